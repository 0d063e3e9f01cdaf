//! [`RedisStore`]: the [`Store`] whose state lives in Redis, so every instance of a deployment
//! shares one count per (policy, key).
//!
//! One request is one script call (EVALSHA of `script.lua`, which carries the five algorithms),
//! except in a Cluster when the request's keys land in different slots: see
//! [`RedisStore`]'s "Cluster" section. Failures (Redis down, slow, or answering nonsense) follow
//! [`OnError`]; a circuit keeps a failed Redis from costing every call its timeout.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};
use tollgate::{Check, Decisions, MemoryStore, Quota, Store, StoreError, Timestamp, Verdict};

use crate::config::{ClockSource, ConfigError, OnError, RedisConfig};
use crate::deny_cache::{CacheKey, DenyCache};
use crate::keys::{KeyHasher, hex, key_name, slot};

/// The Lua source of the one script: the five algorithms, applied all-or-nothing.
pub const SCRIPT: &str = include_str!("script.lua");

/// A Lua double is exact below 2^53, and the script adds a leaky bucket's depth to timestamps
/// (about 2^51 µs today): buckets deeper than this (71 years) are refused, not rounded.
pub const MAX_DEPTH: u64 = 1 << 51;

/// How long a failed Redis is left alone before one call tries it again.
const PROBE_INTERVAL: Duration = Duration::from_millis(100);

/// The retry time a denial by `on_error = deny` carries.
const DENY_RETRY: Duration = Duration::from_secs(1);

/// A store in Redis, standalone or Cluster. Cheap to clone: clones share connections, the deny
/// cache and the fallback store.
///
/// # Semantics
///
/// Decisions equal the pure algorithms' of `tollgate::algorithm` (the Lua port does the same
/// integer arithmetic in microseconds). With [`ClockSource::Redis`] (the default) the script
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
/// slot denies, refunds what the earlier ones committed (SPEC §4 exception): meanwhile another
/// request may see those earlier quotas briefly consumed, so it can be denied where a
/// single-slot store would have admitted it. It never over-admits.
///
/// # Cost per algorithm
///
/// The counters and buckets keep one short string per key and cost O(1) per request. The
/// sliding window log keeps a list of up to `limit` entries, reads it whole on each request
/// (O(limit)) and writes only what changed (the expired head, the new tail): fine for small
/// limits, otherwise prefer the sliding window counter.
///
/// # Failures
///
/// Each call is bounded by `timeout`. When Redis is unreachable or too slow, decisions follow
/// `on_error` and a circuit opens: calls skip Redis (deciding by `on_error` at once) except one
/// probe call every 100 ms, and the first probe that succeeds closes it, so the store returns
/// to Redis by itself. A script error or a reply of the wrong shape is a
/// [`StoreError::Protocol`]; it also follows `on_error` (never a silent allow unless that is
/// `allow`) and is reported by [`RedisStore::apply_redis`] and [`RedisStore::stats`].
/// `Decision` has no field saying that `on_error` decided; [`RedisStore::stats`] counts such
/// decisions (`fallbacks`) and [`RedisStore::is_ready`] turns false meanwhile. A failed
/// [`Store::refund`] is returned as an error (refunds are best effort: the quota comes back
/// when its window passes anyway).
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
    hasher: KeyHasher,
    sha: String,
    memory: MemoryStore,
    deny: DenyCache,
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
    /// Requests decided by `on_error` instead of Redis (allow, deny or the local store).
    pub fallbacks: u64,
    /// Requests answered by the deny cache without calling Redis.
    pub deny_cache_hits: u64,
    /// Failed calls to Redis (unreachable, timeout, protocol).
    pub errors: u64,
}

enum Connection {
    /// Reconnects by itself; created lazily, so a Redis that is down at start is no error.
    Single(ConnectionManager),
    Cluster(Box<ClusterState>),
}

