//! [`RedisStore`]: the [`Store`] whose state lives in Redis, so every instance of a deployment
//! shares one count per (policy, key).
//!
//! One request is one script call (EVALSHA of the small script of its policy's algorithm, or of
//! the multi-check script when it is checked against several policies), except in a Cluster
//! when the request's keys land in different slots: see
//! [`RedisStore`]'s "Cluster" section. Failures (Redis down, slow, or answering nonsense) follow
//! [`OnError`]; a circuit keeps a failed Redis from costing every call its timeout.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::{RedisError, Value};
use tollgate::{Check, Decisions, MemoryStore, StoreError, Timestamp};
#[cfg(doc)]
use tollgate::{OnError, Store};

use crate::config::{ClockSource, ConfigError, RedisConfig};
use crate::deny_cache::{CacheKey, DenyCache};
use crate::keys::{KeyDigest, key_and_slot, key_name};
use crate::lease::{LeaseStats, Leases};
use crate::script::{ScriptKind, Scripts};

/// The Lua that moves a registry's version on (the overrides', a list's), given the last one in
/// `last`: Redis's clock in µs, or `last + 1` when that is not past it, as `v`. A version moves
/// on with every change, and after Redis lost its data (a restart without persistence, a flush)
/// the first change still takes it past every version an instance saw, which an instance
/// would otherwise take for an older read and ignore. A literal, for `concat!`.
macro_rules! next_version {
    () => {
        "local t = redis.call('TIME')
local v = t[1] * 1000000 + t[2]
if v <= last then v = last + 1 end
"
    };
}

mod bans;
mod calls;
mod coalesce;
mod connection;
mod decide;
mod failure;
mod leased;
mod lists;
mod overrides;
mod release;

use connection::Connection;
pub(crate) use connection::classify;
pub use lists::ListChange;

/// How long a failed Redis is left alone before one call tries it again.
const PROBE_INTERVAL: Duration = Duration::from_millis(100);

/// A store in Redis, standalone or Cluster. Cheap to clone: clones share connections, the deny
/// cache and the fallback store.
///
/// # Semantics
///
/// Decisions equal the pure algorithms' of `tollgate::algorithm`: a script decides what to
/// write in Redis and reports the state it read, and those algorithms compute the verdict from
/// it (a script that disagrees with them is a [`StoreError::Protocol`]). With [`ClockSource::Redis`] (the default) the script
/// reads Redis `TIME`, so the caller's `now` is ignored and instances whose clocks disagree
/// still decide as one; [`ClockSource::Local`] uses the caller's `now`. Every key written gets
/// a TTL of one full reset in the same script, so no key outlives its meaning even if a client
/// dies mid-way.
///
/// # Cluster
///
/// Keys are `<prefix>:{<hmac of the client key>}:<policy fingerprint>`: every policy of one
/// client key shares a slot, so the usual request (several policies, one key) is one atomic
/// script. A request whose checks key on *different* values may span slots, and one script
/// cannot touch several slots. Then the store runs one script per slot in order and, if a later
/// slot denies, refunds what the earlier ones committed (the one exception to "a denied request consumes from no policy"): meanwhile another
/// request may see those earlier quotas briefly consumed, so it can be denied where a
/// single-slot store would have admitted it. It never over-admits.
///
/// # Cost per algorithm
///
/// The counters and buckets keep one short string per key and cost O(1) per request. The
/// sliding window log keeps a sorted set of up to `limit` members, one per admitted unit, and
/// costs O((1 + cost) log n) per request; about 41 bytes per unit up to 128 units, 118 beyond
/// (`docs/redis.md`). A charge ([`Store::charge`](tollgate::Store::charge), never refused)
/// adds at most `limit + 1` members whatever its cost, the units past them counted in its top
/// member's name: every script call's work is bounded by the quota, never by a caller's cost.
/// A concurrency key is a sorted set of the permits held (at most `limit`), each scored by its
/// expiry; the key's TTL is its newest permit's, so the permits of an instance that died come
/// back when their `lease_ttl` passes. O(log n) per request and per release.
///
/// # Hot-key leases
///
/// A single check of a policy with a [`Lease`](tollgate::Lease) is spent from this instance's
/// lease of its key; taking the next lease is the only call to Redis. `docs/redis.md` states the
/// bound on what N instances over-admit together (none for the window algorithms) and proves
/// it. Call [`RedisStore::return_leases`] when the instance stops.
///
/// # Failures
///
/// Each call is bounded by `timeout`. When Redis is unreachable or too slow a circuit opens:
/// calls skip Redis except one probe call every 100 ms, and the first probe that succeeds
/// closes it, so the store returns to Redis by itself. Meanwhile, and for a script error or a
/// reply of the wrong shape ([`StoreError::Protocol`]), `on_error` applies: with
/// [`OnError::Local`] an in-process store decides (each instance on its own); otherwise the
/// call returns the error, and the caller's failure rule (the same [`OnError`]) decides what to
/// answer. [`RedisStore::stats`] counts both (`fallbacks`, `errors`) and
/// [`RedisStore::is_ready`] turns false meanwhile. A failed [`Store::refund`] is returned as an
/// error (refunds are best effort: the quota comes back when its window passes anyway), and so
/// is a failed [`Store::release`] but with [`OnError::Local`], which then answers what the local
/// store gave back (the permit in Redis comes back when its `lease_ttl` passes).
///
/// # Deny cache
///
/// A denied single check is answered from this process's memory until its `retry_after`
/// (`deny_cache_size`), except a concurrency check's: any instance's release frees a permit at
/// once, so its denials always go to Redis.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("config", &self.inner.config)
            .field("ready", &self.is_ready())
            .field("stats", &self.stats())
            .finish()
    }
}

