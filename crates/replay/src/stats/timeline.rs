//! Admitted and denied requests over time, in at most [`MAX_BUCKETS`] buckets: they start a
//! second wide and double (merging pairs) whenever the log runs past the last one, so a
//! minute of log and a month of log both plot at a useful resolution in fixed memory.

use tollgate::Timestamp;

/// The most buckets a timeline keeps.
pub(crate) const MAX_BUCKETS: usize = 480;

/// Requests per bucket of time.
#[derive(Clone, Debug, Default)]
pub(crate) struct Timeline {
    /// Microseconds since the epoch where the first bucket starts.
    pub(crate) start: Option<u64>,
    /// Bucket width in microseconds (0 until the first request).
    pub(crate) width: u64,
    pub(crate) admitted: Vec<u64>,
    pub(crate) denied: Vec<u64>,
}

impl Timeline {
    /// One request at `now` (never earlier than the previous one).
    pub(crate) fn add(&mut self, now: Timestamp, allowed: bool) {
        let now = now.as_micros();
        if self.width == 0 {
            self.width = 1_000_000;
        }
        let start = *self.start.get_or_insert(now - now % self.width);
        let mut i = (now.saturating_sub(start) / self.width) as usize;
        while i >= MAX_BUCKETS {
            self.coarsen();
            i = (now.saturating_sub(start) / self.width) as usize;
        }
        if i >= self.admitted.len() {
            self.admitted.resize(i + 1, 0);
            self.denied.resize(i + 1, 0);
        }
        if allowed {
            self.admitted[i] += 1;
        } else {
            self.denied[i] += 1;
        }
    }

    fn coarsen(&mut self) {
        self.width *= 2;
        for v in [&mut self.admitted, &mut self.denied] {
            let merged: Vec<u64> = v.chunks(2).map(|c| c.iter().sum()).collect();
            *v = merged;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_double_and_keep_every_request() {
        let mut t = Timeline::default();
        for s in 0..10_000u64 {
            t.add(Timestamp::from_secs(1_000_000 + s), s % 4 != 0);
        }
        assert!(t.admitted.len() <= MAX_BUCKETS);
        assert_eq!(t.width, 32_000_000);
        assert_eq!(t.admitted.iter().sum::<u64>(), 7_500);
        assert_eq!(t.denied.iter().sum::<u64>(), 2_500);
    }
}
