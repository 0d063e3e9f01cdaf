//! The listener: [`serve`] accepts connections (at most [`Limits::max_connections`]) and runs
//! each in its own task until the shutdown future completes, then drains them.
//! [`serve_over`] does the same over a [`Transport`] (TLS, in the server), whose handshake
//! runs in each connection's task.

mod connection;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tollgate::{Clock, Store};

use crate::codec::FrameLimits;
use crate::decide::Decide;
use crate::handler::Handler;

/// The bounds of a listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once. One more is told `-ERR max number of clients reached` and
    /// closed, as Redis does at its `maxclients`: clients keep their connections for long, so
    /// one past the bound fails at once rather than waiting unseen. Default 10,000.
    pub max_connections: usize,
    /// The largest request, in bytes: an array frame with its headers, any one bulk string, an
    /// inline line. Past it: a protocol error, and the connection closes. Default 64 KiB.
    pub max_request_bytes: usize,
    /// The most arguments in one request. Default 1024.
    pub max_args: usize,
    /// The most requests parsed from the read buffer before their replies are written: a
    /// client pipelining more waits for the first replies (it is read again only once they
    /// are written). Default 1024.
    pub max_pipeline: usize,
    /// The most bytes of arguments a transaction (`MULTI` ... `EXEC`) queues; it also queues
    /// at most [`max_pipeline`](Self::max_pipeline) commands. Past either, the transaction is
    /// discarded: the command is answered with an error and `EXEC` with `-EXECABORT`.
    /// Default 1 MiB.
    pub max_transaction_bytes: usize,
    /// A connection that sends nothing for this long is closed. Default 5 minutes; zero
    /// never closes it.
    pub idle_timeout: Duration,
    /// A client that takes none of its replies for this long is cut off. Default 10 s; zero
    /// waits for ever.
    pub write_timeout: Duration,
    /// How long shutdown waits for connections to finish the requests they have read.
    /// Default 30 s.
    pub drain: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        let frame = FrameLimits::default();
        Limits {
            max_connections: 10_000,
            max_request_bytes: frame.max_request_bytes,
            max_args: frame.max_args,
            max_pipeline: 1024,
            max_transaction_bytes: 1024 * 1024,
            idle_timeout: Duration::from_secs(300),
            write_timeout: Duration::from_secs(10),
            drain: Duration::from_secs(30),
        }
    }
}

impl Limits {
    fn frame(&self) -> FrameLimits {
        FrameLimits {
            max_request_bytes: self.max_request_bytes.max(16),
            max_args: self.max_args.max(1),
        }
    }
}

/// How many refused connections may be saying goodbye at once; past it they are just closed.
const MAX_REFUSING: usize = 64;

/// How an accepted TCP connection is spoken to: as it is ([`Plain`]), or through a layer such
/// as TLS, whose handshake [`open`](Transport::open) runs in the connection's own task, so a
/// slow client delays nobody else.
pub trait Transport: Send + Sync + 'static {
    /// What requests are read from and replies written to.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// The connection from `peer` ready for requests, or `None` to close it (a failed or late
    /// handshake: the transport has dealt with the client).
    fn open(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
    ) -> impl Future<Output = Option<Self::Io>> + Send;

    /// Whether bytes written to a fresh TCP connection reach the client as they are. A
    /// connection past [`Limits::max_connections`] is then told why before it closes; through
    /// TLS it is closed without a handshake, which would cost the most when there is least
    /// to spare.
    fn is_plain(&self) -> bool;
}

/// The bytes of the TCP connection, as they are.
#[derive(Clone, Copy, Debug, Default)]
pub struct Plain;

impl Transport for Plain {
    type Io = TcpStream;

    async fn open(&self, stream: TcpStream, _peer: SocketAddr) -> Option<TcpStream> {
        Some(stream)
    }

    fn is_plain(&self) -> bool {
        true
    }
}

/// Serves the Redis protocol on `listener` with `handler` until `shutdown` completes; then
/// stops accepting, lets each connection answer what it has read, and waits up to
/// [`Limits::drain`] for them to close.
///
/// Errors accepting a connection (out of file descriptors) are retried after a short pause,
/// never fatal; the result is `Ok` once drained.
pub async fn serve<D, S, C>(
    listener: TcpListener,
    handler: Handler<D, S, C>,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    D: Decide,
    S: Store,
    C: Clock,
{
    serve_over(listener, Plain, handler, limits, shutdown).await
}

/// [`serve`] over `transport`: each accepted connection is [opened](Transport::open) in its
/// own task, and counts against [`Limits::max_connections`] from its acceptance.
pub async fn serve_over<T, D, S, C>(
    listener: TcpListener,
    transport: T,
    handler: Handler<D, S, C>,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    T: Transport,
    D: Decide,
    S: Store,
    C: Clock,
{
    let transport = Arc::new(transport);
    let handler = Arc::new(handler);
    let max = limits.max_connections.max(1);
    let permits = Arc::new(Semaphore::new(max));
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "resp: accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            if transport.is_plain() {
                refuse(stream, &refusing);
            }
            continue;
        };
        let handler = Arc::clone(&handler);
        let transport = Arc::clone(&transport);
        let stop = stop_rx.clone();
        tokio::spawn(async move {
            if let Some(io) = transport.open(stream, peer).await {
                connection::run(io, &handler, limits, stop).await;
            }
            drop(permit);
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection holds a permit: getting them all back means all have closed.
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    if tokio::time::timeout(limits.drain, permits.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!("resp: connections still open after the drain period");
    }
    Ok(())
}

/// Tells a connection over the bound why it is closed, as Redis does, then closes it.
fn refuse(mut stream: TcpStream, refusing: &Arc<Semaphore>) {
    const FULL: &[u8] = b"-ERR max number of clients reached\r\n";
    let Ok(permit) = Arc::clone(refusing).try_acquire_owned() else {
        return;
    };
    tokio::spawn(async move {
        let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(FULL)).await;
        connection::close_gracefully(stream).await;
        drop(permit);
    });
}
