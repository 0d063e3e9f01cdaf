//! Hot-key leases through the server, on a real `redis-server`: a server that stops gives the
//! unspent units of its leases back, so the next instance on the same Redis can admit them
//! (without the hand-back they stay taken until the window ends); `/metrics` counts what the
//! leases took, spent, returned and hold, and Redis agrees.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../../redis/tests/common/mod.rs"]
mod redis_harness;

use std::time::Duration;

use common::*;
use hyper::StatusCode;
use redis_harness::{RedisServer, eventually};

/// A fixed window of `limit` per 10 minutes on Redis; `lease` units per lease when given.
fn config(redis: &RedisServer, limit: u32, lease: &str) -> String {
    format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"1s\"\n\n\
         [[policy]]\nname = \"hot\"\nalgorithm = \"fixed_window\"\nlimit = {limit}\n\
         window = \"10m\"\n{lease}",
        redis.url()
    )
}

async fn admitted(server: &Running, n: usize) -> usize {
    admitted_at(server, n, 1).await
}

/// Sends `n` checks of `cost` for one key; how many were admitted.
async fn admitted_at(server: &Running, n: usize, cost: u32) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        let r = post_json(
            &server.url("/v1/check"),
            &format!(r#"{{"policy":"hot","key":"tenant-1","cost":{cost}}}"#),
        )
        .await;
        if r.status == StatusCode::OK {
            ok += 1;
        } else {
            assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        }
    }
    ok
}

#[tokio::test]
async fn a_stopping_server_gives_its_unspent_lease_back() {
    let redis = RedisServer::start();
    // The first instance takes a lease of 5 for its first request and spends one unit of it.
    let first = start_text(&config(&redis, 10, "lease = 5\nlease_ttl = \"60s\"\n")).await;
    assert_eq!(admitted(&first, 1).await, 1);
    first.stop().await;

    // The next instance decides in Redis directly: 9 units remain, not 5.
    let second = start_text(&config(&redis, 10, "")).await;
    assert_eq!(admitted(&second, 12).await, 9);
    second.stop().await;
}

/// Policy "hot"'s lease counters on `/metrics`: grants, taken, spent, returned, held.
async fn lease_metrics(server: &Running) -> [u64; 5] {
    let r = get(&server.admin_url("/metrics"), &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    let text = String::from_utf8_lossy(&r.body).into_owned();
    let value = |name: &str| {
        let prefix = format!("{name}{{policy=\"hot\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} for policy hot in\n{text}"))
    };
    [
        value("tollgate_lease_grants_total"),
        value("tollgate_lease_units_taken_total"),
        value("tollgate_lease_units_spent_total"),
        value("tollgate_lease_units_returned_total"),
        value("tollgate_lease_units_held"),
    ]
}

/// The count Redis holds for the policy's one key ("<window end> <count>").
fn redis_count(redis: &RedisServer) -> Option<u64> {
    let keys = redis.command(&["--scan"])?;
    // The rate-limit key: "<prefix>:{<hash>}:<policy>".
    let key = keys.lines().find(|k| k.contains("}:"))?;
    let value = redis.command(&["GET", key])?;
    value.split_whitespace().nth(1)?.parse().ok()
}

#[tokio::test]
async fn metrics_count_what_leases_take_spend_and_return() {
    let redis = RedisServer::start();
    let server = start_text(&config(&redis, 100, "lease = 10\nlease_ttl = \"60s\"\n")).await;
    // One lease of 10 for the first request; the next two spend from it.
    assert_eq!(admitted(&server, 3).await, 3);
    assert_eq!(lease_metrics(&server).await, [1, 10, 3, 0, 7]);
    assert_eq!(
        redis_count(&redis),
        Some(10),
        "Redis counts the whole lease"
    );

    // A cost of 8 does not fit in the 7 held: they go back, and a lease of 10 comes.
    assert_eq!(admitted_at(&server, 1, 8).await, 1);
    let [grants, taken, spent, returned, held] = lease_metrics(&server).await;
    assert_eq!([grants, taken, spent, returned, held], [2, 20, 11, 7, 2]);
    assert_eq!(taken, spent + returned + held);
    // The return reaches Redis in the background.
    let landed = eventually(Duration::from_secs(5), || async {
        redis_count(&redis) == Some(taken - returned)
    })
    .await;
    assert!(
        landed,
        "Redis holds {:?}, not {}",
        redis_count(&redis),
        taken - returned
    );

    // At shutdown the 2 held go back too: Redis counts exactly what was spent.
    server.stop().await;
    assert_eq!(redis_count(&redis), Some(spent));
    let next = start_text(&config(&redis, 100, "")).await;
    assert_eq!(admitted_at(&next, 1, 89).await, 1);
    assert_eq!(admitted(&next, 1).await, 0, "the limit is reached: 11 + 89");
    next.stop().await;
}
