//! The accept loop every listener shares: HTTP/1.1, and HTTP/2 with prior knowledge (h2c) on
//! the same port, with a header read timeout (slow-loris), a header size bound, a connection
//! limit, a write timeout, and a graceful drain on shutdown; over TLS when the listener has it
//! (`tls.rs`).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};

pub use tollgate_config::Limits;

use crate::response::Body;
use crate::tls::Tls;

pub(crate) mod quick;

/// Completes once `rx` turns true (or its sender is gone).
pub(crate) async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// The most requests in flight on one HTTP/2 connection: each holds a task and its buffers,
/// and `max_connections` bounds connections, not streams.
const MAX_H2_STREAMS: u32 = 256;

/// Serves `handler` on `listener` with hyper's HTTP/1.1 server, or its HTTP/2 server for a
/// client that opens with the HTTP/2 preface (h2c with prior knowledge), until `shutdown` turns
/// true, then drains. With `tls`, each connection's handshake comes first, in its own task,
/// within the header read timeout.
pub(crate) async fn serve<H, F, Q: quick::Quick>(
    name: &'static str,
    listener: TcpListener,
    handler: H,
    shutdown: watch::Receiver<bool>,
    limits: Limits,
    tls: Option<Arc<Tls>>,
    quick: Option<Arc<Q>>,
) where
    H: Fn(SocketAddr, Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    accept_loop(
        name,
        listener,
        move |stream, peer, stop| {
            let handler = handler.clone();
            let tls = tls.clone();
            let quick = quick.clone();
            async move {
                let conn = Conn {
                    name,
                    peer,
                    limits,
                    quick,
                };
                match tls {
                    None => serve_connection(conn, stream, handler, stop).await,
                    Some(tls) => {
                        let Some(stream) =
                            tls.accept(stream, peer, limits.header_read_timeout).await
                        else {
                            return;
                        };
                        serve_connection(conn, stream, handler, stop).await;
                    }
                }
            }
        },
        shutdown,
        limits,
    )
    .await;
}

/// The start of the HTTP/2 connection preface (RFC 9113 §3.4). `PRI` is a reserved method that
/// no HTTP/1.1 request uses, so four bytes tell the two apart.
const H2_PREFACE: &[u8] = b"PRI ";

/// One connection of [`serve`]: reads its first bytes, then hands them and the connection to
/// the HTTP/1.1 or the HTTP/2 server. A client that sends nothing within the header read
/// timeout is cut off, as a slow HTTP/1.1 head is; one that sends its first bytes late has the
/// timeout again for the rest of its head (hyper's timer starts there), so at most twice.
/// Why not `hyper_util`'s `auto` builder: its HTTP/1.1 side has no header size bound (only a
/// buffer size), and it waits for the first bytes without any timeout.
/// What a connection is served with besides its handler.
struct Conn<Q> {
    name: &'static str,
    peer: SocketAddr,
    limits: Limits,
    /// The quick lane for checks, on the decision listener.
    quick: Option<Arc<Q>>,
}

async fn serve_connection<S, H, F, Q: quick::Quick>(
    conn: Conn<Q>,
    mut stream: S,
    handler: H,
    mut stop: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(SocketAddr, Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let Conn {
        name,
        peer,
        limits,
        quick,
    } = conn;
    let mut head = [0; H2_PREFACE.len()];
    let read = tokio::time::timeout(
        limits.header_read_timeout,
        read_head(&mut stream, &mut head),
    );
    let read = tokio::select! {
        read = read => read,
        // Shutting down: a connection that has not sent a byte has nothing in flight.
        _ = crate::serve::stopped(&mut stop) => return,
    };
    let (len, h2) = match read {
        Ok(Ok(Some(read))) => read,
        // Closed before a byte, or nothing within the header read timeout.
        Ok(Ok(None)) | Err(_) => return,
        Ok(Err(e)) => {
            tracing::debug!(listener = name, %peer, error = %e, "connection ended");
            return;
        }
    };
    let read = match (&quick, h2) {
        (Some(quick), false) => {
            match quick::serve(stream, &head[..len], &**quick, limits, &mut stop).await {
                quick::Left::Closed => return,
                quick::Left::HandOff(io, read) => {
                    stream = io;
                    read
                }
            }
        }
        _ => Bytes::copy_from_slice(&head[..len]),
    };
    // A client that takes no byte of an answer for the header read timeout is cut off: one
    // that never reads would otherwise hold its connection, and megabytes of send buffer, for
    // ever (hyper bounds reading a head, not writing an answer).
    let mut io = tokio_io_timeout::TimeoutStream::new(stream);
    io.set_write_timeout(Some(limits.header_read_timeout));
    let io = TokioIo::new(Replay {
        read,
        io: Box::pin(io),
    });
    if h2 {
        serve_http2(name, io, peer, handler, limits, stop).await;
    } else {
        serve_http1(name, io, peer, handler, limits, stop).await;
    }
}

/// Reads the first bytes of a connection into `head`, until they are the start of the HTTP/2
/// preface (`true`) or cannot be (`false`); with how many were read. `None`: closed first.
async fn read_head<S: AsyncRead + Unpin>(
    stream: &mut S,
    head: &mut [u8; H2_PREFACE.len()],
) -> io::Result<Option<(usize, bool)>> {
    let mut len = 0;
    while len < head.len() {
        let n = stream.read(&mut head[len..]).await?;
        if n == 0 {
            return Ok((len > 0).then_some((len, false)));
        }
        len += n;
        if head[..len] != H2_PREFACE[..len] {
            return Ok(Some((len, false)));
        }
    }
    Ok(Some((len, true)))
}

/// A connection whose first bytes were read already: reads give them back first.
struct Replay<S> {
    read: Bytes,
    io: Pin<Box<S>>,
}

impl<S: AsyncRead> AsyncRead for Replay<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.read.is_empty() {
            let n = self.read.len().min(buf.remaining());
            let head = self.read.split_to(n);
            buf.put_slice(&head);
            return Poll::Ready(Ok(()));
        }
        self.io.as_mut().poll_read(cx, buf)
    }
}

