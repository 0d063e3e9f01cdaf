//! A shard's table for one policy: the packed words of its keys, the states too wide for a
//! word, its sliding logs and its concurrency permits; deciding a known key by
//! compare-and-swap, and what a sweep and an eviction read of each state.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use super::super::key_hash::{Hashed, KeyMap};
use super::super::log::LogTable;
use super::super::packing::{Packed, SPILLED, Slot, VACANT};
use super::super::table::{Claim, Table};
use super::ghosts::Ghosts;
use crate::algorithm::{Algorithm, ConcurrencyState};
use crate::{Policy, Quota, Timestamp, Verdict};

#[derive(Debug)]
pub(super) struct PolicyTable {
    pub(super) fingerprint: u64,
    pub(super) quota: Quota,
    /// [`Packed::base`] of the quota.
    base: u64,
    packed: Table,
    /// States too wide for a word; their word in `packed` is [`SPILLED`]. Each has a mutex,
    /// so a spilled key is still decided under the shared lock.
    spill: KeyMap<Mutex<Slot>>,
    pub(super) logs: LogTable,
    /// Concurrency keys' permits, each under a mutex of its own, so that a known key is decided
    /// under the shard's shared lock. A key's vector holds at most `limit` permits.
    pub(super) permits: KeyMap<Mutex<ConcurrencyState>>,
}

