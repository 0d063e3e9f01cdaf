//! The future [`Limiter::check`](super::Limiter::check) returns: for a store that
//! [is immediate](Store::is_immediate) (the memory store), a few words that decide on their first
//! poll, with no state machine around them; for the others, an `async` block. And the memory
//! store's synchronous checks, [`Limiter::check_now`](super::Limiter::check_now), which are the
//! same decision without the future.
//!
//! Why not just an `async fn`: its state machine holds the arguments, the store's future and
//! the decision in flight, and converts the store's result into the limiter's, which cost about
//! a fifth of a memory-store check (measured with callgrind in `benches/check.rs`).

use std::future::Future;
use std::pin::{Pin, pin};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use pin_project_lite::pin_project;

use super::Limiter;
use crate::store::Store;
use crate::{BanStatus, Check, Clock, Decision, Error, MemoryStore, Policy, StoreError, Timestamp};

/// The policy a check is against: by name, or resolved beforehand
/// ([`Limiter::check_policy`](super::Limiter::check_policy)). One decision function takes
/// both, so the store's step is inlined in one place.
#[derive(Clone, Copy)]
pub(super) enum Target<'a> {
    Name(&'a str),
    Policy(&'a Policy),
}

pin_project! {
    /// One check in flight.
    #[project = CheckProjection]
    pub(super) enum CheckFuture<'a, S, C, K, F> {
        /// An immediate store: decided on the first poll.
        Immediate {
            limiter: &'a Limiter<S, C>,
            policy: Target<'a>,
            key: K,
            cost: u32,
            done: bool,
        },
        /// Any other store.
        Deferred {
            limiter: &'a Limiter<S, C>,
            #[pin]
            future: F,
        },
    }
}

impl<'a, S, C, K, F> CheckFuture<'a, S, C, K, F> {
    /// Decides on the first poll.
    #[inline]
    pub(super) fn immediate(
        limiter: &'a Limiter<S, C>,
        policy: Target<'a>,
        key: K,
        cost: u32,
    ) -> Self {
        CheckFuture::Immediate {
            limiter,
            policy,
            key,
            cost,
            done: false,
        }
    }

    /// Awaits `future`.
    pub(super) fn deferred(limiter: &'a Limiter<S, C>, future: F) -> Self {
        CheckFuture::Deferred { limiter, future }
    }
}

impl<S, C, K, F> Future for CheckFuture<'_, S, C, K, F>
where
    S: Store,
    C: Clock,
    K: AsRef<[u8]>,
    F: Future<Output = Result<Decision, Error>>,
{
    type Output = Result<Decision, Error>;

    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            CheckProjection::Immediate {
                limiter,
                policy,
                key,
                cost,
                done,
            } => {
                if *done {
                    // Polled again after completing: stays pending, as a fused future would.
                    return Poll::Pending;
                }
                *done = true;
                Poll::Ready(
                    decide_now(limiter, policy, key.as_ref(), *cost).map(Reordered::into_decision),
                )
            }
            CheckProjection::Deferred { limiter, future } => {
                // Never true of a store that keeps its word: `check` chose this variant because
                // the store was not immediate. Asking lets the compiler drop the arm for the
                // memory store, which keeps this poll small enough for callers to inline.
                if limiter.store().is_immediate() {
                    return Poll::Ready(Err(not_as_promised(
                        "a store that was not immediate when a check began says it is now",
                    )));
                }
                poll_deferred(future, cx)
            }
        }
    }
}

/// Synchronous checks, for the memory store: it never waits, so code that is not async (or that
/// is, but has no reason to go through a future) decides without an executor.
impl<C: Clock> Limiter<MemoryStore, C> {
    /// [`check`](Limiter::check), decided on the spot: the same decision, with no future to
    /// poll and no executor to poll it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Limiter, Policy, Quota};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::new("api", Quota::sliding_window_counter(2, Duration::from_secs(60))?)?)
    ///     .build()?;
    /// assert!(limiter.check_now("api", "customer-42", 1)?.allowed);
    /// assert!(limiter.check_now("api", "customer-42", 1)?.allowed);
    /// let third = limiter.check_now("api", "customer-42", 1)?;
    /// assert!(!third.allowed);
    /// assert!(third.retry_after.is_some());
    /// # Ok(())
    /// # }
    /// ```
    #[inline]
    pub fn check_now(
        &self,
        policy: &str,
        key: impl AsRef<[u8]>,
        cost: u32,
    ) -> Result<Decision, Error> {
        decide_now(self, &Target::Name(policy), key.as_ref(), cost).map(Reordered::into_decision)
    }

    /// [`check_policy`](Limiter::check_policy), decided on the spot (see
    /// [`check_now`](Self::check_now)).
    #[inline]
    pub fn check_policy_now(
        &self,
        policy: &Policy,
        key: impl AsRef<[u8]>,
        cost: u32,
    ) -> Result<Decision, Error> {
        decide_now(self, &Target::Policy(policy), key.as_ref(), cost).map(Reordered::into_decision)
    }
}

