//! The Redis store's own promises beyond the conformance suite: Redis's clock wins over skewed
//! instances, client keys never appear in clear and every key expires, configuration errors
//! are clear, script errors are protocol errors, and the deny cache spares Redis.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use common::RedisServer;
use tollgate::testing::unique;
use tollgate::{Check, Policy, Quota, Store, StoreError, Timestamp};
use tollgate_redis::{ClockSource, OnError, RedisConfig, RedisStore};

fn server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

fn wall() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

fn policy(prefix: &str, quota: Result<Quota, tollgate::QuotaError>) -> Policy {
    Policy::new(&unique(prefix), quota.unwrap()).unwrap()
}

/// Two instances whose clocks differ by 30 s, alternating on one key, decide as one stream:
/// with `clock = redis` the caller's `now` is ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_instances_make_one_decision_stream() {
    let mut config = RedisConfig::standalone(&server().url());
    config.deny_cache_size = 0;
    config.timeout = Duration::from_secs(1);
    let a = RedisStore::new(config.clone()).await.unwrap();
    let b = RedisStore::new(config).await.unwrap();
    for quota in [
        Quota::fixed_window(10, Duration::from_secs(3600)),
        Quota::sliding_window_counter(10, Duration::from_secs(3600)),
        "10/h".parse().and_then(|r| Quota::token_bucket(10, r)),
    ] {
        let p = policy("skew", quota);
        let key = unique("skew-key");
        let mut remaining = Vec::new();
        for i in 0..12 {
            let (store, now) = if i % 2 == 0 {
                (&a, wall())
            } else {
                (&b, wall().saturating_add(Duration::from_secs(30)))
            };
            let d = store
                .apply(now, &[Check::new(&p, key.as_bytes(), 1)])
                .await
                .unwrap()
                .into_first()
                .unwrap();
            remaining.push((d.allowed, d.remaining));
        }
        let expected: Vec<(bool, u64)> = (0..12)
            .map(|i| if i < 10 { (true, 9 - i) } else { (false, 0) })
            .collect();
        assert_eq!(remaining, expected, "{}", p.name());
    }
}

/// No client key appears in Redis (SCAN), and every key the store wrote has a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_hashed_and_expire() {
    let store = common::local_store(&server().url()).await;
    let secret_key = unique("sk_live_SECRET");
    let now = wall();
    for p in tollgate::testing::five_policies(&unique("hashed")) {
        let d = store
            .apply(now, &[Check::new(&p, secret_key.as_bytes(), 1)])
            .await
            .unwrap();
        assert!(d.allowed());
        let name = store.key_of(&Check::new(&p, secret_key.as_bytes(), 1));
        assert!(
            name.starts_with("tg:{") && !name.contains("SECRET"),
            "{name}"
        );
        let ttl: i64 = server()
            .command(&["PTTL", &name])
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(
            ttl > 0 && ttl <= 2_000,
            "{}: PTTL {ttl} (one full reset of a 1 s quota)",
            p.name()
        );
    }
    let all = server()
        .command(&["--scan", "--pattern", "*"])
        .unwrap_or_default();
    assert!(!all.is_empty());
    assert!(!all.contains("SECRET"), "a client key in clear: {all}");
    for key in all.lines() {
        let ttl = server().command(&["PTTL", key]).unwrap_or_default();
        // -1: no expiry (a bug); -2: already gone (another test's key expired meanwhile).
        assert_ne!(ttl.trim(), "-1", "{key} has no expiry");
    }
}

/// A different `key_secret` names different keys: instances must share it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_secret_changes_key_names() {
    let p = policy("secret", Quota::fixed_window(1, Duration::from_secs(1)));
    let a = common::local_store(&server().url()).await;
    let mut config = RedisConfig::standalone(&server().url());
    config.key_secret = b"another".to_vec();
    let b = RedisStore::new(config).await.unwrap();
    let check = Check::new(&p, b"k", 1);
    assert_ne!(a.key_of(&check), b.key_of(&check));
}

#[tokio::test]
async fn bad_urls_are_clear_errors() {
    for (url, needle) in [
        ("localhost:6379", "not a URL"),
        ("http://h:1", "unsupported scheme"),
        ("redis://h:70000", "port"),
    ] {
        let err = RedisStore::new(RedisConfig::standalone(url))
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains(url) && err.contains(needle), "{url}: {err}");
    }
}

/// Redis down at start: construction succeeds, the store is not ready, and decisions follow
/// `on_error`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_at_start_follows_on_error() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("redis://127.0.0.1:{closed}");
    let p = policy("down", Quota::fixed_window(3, Duration::from_secs(60)));
    for mode in [OnError::Allow, OnError::Deny, OnError::Local] {
        let store = common::store_with(&url, mode, Duration::from_millis(50)).await;
        assert!(!store.is_ready());
        assert!(store.ping().await.is_err());
        let mut allowed = 0;
        for _ in 0..5 {
            match store.apply(wall(), &[Check::new(&p, b"k", 1)]).await {
                // `local`: the in-process store decides, limit and all.
                Ok(d) => {
                    assert_eq!(mode, OnError::Local);
                    allowed += usize::from(d.allowed());
                }
                // `allow` and `deny`: the error, for the caller's failure rule to answer; a
                // store that made up a decision would report a quota nobody counted.
                Err(e) => {
                    assert_ne!(mode, OnError::Local, "{e}");
                    assert!(e.is_retryable(), "{e}");
                }
            }
        }
        let expected = if mode == OnError::Local { 3 } else { 0 };
        assert_eq!(allowed, expected, "{mode:?}");
        assert_eq!(store.stats().fallbacks, 5);
    }
}

