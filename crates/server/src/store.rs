//! The store the server runs on, chosen by `[store] kind`: one type over every backend so the
//! limiter type does not change with the configuration.

use tollgate::store::Check;
use tollgate::{Decisions, MemoryStore, Store, StoreError, Timestamp};

use crate::config::{StoreConfig, StoreKind};

/// A store of any kind the configuration can name.
#[derive(Clone, Debug)]
pub enum AnyStore {
    /// In this process.
    Memory(MemoryStore),
}

/// Why the store could not be created.
#[derive(Debug, thiserror::Error)]
pub enum StoreSetupError {
    /// This build has no Redis support.
    #[error(
        "[store] kind = \"redis\" is not available in this build (tollgate-redis is not linked yet); use kind = \"memory\""
    )]
    RedisUnavailable,
}

impl AnyStore {
    /// The store `[store]` describes.
    pub fn from_config(config: &StoreConfig) -> Result<AnyStore, StoreSetupError> {
        match config.kind {
            StoreKind::Memory => {
                let mut b = MemoryStore::builder();
                if let Some(n) = config.max_keys {
                    b = b.max_keys(n);
                }
                Ok(AnyStore::Memory(b.build()))
            }
            StoreKind::Redis => Err(StoreSetupError::RedisUnavailable),
        }
    }

    /// Whether the store answers (always, for memory).
    pub async fn ready(&self) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(_) => Ok(()),
        }
    }

    /// How many keys the store holds state for, when it can tell cheaply.
    pub fn keys_tracked(&self) -> Option<usize> {
        match self {
            AnyStore::Memory(m) => Some(m.len()),
        }
    }

    /// Drops state whose quota has fully reset (memory); a no-op for stores with TTLs.
    pub fn purge(&self, now: Timestamp) {
        match self {
            AnyStore::Memory(m) => {
                m.purge_expired(now);
            }
        }
    }
}

impl Store for AnyStore {
    async fn apply(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<Decisions, StoreError> {
        match self {
            AnyStore::Memory(m) => m.apply(now, checks).await,
        }
    }

    async fn refund(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(m) => m.refund(now, checks).await,
        }
    }
}
