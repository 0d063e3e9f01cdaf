//! The `queue` action on Redis Streams, with real `redis-server` processes (the Redis crate's
//! harness): requests queued by one server are delivered once after it stops and another
//! starts on the same Redis, and a poison message ends in the dead letters, listed and
//! re-driven from any instance. The store-independent bodies of `queue_common::cases` too: a
//! queued request arrives unchanged, and is `delivering` while the upstream holds it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod queue_common;
#[path = "../../redis/tests/common/mod.rs"]
mod redis_harness;

use common::*;
use hyper::StatusCode;
use queue_common::*;
use redis_harness::RedisServer;

fn redis_store(redis: &RedisServer) -> String {
    format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"1s\"\n",
        redis.url()
    )
}

#[tokio::test]
async fn a_queued_request_reaches_the_upstream_unchanged() {
    let redis = RedisServer::start();
    cases::a_queued_request_reaches_the_upstream_unchanged(&redis_store(&redis)).await;
}

#[tokio::test]
async fn delivering_lasts_while_the_upstream_holds_the_request() {
    let redis = RedisServer::start();
    cases::delivering_lasts_while_the_upstream_holds_the_request(&redis_store(&redis)).await;
}

#[tokio::test]
async fn queued_requests_outlive_the_server_that_took_them() {
    let redis = RedisServer::start();
    let up = Recorder::start().await;
    // One delivery a minute: what the first server queues waits in Redis when it stops.
    let slow = queue_config(
        up.addr,
        "1/1m",
        "queue_claim_after = \"1s\"\n",
        &redis_store(&redis),
    );
    let s = start_text(&slow).await;
    let proxy = s.proxy.unwrap();
    let answers = burst(
        proxy,
        &[
            ("/hooks/r", "t", "0"),
            ("/hooks/r", "t", "1"),
            ("/hooks/r", "t", "2"),
            ("/hooks/r", "t", "3"),
        ],
    )
    .await;
    assert_eq!(answers[0].status, 200);
    let ids: Vec<String> = answers[1..].iter().map(raw_accepted_id).collect();
    let queues = get(&s.admin_url("/v1/queues"), &[]).await.json();
    assert_eq!(queues["queues"][0]["durable"], true);
    assert_eq!(queues["queues"][0]["depth"], 3);
    s.stop().await;
    assert_eq!(up.arrivals().len(), 1);

    // Another server, with room to deliver: it takes over what the first held, and the rest.
    let fast = queue_config(
        up.addr,
        "50/s",
        "queue_claim_after = \"1s\"\n",
        &redis_store(&redis),
    );
    let s = start_text(&fast).await;
    let proxy = s.proxy.unwrap();
    for (n, id) in ids.iter().enumerate() {
        let status = wait_state(proxy, id, "delivered").await;
        assert_eq!(status["status"], 200);
        let got = up.with_key(id);
        assert_eq!(got.len(), 1, "{id}: {got:?}");
        assert_eq!(got[0].body, (n + 1).to_string());
    }
    assert_eq!(up.arrivals().len(), 4);
    s.stop().await;
}

#[tokio::test]
async fn a_poison_message_ends_in_the_redis_dead_letters_and_any_instance_redrives_it() {
    let redis = RedisServer::start();
    let up = Recorder::start().await;
    up.answer("/hooks/poison", 503);
    let extra = "queue_attempts = 2\nqueue_backoff = \"10ms\"\n";
    let text = queue_config(up.addr, "20/s", extra, &redis_store(&redis));
    let a = start_text(&text).await;
    let b = start_text(&text).await;
    let answers = burst(
        a.proxy.unwrap(),
        &[("/hooks/ok", "t", "1"), ("/hooks/poison", "t", "2")],
    )
    .await;
    assert_eq!(answers[0].status, 200);
    let poison = raw_accepted_id(&answers[1]);
    // Either instance answers its status: it is in Redis.
    let status = wait_state(b.proxy.unwrap(), &poison, "dead").await;
    assert_eq!(
        (status["attempts"].as_u64(), status["status"].as_u64()),
        (Some(2), Some(503))
    );
    assert_eq!(up.with_key(&poison).len(), 2);
    let dead = get(&b.admin_url("/v1/queues/hooks/dead"), &[]).await.json();
    assert_eq!(dead["dead_letters"][0]["id"], poison.as_str());
    assert_eq!(dead["dead_letters"][0]["target"], "/hooks/poison");
    // A page cursor that is no entry is the caller's mistake (400), not a store failure.
    for bad in ["garbage", "-", "+", "1-", "1-2-3"] {
        let r = get(
            &b.admin_url(&format!("/v1/queues/hooks/dead?after={bad}")),
            &[],
        )
        .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "after={bad}");
        assert_eq!(r.json()["field"], "after", "after={bad}");
    }
    let r = get(&b.admin_url("/v1/queues/hooks/dead?after=0-0"), &[]).await;
    assert_eq!(r.json()["dead_letters"][0]["id"], poison.as_str());

    up.answer("/hooks/poison", 200);
    let r = send("POST", &b.admin_url("/v1/queues/hooks/redrive"), &[], "").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["redriven"], 1);
    let status = wait_state(a.proxy.unwrap(), &poison, "delivered").await;
    assert_eq!(status["attempts"], 1);
    assert_eq!(up.with_key(&poison).len(), 3);
    a.stop().await;
    b.stop().await;
}
