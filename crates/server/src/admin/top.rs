//! The keys that made the most requests, and were denied most, per policy, over the last one
//! to two minutes: `GET /v1/top`, fed on the decision path.
//!
//! # The sketch
//!
//! Space-Saving (Metwally, Agrawal and El Abbadi, 2005): [`CAPACITY`] counters per sketch.
//! A key already counted adds one to its counter; a new key takes over the smallest counter,
//! `m`, with count `m + 1` and error `m`. Memory is fixed, every key with more than `N /
//! CAPACITY` of the sketch's `N` requests is in it, and a counted key's true count lies in
//! `[count - error, count]`. Written by hand rather than with the `topk` crate, whose `insert`
//! takes an owned key: an allocation per request. Here a key already counted costs a hash, one
//! probe and an increment, and a new one reuses the buffer of the key it replaces.
//!
//! # Threads and time
//!
//! Each policy has one pair of sketches (requests, denials) per metrics shard, picked per thread
//! (`sharded::thread_shard`), so threads do not share a lock or a cache line on the decision
//! path; `/v1/top` merges the shards. Each pair belongs to a minute (Unix seconds / 60, set by
//! [`TopKeys::tick`]); a shard keeps the current minute and the one before, and a read merges
//! both: the last one to two minutes. Merging sketches `s` is exact about what each one saw: a
//! key's count is the sum of its counters, plus the smallest counter of every full sketch that
//! does not hold it (it may have been evicted there), and its error grows by the same amount, so
//! `[count - error, count]` still holds the true count and `error` is at most `N / CAPACITY`
//! for the `N` requests of the window.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use smallvec::SmallVec;

use crate::sharded::{SHARDS, thread_shard};

/// Counters per sketch.
pub(crate) const CAPACITY: usize = 128;

/// How long one sketch counts, in seconds: reads cover the current period and the one before.
pub(crate) const PERIOD_SECS: u64 = 60;

/// A key as the store sees it; most fit inline.
type KeyBytes = SmallVec<[u8; 64]>;

/// The keys' hashes are random per process already (keyed SipHash): the index uses them as
/// they are.
#[derive(Default)]
struct Identity(u64);

impl Hasher for Identity {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// One Space-Saving sketch. Its parallel vectors grow to [`CAPACITY`] and are reused.
#[derive(Default)]
struct SpaceSaving {
    hashes: Vec<u64>,
    keys: Vec<KeyBytes>,
    counts: Vec<u64>,
    errors: Vec<u64>,
    /// Hash of a key → its slot.
    index: HashMap<u64, u32, BuildHasherDefault<Identity>>,
    /// At most the smallest counter (counters only grow), and where the search for a slot
    /// holding it resumes: a stream of new keys finds one in a few steps instead of a scan of
    /// every counter per key.
    low: u64,
    cursor: usize,
}

impl SpaceSaving {
    fn add(&mut self, hash: u64, key: &[u8]) {
        if let Some(&slot) = self.index.get(&hash) {
            let slot = slot as usize;
            // Two keys with one 64-bit keyed hash: the second is not counted (probability
            // about CAPACITY / 2^64 per new key).
            if self.keys[slot][..] == *key {
                self.counts[slot] += 1;
            }
            return;
        }
        if self.counts.len() < CAPACITY {
            let slot = self.counts.len();
            self.hashes.push(hash);
            self.keys.push(KeyBytes::from_slice(key));
            self.counts.push(1);
            self.errors.push(0);
            self.index.insert(hash, slot as u32);
            return;
        }
        // Full: the new key takes over a smallest counter.
        let (slot, min) = self.smallest();
        self.index.remove(&self.hashes[slot]);
        self.hashes[slot] = hash;
        self.keys[slot].clear();
        self.keys[slot].extend_from_slice(key);
        self.counts[slot] = min + 1;
        self.errors[slot] = min;
        self.index.insert(hash, slot as u32);
    }

    /// A slot holding the smallest counter, and that counter: the next one at `low` from the
    /// cursor on; when none is, `low` is raised to the smallest and the search made again.
    fn smallest(&mut self) -> (usize, u64) {
        let n = self.counts.len();
        for _ in 0..2 {
            for step in 0..n {
                let slot = (self.cursor + step) % n;
                if self.counts[slot] <= self.low {
                    self.cursor = (slot + 1) % n;
                    return (slot, self.counts[slot]);
                }
            }
            self.low = self.counts.iter().copied().min().unwrap_or(0);
        }
        (0, self.counts.first().copied().unwrap_or(0))
    }

    fn clear(&mut self) {
        self.low = 0;
        self.cursor = 0;
        self.hashes.clear();
        self.keys.clear();
        self.counts.clear();
        self.errors.clear();
        self.index.clear();
    }

    /// The smallest counter when full (what a key it does not hold may have had), else 0.
    fn floor(&self) -> u64 {
        if self.counts.len() < CAPACITY {
            0
        } else {
            self.counts.iter().copied().min().unwrap_or(0)
        }
    }
}

/// One period's sketches of one shard.
#[derive(Default)]
struct Period {
    /// The period (Unix seconds / [`PERIOD_SECS`]) they count.
    number: u64,
    requests: SpaceSaving,
    denied: SpaceSaving,
}

/// A shard: the current period and the one before, in slots `number % 2`.
#[derive(Default)]
#[repr(align(128))]
struct Shard(Mutex<[Period; 2]>);

/// One policy's sketches.
pub(crate) struct PolicyTop {
    shards: [Shard; SHARDS],
    hasher: RandomState,
    period: Arc<AtomicU64>,
}

impl std::fmt::Debug for PolicyTop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PolicyTop")
    }
}

