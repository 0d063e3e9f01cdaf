//! The proxy listener's own HTTP/1.1 relay.
//!
//! hyper's server and client are general: every request becomes a `Request` with a header map,
//! the upstream connection is driven by a task of its own, and a request crosses tasks (and
//! often threads) several times on its way through. A rate-limiting proxy needs much less: read
//! a head, decide, copy the head with a few headers changed, and copy the bodies byte for byte
//! by their framing. This module does exactly that, in one task per client connection that owns
//! both the client socket and (for the length of one exchange) an upstream keep-alive socket,
//! with buffers reused across the requests of a connection.
//!
//! What it does not handle itself (HTTP/1.0, `Expect`, `Upgrade`, absolute-form targets,
//! ambiguous framing, more headers than it has room for, malformed heads) it hands over, with
//! the bytes already read, to the hyper path of [`crate::proxy`], at a request boundary, for
//! the rest of the connection: behaviour there stays as it always was.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{Buf, Bytes, BytesMut};
use hyper::HeaderMap;
use hyper::Method;
use hyper::StatusCode;
use hyper::header::HeaderValue;
use hyper::http::uri::Authority;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::sync::watch;
use tokio::time::Instant;
use tollgate_http::{RateLimitHeaders, RequestInfo};

use crate::Shared;
use crate::engine::{Engine, Verdict};
use crate::serve::Limits;

/// A deadline far enough away to mean "none yet".
const FAR: std::time::Duration = std::time::Duration::from_secs(86_400);

/// Headers parsed per head; a request with more is handed to hyper (which allows 100).
const MAX_HEADERS: usize = 64;
/// Largest upstream response head accepted.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// Most headers in an upstream response head (hyper's client allows 100; a response setting
/// many cookies can have more).
const MAX_RESPONSE_HEADERS: usize = 1024;
/// Idle upstream connections kept for reuse.
const MAX_IDLE: usize = 256;
/// What one read asks for; also the most body bytes batched with a head in one write.
const READ_CHUNK: usize = 16 * 1024;
/// Body bytes a held (`delay`) request may buffer while it waits; past that, reading stops.
const HOLD_BUFFER: usize = 64 * 1024;
/// Longest chunk-size line (with extensions) or trailer section accepted in a chunked body.
const MAX_CHUNK_LINE: usize = 4096;
const MAX_TRAILERS: usize = 64 * 1024;

/// The relay's pool of idle keep-alive connections to the upstream: plain sockets, checked out
/// for one exchange and given back once the response was read to its end.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    idle: Mutex<Idle>,
}

#[derive(Debug, Default)]
struct Idle {
    /// The upstream the idle connections go to (the upstream may change on reload).
    authority: Option<Authority>,
    conns: Vec<TcpStream>,
}

impl Idle {
    /// Whether the idle connections go to `authority`: compared as the configured text, byte
    /// for byte (an `Authority`'s own comparison folds case, byte by byte, on every request).
    fn same_upstream(&self, authority: &Authority) -> bool {
        self.authority
            .as_ref()
            .is_some_and(|a| a.as_str() == authority.as_str())
    }
}

impl Pool {
    fn idle(&self) -> MutexGuard<'_, Idle> {
        match self.idle.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn checkout(&self, authority: &Authority) -> Option<TcpStream> {
        let mut idle = self.idle();
        if !idle.same_upstream(authority) {
            idle.conns.clear();
            idle.authority = Some(authority.clone());
            return None;
        }
        // The most recently returned first: its buffers are warm and it is the least likely
        // to have been closed by the upstream's idle timeout. One that turned readable while
        // idle was closed by the upstream (or sent something unasked): it goes, and the next
        // is tried, so that a pool emptied by an upstream's idle timeout costs no request.
        while let Some(conn) = idle.conns.pop() {
            if !read_ready(&conn) {
                return Some(conn);
            }
        }
        None
    }

    fn checkin(&self, authority: &Authority, conn: TcpStream) {
        let mut idle = self.idle();
        if !idle.same_upstream(authority) {
            return;
        }
        // The longest idle is the likeliest to be closed by now: reaped as others come back,
        // so closed sockets do not sit in the pool until a burst reaches down to them.
        if idle.conns.first().is_some_and(read_ready) {
            idle.conns.remove(0);
        }
        if idle.conns.len() < MAX_IDLE {
            idle.conns.push(conn);
        }
    }
}

/// How a message body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    None,
    Length(u64),
    Chunked,
    /// Until the upstream closes (responses only).
    Close,
}

/// Why a connection leaves the relay.
enum End {
    /// Closed (or to be closed): nothing more to do.
    Close,
    /// A request the relay does not serve: hyper takes the connection over, starting with
    /// these unread bytes.
    Fallback(Bytes),
}

/// Serves the proxy listener until `shutdown` turns true and its connections have drained:
/// the server's runtime accepts, and each connection is handed to the least busy of one
/// single-threaded runtime per core, where it stays.
///
/// Why not the server's runtime: a proxied request is two short socket round trips, and on a
/// work-stealing runtime each wake-up may hop threads (a cross-thread wake is a syscall). A
/// connection that stays on one thread, as an nginx worker does it, costs less per request.
/// Why one acceptor: threads racing for `accept` on a shared socket share connections out
/// unevenly, and the busier thread's connections make the latency tail.
pub(crate) async fn serve_per_core(
    shared: Arc<Shared>,
    listener: tokio::net::TcpListener,
    shutdown: watch::Receiver<bool>,
    limits: Limits,
) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut workers = Vec::with_capacity(threads);
    let mut finished = Vec::with_capacity(threads);
    for i in 0..threads {
        match spawn_worker(i, Arc::clone(&shared), limits) {
            Ok((worker, done)) => {
                workers.push(worker);
                finished.push(done);
            }
            Err(e) => tracing::warn!(error = %e, "proxy: fewer threads than cores"),
        }
    }
    if workers.is_empty() {
        // No thread could be started: serve on this runtime rather than not at all.
        let pool = Arc::new(Pool::default());
        crate::serve::accept_loop(
            "proxy",
            listener,
            move |stream, peer, stop| {
                serve_connection(
                    Arc::clone(&shared),
                    Arc::clone(&pool),
                    stream,
                    peer,
                    limits,
                    stop,
                )
            },
            shutdown,
            limits,
        )
        .await;
        return;
    }
    let workers: Arc<[Worker]> = workers.into();
    crate::serve::accept_loop(
        "proxy",
        listener,
        move |stream, peer, stop| {
            // Handed over here, not in the returned future: only the accept loop holds the
            // workers' senders, so the workers see the end of the channel once it returns.
            let (done_tx, done_rx) = tokio::sync::oneshot::channel();
            if let Some(worker) = workers
                .iter()
                .min_by_key(|w| w.active.load(Ordering::Relaxed))
                && let Ok(stream) = stream.into_std()
            {
                worker.active.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = worker.tx.send((stream, peer, stop, done_tx)) {
                    worker.active.fetch_sub(1, Ordering::Relaxed);
                    drop(e);
                }
            }
            // Holds the connection's permit until the worker is done with it.
            async move {
                let _ = done_rx.await;
            }
        },
        shutdown,
        limits,
    )
    .await;
    // Every connection has drained (or the drain period is over): the workers stop, and
    // whatever is still open goes with them.
    for done in finished {
        let _ = done.await;
    }
}

/// A connection handed to a worker: the socket, the peer, the shutdown signal, and what to
/// tell the acceptor when the connection is over.
type Handoff = (
    std::net::TcpStream,
    SocketAddr,
    watch::Receiver<bool>,
    tokio::sync::oneshot::Sender<()>,
);

