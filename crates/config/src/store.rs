//! `[store]` as validated: which store keeps the counters and, for Redis, the client
//! settings it describes (servers, timeout, clock, key secret, TLS).

use std::time::Duration;

use crate::{OnError, Secret};

/// Which store keeps the counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreKind {
    /// In this process.
    Memory,
    /// Redis or Redis Cluster.
    Redis,
}

/// Whose clock a Redis store uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreClock {
    /// Redis's `TIME`.
    Redis,
    /// This process's clock.
    Local,
}

/// `[store]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// `kind`.
    pub kind: StoreKind,
    /// `url` (Redis).
    pub url: Option<String>,
    /// `cluster`.
    pub cluster: bool,
    /// `nodes`: cluster seed nodes.
    pub nodes: Vec<String>,
    /// `timeout` (default 50ms).
    pub timeout: Duration,
    /// `on_error` (default allow).
    pub on_error: OnError,
    /// `clock` (default redis).
    pub clock: StoreClock,
    /// `max_keys` for the memory store.
    pub max_keys: Option<usize>,
    /// `key_secret_env`: the secret (read from that environment variable) under which API keys
    /// and other credentials are hashed before they become store keys. Every instance sharing a
    /// Redis must use the same one. Unset: a random secret per process with the memory store
    /// (its keys never leave the process), the public built-in one with Redis (with a warning).
    pub key_secret: Option<Secret>,
    /// `path`: where the memory store keeps its state across restarts (memory only); `None`
    /// keeps nothing.
    pub path: Option<std::path::PathBuf>,
    /// `snapshot_every` (default 10s): how often the state is written to `path` while running.
    pub snapshot_every: Duration,
    /// `tls_ca`: the CA certificates (PEM, read when the configuration is) that `rediss://`
    /// servers are checked against, in place of the system's.
    pub tls_ca: Option<Vec<u8>>,
}

impl StoreConfig {
    /// The Redis client settings `[store]` describes. Here rather than in the server's store
    /// module so that validating `[store]` (which asks the Redis client whether it accepts
    /// them) does not make the configuration depend on the module that depends on it.
    pub fn redis_config(&self) -> tollgate_redis::RedisConfig {
        use tollgate_redis::{ClockSource, RedisConfig};
        let mut rc = if !self.nodes.is_empty() {
            RedisConfig::cluster(&self.nodes)
        } else {
            let url = self.url.as_deref().unwrap_or("redis://127.0.0.1:6379");
            if self.cluster {
                RedisConfig::cluster(&[url])
            } else {
                RedisConfig::standalone(url)
            }
        };
        rc.timeout = self.timeout;
        rc.on_error = self.on_error;
        rc.clock = match self.clock {
            StoreClock::Redis => ClockSource::Redis,
            StoreClock::Local => ClockSource::Local,
        };
        if let Some(secret) = &self.key_secret {
            rc.key_secret = secret.expose().to_vec();
        }
        rc.tls_root_cert_pem = self.tls_ca.clone();
        rc
    }
}
