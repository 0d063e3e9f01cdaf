//! The five algorithms as pure state machines: `(state, now, cost, quota) → (state, verdict)`.
//!
//! No I/O, no clock, no locks: a store loads a key's state, runs a step and persists the state,
//! atomically. The step is split in two so a request checked against several policies can be
//! all-or-nothing: [`Algorithm::evaluate`] decides without consuming, and [`Algorithm::commit`]
//! consumes once every policy has admitted the request. The Redis store's Lua scripts implement
//! the same integer arithmetic; `docs/algorithms.md` explains the math of each.

use std::fmt;

use crate::{Timestamp, Verdict};

mod fixed_window;
mod leaky_bucket;
mod sliding_log;
mod sliding_window;
mod token_bucket;

pub use fixed_window::{FixedWindow, FixedWindowState};
pub use leaky_bucket::{LeakyBucket, LeakyBucketState};
pub use sliding_log::{SlidingWindowLog, SlidingWindowLogState};
pub use sliding_window::{SlidingWindowCounter, SlidingWindowCounterState};
pub use token_bucket::{TokenBucket, TokenBucketState};

/// One rate-limiting algorithm with its parameters.
pub trait Algorithm {
    /// What the algorithm remembers per key. `Default` is a key never seen.
    type State: Clone + Default + fmt::Debug;

    /// Decides whether a request of `cost` at `now` is admitted, without consuming anything.
    ///
    /// It may normalise `state` (roll windows over, forget expired entries); normalising never
    /// changes any later decision. A `cost` of zero is a read-only peek: always admitted.
    fn evaluate(&self, state: &mut Self::State, now: Timestamp, cost: u32) -> Verdict;

    /// Consumes `cost` at `now`. Call it only after [`evaluate`](Self::evaluate) admitted the
    /// same request at the same `now`.
    fn commit(&self, state: &mut Self::State, now: Timestamp, cost: u32);

    /// Gives back `cost` consumed earlier, for a request that was admitted but then abandoned
    /// (a client that disconnected while held for its slot). Never gives back more than was
    /// consumed in the state's current span.
    fn refund(&self, state: &mut Self::State, now: Timestamp, cost: u32);

    /// The time from which `state` is equivalent to a key never seen, so a store may drop it.
    fn expires_at(&self, state: &Self::State) -> Timestamp;

    /// The largest cost one request can have; a higher cost is denied with no retry time.
    fn max_cost(&self) -> u32;

    /// Evaluates and, when admitted, commits: one request against one policy.
    fn check(&self, state: &mut Self::State, now: Timestamp, cost: u32) -> Verdict {
        let verdict = self.evaluate(state, now, cost);
        if verdict.allowed {
            self.commit(state, now, cost);
        }
        verdict
    }
}

/// The verdict for a cost the quota can never admit: denied, with no retry time that would lie.
pub(crate) fn never(limit: u32, remaining: u64, reset_micros: u64) -> Verdict {
    Verdict {
        allowed: false,
        limit: u64::from(limit),
        remaining,
        reset_micros,
        retry_after_micros: None,
        delay_micros: 0,
    }
}