/// One per-core thread of the proxy.
struct Worker {
    tx: tokio::sync::mpsc::UnboundedSender<Handoff>,
    /// Connections it serves now.
    active: Arc<std::sync::atomic::AtomicUsize>,
}

/// Starts worker thread `i`: a single-threaded runtime serving the connections it is handed,
/// with its own idle upstream sockets (a socket used from another runtime than the one it was
/// registered with would wake across threads). The receiver completes when the thread ends.
fn spawn_worker(
    i: usize,
    shared: Arc<Shared>,
    limits: Limits,
) -> io::Result<(Worker, tokio::sync::oneshot::Receiver<()>)> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Handoff>();
    let active = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let count = Arc::clone(&active);
    std::thread::Builder::new()
        .name(format!("tollgate-proxy-{i}"))
        .spawn(move || {
            rt.block_on(async move {
                let pool = Arc::new(Pool::default());
                let mut conns = tokio::task::JoinSet::new();
                loop {
                    tokio::select! {
                        next = rx.recv() => {
                            let Some((stream, peer, stop, done)) = next else { break };
                            let shared = Arc::clone(&shared);
                            let pool = Arc::clone(&pool);
                            let count = Arc::clone(&count);
                            conns.spawn(async move {
                                match TcpStream::from_std(stream) {
                                    Ok(stream) => {
                                        serve_connection(shared, pool, stream, peer, limits, stop)
                                            .await;
                                    }
                                    Err(e) => tracing::warn!(error = %e, "proxy: connection lost in hand-off"),
                                }
                                count.fetch_sub(1, Ordering::Relaxed);
                                let _ = done.send(());
                            });
                        }
                        Some(_) = conns.join_next(), if !conns.is_empty() => {}
                    }
                }
                // The acceptor has drained (or given up waiting): what remains is cut.
                conns.shutdown().await;
            });
            let _ = done_tx.send(());
        })?;
    Ok((Worker { tx, active }, done_rx))
}

/// Serves one client connection of the proxy listener.
pub(crate) async fn serve_connection(
    shared: Arc<Shared>,
    pool: Arc<Pool>,
    mut client: TcpStream,
    peer: SocketAddr,
    limits: Limits,
    stop: watch::Receiver<bool>,
) {
    let mut conn = Conn {
        shared: Arc::clone(&shared),
        pool,
        timer: Box::pin(tokio::time::sleep_until(Instant::now() + FAR)),
        peer,
        peer_text: peer.ip().to_string().into_bytes().into_boxed_slice(),
        limits,
        inbuf: BytesMut::with_capacity(READ_CHUNK),
        upbuf: BytesMut::new(),
        uphead: Vec::new(),
        out: Vec::new(),
        map: HeaderMap::new(),
        engine: None,
    };
    match conn.run(&mut client, &stop).await {
        End::Close => {
            let _ = client.shutdown().await;
        }
        End::Fallback(pre) => {
            let io = Rewind { pre, io: client };
            crate::serve::serve_http1(
                "proxy",
                hyper_util::rt::TokioIo::new(io),
                peer,
                move |peer, req| crate::proxy::handle(Arc::clone(&shared), peer, req),
                limits,
                stop,
            )
            .await;
        }
    }
}

/// The state of one client connection, reused from request to request.
struct Conn {
    shared: Arc<Shared>,
    /// This thread's idle upstream sockets.
    pool: Arc<Pool>,
    /// The deadline of the current wait (idle, head, upstream answer): one timer per
    /// connection, moved only when it fires early (set for an earlier wait), instead of one
    /// registered and removed per request.
    timer: Pin<Box<tokio::time::Sleep>>,
    peer: SocketAddr,
    /// The client's address as `X-Forwarded-For` gives it, formatted once per connection.
    peer_text: Box<[u8]>,
    limits: Limits,
    /// Bytes read from the client and not yet relayed.
    inbuf: BytesMut,
    /// Bytes read from the upstream and not yet relayed.
    upbuf: BytesMut,
    /// The request head for the upstream.
    uphead: Vec<u8>,
    /// What goes to the client next (a head, with the first body bytes).
    out: Vec<u8>,
    /// The headers the engine reads (keys, JWT, forwarding headers, host), refilled per request.
    map: HeaderMap,
    /// The engine this connection last used, and the reload generation it came from (out of
    /// here during an exchange).
    engine: Option<(u64, Arc<Engine>)>,
}

/// What the request line and headers said, beyond what is copied.
struct ReqHead {
    framing: Framing,
    /// The client asked to close after this exchange.
    close: bool,
    is_head: bool,
    /// Safe to send again when a reused upstream connection turns out to be dead.
    idempotent: bool,
}

impl Conn {
    /// The engine of the running configuration: looked up again only after a reload.
    /// The engine of the running configuration, taken out of the connection for one exchange
    /// (give it back with [`Conn::put_engine`]): looked up again only after a reload, and
    /// never cloned per request, as a reference count both cores update would bounce between
    /// them.
    fn take_engine(&mut self) -> (u64, Arc<Engine>) {
        let generation = self.shared.generation.load(Ordering::Acquire);
        match self.engine.take() {
            Some((g, e)) if g == generation => (g, e),
            _ => (generation, self.shared.engine()),
        }
    }

    fn put_engine(&mut self, engine: (u64, Arc<Engine>)) {
        self.engine = Some(engine);
    }

    async fn run(&mut self, client: &mut TcpStream, stop: &watch::Receiver<bool>) -> End {
        // One wait for shutdown for the whole connection, rather than one registered and
        // dropped per request. It completes at most once: every branch that sees it returns.
        let mut signal = stop.clone();
        let shutdown = async move { crate::serve::stopped(&mut signal).await };
        tokio::pin!(shutdown);
        let mut first = true;
        loop {
            let stopping = *stop.borrow();
            // Wait for a whole head: the header read timeout runs from the connection's start
            // for its first request, and from a head's first byte for the next ones; before
            // that first byte, the idle timeout.
            let mut head_started = first || !self.inbuf.is_empty();
            let mut deadline = Instant::now()
                + if head_started {
                    self.limits.header_read_timeout
                } else {
                    self.limits.idle_timeout
                };
            first = false;
            loop {
                if !self.inbuf.is_empty() {
                    // The usual case, a whole head ending in CRLF CRLF within the limit, is
                    // found without parsing it twice (exchange parses it).
                    if let Some(end) = head_end(&self.inbuf)
                        && end <= self.limits.max_header_bytes
                    {
                        break;
                    }
                    let mut h = [httparse::EMPTY_HEADER; MAX_HEADERS];
                    let too_large = match httparse::Request::new(&mut h).parse(&self.inbuf) {
                        Ok(httparse::Status::Complete(n)) if n <= self.limits.max_header_bytes => {
                            break;
                        }
                        Ok(httparse::Status::Complete(_)) => true,
                        Ok(httparse::Status::Partial) => {
                            self.inbuf.len() > self.limits.max_header_bytes
                        }
                        Err(_) => return End::Fallback(self.inbuf.split().freeze()),
                    };
                    if too_large {
                        self.write_problem(
                            client,
                            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                            "Request header fields too large",
                            None,
                            true,
                        )
                        .await;
                        return End::Close;
                    }
                    if !head_started {
                        head_started = true;
                        deadline = Instant::now() + self.limits.header_read_timeout;
                    }
                } else if stopping {
                    return End::Close;
                }
                let idle = self.inbuf.is_empty();
                self.inbuf.reserve(READ_CHUNK);
                let spare = self.inbuf.capacity() - self.inbuf.len();
                // The connection's one timer, moved only when it is due later than this wait
                // ends, or fires before it does: most requests touch no timer at all.
                if self.timer.deadline() > deadline {
                    self.timer.as_mut().reset(deadline);
                }
                let n = tokio::select! {
                    biased;
                    r = client.read_buf(&mut self.inbuf) => r,
                    () = self.timer.as_mut() => {
                        if Instant::now() < deadline {
                            self.timer.as_mut().reset(deadline);
                            continue;
                        }
                        // Slow loris or idle: closed without an answer, as hyper does.
                        return End::Close;
                    }
                    // Shutdown: a connection between requests closes.
                    _ = &mut shutdown, if idle => return End::Close,
                };
                match n {
                    Ok(0) | Err(_) => return End::Close,
                    // A short read took all the socket had: the next read would only find it
                    // empty (one wasted syscall per request), so wait for the next event.
                    Ok(n) if n < spare => clear_read_readiness(client),
                    Ok(_) => {}
                }
            }
            let engine = self.take_engine();
            let result = self.exchange(client, &engine.1, stopping).await;
            self.put_engine(engine);
            match result {
                Ok(true) => {}
                Ok(false) => return End::Close,
                Err(fallback) => return fallback,
            }
        }
    }

