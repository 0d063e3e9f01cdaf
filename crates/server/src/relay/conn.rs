//! One client connection of the proxy: read a head, check it, decide, and either answer or
//! forward (see `exchange.rs`), request after request, with buffers reused throughout.

use crate::telemetry::{Door, Trace};
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Buf, BytesMut};
use hyper::header::HeaderValue;
use hyper::{HeaderMap, Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Instant;
use tollgate_http::RequestInfo;

use super::body::Framing;
use super::client::Client;
use super::deadline::{self, Timer};
use super::head::{self, HeadScan, Host, MALFORMED, Refusal, RequestHead, Version};
use super::pool::Pool;
use super::response::write_answer;
use crate::Shared;
use crate::generation::{Disposition, Generation};
use crate::serve::Limits;

/// Headers parsed on the stack; a request with more is parsed again with room for
/// [`MAX_REQUEST_HEADERS`] (hyper allows 100).
const STACK_HEADERS: usize = 64;
const MAX_REQUEST_HEADERS: usize = 256;
/// What one read asks for; also the most body bytes batched with a head in one write.
pub(super) const READ_CHUNK: usize = 16 * 1024;

/// The state of one client connection, reused from request to request.
pub(super) struct Conn {
    pub(super) shared: Arc<Shared>,
    /// This thread's idle upstream sockets.
    pub(super) pool: Arc<Pool>,
    /// The deadline of the current wait (idle, head, upstream answer, a write): see
    /// `deadline.rs`.
    pub(super) timer: Timer,
    pub(super) peer: SocketAddr,
    /// The client's address as `X-Forwarded-For` gives it, formatted once per connection.
    pub(super) peer_text: Box<[u8]>,
    pub(super) limits: Limits,
    /// Bytes read from the client and not yet relayed.
    pub(super) inbuf: BytesMut,
    /// Where the search for the end of the next head goes on from.
    pub(super) scan: HeadScan,
    /// Bytes read from the upstream and not yet relayed.
    pub(super) upbuf: BytesMut,
    /// The request head for the upstream, then the body bytes on their way up.
    pub(super) uphead: Vec<u8>,
    /// What goes to the client next (a head, with the first body bytes).
    pub(super) out: Vec<u8>,
    /// The headers the engine reads (keys, JWT, forwarding headers), refilled per request.
    pub(super) map: HeaderMap,
    /// The engine this connection last used (out of here during an exchange).
    pub(super) engine: Option<Arc<Generation>>,
}

/// What the relay keeps of a request head once its bytes are gone.
#[derive(Clone, Copy, Debug)]
pub(super) struct Plan {
    pub(super) version: Version,
    pub(super) framing: Framing,
    pub(super) close: bool,
    pub(super) is_head: bool,
    pub(super) idempotent: bool,
    pub(super) expect_continue: bool,
}

impl Conn {
    pub(super) fn new(
        shared: Arc<Shared>,
        pool: Arc<Pool>,
        peer: SocketAddr,
        limits: Limits,
    ) -> Conn {
        Conn {
            shared,
            pool,
            timer: deadline::timer(),
            peer,
            peer_text: peer.ip().to_string().into_bytes().into_boxed_slice(),
            limits,
            inbuf: BytesMut::with_capacity(READ_CHUNK),
            scan: HeadScan::default(),
            upbuf: BytesMut::new(),
            uphead: Vec::new(),
            out: Vec::new(),
            map: HeaderMap::new(),
            engine: None,
        }
    }

    /// The engine of the running configuration, taken out of the connection for one exchange
    /// (give it back with [`Conn::put_engine`]): looked up again only after a reload, and
    /// never cloned per request, as a reference count both cores update would bounce between
    /// them.
    fn take_engine(&mut self) -> Arc<Generation> {
        // arc-swap's load borrows the running engine without touching its reference count;
        // a pointer comparison tells whether a reload replaced it.
        let running = self.shared.engine.load();
        match self.engine.take() {
            Some(engine) if Arc::ptr_eq(&engine, &running) => engine,
            _ => arc_swap::Guard::into_inner(running),
        }
    }

    /// Serves requests until the connection ends.
    pub(super) async fn run(&mut self, client: &mut Client, stop: &watch::Receiver<bool>) {
        // One wait for shutdown for the whole connection, rather than one registered and
        // dropped per request. It completes at most once: every branch that sees it returns.
        let mut signal = stop.clone();
        let shutdown = async move { crate::serve::stopped(&mut signal).await };
        tokio::pin!(shutdown);
        let mut first = true;
        loop {
            let stopping = *stop.borrow();
            let Some(head_len) = self
                .read_head(client, shutdown.as_mut(), first, stopping)
                .await
            else {
                return;
            };
            first = false;
            let engine = self.take_engine();
            let go_on = self.exchange(client, &engine, head_len, stopping).await;
            self.engine = Some(engine);
            if !go_on {
                return;
            }
        }
    }

    /// Waits for a whole head; its length. The header read timeout runs from the connection's
    /// start for its first request, and from a head's first byte for the next ones; before
    /// that first byte, the idle timeout. `None`: the connection ends (closed, timed out, too
    /// large a head, shutdown between requests).
    async fn read_head(
        &mut self,
        client: &mut Client,
        mut shutdown: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
        first: bool,
        stopping: bool,
    ) -> Option<usize> {
        self.scan.reset();
        let mut started = first || !self.inbuf.is_empty();
        let mut deadline = Instant::now()
            + if started {
                self.limits.header_read_timeout
            } else {
                self.limits.idle_timeout
            };
        loop {
            // Empty lines before a request line are ignored (RFC 9112 §2.2).
            if skip_empty_lines(&mut self.inbuf) {
                self.scan.reset();
            }
            if !self.inbuf.is_empty() {
                if let Some(end) = self.scan.end(&self.inbuf)
                    && end <= self.limits.max_header_bytes
                {
                    return Some(end);
                }
                if self.inbuf.len() > self.limits.max_header_bytes {
                    let refusal = Refusal::new(
                        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                        "Request header fields too large",
                        "the request head is larger than this server accepts",
                    );
                    self.refuse(client, refusal, Version::Http11).await;
                    return None;
                }
                if !started {
                    started = true;
                    deadline = Instant::now() + self.limits.header_read_timeout;
                }
            } else if stopping {
                return None;
            }
            let idle = self.inbuf.is_empty();
            self.inbuf.reserve(READ_CHUNK);
            if self.timer.deadline() > deadline {
                self.timer.as_mut().reset(deadline);
            }
            let read = tokio::select! {
                biased;
                r = client.read_buf(&mut self.inbuf) => r,
                () = self.timer.as_mut() => {
                    if Instant::now() < deadline {
                        self.timer.as_mut().reset(deadline);
                        continue;
                    }
                    // Slow loris or idle: closed without an answer, as hyper does.
                    return None;
                }
                // Shutdown: a connection between requests closes.
                () = shutdown.as_mut(), if idle => return None,
            };
            match read {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    /// One request and its response. `true`: the connection may carry another request.
    async fn exchange(
        &mut self,
        client: &mut Client,
        engine: &Generation,
        head_len: usize,
        stopping: bool,
    ) -> bool {
        let Some(proxy) = engine.config().proxy.as_ref() else {
            let refusal = Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "Proxy disabled",
                "the running configuration has no [proxy] section",
            );
            self.refuse(client, refusal, Version::Http11).await;
            return false;
        };
        let Some(authority) = proxy.upstream.authority().cloned() else {
            self.inbuf.advance(head_len);
            let refusal = Refusal::new(
                StatusCode::BAD_GATEWAY,
                "Upstream unavailable",
                "the upstream has no authority",
            );
            self.refuse(client, refusal, Version::Http11).await;
            return false;
        };
        let timeout = proxy.timeout;
        if is_status_request(&self.inbuf[..head_len], engine) {
            return Box::pin(self.queue_status(client, head_len, timeout, stopping)).await;
        }
        let decided = self.decide(engine, head_len, &authority).await;
        self.inbuf.advance(head_len);
        let (plan, rate_limit, verdict, settle, waited) = match decided {
            Ok(d) => d,
            Err((refusal, version)) => {
                // The bytes after a head the relay cannot read cannot be trusted to start a
                // request: the connection ends after the answer.
                self.refuse(client, refusal, version).await;
                return false;
            }
        };
        let verdict = match verdict {
            // Only `queue` policies denied it: stored for later, unless no queue takes it.
            Disposition::Respond(answer) if answer.queue_ticket().is_some() => {
                match Box::pin(self.enqueue(client, engine, answer, plan, timeout, stopping)).await
                {
                    Ok(go_on) => return go_on,
                    Err(answer) => Disposition::Respond(answer),
                }
            }
            other => other,
        };
        // A request that waited for a slot goes upstream only if its client is still there:
        // dropping its true-up gives the slot to the next in line.
        if waited && !matches!(verdict, Disposition::Respond(_)) && self.client_left(client) {
            return false;
        }
        let hold = match verdict {
            Disposition::Respond(answer) => {
                // The refused request's body is skipped when it is already here; otherwise the
                // connection closes after the answer rather than read it.
                let body_here = match plan.framing {
                    Framing::None => true,
                    Framing::Length(n) => {
                        let here = usize::try_from(n).is_ok_and(|n| n <= self.inbuf.len());
                        if here {
                            self.inbuf.advance(n as usize);
                        }
                        here
                    }
                    Framing::Chunked | Framing::Close => false,
                };
                let close = plan.close || stopping || !body_here;
                write_answer(
                    &mut self.out,
                    answer.status(),
                    |out| answer.write_headers(out),
                    answer.body(),
                    plan.version,
                    close,
                );
                let written =
                    deadline::within(&mut self.timer, timeout, client.write_all(&self.out))
                        .await
                        .is_some_and(|r| r.is_ok());
                return written && !close;
            }
            Disposition::Hold(hold) => Some(hold),
            Disposition::Pass => None,
        };
        self.forward(
            client,
            &authority,
            plan,
            (&rate_limit, settle),
            hold,
            timeout,
            stopping,
        )
        .await
    }

    /// Parses and checks the head, decides on it, and writes the upstream head when the
    /// request goes on. Works on the head's bytes in place: nothing of it is copied but what
    /// the upstream head needs.
    async fn decide(
        &mut self,
        engine: &Generation,
        head_len: usize,
        authority: &hyper::http::uri::Authority,
    ) -> Result<Decided, (Refusal, Version)> {
        let bytes = &self.inbuf[..head_len];
        let mut stack = [httparse::EMPTY_HEADER; STACK_HEADERS];
        let mut heap;
        let mut req = httparse::Request::new(&mut stack);
        let parsed = match req.parse(bytes) {
            Err(httparse::Error::TooManyHeaders) => {
                heap = vec![httparse::EMPTY_HEADER; MAX_REQUEST_HEADERS];
                req = httparse::Request::new(&mut heap);
                req.parse(bytes)
            }
            other => other,
        };
        let version = match req.version {
            Some(0) => Version::Http10,
            _ => Version::Http11,
        };
        match parsed {
            Ok(httparse::Status::Complete(_)) => {}
            Err(httparse::Error::TooManyHeaders) => {
                let refusal = Refusal::new(
                    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    "Request header fields too large",
                    "the request has more header lines than this server accepts",
                );
                return Err((refusal, version));
            }
            _ => return Err((MALFORMED, version)),
        }
        let head = head::check(&req).map_err(|r| (r, version))?;
        let method =
            Method::from_bytes(head.method.as_bytes()).map_err(|_| (MALFORMED, version))?;
        // The headers the engine may read, under its own names (no name parsed or allocated).
        self.map.clear();
        for h in req.headers.iter() {
            if let Some(name) = engine.header_read(h.name)
                && let Ok(v) = HeaderValue::from_bytes(h.value)
            {
                self.map.append(name.clone(), v);
            }
        }
        // The host the upstream will read, which is the one policies match.
        let host = match &head.host {
            Host::Header(h) | Host::Target(h) => *h,
            Host::Upstream => authority.as_str(),
        };
        let info = RequestInfo::new(&method, &head.target, &self.map)
            .with_host(Some(host))
            .with_peer(Some(self.peer.ip()));
        let trace = if engine.traced() {
            Trace::from_lines(Door::Proxy, req.headers.iter().map(|h| (h.name, h.value)))
        } else {
            Trace::root(Door::Proxy)
        };
        let mut evaluation = engine.evaluate(&info, trace).await;
        let settle = evaluation.take_settle();
        let waited = evaluation.waited_for_slot();
        let (_, rate_limit, verdict) = evaluation.into_parts();
        match &verdict {
            Disposition::Respond(a) if a.queue_ticket().is_some() => head::write_queued_head(
                &mut self.uphead,
                &head,
                req.headers,
                authority,
                &self.peer_text,
                |name| engine.header_read(name).is_some(),
            ),
            Disposition::Respond(_) => {}
            _ => head::write_upstream_head(
                &mut self.uphead,
                &head,
                req.headers,
                authority,
                &self.peer_text,
                (
                    |name| engine.header_read(name).is_some(),
                    settle
                        .as_deref()
                        .is_some_and(crate::generation::Settle::reads_cost_from_body),
                ),
            ),
        }
        Ok((plan_of(&head), rate_limit, verdict, settle, waited))
    }

    /// Answers `refusal` as problem+json and ends the connection (its next bytes cannot be
    /// trusted to start a request). The write has the header read timeout to complete.
    pub(super) async fn refuse(&mut self, client: &mut Client, refusal: Refusal, version: Version) {
        let body = refusal.body();
        write_answer(
            &mut self.out,
            refusal.status(),
            |_| {},
            &body,
            version,
            true,
        );
        let _ = deadline::within(
            &mut self.timer,
            self.limits.header_read_timeout,
            client.write_all(&self.out),
        )
        .await;
    }
}

/// What the relay decided on a request head: how to relay it, the rate-limit headers, what to
/// do, the true-up to hand its response to, and whether the request waited in a line for a
/// concurrency slot.
type Decided = (
    Plan,
    tollgate_http::RateLimitHeaders,
    Disposition,
    Option<Box<crate::generation::Settle>>,
    bool,
);

fn plan_of(head: &RequestHead<'_>) -> Plan {
    Plan {
        version: head.version,
        framing: head.framing,
        close: head.close,
        is_head: head.is_head,
        idempotent: head.idempotent,
        expect_continue: head.expect_continue,
    }
}

/// Drops the empty lines at the start of `buf`; whether there were any.
fn skip_empty_lines(buf: &mut BytesMut) -> bool {
    let mut n = 0;
    loop {
        match &buf[n..] {
            [b'\r', b'\n', ..] => n += 2,
            [b'\n', ..] => n += 1,
            _ => break,
        }
    }
    buf.advance(n);
    n > 0
}

/// Whether a head asks for a stored request's status: `GET /v1/queue/...`, on a proxy with a
/// `queue` policy (otherwise the path is the upstream's, as any other).
fn is_status_request(head: &[u8], engine: &Generation) -> bool {
    head.starts_with(b"GET /v1/queue/")
        && engine
            .config()
            .policies
            .iter()
            .any(|p| p.action == crate::config::Action::Queue)
}
