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
    /// Reads only the oldest entry's time until one stays, so a store that keeps that time at
    /// hand touches its entries only to drop one.
    fn prune(&self, log: &mut impl LogEntries, now: u64) {
        while let Some(t) = log.oldest() {
            if t.saturating_add(self.window) > now {
                break;
            }
            log.pop_oldest();
        }
    }

    /// How long until the newest entry leaves the window. Read only when a verdict needs it
    /// (an admission does not), so an admitted request does not touch the newest entry twice.
    fn newest_expiry(&self, log: &impl LogEntries, now: u64) -> u64 {
        log.newest_time()
            .map_or(0, |t| t.saturating_add(self.window).saturating_sub(now))
    }

    /// [`Algorithm::evaluate`] on any log storage.
    #[inline]
    pub(crate) fn evaluate_log(
        &self,
        log: &mut impl LogEntries,
        now: Timestamp,
        cost: u32,
    ) -> Verdict {
        let now_us = now.as_micros();
        self.prune(log, now_us);
        let total = log.total();
        let limit = u64::from(self.limit);
        let available = limit.saturating_sub(total);
        if cost > self.limit {
            return never(self.limit, available, self.newest_expiry(log, now_us));
        }
        let cost = u64::from(cost);
        if total + cost <= limit {
            return Verdict {
                allowed: true,
                limit,
                remaining: available - cost,
                reset_micros: if cost > 0 {
                    self.window
                } else {
                    self.newest_expiry(log, now_us)
                },
                retry_after_micros: None,
                delay_micros: 0,
            };
        }
        // Admitted once enough of the oldest entries have left the window.
        let must_free = total + cost - limit;
        let mut freed = 0;
        let reset = self.newest_expiry(log, now_us);
        let mut retry = reset;
        for (t, c) in log.entries() {
            freed += u64::from(c);
            if freed >= must_free {
                retry = t.saturating_add(self.window).saturating_sub(now_us);
                break;
            }
        }
        Verdict {
            allowed: false,
            limit,
            remaining: available,
            reset_micros: reset,
            retry_after_micros: Some(retry),
            delay_micros: 0,
        }
    }

    /// [`Algorithm::commit`] on any log storage.
    #[inline]
    pub(crate) fn commit_log(&self, log: &mut impl LogEntries, now: Timestamp, cost: u32) {
        if cost == 0 {
            return;
        }
        let now = now.as_micros();
        self.prune(log, now);
        // Same microsecond: one entry, so a burst costs one slot of memory. An instant before
        // the newest entry (two threads whose clock reads crossed on the way to the key's lock,
        // or a clock stepped back) is logged at the newest entry's time: the log stays in
        // order, which pruning from the front relies on, and the request leaves the window
        // that much later, never sooner.
        let at = log.newest_time().map_or(now, |newest| newest.max(now));
        log.push(at, cost);
    }

    /// [`Algorithm::refund`] on any log storage.
    pub(crate) fn refund_log(&self, log: &mut impl LogEntries, now: Timestamp, cost: u32) {
        self.prune(log, now.as_micros());
        log.take_newest(cost);
    }

    /// [`Algorithm::expires_at`] on any log storage.
    pub(crate) fn expires_at_log(&self, log: &impl LogEntries) -> Timestamp {
        Timestamp::from_micros(
            log.newest_time()
                .map_or(0, |t| t.saturating_add(self.window)),
        )
    }
}

/// How a log is stored: [`SlidingWindowLogState`]'s deque, or the memory store's compact
/// record. The algorithm is written once against this, so both decide alike.
pub(crate) trait LogEntries {
    /// The sum of the entries' costs.
    fn total(&self) -> u64;
    /// The time of the oldest entry.
    fn oldest(&self) -> Option<u64>;
    /// The time of the newest entry.
    fn newest_time(&self) -> Option<u64>;
    /// Drops the oldest entry (and its cost from the total).
    fn pop_oldest(&mut self);
    /// Logs `cost` at `t`, no earlier than the newest entry: merged into it at the same time.
    fn push(&mut self, t: u64, cost: u32);
    /// Takes `cost` back out of the newest entries (at most the total).
    fn take_newest(&mut self, cost: u32);
    /// `(time, cost)` of every entry, oldest first.
    fn entries(&self) -> impl Iterator<Item = (u64, u32)> + '_;
}

impl LogEntries for SlidingWindowLogState {
    fn total(&self) -> u64 {
        self.total
    }

    fn oldest(&self) -> Option<u64> {
        self.entries.front().map(|&(t, _)| t)
    }

    fn newest_time(&self) -> Option<u64> {
        self.entries.back().map(|&(t, _)| t)
    }

    fn pop_oldest(&mut self) {
        if let Some((_, cost)) = self.entries.pop_front() {
            self.total -= u64::from(cost);
        }
    }

    fn push(&mut self, t: u64, cost: u32) {
        // The total grows by what the entries gained: a merged cost saturates at u32::MAX, and
        // a total counting more than its entries hold kept a key refused (with a retry time of
        // zero) once a refund had emptied the log.
        let added = match self.entries.back_mut() {
            Some((newest, c)) if *newest == t => {
                let before = *c;
                *c = c.saturating_add(cost);
                *c - before
            }
            _ => {
                self.entries.push_back((t, cost));
                cost
            }
        };
        self.total += u64::from(added);
    }

    fn take_newest(&mut self, cost: u32) {
        let mut left = cost;
        while left > 0 {
            let Some((_, c)) = self.entries.back_mut() else {
                break;
            };
            let take = left.min(*c);
            *c -= take;
            left -= take;
            self.total -= u64::from(take);
            if *c == 0 {
                self.entries.pop_back();
            }
        }
    }

    fn entries(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.entries.iter().copied()
    }
}

impl Algorithm for SlidingWindowLog {
    type State = SlidingWindowLogState;

    fn evaluate(&self, state: &mut SlidingWindowLogState, now: Timestamp, cost: u32) -> Verdict {
        self.evaluate_log(state, now, cost)
    }

    fn commit(&self, state: &mut SlidingWindowLogState, now: Timestamp, cost: u32) {
        self.commit_log(state, now, cost);
    }

    fn refund(&self, state: &mut SlidingWindowLogState, now: Timestamp, cost: u32) {
        self.refund_log(state, now, cost);
    }

    fn expires_at(&self, state: &SlidingWindowLogState) -> Timestamp {
        self.expires_at_log(state)
    }

    fn max_cost(&self) -> u32 {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_merged_cost_that_saturates_keeps_the_total_true() -> Result<(), QuotaError> {
        let alg = SlidingWindowLog::new(3, Duration::from_secs(1))?;
        let mut state = SlidingWindowLogState::default();
        let now = Timestamp::from_secs(1_800_000_000);
        assert!(alg.check(&mut state, now, 3).allowed);
        // Merged into the entry of the same microsecond, which saturates at u32::MAX.
        alg.charge(&mut state, now, u32::MAX);
        assert_eq!(state.entries, [(now.as_micros(), u32::MAX)]);
        assert_eq!(
            state.total,
            u64::from(u32::MAX),
            "the total its entries hold"
        );
        alg.refund(&mut state, now, u32::MAX);
        assert!(state.entries.is_empty());
        assert_eq!(state.total, 0);
        let v = alg.check(&mut state, now, 1);
        assert!(v.allowed, "an empty log admits: {v:?}");
        Ok(())
    }
}