    /// One request and its response. `Ok(true)`: the connection may carry another request.
    async fn exchange(
        &mut self,
        client: &mut TcpStream,
        engine: &Engine,
        stopping: bool,
    ) -> Result<bool, End> {
        let Some(proxy) = engine.config().proxy.as_ref() else {
            self.write_problem(
                client,
                StatusCode::SERVICE_UNAVAILABLE,
                "Proxy disabled",
                Some("the running configuration has no [proxy] section"),
                false,
            )
            .await;
            return Ok(false);
        };
        let timeout = proxy.timeout;
        let authority = proxy.upstream.authority().cloned();

        let mut hbuf = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut hbuf);
        let head_len = match req.parse(&self.inbuf) {
            Ok(httparse::Status::Complete(n)) => n,
            _ => return Err(End::Fallback(self.inbuf.split().freeze())),
        };
        let head = match classify(&req) {
            Class::Relay(head) => head,
            Class::Fallback => return Err(End::Fallback(self.inbuf.split().freeze())),
            Class::Ambiguous => {
                // Where this request's body ends is a matter of opinion: one the upstream
                // might not share is never forwarded (request smuggling), and the connection
                // ends, as its next bytes cannot be trusted to start a request.
                self.write_problem(
                    client,
                    StatusCode::BAD_REQUEST,
                    "Ambiguous message framing",
                    Some("send one Content-Length, or Transfer-Encoding: chunked alone, not both"),
                    true,
                )
                .await;
                return Ok(false);
            }
        };
        let (Some(method), Some(target)) = (
            req.method
                .and_then(|m| Method::from_bytes(m.as_bytes()).ok()),
            req.path,
        ) else {
            return Err(End::Fallback(self.inbuf.split().freeze()));
        };

        // The headers the engine may read; values it cannot use are skipped, as a header map
        // would refuse them.
        self.map.clear();
        for h in req.headers.iter() {
            let Some(name) = engine.header_read(h.name) else {
                continue;
            };
            if let Ok(v) = HeaderValue::from_bytes(h.value) {
                self.map.append(name.clone(), v);
            }
        }
        let (rate_limit, verdict) = {
            // The host for route matching, straight from the head (not through the map).
            let host = req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("host"))
                .and_then(|h| std::str::from_utf8(h.value).ok());
            let info = RequestInfo::new(&method, target, &self.map)
                .with_host(host)
                .with_peer(Some(self.peer.ip()));
            let (_, rate_limit, verdict, _) = engine.evaluate_parts(&info).await;
            (rate_limit, verdict)
        };
        let hold = match verdict {
            Verdict::Respond(r) => {
                self.inbuf.advance(head_len);
                // The refused request's body is skipped when it is already here; otherwise the
                // connection closes after the answer rather than read it.
                let body_here = match head.framing {
                    Framing::None => true,
                    Framing::Length(n) => {
                        let whole = usize::try_from(n).is_ok_and(|n| n <= self.inbuf.len());
                        if whole {
                            self.inbuf.advance(n as usize);
                        }
                        whole
                    }
                    Framing::Chunked | Framing::Close => false,
                };
                let close = head.close || stopping || !body_here;
                self.out.clear();
                write_response(
                    &mut self.out,
                    r.status(),
                    &tollgate_http::problem::PROBLEM_JSON,
                    |out| r.write_headers(out),
                    r.body(),
                    close,
                );
                if client.write_all(&self.out).await.is_err() {
                    return Ok(false);
                }
                return Ok(!close);
            }
            Verdict::Hold(hold) => Some(hold),
            Verdict::Pass => None,
        };
        let Some(authority) = authority else {
            self.inbuf.advance(head_len);
            return Ok(self
                .answer_upstream_error(client, StatusCode::BAD_GATEWAY, &head, stopping)
                .await);
        };
        build_upstream_head(&mut self.uphead, &req, target, &authority, &self.peer_text);
        self.inbuf.advance(head_len);

        if let Some(hold) = hold {
            // Held for its slot; a client that goes away meanwhile drops the hold, which gives
            // its quota back.
            let wait = hold.wait();
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    _ = &mut wait => break,
                    r = client.read_buf(&mut self.inbuf), if self.inbuf.len() < HOLD_BUFFER => {
                        match r {
                            Ok(0) | Err(_) => return Ok(false),
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
                self.pool.checkout(&authority)
            };
            let (mut up, reused) = match pooled {
                Some(c) => (c, true),
                None => {
                    match tokio::time::timeout_at(deadline, crate::proxy::connect_tcp(&authority))
                        .await
                    {
                        Ok(Ok(c)) => (c, false),
                        Ok(Err(e)) => {
                            tracing::warn!(error = %e, "upstream connect failed");
                            return Ok(self
                                .answer_upstream_error(
                                    client,
                                    StatusCode::BAD_GATEWAY,
                                    &head,
                                    stopping,
                                )
                                .await);
                        }
                        Err(_) => {
                            return Ok(self
                                .answer_upstream_error(
                                    client,
                                    StatusCode::GATEWAY_TIMEOUT,
                                    &head,
                                    stopping,
                                )
                                .await);
                        }
                    }
                }
            };
            // A request that cannot be sent twice checks first that an idle connection is
            // still open (an upstream may have closed it on its idle timeout).
            if reused && !head.idempotent {
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
                    &head,
                    &rate_limit,
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
                        {
                            clear_read_readiness(&up);
                            self.pool.checkin(&authority, up);
                        }
                    }
                    return Ok(client_ok);
                }
                Relayed::ClientGone => return Ok(false),
                Relayed::Failed {
                    nothing_received,
                    timed_out,
                } => {
                    if reused && nothing_received && !timed_out && head.idempotent && !retried {
                        // The keep-alive race: the upstream closed the idle connection as the
                        // request went out. Once more on a fresh one.
                        retried = true;
                        continue;
                    }
                    let status = if timed_out {
                        StatusCode::GATEWAY_TIMEOUT
                    } else {
                        StatusCode::BAD_GATEWAY
                    };
                    return Ok(self
                        .answer_upstream_error(client, status, &head, stopping)
                        .await);
                }
                Relayed::Broken => return Ok(false),
            }
        }
    }

    /// Sends the request (head, then body by its framing) and relays the response, both ways
    /// at once: an upstream may answer before it has read the whole request body.
    async fn relay(
        &mut self,
        client: &mut TcpStream,
        up: &mut TcpStream,
        head: &ReqHead,
        rate_limit: &RateLimitHeaders,
        (deadline, gap): (Instant, std::time::Duration),
        stopping: bool,
    ) -> Relayed {
        let (mut cr, mut cw) = client.split();
        let (mut ur, mut uw) = up.split();
        // Set once the whole request is upstream: an answer that comes before (an early 413,
        // say) leaves the rest of the body on the client connection, which then closes, and
        // says so in the answer's head.
        let sent = std::sync::atomic::AtomicBool::new(false);
        let upload = upload(
            &mut cr,
            &mut self.inbuf,
            &mut uw,
            &mut self.uphead,
            head.framing,
            &sent,
        );
        let download = download(
            &mut ur,
            &mut self.upbuf,
            &mut cw,
            &mut self.out,
            rate_limit,
            head.is_head,
            (head.close || stopping, &sent),
            (deadline, gap),
            &mut self.timer,
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
                    // The upstream stopped reading: what it answers (or not) tells the rest.
                    Err(UploadError::Upstream) => uploaded = Some(false),
                },
            }
        };
        match down {
            Ok(d) => {
                // A request body not wholly read leaves the client connection mid-message.
                let body_done = uploaded == Some(true);
                Relayed::Done {
                    reusable: d.reusable && body_done,
                    client_ok: d.client_ok && body_done,
                }
            }
            Err(DownloadError::BeforeHead {
                nothing_received,
                timed_out,
            }) => {
                if uploaded.is_none() && head.framing != Framing::None {
                    // Part of the body is still unread: the answer must close the connection.
                    return Relayed::Failed {
                        nothing_received: false,
                        timed_out,
                    };
                }
                Relayed::Failed {
                    nothing_received,
                    timed_out,
                }
            }
            Err(DownloadError::AfterHead) => Relayed::Broken,
        }
    }

    /// A 502/504 problem (counted as an upstream error). `Ok(true)` when the connection can go on.
    async fn answer_upstream_error(
        &mut self,
        client: &mut TcpStream,
        status: StatusCode,
        head: &ReqHead,
        force_close: bool,
    ) -> bool {
        self.shared.metrics.upstream_error();
        // A body the upstream never took is still on the client connection: close after.
        let close = force_close || head.close || head.framing != Framing::None;
        let (title, detail) = if status == StatusCode::GATEWAY_TIMEOUT {
            ("Upstream timed out", "the upstream did not answer in time")
        } else {
            (
                "Upstream unavailable",
                "the upstream could not be reached or failed mid-answer",
            )
        };
        self.write_problem(client, status, title, Some(detail), close)
            .await
            && !close
    }

    /// Writes an RFC 9457 problem response. `false` when the client is gone.
    async fn write_problem(
        &mut self,
        client: &mut TcpStream,
        status: StatusCode,
        title: &str,
        detail: Option<&str>,
        close: bool,
    ) -> bool {
        let body = crate::response::problem_body(status, title, detail);
        self.out.clear();
        write_response(
            &mut self.out,
            status,
            &tollgate_http::problem::PROBLEM_JSON,
            |_| {},
            body.as_bytes(),
            close,
        );
        client.write_all(&self.out).await.is_ok()
    }
}

