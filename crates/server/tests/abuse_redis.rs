//! Lockouts and live list entries on Redis, across two server instances sharing it: a client
//! banned through one is refused by the other at once and past its window, either lifts it for
//! both; a live deny entry set on one blocks on the other within a second (one poll), and its
//! removal unblocks. Needs `redis-server`; every wait has a deadline.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use hyper::StatusCode;
use serde_json::json;
use tollgate_testkit::redis::RedisProcess;

fn config(port: u16) -> String {
    format!(
        "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{port}\"\ntimeout = \"200ms\"\n\n\
         [[policy]]\nname = \"login\"\nalgorithm = \"fixed_window\"\nlimit = 2\nwindow = \"1s\"\n\
         key = [\"ip\"]\nmatch = {{ path = \"/login\" }}\n\
         ban = {{ after = 3, within = \"10s\", for = \"30s\" }}\n\n\
         [[policy]]\nname = \"api\"\nlimit = 100\nwindow = \"1m\"\nkey = [\"ip\"]\n\
         match = {{ path = \"/v1/**\" }}\n\n\
         [[list]]\nname = \"blocked\"\naction = \"deny\"\n"
    )
}

fn req(path: &str, ip: &str) -> String {
    json!({"path": path, "ip": ip}).to_string()
}

#[tokio::test]
async fn a_ban_on_one_instance_holds_on_the_other_until_lifted() {
    let redis = RedisProcess::start(&[]);
    let a = start_text(&config(redis.port())).await;
    let b = start_text(&config(redis.port())).await;
    let ip = "192.0.2.31";
    // Alternate between the instances: the denials count in Redis, wherever they land.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut n = 0u32;
    loop {
        let s = if n.is_multiple_of(2) { &a } else { &b };
        n += 1;
        let r = post_json(&s.url("/v1/check"), &req("/login", ip)).await;
        if r.status == StatusCode::TOO_MANY_REQUESTS && r.json()["banned"] == true {
            break;
        }
        assert!(Instant::now() < deadline, "never banned");
    }
    // Past the window, on both instances, the ban holds.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for s in [&a, &b] {
        let r = post_json(&s.url("/v1/check"), &req("/login", ip)).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.json()["banned"], true);
    }
    // Either instance lists it; lifting it on b lets the client in on a at once.
    let listed = get(&a.admin_url("/v1/bans"), &[]).await.json();
    assert_eq!(listed["bans"][0]["key"], format!("ip:{ip}"), "{listed}");
    assert_eq!(listed["bans"][0]["policy"], "login");
    let lift = send(
        "DELETE",
        &b.admin_url("/v1/bans/login/ip%3A192.0.2.31?reason=test"),
        &[],
        "",
    )
    .await;
    assert_eq!(lift.status, StatusCode::NO_CONTENT);
    let r = post_json(&a.url("/v1/check"), &req("/login", ip)).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(
        get(&b.admin_url("/v1/bans"), &[]).await.json()["bans"],
        json!([])
    );
    let metrics =
        String::from_utf8(get(&a.admin_url("/metrics"), &[]).await.body.to_vec()).unwrap();
    assert!(
        metrics.contains("# TYPE tollgate_bans_active gauge"),
        "{metrics}"
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn a_live_deny_entry_blocks_on_every_instance_within_a_poll() {
    let redis = RedisProcess::start(&[]);
    let a = start_text(&config(redis.port())).await;
    let b = start_text(&config(redis.port())).await;
    let ip = "198.51.100.23";
    assert_eq!(
        post_json(&b.url("/v1/check"), &req("/v1/x", ip))
            .await
            .status,
        StatusCode::OK
    );
    let started = Instant::now();
    let put = send(
        "PUT",
        &a.admin_url("/v1/lists/blocked/entries/198.51.100.0%2F24"),
        &[("content-type", "application/json")],
        json!({"reason": "abuse from this range"}).to_string(),
    )
    .await;
    assert_eq!(put.status, StatusCode::CREATED);
    assert_eq!(
        post_json(&a.url("/v1/check"), &req("/v1/x", ip))
            .await
            .status,
        StatusCode::FORBIDDEN,
        "the instance that took the change applies it before it answers"
    );
    wait_for(|| async {
        post_json(&b.url("/v1/check"), &req("/v1/x", ip))
            .await
            .status
            == StatusCode::FORBIDDEN
    })
    .await;
    println!(
        "a live entry reached the other instance after {:?}",
        started.elapsed()
    );
    let listed = get(&b.admin_url("/v1/lists/blocked"), &[]).await.json();
    assert_eq!(listed["live"][0]["entry"], "198.51.100.0/24", "{listed}");
    assert_eq!(listed["live"][0]["reason"], "abuse from this range");
    let del = send(
        "DELETE",
        &b.admin_url("/v1/lists/blocked/entries/198.51.100.0%2F24?reason=over"),
        &[],
        "",
    )
    .await;
    assert_eq!(del.status, StatusCode::NO_CONTENT);
    wait_for(|| async {
        post_json(&a.url("/v1/check"), &req("/v1/x", ip))
            .await
            .status
            == StatusCode::OK
    })
    .await;
    a.stop().await;
    b.stop().await;
}
