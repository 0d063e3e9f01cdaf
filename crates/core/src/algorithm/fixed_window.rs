//! Fixed window counter: one count per window, windows aligned to multiples of the window
//! length since the Unix epoch. Cheapest of all; admits up to twice the limit across a boundary
//! (the end of one window and the start of the next), by design.

use std::time::Duration;

use super::{Algorithm, Divisor, never};
use crate::quota::{MAX_PERIOD, Rate};
use crate::{QuotaError, Timestamp, Verdict};

/// `limit` per `window`, counted in windows aligned to the Unix epoch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FixedWindow {
    limit: u32,
    window: u64,
    per_window: Divisor,
}

/// A fixed window's count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FixedWindowState {
    /// End of the counted window, microseconds since the epoch.
    pub window_end: u64,
    /// Cost admitted in that window.
    pub count: u32,
}

impl FixedWindow {
    /// `limit` per `window`; both must be positive, the window at most 400 days.
    pub fn new(limit: u32, window: Duration) -> Result<Self, QuotaError> {
        let rate = Rate::new(limit, window)?;
        debug_assert!(rate.period() <= MAX_PERIOD);
        Ok(FixedWindow {
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

    #[inline]
    fn normalize(&self, state: &mut FixedWindowState, now: Timestamp) {
        let now = now.as_micros();
        let end = (self.per_window.div(now) + 1) * self.window;
        // A later `window_end` means the clock stepped back: keep counting in it rather than
        // hand out a fresh window.
        if state.window_end < end {
            *state = FixedWindowState {
                window_end: end,
                count: 0,
            };
        }
    }
}

impl Algorithm for FixedWindow {
    type State = FixedWindowState;

    // Always inlined: the memory store's check path is large enough that the compiler would
    // otherwise call it (about 20 instructions more per check, callgrind).
    #[inline(always)]
    fn evaluate(&self, state: &mut FixedWindowState, now: Timestamp, cost: u32) -> Verdict {
        self.normalize(state, now);
        let until_end = state.window_end.saturating_sub(now.as_micros());
        let used = u64::from(state.count);
        let limit = u64::from(self.limit);
        let available = limit.saturating_sub(used);
        let reset = if used > 0 { until_end } else { 0 };
        if cost > self.limit {
            return never(self.limit, available, reset);
        }
        let cost = u64::from(cost);
        if used + cost <= limit {
            Verdict {
                allowed: true,
                limit,
                remaining: available - cost,
                reset_micros: if used + cost > 0 { until_end } else { 0 },
                retry_after_micros: None,
                delay_micros: 0,
            }
        } else {
            // The next window starts empty, and cost <= limit fits in it.
            Verdict {
                allowed: false,
                limit,
                remaining: available,
                reset_micros: reset,
                retry_after_micros: Some(until_end),
                delay_micros: 0,
            }
        }
    }

    #[inline(always)]
    fn commit(&self, state: &mut FixedWindowState, now: Timestamp, cost: u32) {
        self.normalize(state, now);
        state.count = state.count.saturating_add(cost);
    }

    fn refund(&self, state: &mut FixedWindowState, now: Timestamp, cost: u32) {
        self.normalize(state, now);
        state.count = state.count.saturating_sub(cost);
    }

    fn expires_at(&self, state: &FixedWindowState) -> Timestamp {
        Timestamp::from_micros(state.window_end)
    }

    fn max_cost(&self) -> u32 {
        self.limit
    }
}
