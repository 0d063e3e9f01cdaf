//! Forwarding one admitted request: an upstream connection from the pool (or a new one), the
//! request up and the response down at the same time, and the connection back into the pool
//! only when both were framed to their end with nothing left over.

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use hyper::StatusCode;
use hyper::http::uri::Authority;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tollgate_http::RateLimitHeaders;

use crate::generation::Settle;

use super::body::Framing;
use super::client::Client;
use super::conn::{Conn, Plan, READ_CHUNK};
use super::deadline::{self};
use super::head::MALFORMED_BODY;
use super::pool;
use super::response::ForClient;

mod download;
mod upload;

use download::{Download, DownloadError, download};
use upload::{Owed, UploadError, upload};

/// Body bytes a held (`delay`) request may buffer while it waits; past that, reading stops.
const HOLD_BUFFER: usize = 64 * 1024;

/// How an exchange with the upstream ended.
enum Relayed {
    Done {
        /// The upstream connection may carry another request.
        reusable: bool,
        /// The client connection may carry another request.
        client_ok: bool,
    },
    /// The client went away while the request was being sent.
    ClientGone,
    /// The client's chunked body broke its framing before any answer reached it.
    MalformedBody,
    /// The upstream failed before a response head reached the client.
    Failed {
        nothing_received: bool,
        timed_out: bool,
    },
    /// The client's body came too slowly, before any answer reached it: no byte for
    /// `header_read_timeout` (`stalled`), or not whole within `[proxy] timeout` while the
    /// relay waited on the client.
    BodyLate { stalled: bool },
    /// The exchange broke after the client got part of a response.
    Broken,
}

