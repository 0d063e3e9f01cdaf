//! What the log says of a store that fails: a line when failures start, then at most one every
//! [`EVERY`] while they go on (saying how many there were since the last), and one when the
//! store answers again. One line per failed request flooded the log (2,000 lines for 2,000
//! requests while Redis was down) and said nothing once it came back.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate::{Error, OnError};

/// The least time between two lines of one outage.
const EVERY: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub(super) struct Outage {
    /// Whether the last store call failed; read on every answered call, written only when
    /// this changes.
    failing: AtomicBool,
    /// Failures since the last line.
    unlogged: AtomicU64,
    /// Failures since the outage began.
    total: AtomicU64,
    /// When the next line may be written, in milliseconds since `anchor`.
    next_line: AtomicU64,
    anchor: Instant,
}

impl Default for Outage {
    fn default() -> Self {
        Outage {
            failing: AtomicBool::new(false),
            unlogged: AtomicU64::new(0),
            total: AtomicU64::new(0),
            next_line: AtomicU64::new(0),
            anchor: Instant::now(),
        }
    }
}

impl Outage {
    /// A store call failed for the requests of `policies`; whether that was logged.
    pub(super) fn failed(&self, error: &Error, policies: &[&str], on_error: OnError) -> bool {
        let began = !self.failing.swap(true, Ordering::Relaxed);
        self.unlogged.fetch_add(1, Ordering::Relaxed);
        self.total.fetch_add(1, Ordering::Relaxed);
        let now = u64::try_from(self.anchor.elapsed().as_millis()).unwrap_or(u64::MAX);
        let next = self.next_line.load(Ordering::Relaxed);
        let due = began || now >= next;
        let later = now.saturating_add(EVERY.as_millis() as u64);
        // One thread writes the line when several fail at once.
        if !due
            || self
                .next_line
                .compare_exchange(next, later, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        let since_last = self.unlogged.swap(0, Ordering::Relaxed);
        tracing::warn!(
            %error,
            ?policies,
            ?on_error,
            failures = since_last,
            "rate limit store failed (at most one such line every 10 s while it fails)"
        );
        true
    }

    /// A store call answered: ends an outage, if one was going on.
    #[inline]
    pub(super) fn answered(&self) {
        if self.failing.load(Ordering::Relaxed) {
            self.recovered();
        }
    }

    /// The failures of the outage that just ended, logged; `None` when none was going on
    /// (another thread saw the end first).
    #[cold]
    fn recovered(&self) -> Option<u64> {
        if !self.failing.swap(false, Ordering::Relaxed) {
            return None;
        }
        let failures = self.total.swap(0, Ordering::Relaxed);
        self.unlogged.store(0, Ordering::Relaxed);
        self.next_line.store(0, Ordering::Relaxed);
        tracing::info!(failures, "rate limit store answers again");
        Some(failures)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_when_failures_start_then_one_when_they_end() {
        let outage = Outage::default();
        let error: Error = tollgate::StoreError::Unavailable {
            reason: "connection refused".into(),
        }
        .into();
        let failed = || outage.failed(&error, &["api"], OnError::Allow);
        assert!(failed(), "the first failure is logged");
        for _ in 0..999 {
            assert!(!failed(), "the next ones, within ten seconds, are not");
        }
        outage.answered();
        assert_eq!(
            outage.recovered(),
            None,
            "the end was logged once, by answered"
        );
        assert!(!outage.failing.load(Ordering::Relaxed));
        // A new outage is logged at once.
        assert!(failed());
        assert_eq!(outage.recovered(), Some(1));
    }
}
