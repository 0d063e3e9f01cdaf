//! Fixed window counter: one count per window, windows aligned to multiples of the window
//! length since the Unix epoch. Cheapest of all; admits up to twice the limit across a boundary
//! (the end of one window and the start of the next), by design.
//!
//! With a [`Calendar`], windows are the calendar's periods (a day, an ISO week, a month or a
//! year in a time zone) instead: their bounds come from [`Calendar::period`], a pure function of
//! `now`, computed only when a key's window has ended.

use std::time::Duration;

use super::{Algorithm, Divisor, never};
use crate::calendar::Calendar;
use crate::quota::{MAX_PERIOD, Rate};
use crate::{QuotaError, Timestamp, Verdict};

/// `limit` per `window`, counted in windows aligned to the Unix epoch, or per period of a
/// calendar.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FixedWindow {
    limit: u32,
    /// The window, or a calendar period's nominal length.
    window: u64,
    per_window: Divisor,
    /// What the memory store counts window ends in: the window, or a second for a calendar
    /// (whose periods start on whole seconds but have no one length).
    index_unit: Divisor,
    calendar: Option<Calendar>,
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
            index_unit: Divisor::new(rate.period_micros()),
            calendar: None,
        })
    }

    /// `limit` per period of `calendar`; the limit must be positive.
    pub fn with_calendar(limit: u32, calendar: Calendar) -> Result<Self, QuotaError> {
        if limit == 0 {
            return Err(QuotaError::new(
                &format!("{limit}/{}", calendar.unit()),
                "count must be at least 1",
            ));
        }
        let window = calendar.unit().nominal_secs() * 1_000_000;
        Ok(FixedWindow {
            limit,
            window,
            per_window: Divisor::new(window),
            index_unit: Divisor::new(1_000_000),
            calendar: Some(calendar),
        })
    }

    /// The calendar whose periods are the windows, if any.
    pub fn calendar(&self) -> Option<&Calendar> {
        self.calendar.as_ref()
    }

    /// The end (µs) of the window that contains `now`; `u64::MAX` for the last window, which
    /// the end of `u64` cuts short.
    pub fn window_end(&self, now: Timestamp) -> u64 {
        let now = now.as_micros();
        match &self.calendar {
            None => self.aligned_end(now),
            Some(calendar) => calendar.period(now).end,
        }
    }

    /// The end of the window aligned to the epoch that contains `now` (µs). The start is at
    /// most `now`; adding the window saturates, so the last window ends at `u64::MAX` instead
    /// of overflowing (`(now / window + 1) × window` did, near the end of `u64`).
    #[inline]
    fn aligned_end(&self, now: u64) -> u64 {
        (self.per_window.div(now) * self.window).saturating_add(self.window)
    }

    /// The limit per window.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The window in microseconds; for a calendar, the period's nominal length
    /// ([`CalendarUnit::nominal_secs`](crate::CalendarUnit::nominal_secs)).
    #[inline]
    pub fn window_micros(&self) -> u64 {
        self.window
    }

    /// The unit the memory store counts window ends in: the window, or a second for a
    /// calendar.
    #[inline]
    pub(crate) fn index_unit(&self) -> Divisor {
        self.index_unit
    }

    #[inline]
    fn normalize(&self, state: &mut FixedWindowState, now: Timestamp) {
        let end = match &self.calendar {
            None => self.aligned_end(now.as_micros()),
            // A window not over yet is the current period (or a later one, when the clock
            // stepped back): the zone's rules are consulted once per key and period.
            Some(_) if state.window_end > now.as_micros() => return,
            Some(calendar) => calendar.period(now.as_micros()).end,
        };
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

    /// [`evaluate`](Algorithm::evaluate) and, when admitted, the count: the window was
    /// normalised by `evaluate` at this very `now`, so it is not normalised again as
    /// [`commit`](Algorithm::commit) would (a division, a multiplication and the saturating
    /// end of the window, per admitted request).
    #[inline(always)]
    fn check(&self, state: &mut FixedWindowState, now: Timestamp, cost: u32) -> Verdict {
        let verdict = self.evaluate(state, now, cost);
        if verdict.allowed {
            state.count = state.count.saturating_add(cost);
        }
        verdict
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
