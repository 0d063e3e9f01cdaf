//! The service over `tollgate_redis::RedisStore`, against a `redis-server` this test starts on
//! a free loopback port (and kills when done): matching, all-or-nothing across descriptors in
//! one Lua call, and store failures following the store's own `on_error`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{header, request, start_with};
use tollgate_envoy::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_envoy::{Config, Descriptor, Domain, RateLimit, Unit};
use tollgate_redis::{ClockSource, OnError, RedisConfig, RedisStore};
use tollgate_testkit::redis::RedisProcess;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

async fn store(url: &str, on_error: OnError) -> RedisStore {
    let mut config = RedisConfig::standalone(url);
    config.clock = ClockSource::Local;
    config.on_error = on_error;
    config.timeout = Duration::from_millis(500);
    config.key_prefix = format!("envoy-test-{}", std::process::id());
    RedisStore::new(config).await.unwrap()
}

/// Hour windows: this store reads the real clock, and Envoy windows are aligned to it, so a
/// minute's window could roll over between two calls of the test.
fn config() -> Config {
    Config::new().domain(
        Domain::new("edge")
            .descriptor(Descriptor::new("api_key").rate_limit(RateLimit::per(2, Unit::Hour)))
            .descriptor(Descriptor::new("path").rate_limit(RateLimit::per(10, Unit::Hour))),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_counts_every_hit_as_the_peer_and_follows_the_failure_rule() {
    let mut redis = RedisProcess::start(&[]);
    let server = start_with(
        store(&redis.url(), OnError::Deny).await,
        config().failure_mode(OnError::Deny),
    )
    .await;
    let mut c = server.client().await;
    let both: &[&[(&str, &str)]] = &[&[("api_key", "k")], &[("path", "/p")]];
    for i in 0..4 {
        let r = c.should_rate_limit(request("edge", both)).await.unwrap();
        assert_eq!(r.overall_code, if i < 2 { OK } else { OVER }, "call {i}");
        // A request over the limit is counted by every descriptor, as the peer counts it.
        assert_eq!(r.statuses[1].limit_remaining, 9 - i);
    }
    let r = c.should_rate_limit(request("edge", both)).await.unwrap();
    assert!(header(&r, "Retry-After").is_some());

    // Redis gone: the one failure rule decides. Deny: UNAVAILABLE, for Envoy's
    // failure_mode_deny (never OVER_LIMIT: nobody knows the quota); Allow: OK with no limits.
    redis.kill();
    let status = c
        .should_rate_limit(request("edge", &[&[("api_key", "new")]]))
        .await
        .err();
    assert_eq!(
        status.map(|s| s.code()),
        Some(tonic::Code::Unavailable),
        "fail closed"
    );
    drop(server);
    let redis = RedisProcess::start(&[]);
    let allow = start_with(
        store(&redis.url(), OnError::Allow).await,
        config().failure_mode(OnError::Allow),
    )
    .await;
    drop(redis);
    let mut c = allow.client().await;
    let r = c
        .should_rate_limit(request("edge", &[&[("api_key", "new")]]))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OK);
    // Nothing was counted, so no quota is reported.
    assert!(r.response_headers_to_add.is_empty(), "{r:?}");
}
