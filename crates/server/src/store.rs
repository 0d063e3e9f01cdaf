//! The store the server runs on, chosen by `[store] kind`: one type over every backend so the
//! limiter type does not change with the configuration.

use tollgate::store::Check;
use tollgate::{Decision, Decisions, MemoryStore, Store, StoreError, Timestamp};
use tollgate_redis::{LeaseStats, RedisStore, RedisStoreStats};

use crate::config::{StoreConfig, StoreKind};

/// A store of any kind the configuration can name.
#[derive(Clone)]
pub enum AnyStore {
    /// In this process.
    Memory(MemoryStore),
    /// Redis or Redis Cluster, shared by every instance.
    Redis(RedisStore),
}

impl std::fmt::Debug for AnyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AnyStore::Memory(m) => f.debug_tuple("Memory").field(m).finish(),
            AnyStore::Redis(r) => f.debug_tuple("Redis").field(r.config()).finish(),
        }
    }
}

/// Why the store could not be created.
#[derive(Debug, thiserror::Error)]
pub enum StoreSetupError {
    /// The Redis settings were refused.
    #[error("[store]: {0}")]
    Redis(String),
}

pub use tollgate_config::{key_hash_secret, memory_store};

impl AnyStore {
    /// The store `[store]` describes. Redis being down is no error: it starts in its
    /// `on_error` mode and connects when Redis answers.
    pub async fn from_config(config: &StoreConfig) -> Result<AnyStore, StoreSetupError> {
        match config.kind {
            StoreKind::Memory => Ok(AnyStore::Memory(memory_store(config))),
            StoreKind::Redis => RedisStore::new(config.redis_config())
                .await
                .map(AnyStore::Redis)
                .map_err(|e| StoreSetupError::Redis(e.to_string())),
        }
    }

    /// Whether the store answers (always, for memory).
    pub async fn ready(&self) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(_) => Ok(()),
            AnyStore::Redis(r) => r.ping().await,
        }
    }

    /// How many keys the store holds state for, when it can tell cheaply.
    pub fn keys_tracked(&self) -> Option<usize> {
        match self {
            AnyStore::Memory(m) => Some(m.len()),
            AnyStore::Redis(_) => None,
        }
    }

    /// The Redis store's counters (calls, fallbacks, deny-cache hits, errors).
    pub fn redis_stats(&self) -> Option<RedisStoreStats> {
        match self {
            AnyStore::Memory(_) => None,
            AnyStore::Redis(r) => Some(r.stats()),
        }
    }

    /// How many bans are in force, by policy (sorted): for metrics. `None` when the store
    /// could not say.
    pub async fn ban_counts(&self) -> Option<Vec<(String, u64)>> {
        use tollgate::Clock as _;
        let now = tollgate::SystemClock::new().now();
        let mut counts: Vec<(String, u64)> = match self {
            AnyStore::Memory(m) => {
                let mut by: std::collections::HashMap<String, u64> = Default::default();
                for b in m.bans_now(now) {
                    *by.entry(b.policy).or_insert(0) += 1;
                }
                by.into_iter().collect()
            }
            AnyStore::Redis(r) => r.ban_counts(now).await.ok()?.into_iter().collect(),
        };
        counts.sort();
        Some(counts)
    }

    /// What each policy's hot-key leases did (Redis; none for memory).
    pub fn lease_stats(&self) -> Vec<LeaseStats> {
        match self {
            AnyStore::Memory(_) => Vec::new(),
            AnyStore::Redis(r) => r.lease_stats(),
        }
    }

    /// Gives the unspent units of this instance's hot-key leases back to Redis (policies with
    /// `lease`), so a stopping instance does not hold quota back from the others until its
    /// leases end. Nothing to do for memory.
    pub async fn return_leases(&self, now: Timestamp) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(_) => Ok(()),
            AnyStore::Redis(r) => r.return_leases(now).await,
        }
    }

    /// Drops state whose quota has fully reset (memory); Redis keys expire by TTL.
    pub fn purge(&self, now: Timestamp) {
        match self {
            AnyStore::Memory(m) => {
                m.purge_expired(now);
            }
            AnyStore::Redis(_) => {}
        }
    }
}

impl Store for AnyStore {
    async fn apply(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<Decisions, StoreError> {
        match self {
            AnyStore::Memory(m) => m.apply(now, checks).await,
            AnyStore::Redis(r) => r.apply(now, checks).await,
        }
    }

    async fn apply_one(&self, now: Timestamp, check: Check<'_>) -> Result<Decision, StoreError> {
        // Each store's own single-check path (the memory store's skips the batch machinery).
        match self {
            AnyStore::Memory(m) => m.apply_one(now, check).await,
            AnyStore::Redis(r) => r.apply_one(now, check).await,
        }
    }

    #[inline(always)]
    fn apply_one_immediately(&self, now: Timestamp, check: Check<'_>) -> Option<Decision> {
        match self {
            AnyStore::Memory(m) => m.apply_one_immediately(now, check),
            AnyStore::Redis(_) => None,
        }
    }

    async fn charge(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<Decisions, StoreError> {
        match self {
            AnyStore::Memory(m) => m.charge(now, checks).await,
            AnyStore::Redis(r) => r.charge(now, checks).await,
        }
    }

    async fn refund(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(m) => m.refund(now, checks).await,
            AnyStore::Redis(r) => r.refund(now, checks).await,
        }
    }

    async fn release(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<u32, StoreError> {
        match self {
            AnyStore::Memory(m) => m.release(now, checks).await,
            AnyStore::Redis(r) => r.release(now, checks).await,
        }
    }

    async fn bans(&self, now: Timestamp) -> Result<Vec<tollgate::BanRecord>, StoreError> {
        match self {
            AnyStore::Memory(m) => m.bans(now).await,
            AnyStore::Redis(r) => r.bans(now).await,
        }
    }

    async fn lift_ban(&self, now: Timestamp, policy: &str, key: &[u8]) -> Result<bool, StoreError> {
        match self {
            AnyStore::Memory(m) => m.lift_ban(now, policy, key).await,
            AnyStore::Redis(r) => r.lift_ban(now, policy, key).await,
        }
    }

    fn is_immediate(&self) -> bool {
        match self {
            AnyStore::Memory(m) => m.is_immediate(),
            AnyStore::Redis(r) => r.is_immediate(),
        }
    }
}
