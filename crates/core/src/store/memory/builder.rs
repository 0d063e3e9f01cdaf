//! Making a store: the builder of its bounds and shard count, the constructors that start from
//! it, and the random key of the keys' hash a new store draws; apart from what a store does.

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use super::{
    DEFAULT_MAX_KEYS, DEFAULT_MAX_LOG_BYTES, Inner, KeyHasher, Limits, MemoryStore, Shard,
    ShardLocks, Words,
};

/// Builds a [`MemoryStore`].
#[derive(Clone, Debug)]
pub struct MemoryStoreBuilder {
    max_keys: usize,
    max_log_bytes: usize,
    shards: Option<usize>,
    hash_key: Option<(u64, u64)>,
    words: Words,
}

impl MemoryStoreBuilder {
    /// The key of the keys' hash, and how eight-byte keys are hashed: a snapshot's, so that its
    /// keys are found again.
    pub(crate) fn hash_key(mut self, key: (u64, u64), words: Words) -> Self {
        self.hash_key = Some(key);
        self.words = words;
        self
    }

    /// The most keys the store tracks (default 1,000,000); it evicts to stay within it.
    ///
    /// Each shard holds an equal share, `max_keys / shards` rounded down (so that the shares
    /// never add up to more than was asked, the point of a memory bound): the store may hold
    /// up to `shards − 1` keys fewer than asked. `max_keys(100)` over 32 shards (the default
    /// on two CPUs) holds 96; a bound that is a multiple of the shard count, as the default
    /// is of every power of two up to 64, holds just that. A bound below the shard count
    /// halves the shards until each holds a key. [`MemoryStore::max_keys`] says the bound in
    /// force.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// The most bytes the sliding logs hold (default 64 MiB), split evenly over the shards.
    /// Past it, the logs with the least at stake are evicted, never the one being written (so
    /// a shard may exceed its share by one key's log). A log counts 80 bytes (a 64-byte record
    /// in a table at most four-fifths full) while its entries pack into the record: offsets
    /// from the oldest as wide as the log's span needs, plus 8 bits each once a cost is not 1,
    /// in 256 bits (12 requests of a one-second window, 9 of a minute, 8 of an hour; at least
    /// 4). Once longer, it counts 16 bytes more per request but the newest, and per free slot
    /// of its ring buffer.
    pub fn max_log_bytes(mut self, bytes: usize) -> Self {
        self.max_log_bytes = bytes;
        self
    }

    /// How many shards (rounded up to a power of two; default 16 per CPU, at least 16).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards.max(1));
        self
    }

    /// The store.
    pub fn build(self) -> MemoryStore {
        let wanted = self
            .shards
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(16, |n| n.get() * 16));
        let mut count = wanted.next_power_of_two().min(4096);
        // Every shard holds at least one key, so the shards' shares add up to at most max_keys.
        while count > self.max_keys && count > 1 {
            count /= 2;
        }
        let limits = Limits {
            keys: (self.max_keys / count).max(1),
            log_bytes: self.max_log_bytes / count,
        };
        let shards = ShardLocks::new((0..count).map(|_| Shard::new(limits)));
        let hash_key = self.hash_key.unwrap_or_else(random_key);
        MemoryStore {
            inner: Arc::new(Inner {
                shards,
                shard_mask: count as u64 - 1,
                limits,
                hasher: KeyHasher::new(hash_key.0, hash_key.1, self.words),
                hash_key,
                words: self.words,
            }),
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::builder().build()
    }
}

impl MemoryStore {
    /// A store with the default bounds.
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder to set `max_keys`, `max_log_bytes` and the shard count.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder {
            max_keys: DEFAULT_MAX_KEYS,
            max_log_bytes: DEFAULT_MAX_LOG_BYTES,
            shards: None,
            hash_key: None,
            words: Words::Mixed,
        }
    }
}

/// SipHash-1-3 under a random 128-bit key. The key comes from `std`'s `RandomState`, which is
/// seeded from the operating system's randomness: two of its outputs on fixed inputs, which
/// nobody can predict without its own secret key, are this store's key.
fn random_key() -> (u64, u64) {
    let seed = RandomState::new();
    (seed.hash_one(0_u64), seed.hash_one(1_u64))
}