enum Relayed {
    Done {
        reusable: bool,
        client_ok: bool,
    },
    /// The client went away while the request was being sent.
    ClientGone,
    /// The upstream failed before a response head reached the client.
    Failed {
        nothing_received: bool,
        timed_out: bool,
    },
    /// The upstream failed mid-response: the client connection cannot go on.
    Broken,
}

/// What the relay makes of a request head.
enum Class {
    /// It relays the request.
    Relay(ReqHead),
    /// hyper's path takes the connection over (HTTP/1.0, `Expect`, `Upgrade`, `CONNECT`,
    /// absolute-form targets).
    Fallback,
    /// Its body's end is ambiguous (two lengths, a malformed length, both framings, a coding
    /// other than one `chunked`): answered 400, never forwarded.
    Ambiguous,
}

/// Reads the framing and connection options of a request.
fn classify(req: &httparse::Request<'_, '_>) -> Class {
    if req.version != Some(1) || !req.path.is_some_and(|p| p.starts_with('/')) {
        return Class::Fallback;
    }
    let Some(method) = req.method else {
        return Class::Fallback;
    };
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut close = false;
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            let Some(n) = parse_length(h.value) else {
                return Class::Ambiguous;
            };
            if length.is_some_and(|l| l != n) {
                return Class::Ambiguous;
            }
            length = Some(n);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            if chunked || !trim(h.value).eq_ignore_ascii_case(b"chunked") {
                return Class::Ambiguous;
            }
            chunked = true;
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in h.value.split(|b| *b == b',') {
                let token = trim(token);
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"upgrade") {
                    return Class::Fallback;
                }
            }
        } else if name.eq_ignore_ascii_case(b"expect") || name.eq_ignore_ascii_case(b"upgrade") {
            return Class::Fallback;
        }
    }
    let framing = match (chunked, length) {
        (true, Some(_)) => return Class::Ambiguous,
        (true, None) => Framing::Chunked,
        (false, Some(0) | None) => Framing::None,
        (false, Some(n)) => Framing::Length(n),
    };
    if method == "CONNECT" {
        return Class::Fallback;
    }
    Class::Relay(ReqHead {
        framing,
        close,
        is_head: method == "HEAD",
        idempotent: framing == Framing::None
            && matches!(
                method,
                "GET" | "HEAD" | "OPTIONS" | "PUT" | "DELETE" | "TRACE"
            ),
    })
}

fn trim(v: &[u8]) -> &[u8] {
    v.trim_ascii()
}

fn parse_length(v: &[u8]) -> Option<u64> {
    let v = trim(v);
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1). `transfer-encoding` is
/// not among them: a chunked body is relayed as it came, framing included.
fn hop_by_hop(name: &[u8]) -> bool {
    const HOP: [&[u8]; 8] = [
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"upgrade",
    ];
    HOP.iter().any(|h| name.eq_ignore_ascii_case(h))
}

