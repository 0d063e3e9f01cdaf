//! Concurrency limits behind the reverse proxy: a recording upstream holds each request for a
//! while and counts how many it serves at once. Ten clients at once against a limit of three:
//! rejected past three, or served three at a time in order of arrival with `delay`; a client
//! that goes away mid-response frees its slot at once, and one that leaves the line is never
//! forwarded; `/v1/check` acquire and `/v1/release`;
//! three instances on one Redis share the limit.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use hyper::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate_testkit::redis::RedisProcess;

/// What the upstream saw: requests in flight now and at most, and the order it began serving
/// clients in (by their `x-client` header).
#[derive(Default)]
struct Seen {
    now: AtomicUsize,
    max: AtomicUsize,
    order: std::sync::Mutex<Vec<u32>>,
}

/// An upstream that answers each request after holding it `hold`: the head, then half the
/// body, then (after `hold`) the rest, so a client can leave mid-response.
async fn recording_upstream(hold: Duration) -> (SocketAddr, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let state = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let seen = Arc::clone(&state);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                while let Some(request) = next_request(&mut stream, &mut buf).await {
                    let client = request
                        .header("x-client")
                        .and_then(|c| c.trim().parse::<u32>().ok())
                        .unwrap_or(0);
                    let now = seen.now.fetch_add(1, Ordering::SeqCst) + 1;
                    seen.max.fetch_max(now, Ordering::SeqCst);
                    seen.order.lock().unwrap().push(client);
                    let half = b"HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\nhalf";
                    let sent = stream.write_all(half).await.is_ok();
                    tokio::time::sleep(hold).await;
                    seen.now.fetch_sub(1, Ordering::SeqCst);
                    if !sent || stream.write_all(b"done").await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

fn config(up: SocketAddr, action: &str, store: &str) -> String {
    format!(
        "{store}\n[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{up}\"\n\
         [[policy]]\nname = \"exports\"\nalgorithm = \"concurrency\"\nlimit = 3\nlease_ttl = \"1h\"\n\
         key = [\"header:x-api-key\"]\nmatch = {{ path = \"/v1/export/**\" }}\naction = \"{action}\"\n\
         max_delay = \"30s\"\n\
         [[policy]]\nname = \"tokens\"\nalgorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1m\"\n\
         key = [\"header:x-api-key\"]\nmatch = {{ path = \"/v1/other\" }}\n"
    )
}

/// One request through the proxy as client `n`, read to its end.
async fn export(proxy: SocketAddr, n: u32) -> (StatusCode, Option<String>) {
    let r = get(
        &format!("http://{proxy}/v1/export/{n}"),
        &[("x-api-key", "k1"), ("x-client", &n.to_string())],
    )
    .await;
    (r.status, r.header("retry-after").map(str::to_owned))
}

/// Ten clients at once, started in order a few milliseconds apart (so their order of arrival
/// is known); the answers in client order.
async fn ten_at_once(proxy: SocketAddr) -> Vec<(StatusCode, Option<String>)> {
    let mut tasks = Vec::new();
    for n in 0..10u32 {
        tasks.push(tokio::spawn(export(proxy, n)));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test]
async fn past_the_limit_requests_are_rejected() {
    let (up, seen) = recording_upstream(Duration::from_secs(1)).await;
    let s = start_text(&config(up, "reject", "")).await;
    let answers = ten_at_once(s.proxy.unwrap()).await;
    let admitted = answers.iter().filter(|(s, _)| *s == StatusCode::OK).count();
    let rejected: Vec<_> = answers
        .iter()
        .filter(|(s, _)| *s == StatusCode::TOO_MANY_REQUESTS)
        .collect();
    assert_eq!((admitted, rejected.len()), (3, 7), "{answers:?}");
    assert!(
        rejected.iter().all(|(_, r)| r.as_deref() == Some("1")),
        "Retry-After is a second: {rejected:?}"
    );
    assert_eq!(seen.max.load(Ordering::SeqCst), 3);
    // All three ended: the key has its three slots back.
    wait_for(|| async {
        let r = get(&s.admin_url("/metrics"), &[]).await;
        String::from_utf8_lossy(&r.body).contains("tollgate_in_flight{policy=\"exports\"} 0")
    })
    .await;
    let again = ten_at_once(s.proxy.unwrap()).await;
    let admitted = again.iter().filter(|(s, _)| *s == StatusCode::OK).count();
    assert_eq!(admitted, 3, "{again:?}");
    s.stop().await;
}

#[tokio::test]
async fn with_delay_everyone_is_served_in_order() {
    let (up, seen) = recording_upstream(Duration::from_secs(1)).await;
    let s = start_text(&config(up, "delay", "")).await;
    let answers = ten_at_once(s.proxy.unwrap()).await;
    assert!(
        answers.iter().all(|(s, _)| *s == StatusCode::OK),
        "{answers:?}"
    );
    assert_eq!(seen.max.load(Ordering::SeqCst), 3);
    let order = seen.order.lock().unwrap().clone();
    assert_eq!(
        order,
        (0..10).collect::<Vec<u32>>(),
        "served in order of arrival"
    );
    s.stop().await;
}

/// A client that leaves mid-response frees its slot at once: the slot's TTL is an hour, so a
/// fourth request admitted now was admitted because the slot was given back.
#[tokio::test]
async fn a_client_gone_mid_response_frees_its_slot() {
    let (up, _seen) = recording_upstream(Duration::from_secs(30)).await;
    let s = start_text(&config(up, "reject", "")).await;
    let proxy = s.proxy.unwrap();
    let mut held = Vec::new();
    for n in 0..3 {
        held.push(mid_response(proxy, n).await);
    }
    assert_eq!(export(proxy, 9).await.0, StatusCode::TOO_MANY_REQUESTS);
    drop(held.pop());
    wait_for(|| async {
        let r = get(&s.admin_url("/metrics"), &[]).await;
        String::from_utf8_lossy(&r.body).contains("tollgate_in_flight{policy=\"exports\"} 2")
    })
    .await;
    let mut c = TcpStream::connect(proxy).await.unwrap();
    c.write_all(b"GET /v1/export/7 HTTP/1.1\r\nhost: x\r\nx-api-key: k1\r\n\r\n")
        .await
        .unwrap();
    let mut b = [0u8; 64];
    let n = c.read(&mut b).await.unwrap();
    assert!(
        b[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&b[..n])
    );
    drop((held, c));
    s.stop().await;
}

/// Sends client `n`'s request on a connection of its own.
async fn send_export(proxy: SocketAddr, n: u32) -> TcpStream {
    let mut c = TcpStream::connect(proxy).await.unwrap();
    let req =
        format!("GET /v1/export/{n} HTTP/1.1\r\nhost: x\r\nx-api-key: k1\r\nx-client: {n}\r\n\r\n");
    c.write_all(req.as_bytes()).await.unwrap();
    c
}

/// Client `n`'s request, read until the head and half the body have arrived: mid-response,
/// its slot held while the connection is.
async fn mid_response(proxy: SocketAddr, n: u32) -> TcpStream {
    let mut c = send_export(proxy, n).await;
    let mut got = Vec::new();
    while !got.ends_with(b"half") {
        let mut b = [0u8; 256];
        let n = c.read(&mut b).await.unwrap();
        assert!(n > 0, "closed early");
        got.extend_from_slice(&b[..n]);
    }
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    c
}

/// A client that gives up while its request waits in line for a slot: the request never
/// reaches the upstream, and the slot it would have taken goes to the next in line.
#[tokio::test]
async fn a_client_gone_from_the_line_is_not_forwarded() {
    let (up, seen) = recording_upstream(Duration::from_secs(30)).await;
    let s = start_text(&config(up, "delay", "")).await;
    let proxy = s.proxy.unwrap();
    let mut held = Vec::new();
    for n in 0..3 {
        held.push(mid_response(proxy, n).await);
    }
    // Client 5 lines up, and leaves while it waits; client 6 lines up behind it.
    let leaver = send_export(proxy, 5).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(leaver);
    let next = tokio::spawn(mid_response(proxy, 6));
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(held.pop());
    let next = next.await.unwrap();
    assert_eq!(*seen.order.lock().unwrap(), [0, 1, 2, 6]);
    drop((held, next));
    s.stop().await;
}

/// A reload that changes the limit keeps the slots in use: the new limit counts them, and
/// their leases still give them back.
#[tokio::test]
async fn a_reload_of_the_limit_keeps_the_slots_in_use() {
    const POLICY: &str =
        "[[policy]]\nname = \"slots\"\nalgorithm = \"concurrency\"\nlimit = 1\nkey = [\"ip\"]\n";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.toml");
    std::fs::write(&path, with_ports(POLICY)).unwrap();
    let s = start(tollgate_server::Config::load(&path).unwrap()).await;
    let acquire = r#"{"policy":"slots","key":"k","mode":"acquire"}"#;
    let held = post_json(&s.url("/v1/check"), acquire).await;
    assert_eq!(held.status, StatusCode::OK);
    let lease = held.json()["lease"].as_str().unwrap().to_owned();
    assert_eq!(
        post_json(&s.url("/v1/check"), acquire).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    std::fs::write(&path, with_ports(&POLICY.replace("limit = 1", "limit = 2"))).unwrap();
    wait_for(|| async {
        get(&s.admin_url("/v1/policies"), &[]).await.json()["policies"][0]["limit"] == 2
    })
    .await;
    // One more, not two: the slot taken before the reload still counts.
    let second = post_json(&s.url("/v1/check"), acquire).await;
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(second.json()["remaining"], 0);
    assert_eq!(
        post_json(&s.url("/v1/check"), acquire).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // And the first lease gives its slot back.
    let r = post_json(&s.url("/v1/release"), &format!(r#"{{"lease":"{lease}"}}"#)).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(
        post_json(&s.url("/v1/check"), acquire).await.status,
        StatusCode::OK
    );
    s.stop().await;
}

#[tokio::test]
async fn acquire_answers_a_lease_and_release_gives_it_back() {
    let (up, _seen) = recording_upstream(Duration::from_millis(1)).await;
    let s = start_text(&config(up, "reject", "")).await;
    let acquire = r#"{"policy":"exports","key":"k9","mode":"acquire"}"#;
    let mut leases = Vec::new();
    for remaining in [2, 1, 0] {
        let r = post_json(&s.url("/v1/check"), acquire).await;
        assert_eq!(r.status, StatusCode::OK);
        let j = r.json();
        assert_eq!(j["remaining"], remaining);
        assert_eq!(
            r.header("ratelimit-policy"),
            Some("\"exports\";q=3"),
            "no window for requests in flight"
        );
        leases.push(j["lease"].as_str().unwrap().to_owned());
    }
    let r = post_json(&s.url("/v1/check"), acquire).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.json()["lease"], serde_json::Value::Null);
    assert_eq!(r.header("retry-after"), Some("1"));

    let release = |lease: &str| format!(r#"{{"lease":"{lease}"}}"#);
    let r = post_json(&s.url("/v1/release"), &release(&leases[0])).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["released"], 1);
    let r = post_json(&s.url("/v1/release"), &release(&leases[0])).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "twice changes nothing");
    let r = post_json(&s.url("/v1/check"), acquire).await;
    assert_eq!(r.status, StatusCode::OK, "the slot came back");

    // Not ours: a forged or altered lease.
    let mut altered = leases[1].clone();
    let last = if altered.ends_with('0') { "1" } else { "0" };
    altered.replace_range(altered.len() - 1.., last);
    for bad in [altered.as_str(), "zz", ""] {
        let r = post_json(&s.url("/v1/release"), &release(bad)).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(r.json()["field"], "\"lease\"");
    }
    // An acquire's cost is one slot: 0 (an admission that would hold nothing) and 2 are
    // refused, naming the field.
    for cost in [0, 2] {
        let r = post_json(
            &s.url("/v1/check"),
            &format!(r#"{{"policy":"exports","key":"k9","mode":"acquire","cost":{cost}}}"#),
        )
        .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "cost {cost}");
        assert_eq!(r.json()["field"], "\"cost\"");
    }
    // Modes that do not fit the policy.
    let r = post_json(
        &s.url("/v1/check"),
        r#"{"policy":"tokens","key":"k9","mode":"acquire"}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["field"], "\"mode\"");
    let r = post_json(&s.url("/v1/check"), r#"{"policy":"exports","key":"k9"}"#).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["field"], "\"mode\"");
    let detail = r.json()["detail"].as_str().unwrap_or_default().to_owned();
    assert!(
        detail.starts_with("\"mode\" must be \"acquire\" for policy \"exports\""),
        "{detail}"
    );
    s.stop().await;
}

/// A request that outlives its slot's `lease_ttl` finds it taken back when it ends, and the
/// metric says so.
#[tokio::test]
async fn a_slot_outlived_is_counted_as_taken_back() {
    let (up, _seen) = recording_upstream(Duration::from_millis(1500)).await;
    let text = config(up, "reject", "").replace("lease_ttl = \"1h\"", "lease_ttl = \"500ms\"");
    let s = start_text(&text).await;
    assert_eq!(export(s.proxy.unwrap(), 1).await.0, StatusCode::OK);
    // The slot is given back as the exchange ends, just after the client has its answer.
    wait_for(|| async {
        let r = get(&s.admin_url("/metrics"), &[]).await;
        String::from_utf8_lossy(&r.body)
            .contains("tollgate_slots_expired_total{policy=\"exports\"} 1")
    })
    .await;
    s.stop().await;
}

/// Three instances on one Redis: at most three slots in total, whichever instance clients
/// reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_share_the_limit_on_redis() {
    let redis = RedisProcess::start(&[]);
    let store = format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\nclock = \"local\"\n",
        redis.url()
    );
    let (up, seen) = recording_upstream(Duration::from_secs(1)).await;
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(start_text(&config(up, "reject", &store)).await);
    }
    let mut tasks = Vec::new();
    for n in 0..12u32 {
        let proxy = servers[n as usize % 3].proxy.unwrap();
        tasks.push(tokio::spawn(export(proxy, n)));
    }
    let mut admitted = 0;
    for t in tasks {
        if t.await.unwrap().0 == StatusCode::OK {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 3);
    assert_eq!(seen.max.load(Ordering::SeqCst), 3);
    for s in servers {
        s.stop().await;
    }
}