/// A script error (here: a key of the wrong type) is a protocol error, never a panic, and
/// never an allow unless `on_error = allow`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_errors_are_protocol_errors() {
    let p = policy(
        "wrongtype",
        Quota::sliding_window_log(3, Duration::from_secs(60)),
    );
    let key = unique("wrongtype-key");
    let probe = common::local_store(&server().url()).await;
    let name = probe.key_of(&Check::new(&p, key.as_bytes(), 1));
    server().command(&["SET", &name, "not a list"]).unwrap();
    let err = probe
        .apply_redis(wall(), &[Check::new(&p, key.as_bytes(), 1)])
        .await
        .err();
    assert!(matches!(err, Some(StoreError::Protocol { .. })), "{err:?}");
    for mode in [OnError::Deny, OnError::Allow] {
        let store = common::store_with(&server().url(), mode, Duration::from_secs(1)).await;
        let err = store
            .apply(wall(), &[Check::new(&p, key.as_bytes(), 1)])
            .await
            .err();
        assert!(
            matches!(err, Some(StoreError::Protocol { .. })),
            "{mode:?}: {err:?}"
        );
        assert_eq!(store.stats().errors, 1);
        assert!(
            store.is_ready(),
            "a protocol error does not mean Redis is down"
        );
    }
}

/// 10,000 retries while denied cost a handful of Redis calls (INFO commandstats).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_cache_spares_redis() {
    // A server of its own: commandstats count every client's calls.
    let server = RedisServer::start();
    let store = common::store_with(&server.url(), OnError::Deny, Duration::from_secs(1)).await;
    let p = policy(
        "denycache",
        Quota::fixed_window(5, Duration::from_secs(3600)),
    );
    for _ in 0..5 {
        let d = store
            .apply(wall(), &[Check::new(&p, b"k", 1)])
            .await
            .unwrap();
        assert!(d.allowed());
    }
    server.command(&["CONFIG", "RESETSTAT"]).unwrap();
    let before = store.stats().script_calls;
    let mut denied = 0;
    for _ in 0..10_000 {
        let d = store
            .apply(wall(), &[Check::new(&p, b"k", 1)])
            .await
            .unwrap();
        denied += usize::from(!d.allowed());
        let retry = d.retry_after().unwrap();
        assert!(retry > Duration::ZERO && retry <= Duration::from_secs(3600));
    }
    assert_eq!(denied, 10_000);
    // Counted by the store itself, and by the server (which another test's client, reconnecting
    // to a port this server took after it, could also call): the server's count is no lower.
    let calls = store.stats().script_calls - before;
    assert!(calls <= 5, "{calls} script calls for 10,000 denied retries");
    let served = server.command_calls("evalsha") + server.command_calls("eval");
    assert!(served >= calls, "{served} served, {calls} sent");
    assert!(store.stats().deny_cache_hits >= 9_995);
    // Another key, and a cost-0 peek, still go to Redis.
    let d = store
        .apply(wall(), &[Check::new(&p, b"other", 1)])
        .await
        .unwrap();
    assert!(d.allowed());
    let d = store
        .apply(wall(), &[Check::new(&p, b"k", 0)])
        .await
        .unwrap();
    assert!(d.allowed());
}

/// A refund ends a cached denial: the refunded quota is usable at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refund_clears_the_deny_cache() {
    let store = common::store_with(&server().url(), OnError::Deny, Duration::from_secs(1)).await;
    let p = policy("refund", Quota::fixed_window(1, Duration::from_secs(3600)));
    let key = unique("refund-key");
    let check = [Check::new(&p, key.as_bytes(), 1)];
    assert!(store.apply(wall(), &check).await.unwrap().allowed());
    assert!(!store.apply(wall(), &check).await.unwrap().allowed());
    store.refund(wall(), &check).await.unwrap();
    assert!(store.apply(wall(), &check).await.unwrap().allowed());
}

/// A restarted server has no scripts: EVALSHA's NOSCRIPT is answered by loading it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_cache_flush_is_survived() {
    let store = common::local_store(&server().url()).await;
    let p = policy("flush", Quota::fixed_window(5, Duration::from_secs(60)));
    assert!(
        store
            .apply(wall(), &[Check::new(&p, b"k", 1)])
            .await
            .unwrap()
            .allowed()
    );
    server().command(&["SCRIPT", "FLUSH"]).unwrap();
    let d = store
        .apply_redis(wall(), &[Check::new(&p, b"k", 1)])
        .await
        .unwrap();
    assert_eq!(d.as_slice()[0].remaining, 3);
}