struct Inner {
    config: RedisConfig,
    connection: Connection,
    hasher: KeyDigest,
    scripts: Scripts,
    memory: MemoryStore,
    deny: DenyCache,
    leases: Leases,
    epoch: Instant,
    /// 0 while Redis is healthy; else the monotonic µs (since `epoch`) of the next probe.
    probe_at: AtomicU64,
    stats: Counters,
}

#[derive(Default)]
struct Counters {
    script_calls: AtomicU64,
    fallbacks: AtomicU64,
    deny_cache_hits: AtomicU64,
    errors: AtomicU64,
}

/// What the store has done since it was built: for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RedisStoreStats {
    /// Script calls sent to Redis (EVALSHA, plus EVAL after a NOSCRIPT).
    pub script_calls: u64,
    /// Calls Redis did not decide: answered by the local store (`on_error = "local"`) or
    /// returned as errors.
    pub fallbacks: u64,
    /// Requests answered by the deny cache without calling Redis.
    pub deny_cache_hits: u64,
    /// Requests admitted from a hot-key lease this instance held, without calling Redis.
    pub leased: u64,
    /// Failed calls to Redis (unreachable, timeout, protocol).
    pub errors: u64,
    /// Batches in which a standalone store handed its script calls to the connection, which
    /// writes each batch at once (0 for a Cluster): `script_calls / batches` calls share a
    /// write on average.
    pub batches: u64,
}

/// One check ready for a script: its Redis key, slot and deny-cache key.
pub(crate) struct Prepared {
    key: String,
    slot: u16,
    cache: CacheKey,
    /// The key's lockout record, when the check's policy bans.
    ban_key: Option<String>,
}

/// An error while building a [`RedisStore`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The Redis client refused the settings.
    #[error("cannot create a Redis client for {url}: {reason}")]
    Client {
        /// The URL (password redacted).
        url: String,
        /// Why.
        reason: String,
    },
}

