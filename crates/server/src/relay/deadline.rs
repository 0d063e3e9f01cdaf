//! The relay's waits, each bounded, on one timer per connection.
//!
//! Every read and every write of the relay has a deadline: a client that never reads its 429,
//! or an upstream that stops mid-body, would otherwise hold a connection, its task and its place
//! under `max_connections` for ever. One `Sleep` per connection serves them all, moved only when
//! a wait ends earlier than it is set for, so that a run of quick reads and writes touches no
//! timer at all.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// A deadline far enough away to mean "none yet".
pub(super) const FAR: Duration = Duration::from_secs(86_400);

/// The connection's one timer.
pub(super) type Timer = Pin<Box<Sleep>>;

/// A new timer, set for no wait yet.
pub(super) fn timer() -> Timer {
    Box::pin(tokio::time::sleep_until(Instant::now() + FAR))
}

/// Runs `io` until it completes or `deadline` passes; `None` when the time ran out.
pub(super) async fn until<F: Future>(
    timer: &mut Timer,
    deadline: Instant,
    io: F,
) -> Option<F::Output> {
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
                // Set for an earlier wait: now for this one.
                timer.as_mut().reset(deadline);
            }
        }
    }
}

/// Runs `io` for at most `gap` from now; `None` when the time ran out.
pub(super) async fn within<F: Future>(
    timer: &mut Timer,
    gap: Duration,
    io: F,
) -> Option<F::Output> {
    until(timer, Instant::now() + gap, io).await
}
