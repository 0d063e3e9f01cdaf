//! One shard of the memory store: a table per policy for its slice of the key space, and the
//! two ways in. [`Shard::try_shared`] runs under the shared lock and decides a known key by
//! compare-and-swap (a sliding log under the key's own mutex). [`Shard::step`] runs under the
//! exclusive lock and does everything else: new keys, spilled states, batches, refunds, sweeps
//! and eviction.
//!
//! Tables are per policy so that a packed word needs no room for what the policy already
//! knows (the window, the refill interval), and a sweep can still tell when each state expires.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use super::log::{self, CompactLog, LogTable};
use super::packing::{Packed, SPILLED, Slot};
use super::table::Table;
use crate::algorithm::{Algorithm, SlidingWindowLog};
use crate::{Policy, Quota, Timestamp, Verdict};

/// A sweep never runs on a shard smaller than this.
const MIN_SWEEP: usize = 64;

/// The bounds a shard keeps.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    /// Keys tracked.
    pub(super) keys: usize,
    /// Bytes held by sliding logs.
    pub(super) log_bytes: usize,
}

/// Dispatches on a quota's algorithm: `$packed` for the four packed ones, `$log` for the log.
macro_rules! by_algorithm {
    ($quota:expr, $alg:ident => $packed:expr, $log:ident => $logged:expr) => {
        match $quota {
            Quota::FixedWindow($alg) => $packed,
            Quota::SlidingWindowCounter($alg) => $packed,
            Quota::TokenBucket($alg) => $packed,
            Quota::LeakyBucket($alg) => $packed,
            Quota::SlidingWindowLog($log) => $logged,
        }
    };
}

#[derive(Debug, Default)]
pub(super) struct Shard {
    /// Sorted by fingerprint.
    tables: Vec<PolicyTable>,
    /// Keys tracked, over all tables.
    len: usize,
    /// Sweep expired entries once the shard holds this many.
    sweep_at: usize,
    /// Bytes held by the sliding logs; they grow under the shared lock.
    log_bytes: AtomicUsize,
}

#[derive(Debug)]
struct PolicyTable {
    fingerprint: u64,
    quota: Quota,
    /// [`Packed::base`] of the quota.
    base: u64,
    packed: Table,
    /// States too wide for a word; their word in `packed` is [`SPILLED`]. Each has a mutex,
    /// so a spilled key is still decided under the shared lock.
    spill: KeyMap<Mutex<Slot>>,
    logs: LogTable,
}

type KeyMap<V> = HashMap<u64, V, BuildHasherDefault<PassThrough>>;

/// The map keys are already keyed SipHash outputs: hashing them again would only cost time.
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

/// What the shared-lock attempt came to.
pub(super) enum Shared {
    Decided(Verdict),
    /// Decided, and the logs are over their budget: trim them under the exclusive lock.
    DecidedOverBudget(Verdict),
    /// Needs the exclusive lock (a new key, a spilled or spilling state).
    Exclusive,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Evaluate,
    Commit,
}

/// How to take back a tentative commit of a batch.
pub(super) enum Undo {
    Nothing,
    /// Put the state back as it was (`None`: it did not exist).
    Packed(Option<Slot>),
    /// Take the cost back out of the log.
    Log,
}

/// A poisoned entry still holds a valid state: steps do not panic midway.
fn lock<T>(entry: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    entry.lock().unwrap_or_else(PoisonError::into_inner)
}

fn get_mut<T>(entry: &mut Mutex<T>) -> &mut T {
    entry.get_mut().unwrap_or_else(PoisonError::into_inner)
}

fn add_bytes(counter: &AtomicUsize, delta: isize) {
    if delta > 0 {
        counter.fetch_add(delta.unsigned_abs(), Ordering::Relaxed);
    } else if delta < 0 {
        counter.fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
    }
}

