//! Hot-key leases through the server, on a real `redis-server`: a server that stops gives the
//! unspent units of its leases back, so the next instance on the same Redis can admit them
//! (without the hand-back they stay taken until the window ends).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "../../redis/tests/common/mod.rs"]
mod redis_harness;

use common::*;
use hyper::StatusCode;
use redis_harness::RedisServer;

/// A fixed window of 10 per 10 minutes on Redis; `lease` units per lease when given.
fn config(redis: &RedisServer, lease: &str) -> String {
    format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"1s\"\n\n\
         [[policy]]\nname = \"hot\"\nalgorithm = \"fixed_window\"\nlimit = 10\n\
         window = \"10m\"\n{lease}",
        redis.url()
    )
}

async fn admitted(server: &Running, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        let r = post_json(
            &server.url("/v1/check"),
            r#"{"policy":"hot","key":"tenant-1","cost":1}"#,
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
    let first = start_text(&config(&redis, "lease = 5\nlease_ttl = \"60s\"\n")).await;
    assert_eq!(admitted(&first, 1).await, 1);
    first.stop().await;

    // The next instance decides in Redis directly: 9 units remain, not 5.
    let second = start_text(&config(&redis, "")).await;
    assert_eq!(admitted(&second, 12).await, 9);
    second.stop().await;
}
