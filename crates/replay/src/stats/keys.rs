//! One key's counts, and its peak demand: the most cost it asked for within any window of the
//! policy's length, measured in tenths of that window (a ring of ten counters per key).

/// How many slices a window is measured in.
pub(crate) const PEAK_SLICES: usize = 10;

/// One key of one policy.
#[derive(Clone, Debug, Default)]
pub(crate) struct KeyStats {
    /// Requests decided.
    pub(crate) requests: u64,
    /// Of those, denied.
    pub(crate) denied: u64,
    /// The most cost asked for within one window (admitted or not: demand, not throughput).
    pub(crate) peak: u64,
    /// The cost in the last `PEAK_SLICES` slices.
    in_window: u64,
    /// The slice the latest request fell in.
    last_slice: u64,
    ring: [u32; PEAK_SLICES],
}

impl KeyStats {
    /// A request of `cost` in slice `slice` (slices never go back: the replay clock does not).
    pub(crate) fn add(&mut self, slice: u64, cost: u32, allowed: bool) {
        self.requests += 1;
        self.denied += u64::from(!allowed);
        if slice > self.last_slice || self.requests == 1 {
            let gap = slice.saturating_sub(self.last_slice);
            if gap >= PEAK_SLICES as u64 || self.requests == 1 {
                self.ring = [0; PEAK_SLICES];
                self.in_window = 0;
            } else {
                for s in self.last_slice + 1..=slice {
                    let at = &mut self.ring[(s % PEAK_SLICES as u64) as usize];
                    self.in_window -= u64::from(*at);
                    *at = 0;
                }
            }
            self.last_slice = slice;
        }
        let at = &mut self.ring[(self.last_slice % PEAK_SLICES as u64) as usize];
        *at = at.saturating_add(cost);
        self.in_window += u64::from(cost);
        self.peak = self.peak.max(self.in_window);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_is_the_busiest_window() {
        let mut k = KeyStats::default();
        // Two a slice for thirty slices: twenty in any ten consecutive slices.
        for slice in 100..130 {
            k.add(slice, 1, true);
            k.add(slice, 1, false);
        }
        assert_eq!((k.requests, k.denied, k.peak), (60, 30, 20));
        // A burst of 50 long after: the old slices are gone.
        for _ in 0..50 {
            k.add(1_000, 1, true);
        }
        assert_eq!(k.peak, 50);
        // Costs count as the limit counts them.
        let mut c = KeyStats::default();
        c.add(5, 5, true);
        c.add(14, 5, true);
        c.add(15, 5, true);
        assert_eq!(c.peak, 10);
    }
}