/// Whether `name` is one the `Connection` headers list (hop-by-hop too).
fn listed_in_connection(headers: &[httparse::Header<'_>], name: &[u8]) -> bool {
    headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"))
        .flat_map(|h| h.value.split(|b| *b == b','))
        .any(|t| trim(t).eq_ignore_ascii_case(name))
}

/// The request head for the upstream: origin-form, HTTP/1.1, `Host` kept (the upstream's when
/// the client sent none), hop-by-hop headers dropped, `X-Forwarded-For` appended.
fn build_upstream_head(
    out: &mut Vec<u8>,
    req: &httparse::Request<'_, '_>,
    target: &str,
    authority: &Authority,
    client: &[u8],
) {
    out.clear();
    out.extend_from_slice(req.method.unwrap_or("GET").as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    // Names a `Connection` header lists beyond close/keep-alive are hop-by-hop too.
    let has_connection = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"))
        .flat_map(|h| h.value.split(|b| *b == b','))
        .map(trim)
        .any(|t| {
            !t.is_empty()
                && !t.eq_ignore_ascii_case(b"close")
                && !t.eq_ignore_ascii_case(b"keep-alive")
        });
    let mut host = false;
    let mut xff: Option<usize> = None;
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        if hop_by_hop(name) || (has_connection && listed_in_connection(req.headers, name)) {
            continue;
        }
        if name.eq_ignore_ascii_case(b"x-forwarded-for") {
            // Every earlier hop, in order, on one line; this one is added at the end.
            xff = Some(xff.map_or(0, |n| n + 1));
            continue;
        }
        if name.eq_ignore_ascii_case(b"host") {
            host = true;
        }
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    if !host {
        out.extend_from_slice(b"host: ");
        out.extend_from_slice(authority.as_str().as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"x-forwarded-for: ");
    if xff.is_some() {
        for h in req
            .headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("x-forwarded-for"))
        {
            let v = trim(h.value);
            if !v.is_empty() {
                out.extend_from_slice(v);
                out.extend_from_slice(b", ");
            }
        }
    }
    out.extend_from_slice(client);
    out.extend_from_slice(b"\r\n\r\n");
}

/// A complete response of our own (429, 502, ...): status line, `date`, `content-type`, the
/// lines `headers` writes (never `content-length` or `connection`), `content-length`,
/// `connection: close` when closing, and the body, in one buffer.
fn write_response(
    out: &mut Vec<u8>,
    status: StatusCode,
    content_type: &HeaderValue,
    headers: impl FnOnce(&mut Vec<u8>),
    body: &[u8],
    close: bool,
) {
    // Written piece by piece: the formatting machinery costs more than the rest of a 429.
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(&itoa3(status.as_u16()));
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\ndate: ");
    push_date(out);
    out.extend_from_slice(b"\r\ncontent-type: ");
    out.extend_from_slice(content_type.as_bytes());
    out.extend_from_slice(b"\r\n");
    headers(out);
    out.extend_from_slice(b"content-length: ");
    push_decimal(out, body.len());
    out.extend_from_slice(b"\r\n");
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
}

/// The current time as an HTTP date, formatted once a second per thread.
fn push_date(out: &mut Vec<u8>) {
    thread_local! {
        static CACHE: std::cell::RefCell<(u64, String)> = const { std::cell::RefCell::new((0, String::new())) };
    }
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != secs || c.1.is_empty() {
            *c = (secs, httpdate::fmt_http_date(now));
        }
        out.extend_from_slice(c.1.as_bytes());
    });
}

enum UploadError {
    /// The client closed or failed before its body was all read.
    Client,
    /// The upstream would not take the request.
    Upstream,
}

/// Writes the request head to the upstream, with the body's first bytes when they are already
/// here, then the rest of the body by its framing, verbatim.
async fn upload(
    cr: &mut ReadHalf<'_>,
    inbuf: &mut BytesMut,
    uw: &mut WriteHalf<'_>,
    head: &mut Vec<u8>,
    framing: Framing,
    sent: &std::sync::atomic::AtomicBool,
) -> Result<(), UploadError> {
    let mut body = Body::new(framing);
    // The head goes out with whatever body bytes are already here, in one write.
    let take = body.take(inbuf).map_err(|()| UploadError::Client)?;
    head.extend_from_slice(&inbuf[..take]);
    uw.write_all(head)
        .await
        .map_err(|_| UploadError::Upstream)?;
    // `head` is left whole: a request without a body that a reused connection loses is sent
    // again from it, on a new connection (the next request's head replaces it).
    inbuf.advance(take);
    body.consumed(take);
    while !body.done() {
        if inbuf.is_empty() {
            inbuf.reserve(READ_CHUNK);
            match cr.read_buf(inbuf).await {
                Ok(0) | Err(_) => return Err(UploadError::Client),
                Ok(_) => {}
            }
        }
        let take = body.take(inbuf).map_err(|()| UploadError::Client)?;
        uw.write_all(&inbuf[..take])
            .await
            .map_err(|_| UploadError::Upstream)?;
        inbuf.advance(take);
        body.consumed(take);
    }
    sent.store(true, Ordering::Relaxed);
    Ok(())
}

/// Tracks where a body ends as its bytes go by.
struct Body {
    framing: Framing,
    remaining: u64,
    chunked: ChunkedScanner,
    done: bool,
}

impl Body {
    fn new(framing: Framing) -> Self {
        Body {
            framing,
            remaining: match framing {
                Framing::Length(n) => n,
                _ => 0,
            },
            chunked: ChunkedScanner::default(),
            done: matches!(framing, Framing::None | Framing::Length(0)),
        }
    }

    /// How many of `buf`'s leading bytes belong to this body. `Err` on malformed chunking.
    fn take(&mut self, buf: &[u8]) -> Result<usize, ()> {
        if self.done {
            return Ok(0);
        }
        match self.framing {
            Framing::None => Ok(0),
            Framing::Length(_) => {
                Ok(usize::try_from(self.remaining).map_or(buf.len(), |r| r.min(buf.len())))
            }
            Framing::Chunked => {
                let n = self.chunked.scan(buf)?;
                if self.chunked.is_done() {
                    self.done = true;
                }
                Ok(n)
            }
            Framing::Close => Ok(buf.len()),
        }
    }

    /// Records that `n` bytes (from [`Body::take`]) went through.
    fn consumed(&mut self, n: usize) {
        if let Framing::Length(_) = self.framing {
            self.remaining -= n as u64;
            if self.remaining == 0 {
                self.done = true;
            }
        }
    }

    fn done(&self) -> bool {
        self.done
    }
}