impl<S: AsyncWrite> AsyncWrite for Replay<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.io.as_mut().poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.io.as_mut().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.io.as_mut().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.io.as_mut().poll_shutdown(cx)
    }
}

/// Serves one HTTP/2 connection: at most [`MAX_H2_STREAMS`] requests at once, header blocks
/// bounded by `max_header_bytes` (431 past it), and closed (GOAWAY) once no request has been
/// in flight or started for the header read timeout, so a client that opens a connection and
/// sends no complete request is cut off as a slow HTTP/1.1 one is; gracefully shut down once
/// `stop` turns true.
async fn serve_http2<I, H, F>(
    name: &'static str,
    io: I,
    peer: SocketAddr,
    handler: H,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    H: Fn(SocketAddr, Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_H2_STREAMS)
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
    let activity = Arc::new(Activity::default());
    let seen = Arc::clone(&activity);
    let svc = service_fn(move |req: Request<Incoming>| {
        let h = handler.clone();
        let active = Active::new(&seen);
        let head = req.method() == hyper::Method::HEAD;
        async move {
            let mut response = h(peer, req).await;
            drop(active);
            // An answer to HEAD has no content (RFC 9110 §9.3.2). hyper leaves it out over
            // HTTP/1.1 itself, but sends it over HTTP/2, which strict clients refuse.
            if head {
                *response.body_mut() = crate::response::full(Bytes::new());
            }
            Ok::<_, Infallible>(response)
        }
    });
    let conn = builder.serve_connection(io, svc);
    tokio::pin!(conn);
    let idle = async {
        let mut started = activity.started.load(Ordering::Relaxed);
        loop {
            tokio::time::sleep(limits.header_read_timeout).await;
            let now = activity.started.load(Ordering::Relaxed);
            if now == started && activity.in_flight.load(Ordering::Relaxed) == 0 {
                return;
            }
            started = now;
        }
    };
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(listener = name, %peer, error = %e, "connection ended");
            }
        }
        _ = crate::serve::stopped(&mut stop) => {
            // GOAWAY, then the requests in flight finish (within the listener's drain).
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
        _ = idle => {
            // GOAWAY; a client that holds the connection a header read timeout more (a header
            // block never finished) is cut off.
            tracing::debug!(listener = name, %peer, "idle HTTP/2 connection closed");
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(limits.header_read_timeout, conn).await;
        }
    }
}

/// Requests of one HTTP/2 connection: started so far, and in flight now.
#[derive(Default)]
struct Activity {
    started: AtomicU64,
    in_flight: AtomicUsize,
}

/// One request in flight; it counts until dropped (answered, or cancelled by a reset).
struct Active(Arc<Activity>);

impl Active {
    fn new(activity: &Arc<Activity>) -> Self {
        activity.started.fetch_add(1, Ordering::Relaxed);
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        Active(Arc::clone(activity))
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves one connection with hyper's HTTP/1.1 server (header read timeout, header size bound,
/// keep-alive), shutting it down gracefully once `stop` turns true.
pub(crate) async fn serve_http1<I, H, F>(
    name: &'static str,
    io: I,
    peer: SocketAddr,
    handler: H,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    H: Fn(SocketAddr, Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.max_header_bytes)
        .keep_alive(true);
    let svc = service_fn(move |req| {
        let h = handler.clone();
        async move { Ok::<_, Infallible>(h(peer, req).await) }
    });
    let conn = builder.serve_connection(io, svc);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(listener = name, %peer, error = %e, "connection ended");
            }
        }
        _ = crate::serve::stopped(&mut stop) => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// Accepts connections on `listener` (at most `limits.max_connections` at once, TCP_NODELAY)
/// and runs `conn` for each until `shutdown` turns true, then waits for them to drain.
pub(crate) async fn accept_loop<C, F>(
    name: &'static str,
    listener: TcpListener,
    conn: C,
    mut shutdown: watch::Receiver<bool>,
    limits: Limits,
) where
    C: Fn(TcpStream, SocketAddr, watch::Receiver<bool>) -> F + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    // When the listener last said it was full: at most once a minute, so a flood of
    // connections (or a slow-loris attack) is seen in the log without drowning it.
    let mut said_full: Option<tokio::time::Instant> = None;
    loop {
        if permits.available_permits() == 0
            && said_full.is_none_or(|at| at.elapsed() >= Duration::from_secs(60))
        {
            said_full = Some(tokio::time::Instant::now());
            tracing::warn!(
                listener = name,
                max_connections = limits.max_connections,
                "every connection this listener may hold is open: new clients wait in the \
                 accept queue until one closes (raise [server] max_connections, or look for \
                 clients that hold connections without sending)"
            );
        }
        let permit = tokio::select! {
            p = Arc::clone(&permits).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = crate::serve::stopped(&mut shutdown) => break,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(listener = name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = crate::serve::stopped(&mut shutdown) => break,
        };
        let _ = stream.set_nodelay(true);
        let task = conn(stream, peer, shutdown.clone());
        tokio::spawn(async move {
            task.await;
            drop(permit);
        });
    }
    drop(listener);
    // Every connection holds a permit: getting them all back means all have drained.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(limits.drain, permits.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!(
            listener = name,
            "shutdown: connections still open after the drain period"
        );
    }
}
