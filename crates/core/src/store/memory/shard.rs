//! One shard of the memory store: a table per policy for its slice of the key space, and the
//! two ways in. [`Shard::try_shared`] runs under the shared lock and decides a known key by
//! compare-and-swap (a sliding log or a concurrency key's permits under the key's own mutex).
//! [`Shard::step`] runs under the exclusive lock and does everything else: new keys, spilled
//! states, batches, refunds, releases, sweeps and eviction.
//!
//! Tables are per policy so that a packed word needs no room for what the policy already
//! knows (the window, the refill interval), and a sweep can still tell when each state expires.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::key_hash::Hashed;
use super::log::{self, CompactLog};
use super::packing::{Packed, Slot};
use crate::algorithm::{Algorithm, SlidingWindowLog};
use crate::{Decision, Policy, Quota, Timestamp, Verdict};

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

/// Dispatches on a quota's algorithm: `$packed` for the four packed ones, `$log` for the log,
/// `$permits` for concurrency.
macro_rules! by_algorithm {
    ($quota:expr, $alg:ident => $packed:expr, $log:ident => $logged:expr,
     $conc:ident => $permits:expr) => {
        match $quota {
            Quota::FixedWindow($alg) => $packed,
            Quota::SlidingWindowCounter($alg) => $packed,
            Quota::TokenBucket($alg) => $packed,
            Quota::LeakyBucket($alg) => $packed,
            Quota::SlidingWindowLog($log) => $logged,
            Quota::Concurrency($conc) => $permits,
        }
    };
}

mod evict;
mod ghosts;
mod permits;
mod persist;
mod policy_table;

use ghosts::Ghosts;
pub(super) use persist::Restored;
use policy_table::{PolicyTable, Room};

#[derive(Debug, Default)]
pub(super) struct Shard {
    /// Sorted by fingerprint.
    tables: Vec<PolicyTable>,
    /// Keys tracked, over all tables. Atomic because a new key may be added under the shared
    /// lock (see [`Room`]).
    len: AtomicUsize,
    /// Sweep expired entries once the shard holds this many.
    sweep_at: usize,
    /// The keys held after the last sweep.
    swept_len: usize,
    /// The keys the recent sweeps dropped.
    ghosts: Ghosts,
    /// New keys added under the shared lock since the last sweep that were among `ghosts`.
    returns: AtomicUsize,
    /// Bytes held by the sliding logs; they grow under the shared lock.
    log_bytes: AtomicUsize,
    /// The lockout records of the policies with a ban (`bans.rs`).
    pub(super) bans: super::bans::BanTable,
}

/// What the shared-lock attempt came to.
pub(super) enum Shared {
    Decided(Decision),
    /// Decided, and the logs are over their budget: trim them under the exclusive lock.
    DecidedOverBudget(Decision),
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
    /// Give `permit` back, or put back its expiry `before` when it was renewed (0: it was not
    /// held).
    Permit {
        permit: u64,
        before: u64,
    },
}

fn add_bytes(counter: &AtomicUsize, delta: isize) {
    if delta > 0 {
        counter.fetch_add(delta.unsigned_abs(), Ordering::Relaxed);
    } else if delta < 0 {
        counter.fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
    }
}

