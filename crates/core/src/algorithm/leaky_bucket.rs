//! Leaky bucket: requests depart at a constant rate, one every `interval`.
//!
//! The state is the time the next slot is free (`next_free`). A request of cost `c` at `now`
//! departs at `start = max(next_free, now)` and occupies `c` slots. It is admitted iff its last
//! slot fits in the bucket — `start + c × interval − now ≤ (queue + 1) × interval`, so at most
//! `queue` requests wait behind the one departing — and, when a `max_delay` is set, iff
//! `start − now ≤ max_delay`. The verdict's `delay` is `start − now`: with the `delay` action
//! the caller holds the request that long (a shaper); with `reject` it passes at once and the
//! bucket is a policer that admits bursts of `queue + 1`.

use std::time::Duration;

use super::{Algorithm, Divisor, MAX_HORIZON, never};
use crate::clock::duration_micros;
use crate::quota::Rate;
use crate::{QuotaError, Timestamp, Verdict};

/// Departures at `rate`, with at most `queue` waiting and an optional bound on the wait.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LeakyBucket {
    rate: Rate,
    queue: u32,
    interval: u64,
    per_interval: Divisor,
    max_delay: Option<u64>,
}

/// When a leaky bucket's next slot is free.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeakyBucketState {
    /// Microseconds since the epoch.
    pub next_free: u64,
}

impl LeakyBucket {
    /// Departures at `rate`, at most `queue` requests waiting.
    ///
    /// A full bucket (`queue + 1` slots) must drain within 100 years, as a token bucket must
    /// refill: the Redis scripts add these spans to times in doubles, exact only that far.
    pub fn new(rate: Rate, queue: u32) -> Result<Self, QuotaError> {
        let input = format!("rate={rate} queue={queue}");
        let interval = rate.interval_micros(&input)?;
        if queue == u32::MAX {
            return Err(QuotaError::new(&input, "queue must be below 4294967295"));
        }
        if (u64::from(queue) + 1).saturating_mul(interval) > MAX_HORIZON {
            return Err(QuotaError::new(
                &input,
                "the bucket would take over 100 years to drain; use a smaller queue or a faster rate",
            ));
        }
        Ok(LeakyBucket {
            rate,
            queue,
            interval,
            per_interval: Divisor::new(interval),
            max_delay: None,
        })
    }

    /// Also refuse a request that would wait longer than `max_delay` for its slot.
    pub fn with_max_delay(mut self, max_delay: Duration) -> Self {
        self.max_delay = Some(duration_micros(max_delay));
        self
    }

    /// The departure rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// How many requests may wait.
    pub fn queue(&self) -> u32 {
        self.queue
    }

    /// The bound on one request's wait, if any.
    pub fn max_delay(&self) -> Option<Duration> {
        self.max_delay.map(Duration::from_micros)
    }

    /// The most that can be admitted at once: one departing plus `queue` waiting.
    #[inline]
    pub fn burst(&self) -> u32 {
        self.queue + 1
    }

    /// Microseconds between departures.
    pub fn interval_micros(&self) -> u64 {
        self.interval
    }

    /// How many more unit requests fit when the bucket's last slot ends `backlog` after now.
    #[inline]
    fn room(&self, backlog: u64) -> u64 {
        let depth = u64::from(self.burst()) * self.interval;
        let by_queue = self.per_interval.div(depth.saturating_sub(backlog));
        match self.max_delay {
            // The k-th more request would start at end + (k − 1) × interval.
            Some(max) if backlog > max => 0,
            Some(max) => by_queue.min(self.per_interval.div(max - backlog) + 1),
            None => by_queue,
        }
    }
}

impl Algorithm for LeakyBucket {
    type State = LeakyBucketState;

    // Always inlined: the memory store's check path is large enough that the compiler would
    // otherwise call it (about 20 instructions more per check, callgrind).
    #[inline(always)]
    fn evaluate(&self, state: &mut LeakyBucketState, now: Timestamp, cost: u32) -> Verdict {
        // Measured from `now` (`wait` is `start − now`, `backlog` is `end − now`), never as
        // absolute times, so no sum passes the end of `u64` however late the clock reads: an
        // absolute `start + cost × interval` overflowed at timestamps near `u64::MAX`.
        let wait = state.next_free.saturating_sub(now.as_micros());
        if cost > self.burst() {
            return never(self.burst(), self.room(wait), wait);
        }
        let depth = u64::from(self.burst()) * self.interval;
        // At most `depth` is added (cost ≤ burst); saturating, so a state implausibly far ahead
        // is refused rather than wrapped round to an admission.
        let backlog = wait.saturating_add(u64::from(cost) * self.interval);
        let fits_queue = backlog <= depth;
        let fits_delay = self.max_delay.is_none_or(|max| wait <= max);
        if fits_queue && fits_delay {
            Verdict {
                allowed: true,
                limit: u64::from(self.burst()),
                remaining: self.room(backlog),
                reset_micros: backlog,
                retry_after_micros: None,
                delay_micros: wait,
            }
        } else {
            // Denied means a backlog (start == next_free > now): wait until the last slot fits
            // and, with a bound, until the wait is short enough.
            let by_queue = backlog.saturating_sub(depth);
            let by_delay = self.max_delay.map_or(0, |max| wait.saturating_sub(max));
            Verdict {
                allowed: false,
                limit: u64::from(self.burst()),
                remaining: self.room(wait),
                reset_micros: wait,
                retry_after_micros: Some(by_queue.max(by_delay)),
                delay_micros: 0,
            }
        }
    }

    #[inline(always)]
    fn commit(&self, state: &mut LeakyBucketState, now: Timestamp, cost: u32) {
        // Saturating and capped, as the token bucket's: a charge past the limit can push the
        // time out by any amount.
        state.next_free = state
            .next_free
            .max(now.as_micros())
            .saturating_add(u64::from(cost).saturating_mul(self.interval))
            .min(super::MAX_TIME);
    }

    fn refund(&self, state: &mut LeakyBucketState, now: Timestamp, cost: u32) {
        // Saturating: a refund's cost is not bounded by the burst, and u32::MAX intervals of
        // up to 400 days overflow a u64.
        let back = u64::from(cost).saturating_mul(self.interval);
        let now = now.as_micros();
        if state.next_free > now {
            state.next_free = state.next_free.saturating_sub(back).max(now);
        }
    }

    fn expires_at(&self, state: &LeakyBucketState) -> Timestamp {
        Timestamp::from_micros(state.next_free)
    }

    fn max_cost(&self) -> u32 {
        self.burst()
    }
}
