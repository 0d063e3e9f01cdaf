//! `grpc.health.v1.Health` on the server's Envoy listener over a real Redis: `Watch` streams
//! SERVING while Redis answers, NOT_SERVING once it is gone, SERVING again when it is back on
//! the same port, and `Check` and `/readyz` say the same. Needs `redis-server`
//! (`scripts/test.sh` installs it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../../redis/tests/common/mod.rs"]
mod redis_harness;

use std::time::Duration;

use common::*;
use hyper::StatusCode;
use redis_harness::RedisServer;
use tollgate_envoy::RlsClient;
use tollgate_envoy::proto::grpc::health::v1::HealthCheckResponse;
use tollgate_envoy::proto::grpc::health::v1::health_check_response::ServingStatus;

const SERVING: i32 = ServingStatus::Serving as i32;
const NOT_SERVING: i32 = ServingStatus::NotServing as i32;

/// The next status on `stream`, within a deadline generous enough for a loaded machine.
async fn next(stream: &mut tonic::Streaming<HealthCheckResponse>) -> i32 {
    tokio::time::timeout(Duration::from_secs(30), stream.message())
        .await
        .expect("a status change within the deadline")
        .unwrap()
        .expect("the stream goes on")
        .status
}

#[tokio::test]
async fn watch_follows_redis_going_away_and_coming_back() {
    let mut redis = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("tollgate-grpc-health-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit:\n      unit: hour\n      requests_per_unit: 10\n",
    )
    .unwrap();
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ngrpc_listen = \"127.0.0.1:0\"\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n\n\
         [store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"200ms\"\n\n\
         [envoy]\nconfig_dir = {:?}\n",
        redis.url(),
        dir
    );
    let s = start(tollgate_server::Config::parse("t.toml", &text).unwrap()).await;
    let mut client = RlsClient::connect(format!("http://{}", s.grpc.unwrap()))
        .await
        .unwrap();
    let mut watch = client.health_watch("").await.unwrap();
    let mut rls = client
        .health_watch(tollgate_envoy::RLS_SERVICE_NAME)
        .await
        .unwrap();
    assert_eq!(next(&mut watch).await, SERVING);
    assert_eq!(next(&mut rls).await, SERVING);
    assert_eq!(client.health_check("").await.unwrap().status, SERVING);

    redis.kill();
    assert_eq!(next(&mut watch).await, NOT_SERVING);
    assert_eq!(next(&mut rls).await, NOT_SERVING);
    assert_eq!(client.health_check("").await.unwrap().status, NOT_SERVING);
    let ready = get(&s.admin_url("/readyz"), &[]).await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);

    redis.restart();
    assert_eq!(next(&mut watch).await, SERVING);
    assert_eq!(next(&mut rls).await, SERVING);
    assert_eq!(client.health_check("").await.unwrap().status, SERVING);
    assert_eq!(
        get(&s.admin_url("/readyz"), &[]).await.status,
        StatusCode::OK
    );

    // At shutdown the watchers hear NOT_SERVING, then their streams end.
    let stopping = tokio::spawn(s.stop());
    assert_eq!(next(&mut watch).await, NOT_SERVING);
    let end = tokio::time::timeout(Duration::from_secs(30), watch.message()).await;
    assert!(matches!(end, Ok(Ok(None))), "{end:?}");
    stopping.await.unwrap();
}