impl Shard {
    pub(super) fn new(limits: Limits) -> Self {
        Shard {
            sweep_at: MIN_SWEEP.min(limits.keys),
            ..Shard::default()
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// The count, for a caller that holds the shard exclusively.
    fn len_mut(&mut self) -> &mut usize {
        self.len.get_mut()
    }

    /// Adds its tables' layouts to `layout`.
    #[cfg(test)]
    pub(super) fn layout(&self, layout: &mut super::table::Layout) {
        for table in &self.tables {
            table.layout(layout);
        }
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
            Ok(i) => {
                self.tables[i].follow(policy);
                i
            }
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
        key: Hashed,
        now: Timestamp,
        cost: u32,
        permit: u64,
        limits: &Limits,
    ) -> Shared {
        let hash = key.value;
        let Some(table) = self.table(policy.fingerprint()) else {
            return Shared::Exclusive;
        };
        // A new key may be added here while make_room would have nothing to do.
        let room = || Room {
            len: &self.len,
            limit: self.sweep_at.min(limits.keys),
            ghosts: &self.ghosts,
            returns: &self.returns,
        };
        by_algorithm!(policy.quota(), alg => {
            match table.try_packed(alg, key, now, cost, room) {
                Some(verdict) => Shared::Decided(verdict.into_decision(policy.shared_name())),
                None => Shared::Exclusive,
            }
        }, alg => {
            let Some(entry) = table.logs.get(hash) else {
                return Shared::Exclusive;
            };
            let (verdict, delta) = log::lock(entry).step(alg, now, cost, true);
            add_bytes(&self.log_bytes, delta);
            let decision = verdict.into_decision(policy.shared_name());
            if delta > 0 && self.log_bytes() > limits.log_bytes {
                Shared::DecidedOverBudget(decision)
            } else {
                Shared::Decided(decision)
            }
        }, alg => {
            match table.permits.get(&hash) {
                Some(state) => Shared::Decided(
                    alg.check(&mut policy_table::lock(state), now, cost, permit)
                        .into_decision(policy.shared_name()),
                ),
                None => Shared::Exclusive,
            }
        })
    }

    /// Decides under the exclusive lock; in [`Mode::Commit`], consumes when admitted and says
    /// how to undo it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn step(
        &mut self,
        policy: &Policy,
        hash: u64,
        now: Timestamp,
        cost: u32,
        permit: u64,
        mode: Mode,
        limits: Limits,
    ) -> (Verdict, Undo) {
        by_algorithm!(policy.quota(),
            alg => self.step_packed(alg, policy, hash, now, cost, mode, limits),
            alg => self.step_log(alg, policy, hash, now, cost, mode, limits),
            alg => self.step_permits(alg, policy, hash, now, cost, permit, mode, limits))
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
            *self.len_mut() += 1;
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
            *self.len_mut() += 1;
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
                _log => {},
                _permits => {}),
            Undo::Packed(None) => {
                if self.table_mut(policy).remove(hash) {
                    *self.len_mut() -= 1;
                }
            }
            Undo::Log => self.refund(policy, hash, now, cost, 0),
            Undo::Permit { permit, before } => self.undo_permit(policy, hash, *permit, *before),
        }
    }

    /// Charges `cost` to `hash` whatever the quota says (see [`Algorithm::charge`]); the
    /// verdict is what the key has left afterwards, as a peek reports it.
    pub(super) fn charge(
        &mut self,
        policy: &Policy,
        hash: u64,
        now: Timestamp,
        cost: u32,
        limits: Limits,
    ) -> Verdict {
        by_algorithm!(policy.quota(), alg => {
            let before = self.table(policy.fingerprint()).and_then(|t| t.load(alg, hash));
            let known = before.is_some();
            let mut state = before.unwrap_or_default();
            alg.charge(&mut state, now, cost);
            if cost > 0 {
                if !known {
                    self.make_room(now, limits);
                    *self.len_mut() += 1;
                }
                self.table_mut(policy).save(alg, hash, &state);
            }
            Verdict::charged(alg.evaluate(&mut state, now, 0))
        }, alg => {
            if self.table_index(policy.fingerprint())
                .and_then(|i| self.tables[i].logs.get_mut(hash))
                .is_none()
            {
                if cost == 0 {
                    return Verdict::charged(CompactLog::default().step(alg, now, 0, false).0);
                }
                self.make_room(now, limits);
                *self.len_mut() += 1;
                let entry = CompactLog::default();
                add_bytes(&self.log_bytes, entry.bytes() as isize);
                self.table_mut(policy).logs.insert(hash, entry);
            }
            let Some(entry) = self.table_mut(policy).logs.get_mut(hash) else {
                return Verdict::charged(CompactLog::default().step(alg, now, 0, false).0);
            };
            let (verdict, delta) = entry.charge(alg, now, cost);
            let verdict = Verdict::charged(verdict);
            add_bytes(&self.log_bytes, delta);
            if delta > 0 {
                self.trim_logs(now, limits, hash);
            }
            verdict
        }, alg => Verdict::charged(self.peek_permits(alg, policy, hash, now)))
    }

    /// Gives back `cost` consumed earlier by `hash` (see [`Algorithm::refund`]); a concurrency
    /// key's `permit`.
    pub(super) fn refund(
        &mut self,
        policy: &Policy,
        hash: u64,
        now: Timestamp,
        cost: u32,
        permit: u64,
    ) {
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
        }, alg => {
            self.release(alg, policy, hash, now, permit);
        });
    }
}
