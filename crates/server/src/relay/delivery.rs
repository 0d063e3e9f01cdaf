//! A queued request delivered to the upstream by the relay: the head the relay wrote when the
//! request was queued, then the framing the relay writes now (`content-length`) and the
//! `idempotency-key`, then the body. The response is read to its end by its framing (so the
//! connection can go back to the pool) and only its status is kept.

use std::time::Duration;

use bytes::{Buf, BytesMut};
use hyper::http::uri::Authority;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tollgate_http::RateLimitHeaders;

use super::body::{BodyCopy, Encoding, Trailers};
use super::conn::READ_CHUNK;
use super::head::Version;
use super::pool::{self, Pool};
use super::response::{ForClient, response_head};
use crate::queue::{Deliver, Delivered};

/// Why an exchange ended without a status.
struct Failure {
    reason: &'static str,
    /// Nothing came back: on a reused connection, the upstream may have closed it first.
    nothing_received: bool,
}

/// The relay's HTTP/1.1 client for queued requests: [`deliver`] over its own connection pool.
#[derive(Debug, Default)]
pub(crate) struct Upstream {
    pool: Pool,
}

impl Deliver for Upstream {
    fn deliver<'a>(
        &'a self,
        authority: &'a Authority,
        request: (&'a [u8], &'a [u8]),
        id: &'a str,
        timeout: Duration,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Delivered> + Send + 'a>> {
        Box::pin(deliver(&self.pool, authority, request, id, timeout))
    }
}

/// Delivers `head` (a stored head: request line and header lines, without the final empty
/// line) and `body` to `authority` with `id` as its idempotency key, within `timeout`.
pub(crate) async fn deliver(
    pool: &Pool,
    authority: &Authority,
    (head, body): (&[u8], &[u8]),
    id: &str,
    timeout: Duration,
) -> Delivered {
    let mut request = Vec::with_capacity(head.len() + body.len() + 96);
    request.extend_from_slice(head);
    request.extend_from_slice(b"content-length: ");
    tollgate::headers::write_decimal(&mut request, u64::try_from(body.len()).unwrap_or(u64::MAX));
    request.extend_from_slice(b"\r\nidempotency-key: ");
    request.extend_from_slice(id.as_bytes());
    request.extend_from_slice(b"\r\n\r\n");
    request.extend_from_slice(body);
    let is_head = head.starts_with(b"HEAD ");
    let deadline = Instant::now() + timeout;
    let mut fresh = false;
    loop {
        let pooled = if fresh {
            None
        } else {
            pool.checkout(authority)
        };
        let reused = pooled.is_some();
        let mut conn = match pooled {
            Some(c) => c,
            None => match tokio::time::timeout_at(deadline, pool::connect(authority)).await {
                Ok(Ok(c)) => c,
                Ok(Err(_)) => return Delivered::Failed("connection refused or failed"),
                Err(_) => return Delivered::Failed("timed out"),
            },
        };
        match exchange(&mut conn, &request, is_head, deadline).await {
            Ok((status, reusable)) => {
                if reusable {
                    pool.checkin(authority, conn);
                }
                return Delivered::Answered(status);
            }
            // The keep-alive race: the upstream closed the idle connection as the request went
            // out. Once more on a new connection; the idempotency key covers the rest.
            Err(f) if reused && f.nothing_received => fresh = true,
            Err(f) => return Delivered::Failed(f.reason),
        }
    }
}

/// One request up, its response head and body down; the status and whether the connection
/// may carry another request.
async fn exchange(
    conn: &mut TcpStream,
    request: &[u8],
    is_head: bool,
    deadline: Instant,
) -> Result<(u16, bool), Failure> {
    let fail = |reason, nothing_received| Failure {
        reason,
        nothing_received,
    };
    match tokio::time::timeout_at(deadline, conn.write_all(request)).await {
        Ok(Ok(())) => {}
        Ok(Err(_)) => return Err(fail("the connection broke", true)),
        Err(_) => return Err(fail("timed out", false)),
    }
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut out = Vec::new();
    let mut received = false;
    let client = ForClient {
        version: Version::Http11,
        is_head,
        close: false,
    };
    let head = loop {
        match response_head(&buf, &mut out, &RateLimitHeaders::default(), client) {
            Err(_) => return Err(fail("the upstream's answer is not HTTP/1.1", false)),
            Ok(Some(head)) => {
                buf.advance(head.len);
                if head.interim {
                    continue;
                }
                break head;
            }
            Ok(None) => {}
        }
        buf.reserve(READ_CHUNK);
        match tokio::time::timeout_at(deadline, conn.read_buf(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return Err(fail("the connection broke", !received)),
            Ok(Ok(_)) => received = true,
            Err(_) => return Err(fail("timed out", false)),
        }
    };
    // The head as the relay wrote it again starts with `HTTP/1.1 NNN`.
    let status = out
        .get(9..12)
        .and_then(|d| std::str::from_utf8(d).ok())
        .and_then(|d| d.parse::<u16>().ok())
        .ok_or_else(|| fail("the upstream's answer is not HTTP/1.1", false))?;
    // The body, read to its end and dropped. Once the status is here the delivery is done;
    // a body that breaks off only costs the connection.
    let mut body = BodyCopy::new(head.framing, Encoding::Identity, Trailers::Drop);
    let mut sink = Vec::new();
    loop {
        let Ok(take) = body.copy(&buf, &mut sink) else {
            return Ok((status, false));
        };
        buf.advance(take);
        sink.clear();
        if body.done() {
            return Ok((status, !head.upstream_close && buf.is_empty()));
        }
        buf.reserve(READ_CHUNK);
        match tokio::time::timeout_at(deadline, conn.read_buf(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return Ok((status, false)),
        }
    }
}
