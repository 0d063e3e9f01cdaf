//! The accept loop every listener shares: HTTP/1.1 with a header read timeout (slow-loris), a
//! header size bound, a connection limit, and a graceful drain on shutdown; over TLS when the
//! listener has it (`tls.rs`).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};

pub use tollgate_config::Limits;

use crate::response::Body;
use crate::tls::Tls;

/// Completes once `rx` turns true (or its sender is gone).
pub(crate) async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// Serves `handler` on `listener` with hyper's HTTP/1.1 server until `shutdown` turns true,
/// then drains. With `tls`, each connection's handshake comes first, in its own task, within
/// the header read timeout.
pub(crate) async fn serve<H, F>(
    name: &'static str,
    listener: TcpListener,
    handler: H,
    shutdown: watch::Receiver<bool>,
    limits: Limits,
    tls: Option<Arc<Tls>>,
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
            async move {
                match tls {
                    None => serve_bounded(name, stream, peer, handler, limits, stop).await,
                    Some(tls) => {
                        let Some(stream) =
                            tls.accept(stream, peer, limits.header_read_timeout).await
                        else {
                            return;
                        };
                        serve_bounded(name, stream, peer, handler, limits, stop).await;
                    }
                }
            }
        },
        shutdown,
        limits,
    )
    .await;
}

/// [`serve_http1`] over `stream` with its writes bounded in time.
async fn serve_bounded<S, H, F>(
    name: &'static str,
    stream: S,
    peer: SocketAddr,
    handler: H,
    limits: Limits,
    stop: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Send + 'static,
    H: Fn(SocketAddr, Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    // A client that takes no byte of an answer for the header read timeout is cut off: one
    // that never reads would otherwise hold its connection, and megabytes of send buffer, for
    // ever (hyper bounds reading a head, not writing an answer).
    let mut io = tokio_io_timeout::TimeoutStream::new(stream);
    io.set_write_timeout(Some(limits.header_read_timeout));
    serve_http1(
        name,
        TokioIo::new(Box::pin(io)),
        peer,
        handler,
        limits,
        stop,
    )
    .await;
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
    loop {
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
