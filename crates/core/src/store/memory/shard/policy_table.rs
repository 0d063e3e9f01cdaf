//! A shard's table for one policy: the packed words of its keys, the states too wide for a
//! word, its sliding logs and its concurrency permits; deciding a known key by
//! compare-and-swap, and what a sweep and an eviction read of each state.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, PoisonError};

use super::super::log::LogTable;
use super::super::packing::{Packed, SPILLED, Slot};
use super::super::table::Table;
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

pub(super) type KeyMap<V> = HashMap<u64, V, BuildHasherDefault<PassThrough>>;

/// The map keys are already keyed SipHash outputs: hashing them again would only cost time.
#[derive(Default)]
pub(super) struct PassThrough(u64);

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
        if word == SPILLED {
            return self.spill.get(&hash).map(|slot| alg.narrow(*lock(slot)));
        }
        Some(alg.decode(self.base, word))
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

    pub(super) fn remove(&mut self, hash: u64) -> bool {
        self.spill.remove(&hash);
        self.packed.remove(hash)
            || self.logs.remove(hash).is_some()
            || self.permits.remove(&hash).is_some()
    }

    /// Decides under the shared lock: a compare-and-swap loop on the key's word.
    #[inline(always)]
    pub(super) fn try_packed<A: Packed>(
        &self,
        alg: &A,
        hash: u64,
        now: Timestamp,
        cost: u32,
    ) -> Option<Verdict> {
        let word = self.packed.get(hash)?;
        // Relaxed is enough: the decision depends on this one word, and compare-and-swap on one
        // location is totally ordered, so no two threads both consume the same last unit. The
        // table itself is published by the shard lock.
        let mut current = word.load(Ordering::Relaxed);
        loop {
            if current == SPILLED {
                return self.try_spilled(alg, hash, now, cost);
            }
            let mut state = alg.decode(self.base, current);
            let verdict = alg.evaluate(&mut state, now, cost);
            // Denials and peeks write nothing: a client that is being refused costs no store.
            if !verdict.allowed || cost == 0 {
                return Some(verdict);
            }
            alg.commit(&mut state, now, cost);
            let next = alg.encode(self.base, &state)?;
            match word.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(verdict),
                Err(seen) => current = seen,
            }
        }
    }

    /// Decides a spilled key under its mutex. It stays spilled until it expires.
    fn try_spilled<A: Packed>(
        &self,
        alg: &A,
        hash: u64,
        now: Timestamp,
        cost: u32,
    ) -> Option<Verdict> {
        let mut slot = lock(self.spill.get(&hash)?);
        let mut state = alg.narrow(*slot);
        let verdict = alg.evaluate(&mut state, now, cost);
        if verdict.allowed && cost > 0 {
            alg.commit(&mut state, now, cost);
            *slot = alg.widen(&state);
        }
        Some(verdict)
    }

    /// When each state expires and what share of its quota it holds at `now` (in 2⁻²⁰ units).
    pub(super) fn ranked(&mut self, now: Timestamp, index: usize, out: &mut Vec<Candidate>) {
        let base = self.base;
        by_algorithm!(&self.quota, alg => {
            for (hash, word) in self.packed.iter() {
                let state = if word == SPILLED {
                    self.spill.get(&hash).map(|s| alg.narrow(*lock(s)))
                } else {
                    Some(alg.decode(base, word))
                };
                if let Some(mut state) = state {
                    let expires_at = alg.expires_at(&state).as_micros();
                    let stake = stake(alg.evaluate(&mut state, now, 0));
                    out.push(Candidate { stake, expires_at, hash, index });
                }
            }
        }, alg => {
            self.logs.for_each_mut(|hash, log| {
                let expires_at = alg.expires_at_log(log).as_micros();
                let stake = stake(alg.evaluate_log(log, now, 0));
                out.push(Candidate { stake, expires_at, hash, index });
            });
        }, alg => {
            for (&hash, state) in self.permits.iter_mut() {
                let state = get_mut(state);
                let expires_at = alg.expires_at(state).as_micros();
                let stake = stake(alg.evaluate(state, now, 0, 0));
                out.push(Candidate { stake, expires_at, hash, index });
            }
        });
    }

    /// Drops the states that have fully reset by `now`.
    pub(super) fn sweep(&mut self, now: u64) {
        let base = self.base;
        by_algorithm!(&self.quota, alg => {
            self.spill.retain(|_, s| alg.expires_at(&alg.narrow(*get_mut(s))).as_micros() > now);
            let spill = &self.spill;
            self.packed.retain(|hash, word| {
                if word == SPILLED {
                    spill.contains_key(&hash)
                } else {
                    alg.expires_at(&alg.decode(base, word)).as_micros() > now
                }
            });
        }, alg => {
            self.logs.retain(|log| alg.expires_at_log(log).as_micros() > now);
        }, alg => {
            self.permits.retain(|_, state| alg.expires_at(get_mut(state)).as_micros() > now);
        });
    }
}

/// The share of the quota a decision says is in use, in 2⁻²⁰ units: what evicting the key
/// would hand back to it.
fn stake(peek: Verdict) -> u64 {
    let limit = peek.limit.max(1);
    (limit.saturating_sub(peek.remaining) << 20) / limit
}

/// An eviction candidate: the least at stake goes first, then the earliest to expire.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Candidate {
    stake: u64,
    expires_at: u64,
    pub(super) hash: u64,
    pub(super) index: usize,
}
