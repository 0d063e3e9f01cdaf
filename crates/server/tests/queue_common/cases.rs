//! Test bodies of the `queue` action written once and run on each store (`queue.rs` in memory,
//! `queue_redis.rs` over Redis): what "delivering" means, with the queue's gauges, and a queued
//! request reaching the upstream byte for byte as the client sent it.

use hyper::HeaderMap;
use serde_json::Value;

use super::*;
use crate::common::raw::Client;
use crate::common::{get, start_text};

pub const DEPTH: &str = "tollgate_queue_depth{policy=\"hooks\"}";
pub const OLDEST: &str = "tollgate_queue_oldest_age_seconds{policy=\"hooks\"}";
pub const DEAD: &str = "tollgate_queue_dead_letter_depth{policy=\"hooks\"}";

/// While the upstream holds a delivery, the message is `delivering` (not queued, not yet
/// delivered), and the gauges count it as one message that has waited; once the upstream
/// answers, it is `delivered` with that status and the gauges fall to 0. `store` is the
/// configuration's store section ("" for memory).
pub async fn delivering_lasts_while_the_upstream_holds_the_request(store: &str) {
    let up = Recorder::start().await;
    let gate = up.hold("/hooks/held");
    up.answer("/hooks/held", 201);
    // A minute's timeout: however slow the machine, the held delivery is not given up while the
    // test looks at it. Two a second: the second request of the burst is over the rate even
    // when the first one's round trip is slow.
    let config = queue_config_timeout(up.addr, "1m", "2/s", "", store);
    let s = start_text(&config).await;
    let (proxy, admin) = (s.proxy.unwrap(), s.admin);
    let answers = burst(
        proxy,
        &[("/hooks/live", "t", "0"), ("/hooks/held", "t", "1")],
    )
    .await;
    assert_eq!(answers[0].status, 200, "{:?}", answers[0]);
    let id = raw_accepted_id(&answers[1]);

    eventually("the upstream holds the delivery", || {
        up.with_key(&id).len() == 1
    })
    .await;
    // The upstream has the request and has not answered: its delivery is under way.
    let status = get(&format!("http://{proxy}/v1/queue/{id}"), &[])
        .await
        .json();
    assert_eq!(status["state"], "delivering", "{status}");
    assert_eq!(status["attempts"], 1, "{status}");
    assert_eq!(status["status"], Value::Null, "{status}");
    // The gauges (read from the store every second) count it, and it has been waiting.
    metric_until(admin, DEPTH, |v| v == 1.0).await;
    metric_until(admin, OLDEST, |v| v > 0.0).await;

    gate.release();
    let status = wait_state(proxy, &id, "delivered").await;
    assert_eq!(
        (status["status"].as_u64(), status["attempts"].as_u64()),
        (Some(201), Some(1)),
        "{status}"
    );
    assert_eq!(up.with_key(&id).len(), 1);
    metric_until(admin, DEPTH, |v| v == 0.0).await;
    metric_until(admin, OLDEST, |v| v == 0.0).await;
    s.stop().await;
}

/// The request both times: a method other than POST, a query string, repeated, quoted and
/// non-ASCII headers, credentials, and a binary body that holds bytes looking like HTTP.
fn odd_request() -> Vec<u8> {
    let body: Vec<u8> = (0..=255u8)
        .chain(*b"\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n")
        .collect();
    let mut request = format!(
        "PATCH /hooks/a?x=1&y=2&q=a%2Fb%20c&flag HTTP/1.1\r\nHost: hooks.test\r\n\
         X-Tenant: t1\r\nUser-Agent: webhook-sender/1.0 (+https://sender.test)\r\n\
         Accept: application/json, */*;q=0.5\r\nAuthorization: Bearer s3cr3t\r\n\
         Cookie: a=1; b=2\r\nX-Multi: one\r\nX-Multi: two, three\r\n\
         X-Quoted: \"a, b\"; q=\"c\\\"d\"\r\nX-Utf8: caf\u{e9}\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);
    request
}

/// Every header of `headers` but `except`, as (name, value) pairs sorted by name (the values of
/// one name in their order).
fn header_list(headers: &HeaderMap, except: &str) -> Vec<(String, Vec<u8>)> {
    let mut list: Vec<(String, Vec<u8>)> = headers
        .iter()
        .filter(|(name, _)| name.as_str() != except)
        .map(|(name, value)| (name.to_string(), value.as_bytes().to_vec()))
        .collect();
    list.sort_by(|a, b| a.0.cmp(&b.0));
    list
}

/// A queued request reaches the upstream as the client sent it: method, target with its query,
/// every header and the body unchanged, and with exactly the head the same request got when it
/// went straight through, plus its idempotency key.
pub async fn a_queued_request_reaches_the_upstream_unchanged(store: &str) {
    let up = Recorder::start().await;
    let s = start_text(&queue_config(up.addr, "2/s", "", store)).await;
    let proxy = s.proxy.unwrap();
    let request = odd_request();
    // The same request twice, pipelined: the first goes straight through, the second is over
    // the rate and queued.
    let mut c = Client::connect(proxy).await;
    c.send([request.as_slice(), request.as_slice()].concat())
        .await;
    let live = c.response().await;
    assert_eq!(live.status, 200, "{live:?}");
    let id = raw_accepted_id(&c.response().await);
    wait_state(proxy, &id, "delivered").await;

    let arrivals = up.arrivals();
    assert_eq!(arrivals.len(), 2, "{arrivals:?}");
    let passed = &arrivals[0];
    assert_eq!(passed.key(), None);
    let delivered = &arrivals[1];
    assert_eq!(delivered.key(), Some(id.as_str()));
    let body_at = request.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    for a in [passed, delivered] {
        assert_eq!(a.method, "PATCH");
        assert_eq!(a.target, "/hooks/a?x=1&y=2&q=a%2Fb%20c&flag");
        assert_eq!(a.body, request[body_at..]);
        let values = |name: &str| -> Vec<&[u8]> {
            a.headers
                .get_all(name)
                .iter()
                .map(|v| v.as_bytes())
                .collect()
        };
        for (name, value) in [
            ("host", &b"hooks.test"[..]),
            ("x-tenant", b"t1"),
            ("user-agent", b"webhook-sender/1.0 (+https://sender.test)"),
            ("accept", b"application/json, */*;q=0.5"),
            ("authorization", b"Bearer s3cr3t"),
            ("cookie", b"a=1; b=2"),
            ("x-quoted", b"\"a, b\"; q=\"c\\\"d\""),
            ("x-utf8", "caf\u{e9}".as_bytes()),
            ("content-type", b"application/octet-stream"),
        ] {
            assert_eq!(values(name), [value], "{name}");
        }
        assert_eq!(values("x-multi"), [&b"one"[..], b"two, three"]);
    }
    assert_eq!(
        header_list(&delivered.headers, "idempotency-key"),
        header_list(&passed.headers, "idempotency-key"),
        "the delivered head differs from the one that went straight through"
    );
    s.stop().await;
}
