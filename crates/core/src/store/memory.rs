//! The in-process store: the embedded default.
//!
//! # Layout
//!
//! Keys are spread over shards by a keyed 64-bit SipHash of their bytes; each shard holds a
//! table per policy. A key is identified by that hash alone: fixed size, no allocation for keys
//! of any length, and, because the hash key is random per store, no way for a client to craft
//! keys that collide with another client's or crowd one slot of a table. (Two of a million keys
//! of one policy share state with probability about 3·10⁻⁸.) SipHash stays, rather than a faster
//! unkeyed or weakly keyed hash, because keys are chosen by clients and the hash *is* the key.
//!
//! The counter and bucket algorithms pack their state into one 64-bit word next to the hash
//! (`packing`), in an open-addressing table that is at most four-fifths full and grows by half
//! (`table`): 16 bytes an entry, 20 to 30 bytes a tracked key at any size
//! (`benches/memory_per_key.rs` measures it). The rare state that does not fit a word (a window
//! under 100 ms, a sliding count over 65,535, a time before 2024) keeps a 16-byte slot beside
//! the table. The sliding log keeps a 64-byte record per key in a table of its own, with up to
//! its entries bit-packed in it while they fit (12 for a one-second window, 9 for a minute, 8
//! for an hour, fewer when costs are not 1) and longer logs on the heap (`log`), within a byte
//! budget. A concurrency key keeps its permits, a sorted vector of at most `limit` of them
//! (16 bytes each), in a map beside them.
//!
//! # Concurrency
//!
//! Each shard is behind a lock of its own kind (`shard_lock`): a reader takes its thread's slot
//! of the shard with one compare-and-swap and gives it back with a plain store, so threads never
//! write to a shared cache line just to read, and a read costs one locked instruction rather
//! than a reader-writer lock's two. A known key is decided under that shared lock, by
//! compare-and-swap on its word, as `governor` does; a sliding log and a
//! concurrency key's permits under their own mutex. A new counter or bucket key is added under
//! it too, by claiming an empty slot with compare-and-swap, unless the shard is due a sweep or
//! its table must grow. Only those, another new key, a spilled state, a batch of several checks
//! (all-or-nothing), a refund, a release or a sweep take the shard exclusively.
//!
//! # Eviction
//!
//! An entry whose quota has fully reset is equivalent to no entry. Shards drop such entries when
//! they have doubled in size since the last sweep, before they grow, unless a quarter or more of
//! the keys added since were keys that recent sweeps dropped (a per-second quota over many
//! clients: each key resets between its requests and comes back); then the shard keeps them and
//! grows, rather than adding them again and again. Which keys were dropped is kept as a bit set
//! of one to two bytes per key of the shard's share of `max_keys`, from its first sweep. When a
//! shard is at its share of `max_keys`, it drops expired entries and, if that is not enough, the
//! sixteenth of its entries with the least at stake: the smallest share of their quota in use
//! (what eviction would hand back to them), then the earliest to expire, so a flood of new keys
//! evicts other one-request keys long before it evicts a client that is being denied. The
//! sliding logs are also held to a byte budget ([`MemoryStoreBuilder::max_log_bytes`]) the same
//! way.

use std::future::Future;
use std::sync::Arc;

use super::{Check, Store};
use crate::{Decision, Decisions, Policy, StoreError, Timestamp, Verdict};

mod bans;
mod batch;
mod builder;
mod immediate;
mod key_hash;
mod log;
mod packing;
mod quota_codec;
mod shard;
mod shard_lock;
mod snapshot;
mod table;

pub use builder::MemoryStoreBuilder;
pub use snapshot::{RestoreCounts, STORE_FORMAT, SnapshotCounts};

use immediate::{ApplyOne, Immediate};
pub(crate) use key_hash::Words;
use key_hash::{Hashed, KeyHasher};
use shard::{Limits, Mode, Shard, Shared};
use shard_lock::{Lock, ShardLocks};

/// The default bound on tracked keys.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// The default bound on the bytes the sliding logs hold, over the whole store.
pub const DEFAULT_MAX_LOG_BYTES: usize = 64 << 20;

/// The in-process store. Cheap to clone: clones share the same state.
#[derive(Clone, Debug)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shards: ShardLocks<Shard>,
    shard_mask: u64,
    /// Each shard's share of the bounds.
    limits: Limits,
    /// Keys the hash of a key: random per store (or a snapshot's).
    hasher: KeyHasher,
    /// The hasher's key and how it hashes eight-byte keys, which a snapshot keeps.
    hash_key: (u64, u64),
    words: Words,
}

