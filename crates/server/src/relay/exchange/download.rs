//! The response's way down: its head read and written again for the client, then its body
//! copied by its framing, fed to the true-up as it passes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::ReadHalf;
use tokio::time::Instant;
use tollgate_http::RateLimitHeaders;

use crate::generation::Settle;

use super::super::body::{BodyCopy, Malformed, Trailers};
use super::super::client::ClientWrite;
use super::super::conn::READ_CHUNK;
use super::super::deadline::{self, Timer};
use super::super::response::{ForClient, response_head};

pub(super) enum DownloadError {
    /// Nothing reached the client: it can still be answered 502/504.
    BeforeHead {
        nothing_received: bool,
        timed_out: bool,
    },
    /// The client got part of a response.
    AfterHead,
}

pub(super) struct Downloaded {
    /// The upstream connection ended cleanly and may carry another request.
    pub(super) reusable: bool,
    /// The client connection may carry another request.
    pub(super) client_ok: bool,
}

/// The buffers and sockets the download works with.
pub(super) struct Download<'a, 'r, 'w> {
    pub(super) up: &'a mut ReadHalf<'r>,
    pub(super) upbuf: &'a mut BytesMut,
    pub(super) client: &'a mut ClientWrite<'w>,
    pub(super) out: &'a mut Vec<u8>,
    pub(super) timer: &'a mut Timer,
}

/// Hands the true-up the status and headers of the response head `head` (a head the relay
/// already parsed once: parsed again here only for a request that has a true-up).
pub(super) fn read_response(settle: &mut Settle, head: &[u8]) {
    if !settle.reads_response() {
        // Only concurrency slots to give back: the response says nothing they need.
        return;
    }
    // Room for the usual head on the stack; a head with more lines (cookies by the hundred)
    // is read again with room for as many as the relay accepts at all.
    let mut few = [httparse::EMPTY_HEADER; 48];
    let mut response = httparse::Response::new(&mut few);
    match response.parse(head) {
        Ok(httparse::Status::Complete(_)) => {
            let status = response.code.unwrap_or(200);
            settle.response_from(status, response.headers.iter().map(|h| (h.name, h.value)));
        }
        Err(httparse::Error::TooManyHeaders) => {
            let mut many =
                vec![httparse::EMPTY_HEADER; super::super::response::MAX_RESPONSE_HEADERS];
            let mut response = httparse::Response::new(&mut many);
            if let Ok(httparse::Status::Complete(_)) = response.parse(head) {
                let status = response.code.unwrap_or(200);
                settle.response_from(status, response.headers.iter().map(|h| (h.name, h.value)));
            }
        }
        _ => {}
    }
}

/// Reads the upstream's response head (interim 1xx ones forwarded), writes the client's version
/// of it with the rate-limit headers, then relays the body, framed for the client by the relay.
pub(super) async fn download(
    io: Download<'_, '_, '_>,
    (rate_limit, mut settle): (&RateLimitHeaders, Option<&mut Settle>),
    mut client: ForClient,
    (sent, answered, continued): (&AtomicBool, &AtomicBool, &AtomicBool),
    (deadline, gap): (Instant, Duration),
) -> Result<Downloaded, DownloadError> {
    let Download {
        up,
        upbuf,
        client: to_client,
        out,
        timer,
    } = io;
    let mut received = false;
    let base_close = client.close;
    let head = loop {
        // Whether the request is all upstream is read as the head is written: it may still be
        // going up.
        client.close = base_close || !sent.load(Ordering::Relaxed);
        match response_head(upbuf, out, rate_limit, client) {
            Err(_) => {
                return Err(DownloadError::BeforeHead {
                    nothing_received: false,
                    timed_out: false,
                });
            }
            Ok(Some(head)) => {
                if !head.interim
                    && let Some(settle) = settle.as_deref_mut()
                {
                    read_response(settle, &upbuf[..head.len]);
                }
                // `HTTP/1.1 100 `: the client is told to send its body.
                let go_on = head.interim && upbuf.get(9..12) == Some(b"100".as_slice());
                upbuf.advance(head.len);
                if head.interim {
                    if !out.is_empty() {
                        deadline::within(timer, gap, to_client.write_all(out))
                            .await
                            .and_then(Result::ok)
                            .ok_or(DownloadError::AfterHead)?;
                        if go_on {
                            continued.store(true, Ordering::Relaxed);
                        }
                    }
                    continue;
                }
                break head;
            }
            Ok(None) => {}
        }
        upbuf.reserve(READ_CHUNK);
        match deadline::until(timer, deadline, up.read_buf(upbuf)).await {
            None => {
                return Err(DownloadError::BeforeHead {
                    nothing_received: !received,
                    timed_out: true,
                });
            }
            Some(Ok(0) | Err(_)) => {
                return Err(DownloadError::BeforeHead {
                    nothing_received: !received,
                    timed_out: false,
                });
            }
            Some(Ok(_)) => received = true,
        }
    };
    answered.store(true, Ordering::Relaxed);

    // The body; its first bytes go out with the head, in one write. Past the head, neither side
    // may stall the exchange for longer than `gap` at a time (nginx's proxy_read_timeout and
    // send_timeout).
    let mut body = BodyCopy::new(head.framing, head.encoding, Trailers::Forward);
    loop {
        let take = match settle.as_deref_mut() {
            Some(settle) if settle.reads_body() => {
                body.copy_tapped(upbuf, out, &mut |chunk| settle.feed(chunk))
            }
            _ => body.copy(upbuf, out),
        }
        .map_err(|Malformed| DownloadError::AfterHead)?;
        upbuf.advance(take);
        if !out.is_empty() {
            deadline::within(timer, gap, to_client.write_all(out))
                .await
                .and_then(Result::ok)
                .ok_or(DownloadError::AfterHead)?;
            out.clear();
        }
        if body.done() {
            break;
        }
        upbuf.reserve(READ_CHUNK);
        let Some(read) = deadline::within(timer, gap, up.read_buf(upbuf)).await else {
            return Err(DownloadError::AfterHead);
        };
        match read {
            Ok(0) => {
                // The upstream closed: the end of a close-delimited body, or a body cut short.
                if !body.close(out) {
                    return Err(DownloadError::AfterHead);
                }
                deadline::within(timer, gap, to_client.write_all(out))
                    .await
                    .and_then(Result::ok)
                    .ok_or(DownloadError::AfterHead)?;
                out.clear();
                return Ok(Downloaded {
                    reusable: false,
                    client_ok: !head.client_close,
                });
            }
            Err(_) => return Err(DownloadError::AfterHead),
            Ok(_) => {}
        }
    }
    Ok(Downloaded {
        // Bytes past the response's end: the upstream is out of step; never reused.
        reusable: !head.upstream_close && upbuf.is_empty(),
        client_ok: !head.client_close,
    })
}
