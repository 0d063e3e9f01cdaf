//! Lockouts in Redis beyond the conformance suite: what is stored (one hash per banned key and
//! policy, beside the key's state, living as long as it means something), bans honoured at once
//! by every instance sharing the Redis, listed and lifted from any of them, and never answered
//! from a deny cache.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use common::RedisServer;
use tollgate::testing::unique;
use tollgate::{Ban, BanStatus, Check, Policy, Quota, Store, Timestamp};
use tollgate_redis::{OnError, RedisConfig, RedisStore};

fn server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

fn wall() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

/// A store with Redis's clock and a deny cache, as a server runs it.
async fn instance() -> RedisStore {
    let mut config = RedisConfig::standalone(&server().url());
    config.on_error = OnError::Deny;
    RedisStore::new(config).await.unwrap()
}

fn login(after: u32, ban_for: Duration) -> Policy {
    let quota = Quota::fixed_window(1, Duration::from_secs(60)).unwrap();
    let ban = Ban::new(after, Duration::from_secs(600), ban_for).unwrap();
    Policy::new(&unique("login"), quota)
        .unwrap()
        .with_ban(ban)
        .unwrap()
}

/// A ban started through one instance refuses the key on another at once; the other lists it
/// and lifts it, and the first admits the key again at once (after its window, here long, the
/// quota is its own matter: a lifted ban leaves the quota as it stands).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ban_is_shared_listed_and_lifted_across_instances() {
    let (a, b) = (instance().await, instance().await);
    let policy = login(2, Duration::from_secs(300));
    let key = unique("ip:203.0.113.7");
    let check = Check::new(&policy, key.as_bytes(), 1);
    assert!(a.apply_one(wall(), check).await.unwrap().allowed);
    let first = a.apply_one(wall(), check).await.unwrap();
    assert_eq!((first.allowed, first.ban), (false, BanStatus::None));
    // The second denial, through the other instance, starts the ban.
    let second = b.apply_one(wall(), check).await.unwrap();
    assert_eq!(second.ban, BanStatus::Started, "{second:?}");
    let refused = a.apply_one(wall(), check).await.unwrap();
    assert_eq!(refused.ban, BanStatus::Active, "{refused:?}");
    let retry = refused.retry_after.unwrap();
    assert!(retry > Duration::from_secs(290) && retry <= Duration::from_secs(300));

    let listed = b.bans(wall()).await.unwrap();
    let mine: Vec<_> = listed
        .iter()
        .filter(|r| r.policy == policy.name())
        .collect();
    assert_eq!(mine.len(), 1, "{listed:?}");
    assert_eq!(mine[0].key, key.as_bytes());
    assert_eq!(mine[0].denials, 3);
    assert_eq!(
        mine[0].until.as_micros() - mine[0].since.as_micros(),
        300_000_000
    );

    // The record: a hash beside the key's state, in its slot, with the TTL of the ban.
    let name = a.ban_key_of(&check);
    assert!(name.ends_with(&format!(":ban:{}", policy.name())), "{name}");
    assert_eq!(server().command(&["TYPE", &name]).unwrap().trim(), "hash");
    let ttl: i64 = server()
        .command(&["PTTL", &name])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        ttl > 590_000 && ttl <= 600_000,
        "the streak's 10 minutes: {ttl}"
    );

    assert!(
        b.lift_ban(wall(), policy.name(), key.as_bytes())
            .await
            .unwrap()
    );
    assert_eq!(server().command(&["EXISTS", &name]).unwrap().trim(), "0");
    let after = a.apply_one(wall(), check).await.unwrap();
    assert_eq!(after.ban, BanStatus::None, "lifted: {after:?}");
    assert!(
        !a.bans(wall())
            .await
            .unwrap()
            .iter()
            .any(|r| r.policy == policy.name())
    );
    assert!(
        !a.lift_ban(wall(), policy.name(), key.as_bytes())
            .await
            .unwrap()
    );
}

/// Denials of a policy that bans are never answered from the deny cache: each one reaches
/// Redis and is counted, so a hammering client is banned however many instances it spreads
/// over, and a lifted ban ends at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn banning_policies_skip_the_deny_cache() {
    let store = instance().await;
    let policy = login(5, Duration::from_secs(60));
    let key = unique("hammer");
    let check = Check::new(&policy, key.as_bytes(), 1);
    assert!(store.apply_one(wall(), check).await.unwrap().allowed);
    let before = store.stats().deny_cache_hits;
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(store.apply_one(wall(), check).await.unwrap().ban);
    }
    assert_eq!(store.stats().deny_cache_hits, before);
    assert_eq!(
        statuses,
        [
            BanStatus::None,
            BanStatus::None,
            BanStatus::None,
            BanStatus::None,
            BanStatus::Started,
            BanStatus::Active
        ]
    );
}
