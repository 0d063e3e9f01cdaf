//! The server over a real Redis: two instances share one count, `/readyz` follows Redis, and
//! `on_error = "allow"` keeps serving when Redis goes away. Needs `redis-server`
//! (`scripts/test.sh` installs it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use hyper::StatusCode;

#[tokio::test]
async fn two_instances_share_one_redis_count() {
    let Some(mut redis) = common::redis::redis() else {
        panic!("redis-server could not be started: install redis-server (scripts/test.sh does)");
    };
    let text = format!(
        "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{}\"\ntimeout = \"100ms\"\non_error = \"allow\"\n\n[[policy]]\nname = \"api\"\nalgorithm = \"sliding_window_counter\"\nlimit = 3\nwindow = \"1m\"\nkey = [\"header:x-api-key\"]\n",
        redis.port
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
    let Some(mut redis) = common::redis::redis() else {
        panic!("redis-server could not be started: install redis-server (scripts/test.sh does)");
    };
    let text = format!(
        "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{}\"\ntimeout = \"100ms\"\non_error = \"local\"\n\n[[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 2\nwindow = \"1m\"\nkey = [\"header:x-api-key\"]\n",
        redis.port
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
