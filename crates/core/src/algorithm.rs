//! The algorithms as pure state machines: `(state, now, cost, quota) → (state, verdict)`.
//!
//! No I/O, no clock, no locks: a store loads a key's state, runs a step and persists the state,
//! atomically. The step is split in two so a request checked against several policies can be
//! all-or-nothing: [`Algorithm::evaluate`] decides without consuming, and [`Algorithm::commit`]
//! consumes once every policy has admitted the request. The Redis store's Lua scripts implement
//! the same integer arithmetic; `docs/algorithms.md` explains the math of each.
//!
//! The five rate algorithms implement [`Algorithm`]. [`Concurrency`] (requests in flight, not
//! per time) has the same evaluate/commit split but its steps also name the request's permit,
//! so it has methods of its own.

use std::fmt;

use crate::{Timestamp, Verdict};

mod concurrency;
mod fixed_window;
mod leaky_bucket;
mod sliding_log;
mod sliding_window;
mod token_bucket;

pub use concurrency::{Concurrency, ConcurrencyState, Occupancy};
pub use fixed_window::{FixedWindow, FixedWindowState};
pub use leaky_bucket::{LeakyBucket, LeakyBucketState};
pub(crate) use sliding_log::LogEntries;
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
    /// changes any later decision. A `cost` of zero is a read-only peek: admitted unless the
    /// key is already past its quota at `now` (a [`charge`](Self::charge) can take it there),
    /// and then denied with the time until it is back within it.
    fn evaluate(&self, state: &mut Self::State, now: Timestamp, cost: u32) -> Verdict;

    /// Consumes `cost` at `now`. Call it only after [`evaluate`](Self::evaluate) admitted the
    /// same request at the same `now`.
    fn commit(&self, state: &mut Self::State, now: Timestamp, cost: u32);

    /// Consumes `cost` at `now` whatever the quota says: a usage report, or the true-up of a
    /// cost known only once the response is out. Never refused: the state may go past the
    /// limit, and later requests then wait for it to drain as they would for any use.
    fn charge(&self, state: &mut Self::State, now: Timestamp, cost: u32) {
        // The peek normalises the state (rolls windows over, forgets expired entries) first.
        let _ = self.evaluate(state, now, 0);
        self.commit(state, now, cost);
    }

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

/// Division by a number fixed when a quota is built (a window, a refill interval), by
/// multiplication: a 64-bit `div` takes 25 to 90 cycles on the x86 cores this runs on, several
/// times what the rest of a decision's arithmetic does, and every admitted request needs one.
///
/// `m = ⌊2⁶⁴ / d⌋` gives an estimate `⌊n·m / 2⁶⁴⌋` that is the quotient or one less (since
/// `n·m / 2⁶⁴ > n/d − 1`); one comparison corrects it. Exact for every `u64`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Divisor {
    d: u64,
    m: u64,
}

impl Divisor {
    /// Dividing by `d`, which must be positive (quotas never have a zero window or interval).
    pub(crate) fn new(d: u64) -> Self {
        let d = d.max(1);
        // For d = 1, 2⁶⁴ − 1: the estimate is then n − 1 (or 0), still the quotient or one
        // less, and the same correction holds, with no branch for it in `div`.
        let m = u64::try_from((1u128 << 64) / u128::from(d)).unwrap_or(u64::MAX);
        Divisor { d, m }
    }

    /// The divisor.
    #[inline]
    pub(crate) fn get(self) -> u64 {
        self.d
    }

    /// `⌊n / d⌋`.
    #[inline]
    pub(crate) fn div(self, n: u64) -> u64 {
        let q = ((u128::from(n) * u128::from(self.m)) >> 64) as u64;
        if n - q * self.d >= self.d { q + 1 } else { q }
    }
}

/// The longest a bucket may take to refill (token) or drain (leaky) when full: 100 years.
/// Capacity × interval stays within it, so every sum of times is exact in a Lua double (the
/// Redis scripts') as well as in a `u64`.
pub(crate) const MAX_HORIZON: u64 = 100 * 365 * 86_400 * 1_000_000;

/// The latest time a bucket's state may hold (year 292,277): a charge past the limit is
/// capped here, far below the memory store's marker word (`u64::MAX`).
pub(crate) const MAX_TIME: u64 = u64::MAX >> 1;

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

#[cfg(test)]
mod tests {
    use super::Divisor;

    #[test]
    fn divisor_divides_exactly() {
        let mut next = crate::test_rng::xorshift(0x2545_f491_4f6c_dd1d_u64);
        let edges = [0, 1, 2, 3, 59_999_999, 60_000_000, u64::MAX - 1, u64::MAX];
        let mut divisors = vec![
            1,
            2,
            3,
            7,
            1_000,
            333_334,
            60_000_000,
            86_400_000_000,
            u64::MAX,
        ];
        for _ in 0..2_000 {
            let d = next() >> (next() % 64);
            divisors.push(d.max(1));
        }
        for d in divisors {
            let divisor = Divisor::new(d);
            let mut numerators = edges.to_vec();
            for _ in 0..200 {
                numerators.push(next() >> (next() % 64));
            }
            for n in numerators {
                assert_eq!(divisor.div(n), n / d, "{n} / {d}");
            }
            for k in [1, 2, 1_000_003] {
                let n = d.saturating_mul(k);
                for n in [n.saturating_sub(1), n, n.saturating_add(1)] {
                    assert_eq!(divisor.div(n), n / d, "{n} / {d}");
                }
            }
        }
    }
}