/// Polls a waiting store's check, out of line: kept out of the poll above, it leaves that poll
/// small enough for callers to inline, which the memory store's checks gain from.
#[inline(never)]
fn poll_deferred<F: Future>(future: Pin<&mut F>, cx: &mut Context<'_>) -> Poll<F::Output> {
    future.poll(cx)
}

/// The check, decided by the store on the spot ([`Store::apply_one_immediately`]) or else by
/// polling its future once: an immediate store promises that it is ready then (a store that
/// breaks the promise gets a store error, as `is_immediate` says).
///
/// Out of line, and not generic over the key: the future stays a few words that the caller's
/// poll folds away. The decision comes back [reordered](Reordered), and the caller's inlined
/// poll builds the `Decision` from it.
///
/// The target comes by reference: by value it would be a seventh argument, passed on the stack
/// (about 25 instructions more per check, callgrind).
#[inline(never)]
fn decide_now<S: Store, C: Clock>(
    limiter: &Limiter<S, C>,
    policy: &Target<'_>,
    key: &[u8],
    cost: u32,
) -> Result<Reordered, Error> {
    let policy = match *policy {
        Target::Name(name) => limiter.require(name)?,
        Target::Policy(policy) => policy,
    };
    let (check, now) = limiter.prepare(policy, key, cost)?;
    if let Some(decision) = limiter.store().apply_one_immediately(now, check) {
        return Ok(Reordered::of(decision));
    }
    poll_once(limiter.store(), now, check.policy, check.key, check.cost).map(Reordered::of)
}

/// A [`Decision`] with its fields in another order: how [`decide_now`] hands a decision back.
///
/// Why: callers copy what a future gives them (an executor returning a future's output, an
/// `.await` keeping it). A value laid out as the `Decision` it becomes is copied whole, in
/// 16-byte pieces, right after `decide_now` wrote it in 8-byte words, and the processor cannot
/// forward such a read from its store buffer: it waits until the writes reach the cache. Built
/// from another layout, the `Decision` is copied field by field, each read the size of its
/// write. The order below is measured: with `policy` first, the caller read the name's length
/// and `limit` with one 16-byte load, and waited again. One hot key, `benches/calling.rs`:
/// `check(..).await` under tokio went from 25 to 19 ns, `futures::executor::block_on(check(..))`
/// from 27 to 22 ns; a decision polled once and `check_now` are unchanged.
#[repr(C)]
struct Reordered {
    limit: u64,
    reset: Duration,
    remaining: u64,
    retry_after: Option<Duration>,
    policy: &'static str,
    ban: BanStatus,
    delay: Option<Duration>,
    allowed: bool,
}

impl Reordered {
    #[inline(always)]
    fn of(d: Decision) -> Reordered {
        Reordered {
            limit: d.limit,
            reset: d.reset,
            remaining: d.remaining,
            retry_after: d.retry_after,
            policy: d.policy,
            ban: d.ban,
            delay: d.delay,
            allowed: d.allowed,
        }
    }

    #[inline(always)]
    fn into_decision(self) -> Decision {
        Decision {
            policy: self.policy,
            allowed: self.allowed,
            limit: self.limit,
            remaining: self.remaining,
            reset: self.reset,
            retry_after: self.retry_after,
            delay: self.delay,
            ban: self.ban,
        }
    }
}

/// The check through the store's future, polled once: a check the store did not decide
/// [immediately](Store::apply_one_immediately). Out of line, so that the common path above
/// stays small and returns its decision in place; given the check's fields, not the check: with
/// a `&Check` here, the common path wrote the whole check to memory on every call for this one,
/// which seldom runs (callgrind: 5 instructions a check).
#[inline(never)]
fn poll_once<S: Store>(
    store: &S,
    now: Timestamp,
    policy: &Policy,
    key: &[u8],
    cost: u32,
) -> Result<Decision, Error> {
    let future = pin!(store.apply_one(now, Check::new(policy, key, cost)));
    match future.poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(Ok(decision)) => Ok(decision),
        Poll::Ready(Err(error)) => Err(error.into()),
        Poll::Pending => Err(not_as_promised(
            "a store that says it is immediate returned a pending decision",
        )),
    }
}

/// A store that broke its word about being [immediate](Store::is_immediate).
#[cold]
fn not_as_promised(reason: &'static str) -> Error {
    Error::from(StoreError::Protocol {
        reason: reason.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field survives the trip through [`Reordered`], whatever is absent or at its end.
    #[test]
    fn a_decision_comes_back_whole() {
        let admitted = Decision {
            policy: "api",
            allowed: true,
            limit: 10,
            remaining: 9,
            reset: Duration::new(5, 999_999_999),
            retry_after: None,
            delay: Some(Duration::from_micros(250)),
            ban: BanStatus::None,
        };
        let banned = Decision {
            policy: "login",
            allowed: false,
            limit: u64::MAX,
            remaining: 0,
            reset: Duration::ZERO,
            retry_after: Some(Duration::MAX),
            delay: None,
            ban: BanStatus::Started,
        };
        for decision in [admitted, banned] {
            assert_eq!(Reordered::of(decision).into_decision(), decision);
        }
    }
}