/// A poisoned entry still holds a valid state: steps do not panic midway.
pub(super) fn lock<T>(entry: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    entry.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(super) fn get_mut<T>(entry: &mut Mutex<T>) -> &mut T {
    entry.get_mut().unwrap_or_else(PoisonError::into_inner)
}

impl PolicyTable {
    pub(super) fn new(policy: &Policy) -> Self {
        Self::with_quota(policy.fingerprint(), policy.quota().clone())
    }

    /// The table of the policy whose fingerprint is `fingerprint`, with `quota`.
    pub(super) fn with_quota(fingerprint: u64, quota: Quota) -> Self {
        let base = by_algorithm!(&quota, a => a.base(), _log => 0, _permits => 0);
        PolicyTable {
            fingerprint,
            quota,
            base,
            packed: Table::default(),
            spill: KeyMap::default(),
            logs: LogTable::default(),
            permits: KeyMap::default(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.packed.len() + self.logs.len() + self.permits.len()
    }

    /// Adds its tables' layouts to `layout`.
    #[cfg(test)]
    pub(super) fn layout(&self, layout: &mut super::super::table::Layout) {
        layout.add(&self.packed);
        self.logs.layout(layout);
    }

    /// Takes the quota of `policy`, which has this table's fingerprint. Only a concurrency
    /// limit's can differ: its fingerprint leaves out its numbers, so that a reload that
    /// changes them keeps the slots in use. Decisions read the limit from the policy; the
    /// eviction ranking ([`ranked`](Self::ranked)) reads it from here.
    pub(super) fn follow(&mut self, policy: &Policy) {
        if let Quota::Concurrency(_) = policy.quota()
            && self.quota != *policy.quota()
        {
            self.quota = policy.quota().clone();
        }
    }

    /// Makes room for `additional` more keys.
    pub(super) fn reserve(&mut self, additional: usize) {
        match self.quota {
            Quota::SlidingWindowLog(_) => self.logs.reserve(additional),
            Quota::Concurrency(_) => {}
            _ => self.packed.reserve(additional),
        }
    }

    /// Whether `hash` has a state here.
    pub(super) fn contains(&self, hash: u64) -> bool {
        self.packed.get(hash).is_some()
            || self.logs.get(hash).is_some()
            || self.permits.contains_key(&hash)
    }

    /// Every packed `(hash, word)`; a word [`SPILLED`] has its state in [`spilled`](Self::spilled).
    pub(super) fn packed_words(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.packed.iter()
    }

    /// The state of a spilled key.
    pub(super) fn spilled(&self, hash: u64) -> Option<&Mutex<Slot>> {
        self.spill.get(&hash)
    }

    /// [`Packed::base`] of the quota.
    pub(super) fn base(&self) -> u64 {
        self.base
    }

    pub(super) fn load<A: Packed>(&self, alg: &A, hash: u64) -> Option<A::State> {
        let word = self.packed.get(hash)?.load(Ordering::Relaxed);
        self.state_of(alg, hash, word)
    }

    /// The state a word stands for (a spilled one's from its slot).
    fn state_of<A: Packed>(&self, alg: &A, hash: u64, word: u64) -> Option<A::State> {
        match word {
            SPILLED => self.spill.get(&hash).map(|slot| alg.narrow(*lock(slot))),
            VACANT => Some(A::State::default()),
            word => Some(alg.decode(self.base, word)),
        }
    }

    /// Stores `state` for `hash`, as a word when it fits.
    pub(super) fn save<A: Packed>(&mut self, alg: &A, hash: u64, state: &A::State) {
        let word = alg.encode(self.base, state);
        match self.packed.get_mut(hash) {
            Some(slot) => {
                if *slot == SPILLED && word.is_some() {
                    self.spill.remove(&hash);
                }
                *slot = word.unwrap_or(SPILLED);
            }
            None => self.packed.insert(hash, word.unwrap_or(SPILLED)),
        }
        if word.is_none() {
            self.spill.insert(hash, Mutex::new(alg.widen(state)));
        }
    }

    /// Whether adding keys of `hashes` one at a time would walk far from their homes (see
    /// `Table::would_crowd`).
    pub(super) fn would_crowd(&self, hashes: impl ExactSizeIterator<Item = u64>) -> bool {
        match self.quota {
            Quota::SlidingWindowLog(_) => self.logs.would_crowd(hashes),
            Quota::Concurrency(_) => false,
            _ => self.packed.would_crowd(hashes),
        }
    }

    /// Stores the states of keys it does not hold, their hashes unique, as [`save`](Self::save)
    /// stores each, in one pass (see `Table::extend`).
    pub(super) fn extend<A: Packed>(&mut self, alg: &A, states: Vec<(u64, A::State)>) {
        let mut words = Vec::with_capacity(states.len());
        for (hash, state) in states {
            let word = alg.encode(self.base, &state);
            if word.is_none() {
                self.spill.insert(hash, Mutex::new(alg.widen(&state)));
            }
            words.push((hash, word.unwrap_or(SPILLED)));
        }
        self.packed.extend_words(words);
    }

    pub(super) fn remove(&mut self, hash: u64) -> bool {
        self.spill.remove(&hash);
        self.packed.remove(hash)
            || self.logs.remove(hash).is_some()
            || self.permits.remove(&hash).is_some()
    }

    /// Decides under the shared lock: a compare-and-swap loop on the key's word, after claiming
    /// a slot for a new key that the decision stores. `None`: the exclusive lock is needed.
    #[inline(always)]
    pub(super) fn try_packed<'s, A: Packed>(
        &self,
        alg: &A,
        key: Hashed,
        now: Timestamp,
        cost: u32,
        room: impl FnOnce() -> Room<'s>,
    ) -> Option<Verdict> {
        let hash = key.value;
        match self.packed.find(hash, key.again) {
            Ok(word) => self.decide_word(alg, hash, word, word.load(Ordering::Relaxed), now, cost),
            Err(vacant) => self.try_new(alg, hash, vacant?, now, cost, room()),
        }
    }

    /// A key the table does not hold, under the shared lock. A denial or a peek stores nothing,
    /// as under the exclusive lock. Otherwise its slot is claimed if the shard may grow by one
    /// key without a sweep or an eviction ([`Room`]) and the table without growing; if not, the
    /// exclusive lock does it.
    ///
    /// Why: a key whose quota had fully reset was dropped by a sweep and comes back new. Under
    /// the exclusive lock (eight locked instructions to take it, a probe again, a shard-wide
    /// count) that cost about 150 ns a decision against 40 for a known key, with 100,000 keys in
    /// turn on a bucket of 1,000 a second, where every key comes back so (`benches/check.rs`,
    /// mode `renew`).
    ///
    /// Inline, as [`try_spilled`](Self::try_spilled): out of line, each returned its verdict
    /// through a stack slot that the known key's path then wrote its own verdict to as well,
    /// and the decision was copied out of it with a 16-byte load of two 8-byte stores, which the
    /// processor cannot forward: a stall in every check (perf annotate of `benches/check.rs`,
    /// a hot key 27 ns a check, 23 ns inline).
    #[inline(always)]
    fn try_new<A: Packed>(
        &self,
        alg: &A,
        hash: u64,
        vacant: usize,
        now: Timestamp,
        cost: u32,
        room: Room<'_>,
    ) -> Option<Verdict> {
        let mut state = A::State::default();
        let verdict = alg.check(&mut state, now, cost);
        if !verdict.allowed || cost == 0 {
            return Some(verdict);
        }
        let next = alg.encode(self.base, &state)?;
        if !room.reserve() {
            return None;
        }
        let word = match self.packed.claim(hash, vacant) {
            Claim::New(word) => {
                room.count_return(hash);
                word
            }
            Claim::Existing(word) => {
                room.release();
                return self.decide_word(alg, hash, word, word.load(Ordering::Relaxed), now, cost);
            }
            Claim::Full => {
                room.release();
                return None;
            }
        };
        match word.compare_exchange(VACANT, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => Some(verdict),
            // Another thread decided the key since the claim: decide again from its state.
            Err(seen) => self.decide_word(alg, hash, word, seen, now, cost),
        }
    }

    /// The compare-and-swap loop on a known key's word, `current` its last value seen.
    #[inline(always)]
    fn decide_word<A: Packed>(
        &self,
        alg: &A,
        hash: u64,
        word: &AtomicU64,
        mut current: u64,
        now: Timestamp,
        cost: u32,
    ) -> Option<Verdict> {
        // Relaxed is enough: the decision depends on this one word, and compare-and-swap on one
        // location is totally ordered, so no two threads both consume the same last unit. The
        // table itself is published by the shard lock.
        loop {
            if current == SPILLED {
                return self.try_spilled(alg, hash, now, cost);
            }
            let mut state = if current == VACANT {
                A::State::default()
            } else {
                alg.decode(self.base, current)
            };
            let verdict = alg.check(&mut state, now, cost);
            // Denials and peeks write nothing: a client that is being refused costs no store.
            if !verdict.allowed || cost == 0 {
                return Some(verdict);
            }
            let next = alg.encode(self.base, &state)?;
            match word.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(verdict),
                Err(seen) => current = seen,
            }
        }
    }

    /// Decides a spilled key under its mutex. It stays spilled until it expires. Inline: see
    /// [`try_new`](Self::try_new).
    #[inline(always)]
    fn try_spilled<A: Packed>(
        &self,
        alg: &A,
        hash: u64,
        now: Timestamp,
        cost: u32,
    ) -> Option<Verdict> {
        let mut slot = lock(self.spill.get(&hash)?);
        let mut state = alg.narrow(*slot);
        let verdict = alg.check(&mut state, now, cost);
        if verdict.allowed && cost > 0 {
            *slot = alg.widen(&state);
        }
        Some(verdict)
    }

    /// When each state expires and what share of its quota it holds at `now` (in 2⁻²⁰ units).
    pub(super) fn ranked(&mut self, now: Timestamp, index: usize, out: &mut Vec<Candidate>) {
        by_algorithm!(&self.quota, alg => {
            for (hash, word) in self.packed.iter() {
                if let Some(mut state) = self.state_of(alg, hash, word) {
                    let expires_at = alg.expires_at(&state).as_micros();
                    let stake = stake(alg.evaluate(&mut state, now, 0));
                    out.push(Candidate::new(stake, expires_at, hash, index));
                }
            }
        }, alg => {
            self.logs.for_each_mut(|hash, log| {
                let expires_at = alg.expires_at_log(log).as_micros();
                let stake = stake(alg.evaluate_log(log, now, 0));
                out.push(Candidate::new(stake, expires_at, hash, index));
            });
        }, alg => {
            for (&hash, state) in self.permits.iter_mut() {
                let state = get_mut(state);
                let expires_at = alg.expires_at(state).as_micros();
                let stake = stake(alg.evaluate(state, now, 0, 0));
                out.push(Candidate::new(stake, expires_at, hash, index));
            }
        });
    }

    /// Drops the states that have fully reset by `now`.
    /// Drops the states that have fully reset by `now`, recording the packed ones' hashes in
    /// `ghosts` (new logs are added under the exclusive lock, which counts no returns).
    pub(super) fn sweep(&mut self, now: u64, ghosts: &mut Ghosts) {
        let base = self.base;
        by_algorithm!(&self.quota, alg => {
            self.spill.retain(|_, s| alg.expires_at(&alg.narrow(*get_mut(s))).as_micros() > now);
            let spill = &self.spill;
            self.packed.retain(|hash, word| {
                let keep = match word {
                    SPILLED => spill.contains_key(&hash),
                    VACANT => false,
                    word => alg.expires_at(&alg.decode(base, word)).as_micros() > now,
                };
                if !keep {
                    ghosts.record(hash);
                }
                keep
            });
        }, alg => {
            self.logs.retain(|log| alg.expires_at_log(log).as_micros() > now);
        }, alg => {
            self.permits.retain(|_, state| alg.expires_at(get_mut(state)).as_micros() > now);
        });
    }
}

/// The shard's count of keys, for a new key added under the shared lock: it may add one while
/// the count is under `limit`, the count at which the shard must sweep or evict first (which
/// takes the exclusive lock). And the keys its last sweep dropped, to count those that return.
#[derive(Clone, Copy)]
pub(super) struct Room<'s> {
    pub(super) len: &'s AtomicUsize,
    pub(super) limit: usize,
    pub(super) ghosts: &'s Ghosts,
    pub(super) returns: &'s AtomicUsize,
}

