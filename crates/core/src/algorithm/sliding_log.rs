//! Sliding window log: the time and cost of every admitted request in the last window. Exact:
//! a request is admitted iff the cost admitted in the last `window` plus its own is at most
//! `limit`. Denied requests are not logged, so a key holds at most `limit` entries (fewer when
//! requests at the same microsecond are merged), which is this algorithm's price.

use std::collections::VecDeque;
use std::time::Duration;

use super::{Algorithm, never};
use crate::quota::Rate;
use crate::{QuotaError, Timestamp, Verdict};

/// At most `limit` in any sliding `window`, exactly.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SlidingWindowLog {
    limit: u32,
    window: u64,
}

/// The admitted requests of the last window, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlidingWindowLogState {
    /// `(microseconds since the epoch, cost)` of each admitted request, oldest first.
    pub entries: VecDeque<(u64, u32)>,
    /// Sum of the costs in `entries`.
    pub total: u64,
}

impl SlidingWindowLog {
    /// At most `limit` per sliding `window`; both must be positive, the window at most 400 days.
    pub fn new(limit: u32, window: Duration) -> Result<Self, QuotaError> {
        let rate = Rate::new(limit, window)?;
        Ok(SlidingWindowLog {
            limit,
            window: rate.period_micros(),
        })
    }

    /// The limit per window.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The window in microseconds.
    pub fn window_micros(&self) -> u64 {
        self.window
    }

    /// Drops entries that left the window: an entry at `t` counts while `now < t + window`.
    fn prune(&self, state: &mut SlidingWindowLogState, now: Timestamp) {
        let now = now.as_micros();
        while let Some(&(t, cost)) = state.entries.front() {
            if t.saturating_add(self.window) > now {
                break;
            }
            state.total -= u64::from(cost);
            state.entries.pop_front();
        }
    }
}

impl Algorithm for SlidingWindowLog {
    type State = SlidingWindowLogState;

    fn evaluate(&self, state: &mut SlidingWindowLogState, now: Timestamp, cost: u32) -> Verdict {
        self.prune(state, now);
        let now_us = now.as_micros();
        let limit = u64::from(self.limit);
        let available = limit.saturating_sub(state.total);
        let newest_expiry = state
            .entries
            .back()
            .map_or(0, |&(t, _)| (t + self.window).saturating_sub(now_us));
        if cost > self.limit {
            return never(self.limit, available, newest_expiry);
        }
        let cost = u64::from(cost);
        if state.total + cost <= limit {
            return Verdict {
                allowed: true,
                limit,
                remaining: available - cost,
                reset_micros: if cost > 0 { self.window } else { newest_expiry },
                retry_after_micros: None,
                delay_micros: 0,
            };
        }
        // Admitted once enough of the oldest entries have left the window.
        let must_free = state.total + cost - limit;
        let mut freed = 0;
        let mut retry = newest_expiry;
        for &(t, c) in &state.entries {
            freed += u64::from(c);
            if freed >= must_free {
                retry = (t + self.window).saturating_sub(now_us);
                break;
            }
        }
        Verdict {
            allowed: false,
            limit,
            remaining: available,
            reset_micros: newest_expiry,
            retry_after_micros: Some(retry),
            delay_micros: 0,
        }
    }

    fn commit(&self, state: &mut SlidingWindowLogState, now: Timestamp, cost: u32) {
        if cost == 0 {
            return;
        }
        self.prune(state, now);
        let now = now.as_micros();
        match state.entries.back_mut() {
            // Same microsecond: one entry, so a burst costs one slot of memory.
            Some((t, c)) if *t == now => *c = c.saturating_add(cost),
            _ => state.entries.push_back((now, cost)),
        }
        state.total += u64::from(cost);
    }

    fn refund(&self, state: &mut SlidingWindowLogState, now: Timestamp, cost: u32) {
        self.prune(state, now);
        let mut left = cost;
        while left > 0 {
            let Some((_, c)) = state.entries.back_mut() else {
                break;
            };
            let take = left.min(*c);
            *c -= take;
            left -= take;
            state.total -= u64::from(take);
            if *c == 0 {
                state.entries.pop_back();
            }
        }
    }

    fn expires_at(&self, state: &SlidingWindowLogState) -> Timestamp {
        Timestamp::from_micros(
            state
                .entries
                .back()
                .map_or(0, |&(t, _)| t.saturating_add(self.window)),
        )
    }

    fn max_cost(&self) -> u32 {
        self.limit
    }
}