impl PolicyTop {
    /// Counts one decision of `key` (as the store sees it).
    #[inline]
    pub(crate) fn record(&self, key: &[u8], denied: bool) {
        let number = self.period.load(Relaxed);
        let hash = self.hasher.hash_one(key);
        let mut periods = self.shards[thread_shard()]
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let period = &mut periods[(number % 2) as usize];
        if period.number != number {
            period.number = number;
            period.requests.clear();
            period.denied.clear();
        }
        period.requests.add(hash, key);
        if denied {
            period.denied.add(hash, key);
        }
    }

    /// The `n` keys with the most requests and the `n` with the most denials, over the current
    /// period and the one before.
    pub(crate) fn read(&self, n: usize) -> TopView {
        let now = self.period.load(Relaxed);
        let mut requests = Merge::default();
        let mut denied = Merge::default();
        for shard in &self.shards {
            let periods = shard.0.lock().unwrap_or_else(PoisonError::into_inner);
            for period in periods.iter() {
                if period.number + 1 >= now && period.number <= now {
                    requests.add(&period.requests);
                    denied.add(&period.denied);
                }
            }
        }
        TopView {
            since_period: now.saturating_sub(1),
            requests: requests.top(n),
            denied: denied.top(n),
        }
    }
}

/// Sketches merged (see the module's documentation).
#[derive(Default)]
struct Merge {
    /// Key → (sum of its counters, sum of their lower bounds, sum of the floors of the sketches
    /// that hold it).
    keys: HashMap<KeyBytes, (u64, u64, u64)>,
    /// Sum of every sketch's floor.
    floors: u64,
    total: u64,
}

impl Merge {
    fn add(&mut self, sketch: &SpaceSaving) {
        let floor = sketch.floor();
        self.floors += floor;
        for ((key, &count), &error) in sketch.keys.iter().zip(&sketch.counts).zip(&sketch.errors) {
            let e = self.keys.entry(key.clone()).or_default();
            e.0 += count;
            e.1 += count - error;
            e.2 += floor;
            self.total += count;
        }
    }

    fn top(self, n: usize) -> Counted {
        let floors = self.floors;
        let mut keys: Vec<TopKey> = self
            .keys
            .into_iter()
            .map(|(key, (count, lower, held_floors))| {
                let count = count + (floors - held_floors);
                TopKey {
                    key: key.to_vec(),
                    count,
                    error: count - lower,
                }
            })
            .collect();
        keys.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        keys.truncate(n);
        Counted {
            total: self.total,
            error_bound: floors,
            keys,
        }
    }
}

/// One key's estimate: the true count is in `[count - error, count]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TopKey {
    pub(crate) key: Vec<u8>,
    pub(crate) count: u64,
    pub(crate) error: u64,
}

/// The top keys of one kind (requests or denials).
#[derive(Clone, Debug)]
pub(crate) struct Counted {
    /// Everything counted in the window, exactly.
    pub(crate) total: u64,
    /// The largest `error` any key can have (a key not listed had at most this many).
    pub(crate) error_bound: u64,
    pub(crate) keys: Vec<TopKey>,
}

/// What `/v1/top` reports for one policy.
#[derive(Clone, Debug)]
pub(crate) struct TopView {
    /// The first period counted (Unix seconds / [`PERIOD_SECS`]).
    pub(crate) since_period: u64,
    pub(crate) requests: Counted,
    pub(crate) denied: Counted,
}

/// Every policy's sketches, kept across reloads by policy name, and the current period.
pub(crate) struct TopKeys {
    period: Arc<AtomicU64>,
    policies: RwLock<HashMap<String, Arc<PolicyTop>>>,
}

impl Default for TopKeys {
    fn default() -> Self {
        let top = TopKeys {
            period: Arc::default(),
            policies: RwLock::default(),
        };
        top.tick(unix_secs());
        top
    }
}

impl std::fmt::Debug for TopKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TopKeys")
    }
}

/// The time since the Unix epoch, to the nanosecond.
pub(crate) fn unix_now() -> std::time::Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

/// Seconds since the Unix epoch, now.
pub(crate) fn unix_secs() -> u64 {
    unix_now().as_secs()
}

impl TopKeys {
    /// Moves to the period of `unix_secs` (the server calls it every second).
    pub(crate) fn tick(&self, unix_secs: u64) {
        self.period.store(unix_secs / PERIOD_SECS, Relaxed);
    }

    /// The sketches of `policy`, created on first use (an engine resolves them once per
    /// configuration).
    pub(crate) fn policy(&self, policy: &str) -> Arc<PolicyTop> {
        if let Ok(map) = self.policies.read()
            && let Some(top) = map.get(policy)
        {
            return Arc::clone(top);
        }
        let mut map = self
            .policies
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let period = Arc::clone(&self.period);
        Arc::clone(map.entry(policy.to_owned()).or_insert_with(|| {
            Arc::new(PolicyTop {
                shards: Default::default(),
                hasher: RandomState::new(),
                period,
            })
        }))
    }

    /// The Unix second the reads of [`PolicyTop::read`] start from.
    pub(crate) fn since_secs(view: &TopView) -> u64 {
        view.since_period * PERIOD_SECS
    }
}

#[cfg(test)]
#[path = "top_tests.rs"]
mod tests;
