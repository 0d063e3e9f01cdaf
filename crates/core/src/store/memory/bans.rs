//! The memory store's lockout records ([`Ban`]): a table per shard, beside the policies' tables
//! and under the same lock, keyed by the key's hash and holding one record per policy name.
//!
//! A check of a policy without a ban never looks here. One with a ban reads its record under the
//! shard's shared lock (a lookup in an empty map while nobody is denied): a banned key is
//! refused there, its refusal counted in an atomic (a peek's is not). A denial by the quota is
//! counted under the exclusive lock, which every denial that may start a ban takes; admissions
//! stay on the shared path.
//!
//! Bounded like the keys: at most the shard's share of `max_keys` records. Past it, records
//! that have expired go first, then streaks that have not banned anyone; when every record left
//! is a ban in force, a new denial is not counted.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use smallvec::SmallVec;

use super::batch::guard_for;
use super::key_hash::KeyMap;
use super::shard::{Limits, Mode, Shard, Shared};
use super::shard_lock::WriteGuard;
use super::{MemoryStore, trim_logs};
use crate::store::snapshot::{Cursor, Put, SnapshotError, corrupt};
use crate::{Ban, BanRecord, BanState, Check, Decision, Decisions, Timestamp, Verdict};

#[derive(Debug)]
struct Record {
    policy: &'static str,
    key: Box<[u8]>,
    /// The rule it was last counted under: a sweep needs it to tell when the record expires.
    rule: Ban,
    streak_start: u64,
    since: u64,
    until: u64,
    /// Counted under the shared lock while banned.
    denials: AtomicU32,
}

impl Record {
    fn state(&self) -> BanState {
        BanState {
            streak_start: self.streak_start,
            denials: self.denials.load(Ordering::Relaxed),
            since: self.since,
            until: self.until,
        }
    }

    fn set(&mut self, s: BanState) {
        self.streak_start = s.streak_start;
        *self.denials.get_mut() = s.denials;
        self.since = s.since;
        self.until = s.until;
    }
}

/// What counting a denial came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Counted {
    /// Counted in the streak; no ban.
    Streak,
    /// It started a ban that lasts until then (µs).
    Started(u64),
    /// The key was banned already (by a request decided meanwhile): refused until then.
    Banned(u64),
}

/// One shard's records.
#[derive(Debug, Default)]
pub(super) struct BanTable {
    records: KeyMap<SmallVec<[Record; 1]>>,
    len: usize,
}

impl BanTable {
    fn find(&self, policy: &str, hash: u64) -> Option<&Record> {
        self.records.get(&hash)?.iter().find(|r| r.policy == policy)
    }

    /// When `policy` bans `hash` at `now`, its end. The refusal of a check of `cost` is counted
    /// in the ban's denials, except a peek's (cost 0): a peek is refused but is no denial, so a
    /// dashboard that peeks does not inflate them.
    #[inline]
    pub(super) fn refuse(&self, policy: &str, hash: u64, now: u64, cost: u32) -> Option<u64> {
        if self.records.is_empty() {
            return None;
        }
        let record = self.find(policy, hash)?;
        if now >= record.until {
            return None;
        }
        if cost > 0 {
            record.denials.fetch_add(1, Ordering::Relaxed);
        }
        Some(record.until)
    }

    /// Counts a denial of `key` (hashed `hash`) by `policy`'s quota at `now` under `rule`.
    /// `None` when the table is full of bans in force and the denial was not counted.
    pub(super) fn deny(
        &mut self,
        rule: &Ban,
        policy: &'static str,
        key: &[u8],
        hash: u64,
        now: u64,
        cap: usize,
    ) -> Option<Counted> {
        let known = self
            .records
            .get(&hash)
            .is_some_and(|list| list.iter().any(|r| r.policy == policy));
        if !known {
            if self.len >= cap {
                self.make_room(now, cap);
                if self.len >= cap {
                    return None;
                }
            }
            self.records.entry(hash).or_default().push(Record {
                policy,
                key: key.into(),
                rule: *rule,
                streak_start: 0,
                since: 0,
                until: 0,
                denials: AtomicU32::new(0),
            });
            self.len += 1;
        }
        let record = self
            .records
            .get_mut(&hash)?
            .iter_mut()
            .find(|r| r.policy == policy)?;
        record.rule = *rule;
        let mut state = record.state();
        if rule.is_banned(&state, now) {
            rule.refuse(&mut state);
            record.set(state);
            return Some(Counted::Banned(state.until));
        }
        let started = rule.deny(&mut state, now);
        record.set(state);
        Some(if started {
            Counted::Started(state.until)
        } else {
            Counted::Streak
        })
    }

