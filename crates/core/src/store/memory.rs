//! The in-process store: the embedded default.
//!
//! # Layout
//!
//! State lives in shards, each a `Mutex` around two hash maps, so two threads contend only when
//! their keys share a shard; there is no global lock. A key is identified by a keyed 64-bit
//! SipHash of (policy fingerprint, key bytes): fixed size, no allocation for keys of any length,
//! and, because the hash key is random per store, no way for a client to craft keys that collide
//! with another client's. (Two of a million keys share state with probability about 3·10⁻⁸.)
//!
//! The counter and bucket algorithms pack their state into a 16-byte [`Slot`] whose first field
//! is always the time the state expires, so eviction never needs the policy. With the 8-byte
//! key that is 24 bytes an entry: under 64 bytes a tracked key, table overhead included
//! (`benches/memory_per_key.rs` measures it). The sliding log keeps its own map, since its
//! state grows with the limit.
//!
//! # Eviction
//!
//! An entry whose quota has fully reset is equivalent to no entry. Shards drop such entries when
//! they have doubled in size since the last sweep, before they grow. When a shard is at its share
//! of `max_keys`, it drops expired entries and, if that is not enough, the sixteenth of its
//! entries with the least at stake: earliest expiry first, then least consumed, so a flood of
//! new keys evicts other one-request keys long before it evicts a client that is being denied.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use smallvec::SmallVec;

use super::{Check, Store};
use crate::algorithm::{
    Algorithm, FixedWindow, FixedWindowState, LeakyBucket, LeakyBucketState, SlidingWindowCounter,
    SlidingWindowCounterState, SlidingWindowLog, SlidingWindowLogState, TokenBucket,
    TokenBucketState,
};
use crate::{Decision, Decisions, Quota, StoreError, Timestamp, Verdict};

/// The default bound on tracked keys.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// A sweep never runs on a shard smaller than this.
const MIN_SWEEP: usize = 64;

/// The in-process store. Cheap to clone: clones share the same state.
#[derive(Clone, Debug)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shards: Box<[Padded<Mutex<Shard>>]>,
    shard_mask: u64,
    /// Each shard's share of `max_keys`.
    shard_cap: usize,
    /// Keys the hash of (policy, key): random per store.
    hasher: RandomState,
}

/// Keeps each shard's lock on its own cache lines, so neighbours do not slow each other down.
#[derive(Debug)]
#[repr(align(128))]
struct Padded<T>(T);

/// A packed counter or bucket state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Slot {
    /// When the state is equivalent to a fresh key (µs since the epoch).
    expires_at: u64,
    a: u32,
    b: u32,
}

#[derive(Debug)]
struct LogEntry {
    state: SlidingWindowLogState,
    expires_at: u64,
}

type KeyMap<V> = HashMap<u64, V, BuildHasherDefault<PassThrough>>;

#[derive(Debug, Default)]
struct Shard {
    slots: KeyMap<Slot>,
    logs: KeyMap<LogEntry>,
    /// Sweep expired entries once the shard holds this many.
    sweep_at: usize,
}

/// The map keys are already SipHash outputs: hashing them again would only cost time.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Builds a [`MemoryStore`].
#[derive(Clone, Debug)]
pub struct MemoryStoreBuilder {
    max_keys: usize,
    shards: Option<usize>,
}

