//! Several checks decided at once, all-or-nothing (a request under several policies).

use smallvec::SmallVec;

use super::shard::{Mode, Shard, Undo};
use super::shard_lock::WriteGuard;
use super::{MemoryStore, bans};
use crate::{Check, Decisions, Timestamp, Verdict};

impl MemoryStore {
    /// Several checks at once: lock every shard involved exclusively, in index order (so two
    /// batches never deadlock), decide and tentatively commit each, and undo the commits if any
    /// check denies.
    pub(super) fn apply_batch(&self, now: Timestamp, checks: &[Check<'_>]) -> Decisions {
        let hashes: SmallVec<[u64; 4]> = checks.iter().map(|c| self.hash(c.key)).collect();
        let mut indexes: SmallVec<[usize; 4]> =
            hashes.iter().map(|&h| self.shard_index(h)).collect();
        indexes.sort_unstable();
        indexes.dedup();
        let mut guards: SmallVec<[(usize, WriteGuard<'_, Shard>); 4]> = indexes
            .iter()
            .map(|&i| (i, self.inner.shards.write(i)))
            .collect();
        let limits = self.inner.limits;
        let mut verdicts: SmallVec<[Verdict; 4]> = SmallVec::new();
        let mut undo: SmallVec<[Undo; 4]> = SmallVec::new();
        let banned = if checks.iter().any(|c| c.policy.ban().is_some()) {
            bans::banned_before(&mut guards, self, checks, &hashes, now.as_micros())
        } else {
            SmallVec::new()
        };
        // A banned check refuses the request: nothing is committed.
        let mut all_allowed = !banned.iter().any(Option::is_some);
        for (i, (check, &hash)) in checks.iter().zip(&hashes).enumerate() {
            if let Some(Some(_)) = banned.get(i) {
                // Refused by its ban, its quota untouched.
                verdicts.push(Verdict::denied_for_good(u64::from(
                    check.policy.quota().limit(),
                )));
                undo.push(Undo::Nothing);
                all_allowed = false;
                continue;
            }
            let shard = guard_for(&mut guards, self.shard_index(hash));
            let mode = if all_allowed {
                Mode::Commit
            } else {
                Mode::Evaluate
            };
            let (verdict, step_undo) = shard.step(
                check.policy,
                hash,
                now,
                check.cost,
                check.permit,
                mode,
                limits,
            );
            all_allowed &= verdict.allowed;
            verdicts.push(verdict);
            undo.push(step_undo);
        }
        if !all_allowed {
            for ((check, &hash), step_undo) in checks.iter().zip(&hashes).zip(&undo).rev() {
                guard_for(&mut guards, self.shard_index(hash)).undo(
                    check.policy,
                    hash,
                    now,
                    check.cost,
                    step_undo,
                );
            }
            // Nothing was consumed: report each admitting policy's quota as it stands.
            for ((check, &hash), verdict) in checks.iter().zip(&hashes).zip(verdicts.iter_mut()) {
                if verdict.allowed {
                    let shard = guard_for(&mut guards, self.shard_index(hash));
                    *verdict = shard
                        .step(check.policy, hash, now, 0, 0, Mode::Evaluate, limits)
                        .0;
                }
            }
        }
        if !banned.is_empty() {
            let now = now.as_micros();
            return bans::settle_bans(
                &mut guards,
                self,
                checks,
                &hashes,
                verdicts,
                &banned,
                now,
                limits,
            );
        }
        drop(guards);
        checks
            .iter()
            .zip(verdicts)
            .map(|(check, v)| v.into_decision(check.policy.shared_name()))
            .collect()
    }
}

/// The shard at `index` among a batch's exclusive locks, sorted by index.
pub(super) fn guard_for<'g, 's>(
    guards: &'g mut [(usize, WriteGuard<'s, Shard>)],
    index: usize,
) -> &'g mut Shard {
    let position = guards.partition_point(|(i, _)| *i < index);
    &mut guards[position].1
}