/// The clock mode matters only for `now`: with `clock = local` a caller far in the future
/// still gets keys that expire one reset later, not immediately or never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_clock_ttls_are_relative() {
    let mut config = RedisConfig::standalone(&server().url());
    config.clock = ClockSource::Local;
    let store = RedisStore::new(config).await.unwrap();
    let p = policy(
        "reltl",
        "1/s".parse().and_then(|r| Quota::token_bucket(60, r)),
    );
    let key = unique("reltl-key");
    let past = Timestamp::from_secs(1_000_000_000);
    assert!(
        store
            .apply(past, &[Check::new(&p, key.as_bytes(), 10)])
            .await
            .unwrap()
            .allowed()
    );
    let name = store.key_of(&Check::new(&p, key.as_bytes(), 1));
    let ttl: i64 = server()
        .command(&["PTTL", &name])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!((9_000..=10_000).contains(&ttl), "PTTL {ttl}");
}

/// The store behind the core's `Limiter`, as the server uses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_behind_the_limiter() {
    let store = common::store_with(&server().url(), OnError::Deny, Duration::from_secs(1)).await;
    let name = unique("limiter");
    let limiter = tollgate::Limiter::builder()
        .store(store)
        .policy(
            Policy::new(
                &name,
                Quota::sliding_window_counter(3, Duration::from_secs(60)).unwrap(),
            )
            .unwrap(),
        )
        .build()
        .unwrap();
    let key = unique("limiter-key");
    for remaining in (0..3).rev() {
        let d = limiter.check(&name, key.as_str(), 1).await.unwrap();
        assert!(d.allowed);
        assert_eq!(d.remaining, remaining);
    }
    let d = limiter.check(&name, key.as_str(), 1).await.unwrap();
    assert!(!d.allowed && d.retry_after.is_some());
}

/// A Cluster whose seeds are all down at start: construction succeeds, decisions follow
/// `on_error` within the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_unreachable_at_start_follows_on_error() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut config = RedisConfig::cluster(&[format!("redis://127.0.0.1:{closed}")]);
    config.on_error = OnError::Deny;
    let store = RedisStore::new(config).await.unwrap();
    assert!(!store.is_ready());
    let p = policy(
        "cluster-down",
        Quota::fixed_window(3, Duration::from_secs(60)),
    );
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let err = store.apply(wall(), &[Check::new(&p, b"k", 1)]).await.err();
        assert!(matches!(&err, Some(e) if e.is_retryable()), "{err:?}");
        assert!(started.elapsed() < Duration::from_millis(500));
    }
}

/// A charge far past a sliding window log's limit (a usage report of 200,000, then of
/// 2^32 − 1, against 5 a minute) leaves at most limit + 1 members in the key, not one per unit
/// charged: the script's work is bounded by the quota, so Redis answers the next call (another
/// key's check) at once instead of running one script for ever while every decision waits and
/// fails open. The key still decides as the memory store's log (the conformance suite compares
/// them): over its limit for a minute, and a refund gives back what the name counts first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_charge_on_a_log_keeps_few_members() {
    let store = common::local_store(&server().url()).await;
    let log = policy(
        "huge-log",
        Quota::sliding_window_log(5, Duration::from_secs(60)),
    );
    let now = wall();
    let zcard = |name: &str| -> u64 {
        server()
            .command(&["ZCARD", name])
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    for cost in [200_000, u32::MAX] {
        let key = unique("huge-key");
        let check = Check::new(&log, key.as_bytes(), cost);
        let charged = store.charge(now, &[check]).await.unwrap();
        let charged = charged.into_first().unwrap();
        assert!(charged.allowed && charged.remaining == 0, "{charged:?}");
        let name = store.key_of(&check);
        assert_eq!(zcard(&name), 6, "charged {cost}: limit + 1 members");
        // Another key's check, right after: decided in Redis (this store fails closed).
        let other = unique("huge-other");
        let d = store
            .apply(now, &[Check::new(&log, other.as_bytes(), 1)])
            .await
            .unwrap()
            .into_first()
            .unwrap();
        assert!(d.allowed && d.remaining == 4, "{d:?}");
        let peek = store
            .apply(now, &[Check::new(&log, key.as_bytes(), 0)])
            .await
            .unwrap()
            .into_first()
            .unwrap();
        assert!(!peek.allowed, "over its limit: {peek:?}");
        assert_eq!(peek.retry_after, Some(Duration::from_secs(60)));
        // All but one unit back: the count in the top member's name first, then five members.
        store
            .refund(now, &[Check::new(&log, key.as_bytes(), cost - 1)])
            .await
            .unwrap();
        assert_eq!(zcard(&name), 1, "charged {cost}, refunded all but one");
        let d = store
            .apply(now, &[Check::new(&log, key.as_bytes(), 4)])
            .await
            .unwrap()
            .into_first()
            .unwrap();
        assert!(d.allowed && d.remaining == 0, "{d:?}");
    }
    let stats = store.stats();
    assert_eq!((stats.errors, stats.fallbacks), (0, 0), "{stats:?}");
}