/// Finds the end of a chunked body (RFC 9112 §7.1) without decoding it: sizes, extensions and
/// trailers are relayed as they came.
#[derive(Clone, Copy, Debug, Default)]
struct ChunkedScanner {
    state: ChunkState,
    size: u64,
    line: usize,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum ChunkState {
    /// In a chunk-size line: hex digits seen so far.
    #[default]
    Size,
    /// Past the size, in extensions.
    Ext,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    /// At the start of a trailer line (or of the final empty line).
    TrailerStart,
    Trailer,
    /// A trailer line's CR seen: its LF must follow.
    TrailerLf,
    FinalLf,
    Done,
}

impl ChunkedScanner {
    fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// How many of `buf`'s bytes belong to the body (all, unless it ends within `buf`).
    fn scan(&mut self, buf: &[u8]) -> Result<usize, ()> {
        let mut i = 0;
        while i < buf.len() {
            let b = buf[i];
            match self.state {
                ChunkState::Size => match b {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        let d = (b as char).to_digit(16).ok_or(())?;
                        if self.size > (u64::MAX >> 4) {
                            return Err(());
                        }
                        self.size = (self.size << 4) | u64::from(d);
                        self.line += 1;
                    }
                    b';' | b' ' | b'\t' if self.line > 0 => self.state = ChunkState::Ext,
                    b'\r' if self.line > 0 => self.state = ChunkState::SizeLf,
                    _ => return Err(()),
                },
                ChunkState::Ext => match b {
                    b'\r' => self.state = ChunkState::SizeLf,
                    b'\n' => return Err(()),
                    _ => {
                        self.line += 1;
                        if self.line > MAX_CHUNK_LINE {
                            return Err(());
                        }
                    }
                },
                ChunkState::SizeLf => {
                    if b != b'\n' {
                        return Err(());
                    }
                    self.line = 0;
                    self.state = if self.size == 0 {
                        ChunkState::TrailerStart
                    } else {
                        ChunkState::Data
                    };
                }
                ChunkState::Data => {
                    let avail = (buf.len() - i) as u64;
                    let n = avail.min(self.size);
                    self.size -= n;
                    i += n as usize;
                    if self.size == 0 {
                        self.state = ChunkState::DataCr;
                    }
                    continue;
                }
                ChunkState::DataCr => {
                    if b != b'\r' {
                        return Err(());
                    }
                    self.state = ChunkState::DataLf;
                }
                ChunkState::DataLf => {
                    if b != b'\n' {
                        return Err(());
                    }
                    self.state = ChunkState::Size;
                }
                // Lines end in CRLF here, never a bare LF: a recipient that accepts bare LF
                // (RFC 9112 §2.2 lets it) would end the body earlier than this scanner, and what
                // it then reads as a second request would never have been rate limited.
                ChunkState::TrailerStart => match b {
                    b'\r' => self.state = ChunkState::FinalLf,
                    b'\n' => return Err(()),
                    _ => {
                        self.state = ChunkState::Trailer;
                        self.line += 1;
                    }
                },
                ChunkState::Trailer => {
                    self.line += 1;
                    if self.line > MAX_TRAILERS {
                        return Err(());
                    }
                    match b {
                        b'\r' => self.state = ChunkState::TrailerLf,
                        b'\n' => return Err(()),
                        _ => {}
                    }
                }
                ChunkState::TrailerLf => {
                    if b != b'\n' {
                        return Err(());
                    }
                    self.state = ChunkState::TrailerStart;
                }
                ChunkState::FinalLf => {
                    if b != b'\n' {
                        return Err(());
                    }
                    self.state = ChunkState::Done;
                    return Ok(i + 1);
                }
                ChunkState::Done => return Ok(i),
            }
            i += 1;
        }
        Ok(i)
    }
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

/// Reads the upstream's response head (interim 1xx ones forwarded), writes it to the client
/// with the rate-limit headers, then relays the body by its framing.
#[allow(clippy::too_many_arguments)]
async fn download(
    ur: &mut ReadHalf<'_>,
    upbuf: &mut BytesMut,
    cw: &mut WriteHalf<'_>,
    out: &mut Vec<u8>,
    rate_limit: &RateLimitHeaders,
    is_head: bool,
    (close, sent): (bool, &std::sync::atomic::AtomicBool),
    (deadline, gap): (Instant, std::time::Duration),
    timer: &mut Pin<Box<tokio::time::Sleep>>,
) -> Result<Downloaded, DownloadError> {
    let mut received = false;
    if timer.deadline() > deadline {
        timer.as_mut().reset(deadline);
    }
    let before_head = || DownloadError::BeforeHead {
        nothing_received: false,
        timed_out: false,
    };
    let (framing, upstream_close, close) = loop {
        // Parse what is buffered; read more while the head is incomplete. Whether the request
        // is all upstream is read as the head is written: it may still be going up.
        let close = close || !sent.load(Ordering::Relaxed);
        match response_head(upbuf, out, rate_limit, is_head, close) {
            Err(()) => return Err(before_head()),
            Ok(Some(head)) => {
                upbuf.advance(head.len);
                if head.interim {
                    within(timer, gap, cw.write_all(out))
                        .await
                        .and_then(Result::ok)
                        .ok_or(DownloadError::AfterHead)?;
                    continue;
                }
                break (head.framing, head.upstream_close, close);
            }
            Ok(None) => {}
        }
        upbuf.reserve(READ_CHUNK);
        let read = tokio::select! {
            biased;
            r = ur.read_buf(upbuf) => r,
            () = timer.as_mut() => {
                if Instant::now() < deadline {
                    // Set for an earlier wait: now for this one.
                    timer.as_mut().reset(deadline);
                    continue;
                }
                return Err(DownloadError::BeforeHead {
                    nothing_received: !received,
                    timed_out: true,
                });
            }
        };
        match read {
            Ok(0) | Err(_) => {
                return Err(DownloadError::BeforeHead {
                    nothing_received: !received,
                    timed_out: false,
                });
            }
            Ok(_) => received = true,
        }
    };

    // The body, by its framing; its first bytes go out with the head, in one write.
    let mut body = Body::new(framing);
    loop {
        let take = body.take(upbuf).map_err(|()| DownloadError::AfterHead)?;
        if framing == Framing::Close {
            if take > 0 {
                push_chunk_header(out, take);
                out.extend_from_slice(&upbuf[..take]);
                out.extend_from_slice(b"\r\n");
            }
        } else if !out.is_empty() {
            out.extend_from_slice(&upbuf[..take]);
        }
        // Past the head, neither side may stall the exchange for longer than `gap` at a time
        // (nginx's proxy_read_timeout and send_timeout): an upstream that stops mid-body or a
        // client that stops reading would otherwise hold the connection, its task and its
        // place under max_connections for ever.
        if !out.is_empty() {
            within(timer, gap, cw.write_all(out))
                .await
                .and_then(Result::ok)
                .ok_or(DownloadError::AfterHead)?;
            out.clear();
        } else if take > 0 {
            within(timer, gap, cw.write_all(&upbuf[..take]))
                .await
                .and_then(Result::ok)
                .ok_or(DownloadError::AfterHead)?;
        }
        upbuf.advance(take);
        body.consumed(take);
        if body.done() {
            break;
        }
        upbuf.reserve(READ_CHUNK);
        let Some(read) = within(timer, gap, ur.read_buf(upbuf)).await else {
            return Err(DownloadError::AfterHead);
        };
        match read {
            Ok(0) if framing == Framing::Close => {
                within(timer, gap, cw.write_all(b"0\r\n\r\n"))
                    .await
                    .and_then(Result::ok)
                    .ok_or(DownloadError::AfterHead)?;
                return Ok(Downloaded {
                    reusable: false,
                    client_ok: !close,
                });
            }
            Ok(0) | Err(_) => return Err(DownloadError::AfterHead),
            Ok(_) => {}
        }
    }
    Ok(Downloaded {
        // Bytes past the response's end: the upstream is out of step; do not reuse it.
        reusable: !upstream_close && upbuf.is_empty(),
        client_ok: !close,
    })
}

/// Runs `io` until it completes or `gap` passes, on the connection's one timer; `None` when the
/// time ran out. The timer is moved only when it is due later than this wait ends, or fires
/// before it does, so a run of quick reads does not touch it.
async fn within<F: std::future::Future>(
    timer: &mut Pin<Box<tokio::time::Sleep>>,
    gap: std::time::Duration,
    io: F,
) -> Option<F::Output> {
    let deadline = Instant::now() + gap;
    if timer.deadline() > deadline {
        timer.as_mut().reset(deadline);
    }
    tokio::pin!(io);
    loop {
        tokio::select! {
            biased;
            r = &mut io => return Some(r),
            () = timer.as_mut() => {
                if Instant::now() >= deadline {
                    return None;
                }
                timer.as_mut().reset(deadline);
            }
        }
    }
}

/// A response head read from the upstream, already rewritten for the client.
struct ResponseHead {
    len: usize,
    /// A 1xx to forward before the final answer.
    interim: bool,
    framing: Framing,
    /// The upstream will close (or must be read to its end): not reusable.
    upstream_close: bool,
}

/// Parses the upstream's response head at the start of `upbuf` and writes the client's
/// version into `out`: hop-by-hop headers dropped, the rate-limit headers in place of any of
/// the same name, re-framed as chunked when the upstream delimits the body by closing.
/// `Ok(None)`: incomplete. Kept out of the async code so the parser's header array lives on
/// the stack, not in every download's future.
fn response_head(
    upbuf: &[u8],
    out: &mut Vec<u8>,
    rate_limit: &RateLimitHeaders,
    is_head: bool,
    close: bool,
) -> Result<Option<ResponseHead>, ()> {
    if upbuf.is_empty() {
        return Ok(None);
    }
    let mut h = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut h);
    match res.parse(upbuf) {
        Ok(httparse::Status::Complete(n)) => {
            rewrite_response_head(&res, n, out, rate_limit, is_head, close)
        }
        Ok(httparse::Status::Partial) if upbuf.len() <= MAX_RESPONSE_HEAD => Ok(None),
        // Many cookies, say: parsed again with room for as many as the size limit allows
        // in practice, on the heap, as this is rare.
        Err(httparse::Error::TooManyHeaders) => {
            let mut h = vec![httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
            let mut res = httparse::Response::new(&mut h);
            match res.parse(upbuf) {
                Ok(httparse::Status::Complete(n)) => {
                    rewrite_response_head(&res, n, out, rate_limit, is_head, close)
                }
                Ok(httparse::Status::Partial) if upbuf.len() <= MAX_RESPONSE_HEAD => Ok(None),
                _ => Err(()),
            }
        }
        _ => Err(()),
    }
}

/// [`response_head`] once the head is parsed (`len` bytes).
fn rewrite_response_head(
    res: &httparse::Response<'_, '_>,
    len: usize,
    out: &mut Vec<u8>,
    rate_limit: &RateLimitHeaders,
    is_head: bool,
    close: bool,
) -> Result<Option<ResponseHead>, ()> {
    let code = res.code.unwrap_or(0);
    if code == 101 || !(100..=999).contains(&code) {
        return Err(());
    }
    let interim = code < 200;
    debug_assert!(
        rate_limit.names().all(|n| may_be_rate_limit(n.as_bytes())),
        "the pre-filter must pass every header Tollgate sets"
    );
    let mut length: Option<u64> = None;
    let mut te_chunked: Option<bool> = None;
    let mut upstream_close = false;
    let mut keep_alive = false;
    // Names a `Connection` header lists beyond close/keep-alive are hop-by-hop too.
    let mut listed = false;
    for h in res.headers.iter() {
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            let n = parse_length(h.value).ok_or(())?;
            if length.is_some_and(|l| l != n) {
                return Err(());
            }
            length = Some(n);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            // Chunked must come last; anything else is read until the upstream closes.
            let last = h.value.rsplit(|b| *b == b',').next().map(trim);
            te_chunked = Some(last.is_some_and(|t| t.eq_ignore_ascii_case(b"chunked")));
        } else if name.eq_ignore_ascii_case(b"connection") {
            for t in h.value.split(|b| *b == b',').map(trim) {
                if t.eq_ignore_ascii_case(b"close") {
                    upstream_close = true;
                } else if t.eq_ignore_ascii_case(b"keep-alive") {
                    keep_alive = true;
                } else if !t.is_empty() {
                    listed = true;
                }
            }
        }
    }
    // HTTP/1.0 closes after each response unless it says keep-alive.
    if res.version == Some(0) && !keep_alive {
        upstream_close = true;
    }
    // A coding other than chunked (gzip, say) cannot be passed on without the header that
    // names it, and the client connection cannot be re-framed around it: 502, as nginx does.
    if te_chunked == Some(false) && !(interim || is_head || code == 204 || code == 304) {
        return Err(());
    }
    // Both framings: chunked wins, the length goes (RFC 9112 §6.3), and the connection that
    // sent such a response is not trusted with another request.
    let drop_length = te_chunked == Some(true);
    if drop_length && length.is_some() {
        upstream_close = true;
    }
    let framing = if interim || is_head || code == 204 || code == 304 {
        Framing::None
    } else {
        match (te_chunked, length) {
            (Some(_), _) => Framing::Chunked,
            (None, None) => Framing::Close,
            (None, Some(n)) => Framing::Length(n),
        }
    };
    if framing == Framing::Close {
        upstream_close = true;
    }
    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(&itoa3(code));
    out.push(b' ');
    match res.reason {
        Some(r) if !r.is_empty() => out.extend_from_slice(r.as_bytes()),
        _ => out.extend_from_slice(
            StatusCode::from_u16(code)
                .ok()
                .and_then(|s| s.canonical_reason())
                .unwrap_or("")
                .as_bytes(),
        ),
    }
    out.extend_from_slice(b"\r\n");
    for h in res.headers.iter() {
        let name = h.name.as_bytes();
        if hop_by_hop(name)
            || (listed && listed_in_connection(res.headers, name))
            || (!interim && may_be_rate_limit(name) && replaced_by(rate_limit, name))
            || (framing == Framing::Close && name.eq_ignore_ascii_case(b"transfer-encoding"))
            || (drop_length && name.eq_ignore_ascii_case(b"content-length"))
        {
            continue;
        }
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    if !interim {
        rate_limit.write(out);
        if framing == Framing::Close {
            // Re-framed as chunked, so the client connection outlives the upstream one.
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
        }
        if close {
            out.extend_from_slice(b"connection: close\r\n");
        }
    }
    out.extend_from_slice(b"\r\n");
    Ok(Some(ResponseHead {
        len,
        interim,
        framing,
        upstream_close,
    }))
}

/// Whether `name` could be one of the headers Tollgate sets (`ratelimit*`, `retry-after`,
/// `x-ratelimit-*`): most upstream headers are ruled out by their first byte, before any
/// comparison with the list.
fn may_be_rate_limit(name: &[u8]) -> bool {
    matches!(name.first(), Some(b'r' | b'R' | b'x' | b'X'))
}

/// Whether the rate-limit headers replace the upstream's header `name`.
fn replaced_by(rate_limit: &RateLimitHeaders, name: &[u8]) -> bool {
    rate_limit
        .names()
        .any(|n| name.eq_ignore_ascii_case(n.as_bytes()))
}

fn push_chunk_header(out: &mut Vec<u8>, n: usize) {
    use std::io::Write;
    let _ = write!(out, "{n:x}\r\n");
}

/// Whether the runtime has seen `s` turn readable (data, or the peer's close) since its
/// readiness was last cleared: an atomic load, no syscall. An idle upstream socket should never
/// be.
fn read_ready(s: &TcpStream) -> bool {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    s.poll_read_ready(&mut cx).is_ready()
}

/// Forgets that `s` was readable, without a syscall, so that its next read waits for the
/// next readiness event: for a socket known to be drained (a short read, or an upstream whose
/// answer was read to its end). Data that arrived meanwhile raises a new event.
fn clear_read_readiness(s: &TcpStream) {
    let _ = s.try_io(tokio::io::Interest::READABLE, || {
        Err::<(), _>(io::ErrorKind::WouldBlock.into())
    });
}

/// Where a head ending in CRLF CRLF ends, if `buf` holds one.
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// `n` in decimal.
fn push_decimal(out: &mut Vec<u8>, n: usize) {
    let n = u64::try_from(n).unwrap_or(u64::MAX);
    tollgate::headers::write_decimal(out, n);
}

/// A status code (100–999) as its three digits.
fn itoa3(code: u16) -> [u8; 3] {
    [
        b'0' + (code / 100 % 10) as u8,
        b'0' + (code / 10 % 10) as u8,
        b'0' + (code % 10) as u8,
    ]
}

/// A socket whose first reads come from bytes already taken off it (by the relay, before it
/// handed the connection to hyper).
struct Rewind {
    pre: Bytes,
    io: TcpStream,
}

impl AsyncRead for Rewind {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.pre.is_empty() {
            let n = self.pre.len().min(buf.remaining());
            buf.put_slice(&self.pre[..n]);
            self.pre.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_all(input: &[u8]) -> Result<(usize, bool), ()> {
        let mut s = ChunkedScanner::default();
        let n = s.scan(input)?;
        Ok((n, s.is_done()))
    }

