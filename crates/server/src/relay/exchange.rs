//! Forwarding one admitted request: an upstream connection from the pool (or a new one), the
//! request up and the response down at the same time, and the connection back into the pool
//! only when both were framed to their end with nothing left over.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use hyper::StatusCode;
use hyper::http::uri::Authority;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::time::{Instant, Sleep};
use tollgate_http::RateLimitHeaders;

use crate::generation::Settle;

use super::body::{BodyCopy, Encoding, Framing, Malformed, Trailers};
use super::client::{Client, ClientRead, ClientWrite};
use super::conn::{Conn, Plan, READ_CHUNK};
use super::deadline::{self, Timer};
use super::head::MALFORMED_BODY;
use super::pool;
use super::response::{ForClient, response_head};

/// Body bytes a held (`delay`) request may buffer while it waits; past that, reading stops.
const HOLD_BUFFER: usize = 64 * 1024;

/// The windows a request body's stall bound (`header_read_timeout`) is watched in: see
/// [`BodyClock`].
const STALL_WINDOWS: u32 = 4;

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

enum UploadError {
    /// The client closed or failed before its body was all read.
    Client,
    /// The client's chunked body is malformed.
    Malformed,
    /// The upstream would not take the request.
    Upstream,
    /// The client sent no byte of the body it owes for `header_read_timeout`, before any
    /// answer went to it.
    Stalled,
}

/// What the upload needs to hold a client to its body's bounds, and to tell the relay whose
/// wait it is.
struct Owed<'a> {
    /// No byte of a body for this long is the client's fault: `header_read_timeout`, as for a
    /// head (nginx's client_body_timeout).
    stall: Duration,
    /// `Expect: 100-continue`: until told to go on, or until its body starts anyway, the
    /// client waits on the upstream, not the other way round.
    expect_continue: bool,
    /// Set while the upload waits for body bytes the client owes.
    awaiting: &'a AtomicBool,
    /// A `100 Continue` reached the client.
    continued: &'a AtomicBool,
    /// A final head is on its way to the client: past it, a stalled body is left to the
    /// download's bounds, as before.
    answered: &'a AtomicBool,
}

/// The stall bound of a request body, watched on a timer of the upload's own (the connection's
/// is the download's) without reading the clock per chunk: the bound is cut in
/// [`STALL_WINDOWS`] windows, a read that returns only marks its window heard, and the timer
/// moves once per window (one clock read). [`STALL_WINDOWS`] windows in a row without a byte
/// are a stall: found between the bound and a window past it after the client's last byte.
/// Armed at the first wait for owed bytes: a body that came with its head, or a request
/// without one, never touches it.
#[derive(Default)]
struct BodyClock {
    /// Windows in a row without a byte.
    quiet: u32,
    /// A byte came in the current window.
    heard: bool,
    /// No longer watched (an answer went to the client).
    off: bool,
}

impl BodyClock {
    /// Reads the client's next body bytes into `inbuf`, within the stall bound. `Err`: stalled.
    async fn read(
        &mut self,
        client: &mut ClientRead<'_>,
        inbuf: &mut BytesMut,
        mut timer: Pin<&mut Option<Sleep>>,
        owed: &Owed<'_>,
    ) -> Result<io::Result<usize>, UploadError> {
        let window = owed.stall / STALL_WINDOWS;
        if timer.is_none() && !self.off {
            timer.set(Some(tokio::time::sleep(window)));
        }
        loop {
            let Some(sleep) = timer.as_mut().as_pin_mut() else {
                return Ok(client.read_buf(inbuf).await);
            };
            tokio::select! {
                biased;
                r = client.read_buf(inbuf) => {
                    self.heard = true;
                    return Ok(r);
                }
                () = sleep => {}
            }
            // A window ended. Those that passed while the upload waited on the upstream end
            // here at once, as one: the window its last read was heard in.
            self.quiet = if self.heard { 0 } else { self.quiet + 1 };
            self.heard = false;
            if self.quiet >= STALL_WINDOWS {
                if !owed.answered.load(Ordering::Relaxed) {
                    return Err(UploadError::Stalled);
                }
                self.off = true;
                timer.set(None);
                continue;
            }
            if let Some(sleep) = timer.as_mut().as_pin_mut() {
                sleep.reset(Instant::now() + window);
            }
        }
    }
}

