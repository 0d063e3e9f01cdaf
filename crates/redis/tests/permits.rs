//! Concurrency permits in Redis beyond the conformance suite: what is stored (a sorted set of
//! permit ids scored by expiry, living as long as its newest permit), permits shared by every
//! instance, a dead instance's permits coming back when their TTL passes, denials never cached,
//! and `on_error` when Redis is gone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use common::RedisServer;
use tollgate::testing::unique;
use tollgate::{Check, Decision, Policy, Quota, Store, Timestamp};
use tollgate_redis::OnError;

fn server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

fn wall() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

fn inflight(limit: u32, ttl: Duration) -> Policy {
    Policy::new(&unique("inflight"), Quota::concurrency(limit, ttl).unwrap()).unwrap()
}

async fn take<S: Store>(store: &S, policy: &Policy, key: &[u8], permit: u64) -> Decision {
    let check = Check::new(policy, key, 1).with_permit(permit);
    store.apply_one(wall(), check).await.unwrap()
}

/// The key is a sorted set of 16-hex-digit permit ids scored by their expiry (µs), with the TTL
/// of its newest permit; releasing the last permit deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_are_a_sorted_set_that_lives_as_long_as_its_newest() {
    let store = common::local_store(&server().url()).await;
    let policy = inflight(3, Duration::from_secs(60));
    let key = unique("zset");
    let now = wall();
    let check = Check::new(&policy, key.as_bytes(), 1).with_permit(0xdead_beef);
    assert!(store.apply_one(now, check).await.unwrap().allowed);
    let name = store.key_of(&check);
    assert!(name.starts_with("tg:{"), "{name}");
    assert_eq!(server().command(&["TYPE", &name]).unwrap().trim(), "zset");
    let members = server()
        .command(&["ZRANGE", &name, "0", "-1", "WITHSCORES"])
        .unwrap();
    let expires = now.as_micros() + 60_000_000;
    assert_eq!(
        members.split_whitespace().collect::<Vec<_>>(),
        ["00000000deadbeef", expires.to_string().as_str()]
    );
    let ttl: i64 = server()
        .command(&["PTTL", &name])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!((58_000..=60_000).contains(&ttl), "PTTL {ttl}");
    assert_eq!(store.release(now, &[check]).await.unwrap(), 1);
    assert_eq!(server().command(&["EXISTS", &name]).unwrap().trim(), "0");
}

/// Two instances share one set of N permits: what one holds the other cannot take, and one's
/// release frees a permit for the other at once, although both cache denials (concurrency
/// denials are never cached).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_share_the_permits() {
    let timeout = Duration::from_secs(1);
    let a = common::store_with(&server().url(), OnError::Deny, timeout).await;
    let b = common::store_with(&server().url(), OnError::Deny, timeout).await;
    let policy = inflight(3, Duration::from_secs(60));
    let key = unique("shared");
    let key = key.as_bytes();
    assert!(take(&a, &policy, key, 1).await.allowed);
    assert!(take(&a, &policy, key, 2).await.allowed);
    assert!(take(&b, &policy, key, 3).await.allowed);
    for _ in 0..3 {
        let d = take(&b, &policy, key, 4).await;
        assert!(
            !d.allowed && d.retry_after <= Some(Duration::from_secs(1)),
            "{d:?}"
        );
        assert!(!take(&a, &policy, key, 5).await.allowed);
    }
    let released = a
        .release(wall(), &[Check::new(&policy, key, 1).with_permit(2)])
        .await
        .unwrap();
    assert_eq!(released, 1);
    let d = take(&b, &policy, key, 4).await;
    assert!(d.allowed, "freed by the other instance, at once: {d:?}");
    assert_eq!(b.stats().deny_cache_hits + a.stats().deny_cache_hits, 0);
}

/// An instance that dies holding permits (it never releases them): they come back when their
/// `lease_ttl` passes, on Redis's clock, and the key expires with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_instances_permits_come_back_after_their_ttl() {
    let timeout = Duration::from_secs(1);
    let policy = inflight(2, Duration::from_millis(400));
    let key = unique("dead");
    let key = key.as_bytes();
    let dying = common::store_with(&server().url(), OnError::Deny, timeout).await;
    assert!(take(&dying, &policy, key, 1).await.allowed);
    assert!(take(&dying, &policy, key, 2).await.allowed);
    let name = dying.key_of(&Check::new(&policy, key, 1));
    drop(dying);
    let survivor = common::store_with(&server().url(), OnError::Deny, timeout).await;
    let d = take(&survivor, &policy, key, 3).await;
    assert!(!d.allowed, "{d:?}");
    let retry = d.retry_after.unwrap();
    assert!(retry <= Duration::from_millis(400), "{retry:?}");
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(server().command(&["EXISTS", &name]).unwrap().trim(), "0");
    let d = take(&survivor, &policy, key, 3).await;
    assert!(
        d.allowed && d.remaining == 1,
        "taken back by their TTL: {d:?}"
    );
}

/// With Redis gone, `on_error = "local"` decides permits in the process (and gives them back
/// there); `"deny"` returns the errors for the caller's failure rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_error_follows_the_mode_for_permits() {
    let mut server = RedisServer::start();
    let timeout = Duration::from_millis(200);
    let local = common::store_with(&server.url(), OnError::Local, timeout).await;
    let deny = common::store_with(&server.url(), OnError::Deny, timeout).await;
    server.kill();
    let policy = inflight(2, Duration::from_secs(60));
    let check = |permit| Check::new(&policy, b"k", 1).with_permit(permit);
    for permit in [1, 2] {
        assert!(
            local
                .apply_one(wall(), check(permit))
                .await
                .unwrap()
                .allowed
        );
    }
    assert!(!local.apply_one(wall(), check(3)).await.unwrap().allowed);
    assert_eq!(
        local.release(wall(), &[check(1), check(9)]).await.unwrap(),
        1
    );
    assert!(local.apply_one(wall(), check(3)).await.unwrap().allowed);
    assert!(
        deny.apply_one(wall(), check(1))
            .await
            .unwrap_err()
            .is_retryable()
    );
    assert!(
        deny.release(wall(), &[check(1)])
            .await
            .unwrap_err()
            .is_retryable()
    );
}

/// The `Limiter`'s slots over Redis: the limit held across two limiters sharing it, a slot
/// given back by `release`, and one given back by a task when it is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limiter_slots_are_shared_and_given_back_on_release_and_drop() {
    let policy = inflight(2, Duration::from_secs(60));
    let name = policy.name();
    let limiter = |store| {
        tollgate::Limiter::builder()
            .store(store)
            .policy(policy.clone())
            .build()
            .unwrap()
    };
    let one = limiter(common::local_store(&server().url()).await);
    let two = limiter(common::local_store(&server().url()).await);
    let key = unique("slots");
    let first = one.take_slot(name, &key).await.unwrap();
    let second = two.take_slot(name, &key).await.unwrap();
    assert_eq!(second.decision().remaining, 0);
    assert!(
        one.take_slot(name, &key).await.is_err(),
        "the limit is shared"
    );
    assert!(first.release().await.unwrap());
    let third = two.take_slot(name, &key).await.unwrap();
    // Dropped, a slot is given back by a task of its own: soon, not at once.
    drop(second);
    let mut again = None;
    for _ in 0..200 {
        if let Ok(slot) = one.take_slot(name, &key).await {
            again = Some(slot);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let again = again.expect("the dropped slot came back");
    assert!(again.release().await.unwrap() && third.release().await.unwrap());
}
