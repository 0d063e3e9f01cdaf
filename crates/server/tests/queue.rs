//! The `queue` action on the memory store, through the real proxy to a recording upstream:
//! over-rate requests answered 202 and delivered once with their idempotency key, unchanged;
//! `delivering` while the upstream holds one; 413, and 429 with `Retry-After` for a full queue;
//! a 4xx final, a 5xx or a timeout tried again, an upstream that reads a delivery on a pooled
//! connection and hangs up read once per attempt, a poison message in the dead letters until
//! re-driven from the admin API, with the gauges; the other policies charged when a request is
//! queued.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod queue_common;

use common::*;
use hyper::StatusCode;
use queue_common::*;

#[tokio::test]
async fn over_rate_requests_are_accepted_then_delivered_once_with_their_idempotency_key() {
    let up = Recorder::start().await;
    let s = start_text(&queue_config(up.addr, "20/s", "", "")).await;
    let proxy = s.proxy.unwrap();
    let bodies: Vec<String> = (0..6).map(|n| format!("{{\"n\":{n}}}")).collect();
    let requests: Vec<(&str, &str, &str)> = bodies
        .iter()
        .map(|b| ("/hooks/a?x=1", "t1", b.as_str()))
        .collect();
    let answers = burst(proxy, &requests).await;
    // The first goes straight through; the rest of the burst is over the rate.
    assert_eq!(answers[0].status, 200, "{:?}", answers[0]);
    let mut ids = Vec::new();
    for (n, r) in answers.iter().enumerate().skip(1) {
        assert!(r.header("x-ratelimit-limit").is_some(), "{r:?}");
        assert_eq!(r.header("content-type"), Some("application/json"));
        ids.push((n, raw_accepted_id(r)));
    }
    for (n, id) in &ids {
        let status = wait_state(proxy, id, "delivered").await;
        assert_eq!(status["status"], 200);
        assert_eq!(status["attempts"], 1);
        assert_eq!(status["policy"], "hooks");
        let got = up.with_key(id);
        assert_eq!(got.len(), 1, "{id} delivered {} times", got.len());
        let a = &got[0];
        assert_eq!(a.method, "POST");
        assert_eq!(a.target, "/hooks/a?x=1");
        assert_eq!(a.body, bodies[*n]);
        assert_eq!(a.header("content-type"), Some("application/json"));
        assert_eq!(a.header("host"), Some("hooks.test"));
        assert_eq!(a.header("x-tenant"), Some("t1"));
        assert_eq!(a.header("x-forwarded-for"), Some("127.0.0.1"));
    }
    assert_eq!(up.arrivals().len(), 6);
    let metrics = get(&s.admin_url("/metrics"), &[]).await;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    for line in [
        "tollgate_queue_enqueued_total{policy=\"hooks\"} 5",
        "tollgate_queue_deliveries_total{policy=\"hooks\",result=\"delivered\"} 5",
        "tollgate_queue_retries_total{policy=\"hooks\"} 0",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
    s.stop().await;
}

#[tokio::test]
async fn the_client_idempotency_key_and_expect_are_replaced_and_chunked_bodies_stored_whole() {
    let up = Recorder::start().await;
    let s = start_text(&queue_config(up.addr, "1/2s", "", "")).await;
    let proxy = s.proxy.unwrap();
    let mut c = common::raw::Client::connect(proxy).await;
    c.send("POST /hooks/k HTTP/1.1\r\nHost: a\r\nX-Tenant: t\r\nContent-Length: 0\r\n\r\n")
        .await;
    assert_eq!(c.response().await.status, 200);
    // Over the rate (one per 2 s): queued. The client waits for 100 Continue.
    c.send(
        "POST /hooks/k HTTP/1.1\r\nHost: a\r\nX-Tenant: t\r\nIdempotency-Key: mine\r\n\
         Expect: 100-continue\r\nConnection: keep-alive, x-drop\r\nX-Drop: 1\r\n\
         Transfer-Encoding: chunked\r\n\r\n",
    )
    .await;
    c.send("5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nx-trailer: t\r\n\r\n")
        .await;
    let r = c.response().await;
    assert_eq!(r.interim, [100], "{r:?}");
    let id = raw_accepted_id(&r);
    let status = get(&format!("http://{proxy}/v1/queue/{id}"), &[]).await;
    assert_eq!(status.header("cache-control"), Some("no-store"));
    wait_state(proxy, &id, "delivered").await;
    let got = up.with_key(&id);
    assert_eq!(got.len(), 1);
    let a = &got[0];
    assert_eq!(a.body, "hello world");
    assert_eq!(a.header("content-length"), Some("11"));
    assert_eq!(a.headers.get_all("idempotency-key").iter().count(), 1);
    for gone in [
        "expect",
        "transfer-encoding",
        "x-drop",
        "x-trailer",
        "connection",
    ] {
        assert_eq!(a.header(gone), None, "{gone}: {:?}", a.headers);
    }
    assert_eq!(up.arrivals().len(), 2);
    s.stop().await;
}

#[tokio::test]
async fn a_queued_request_reaches_the_upstream_unchanged() {
    cases::a_queued_request_reaches_the_upstream_unchanged("").await;
}

#[tokio::test]
async fn delivering_lasts_while_the_upstream_holds_the_request() {
    cases::delivering_lasts_while_the_upstream_holds_the_request("").await;
}

#[tokio::test]
async fn an_upstream_that_stalls_past_the_timeout_gets_the_request_again() {
    let up = Recorder::start().await;
    // The first delivery gets no answer and its connection stays open: only the timeout ends it.
    up.stall("/hooks/slow", 1);
    let extra = "queue_backoff = \"10ms\"\n";
    let s = start_text(&queue_config_timeout(up.addr, "300ms", "2/s", extra, "")).await;
    let proxy = s.proxy.unwrap();
    let answers = burst(proxy, &[("/hooks/ok", "t", "0"), ("/hooks/slow", "t", "1")]).await;
    assert_eq!(answers[0].status, 200, "{:?}", answers[0]);
    let id = raw_accepted_id(&answers[1]);
    let status = wait_state(proxy, &id, "delivered").await;
    assert_eq!(
        (status["status"].as_u64(), status["attempts"].as_u64()),
        (Some(200), Some(2)),
        "{status}"
    );
    // The stalled attempt and the one after it, with the same key and the same request.
    let got = up.with_key(&id);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(
        (got[0].body.as_ref(), got[1].body.as_ref()),
        (&b"1"[..], &b"1"[..])
    );
    for (series, value) in [
        ("tollgate_queue_retries_total{policy=\"hooks\"}", 1.0),
        (
            "tollgate_queue_deliveries_total{policy=\"hooks\",result=\"delivered\"}",
            1.0,
        ),
        ("tollgate_queue_dead_letters_total{policy=\"hooks\"}", 0.0),
    ] {
        assert_eq!(metric(s.admin, series).await, value, "{series}");
    }
    s.stop().await;
}

#[tokio::test]
async fn an_upstream_that_reads_a_delivery_then_hangs_up_reads_it_once_per_attempt() {
    let up = Recorder::start().await;
    // The first delivery of /hooks/gone is read whole, then its connection closes unanswered:
    // the upstream may have acted on it, so it is not sent again until its next attempt.
    up.hang_up("/hooks/gone", 1);
    let extra = "queue_backoff = \"10ms\"\n";
    let s = start_text(&queue_config(up.addr, "5/s", extra, "")).await;
    let proxy = s.proxy.unwrap();
    let answers = burst(
        proxy,
        &[
            ("/hooks/ok", "t", "0"),
            ("/hooks/ok", "t", "1"),
            ("/hooks/gone", "t", "2"),
        ],
    )
    .await;
    assert_eq!(answers[0].status, 200, "{:?}", answers[0]);
    let ok = raw_accepted_id(&answers[1]);
    let gone = raw_accepted_id(&answers[2]);
    wait_state(proxy, &ok, "delivered").await;
    let status = wait_state(proxy, &gone, "delivered").await;
    let got = up.with_key(&gone);
    // Read once per attempt, and the status counts every read as an attempt.
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(
        (status["status"].as_u64(), status["attempts"].as_u64()),
        (Some(200), Some(2)),
        "{status}"
    );
    // The first went out on the pooled connection of the delivery before it.
    let before = up.with_key(&ok);
    assert_eq!(got[0].conn, before[0].conn, "not on a reused connection");
    assert_ne!(got[1].conn, got[0].conn);
    assert_eq!(
        (got[0].body.as_ref(), got[1].body.as_ref()),
        (&b"2"[..], &b"2"[..])
    );
    // The second attempt took a slot of its own (one every 200 ms), not an immediate resend.
    let gap = got[1].at - got[0].at;
    assert!(gap >= std::time::Duration::from_millis(50), "{gap:?}");
    for (series, value) in [
        ("tollgate_queue_retries_total{policy=\"hooks\"}", 1.0),
        (
            "tollgate_queue_deliveries_total{policy=\"hooks\",result=\"delivered\"}",
            2.0,
        ),
        ("tollgate_queue_dead_letters_total{policy=\"hooks\"}", 0.0),
    ] {
        assert_eq!(metric(s.admin, series).await, value, "{series}");
    }
    s.stop().await;
}

#[tokio::test]
async fn too_large_bodies_are_413_and_a_full_queue_is_429_with_retry_after() {
    let up = Recorder::start().await;
    // One delivery a minute: whatever is queued stays queued for the test.
    let extra = "queue_max_body = 10\nqueue_max_depth = 2\n";
    let s = start_text(&queue_config(up.addr, "1/1m", extra, "")).await;
    let proxy = s.proxy.unwrap();
    let answers = burst(
        proxy,
        &[
            ("/hooks/x", "t", "first"),
            ("/hooks/x", "t", "0123456789"),
            ("/hooks/x", "t", ""),
            ("/hooks/x", "t", "x"),
        ],
    )
    .await;
    assert_eq!(answers[0].status, 200);
    let queued = [raw_accepted_id(&answers[1]), raw_accepted_id(&answers[2])];
    let full = &answers[3];
    assert_eq!(full.status, 429, "{full:?}");
    assert_eq!(full.header("retry-after"), Some("60"));
    assert!(full.body().contains("Queue full"), "{full:?}");
    // Too large: refused before its body is read, and the connection closes.
    let big = send(
        "POST",
        &format!("http://{proxy}/hooks/x"),
        &[("x-tenant", "t")],
        "eleven byte",
    )
    .await;
    assert_eq!(big.status, StatusCode::PAYLOAD_TOO_LARGE, "{:?}", big.body);
    for id in &queued {
        let r = get(&format!("http://{proxy}/v1/queue/{id}"), &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        let state = r.json()["state"].as_str().unwrap().to_owned();
        assert!(
            ["queued", "delivering"].contains(&state.as_str()),
            "{state}"
        );
    }
    // Only the first request reached the upstream.
    assert_eq!(up.arrivals().len(), 1);
    let metrics = get(&s.admin_url("/metrics"), &[]).await;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    for line in [
        "tollgate_queue_refused_total{policy=\"hooks\",reason=\"full\"} 1",
        "tollgate_queue_refused_total{policy=\"hooks\",reason=\"too_large\"} 1",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
    s.stop().await;
}

#[tokio::test]
async fn a_4xx_is_final_and_a_poison_message_ends_in_the_dead_letters_until_redriven() {
    let up = Recorder::start().await;
    up.answer("/hooks/bad", 422);
    up.answer("/hooks/poison", 500);
    let extra = "queue_attempts = 3\nqueue_backoff = \"10ms\"\n";
    let s = start_text(&queue_config(up.addr, "20/s", extra, "")).await;
    let proxy = s.proxy.unwrap();
    let answers = burst(
        proxy,
        &[
            ("/hooks/ok", "t", "1"),
            ("/hooks/bad", "t", "2"),
            ("/hooks/poison", "t", "3"),
        ],
    )
    .await;
    assert_eq!(answers[0].status, 200);
    let bad = raw_accepted_id(&answers[1]);
    let poison = raw_accepted_id(&answers[2]);

    let status = wait_state(proxy, &bad, "delivered").await;
    assert_eq!(
        (status["status"].as_u64(), status["attempts"].as_u64()),
        (Some(422), Some(1))
    );
    assert_eq!(up.with_key(&bad).len(), 1);

    let status = wait_state(proxy, &poison, "dead").await;
    assert_eq!(
        (status["status"].as_u64(), status["attempts"].as_u64()),
        (Some(500), Some(3))
    );
    assert_eq!(up.with_key(&poison).len(), 3);
    let dead = get(&s.admin_url("/v1/queues/hooks/dead"), &[]).await;
    assert_eq!(dead.status, StatusCode::OK);
    let list = dead.json()["dead_letters"].clone();
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(list[0]["id"], poison.as_str());
    assert_eq!(list[0]["method"], "POST");
    assert_eq!(list[0]["target"], "/hooks/poison");
    assert_eq!(list[0]["attempts"], 3);
    assert_eq!(list[0]["status"], 500);
    let queues = get(&s.admin_url("/v1/queues"), &[]).await.json();
    assert_eq!(queues["queues"][0]["policy"], "hooks");
    assert_eq!(queues["queues"][0]["durable"], false);
    // The gauge counts the dead letter (the store is read every second).
    metric_until(s.admin, cases::DEAD, |v| v == 1.0).await;

    let metrics = get(&s.admin_url("/metrics"), &[]).await;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    for line in [
        "tollgate_queue_dead_letters_total{policy=\"hooks\"} 1",
        "tollgate_queue_retries_total{policy=\"hooks\"} 2",
        "tollgate_queue_deliveries_total{policy=\"hooks\",result=\"refused\"} 1",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }

    // The upstream is fixed: re-driven, the message goes with the same key and fresh attempts.
    up.answer("/hooks/poison", 200);
    let wrong = send(
        "POST",
        &s.admin_url("/v1/queues/hooks/dead/0123/redrive"),
        &[],
        "",
    )
    .await;
    assert_eq!(wrong.status, StatusCode::NOT_FOUND);
    let redrive = send(
        "POST",
        &s.admin_url(&format!("/v1/queues/hooks/dead/{poison}/redrive")),
        &[],
        "",
    )
    .await;
    assert_eq!(redrive.status, StatusCode::OK, "{:?}", redrive.body);
    let status = wait_state(proxy, &poison, "delivered").await;
    assert_eq!(
        (status["status"].as_u64(), status["attempts"].as_u64()),
        (Some(200), Some(1))
    );
    assert_eq!(up.with_key(&poison).len(), 4);
    let dead = get(&s.admin_url("/v1/queues/hooks/dead"), &[]).await.json();
    assert_eq!(dead["dead_letters"].as_array().map(Vec::len), Some(0));
    // The gauge falls with it; the counter of messages that died stays.
    metric_until(s.admin, cases::DEAD, |v| v == 0.0).await;
    assert_eq!(
        metric(
            s.admin,
            "tollgate_queue_dead_letters_total{policy=\"hooks\"}"
        )
        .await,
        1.0
    );
    s.stop().await;
}

#[tokio::test]
async fn queueing_charges_the_other_policies_and_check_api_answers_429() {
    let up = Recorder::start().await;
    let other = "[[policy]]\nname = \"per-tenant\"\nalgorithm = \"fixed_window\"\nlimit = 3\n\
                 window = \"1h\"\nkey = [\"header:x-tenant\"]\nmatch = { path = \"/hooks/**\" }\n";
    let s = start_text(&queue_config(up.addr, "1/1m", "", other)).await;
    let proxy = s.proxy.unwrap();
    let answers = burst(
        proxy,
        &[
            ("/hooks/c", "t", "1"),
            ("/hooks/c", "t", "2"),
            ("/hooks/c", "t", "3"),
            ("/hooks/c", "t", "4"),
        ],
    )
    .await;
    let statuses: Vec<u16> = answers.iter().map(|r| r.status).collect();
    // One passes, two are queued (each counted by the fixed window), the fourth is over it.
    assert_eq!(statuses, [200, 202, 202, 429]);
    assert!(answers[3].body().contains("per-tenant"), "{:?}", answers[3]);
    // The decision API cannot queue: the queue policy's denial is a 429 there.
    let attrs = r#"{"method": "POST", "path": "/hooks/c", "headers": {"x-tenant": "u"}}"#;
    assert_eq!(
        post_json(&s.url("/v1/check"), attrs).await.status,
        StatusCode::OK
    );
    let r = post_json(&s.url("/v1/check"), attrs).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{:?}", r.body);
    s.stop().await;
}

#[tokio::test]
async fn queue_status_paths_are_the_upstreams_without_a_queue_policy() {
    let up = Recorder::start().await;
    let s = start_text(&queue_config(up.addr, "5/s", "", "")).await;
    let proxy = s.proxy.unwrap();
    let r = get(
        &format!("http://{proxy}/v1/queue/00000000000000000000000000000000"),
        &[],
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = get(&format!("http://{proxy}/v1/queue/../../etc/passwd"), &[]).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert!(up.arrivals().is_empty());
    s.stop().await;

    let plain = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{}\"\n",
        up.addr
    );
    let s = start_text(&plain).await;
    let r = get(&format!("http://{}/v1/queue/abc", s.proxy.unwrap()), &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(up.arrivals().len(), 1);
    s.stop().await;
}
