//! A shard's concurrency keys under the exclusive lock: new keys, batches and their undo,
//! releases, and the peeks a charge answers with. A known key's plain decision runs under the
//! shared lock instead ([`Shard::try_shared`]), under the key's own mutex.
//!
//! A key whose permits have all come back is removed at once when it is released, so the shard's
//! count of keys follows the requests in flight; one whose permits expired is swept as any
//! state whose quota has reset.

use std::sync::Mutex;

use super::policy_table::get_mut;
use super::{Limits, Mode, Shard, Undo};
use crate::algorithm::{Concurrency, ConcurrencyState};
use crate::{Policy, Quota, Timestamp, Verdict};

impl Shard {
    /// [`Shard::step`] for a concurrency key.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn step_permits(
        &mut self,
        alg: &Concurrency,
        policy: &Policy,
        hash: u64,
        now: Timestamp,
        cost: u32,
        permit: u64,
        mode: Mode,
        limits: Limits,
    ) -> (Verdict, Undo) {
        let commit = mode == Mode::Commit;
        let known = self
            .table_index(policy.fingerprint())
            .and_then(|i| self.tables[i].permits.get_mut(&hash));
        if let Some(state) = known {
            let state = get_mut(state);
            let verdict = alg.evaluate(state, now, cost, permit);
            if !(commit && verdict.allowed && cost > 0) {
                return (verdict, Undo::Nothing);
            }
            let before = state.occupancy(permit).own;
            alg.commit(state, now, cost, permit);
            return (verdict, Undo::Permit { permit, before });
        }
        let mut state = ConcurrencyState::default();
        let verdict = alg.evaluate(&mut state, now, cost, permit);
        // An admitted cost above 0 names a permit (permit 0 is denied for good).
        if !(commit && verdict.allowed && cost > 0) {
            return (verdict, Undo::Nothing);
        }
        alg.commit(&mut state, now, cost, permit);
        self.make_room(now, limits);
        *self.len_mut() += 1;
        self.table_mut(policy)
            .permits
            .insert(hash, Mutex::new(state));
        (verdict, Undo::Permit { permit, before: 0 })
    }

    /// Takes back a batch's tentative permit: gives it back, or puts back the expiry it had
    /// before it was renewed.
    pub(super) fn undo_permit(&mut self, policy: &Policy, hash: u64, permit: u64, before: u64) {
        let Quota::Concurrency(alg) = policy.quota() else {
            return;
        };
        let Some(i) = self.table_index(policy.fingerprint()) else {
            return;
        };
        let table = &mut self.tables[i];
        let Some(state) = table.permits.get_mut(&hash) else {
            return;
        };
        let state = get_mut(state);
        if before == 0 {
            state.remove(permit);
        } else {
            state.take(permit, before, alg.limit() as usize);
        }
        if state.permits.is_empty() {
            table.permits.remove(&hash);
            *self.len_mut() -= 1;
        }
    }

    /// What a concurrency key has free at `now`, taking nothing.
    pub(super) fn peek_permits(
        &mut self,
        alg: &Concurrency,
        policy: &Policy,
        hash: u64,
        now: Timestamp,
    ) -> Verdict {
        let known = self
            .table_index(policy.fingerprint())
            .and_then(|i| self.tables[i].permits.get_mut(&hash));
        match known {
            Some(state) => alg.evaluate(get_mut(state), now, 0, 0),
            None => alg.evaluate(&mut ConcurrencyState::default(), now, 0, 0),
        }
    }

    /// Gives `permit` of `hash` back; whether it was still held. Checks of other algorithms
    /// hold no permit.
    pub(in crate::store::memory) fn release_permit(
        &mut self,
        policy: &Policy,
        hash: u64,
        now: Timestamp,
        permit: u64,
    ) -> bool {
        match policy.quota() {
            Quota::Concurrency(alg) => self.release(alg, policy, hash, now, permit),
            _ => false,
        }
    }

    /// [`Concurrency::release`] on the key's permits; a key left with none is dropped.
    pub(super) fn release(
        &mut self,
        alg: &Concurrency,
        policy: &Policy,
        hash: u64,
        now: Timestamp,
        permit: u64,
    ) -> bool {
        let Some(i) = self.table_index(policy.fingerprint()) else {
            return false;
        };
        let table = &mut self.tables[i];
        let Some(state) = table.permits.get_mut(&hash) else {
            return false;
        };
        let state = get_mut(state);
        let held = alg.release(state, now, permit);
        if state.permits.is_empty() {
            table.permits.remove(&hash);
            *self.len_mut() -= 1;
        }
        held
    }
}