impl Conn {
    /// Whether the client has closed its connection (or it broke), found without waiting: what
    /// it sent meanwhile (its body, up to [`HOLD_BUFFER`]) is read into `inbuf`, where the
    /// exchange reads the body from. Asked of a request that waited for its slot: one whose
    /// client gave up is not sent upstream. A client that shut only its writing half after
    /// its request counts as gone, as it does while a held request waits (and as nginx takes
    /// it).
    pub(super) fn client_left(&mut self, client: &mut Client) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        while self.inbuf.len() < HOLD_BUFFER {
            self.inbuf.reserve(READ_CHUNK);
            match std::pin::pin!(client.read_buf(&mut self.inbuf)).poll(&mut cx) {
                Poll::Ready(Ok(0) | Err(_)) => return true,
                Poll::Ready(Ok(_)) => {}
                Poll::Pending => return false,
            }
        }
        false
    }

    /// Holds the request if it must wait for its slot, then forwards it. `true`: the client
    /// connection may carry another request.
    ///
    /// Longer than the house's 80 lines on purpose, as is [`download`]: split into async
    /// helpers (the hold, the checkout, the head and body phases of the download), a proxied
    /// request cost 1.5% more instructions under callgrind (20,730 to 21,035), each nested
    /// future another state machine on the hot path.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn forward(
        &mut self,
        client: &mut Client,
        authority: &Authority,
        plan: Plan,
        (rate_limit, mut settle): (&RateLimitHeaders, Option<Box<Settle>>),
        hold: Option<crate::generation::Hold>,
        timeout: Duration,
        stopping: bool,
    ) -> bool {
        // The true-up (`charge = "response"`, `count_status`) is settled when it is dropped,
        // at the end of this exchange whichever way it ends, with what it was fed.
        if let Some(hold) = hold {
            // Held for its slot; a client that goes away meanwhile drops the hold, which gives
            // its quota back.
            let wait = hold.wait();
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    () = &mut wait => break,
                    r = client.read_buf(&mut self.inbuf), if self.inbuf.len() < HOLD_BUFFER => {
                        match r {
                            Ok(0) | Err(_) => return false,
                            Ok(_) => {}
                        }
                    }
                }
            }
        }
        let deadline = Instant::now() + timeout;
        let mut retried = false;
        loop {
            // A retry goes out on a new connection: the pool may hold more that the upstream
            // closed at the same moment.
            let pooled = if retried {
                None
            } else {
                self.pool.checkout(authority)
            };
            let (mut up, reused) = match pooled {
                Some(c) => (c, true),
                None => match tokio::time::timeout_at(deadline, pool::connect(authority)).await {
                    Ok(Ok(c)) => (c, false),
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "upstream connect failed");
                        return self
                            .upstream_error(
                                client,
                                (StatusCode::BAD_GATEWAY, rate_limit, settle.as_deref_mut()),
                                plan,
                                stopping,
                                timeout,
                            )
                            .await;
                    }
                    Err(_) => {
                        return self
                            .upstream_error(
                                client,
                                (
                                    StatusCode::GATEWAY_TIMEOUT,
                                    rate_limit,
                                    settle.as_deref_mut(),
                                ),
                                plan,
                                stopping,
                                timeout,
                            )
                            .await;
                    }
                },
            };
            // A request that cannot be sent twice checks first that an idle connection is
            // still open (an upstream may have closed it on its idle timeout).
            if reused && !plan.idempotent {
                let mut probe = [0u8; 1];
                match up.try_read(&mut probe) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    _ => continue,
                }
            }
            self.upbuf.clear();
            let outcome = self
                .relay(
                    client,
                    &mut up,
                    plan,
                    (rate_limit, settle.as_deref_mut()),
                    (deadline, timeout),
                    stopping,
                )
                .await;
            match outcome {
                Relayed::Done {
                    reusable,
                    client_ok,
                } => {
                    if reusable {
                        self.pool.checkin(authority, up);
                    }
                    // The client's next request on this connection (pipelined, or sent as
                    // soon as the answer ended) is decided on the trued-up count.
                    if client_ok && let Some(settle) = settle.take() {
                        (*settle).finish_in_order().await;
                    }
                    return client_ok;
                }
                Relayed::ClientGone | Relayed::Broken => return false,
                Relayed::BodyLate { stalled } => {
                    // The client's fault, not the upstream's: 408, as nginx answers once
                    // client_body_timeout passes, and the connection closes (the rest of the
                    // body may still come).
                    let detail = if stalled {
                        "the request body stalled for longer than header_read_timeout"
                    } else {
                        "the request body was not whole within the proxy timeout"
                    };
                    return self
                        .answer_here(
                            client,
                            (
                                StatusCode::REQUEST_TIMEOUT,
                                rate_limit,
                                settle.as_deref_mut(),
                            ),
                            ("Request Timeout", detail),
                            plan.version,
                            (true, timeout),
                        )
                        .await;
                }
                Relayed::MalformedBody => {
                    self.refuse(client, MALFORMED_BODY, plan.version).await;
                    return false;
                }
                Relayed::Failed {
                    nothing_received,
                    timed_out,
                } => {
                    // The keep-alive race: the upstream closed the idle connection as the
                    // request went out. Sent once more, on a fresh connection, only when it has
                    // no body and is idempotent; the client's request was counted once, and the
                    // upstream acted on at most one of the two copies it may have received.
                    if reused && nothing_received && !timed_out && plan.idempotent && !retried {
                        retried = true;
                        continue;
                    }
                    let status = if timed_out {
                        StatusCode::GATEWAY_TIMEOUT
                    } else {
                        StatusCode::BAD_GATEWAY
                    };
                    return self
                        .upstream_error(
                            client,
                            (status, rate_limit, settle.as_deref_mut()),
                            plan,
                            stopping,
                            timeout,
                        )
                        .await;
                }
            }
        }
    }

    /// Sends the request (head, then body) and relays the response, both ways at once: an
    /// upstream may answer before it has read the whole request body.
    async fn relay(
        &mut self,
        client: &mut Client,
        up: &mut TcpStream,
        plan: Plan,
        (rate_limit, settle): (&RateLimitHeaders, Option<&mut Settle>),
        (deadline, gap): (Instant, Duration),
        stopping: bool,
    ) -> Relayed {
        let (mut client_read, mut client_write) = client.split();
        let (mut up_read, mut up_write) = up.split();
        // Set once the whole request is upstream: an answer that comes before (an early 413,
        // say) leaves the rest of the body on the client connection, which then closes, and
        // says so in the answer's head.
        let sent = AtomicBool::new(false);
        // Set once a final head is on its way to the client: past it, a broken request body
        // can no longer be answered 400.
        let answered = AtomicBool::new(false);
        // A request that holds a concurrency slot gives it back as soon as its client goes
        // away, even while the upstream is quiet: once the request is up, the client's side
        // is watched for its close (as nginx does, by peeking; over TLS, by reading: see
        // `ClientRead::next_bytes`; pipelined bytes end the watch).
        let watch_client = settle.as_deref().is_some_and(Settle::holds_slots);
        let body_sent = AtomicBool::new(false);
        // Set while the upload waits for body bytes the client owes (not while it waits for
        // the upstream to take them): an exchange that times out then is the client's doing.
        let awaiting_client = AtomicBool::new(false);
        // Set once a `100 Continue` reached the client: an `Expect: 100-continue` client owes
        // its body from then on (or from its first byte, if it sent it anyway).
        let continued = AtomicBool::new(false);
        let owed = Owed {
            stall: self.limits.header_read_timeout,
            expect_continue: plan.expect_continue,
            awaiting: &awaiting_client,
            continued: &continued,
            answered: &answered,
        };
        let upload = async {
            upload(
                &mut client_read,
                &mut self.inbuf,
                &mut up_write,
                &mut self.uphead,
                plan.framing,
                (&sent, owed),
            )
            .await?;
            if !watch_client {
                return Ok(());
            }
            body_sent.store(true, Ordering::Relaxed);
            match client_read.next_bytes(&mut self.inbuf).await {
                Ok(0) | Err(_) => Err(UploadError::Client),
                Ok(_) => std::future::pending().await,
            }
        };
        let client_side = ForClient {
            version: plan.version,
            is_head: plan.is_head,
            close: plan.close || stopping,
        };
        let download = download(
            Download {
                up: &mut up_read,
                upbuf: &mut self.upbuf,
                client: &mut client_write,
                out: &mut self.out,
                timer: &mut self.timer,
            },
            (rate_limit, settle),
            client_side,
            (&sent, &answered, &continued),
            (deadline, gap),
        );
        tokio::pin!(upload, download);
        let mut uploaded: Option<bool> = None;
        let down = loop {
            tokio::select! {
                biased;
                r = &mut download => break r,
                r = &mut upload, if uploaded.is_none() => match r {
                    Ok(()) => uploaded = Some(true),
                    Err(UploadError::Client) => return Relayed::ClientGone,
                    Err(UploadError::Malformed) => {
                        return if answered.load(Ordering::Relaxed) {
                            Relayed::Broken
                        } else {
                            Relayed::MalformedBody
                        };
                    }
                    // The upstream stopped reading: what it answers (or not) tells the rest.
                    Err(UploadError::Upstream) => uploaded = Some(false),
                    // Only before an answer (past one, the upload waits on as it did).
                    Err(UploadError::Stalled) => return Relayed::BodyLate { stalled: true },
                },
            }
        };
        match down {
            Ok(d) => {
                // A request body not wholly read leaves the client connection mid-message.
                let body_done = uploaded == Some(true) || body_sent.load(Ordering::Relaxed);
                Relayed::Done {
                    reusable: d.reusable && body_done,
                    client_ok: d.client_ok && body_done,
                }
            }
            // The time ran out while the relay waited for the client's body: the client's
            // doing. (Waiting for the upstream to take the body, or to answer it, is the
            // upstream's: 504.)
            Err(DownloadError::BeforeHead {
                timed_out: true, ..
            }) if awaiting_client.load(Ordering::Relaxed) => Relayed::BodyLate { stalled: false },
            Err(DownloadError::BeforeHead {
                nothing_received,
                timed_out,
            }) => Relayed::Failed {
                // Part of the body still unread: the answer must close the connection, and
                // the request is not sent again.
                nothing_received: nothing_received
                    && (uploaded.is_some()
                        || body_sent.load(Ordering::Relaxed)
                        || plan.framing == Framing::None),
                timed_out,
            },
            Err(DownloadError::AfterHead) => Relayed::Broken,
        }
    }

    /// A 502/504 problem (counted as an upstream error), with the request's rate-limit headers
    /// as on every answer. `true` when the connection can go on.
    async fn upstream_error(
        &mut self,
        client: &mut Client,
        (status, rate_limit, settle): (StatusCode, &RateLimitHeaders, Option<&mut Settle>),
        plan: Plan,
        force_close: bool,
        timeout: Duration,
    ) -> bool {
        self.shared.metrics.upstream_error();
        // A body the upstream never took is still on the client connection: close after.
        let close = force_close
            || plan.close
            || !matches!(plan.framing, Framing::None | Framing::Length(0));
        let words = if status == StatusCode::GATEWAY_TIMEOUT {
            ("Upstream timed out", "the upstream did not answer in time")
        } else {
            (
                "Upstream unavailable",
                "the upstream could not be reached or failed mid-answer",
            )
        };
        self.answer_here(
            client,
            (status, rate_limit, settle),
            words,
            plan.version,
            (close, timeout),
        )
        .await
    }

    /// The relay's own problem answer in place of the upstream's (502, 504, 408), with the
    /// request's rate-limit headers as on every answer. `true` when the connection can go on.
    async fn answer_here(
        &mut self,
        client: &mut Client,
        (status, rate_limit, settle): (StatusCode, &RateLimitHeaders, Option<&mut Settle>),
        (title, detail): (&str, &str),
        version: super::head::Version,
        (close, timeout): (bool, Duration),
    ) -> bool {
        // The client gets this status: `count_status` counts it (a 5xx error budget does); a
        // cost read from the response keeps admission's charge.
        if let Some(settle) = settle {
            settle.answered_here(status.as_u16());
        }
        let body = crate::response::problem_body(status, title, Some(detail));
        super::response::write_answer(
            &mut self.out,
            status,
            |out| rate_limit.write(out),
            body.as_bytes(),
            version,
            close,
        );
        let written = deadline::within(&mut self.timer, timeout, client.write_all(&self.out))
            .await
            .is_some_and(|r| r.is_ok());
        written && !close
    }
}
