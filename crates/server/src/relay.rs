//! The proxy listener: an HTTP/1.1 relay of its own, one thread per core.
//!
//! hyper's server and client are general: every request becomes a `Request` with a header map,
//! the upstream connection is driven by a task of its own, and a request crosses tasks (and
//! often threads) several times on its way through. A rate-limiting proxy needs much less:
//! read a head, decide, write the head again for the upstream, and copy the bodies by their
//! framing. Measured side by side (hyper's `http1` server and `client::conn::http1` on these
//! same per-core runtimes, with a per-thread pool), hyper cost about 1.6 times the relay's CPU
//! per proxied request, so the proxy is this relay, and only it: there is no second path.
//!
//! Its seams, one file each:
//! - `client.rs`: the client's connection, TCP or TLS;
//! - `conn.rs`: a client connection's loop: find a head, check it, decide, answer or forward;
//! - `head.rs`: request heads: found in linear time, checked, written again for the upstream;
//! - `exchange.rs`: one request up and its response down, at the same time;
//! - `body.rs`: where bodies end; chunked bodies decoded and written again canonically;
//! - `response.rs`: response heads written again for the client, and the relay's own answers;
//! - `pool.rs`: upstream connections, pooled per thread only when cleanly framed;
//! - `deadline.rs`: every read and write bounded, on one timer per connection;
//! - `queue.rs` and `delivery.rs`: the `queue` action's requests stored (`202 Accepted`) and
//!   their status answered, and their later delivery, written by the relay like any request.
//!
//! The invariant all of it keeps: every request the upstream reads is one the rate limiter
//! decided on, as that request (method, target, host, key), and every response a client reads
//! answers one of its own requests. See `docs/proxy.md`.

mod body;
mod client;
mod conn;
mod deadline;
mod delivery;
mod exchange;
mod head;
mod pool;
mod queue;
mod response;

pub(crate) use delivery::Upstream;
use pool::Pool;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::Shared;
use crate::serve::Limits;
use crate::tls::Tls;
use client::Client;
use conn::Conn;

/// Serves the proxy listener until `shutdown` turns true and its connections have drained:
/// the server's runtime accepts, and each connection is handed to the least busy of one
/// single-threaded runtime per core, where it stays.
///
/// Why not the server's runtime: a proxied request is two short socket round trips, and on a
/// work-stealing runtime each wake-up may hop threads (a cross-thread wake is a syscall). A
/// connection that stays on one thread, as an nginx worker does it, costs less per request.
/// Why one acceptor: threads racing for `accept` on a shared socket share connections out
/// unevenly, and the busier thread's connections make the latency tail.
///
/// With `tls`, each connection's handshake runs on its worker, as the connection's first step.
pub(crate) async fn serve_per_core(
    shared: Arc<Shared>,
    listener: tokio::net::TcpListener,
    shutdown: watch::Receiver<bool>,
    limits: Limits,
    tls: Option<Arc<Tls>>,
) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut workers = Vec::with_capacity(threads);
    let mut finished = Vec::with_capacity(threads);
    for i in 0..threads {
        match spawn_worker(i, Arc::clone(&shared), limits, tls.clone()) {
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
                    tls.clone(),
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
    tls: Option<Arc<Tls>>,
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
                            let tls = tls.clone();
                            conns.spawn(async move {
                                match TcpStream::from_std(stream) {
                                    Ok(stream) => {
                                        serve_connection(shared, pool, stream, peer, limits, stop, tls)
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

/// Serves one client connection of the proxy listener, after its TLS handshake when `tls`.
pub(crate) async fn serve_connection(
    shared: Arc<Shared>,
    pool: Arc<Pool>,
    stream: TcpStream,
    peer: SocketAddr,
    limits: Limits,
    stop: watch::Receiver<bool>,
    tls: Option<Arc<Tls>>,
) {
    let mut client = match tls {
        None => Client::Plain(stream),
        Some(tls) => match tls.accept(stream, peer, limits.header_read_timeout).await {
            Some(stream) => Client::Tls(Box::new(stream)),
            None => return,
        },
    };
    let mut conn = Conn::new(shared, pool, peer, limits);
    conn.run(&mut client, &stop).await;
    let _ = client.shutdown().await;
}