impl MemoryStore {
    /// The bound on tracked keys in force: the builder's, rounded down to a multiple of the
    /// shard count (see [`MemoryStoreBuilder::max_keys`]).
    pub fn max_keys(&self) -> usize {
        self.inner.limits.keys * self.inner.shards.len()
    }

    /// How many keys are tracked now (expired ones included until a sweep drops them).
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| s.read().len()).sum()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held by sliding-log entries now (see [`MemoryStoreBuilder::max_log_bytes`]).
    pub fn log_bytes(&self) -> usize {
        self.inner.shards.iter().map(|s| s.read().log_bytes()).sum()
    }

    /// Drops every key whose quota has fully reset by `now`; returns how many. Servers call it
    /// now and then so an idle store shrinks; the store also sweeps by itself as it grows.
    /// Records of bans and denial streaks are dropped too once they mean nothing.
    pub fn purge_expired(&self, now: Timestamp) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| s.write().sweep(now.as_micros()))
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
    ///
    /// A known key is decided under the shard's shared lock, by compare-and-swap; anything else
    /// out of line. The decision is built before the lock is released, where the caller
    /// receives it, rather than carried past the release (which cost copies of it).
    #[inline(always)]
    pub fn apply_one_now(&self, now: Timestamp, check: &Check<'_>) -> Decision {
        if let Some(rule) = check.policy.ban() {
            return self.apply_one_banning(now, check, rule);
        }
        self.apply_one_unbanned(now, *check)
    }

    /// [`apply_one_now`](Self::apply_one_now) for a policy without a ban.
    #[inline(always)]
    fn apply_one_unbanned(&self, now: Timestamp, check: Check<'_>) -> Decision {
        // By value, and the cold path below given the fields it needs: a `&Check` anywhere on
        // this path kept a copy of the check in memory on every call (callgrind: 4-5
        // instructions a check).
        let Check {
            policy,
            key,
            cost,
            permit,
        } = check;
        let hashed = self.hashed(key);
        let hash = hashed.value;
        let lock = self.shard(hash);
        let limits = &self.inner.limits;
        let shard = lock.read();
        match shard.try_shared(policy, hashed, now, cost, permit, limits) {
            Shared::Decided(decision) => decision,
            Shared::DecidedOverBudget(decision) => {
                drop(shard);
                trim_logs(lock, now, *limits, hash);
                decision
            }
            Shared::Exclusive => {
                drop(shard);
                decide_exclusive(lock, now, policy, cost, permit, hash, *limits)
                    .into_decision(policy.shared_name())
            }
        }
    }

    /// Charges each check's cost whatever the quota says (see [`Store::charge`]).
    pub fn charge_now(&self, now: Timestamp, checks: &[Check<'_>]) -> Decisions {
        let limits = self.inner.limits;
        checks
            .iter()
            .map(|check| {
                let hash = self.hash(check.key);
                self.shard(hash)
                    .write()
                    .charge(check.policy, hash, now, check.cost, limits)
                    .into_decision(check.policy.shared_name())
            })
            .collect()
    }

    /// Gives back the cost of admitted checks (see [`Store::refund`]); a concurrency check's
    /// permit.
    pub fn refund_now(&self, now: Timestamp, checks: &[Check<'_>]) {
        for check in checks {
            let hash = self.hash(check.key);
            self.shard(hash)
                .write()
                .refund(check.policy, hash, now, check.cost, check.permit);
        }
    }

    /// Gives back the concurrency checks' permits; how many were still held (see
    /// [`Store::release`]).
    pub fn release_now(&self, now: Timestamp, checks: &[Check<'_>]) -> u32 {
        let mut held = 0;
        for check in checks {
            if let crate::Quota::Concurrency(_) = check.policy.quota() {
                let hash = self.hash(check.key);
                let released =
                    self.shard(hash)
                        .write()
                        .release_permit(check.policy, hash, now, check.permit);
                held += u32::from(released);
            }
        }
        held
    }

    /// The key's identity: SipHash-1-3 of its bytes under this store's random key
    /// (`key_hash`). The policy is not hashed in: each policy has its own tables.
    #[inline(always)]
    fn hash(&self, key: &[u8]) -> u64 {
        table::identity(self.inner.hasher.hash(key))
    }

    /// [`hash`](Self::hash), and whether this thread hashed the same key last.
    #[inline(always)]
    fn hashed(&self, key: &[u8]) -> Hashed {
        let hashed = self.inner.hasher.hashed(key);
        Hashed {
            value: table::identity(hashed.value),
            ..hashed
        }
    }

    /// Every table's layout, summed (see [`table::Layout`]).
    #[cfg(test)]
    fn layout(&self) -> table::Layout {
        let mut layout = table::Layout::default();
        for shard in self.inner.shards.iter() {
            shard.read().layout(&mut layout);
        }
        layout
    }

    /// The low bits pick the shard; the tables place keys by their high bits.
    #[inline]
    fn shard_index(&self, hash: u64) -> usize {
        (hash & self.inner.shard_mask) as usize
    }

    #[inline]
    fn shard(&self, hash: u64) -> Lock<'_, Shard> {
        self.inner.shards.lock(self.shard_index(hash))
    }
}

impl Store for MemoryStore {
    fn apply(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
    ) -> impl Future<Output = Result<Decisions, StoreError>> + Send {
        Immediate(Some(move || Ok(self.apply_now(now, checks))))
    }

    fn apply_one(
        &self,
        now: Timestamp,
        check: Check<'_>,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        ApplyOne {
            store: self,
            now,
            check: Some(check),
        }
    }

    /// Every check of a policy without a ban; those with one take `apply_one`, whose lockout
    /// path is out of line.
    #[inline(always)]
    fn apply_one_immediately(&self, now: Timestamp, check: Check<'_>) -> Option<Decision> {
        match check.policy.ban() {
            None => Some(self.apply_one_unbanned(now, check)),
            Some(_) => None,
        }
    }

    fn charge(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
    ) -> impl Future<Output = Result<Decisions, StoreError>> + Send {
        Immediate(Some(move || Ok(self.charge_now(now, checks))))
    }

    fn refund(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        Immediate(Some(move || {
            self.refund_now(now, checks);
            Ok(())
        }))
    }

    fn release(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
    ) -> impl Future<Output = Result<u32, StoreError>> + Send {
        Immediate(Some(move || Ok(self.release_now(now, checks))))
    }

    fn bans(
        &self,
        now: Timestamp,
    ) -> impl Future<Output = Result<Vec<crate::BanRecord>, StoreError>> + Send {
        Immediate(Some(move || Ok(self.bans_now(now))))
    }

    fn lift_ban(
        &self,
        now: Timestamp,
        policy: &str,
        key: &[u8],
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        Immediate(Some(move || Ok(self.lift_ban_now(now, policy, key))))
    }

    /// Every operation runs under a shard lock and never waits for anything else.
    fn is_immediate(&self) -> bool {
        true
    }
}