/// Writes the request head to the upstream, with the body's first bytes when they are already
/// here, then the rest of the body, framed as the head says: a length as it came, chunked
/// written again (trailers checked and dropped).
///
/// A client that owes body bytes and sends none for `header_read_timeout` is cut off
/// ([`UploadError::Stalled`]); while the upload waits on it, `owed.awaiting` says so.
async fn upload(
    client: &mut ClientRead<'_>,
    inbuf: &mut BytesMut,
    up: &mut WriteHalf<'_>,
    head: &mut Vec<u8>,
    framing: Framing,
    (sent, owed): (&AtomicBool, Owed<'_>),
) -> Result<(), UploadError> {
    let encoding = if framing == Framing::Chunked {
        Encoding::Chunked
    } else {
        Encoding::Identity
    };
    let mut body = BodyCopy::new(framing, encoding, Trailers::Drop);
    // The head goes out with whatever body bytes are already here, in one write. A request
    // without a body leaves `head` whole, to be sent again if a reused connection loses it.
    let take = body
        .copy(inbuf, head)
        .map_err(|Malformed| UploadError::Malformed)?;
    inbuf.advance(take);
    up.write_all(head)
        .await
        .map_err(|_| UploadError::Upstream)?;
    // Some of the body is here: an `Expect: 100-continue` client did not wait.
    let mut started = take > 0;
    let mut clock = BodyClock::default();
    let mut timer = std::pin::pin!(None::<Sleep>);
    while !body.done() {
        if inbuf.is_empty() {
            inbuf.reserve(READ_CHUNK);
            let read = if !owed.expect_continue || started || owed.continued.load(Ordering::Relaxed)
            {
                owed.awaiting.store(true, Ordering::Relaxed);
                let read = clock.read(client, inbuf, timer.as_mut(), &owed).await?;
                owed.awaiting.store(false, Ordering::Relaxed);
                read
            } else {
                client.read_buf(inbuf).await
            };
            match read {
                Ok(0) | Err(_) => return Err(UploadError::Client),
                Ok(_) => started = true,
            }
        }
        head.clear();
        let take = body
            .copy(inbuf, head)
            .map_err(|Malformed| UploadError::Malformed)?;
        inbuf.advance(take);
        if !head.is_empty() {
            up.write_all(head)
                .await
                .map_err(|_| UploadError::Upstream)?;
        }
    }
    sent.store(true, Ordering::Relaxed);
    Ok(())
}

enum DownloadError {
    /// Nothing reached the client: it can still be answered 502/504.
    BeforeHead {
        nothing_received: bool,
        timed_out: bool,
    },
    /// The client got part of a response.
    AfterHead,
}

struct Downloaded {
    /// The upstream connection ended cleanly and may carry another request.
    reusable: bool,
    /// The client connection may carry another request.
    client_ok: bool,
}

/// The buffers and sockets the download works with.
struct Download<'a, 'r, 'w> {
    up: &'a mut ReadHalf<'r>,
    upbuf: &'a mut BytesMut,
    client: &'a mut ClientWrite<'w>,
    out: &'a mut Vec<u8>,
    timer: &'a mut Timer,
}

/// Hands the true-up the status and headers of the response head `head` (a head the relay
/// already parsed once: parsed again here only for a request that has a true-up).
fn read_response(settle: &mut Settle, head: &[u8]) {
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
            let mut many = vec![httparse::EMPTY_HEADER; super::response::MAX_RESPONSE_HEADERS];
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
async fn download(
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
