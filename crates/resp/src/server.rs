//! The listener: [`serve`] accepts connections (at most [`Limits::max_connections`]) and runs
//! each in its own task until the shutdown future completes, then drains them.

mod connection;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt as _;
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
    let handler = Arc::new(handler);
    let max = limits.max_connections.max(1);
    let permits = Arc::new(Semaphore::new(max));
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
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
            refuse(stream, &refusing);
            continue;
        };
        let handler = Arc::clone(&handler);
        let stop = stop_rx.clone();
        tokio::spawn(async move {
            connection::run(stream, &handler, limits, stop).await;
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