impl PolicyTable {
    fn new(policy: &Policy) -> Self {
        let base = by_algorithm!(policy.quota(), a => a.base(), _log => 0);
        PolicyTable {
            fingerprint: policy.fingerprint(),
            quota: policy.quota().clone(),
            base,
            packed: Table::default(),
            spill: KeyMap::default(),
            logs: LogTable::default(),
        }
    }

    fn len(&self) -> usize {
        self.packed.len() + self.logs.len()
    }

    fn load<A: Packed>(&self, alg: &A, hash: u64) -> Option<A::State> {
        let word = self.packed.get(hash)?.load(Ordering::Relaxed);
        if word == SPILLED {
            return self.spill.get(&hash).map(|slot| alg.narrow(*lock(slot)));
        }
        Some(alg.decode(self.base, word))
    }

    /// Stores `state` for `hash`, as a word when it fits.
    fn save<A: Packed>(&mut self, alg: &A, hash: u64, state: &A::State) {
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

    fn remove(&mut self, hash: u64) -> bool {
        self.spill.remove(&hash);
        self.packed.remove(hash) || self.logs.remove(hash).is_some()
    }

    /// Decides under the shared lock: a compare-and-swap loop on the key's word.
    #[inline(always)]
    fn try_packed<A: Packed>(
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
    fn ranked(&mut self, now: Timestamp, index: usize, out: &mut Vec<Candidate>) {
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
        });
    }

