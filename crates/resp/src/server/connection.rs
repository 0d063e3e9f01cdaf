//! One connection: read, answer every complete request in the buffer (up to the pipeline
//! bound) into one reply buffer, write it with one call, repeat. A malformed request is
//! answered `-ERR Protocol error: ...` after the requests before it, and closes this
//! connection only.

use std::time::Duration;

use bytes::{Buf as _, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::watch;
use tokio::time::{Instant, timeout, timeout_at};
use tollgate::{Clock, Store};

use super::Limits;
use crate::codec::{FrameLimits, Parsed, Protocol, ReplyBuf, parse_request};
use crate::decide::Decide;
use crate::handler::{Handler, Session};

/// The read buffer's size: many pipelined requests per read.
const READ_SIZE: usize = 16 * 1024;

/// Read into the buffer only with at least this much room.
const MIN_READ: usize = 4 * 1024;

/// Replies past this size are written before more requests are run, so a batch of large
/// replies (`ECHO`, `COMMAND`) is not all held at once.
const FLUSH_AT: usize = 64 * 1024;

/// How long a closing connection keeps reading (and dropping) what its client still sends, so
/// that closing does not reset the connection before the client has read the last replies.
const LINGER: Duration = Duration::from_secs(1);

/// And how much it reads at most meanwhile.
const LINGER_BYTES: usize = 64 * 1024;

/// A connection quiet for this long drops its buffers until its client sends again.
const RELEASE_AFTER: Duration = Duration::from_secs(1);

/// What a connection that has not given the password may send in one request: enough for
/// `AUTH` and `HELLO ... AUTH ... SETNAME ...`, as Redis bounds such a client (10 arguments,
/// 16 KiB), so that a client without the password cannot make the server hold the largest
/// requests it takes.
const UNAUTHENTICATED: FrameLimits = FrameLimits {
    max_request_bytes: 16 * 1024,
    max_args: 10,
};

/// How a batch ended.
enum End {
    /// Every complete request is answered: read more.
    Drained,
    /// The pipeline bound or the reply buffer stopped it: write, then go on without reading.
    More,
    /// `QUIT` or a protocol error: write, then close.
    Close,
    /// An HTTP request: close without writing.
    Abort,
}

/// Serves one connection until the client leaves, idles out, breaks the protocol, or `stop`
/// turns true (then it closes as soon as every request it has read is answered).
pub(super) async fn run<D: Decide, S: Store, C: Clock>(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    handler: &Handler<D, S, C>,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) {
    let frame = limits.frame();
    let max_pipeline = limits.max_pipeline.max(1);
    let mut session = handler.session(max_pipeline, limits.max_transaction_bytes.max(1));
    let mut input = BytesMut::with_capacity(READ_SIZE);
    let mut out = ReplyBuf::new(Protocol::Resp2);
    loop {
        let (used, end) = batch(
            handler,
            &mut session,
            &input,
            &frame,
            max_pipeline,
            &mut out,
        )
        .await;
        input.advance(used);
        if matches!(end, End::Abort) {
            // Nothing of this batch is answered, as Redis drops such a client.
            return;
        }
        if !out.is_empty() {
            // Flushed: a layer such as TLS may hold the end of what it took until asked to
            // (a no-op on plain TCP).
            let write = async {
                stream.write_all(out.as_bytes()).await?;
                stream.flush().await
            };
            let written = within(limits.write_timeout, write).await;
            if !matches!(written, Some(Ok(()))) {
                return;
            }
            out.clear();
        }
        match end {
            End::Close => return close_gracefully(stream).await,
            End::More => continue,
            End::Abort => return,
            End::Drained => {}
        }
        if *stop.borrow_and_update() {
            return;
        }
        if input.capacity() - input.len() < MIN_READ {
            input.reserve(READ_SIZE);
        }
        // Between requests, wait a moment with the buffers (shutdown is noticed once it has
        // passed: registering with the shutdown signal on every read of a busy connection
        // locks a list all connections share); mid-request, the whole idle time.
        let between = input.is_empty();
        let read = if between {
            within(
                quiet_after(limits.idle_timeout),
                stream.read_buf(&mut input),
            )
            .await
        } else {
            tokio::select! {
                read = within(limits.idle_timeout, stream.read_buf(&mut input)) => read,
                _ = stop.changed() => return,
            }
        };
        match read {
            Some(Ok(n)) if n > 0 => {}
            None if between => {
                if !quiet(
                    &mut stream,
                    limits.idle_timeout,
                    &mut stop,
                    &mut input,
                    &mut out,
                )
                .await
                {
                    return;
                }
            }
            // The client left, the socket failed, or it was idle too long.
            _ => return,
        }
    }
}

/// How long a connection waits between requests before it gives its buffers back: a second,
/// or the idle timeout if shorter.
fn quiet_after(idle: Duration) -> Duration {
    if idle.is_zero() {
        RELEASE_AFTER
    } else {
        RELEASE_AFTER.min(idle)
    }
}

/// A connection quiet since its last answers gives its buffers back (connections of client
/// pools mostly sit idle: 5,000 idle connections took 57 MB of the example server's memory
/// with their buffers, 32 MB without), then waits for its client for the rest of the idle
/// time, reading its first bytes onto the stack and into a new buffer. False once it should
/// close: idle too long, failed, gone, or shutting down.
async fn quiet(
    stream: &mut (impl AsyncRead + Unpin),
    idle: Duration,
    stop: &mut watch::Receiver<bool>,
    input: &mut BytesMut,
    out: &mut ReplyBuf,
) -> bool {
    *input = BytesMut::new();
    out.release();
    let rest = idle.saturating_sub(quiet_after(idle));
    if !idle.is_zero() && rest.is_zero() {
        return false;
    }
    let mut first = [0u8; 512];
    let read = tokio::select! {
        read = within(rest, stream.read(&mut first)) => read,
        _ = stop.changed() => return false,
    };
    match read {
        Some(Ok(n)) if n > 0 => {
            input.reserve(READ_SIZE);
            input.extend_from_slice(&first[..n]);
            true
        }
        _ => false,
    }
}

/// `io`'s result, or `None` once it has waited `limit` (never, for a zero limit).
async fn within<F: std::future::Future>(limit: Duration, io: F) -> Option<F::Output> {
    if limit.is_zero() {
        return Some(io.await);
    }
    timeout(limit, io).await.ok()
}

/// Runs the complete requests at the start of `input`, writing their replies to `out`; returns
/// the bytes they took and why it stopped.
async fn batch<D: Decide, S: Store, C: Clock>(
    handler: &Handler<D, S, C>,
    session: &mut Session,
    input: &[u8],
    frame: &FrameLimits,
    max_pipeline: usize,
    out: &mut ReplyBuf,
) -> (usize, End) {
    let mut used = 0;
    let mut answered = 0;
    loop {
        if out.len() >= FLUSH_AT {
            return (used, End::More);
        }
        // An `EXEC`'s commands, before any request after it, and apart from the pipeline
        // bound: the transaction was one request.
        if Handler::<D, S, C>::exec_pending(session) {
            handler.exec_next(session, out).await;
            continue;
        }
        if answered == max_pipeline {
            return (used, End::More);
        }
        let limits = if session.authenticated() {
            frame
        } else {
            &FrameLimits {
                max_request_bytes: frame
                    .max_request_bytes
                    .min(UNAUTHENTICATED.max_request_bytes),
                max_args: frame.max_args.min(UNAUTHENTICATED.max_args),
            }
        };
        match parse_request(&input[used..], limits) {
            Ok(Parsed::Request(request, len)) => {
                used += len;
                // An empty array or a blank line: no command, no reply (as Redis).
                if request.is_empty() {
                    continue;
                }
                handler.execute(session, &request, out).await;
                answered += 1;
                if session.abort {
                    return (used, End::Abort);
                }
                if session.close {
                    return (used, End::Close);
                }
            }
            Ok(Parsed::Incomplete) => return (used, End::Drained),
            Err(e) => {
                let mut line = b"ERR ".to_vec();
                line.extend_from_slice(e.message().as_bytes());
                out.error(&line);
                return (used, End::Close);
            }
        }
    }
}

/// Closes `stream` after its replies: a FIN first, then a short read of whatever the client
/// still sends, since closing a socket with unread input resets the connection, and a reset
/// can destroy replies the client has not read yet.
pub(super) async fn close_gracefully(mut stream: impl AsyncRead + AsyncWrite + Unpin) {
    let deadline = Instant::now() + LINGER;
    if timeout_at(deadline, stream.shutdown()).await.is_err() {
        return;
    }
    let mut sink = [0u8; 4096];
    let mut drained = 0;
    while drained < LINGER_BYTES {
        match timeout_at(deadline, stream.read(&mut sink)).await {
            Ok(Ok(n)) if n > 0 => drained += n,
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests;
