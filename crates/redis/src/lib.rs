//! Redis store for Tollgate: every instance of a deployment shares one count per (policy, key).
//!
//! [`RedisStore`] implements [`tollgate::Store`]: each request is decided in one atomic,
//! all-or-nothing script call in Redis (a small script per algorithm, one for requests checked
//! against several policies; `docs/redis.md` describes them), and the verdict is computed from
//! the state the script read with the pure algorithms themselves. Standalone (`redis://`, `rediss://` with the `tls`
//! feature) or Cluster (seed nodes; MOVED/ASK handled by the client). [`RedisConfig`] sets the
//! timeout, the failure mode ([`OnError`]), whose clock decides ([`ClockSource`]) and how keys
//! are named; client keys are stored only as a keyed hash.
//!
//! ```no_run
//! use tollgate::{Check, Policy, Quota, Store, Timestamp};
//! use tollgate_redis::{RedisConfig, RedisStore};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::new(RedisConfig::standalone("redis://127.0.0.1:6379")).await?;
//! let policy = Policy::new("api", "100/1m".parse().and_then(|r: tollgate::Rate| {
//!     Quota::token_bucket(100, r)
//! })?)?;
//! let decisions = store
//!     .apply(Timestamp::from_system_time(std::time::SystemTime::now()), &[Check::new(&policy, b"customer-42", 1)])
//!     .await?;
//! assert!(decisions.allowed());
//! # Ok(())
//! # }
//! ```

//!
//! # Operating it
//!
//! - Redis 5 or later (tested with 7.0), standalone or Cluster; no modules. Keys are
//!   `<key_prefix>:{<128-bit HMAC-SHA256 of the client key, hex>}:<policy fingerprint, hex>`,
//!   each with a TTL of one full reset, so memory follows the active keys.
//! - Every instance sharing a Redis must use the same `key_secret` and `key_prefix`.
//! - [`RedisStore::is_ready`] / [`RedisStore::ping`] serve a readiness probe;
//!   [`RedisStore::stats`] counts script calls, fallbacks, deny-cache hits and errors.
//! - The tests start their own `redis-server` processes on free loopback ports and fail (never
//!   skip) when it is missing: `apt-get install -y redis-server redis-tools`.

mod config;
#[cfg(feature = "client")]
mod deny_cache;
#[cfg(feature = "client")]
mod keys;
#[cfg(feature = "client")]
mod lease;
#[cfg(feature = "client")]
mod script;
#[cfg(feature = "client")]
mod store;
#[cfg(feature = "client")]
pub mod stream_queue;
#[cfg(feature = "client")]
mod verdict;

pub use config::{
    ClockSource, ConfigError, DEFAULT_KEY_PREFIX, DEFAULT_KEY_SECRET, DEFAULT_TIMEOUT, OnError,
    RedisConfig,
};
#[cfg(feature = "client")]
pub use lease::LeaseStats;
#[cfg(feature = "client")]
pub use script::MAX_DEPTH;
#[cfg(feature = "client")]
pub use store::{BuildError, ListChange, RedisStore, RedisStoreStats};