    /// Drops the states that have fully reset by `now`.
    fn sweep(&mut self, now: u64) {
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
struct Candidate {
    stake: u64,
    expires_at: u64,
    hash: u64,
    index: usize,
}

impl Shard {
    pub(super) fn new(limits: Limits) -> Self {
        Shard {
            sweep_at: MIN_SWEEP.min(limits.keys),
            ..Shard::default()
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn log_bytes(&self) -> usize {
        self.log_bytes.load(Ordering::Relaxed)
    }

    fn table_index(&self, fingerprint: u64) -> Option<usize> {
        self.tables
            .binary_search_by_key(&fingerprint, |t| t.fingerprint)
            .ok()
    }

    #[inline]
    fn table(&self, fingerprint: u64) -> Option<&PolicyTable> {
        // Most stores hold a handful of policies: comparing them beats a search.
        if self.tables.len() <= 4 {
            return self.tables.iter().find(|t| t.fingerprint == fingerprint);
        }
        self.table_index(fingerprint).map(|i| &self.tables[i])
    }

    fn table_mut(&mut self, policy: &Policy) -> &mut PolicyTable {
        let fingerprint = policy.fingerprint();
        let i = match self
            .tables
            .binary_search_by_key(&fingerprint, |t| t.fingerprint)
        {
            Ok(i) => i,
            Err(i) => {
                self.tables.insert(i, PolicyTable::new(policy));
                i
            }
        };
        &mut self.tables[i]
    }

    /// Decides a known key under the shared lock, or says the exclusive lock is needed.
    #[inline(always)]
    pub(super) fn try_shared(
        &self,
        policy: &Policy,
        hash: u64,
        now: Timestamp,
        cost: u32,
        limits: Limits,
    ) -> Shared {
        let Some(table) = self.table(policy.fingerprint()) else {
            return Shared::Exclusive;
        };
        by_algorithm!(policy.quota(), alg => {
            match table.try_packed(alg, hash, now, cost) {
                Some(verdict) => Shared::Decided(verdict),
                None => Shared::Exclusive,
            }
        }, alg => {
            let Some(entry) = table.logs.get(hash) else {
                return Shared::Exclusive;
            };
            let (verdict, delta) = log::lock(entry).step(alg, now, cost, true);
            add_bytes(&self.log_bytes, delta);
            if delta > 0 && self.log_bytes() > limits.log_bytes {
                Shared::DecidedOverBudget(verdict)
            } else {
                Shared::Decided(verdict)
            }
        })
    }

    /// Decides under the exclusive lock; in [`Mode::Commit`], consumes when admitted and says
    /// how to undo it.
    pub(super) fn step(
        &mut self,
        policy: &Policy,
        hash: u64,
        now: Timestamp,
        cost: u32,
        mode: Mode,
        limits: Limits,
    ) -> (Verdict, Undo) {
        by_algorithm!(policy.quota(),
            alg => self.step_packed(alg, policy, hash, now, cost, mode, limits),
            alg => self.step_log(alg, policy, hash, now, cost, mode, limits))
    }

    #[allow(clippy::too_many_arguments)]
    fn step_packed<A: Packed>(
        &mut self,
        alg: &A,
        policy: &Policy,
        hash: u64,
        now: Timestamp,
        cost: u32,
        mode: Mode,
        limits: Limits,
    ) -> (Verdict, Undo) {
        let before = self
            .table(policy.fingerprint())
            .and_then(|t| t.load(alg, hash));
        let mut state = before.clone().unwrap_or_default();
        let verdict = alg.evaluate(&mut state, now, cost);
        if mode == Mode::Evaluate || !verdict.allowed || cost == 0 {
            return (verdict, Undo::Nothing);
        }
        alg.commit(&mut state, now, cost);
        if before.is_none() {
            self.make_room(now, limits);
            self.len += 1;
        }
        self.table_mut(policy).save(alg, hash, &state);
        (verdict, Undo::Packed(before.map(|s| alg.widen(&s))))
    }

    #[allow(clippy::too_many_arguments)]
    fn step_log(
        &mut self,
        alg: &SlidingWindowLog,
        policy: &Policy,
        hash: u64,
        now: Timestamp,
        cost: u32,
        mode: Mode,
        limits: Limits,
    ) -> (Verdict, Undo) {
        let commit = mode == Mode::Commit;
        let known = self
            .table_index(policy.fingerprint())
            .and_then(|i| self.tables[i].logs.get_mut(hash));
        let (verdict, delta) = if let Some(entry) = known {
            entry.step(alg, now, cost, commit)
        } else {
            let mut entry = CompactLog::default();
            let (verdict, _) = entry.step(alg, now, cost, commit);
            if !(commit && verdict.allowed && cost > 0) {
                return (verdict, Undo::Nothing);
            }
            self.make_room(now, limits);
            self.len += 1;
            let bytes = entry.bytes() as isize;
            self.table_mut(policy).logs.insert(hash, entry);
            (verdict, bytes)
        };
        add_bytes(&self.log_bytes, delta);
        if delta > 0 {
            self.trim_logs(now, limits, hash);
        }
        let consumed = commit && verdict.allowed && cost > 0;
        (verdict, if consumed { Undo::Log } else { Undo::Nothing })
    }

    /// Takes back a tentative commit of a batch.
    pub(super) fn undo(
        &mut self,
        policy: &Policy,
        hash: u64,
        now: Timestamp,
        cost: u32,
        undo: &Undo,
    ) {
        match undo {
            Undo::Nothing => {}
            Undo::Packed(Some(slot)) => by_algorithm!(policy.quota(),
                alg => self.table_mut(policy).save(alg, hash, &alg.narrow(*slot)),
                _log => {}),
            Undo::Packed(None) => {
                if self.table_mut(policy).remove(hash) {
                    self.len -= 1;
                }
            }
            Undo::Log => self.refund(policy, hash, now, cost),
        }
    }

    /// Gives back `cost` consumed earlier by `hash` (see [`Algorithm::refund`]).
    pub(super) fn refund(&mut self, policy: &Policy, hash: u64, now: Timestamp, cost: u32) {
        by_algorithm!(policy.quota(), alg => {
            let Some(mut state) = self.table(policy.fingerprint()).and_then(|t| t.load(alg, hash)) else {
                return;
            };
            alg.refund(&mut state, now, cost);
            self.table_mut(policy).save(alg, hash, &state);
        }, alg => {
            if let Some(log) = self.table_mut(policy).logs.get_mut(hash) {
                alg.refund_log(log, now, cost);
                log.tidy();
            }
        });
    }

    /// Makes room for one more key: sweeps expired entries when the shard has doubled since the
    /// last sweep or is full, then evicts the entries with the least at stake if still full.
    fn make_room(&mut self, now: Timestamp, limits: Limits) {
        let cap = limits.keys;
        if self.len < self.sweep_at && self.len < cap {
            return;
        }
        self.sweep(now.as_micros());
        if self.len >= cap {
            let count = cap.div_ceil(16).max(self.len + 1 - cap);
            self.evict(now, count, None);
        }
        self.sweep_at = (self.len * 2).clamp(MIN_SWEEP.min(cap), cap);
    }

    /// Drops entries whose quota has fully reset; returns how many.
    pub(super) fn sweep(&mut self, now: u64) -> usize {
        let before = self.len;
        for table in &mut self.tables {
            table.sweep(now);
        }
        self.tables.retain(|t| t.len() > 0);
        self.recount();
        before - self.len
    }

    fn recount(&mut self) {
        self.len = self.tables.iter().map(PolicyTable::len).sum();
        let bytes = self.tables.iter_mut().map(|t| t.logs.bytes()).sum();
        *self.log_bytes.get_mut() = bytes;
    }

    /// Drops `count` entries, the least at stake first, never `keep`.
    fn evict(&mut self, now: Timestamp, count: usize, keep: Option<u64>) {
        let mut ranked = Vec::with_capacity(self.len);
        for (index, table) in self.tables.iter_mut().enumerate() {
            table.ranked(now, index, &mut ranked);
        }
        ranked.retain(|c| Some(c.hash) != keep);
        let count = count.min(ranked.len());
        if count == 0 {
            return;
        }
        if count < ranked.len() {
            ranked.select_nth_unstable(count - 1);
        }
        for c in &ranked[..count] {
            self.tables[c.index].remove(c.hash);
        }
        self.recount();
    }

    /// Brings the logs back within their byte budget: drops those that have reset, then the
    /// least at stake, but never `keep` (the log that just grew), so a client being denied keeps
    /// its full log and a new log never evicts itself. It trims to fifteen sixteenths of the
    /// budget, so the next trim is many new logs away (one ranking per request would make a
    /// flood of new keys quadratic).
    pub(super) fn trim_logs(&mut self, now: Timestamp, limits: Limits, keep: u64) {
        if self.log_bytes() <= limits.log_bytes {
            return;
        }
        let target = limits.log_bytes - limits.log_bytes / 16;
        let now_us = now.as_micros();
        for table in &mut self.tables {
            if let Quota::SlidingWindowLog(alg) = &table.quota {
                table
                    .logs
                    .retain(|log| alg.expires_at_log(log).as_micros() > now_us);
            }
        }
        self.recount();
        while self.log_bytes() > target {
            let mut ranked = Vec::new();
            for (index, table) in self.tables.iter_mut().enumerate() {
                if matches!(table.quota, Quota::SlidingWindowLog(_)) {
                    table.ranked(now, index, &mut ranked);
                }
            }
            ranked.retain(|c| c.hash != keep);
            // Evict in rounds of an eighth, so a trim does not rank the logs once per victim.
            let Some(count) = Some(ranked.len().div_ceil(8)).filter(|&n| n > 0) else {
                break;
            };
            ranked.sort_unstable();
            let mut excess = self.log_bytes() - target;
            for c in ranked.iter().take(count) {
                let table = &mut self.tables[c.index];
                if let Some(log) = table.logs.remove(c.hash) {
                    excess = excess.saturating_sub(log.bytes());
                }
                if excess == 0 {
                    break;
                }
            }
            self.recount();
        }
    }
}