impl RedisStore {
    /// Validates `config` and builds the store. Redis being unreachable is not an error: the
    /// store starts in its failure mode and connects when Redis answers (see
    /// [`is_ready`](Self::is_ready)). Call it inside a Tokio runtime.
    pub async fn new(config: RedisConfig) -> Result<Self, BuildError> {
        config.validate()?;
        let client_error = |e: RedisError| BuildError::Client {
            url: config
                .nodes
                .iter()
                .map(|n| crate::config::redact(n))
                .collect::<Vec<_>>()
                .join(","),
            reason: e.to_string(),
        };
        #[cfg(feature = "tls")]
        {
            // rustls needs a process-wide crypto provider; ring is the one this crate enables.
            // If the application installed one already, that one stays.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let connect_timeout = config.timeout.max(Duration::from_millis(250));
        let connection = Connection::new(&config, connect_timeout).map_err(client_error)?;
        let store = RedisStore {
            inner: Arc::new(Inner {
                hasher: KeyDigest::new(&config.key_secret),
                scripts: Scripts::new(config.clock),
                memory: MemoryStore::new(),
                deny: DenyCache::new(config.deny_cache_size),
                leases: Leases::new(config.lease_table_size),
                epoch: Instant::now(),
                probe_at: AtomicU64::new(0),
                stats: Counters::default(),
                connection,
                config,
            }),
        };
        // Connect now if Redis is there, so the first request does not pay for it; if it is
        // not, start in the failure mode.
        if store.ping_with(connect_timeout).await.is_err() {
            store.open_circuit();
        }
        Ok(store)
    }

    /// The configuration the store runs with.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// Sends `PING` (bounded by `timeout`); success also closes the circuit. For a Cluster it
    /// also asks a node for `CLUSTER INFO`, within the same bound, and fails unless the
    /// Cluster is serving (`cluster_state:ok`): a Cluster that lost a master without a replica
    /// still answers `PING` on its live nodes while it refuses every script (`CLUSTERDOWN`).
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.ping_with(self.inner.config.timeout).await
    }

    async fn ping_with(&self, limit: Duration) -> Result<(), StoreError> {
        let cluster = self.inner.config.cluster;
        let result = tokio::time::timeout(limit, async {
            let mut conn = self.inner.connection.get().await?;
            let reply: Result<Value, RedisError> = redis::cmd("PING").query_async(&mut conn).await;
            reply.map_err(classify)?;
            if cluster {
                let info: Result<Value, RedisError> = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query_async(&mut conn)
                    .await;
                cluster_serving(&info.map_err(classify)?)?;
            }
            Ok(())
        })
        .await
        .unwrap_or(Err(StoreError::Timeout { after: limit }));
        if result.is_ok() {
            self.inner.probe_at.store(0, Ordering::Relaxed);
        }
        result
    }

    /// Whether decisions currently come from Redis (the last call to Redis succeeded). A
    /// readiness probe (`/readyz`) can report it; [`ping`](Self::ping) checks actively.
    pub fn is_ready(&self) -> bool {
        self.inner.probe_at.load(Ordering::Relaxed) == 0
    }