    #[test]
    fn chunked_scanner_finds_the_end_and_stops_there() {
        let body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nx-trailer: 1\r\n\r\n";
        let mut input = body.to_vec();
        input.extend_from_slice(b"GET / HTTP/1.1\r\n");
        assert_eq!(scan_all(&input), Ok((body.len(), true)));
        assert_eq!(scan_all(b"0\r\n\r\n"), Ok((5, true)));
    }

    #[test]
    fn response_head_rewrites_for_the_client() {
        let mut out = Vec::new();
        let none = RateLimitHeaders::default();
        let raw = b"HTTP/1.1 200 OK\r\nConnection: keep-alive, x-hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nContent-Length: 2\r\nX-Up: 1\r\n\r\nok";
        let head = response_head(raw, &mut out, &none, false, false);
        let Ok(Some(head)) = head else {
            panic!("a complete head");
        };
        assert_eq!(
            (head.len, head.framing, head.upstream_close),
            (raw.len() - 2, Framing::Length(2), false)
        );
        assert_eq!(
            String::from_utf8_lossy(&out),
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Up: 1\r\n\r\n"
        );
        // No length: read until the upstream closes, and chunked for the client, who closes
        // when asked to.
        let head = response_head(
            b"HTTP/1.1 200 \r\nX-Up: 1\r\n\r\n",
            &mut out,
            &none,
            false,
            true,
        );
        assert!(matches!(
            head,
            Ok(Some(ResponseHead {
                framing: Framing::Close,
                upstream_close: true,
                ..
            }))
        ));
        assert_eq!(
            String::from_utf8_lossy(&out),
            "HTTP/1.1 200 OK\r\nX-Up: 1\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        );
        // HEAD and 304: no body whatever the length says; 1xx forwarded as interim.
        let head = response_head(
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n",
            &mut out,
            &none,
            true,
            false,
        );
        assert!(matches!(
            head,
            Ok(Some(ResponseHead {
                framing: Framing::None,
                ..
            }))
        ));
        let head = response_head(
            b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",
            &mut out,
            &none,
            false,
            false,
        );
        assert!(matches!(head, Ok(Some(ResponseHead { interim: true, .. }))));
        // Incomplete, then malformed.
        assert!(matches!(
            response_head(b"HTTP/1.1 200 OK\r\n", &mut out, &none, false, false),
            Ok(None)
        ));
        assert!(response_head(b"garbage\r\n\r\n", &mut out, &none, false, false).is_err());
        assert!(
            response_head(
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                &mut out,
                &none,
                false,
                false
            )
            .is_err()
        );
    }

    #[test]
    fn numbers_and_head_ends() {
        for n in [0usize, 7, 10, 429, 65536, usize::MAX] {
            let mut out = Vec::new();
            push_decimal(&mut out, n);
            assert_eq!(out, n.to_string().into_bytes());
        }
        assert_eq!(&itoa3(204), b"204");
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nrest"), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: a\r\n"), None);
    }

