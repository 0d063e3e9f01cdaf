//! The server over a real Redis: two instances share one count, `/readyz` follows Redis,
//! `on_error = "allow"` keeps serving when Redis goes away, an expired override leaves Redis,
//! and overrides and list entries keep applying after Redis lost its data. Needs
//! `redis-server` (`scripts/test.sh` installs it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../../redis/tests/common/mod.rs"]
mod redis_harness;

use common::*;
use hyper::StatusCode;
use redis_harness::RedisServer;
use serde_json::json;
use tollgate_testkit::redis::RedisProcess;

#[tokio::test]
async fn two_instances_share_one_redis_count() {
    let mut redis = RedisProcess::start(&[]);
    let text = format!(
        "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{}\"\ntimeout = \"100ms\"\non_error = \"allow\"\n\n[[policy]]\nname = \"api\"\nalgorithm = \"sliding_window_counter\"\nlimit = 3\nwindow = \"1m\"\nkey = [\"header:x-api-key\"]\n",
        redis.port()
    );
    let a = start_text(&text).await;
    let b = start_text(&text).await;
    assert_eq!(
        get(&a.admin_url("/readyz"), &[]).await.status,
        StatusCode::OK
    );
    let req = r#"{"path":"/v1/x","headers":{"x-api-key":"shared"}}"#;
    let mut statuses = Vec::new();
    for s in [&a, &b, &a, &b] {
        statuses.push(post_json(&s.url("/v1/check"), req).await.status);
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    // By policy and key, too.
    let r = post_json(&b.url("/v1/check"), r#"{"policy":"api","key":"k"}"#).await;
    assert_eq!(r.json()["remaining"], 2);
    let r = post_json(&a.url("/v1/check"), r#"{"policy":"api","key":"k"}"#).await;
    assert_eq!(r.json()["remaining"], 1);

    // Redis goes away: not ready, and on_error = "allow" keeps admitting.
    redis.kill();
    let r = get(&a.admin_url("/readyz"), &[]).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    let r = post_json(
        &a.url("/v1/check"),
        r#"{"path":"/v1/x","headers":{"x-api-key":"other"}}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let m = get(&a.admin_url("/metrics"), &[]).await;
    let text = String::from_utf8_lossy(&m.body).into_owned();
    assert!(text.contains("tollgate_store_fallbacks_total"), "{text}");
    assert!(!text.contains("tollgate_store_errors_total 0"), "{text}");
    a.stop().await;
    b.stop().await;
}

/// With `on_error = "local"` an instance whose Redis is away still decides every request, from
/// its own memory: `/readyz` keeps it in its Service, saying why, and the quota still holds.
#[tokio::test]
async fn on_error_local_stays_ready_without_redis() {
    let mut redis = RedisProcess::start(&[]);
    let text = format!(
        "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{}\"\ntimeout = \"100ms\"\non_error = \"local\"\n\n[[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 2\nwindow = \"1m\"\nkey = [\"header:x-api-key\"]\n",
        redis.port()
    );
    let s = start_text(&text).await;
    let ready = get(&s.admin_url("/readyz"), &[]).await;
    assert_eq!(
        (ready.status, &ready.body[..]),
        (StatusCode::OK, &b"ready\n"[..])
    );
    redis.kill();
    let ready = get(&s.admin_url("/readyz"), &[]).await;
    assert_eq!(ready.status, StatusCode::OK);
    let said = String::from_utf8_lossy(&ready.body);
    assert!(
        said.starts_with("ready: deciding locally (on_error = \"local\"); store unreachable:"),
        "{said}"
    );
    let req = r#"{"policy":"api","key":"k"}"#;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(post_json(&s.url("/v1/check"), req).await.status);
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    s.stop().await;
}

/// An override set with `expires` stops applying when it ends, and its field leaves Redis by
/// the instances' next poll: no later change is needed to remove it.
#[tokio::test]
async fn an_expired_override_leaves_redis() {
    let redis = RedisServer::start();
    let text = format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"200ms\"\n\n[[policy]]\nname = \"api\"\nlimit = 10\nwindow = \"1m\"\nkey = [\"ip\"]\n",
        redis.url()
    );
    let s = start_text(&text).await;
    let r = send(
        "PUT",
        &s.admin_url("/v1/overrides/api/ip:203.0.113.5"),
        &[("content-type", "application/json")],
        json!({"limit": 3, "reason": "for a second", "expires": "1s"}).to_string(),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let fields = || redis.command(&["HLEN", "tg:{overrides}"]).unwrap();
    assert_eq!(fields().trim(), "1");
    wait_for(|| async { fields().trim() == "0" }).await;
    let listed = get(&s.admin_url("/v1/overrides"), &[]).await.json();
    assert_eq!(listed["overrides"], json!([]));
    s.stop().await;
}

/// Redis loses its data (a restart without persistence, a flush, a failover to a replica that
/// was behind): the overrides and live list entries it held are gone for every instance, and
/// the ones set afterwards apply on every instance, the one that set them at once, even when
/// they are set before the instances' next poll.
#[tokio::test]
async fn overrides_and_lists_apply_after_redis_lost_its_data() {
    let redis = RedisServer::start();
    let text = format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"200ms\"\n\n[[policy]]\nname = \"api\"\nlimit = 10\nwindow = \"1m\"\nkey = [\"ip\"]\n\n[[list]]\nname = \"blocked\"\naction = \"deny\"\nips = []\n",
        redis.url()
    );
    let a = start_text(&text).await;
    let b = start_text(&text).await;
    let put = |s: &Running, path: &str, body: serde_json::Value| {
        let url = s.admin_url(path);
        async move {
            send(
                "PUT",
                &url,
                &[("content-type", "application/json")],
                body.to_string(),
            )
            .await
            .status
        }
    };
    let limit = |s: &Running, ip: &str| {
        let url = s.url("/v1/check");
        let body = json!({"path": "/v1/x", "ip": ip}).to_string();
        async move {
            let r = post_json(&url, &body).await;
            (r.status, r.header("x-ratelimit-limit").map(str::to_owned))
        }
    };
    // Several changes before Redis loses them, so their versions are well past the first.
    for n in 1..=3 {
        let body = json!({"limit": n, "reason": "before"});
        let status = put(&a, "/v1/overrides/api/ip:203.0.113.5", body).await;
        assert!(status.is_success(), "{status}");
        let body = json!({"reason": format!("before {n}")});
        let status = put(&a, "/v1/lists/blocked/entries/198.51.100.1%2F32", body).await;
        assert!(status.is_success(), "{status}");
    }
    wait_for(|| async {
        limit(&b, "203.0.113.5").await.1.as_deref() == Some("3")
            && limit(&b, "198.51.100.1").await.0 == StatusCode::FORBIDDEN
    })
    .await;

    redis.command(&["FLUSHALL"]).unwrap();
    // Set at once, before any poll: the instance that takes a change applies it before it
    // answers, whatever versions it saw before Redis lost them.
    let body = json!({"limit": 2, "reason": "after"});
    assert_eq!(
        put(&a, "/v1/overrides/api/ip:203.0.113.6", body).await,
        StatusCode::CREATED
    );
    let body = json!({"reason": "after"});
    assert_eq!(
        put(&a, "/v1/lists/blocked/entries/198.51.100.2%2F32", body).await,
        StatusCode::CREATED
    );
    assert_eq!(
        limit(&a, "203.0.113.6").await,
        (StatusCode::OK, Some("2".to_owned()))
    );
    assert_eq!(limit(&a, "198.51.100.2").await.0, StatusCode::FORBIDDEN);
    // Every instance: what Redis lost no longer applies, what was set since does.
    for s in [&a, &b] {
        wait_for(|| async {
            limit(s, "203.0.113.5").await.1.as_deref() == Some("10")
                && limit(s, "203.0.113.6").await.1.as_deref() == Some("2")
                && limit(s, "198.51.100.1").await.0 != StatusCode::FORBIDDEN
                && limit(s, "198.51.100.2").await.0 == StatusCode::FORBIDDEN
        })
        .await;
        let listed = get(&s.admin_url("/v1/overrides"), &[]).await.json();
        assert_eq!(listed["overrides"].as_array().map(Vec::len), Some(1));
    }
    a.stop().await;
    b.stop().await;
}