    /// The `EVALSHA` command (name first) that decides `check` alone, as this store sends it:
    /// for benchmarks (`redis-benchmark`) and debugging. Redis learns the script on the store's
    /// first call of it, or from [`load_scripts`](Self::load_scripts).
    pub fn script_command(&self, check: &Check<'_>) -> Result<Vec<String>, StoreError> {
        crate::script::validate(check)?;
        let key = self.key_of(check);
        let cmd = self.command(
            "EVALSHA",
            ScriptKind::of(check.policy.quota()),
            &[key.as_str()],
            Timestamp::EPOCH,
            |cmd| {
                crate::script::one_check_args(
                    cmd,
                    Timestamp::from_system_time(std::time::SystemTime::now()),
                    check,
                    check.cost,
                    0,
                )
            },
        )?;
        Ok(cmd
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => String::new(),
            })
            .collect())
    }

    /// Loads every script into Redis (standalone; a Cluster node learns them on first use), so
    /// no call pays for an `EVAL` after `NOSCRIPT`.
    pub async fn load_scripts(&self) -> Result<(), StoreError> {
        let mut conn = self.inner.connection.get().await?;
        for kind in ScriptKind::ALL {
            let source = &self.inner.scripts.get(kind).source;
            self.bounded(async {
                let reply: Result<Value, RedisError> = redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(source)
                    .query_async(&mut conn)
                    .await;
                reply.map(|_| ()).map_err(classify)
            })
            .await?;
        }
        Ok(())
    }

    /// Counters since the store was built.
    pub fn stats(&self) -> RedisStoreStats {
        let s = &self.inner.stats;
        RedisStoreStats {
            script_calls: s.script_calls.load(Ordering::Relaxed),
            fallbacks: s.fallbacks.load(Ordering::Relaxed),
            deny_cache_hits: s.deny_cache_hits.load(Ordering::Relaxed),
            leased: self.inner.leases.spends(),
            errors: s.errors.load(Ordering::Relaxed),
            batches: self.inner.connection.batches(),
        }
    }

    /// What each policy's hot-key leases did on this instance (policies with a lease, from
    /// their first leased request), by policy name: for metrics.
    pub fn lease_stats(&self) -> Vec<LeaseStats> {
        self.inner.leases.stats()
    }

    /// The Redis key that holds `check`'s state (for operators and tests; the client key
    /// appears only as its keyed hash).
    pub fn key_of(&self, check: &Check<'_>) -> String {
        key_name(
            &self.inner.config.key_prefix,
            &self.inner.hasher.digest(check.key),
            check.policy.fingerprint(),
        )
    }

    /// Decides `checks` in Redis only: no deny cache, no circuit, no `on_error`; a failure is
    /// returned as it is. [`Store::apply`] is this plus those.
    pub async fn apply_redis(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
    ) -> Result<Decisions, StoreError> {
        let prepared = self.prepare(checks)?;
        let verdicts = self
            .within_timeout(self.run(now, checks, &prepared))
            .await?;
        self.index_bans(&prepared, &verdicts).await;
        Ok(decide::decisions(checks, verdicts))
    }

    fn prepare(&self, checks: &[Check<'_>]) -> Result<Vec<Prepared>, StoreError> {
        let (prefix, cluster) = (&self.inner.config.key_prefix, self.inner.config.cluster);
        if let [check] = checks {
            crate::script::validate(check)?;
            let mac = self.inner.hasher.digest(check.key);
            let fingerprint = check.policy.fingerprint();
            let (key, slot) = key_and_slot(prefix, &mac, fingerprint, cluster);
            return Ok(vec![Prepared {
                key,
                slot,
                cache: (fingerprint, u128::from_be_bytes(mac)),
                ban_key: ban_key_of(prefix, &mac, check),
            }]);
        }
        // Policies of one request usually share the key: hash each distinct key once.
        let mut seen: Vec<(&[u8], [u8; 16])> = Vec::with_capacity(1);
        let mut out = Vec::with_capacity(checks.len());
        for check in checks {
            crate::script::validate(check)?;
            let mac = match seen.iter().find(|(k, _)| *k == check.key) {
                Some(&(_, mac)) => mac,
                None => {
                    let mac = self.inner.hasher.digest(check.key);
                    seen.push((check.key, mac));
                    mac
                }
            };
            let fingerprint = check.policy.fingerprint();
            let (key, slot) = key_and_slot(prefix, &mac, fingerprint, cluster);
            out.push(Prepared {
                key,
                slot,
                cache: (fingerprint, u128::from_be_bytes(mac)),
                ban_key: ban_key_of(prefix, &mac, check),
            });
        }
        Ok(out)
    }

    /// `fut` within the configured timeout.
    async fn bounded<T>(
        &self,
        fut: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let after = self.inner.config.timeout;
        tokio::time::timeout(after, fut)
            .await
            .unwrap_or(Err(StoreError::Timeout { after }))
    }

    fn mono_micros(&self) -> u64 {
        u64::try_from(self.inner.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// The clock of the deny cache: the caller's with a local clock; otherwise this process's
    /// monotonic clock, since the decision's times are relative to Redis `TIME`.
    fn cache_now(&self, now: Timestamp) -> u64 {
        match self.inner.config.clock {
            ClockSource::Local => now.as_micros(),
            ClockSource::Redis => self.mono_micros(),
        }
    }
}

/// The lockout record's key of a check whose policy bans.
fn ban_key_of(prefix: &str, mac: &[u8], check: &Check<'_>) -> Option<String> {
    check
        .policy
        .ban()
        .map(|_| crate::keys::ban_key(prefix, mac, check.policy.name()))
}

/// Whether a `CLUSTER INFO` reply says the Cluster serves (`cluster_state:ok`); if not, why.
fn cluster_serving(info: &Value) -> Result<(), StoreError> {
    let text = match info {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::VerbatimString { text, .. } => text.clone(),
        Value::SimpleString(text) => text.clone(),
        other => {
            return Err(StoreError::Protocol {
                reason: format!("CLUSTER INFO answered {other:?}"),
            });
        }
    };
    let state = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("cluster_state:"))
        .map(str::trim);
    match state {
        Some("ok") => Ok(()),
        Some(state) => Err(StoreError::Unavailable {
            reason: format!(
                "the Redis Cluster is not serving: CLUSTER INFO says cluster_state:{state}"
            ),
        }),
        None => Err(StoreError::Protocol {
            reason: "CLUSTER INFO has no cluster_state".to_owned(),
        }),
    }
}