    /// Forgets `policy`'s record of `hash`; whether it banned at `now`.
    pub(super) fn lift(&mut self, policy: &str, hash: u64, now: u64) -> bool {
        let Some(list) = self.records.get_mut(&hash) else {
            return false;
        };
        let Some(i) = list.iter().position(|r| r.policy == policy) else {
            return false;
        };
        let banned = now < list[i].until;
        list.remove(i);
        self.len -= 1;
        if list.is_empty() {
            self.records.remove(&hash);
        }
        banned
    }

    /// Appends the bans in force at `now`.
    pub(super) fn list(&self, now: u64, out: &mut Vec<BanRecord>) {
        for r in self.records.values().flatten() {
            if now < r.until {
                out.push(BanRecord {
                    policy: r.policy.to_owned(),
                    key: r.key.to_vec(),
                    since: Timestamp::from_micros(r.since),
                    until: Timestamp::from_micros(r.until),
                    denials: r.denials.load(Ordering::Relaxed),
                });
            }
        }
    }

    /// Drops the records that mean nothing at `now`.
    pub(super) fn sweep(&mut self, now: u64) {
        self.retain(|r| now < r.rule.expires_at(&r.state()));
    }

    fn retain(&mut self, mut keep: impl FnMut(&Record) -> bool) {
        if self.records.is_empty() {
            return;
        }
        self.records.retain(|_, list| {
            list.retain(|r| keep(r));
            !list.is_empty()
        });
        self.len = self.records.values().map(SmallVec::len).sum();
    }

    /// At the bound: expired records go, then streaks that banned nobody now.
    fn make_room(&mut self, now: u64, cap: usize) {
        self.sweep(now);
        if self.len >= cap {
            self.retain(|r| now < r.until);
        }
    }
}

impl MemoryStore {
    /// [`apply_one_now`](MemoryStore::apply_one_now) for a policy with a ban: refused while
    /// banned; admitted on the shared path; a denial counted under the exclusive lock.
    #[cold]
    #[inline(never)]
    pub(super) fn apply_one_banning(
        &self,
        now: Timestamp,
        check: &Check<'_>,
        rule: &Ban,
    ) -> Decision {
        let name = check.policy.shared_name();
        let limit = u64::from(check.policy.quota().limit());
        let now_us = now.as_micros();
        let hashed = self.hashed(check.key);
        let hash = hashed.value;
        let lock = self.shard(hash);
        let limits = self.inner.limits;
        let decided = {
            let shard = lock.read();
            if let Some(until) = shard.bans.refuse(name, hash, now_us, check.cost) {
                return Ban::banned_decision(name, limit, now_us, until);
            }
            match shard.try_shared(check.policy, hashed, now, check.cost, check.permit, &limits) {
                Shared::Decided(d) => Some(d),
                Shared::DecidedOverBudget(d) => {
                    drop(shard);
                    trim_logs(lock, now, limits, hash);
                    Some(d)
                }
                Shared::Exclusive => None,
            }
        };
        if let Some(d) = decided
            && (d.allowed || check.cost == 0)
        {
            return d;
        }
        let mut shard = lock.write();
        let denied = match decided {
            Some(d) => d,
            None => {
                if let Some(until) = shard.bans.refuse(name, hash, now_us, check.cost) {
                    return Ban::banned_decision(name, limit, now_us, until);
                }
                let (v, _) = shard.step(
                    check.policy,
                    hash,
                    now,
                    check.cost,
                    check.permit,
                    Mode::Commit,
                    limits,
                );
                if v.allowed || check.cost == 0 {
                    return v.into_decision(name);
                }
                v.into_decision(name)
            }
        };
        let counted = shard
            .bans
            .deny(rule, name, check.key, hash, now_us, limits.keys);
        counted_decision(denied, counted, limit, now_us)
    }

    /// The bans in force at `now` (see [`Store::bans`](crate::Store::bans)).
    pub fn bans_now(&self, now: Timestamp) -> Vec<BanRecord> {
        let mut out = Vec::new();
        for shard in self.inner.shards.iter() {
            shard.read().bans.list(now.as_micros(), &mut out);
        }
        out
    }

    /// Lifts a ban (see [`Store::lift_ban`](crate::Store::lift_ban)).
    pub fn lift_ban_now(&self, now: Timestamp, policy: &str, key: &[u8]) -> bool {
        let hash = self.hash(key);
        self.shard(hash)
            .write()
            .bans
            .lift(policy, hash, now.as_micros())
    }
}

/// The decision of a check its quota denied, once the denial was counted.
fn counted_decision(
    decision: Decision,
    counted: Option<Counted>,
    limit: u64,
    now: u64,
) -> Decision {
    match counted {
        Some(Counted::Started(until)) => Ban::started(decision, now, until),
        Some(Counted::Banned(until)) => Ban::banned_decision(decision.policy, limit, now, until),
        Some(Counted::Streak) | None => decision,
    }
}

