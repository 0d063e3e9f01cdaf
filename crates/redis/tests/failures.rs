//! Redis failing under load: killed and restarted, or slow behind a delaying proxy. Each
//! `on_error` mode decides as documented, nothing panics, and decisions come from Redis again
//! by themselves once it answers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use common::{RedisServer, SlowProxy};
use tollgate::testing::unique;
use tollgate::{Check, Decision, Policy, Quota, Store, StoreError, Timestamp};
use tollgate_redis::{OnError, RedisStore};

fn wall() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

fn big_policy() -> Policy {
    Policy::new(
        &unique("outage"),
        Quota::fixed_window(1_000_000, Duration::from_secs(3600)).unwrap(),
    )
    .unwrap()
}

async fn decide(store: &RedisStore, policy: &Policy, key: &[u8]) -> Result<Decision, StoreError> {
    let decisions = store.apply(wall(), &[Check::new(policy, key, 1)]).await?;
    Ok(decisions.into_first().unwrap())
}

/// What a call Redis could not answer gets: with `local`, a decision of the in-process store
/// (counting on its own, from a fresh quota); otherwise the error, retryable, for the caller's
/// failure rule to answer.
fn follows_mode(mode: OnError, d: &Result<Decision, StoreError>) -> bool {
    match (mode, d) {
        (OnError::Local, Ok(d)) => d.allowed && d.remaining < d.limit,
        (OnError::Allow | OnError::Deny, Err(e)) => e.is_retryable(),
        _ => false,
    }
}

/// 8 tasks hammer the store; Redis is killed (SIGKILL) and restarted on the same port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_under_load() {
    for mode in [OnError::Allow, OnError::Deny, OnError::Local] {
        let mut server = RedisServer::start();
        let store = common::store_with(&server.url(), mode, Duration::from_millis(50)).await;
        let policy = big_policy();
        let down = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (made, made_down) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut tasks = tokio::task::JoinSet::new();
        for t in 0..8 {
            let (store, policy, down, stop) =
                (store.clone(), policy.clone(), down.clone(), stop.clone());
            let (made, made_down) = (made.clone(), made_down.clone());
            tasks.spawn(async move {
                let key = format!("k{t}");
                let (mut during, mut wrong) = (0u32, 0u32);
                while !stop.load(Ordering::Relaxed) {
                    let before = down.load(Ordering::Acquire);
                    let d = decide(&store, &policy, key.as_bytes()).await;
                    made.fetch_add(1, Ordering::Relaxed);
                    if before && down.load(Ordering::Acquire) {
                        made_down.fetch_add(1, Ordering::Relaxed);
                        during += 1;
                        wrong += u32::from(!follows_mode(mode, &d));
                    }
                    tokio::task::yield_now().await;
                }
                (during, wrong)
            });
        }
        // Under load before the crash, and for a while during the outage (counted, not timed).
        let busy = common::eventually(Duration::from_secs(5), || async {
            made.load(Ordering::Relaxed) >= 200
        });
        assert!(busy.await, "{mode:?}: no load before the crash");
        tokio::task::block_in_place(|| server.kill());
        down.store(true, Ordering::Release);
        let busy = common::eventually(Duration::from_secs(5), || async {
            made_down.load(Ordering::Relaxed) >= 500
        });
        assert!(busy.await, "{mode:?}: no load during the outage");
        down.store(false, Ordering::Release);
        tokio::task::block_in_place(|| server.restart());
        let restarted = Instant::now();
        // Back on Redis by itself: a probe succeeds and the store is ready within 2 s.
        let back = common::eventually(Duration::from_secs(2), || async {
            store.is_ready() && store.apply_redis(wall(), &[]).await.is_ok()
        })
        .await;
        assert!(back, "{mode:?}: not back on Redis 2 s after the restart");
        // Decisions now come from Redis: no more fallbacks.
        let fallbacks = store.stats().fallbacks;
        for _ in 0..20 {
            let d = decide(&store, &policy, b"after").await;
            assert!(d.is_ok_and(|d| d.allowed), "{mode:?}");
        }
        assert_eq!(store.stats().fallbacks, fallbacks, "{mode:?}");
        let elapsed = restarted.elapsed();
        stop.store(true, Ordering::Relaxed);
        let (mut during, mut wrong) = (0, 0);
        while let Some(r) = tasks.join_next().await {
            let (d, w) = r.expect("a task panicked");
            during += d;
            wrong += w;
        }
        assert!(during > 0, "{mode:?}: no decision during the outage");
        assert_eq!(
            wrong, 0,
            "{mode:?}: {wrong} of {during} outage decisions broke on_error"
        );
        assert!(elapsed < Duration::from_secs(3));
    }
}

/// Behind a proxy that delays replies past the timeout, each decision returns within
/// timeout + 10 ms and follows `on_error`; when the delay goes, Redis decides again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_redis_follows_on_error_within_the_timeout() {
    let server = RedisServer::start();
    let proxy = SlowProxy::start(server.port);
    let timeout = Duration::from_millis(50);
    for mode in [OnError::Deny, OnError::Allow, OnError::Local] {
        let store = common::store_with(&proxy.url(), mode, timeout).await;
        let policy = big_policy();
        assert!(store.is_ready());
        assert!(decide(&store, &policy, b"k").await.unwrap().allowed);
        proxy.set_delay(Duration::from_millis(300));
        // In Redis only, the call fails with the store's timeout (a standalone store's calls
        // are timed in batches by its coalescer).
        let slow = store
            .apply_redis(wall(), &[Check::new(&policy, b"k", 1)])
            .await;
        assert!(
            matches!(slow, Err(StoreError::Timeout { after }) if after == timeout),
            "{mode:?}: {slow:?}"
        );
        // Each decision within timeout + 10 ms of a plain timer of `timeout` started beside
        // it: on a loaded machine the runtime's own wake-up lag is not the store's.
        let mut probes = 0;
        for _ in 0..20 {
            let started = Instant::now();
            let (d, (decided, timer)) = {
                let decision = async {
                    let d = decide(&store, &policy, b"k").await;
                    (d, started.elapsed())
                };
                let timer = async {
                    tokio::time::sleep(timeout).await;
                    started.elapsed()
                };
                let ((d, decided), timer) = tokio::join!(decision, timer);
                (d, (decided, timer))
            };
            assert!(follows_mode(mode, &d), "{mode:?}: {d:?}");
            assert!(
                decided <= timer + Duration::from_millis(10),
                "{mode:?}: a decision took {decided:?} (a {timeout:?} timer: {timer:?})"
            );
            probes += usize::from(decided >= timeout);
        }
        assert!(probes > 0, "{mode:?}: no call tried Redis");
        assert!(!store.is_ready());
        proxy.set_delay(Duration::ZERO);
        let back = common::eventually(Duration::from_secs(2), || async {
            let _ = decide(&store, &policy, b"k").await;
            store.is_ready()
        })
        .await;
        assert!(back, "{mode:?}: not back on Redis after the delay went");
    }
}