impl MemoryStoreBuilder {
    /// The most keys the store tracks (default 1,000,000); it evicts to stay within it.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
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
        let shard_cap = (self.max_keys / count).max(1);
        let shards = (0..count)
            .map(|_| {
                Padded(Mutex::new(Shard {
                    sweep_at: MIN_SWEEP.min(shard_cap),
                    ..Shard::default()
                }))
            })
            .collect();
        MemoryStore {
            inner: Arc::new(Inner {
                shards,
                shard_mask: count as u64 - 1,
                shard_cap,
                hasher: RandomState::new(),
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

    /// A builder to set `max_keys` and the shard count.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder {
            max_keys: DEFAULT_MAX_KEYS,
            shards: None,
        }
    }

    /// The bound on tracked keys.
    pub fn max_keys(&self) -> usize {
        self.inner.shard_cap * self.inner.shards.len()
    }

    /// How many keys are tracked now (expired ones included until a sweep drops them).
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| {
                let shard = lock(&s.0);
                shard.slots.len() + shard.logs.len()
            })
            .sum()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every key whose quota has fully reset by `now`; returns how many. Servers call it
    /// now and then so an idle store shrinks; the store also sweeps by itself as it grows.
    pub fn purge_expired(&self, now: Timestamp) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| lock(&s.0).sweep(now.as_micros()))
            .sum()
    }

    /// Decides `checks` synchronously: the work behind [`Store::apply`], for callers without an
    /// async context.
    pub fn apply_now(&self, now: Timestamp, checks: &[Check<'_>]) -> Decisions {
        match checks {
            [] => Decisions::new(),
            [check] => {
                let mut out = Decisions::new();
                out.push(self.apply_one_now(now, check));
                out
            }
            _ => self.apply_batch(now, checks),
        }
    }

    /// Decides one check synchronously.
    #[inline]
    pub fn apply_one_now(&self, now: Timestamp, check: &Check<'_>) -> Decision {
        let hash = self.hash(check);
        let verdict = {
            let mut shard = lock(self.shard(hash));
            let cap = self.inner.shard_cap;
            shard
                .step(
                    check.policy.quota(),
                    hash,
                    now,
                    check.cost,
                    Mode::Commit,
                    cap,
                )
                .0
        };
        verdict.into_decision(check.policy.shared_name())
    }

    /// Several checks at once: lock every shard involved in index order (so two batches never
    /// deadlock), decide and tentatively commit each, and undo the commits if any check denies.
    fn apply_batch(&self, now: Timestamp, checks: &[Check<'_>]) -> Decisions {
        let hashes: SmallVec<[u64; 4]> = checks.iter().map(|c| self.hash(c)).collect();
        let mut indexes: SmallVec<[usize; 4]> =
            hashes.iter().map(|&h| self.shard_index(h)).collect();
        indexes.sort_unstable();
        indexes.dedup();
        let mut guards: SmallVec<[(usize, MutexGuard<'_, Shard>); 4]> = indexes
            .iter()
            .map(|&i| (i, lock(&self.inner.shards[i].0)))
            .collect();
        let cap = self.inner.shard_cap;
        let mut verdicts: SmallVec<[Verdict; 4]> = SmallVec::new();
        let mut undo: SmallVec<[Undo; 4]> = SmallVec::new();
        let mut all_allowed = true;
        for (check, &hash) in checks.iter().zip(&hashes) {
            let shard = guard_for(&mut guards, self.shard_index(hash));
            let mode = if all_allowed {
                Mode::Commit
            } else {
                Mode::Evaluate
            };
            let (verdict, step_undo) =
                shard.step(check.policy.quota(), hash, now, check.cost, mode, cap);
            all_allowed &= verdict.allowed;
            verdicts.push(verdict);
            undo.push(step_undo);
        }
        if !all_allowed {
            for ((check, &hash), step_undo) in checks.iter().zip(&hashes).zip(&undo).rev() {
                guard_for(&mut guards, self.shard_index(hash)).undo(check, hash, now, step_undo);
            }
            // Nothing was consumed: report each admitting policy's quota as it stands.
            for ((check, &hash), verdict) in checks.iter().zip(&hashes).zip(verdicts.iter_mut()) {
                if verdict.allowed {
                    let shard = guard_for(&mut guards, self.shard_index(hash));
                    *verdict = shard
                        .step(check.policy.quota(), hash, now, 0, Mode::Evaluate, cap)
                        .0;
                }
            }
        }
        drop(guards);
        checks
            .iter()
            .zip(verdicts)
            .map(|(check, v)| v.into_decision(check.policy.shared_name()))
            .collect()
    }

    /// Gives back the cost of admitted checks (see [`Store::refund`]).
    pub fn refund_now(&self, now: Timestamp, checks: &[Check<'_>]) {
        for check in checks {
            let hash = self.hash(check);
            lock(self.shard(hash)).refund(check, hash, now);
        }
    }

    /// The key's identity: SipHash-1-3 under this store's random key, of the key bytes followed
    /// by the policy fingerprint (fixed-size and last, so no length prefix is needed to keep
    /// two (policy, key) pairs from writing the same bytes).
    #[inline]
    fn hash(&self, check: &Check<'_>) -> u64 {
        let mut hasher = self.inner.hasher.build_hasher();
        hasher.write(check.key);
        hasher.write_u64(check.policy.fingerprint());
        hasher.finish()
    }

    /// Bits 32 and up pick the shard: the maps use the low bits for buckets and the top seven
    /// as tags, so shard choice stays independent of both.
    #[inline]
    fn shard_index(&self, hash: u64) -> usize {
        ((hash >> 32) & self.inner.shard_mask) as usize
    }

    fn shard(&self, hash: u64) -> &Mutex<Shard> {
        &self.inner.shards[self.shard_index(hash)].0
    }
}

impl Store for MemoryStore {
    async fn apply(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<Decisions, StoreError> {
        Ok(self.apply_now(now, checks))
    }

    async fn apply_one(&self, now: Timestamp, check: Check<'_>) -> Result<Decision, StoreError> {
        Ok(self.apply_one_now(now, &check))
    }

    async fn refund(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<(), StoreError> {
        self.refund_now(now, checks);
        Ok(())
    }

    /// Every operation runs under a shard lock and never waits for anything else.
    fn is_immediate(&self) -> bool {
        true
    }
}

/// A poisoned shard still holds valid state (algorithm steps do not panic midway), so keep going.
fn lock(mutex: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn guard_for<'g, 's>(
    guards: &'g mut [(usize, MutexGuard<'s, Shard>)],
    index: usize,
) -> &'g mut Shard {
    let position = guards.partition_point(|(i, _)| *i < index);
    &mut guards[position].1
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Evaluate,
    Commit,
}

/// How to take back a tentative commit of a batch.
enum Undo {
    Nothing,
    /// Put the slot back as it was (`None`: it did not exist).
    Slot(Option<Slot>),
    /// Take the cost back out of the log.
    Log,
}

/// Counter and bucket states that pack into a [`Slot`].
trait Packed: Algorithm {
    fn pack(&self, state: &Self::State) -> Slot;
    fn unpack(&self, slot: Slot) -> Self::State;
}

impl Packed for FixedWindow {
    fn pack(&self, state: &FixedWindowState) -> Slot {
        Slot {
            expires_at: state.window_end,
            a: state.count,
            b: 0,
        }
    }

    fn unpack(&self, slot: Slot) -> FixedWindowState {
        FixedWindowState {
            window_end: slot.expires_at,
            count: slot.a,
        }
    }
}

impl Packed for SlidingWindowCounter {
    /// The expiry is `window_end + window` while the current count is non-zero and
    /// `window_end` otherwise, so `window_end` can be recovered from it and the counts.
    fn pack(&self, state: &SlidingWindowCounterState) -> Slot {
        let expires_at = if state.current > 0 {
            state.window_end + self.window_micros()
        } else {
            state.window_end
        };
        Slot {
            expires_at,
            a: state.current,
            b: state.previous,
        }
    }

    fn unpack(&self, slot: Slot) -> SlidingWindowCounterState {
        let window_end = if slot.a > 0 {
            slot.expires_at - self.window_micros()
        } else {
            slot.expires_at
        };
        SlidingWindowCounterState {
            window_end,
            current: slot.a,
            previous: slot.b,
        }
    }
}

impl Packed for TokenBucket {
    fn pack(&self, state: &TokenBucketState) -> Slot {
        Slot {
            expires_at: state.tat,
            a: 0,
            b: 0,
        }
    }

    fn unpack(&self, slot: Slot) -> TokenBucketState {
        TokenBucketState {
            tat: slot.expires_at,
        }
    }
}

impl Packed for LeakyBucket {
    fn pack(&self, state: &LeakyBucketState) -> Slot {
        Slot {
            expires_at: state.next_free,
            a: 0,
            b: 0,
        }
    }

    fn unpack(&self, slot: Slot) -> LeakyBucketState {
        LeakyBucketState {
            next_free: slot.expires_at,
        }
    }
}

impl Shard {
    fn len(&self) -> usize {
        self.slots.len() + self.logs.len()
    }

    fn step(
        &mut self,
        quota: &Quota,
        hash: u64,
        now: Timestamp,
        cost: u32,
        mode: Mode,
        cap: usize,
    ) -> (Verdict, Undo) {
        match quota {
            Quota::FixedWindow(a) => self.step_packed(a, hash, now, cost, mode, cap),
            Quota::SlidingWindowCounter(a) => self.step_packed(a, hash, now, cost, mode, cap),
            Quota::TokenBucket(a) => self.step_packed(a, hash, now, cost, mode, cap),
            Quota::LeakyBucket(a) => self.step_packed(a, hash, now, cost, mode, cap),
            Quota::SlidingWindowLog(a) => self.step_log(a, hash, now, cost, mode, cap),
        }
    }

    fn step_packed<A: Packed>(
        &mut self,
        alg: &A,
        hash: u64,
        now: Timestamp,
        cost: u32,
        mode: Mode,
        cap: usize,
    ) -> (Verdict, Undo) {
        let commit = mode == Mode::Commit && cost > 0;
        // One lookup for a known key: decide and update the slot in place.
        if let Some(slot) = self.slots.get_mut(&hash) {
            let before = *slot;
            let mut state = alg.unpack(before);
            let verdict = alg.evaluate(&mut state, now, cost);
            if !(commit && verdict.allowed) {
                return (verdict, Undo::Nothing);
            }
            alg.commit(&mut state, now, cost);
            *slot = alg.pack(&state);
            return (verdict, Undo::Slot(Some(before)));
        }
        let mut state = A::State::default();
        let verdict = alg.evaluate(&mut state, now, cost);
        if !(commit && verdict.allowed) {
            return (verdict, Undo::Nothing);
        }
        alg.commit(&mut state, now, cost);
        self.make_room(now.as_micros(), cap);
        self.slots.insert(hash, alg.pack(&state));
        (verdict, Undo::Slot(None))
    }

    fn step_log(
        &mut self,
        alg: &SlidingWindowLog,
        hash: u64,
        now: Timestamp,
        cost: u32,
        mode: Mode,
        cap: usize,
    ) -> (Verdict, Undo) {
        if let Some(entry) = self.logs.get_mut(&hash) {
            let verdict = alg.evaluate(&mut entry.state, now, cost);
            if mode == Mode::Evaluate || !verdict.allowed || cost == 0 {
                return (verdict, Undo::Nothing);
            }
            alg.commit(&mut entry.state, now, cost);
            entry.expires_at = alg.expires_at(&entry.state).as_micros();
            return (verdict, Undo::Log);
        }
        let mut state = SlidingWindowLogState::default();
        let verdict = alg.evaluate(&mut state, now, cost);
        if mode == Mode::Evaluate || !verdict.allowed || cost == 0 {
            return (verdict, Undo::Nothing);
        }
        alg.commit(&mut state, now, cost);
        let expires_at = alg.expires_at(&state).as_micros();
        self.make_room(now.as_micros(), cap);
        self.logs.insert(hash, LogEntry { state, expires_at });
        (verdict, Undo::Log)
    }

    fn undo(&mut self, check: &Check<'_>, hash: u64, now: Timestamp, undo: &Undo) {
        match undo {
            Undo::Nothing => {}
            Undo::Slot(Some(slot)) => {
                self.slots.insert(hash, *slot);
            }
            Undo::Slot(None) => {
                self.slots.remove(&hash);
            }
            Undo::Log => self.refund(check, hash, now),
        }
    }

    fn refund(&mut self, check: &Check<'_>, hash: u64, now: Timestamp) {
        match check.policy.quota() {
            Quota::FixedWindow(a) => self.refund_packed(a, hash, now, check.cost),
            Quota::SlidingWindowCounter(a) => self.refund_packed(a, hash, now, check.cost),
            Quota::TokenBucket(a) => self.refund_packed(a, hash, now, check.cost),
            Quota::LeakyBucket(a) => self.refund_packed(a, hash, now, check.cost),
            Quota::SlidingWindowLog(a) => {
                if let Some(entry) = self.logs.get_mut(&hash) {
                    a.refund(&mut entry.state, now, check.cost);
                    entry.expires_at = a.expires_at(&entry.state).as_micros();
                }
            }
        }
    }

    fn refund_packed<A: Packed>(&mut self, alg: &A, hash: u64, now: Timestamp, cost: u32) {
        if let Some(slot) = self.slots.get_mut(&hash) {
            let mut state = alg.unpack(*slot);
            alg.refund(&mut state, now, cost);
            *slot = alg.pack(&state);
        }
    }

    /// Makes room for one more key: sweeps expired entries when the shard has doubled since the
    /// last sweep or is full, then evicts the least valuable entries if it is still full.
    fn make_room(&mut self, now: u64, cap: usize) {
        let len = self.len();
        if len < self.sweep_at && len < cap {
            return;
        }
        self.sweep(now);
        if self.len() >= cap {
            self.evict(cap.div_ceil(16).max(self.len() + 1 - cap));
        }
        self.sweep_at = (self.len() * 2).clamp(MIN_SWEEP.min(cap), cap);
    }

    /// Drops entries whose quota has fully reset; returns how many.
    fn sweep(&mut self, now: u64) -> usize {
        let before = self.len();
        self.slots.retain(|_, s| s.expires_at > now);
        self.logs.retain(|_, e| e.expires_at > now);
        before - self.len()
    }

    /// Drops the `count` entries with the least at stake: earliest expiry, then least consumed.
    fn evict(&mut self, count: usize) {
        let mut ranked: Vec<(u64, u64, u64, bool)> = self
            .slots
            .iter()
            .map(|(&k, s)| (s.expires_at, u64::from(s.a) + u64::from(s.b), k, false))
            .chain(
                self.logs
                    .iter()
                    .map(|(&k, e)| (e.expires_at, e.state.total, k, true)),
            )
            .collect();
        let count = count.min(ranked.len());
        if count == 0 {
            return;
        }
        if count < ranked.len() {
            ranked.select_nth_unstable(count - 1);
        }
        for &(_, _, key, is_log) in &ranked[..count] {
            if is_log {
                self.logs.remove(&key);
            } else {
                self.slots.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Policy, Quota, QuotaError};
    use std::time::Duration;

    #[test]
    fn slots_are_sixteen_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 16);
    }

    #[test]
    fn sliding_counter_packing_round_trips() -> Result<(), QuotaError> {
        let alg = SlidingWindowCounter::new(10, Duration::from_secs(1))?;
        for state in [
            SlidingWindowCounterState {
                window_end: 5_000_000,
                current: 3,
                previous: 7,
            },
            SlidingWindowCounterState {
                window_end: 5_000_000,
                current: 0,
                previous: 7,
            },
            SlidingWindowCounterState::default(),
        ] {
            assert_eq!(alg.unpack(alg.pack(&state)), state);
        }
        Ok(())
    }

    #[test]
    fn max_keys_rounds_shards_down() {
        let store = MemoryStore::builder().max_keys(10).shards(64).build();
        assert!(store.max_keys() <= 10);
    }

    #[test]
    fn denied_new_key_is_not_stored() -> Result<(), QuotaError> {
        let store = MemoryStore::new();
        let policy = Policy::new("p", Quota::fixed_window(1, Duration::from_secs(1))?)?;
        let now = Timestamp::from_secs(100);
        let d = store.apply_now(now, &[Check::new(&policy, b"k", 0)]);
        assert!(d.allowed());
        assert_eq!(store.len(), 0, "a peek stores nothing");
        Ok(())
    }
}
