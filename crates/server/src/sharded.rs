//! Counters spread over per-thread shards, so that threads counting every request never fight
//! over one cache line; the top-keys sketches shard the same way.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counters spread over cache-line-sized shards, one picked per thread: the proxy's threads
/// count every request, and one shared line bouncing between cores on each increment would cost
/// more than the rest of the bookkeeping. Reads add the shards up.
pub(crate) struct Sharded<const N: usize> {
    shards: [Shard<N>; SHARDS],
}

/// Shards of per-thread statistics (counters here, top-keys sketches in `admin::top`).
pub(crate) const SHARDS: usize = 8;

#[repr(align(128))]
struct Shard<const N: usize>([AtomicU64; N]);

impl<const N: usize> Default for Sharded<N> {
    fn default() -> Self {
        Sharded {
            shards: std::array::from_fn(|_| Shard(std::array::from_fn(|_| AtomicU64::new(0)))),
        }
    }
}

impl<const N: usize> std::fmt::Debug for Sharded<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries((0..N).map(|i| self.get(i))).finish()
    }
}

/// This thread's shard: threads take them in turn as they first count something, so the
/// proxy's per-core threads each have their own.
#[inline]
pub(crate) fn thread_shard() -> usize {
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static MINE: usize = NEXT.fetch_add(1, Relaxed) % SHARDS;
    }
    MINE.with(|m| *m)
}

impl<const N: usize> Sharded<N> {
    /// Adds `v` to counter `i` (ignored past `N`).
    pub(crate) fn add(&self, i: usize, v: u64) {
        if let Some(c) = self.shards[thread_shard()].0.get(i) {
            c.fetch_add(v, Relaxed);
        }
    }

    /// Counter `i`, all shards added up.
    pub(crate) fn get(&self, i: usize) -> u64 {
        self.shards
            .iter()
            .filter_map(|s| s.0.get(i))
            .map(|c| c.load(Relaxed))
            .sum()
    }
}
