//! Token bucket, kept as one timestamp (GCRA, the generic cell rate algorithm).
//!
//! A bucket of `capacity` tokens refills one token every `interval`. Instead of tokens and a
//! last-refill time, the state is the *theoretical arrival time* `tat`: the time at which the
//! bucket will be full again. A request of cost `c` at `now` is admitted iff
//! `max(tat, now) + c × interval − now ≤ capacity × interval`; admitting it moves `tat` by
//! `c × interval`. One integer per key, and the same decisions as counting tokens.

use super::{Algorithm, Divisor, MAX_HORIZON, never};
use crate::quota::Rate;
use crate::{QuotaError, Timestamp, Verdict};

/// Bursts up to `capacity`, then `refill`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokenBucket {
    capacity: u32,
    refill: Rate,
    interval: u64,
    per_interval: Divisor,
    /// `capacity × interval`: how far ahead of now a full bucket's `tat` can be, computed once.
    horizon: u64,
}

/// A token bucket's theoretical arrival time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenBucketState {
    /// When the bucket is full again, microseconds since the epoch.
    pub tat: u64,
}

impl TokenBucket {
    /// A bucket of `capacity` tokens refilled at `refill`.
    ///
    /// The refill interval is rounded up to whole microseconds ("3/s" becomes one token every
    /// 333,334 µs), so the enforced rate never exceeds the configured one.
    pub fn new(capacity: u32, refill: Rate) -> Result<Self, QuotaError> {
        let input = format!("capacity={capacity} refill={refill}");
        if capacity == 0 {
            return Err(QuotaError::new(&input, "capacity must be at least 1"));
        }
        let interval = refill.interval_micros(&input)?;
        if u64::from(capacity).saturating_mul(interval) > MAX_HORIZON {
            return Err(QuotaError::new(
                &input,
                "the bucket would take over 100 years to refill; use a smaller capacity or a faster refill",
            ));
        }
        Ok(TokenBucket {
            capacity,
            refill,
            interval,
            per_interval: Divisor::new(interval),
            horizon: u64::from(capacity) * interval,
        })
    }

    /// The bucket size: the largest burst.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The refill rate.
    pub fn refill(&self) -> Rate {
        self.refill
    }

    /// Microseconds per token.
    pub fn interval_micros(&self) -> u64 {
        self.interval
    }
}

impl Algorithm for TokenBucket {
    type State = TokenBucketState;

    // Always inlined: the memory store's check path is large enough that the compiler would
    // otherwise call it (about 20 instructions more per check, callgrind).
    #[inline(always)]
    fn evaluate(&self, state: &mut TokenBucketState, now: Timestamp, cost: u32) -> Verdict {
        // Everything is measured from `now` (`ahead` is `max(tat, now) − now`), never as an
        // absolute time, so no sum can pass the end of `u64` however late the clock reads: an
        // absolute `tat + cost × interval` overflowed at timestamps near `u64::MAX`.
        let ahead = state.tat.saturating_sub(now.as_micros());
        let horizon = self.horizon;
        // Whole tokens in the bucket before this request (a division: computed only when the
        // answer reports them, not on the admitted path). None when the state is further ahead
        // than a full bucket: it was written at a later instant than `now` (a clock stepped
        // back, or a sweep reading every key at its own instant).
        let tokens = || self.per_interval.div(horizon.saturating_sub(ahead));
        if cost > self.capacity {
            return never(self.capacity, tokens(), ahead);
        }
        // At most `horizon` is added (cost ≤ capacity); saturating, so a state implausibly far
        // ahead is refused rather than wrapped round to an admission.
        let after = ahead.saturating_add(u64::from(cost) * self.interval);
        if after <= horizon {
            Verdict {
                allowed: true,
                limit: u64::from(self.capacity),
                remaining: self.per_interval.div(horizon - after),
                reset_micros: after,
                retry_after_micros: None,
                delay_micros: 0,
            }
        } else {
            Verdict {
                allowed: false,
                limit: u64::from(self.capacity),
                // Refused, fewer tokens than the cost are left: none for a cost of one, the
                // common case, which then needs no division.
                remaining: if cost <= 1 { 0 } else { tokens() },
                reset_micros: ahead,
                retry_after_micros: Some(after - horizon),
                delay_micros: 0,
            }
        }
    }

    /// [`evaluate`](Algorithm::evaluate) and, when admitted, [`commit`](Algorithm::commit) in
    /// one: an admission's new time is the one `evaluate` just computed (`now` plus the reset),
    /// so it is not computed again with commit's arithmetic. Saturating all the same: `now`
    /// itself may be within a bucket's span of the end of `u64` (a clock gone wrong).
    #[inline(always)]
    fn check(&self, state: &mut TokenBucketState, now: Timestamp, cost: u32) -> Verdict {
        let verdict = self.evaluate(state, now, cost);
        if verdict.allowed {
            state.tat = now
                .as_micros()
                .saturating_add(verdict.reset_micros)
                .min(super::MAX_TIME);
        }
        verdict
    }

    #[inline(always)]
    fn commit(&self, state: &mut TokenBucketState, now: Timestamp, cost: u32) {
        // Saturating, and capped far below the memory store's marker word: a charge past the
        // limit (a usage report) can push the time out by any amount.
        state.tat = state
            .tat
            .max(now.as_micros())
            .saturating_add(u64::from(cost).saturating_mul(self.interval))
            .min(super::MAX_TIME);
    }

    fn refund(&self, state: &mut TokenBucketState, now: Timestamp, cost: u32) {
        // Saturating: a refund's cost is not bounded by the capacity, and u32::MAX intervals
        // of up to 400 days overflow a u64.
        let back = u64::from(cost).saturating_mul(self.interval);
        state.tat = state
            .tat
            .saturating_sub(back)
            .max(now.as_micros().min(state.tat));
    }

    fn expires_at(&self, state: &TokenBucketState) -> Timestamp {
        Timestamp::from_micros(state.tat)
    }

    fn max_cost(&self) -> u32 {
        self.capacity
    }
}
