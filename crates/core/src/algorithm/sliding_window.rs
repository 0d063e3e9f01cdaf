//! Sliding window counter: two fixed-window counts, the previous one weighted by how much of it
//! the sliding window still covers:
//!
//! ```text
//! estimate = current + previous × (window − elapsed) / window
//! ```
//!
//! A request is admitted iff `estimate + cost ≤ limit`. Two integers per key, no boundary burst,
//! and close to exact for real traffic: the recommended default.
//!
//! All comparisons are done multiplied out by `window` in 128-bit integers, so there is no
//! rounding anywhere and `retry_after` is exact to the microsecond.

use std::time::Duration;

use super::{Algorithm, Divisor, never};
use crate::quota::Rate;
use crate::{QuotaError, Timestamp, Verdict};

/// `limit` per sliding `window`, estimated from two counters.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SlidingWindowCounter {
    limit: u32,
    window: u64,
    per_window: Divisor,
}

/// The counts of the current and the previous window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlidingWindowCounterState {
    /// End of the current window, microseconds since the epoch.
    pub window_end: u64,
    /// Cost admitted in the current window.
    pub current: u32,
    /// Cost admitted in the window before it.
    pub previous: u32,
}

impl SlidingWindowCounter {
    /// `limit` per sliding `window`; both must be positive, the window at most 400 days.
    pub fn new(limit: u32, window: Duration) -> Result<Self, QuotaError> {
        let rate = Rate::new(limit, window)?;
        Ok(SlidingWindowCounter {
            limit,
            window: rate.period_micros(),
            per_window: Divisor::new(rate.period_micros()),
        })
    }

    /// The limit per window.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The window in microseconds.
    #[inline]
    pub fn window_micros(&self) -> u64 {
        self.window
    }

    /// Divides by the window, fast.
    #[inline]
    pub(crate) fn per_window(&self) -> Divisor {
        self.per_window
    }

    /// Rolls the windows over to the one that contains `now`. Its end saturates: the last
    /// window, cut short by the end of `u64`, ends at `u64::MAX` (`(now / window + 1) × window`
    /// overflowed there), and it still follows the window before it.
    #[inline]
    fn normalize(&self, state: &mut SlidingWindowCounterState, now: Timestamp) {
        let end = (self.per_window.div(now.as_micros()) * self.window).saturating_add(self.window);
        if state.window_end < end {
            let previous = if state.window_end.saturating_add(self.window) == end {
                state.current
            } else {
                0
            };
            *state = SlidingWindowCounterState {
                window_end: end,
                current: 0,
                previous,
            };
        }
    }

    /// Time until the estimate is back to zero.
    #[inline]
    fn reset_micros(&self, state: &SlidingWindowCounterState, now: u64) -> u64 {
        if state.current > 0 {
            state
                .window_end
                .saturating_add(self.window)
                .saturating_sub(now)
        } else if state.previous > 0 {
            state.window_end.saturating_sub(now)
        } else {
            0
        }
    }
}

impl Algorithm for SlidingWindowCounter {
    type State = SlidingWindowCounterState;

    // Always inlined: the memory store's check path is large enough that the compiler would
    // otherwise call it (about 20 instructions more per check, callgrind).
    #[inline(always)]
    fn evaluate(
        &self,
        state: &mut SlidingWindowCounterState,
        now: Timestamp,
        cost: u32,
    ) -> Verdict {
        self.normalize(state, now);
        let now_us = now.as_micros();
        let w = u128::from(self.window);
        let limit = u128::from(self.limit);
        // Time the previous window still covers; a clock step back leaves it at `window`.
        let start = state.window_end - self.window;
        let overlap = u128::from(self.window - now_us.saturating_sub(start).min(self.window));
        let previous = u128::from(state.previous);
        let current = u128::from(state.current);
        // used × window, exactly.
        let used = previous * overlap + current * w;
        let available = |used: u128| -> u64 {
            let left = (limit * w).saturating_sub(used);
            match u64::try_from(left) {
                Ok(left) => self.per_window.div(left),
                Err(_) => u64::try_from(left / w).unwrap_or(u64::MAX),
            }
        };
        if cost > self.limit {
            return never(
                self.limit,
                available(used),
                self.reset_micros(state, now_us),
            );
        }
        let c = u128::from(cost);
        if used + c * w <= limit * w {
            let mut after = *state;
            after.current += cost;
            return Verdict {
                allowed: true,
                limit: u64::from(self.limit),
                remaining: available(used + c * w),
                reset_micros: self.reset_micros(&after, now_us),
                retry_after_micros: None,
                delay_micros: 0,
            };
        }
        let until_end = u128::from(state.window_end.saturating_sub(now_us));
        let retry = if current + c <= limit {
            // Still in this window, once the previous window's weight has shrunk enough:
            // previous × (overlap − Δ) ≤ (limit − current − cost) × window.
            let fits = (limit - current - c) * w / previous.max(1);
            overlap.saturating_sub(fits)
        } else {
            // In the next window, where this window's count becomes the weighted one:
            // current × (window − e) ≤ (limit − cost) × window.
            let fits = (limit - c) * w / current.max(1);
            until_end + w.saturating_sub(fits)
        };
        Verdict {
            allowed: false,
            limit: u64::from(self.limit),
            remaining: available(used),
            reset_micros: self.reset_micros(state, now_us),
            retry_after_micros: Some(u64::try_from(retry).unwrap_or(u64::MAX)),
            delay_micros: 0,
        }
    }

    #[inline(always)]
    fn commit(&self, state: &mut SlidingWindowCounterState, now: Timestamp, cost: u32) {
        self.normalize(state, now);
        state.current = state.current.saturating_add(cost);
    }

    fn refund(&self, state: &mut SlidingWindowCounterState, now: Timestamp, cost: u32) {
        self.normalize(state, now);
        state.current = state.current.saturating_sub(cost);
    }

    fn expires_at(&self, state: &SlidingWindowCounterState) -> Timestamp {
        let t = if state.current > 0 {
            state.window_end.saturating_add(self.window)
        } else if state.previous > 0 {
            state.window_end
        } else {
            0
        };
        Timestamp::from_micros(t)
    }

    fn max_cost(&self) -> u32 {
        self.limit
    }
}