/// A batch's checks of policies with a ban, under the batch's exclusive locks: whether each
/// is banned before anything is decided (`None`: not banned, or no ban).
pub(super) fn banned_before(
    guards: &mut [(usize, WriteGuard<'_, Shard>)],
    store: &MemoryStore,
    checks: &[Check<'_>],
    hashes: &[u64],
    now: u64,
) -> SmallVec<[Option<u64>; 4]> {
    checks
        .iter()
        .zip(hashes)
        .map(|(check, &hash)| {
            check.policy.ban()?;
            guard_for(guards, store.shard_index(hash)).bans.refuse(
                check.policy.name(),
                hash,
                now,
                check.cost,
            )
        })
        .collect()
}

/// The batch's decisions, with the bans: a banned check's refusal, and each denial by a
/// policy with a ban counted (and answered as the ban it may start).
#[allow(clippy::too_many_arguments)]
pub(super) fn settle_bans(
    guards: &mut [(usize, WriteGuard<'_, Shard>)],
    store: &MemoryStore,
    checks: &[Check<'_>],
    hashes: &[u64],
    verdicts: SmallVec<[Verdict; 4]>,
    banned: &[Option<u64>],
    now: u64,
    limits: Limits,
) -> Decisions {
    checks
        .iter()
        .zip(hashes)
        .zip(verdicts)
        .zip(banned)
        .map(|(((check, &hash), v), banned)| {
            let name = check.policy.shared_name();
            let decision = v.into_decision(name);
            let Some(rule) = check.policy.ban() else {
                return decision;
            };
            let limit = u64::from(check.policy.quota().limit());
            if let Some(until) = banned {
                return Ban::banned_decision(name, limit, now, *until);
            }
            if decision.allowed || check.cost == 0 {
                return decision;
            }
            let counted = guard_for(guards, store.shard_index(hash)).bans.deny(
                rule,
                name,
                check.key,
                hash,
                now,
                limits.keys,
            );
            counted_decision(decision, counted, limit, now)
        })
        .collect()
}

/// A ban record as a snapshot keeps it: `hash | policy | key | after | within µs | for µs |
/// streak start | denials | since | until`, the policy and key as length-prefixed bytes.
impl BanTable {
    /// Appends the records that still mean something at `now` to `out`; how many.
    pub(super) fn export(&self, now: u64, out: &mut Vec<u8>) -> u64 {
        let mut n = 0;
        for (&hash, list) in &self.records {
            for r in list {
                let state = r.state();
                if now >= r.rule.expires_at(&state) {
                    continue;
                }
                out.put_u64(hash);
                out.put_bytes(r.policy.as_bytes());
                out.put_bytes(&r.key);
                out.put_u32(r.rule.after());
                out.put_u64(r.rule.within_micros());
                out.put_u64(r.rule.duration_micros());
                out.put_u64(state.streak_start);
                out.put_u32(state.denials);
                out.put_u64(state.since);
                out.put_u64(state.until);
                n += 1;
            }
        }
        n
    }
}

/// One record read back from a snapshot.
pub(super) struct RestoredBan {
    pub(super) hash: u64,
    pub(super) policy: String,
    record: Record,
}

impl RestoredBan {
    /// The next record of `c`; `None` for one that means nothing at `now`.
    pub(super) fn read(c: &mut Cursor<'_>, now: u64) -> Result<Option<Self>, SnapshotError> {
        let hash = c.u64()?;
        let policy = std::str::from_utf8(c.bytes()?)
            .map_err(|_| corrupt("a ban's policy name is not UTF-8"))?
            .to_owned();
        let key = c.bytes()?.into();
        let (after, within, duration) = (c.u32()?, c.u64()?, c.u64()?);
        let rule = Ban::new(
            after,
            Duration::from_micros(within),
            Duration::from_micros(duration),
        )
        .map_err(|e| corrupt(format!("a ban's rule: {e}")))?;
        let state = BanState {
            streak_start: c.u64()?,
            denials: c.u32()?,
            since: c.u64()?,
            until: c.u64()?,
        };
        if now >= rule.expires_at(&state) {
            return Ok(None);
        }
        let mut record = Record {
            policy: "",
            key,
            rule,
            streak_start: 0,
            since: 0,
            until: 0,
            denials: AtomicU32::new(0),
        };
        record.set(state);
        Ok(Some(RestoredBan {
            hash,
            policy,
            record,
        }))
    }
}

impl BanTable {
    /// Adds a restored record under `policy` (the store's interned name), unless the table
    /// holds one for it already or is full.
    pub(super) fn restore(&mut self, ban: RestoredBan, policy: &'static str, cap: usize) -> bool {
        let list = self.records.entry(ban.hash).or_default();
        if self.len >= cap || list.iter().any(|r| r.policy == policy) {
            if list.is_empty() {
                self.records.remove(&ban.hash);
            }
            return false;
        }
        list.push(Record {
            policy,
            ..ban.record
        });
        self.len += 1;
        true
    }
}