impl Room<'_> {
    /// Counts a new key that the last sweep dropped.
    fn count_return(self, hash: u64) {
        if self.ghosts.contains(hash) {
            self.returns.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one more key, if there is room for it.
    fn reserve(self) -> bool {
        if self.len.fetch_add(1, Ordering::Relaxed) < self.limit {
            return true;
        }
        self.release();
        false
    }

    fn release(self) {
        self.len.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The share of the quota a decision says is in use, in 2⁻²⁰ units: what evicting the key
/// would hand back to it.
fn stake(peek: Verdict) -> u64 {
    let limit = peek.limit.max(1);
    (limit.saturating_sub(peek.remaining) << 20) / limit
}

/// An eviction candidate: the least at stake goes first, then the earliest to expire, then, among
/// keys alike in both (a flood of one-request keys in one window), the order of `tie`, a scatter
/// of the hash.
///
/// Why not the hash itself: its high bits are the key's home in the table (and its low bits
/// chose the shard). Ties broken by the hash evicted the keys of the lowest homes, round after
/// round, so a shard at its bound kept keys of ever higher homes: past twice `max_keys` keys
/// through the store every key sat in the top half of its table, past six times in one probe
/// run the length of the table, a thousand slots from its home on average. Every check walked
/// that run, and a restore placing a million such keys walked it for each (19 to 30 s, against
/// 76 ms for keys spread over the homes).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Candidate {
    stake: u64,
    expires_at: u64,
    tie: u64,
    pub(super) hash: u64,
    pub(super) index: usize,
}

impl Candidate {
    fn new(stake: u64, expires_at: u64, hash: u64, index: usize) -> Self {
        Candidate {
            stake,
            expires_at,
            tie: scatter(hash),
            hash,
            index,
        }
    }
}

/// A one-to-one mix of a hash (SplitMix64's finalizer): each of its bits depends on every bit of
/// the hash, so the keys first in its order are spread over every range of the hash's bits
/// (homes, shards, the ghosts' bits) as evenly as the keys themselves.
fn scatter(hash: u64) -> u64 {
    let z = (hash ^ (hash >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests;