/// What the shared lock could not decide: a new key, a spilled or spilling state.
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn decide_exclusive(
    lock: Lock<'_, Shard>,
    now: Timestamp,
    policy: &Policy,
    cost: u32,
    permit: u64,
    hash: u64,
    limits: Limits,
) -> Verdict {
    lock.write()
        .step(policy, hash, now, cost, permit, Mode::Commit, limits)
        .0
}

/// Brings the shard's logs back within their budget, keeping `hash`'s.
#[cold]
#[inline(never)]
fn trim_logs(lock: Lock<'_, Shard>, now: Timestamp, limits: Limits, hash: u64) {
    lock.write().trim_logs(now, limits, hash);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Policy, Quota, QuotaError};
    use std::time::Duration;

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

    #[test]
    fn immediately_answers_policies_without_a_ban() -> Result<(), QuotaError> {
        let store = MemoryStore::new();
        let quota = Quota::fixed_window(1, Duration::from_secs(60))?;
        let plain = Policy::new("plain", quota.clone())?;
        let banning = Policy::new("banning", quota)?.with_ban(crate::Ban::new(
            1,
            Duration::from_secs(60),
            Duration::from_secs(600),
        )?)?;
        let now = Timestamp::from_secs(100);
        let first = store.apply_one_immediately(now, Check::new(&plain, b"k", 1));
        assert!(
            first.is_some_and(|d| d.allowed && d.remaining == 0),
            "{first:?}"
        );
        let second = store.apply_one_immediately(now, Check::new(&plain, b"k", 1));
        assert!(second.is_some_and(|d| !d.allowed), "{second:?}");
        // A policy with a ban goes through apply_one, where its lockout is counted.
        let check = Check::new(&banning, b"k", 1);
        assert_eq!(store.apply_one_immediately(now, check), None);
        assert!(store.apply_one_now(now, &check).allowed);
        let denied = store.apply_one_now(now, &check);
        assert_eq!(denied.ban, crate::BanStatus::Started, "{denied:?}");
        Ok(())
    }
}