    #[test]
    fn chunked_scanner_resumes_byte_by_byte() {
        let body = b"a\r\n0123456789\r\n0\r\n\r\n";
        let mut s = ChunkedScanner::default();
        let mut total = 0;
        for b in body {
            total += s.scan(std::slice::from_ref(b)).unwrap_or(0);
        }
        assert_eq!(total, body.len());
        assert!(s.is_done());
    }

    #[test]
    fn chunked_scanner_rejects_malformed_framing() {
        assert!(scan_all(b"zz\r\n").is_err());
        assert!(scan_all(b"\r\n").is_err());
        assert!(scan_all(b"3\r\nabcX\r\n").is_err());
        assert!(scan_all(b"ffffffffffffffffff\r\n").is_err());
    }

    fn parse<'h, 'b>(
        h: &'h mut [httparse::Header<'b>],
        raw: &'b [u8],
    ) -> (httparse::Request<'h, 'b>, usize) {
        let mut req = httparse::Request::new(h);
        let n = match req.parse(raw) {
            Ok(httparse::Status::Complete(n)) => n,
            other => panic!("not a complete head: {other:?}"),
        };
        (req, n)
    }

    #[test]
    fn classify_leaves_the_unusual_to_hyper_and_refuses_the_ambiguous() {
        // 'r' relayed, 'f' handed to hyper, 'a' ambiguous (400).
        let cases: [(&[u8], char); 11] = [
            (b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", 'r'),
            (b"GET / HTTP/1.0\r\n\r\n", 'f'),
            (b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", 'f'),
            (
                b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n",
                'f',
            ),
            (
                b"GET / HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
                'f',
            ),
            (
                b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
                'a',
            ),
            (
                b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                'a',
            ),
            (
                b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
                'a',
            ),
            (
                b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                'a',
            ),
            (b"POST / HTTP/1.1\r\nContent-Length: +3\r\n\r\n", 'a'),
            (
                b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
                'r',
            ),
        ];
        for (raw, want) in cases {
            let mut h = [httparse::EMPTY_HEADER; 16];
            let (req, _) = parse(&mut h, raw);
            let got = match classify(&req) {
                Class::Relay(_) => 'r',
                Class::Fallback => 'f',
                Class::Ambiguous => 'a',
            };
            assert_eq!(got, want, "{}", String::from_utf8_lossy(raw));
        }
        let mut h = [httparse::EMPTY_HEADER; 16];
        let (req, _) = parse(
            &mut h,
            b"POST /x HTTP/1.1\r\ncontent-length: 12\r\nconnection: close\r\n\r\n",
        );
        let Class::Relay(head) = classify(&req) else {
            panic!("a plain POST is relayed");
        };
        assert_eq!(
            (head.framing, head.close, head.idempotent),
            (Framing::Length(12), true, false)
        );
    }

    #[test]
    fn upstream_head_keeps_host_drops_hop_by_hop_and_appends_the_client() {
        let mut h = [httparse::EMPTY_HEADER; 16];
        let (req, _) = parse(
            &mut h,
            b"GET /a?b=1 HTTP/1.1\r\nHost: api.example.com\r\nConnection: keep-alive, x-secret\r\nX-Secret: 1\r\nKeep-Alive: 5\r\nX-Forwarded-For: 192.0.2.1\r\nx-forwarded-for: 192.0.2.2\r\nX-Api-Key: k\r\n\r\n",
        );
        let mut out = Vec::new();
        let authority: Authority = "127.0.0.1:9".parse().unwrap_or_else(|_| unreachable!());
        build_upstream_head(&mut out, &req, "/a?b=1", &authority, b"10.0.0.7");
        assert_eq!(
            String::from_utf8_lossy(&out),
            "GET /a?b=1 HTTP/1.1\r\nHost: api.example.com\r\nX-Api-Key: k\r\nx-forwarded-for: 192.0.2.1, 192.0.2.2, 10.0.0.7\r\n\r\n"
        );
        // No Host (allowed to reach here only from a lenient client): the upstream's.
        let mut h = [httparse::EMPTY_HEADER; 4];
        let (req, _) = parse(&mut h, b"GET / HTTP/1.1\r\n\r\n");
        build_upstream_head(&mut out, &req, "/", &authority, b"::1");
        assert_eq!(
            String::from_utf8_lossy(&out),
            "GET / HTTP/1.1\r\nhost: 127.0.0.1:9\r\nx-forwarded-for: ::1\r\n\r\n"
        );
    }
}