struct ClusterState {
    client: ClusterClient,
    /// Connected in the background, so no call waits longer than its timeout for it.
    conn: RwLock<Option<ClusterConnection>>,
    connecting: Arc<AtomicBool>,
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// One check ready for the script: its Redis key, slot, cache key and script arguments.
struct Prepared {
    key: String,
    slot: u16,
    cache: CacheKey,
    args: [i64; 5],
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
        let connection = if config.cluster {
            #[allow(unused_mut)]
            let mut builder = ClusterClientBuilder::new(config.nodes.clone());
            #[cfg(feature = "tls")]
            if let Some(pem) = &config.tls_root_cert_pem {
                builder = builder.certs(tls_certificates(pem));
            }
            let client = builder
                .connection_timeout(connect_timeout)
                .response_timeout(config.timeout.max(Duration::from_millis(10)))
                .retries(2)
                .min_retry_wait(10)
                .max_retry_wait(100)
                .build()
                .map_err(client_error)?;
            Connection::Cluster(Box::new(ClusterState {
                client,
                conn: RwLock::new(None),
                connecting: Arc::new(AtomicBool::new(false)),
            }))
        } else {
            let url = config.nodes[0].as_str();
            let client = match &config.tls_root_cert_pem {
                #[cfg(feature = "tls")]
                Some(pem) => redis::Client::build_with_tls(url, tls_certificates(pem)),
                _ => redis::Client::open(url),
            }
            .map_err(client_error)?;
            let manager_config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                .set_response_timeout(Some(config.timeout))
                .set_number_of_retries(1)
                .set_min_delay(Duration::from_millis(10))
                .set_max_delay(Duration::from_millis(100));
            Connection::Single(
                ConnectionManager::new_lazy_with_config(client, manager_config)
                    .map_err(client_error)?,
            )
        };
        let store = RedisStore {
            inner: Arc::new(Inner {
                hasher: KeyHasher::new(&config.key_secret),
                sha: redis::Script::new(SCRIPT).get_hash().to_owned(),
                memory: MemoryStore::new(),
                deny: DenyCache::new(config.deny_cache_size),
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

    /// Sends `PING` (bounded by `timeout`); success also closes the circuit.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.ping_with(self.inner.config.timeout).await
    }

    async fn ping_with(&self, limit: Duration) -> Result<(), StoreError> {
        let result = tokio::time::timeout(limit, async {
            let mut conn = self.conn().await?;
            let reply: Result<Value, RedisError> = redis::cmd("PING").query_async(&mut conn).await;
            reply.map(|_| ()).map_err(classify)
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

    /// The SHA1 under which Redis knows [`SCRIPT`] (for `EVALSHA` by other tools).
    pub fn script_sha(&self) -> &str {
        &self.inner.sha
    }

    /// Counters since the store was built.
    pub fn stats(&self) -> RedisStoreStats {
        let s = &self.inner.stats;
        RedisStoreStats {
            script_calls: s.script_calls.load(Ordering::Relaxed),
            fallbacks: s.fallbacks.load(Ordering::Relaxed),
            deny_cache_hits: s.deny_cache_hits.load(Ordering::Relaxed),
            errors: s.errors.load(Ordering::Relaxed),
        }
    }

    /// The Redis key that holds `check`'s state (for operators and tests; the client key
    /// appears only as its keyed hash).
    pub fn key_of(&self, check: &Check<'_>) -> String {
        let tag = hex(&self.inner.hasher.mac(check.key));
        key_name(
            &self.inner.config.key_prefix,
            &tag,
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
        let verdicts = self.bounded(self.run(now, &prepared)).await?;
        Ok(decisions(checks, verdicts))
    }

    fn prepare(&self, checks: &[Check<'_>]) -> Result<Vec<Prepared>, StoreError> {
        // Policies of one request usually share the key: hash each distinct key once.
        let mut seen: Vec<(&[u8], u128, String, u16)> = Vec::with_capacity(1);
        let mut out = Vec::with_capacity(checks.len());
        for check in checks {
            let index = match seen.iter().position(|(k, ..)| *k == check.key) {
                Some(i) => i,
                None => {
                    let mac = self.inner.hasher.mac(check.key);
                    let tag = hex(&mac);
                    let slot = slot(&tag);
                    seen.push((check.key, u128::from_be_bytes(mac), tag, slot));
                    seen.len() - 1
                }
            };
            let (_, id, tag, slot) = &seen[index];
            let fingerprint = check.policy.fingerprint();
            out.push(Prepared {
                key: key_name(&self.inner.config.key_prefix, tag, fingerprint),
                slot: *slot,
                cache: (fingerprint, *id),
                args: encode(check)?,
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

    fn clock_arg(&self, now: Timestamp) -> i64 {
        match self.inner.config.clock {
            ClockSource::Redis => -1,
            ClockSource::Local => i64::try_from(now.as_micros()).unwrap_or(i64::MAX),
        }
    }

    /// Runs the checks: one script call, or one per slot in a Cluster (see the type's docs).
    async fn run(&self, now: Timestamp, prepared: &[Prepared]) -> Result<Vec<Verdict>, StoreError> {
        let mut conn = self.conn().await?;
        let first = prepared.first().map(|p| p.slot);
        if !self.inner.config.cluster || prepared.iter().all(|p| Some(p.slot) == first) {
            let all: Vec<&Prepared> = prepared.iter().collect();
            return self.script(&mut conn, "a", now, &all).await;
        }
        // Group by slot, in order of first appearance.
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        for (i, p) in prepared.iter().enumerate() {
            match groups.iter_mut().find(|(s, _)| *s == p.slot) {
                Some((_, members)) => members.push(i),
                None => groups.push((p.slot, vec![i])),
            }
        }
        let mut verdicts: Vec<Option<Verdict>> = vec![None; prepared.len()];
        let mut denied_at = None;
        for (g, (_, members)) in groups.iter().enumerate() {
            let checks: Vec<&Prepared> = members.iter().map(|&i| &prepared[i]).collect();
            let got = self.script(&mut conn, "a", now, &checks).await?;
            let admitted = got.iter().all(|v| v.allowed);
            for (&i, v) in members.iter().zip(got) {
                verdicts[i] = Some(v);
            }
            if !admitted {
                denied_at = Some(g);
                break;
            }
        }
        if let Some(denied) = denied_at {
            // Give back what the earlier slots committed, then report every admitting check as
            // its quota stands (a dry run: decided, nothing written).
            for (g, (_, members)) in groups.iter().enumerate() {
                if g == denied {
                    continue;
                }
                let checks: Vec<&Prepared> = members.iter().map(|&i| &prepared[i]).collect();
                if g < denied {
                    self.script(&mut conn, "r", now, &checks).await?;
                }
                let got = self.script(&mut conn, "d", now, &checks).await?;
                for (&i, v) in members.iter().zip(got) {
                    verdicts[i] = Some(v);
                }
            }
        }
        verdicts
            .into_iter()
            .map(|v| v.ok_or_else(|| protocol("a check got no verdict")))
            .collect()
    }

    /// One script call; `op` is "a" (apply), "d" (dry run) or "r" (refund).
    async fn script(
        &self,
        conn: &mut Conn,
        op: &str,
        now: Timestamp,
        checks: &[&Prepared],
    ) -> Result<Vec<Verdict>, StoreError> {
        let build = |name: &str, first: &str| {
            let mut cmd = redis::cmd(name);
            cmd.arg(first).arg(checks.len());
            for p in checks {
                cmd.arg(&p.key);
            }
            cmd.arg(op).arg(self.clock_arg(now));
            for p in checks {
                cmd.arg(&p.args[..]);
            }
            cmd
        };
        self.inner
            .stats
            .script_calls
            .fetch_add(1, Ordering::Relaxed);
        let reply: Result<Value, RedisError> =
            build("EVALSHA", &self.inner.sha).query_async(conn).await;
        let reply = match reply {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                // A restarted or new node has an empty script cache: EVAL loads it there.
                self.inner
                    .stats
                    .script_calls
                    .fetch_add(1, Ordering::Relaxed);
                build("EVAL", SCRIPT).query_async(conn).await
            }
            other => other,
        };
        let reply = reply.map_err(classify)?;
        if op == "r" {
            return Ok(Vec::new());
        }
        parse_reply(reply, checks.len())
    }

    async fn conn(&self) -> Result<Conn, StoreError> {
        match &self.inner.connection {
            Connection::Single(manager) => Ok(Conn::Single(manager.clone())),
            Connection::Cluster(state) => {
                let ClusterState {
                    client,
                    conn,
                    connecting,
                } = &**state;
                if let Some(c) = conn.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
                    return Ok(Conn::Cluster(c.clone()));
                }
                // Connect in the background, so no call waits longer than its timeout for it.
                if !connecting.swap(true, Ordering::AcqRel) {
                    let client = client.clone();
                    let connecting = connecting.clone();
                    let store = self.clone();
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    tokio::spawn(async move {
                        let result = client.get_async_connection().await;
                        if let (Ok(c), Connection::Cluster(state)) =
                            (&result, &store.inner.connection)
                        {
                            *state.conn.write().unwrap_or_else(|e| e.into_inner()) =
                                Some(c.clone());
                        }
                        connecting.store(false, Ordering::Release);
                        let _ = tx.send(result);
                    });
                    if let Ok(Ok(c)) = rx.await {
                        return Ok(Conn::Cluster(c));
                    }
                }
                Err(StoreError::Unavailable {
                    reason: "not connected to the Redis Cluster yet".to_owned(),
                })
            }
        }
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

    /// Whether this call may go to Redis: always while healthy; when the circuit is open, one
    /// call per probe interval.
    fn may_call_redis(&self) -> bool {
        let at = self.inner.probe_at.load(Ordering::Relaxed);
        if at == 0 {
            return true;
        }
        let now = self.mono_micros();
        now >= at
            && self
                .inner
                .probe_at
                .compare_exchange(
                    at,
                    now + probe_micros(),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    fn open_circuit(&self) {
        let next = self.mono_micros().max(1) + probe_micros();
        let _ = self
            .inner
            .probe_at
            .compare_exchange(0, next, Ordering::AcqRel, Ordering::Relaxed);
    }

    async fn fallback(&self, now: Timestamp, checks: &[Check<'_>]) -> Decisions {
        self.inner.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
        match self.inner.config.on_error {
            OnError::Local => self.inner.memory.apply_now(now, checks),
            OnError::Allow => checks
                .iter()
                .map(|c| {
                    let limit = u64::from(c.policy.quota().limit());
                    Verdict {
                        allowed: true,
                        limit,
                        remaining: limit,
                        reset_micros: 0,
                        retry_after_micros: None,
                        delay_micros: 0,
                    }
                    .into_decision(c.policy.shared_name())
                })
                .collect(),
            OnError::Deny => checks
                .iter()
                .map(|c| {
                    let retry = u64::try_from(DENY_RETRY.as_micros()).unwrap_or(u64::MAX);
                    Verdict {
                        allowed: false,
                        limit: u64::from(c.policy.quota().limit()),
                        remaining: 0,
                        reset_micros: retry,
                        retry_after_micros: Some(retry),
                        delay_micros: 0,
                    }
                    .into_decision(c.policy.shared_name())
                })
                .collect(),
        }
    }
}

#[cfg(feature = "tls")]
fn tls_certificates(root_pem: &[u8]) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(root_pem.to_vec()),
    }
}

fn probe_micros() -> u64 {
    u64::try_from(PROBE_INTERVAL.as_micros()).unwrap_or(u64::MAX)
}

impl Store for RedisStore {
    async fn apply(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<Decisions, StoreError> {
        if checks.is_empty() {
            return Ok(Decisions::new());
        }
        let prepared = self.prepare(checks)?;
        let single = checks.len() == 1;
        if single {
            if let Some(v) =
                self.inner
                    .deny
                    .get(&prepared[0].cache, checks[0].cost, self.cache_now(now))
            {
                self.inner
                    .stats
                    .deny_cache_hits
                    .fetch_add(1, Ordering::Relaxed);
                return Ok(decisions(checks, vec![v]));
            }
        }
        if !self.may_call_redis() {
            return Ok(self.fallback(now, checks).await);
        }
        match self.bounded(self.run(now, &prepared)).await {
            Ok(verdicts) => {
                self.inner.probe_at.store(0, Ordering::Relaxed);
                if single {
                    if let Some(v) = verdicts.first().filter(|v| !v.allowed) {
                        self.inner.deny.insert(
                            prepared[0].cache,
                            checks[0].cost,
                            self.cache_now(now),
                            *v,
                        );
                    }
                }
                Ok(decisions(checks, verdicts))
            }
            Err(e) => {
                self.inner.stats.errors.fetch_add(1, Ordering::Relaxed);
                if e.is_retryable() {
                    self.open_circuit();
                }
                Ok(self.fallback(now, checks).await)
            }
        }
    }

    async fn refund(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<(), StoreError> {
        if checks.is_empty() {
            return Ok(());
        }
        let prepared = self.prepare(checks)?;
        for p in &prepared {
            self.inner.deny.remove(&p.cache);
        }
        if self.inner.config.on_error == OnError::Local {
            // Whatever the fallback store admitted meanwhile is given back there too.
            self.inner.memory.refund_now(now, checks);
        }
        let result = self
            .bounded(async {
                let mut conn = self.conn().await?;
                // Refunds are per key and commutative across keys: one call per slot.
                let mut slots: Vec<u16> = prepared.iter().map(|p| p.slot).collect();
                if !self.inner.config.cluster {
                    slots.truncate(1);
                }
                slots.dedup();
                let mut done: Vec<u16> = Vec::new();
                for s in slots {
                    if done.contains(&s) {
                        continue;
                    }
                    done.push(s);
                    let group: Vec<&Prepared> = prepared
                        .iter()
                        .filter(|p| !self.inner.config.cluster || p.slot == s)
                        .collect();
                    self.script(&mut conn, "r", now, &group).await?;
                }
                Ok(())
            })
            .await;
        if let Err(e) = &result {
            self.inner.stats.errors.fetch_add(1, Ordering::Relaxed);
            if e.is_retryable() {
                self.open_circuit();
            }
        }
        result
    }
}

fn decisions(checks: &[Check<'_>], verdicts: Vec<Verdict>) -> Decisions {
    checks
        .iter()
        .zip(verdicts)
        .map(|(c, v)| v.into_decision(c.policy.shared_name()))
        .collect()
}

/// The script arguments of one check: algorithm code and parameters, then the cost.
fn encode(check: &Check<'_>) -> Result<[i64; 5], StoreError> {
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let cost = i64::from(check.cost);
    Ok(match check.policy.quota() {
        Quota::FixedWindow(a) => [1, i64::from(a.limit()), n(a.window_micros()), 0, cost],
        Quota::SlidingWindowLog(a) => [2, i64::from(a.limit()), n(a.window_micros()), 0, cost],
        Quota::SlidingWindowCounter(a) => [3, i64::from(a.limit()), n(a.window_micros()), 0, cost],
        Quota::TokenBucket(a) => [4, i64::from(a.capacity()), n(a.interval_micros()), 0, cost],
        Quota::LeakyBucket(a) => {
            let depth = u64::from(a.burst()).saturating_mul(a.interval_micros());
            if depth >= MAX_DEPTH {
                return Err(protocol(&format!(
                    "policy {:?}: a leaky bucket deeper than 2^51 µs is beyond the Redis \
                     store's exact arithmetic",
                    check.policy.name()
                )));
            }
            // Any bound past the bucket's depth behaves like no bound smaller than 2^52.
            let max_delay = a.max_delay().map_or(-1, |d| {
                n(u64::try_from(d.as_micros())
                    .unwrap_or(u64::MAX)
                    .min(MAX_DEPTH * 2))
            });
            [
                5,
                i64::from(a.burst()),
                n(a.interval_micros()),
                max_delay,
                cost,
            ]
        }
    })
}

fn parse_reply(reply: Value, n: usize) -> Result<Vec<Verdict>, StoreError> {
    let Value::Array(items) = reply else {
        return Err(protocol(&format!(
            "expected an array from the script, got {reply:?}"
        )));
    };
    if items.len() != 6 * n {
        return Err(protocol(&format!(
            "expected {} integers from the script, got {}",
            6 * n,
            items.len()
        )));
    }
    let mut ints = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Value::Int(i) => ints.push(i),
            other => {
                return Err(protocol(&format!(
                    "expected an integer in the script's reply, got {other:?}"
                )));
            }
        }
    }
    let u = |i: i64| u64::try_from(i).map_err(|_| protocol(&format!("negative value {i}")));
    ints.chunks_exact(6)
        .map(|c| {
            Ok(Verdict {
                allowed: c[0] == 1,
                limit: u(c[1])?,
                remaining: u(c[2])?,
                reset_micros: u(c[3])?,
                retry_after_micros: if c[4] < 0 { None } else { Some(u(c[4])?) },
                delay_micros: u(c[5])?,
            })
        })
        .collect()
}

fn protocol(reason: &str) -> StoreError {
    StoreError::Protocol {
        reason: reason.to_owned(),
    }
}

/// Connection trouble and cluster reconfiguration are retryable ([`StoreError::Unavailable`]);
/// anything else Redis says is a [`StoreError::Protocol`].
fn classify(e: RedisError) -> StoreError {
    let retryable = e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(
            e.kind(),
            ErrorKind::Io
                | ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::BusyLoading
                        | ServerErrorKind::Moved
                        | ServerErrorKind::Ask
                        | ServerErrorKind::ReadOnly
                )
        );
    if retryable {
        StoreError::Unavailable {
            reason: e.to_string(),
        }
    } else {
        StoreError::Protocol {
            reason: e.to_string(),
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate::Policy;

    #[test]
    fn replies_of_the_wrong_shape_are_protocol_errors() {
        for reply in [
            Value::Nil,
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Nil; 6]),
            Value::Array(vec![Value::Int(-5); 6]),
        ] {
            assert!(matches!(
                parse_reply(reply, 1),
                Err(StoreError::Protocol { .. })
            ));
        }
    }

    #[test]
    fn deep_leaky_buckets_are_refused_not_rounded() -> Result<(), Box<dyn std::error::Error>> {
        let q = Quota::leaky_bucket("1/400d".parse()?, 100_000)?;
        let p = Policy::new("deep", q)?;
        assert!(matches!(
            encode(&Check::new(&p, b"k", 1)),
            Err(StoreError::Protocol { .. })
        ));
        let q = Quota::sliding_window_counter(u32::MAX, Duration::from_secs(400 * 86_400))?;
        let p = Policy::new("huge counter", q)?;
        assert!(
            encode(&Check::new(&p, b"k", 1)).is_ok(),
            "exact in the script"
        );
        Ok(())
    }
}
