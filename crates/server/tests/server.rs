//! End-to-end tests of the server library: decision API, forward-auth, admin, reload, proxy,
//! graceful shutdown. Every server binds 127.0.0.1:0.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use hyper::StatusCode;

const TWO_PER_MINUTE: &str = r#"
[[policy]]
name = "api"
algorithm = "fixed_window"
limit = 2
window = "1m"
key = ["header:x-api-key", "ip"]
match = { path = "/v1/**" }

[[policy]]
name = "export"
algorithm = "token_bucket"
capacity = 10
refill = "1/s"
cost = 5
key = ["header:x-api-key"]
match = { path = "/v1/export/*", methods = ["POST"] }

[[policy]]
name = "strict"
algorithm = "sliding_window_counter"
limit = 5
window = "1m"
key = ["header:x-user"]
require_key = true
match = { path = "/private/**" }

[[policy]]
name = "trial"
algorithm = "fixed_window"
limit = 1
window = "1m"
action = "shadow"
match = { path = "/trial/**" }
"#;

/// Parses a structured-field list into (name, params) without a regex: enough for the tests.
fn sf_list(v: &str) -> Vec<(String, Vec<(String, i64)>)> {
    v.split(", ")
        .map(|item| {
            let mut parts = item.split(';');
            let name = parts.next().unwrap().trim_matches('"').to_owned();
            let params = parts
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap();
                    (k.to_owned(), v.parse().unwrap())
                })
                .collect();
            (name, params)
        })
        .collect()
}

#[tokio::test]
async fn check_by_policy_allows_then_denies_with_headers() {
    let s = start_text(TWO_PER_MINUTE).await;
    let body = r#"{"policy": "api", "key": "customer-42", "cost": 1}"#;
    let r = post_json(&s.url("/v1/check"), body).await;
    assert_eq!(r.status, StatusCode::OK);
    let j = r.json();
    for field in [
        "allowed",
        "policy",
        "limit",
        "remaining",
        "reset",
        "retry_after",
        "delay",
    ] {
        assert!(j.get(field).is_some(), "missing {field}: {j}");
    }
    assert_eq!(j["allowed"], true);
    assert_eq!(j["policy"], "api");
    assert_eq!(j["limit"], 2);
    assert_eq!(j["remaining"], 1);
    assert!(j["retry_after"].is_null() && j["delay"].is_null());
    assert_eq!(r.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("1"));
    let reset: u64 = r.header("x-ratelimit-reset").unwrap().parse().unwrap();
    assert!(reset > 1_700_000_000, "epoch seconds by default");
    let pol = sf_list(r.header("ratelimit-policy").unwrap());
    assert_eq!(pol[0].0, "api");
    assert_eq!(pol[0].1, vec![("q".to_owned(), 2), ("w".to_owned(), 60)]);

    post_json(&s.url("/v1/check"), body).await;
    let r = post_json(&s.url("/v1/check"), body).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let j = r.json();
    assert_eq!(j["allowed"], false);
    assert_eq!(j["remaining"], 0);
    let retry = j["retry_after"].as_u64().unwrap();
    assert!((1..=60).contains(&retry));
    let header_retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert_eq!(header_retry, retry);
    let rl = sf_list(r.header("ratelimit").unwrap());
    assert_eq!(rl[0].0, "api");
    assert_eq!(rl[0].1[0], ("r".to_owned(), 0));
    assert!(
        header_retry >= rl[0].1[1].1 as u64,
        "Retry-After never earlier than t"
    );

    // Another key has its own quota; a cost above the quota is denied without a Retry-After.
    let r = post_json(&s.url("/v1/check"), r#"{"policy":"api","key":"other"}"#).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = post_json(
        &s.url("/v1/check"),
        r#"{"policy":"api","key":"x","cost":3}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(r.json()["retry_after"].is_null());
    assert!(r.header("retry-after").is_none());
    s.stop().await;
}

/// `X-RateLimit-Reset` is when the quota comes back, counted from the instant the store
/// decided: a fixed window's end exactly, on an admission, a denial, and an answer that
/// combines two policies. Counted from a later reading of the clock, a window's whole-second
/// end became the next second.
#[tokio::test]
async fn the_reset_time_is_the_windows_end_on_every_answer() {
    let s = start_text(
        "[[policy]]\nname = \"hourly\"\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\nkey = [\"ip\"]\n\n\
         [[policy]]\nname = \"daily\"\nalgorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1d\"\nkey = [\"ip\"]\n",
    )
    .await;
    let by_key = r#"{"policy": "hourly", "key": "ip:192.0.2.44"}"#;
    let described = r#"{"path": "/x", "ip": "192.0.2.45"}"#;
    let mut seen = Vec::new();
    for body in [by_key, by_key, described, described] {
        let r = post_json(&s.url("/v1/check"), body).await;
        let reset: u64 = r.header("x-ratelimit-reset").unwrap().parse().unwrap();
        seen.push((r.status.as_u16(), reset));
    }
    let statuses: Vec<u16> = seen.iter().map(|(status, _)| *status).collect();
    assert_eq!(statuses, [200, 429, 200, 429], "{seen:?}");
    for (_, reset) in &seen {
        assert_eq!(
            reset % 3600,
            0,
            "the hour's end, not a second after: {seen:?}"
        );
    }
    s.stop().await;
    // A shadow policy that denies: the enforcing one is counted again, and its answer too
    // counts from when it was decided.
    let s = start_text(
        "[[policy]]\nname = \"hourly\"\nalgorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1h\"\nkey = [\"ip\"]\n\n\
         [[policy]]\nname = \"trial\"\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\nkey = [\"ip\"]\naction = \"shadow\"\n",
    )
    .await;
    for _ in 0..3 {
        let r = post_json(&s.url("/v1/check"), described).await;
        assert_eq!(r.status.as_u16(), 200);
        let reset: u64 = r.header("x-ratelimit-reset").unwrap().parse().unwrap();
        assert_eq!(reset % 3600, 0, "the hour's end: {reset}");
    }
    s.stop().await;
}

#[tokio::test]
async fn check_rejects_bad_input_with_problem_json() {
    let s = start_text(TWO_PER_MINUTE).await;
    for bad in [
        "{not json",
        "[1,2]",
        r#"{"policy": 3}"#,
        r#"{"policy":"api"}"#,
        r#"{"policy":"api","key":"k","cost":-1}"#,
        r#"{"method":"GET"}"#,
        // A member given twice, which readers of the body could take either way.
        r#"{"policy":"nope","policy":"api","key":"k"}"#,
        r#"{"policy":"api","key":"k","cost":5,"cost":1}"#,
        r#"{"path":"/a","path":"/v1/x","ip":"192.0.2.1"}"#,
        // ... at any depth, and in a member the quick reading has no use for.
        r#"{"policy":"api","key":"k","extra":{"a":1,"a":2}}"#,
        r#"{"policy":"api","key":"k","x":1,"x":2}"#,
        // The fields in an array are no object.
        r#"["api","k",1,"check"]"#,
    ] {
        let r = post_json(&s.url("/v1/check"), bad).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert_eq!(r.json()["status"], 400);
    }
    // A member the check has no use for is read (the general way) and ignored.
    let r = post_json(
        &s.url("/v1/check"),
        r#"{"policy":"api","key":"k","note":{"a":1}}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["remaining"], 1);
    let r = post_json(&s.url("/v1/check"), r#"{"policy":"nope","key":"k"}"#).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = get(&s.url("/v1/check"), &[]).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    // Not UTF-8, in a member the quick reading would skip: not JSON, refused.
    let r = send(
        "POST",
        &s.url("/v1/check"),
        &[("content-type", "application/json")],
        b"{\"policy\":\"api\",\"key\":\"k\",\"x\":\"\xff\"}".to_vec(),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = send("POST", &s.url("/v1/check"), &[], vec![b'{'; 100 * 1024]).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    s.stop().await;
}

#[tokio::test]
async fn check_by_attributes_evaluates_every_matching_policy() {
    let s = start_text(TWO_PER_MINUTE).await;
    let req =
        r#"{"method":"POST","path":"/v1/export/7","headers":{"x-api-key":"k"},"ip":"203.0.113.9"}"#;
    let r = post_json(&s.url("/v1/check"), req).await;
    assert_eq!(r.status, StatusCode::OK);
    let j = r.json();
    assert_eq!(j["allowed"], true);
    let names: Vec<&str> = j["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["policy"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["api", "export"]);
    let pol = sf_list(r.header("ratelimit-policy").unwrap());
    assert_eq!(pol.len(), 2);
    // export: capacity 10, cost 5 → the second request empties it, the third is denied, and
    // a denial consumes from no policy (api still has 0 left after two admits).
    let r = post_json(&s.url("/v1/check"), req).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = post_json(&s.url("/v1/check"), req).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // GET is not matched by export: only api, keyed by the same API key, now exhausted.
    let r = post_json(
        &s.url("/v1/check"),
        r#"{"path":"/v1/x","headers":{"x-api-key":"k"}}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.json()["decisions"].as_array().unwrap().len(), 1);
    // The IP selector: a different key space, so an API key equal to an IP never collides.
    let r = post_json(
        &s.url("/v1/check"),
        r#"{"path":"/v1/x","ip":"203.0.113.9"}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    // No policy matches: admitted, no headers.
    let r = post_json(&s.url("/v1/check"), r#"{"path":"/elsewhere"}"#).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.header("ratelimit").is_none());
    // require_key: 401 without the key.
    let r = post_json(&s.url("/v1/check"), r#"{"path":"/private/x"}"#).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    // shadow never blocks but reports.
    for _ in 0..3 {
        let r = post_json(&s.url("/v1/check"), r#"{"path":"/trial/x","ip":"1.1.1.1"}"#).await;
        assert_eq!(r.status, StatusCode::OK);
    }
    let r = post_json(&s.url("/v1/check"), r#"{"path":"/trial/x","ip":"1.1.1.1"}"#).await;
    assert_eq!(r.json()["shadow"][0]["allowed"], false);
    let m = get(&s.admin_url("/metrics"), &[]).await;
    let text = String::from_utf8_lossy(&m.body);
    assert!(
        text.contains("tollgate_decisions_total{policy=\"trial\",outcome=\"shadow\"} 3"),
        "{text}"
    );
    s.stop().await;
}

#[tokio::test]
async fn forward_auth_reads_forwarded_headers() {
    let s = start_text(TWO_PER_MINUTE).await;
    let h = [
        ("x-forwarded-method", "GET"),
        ("x-forwarded-uri", "/v1/items?page=2"),
        ("x-forwarded-host", "api.example.com"),
        ("x-forwarded-for", "198.51.100.7"),
    ];
    for _ in 0..2 {
        let r = get(&s.url("/v1/forward-auth"), &h).await;
        assert_eq!(r.status, StatusCode::OK);
        assert!(r.header("ratelimit").is_some());
    }
    let r = get(&s.url("/v1/forward-auth"), &h).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    let j = r.json();
    assert_eq!(
        j["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(j["violated-policies"][0], "api");
    assert!(r.header("retry-after").is_some());
    // Another client address behind the same proxy has its own quota.
    let r = get(
        &s.url("/v1/forward-auth"),
        &[
            ("x-forwarded-method", "GET"),
            ("x-forwarded-uri", "/v1/items"),
            ("x-forwarded-host", "api.example.com"),
            ("x-forwarded-for", "198.51.100.8"),
        ],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    s.stop().await;
}

#[tokio::test]
async fn admin_endpoints_and_token() {
    let s = start_text(&format!("{TWO_PER_MINUTE}\n")).await;
    let r = get(&s.admin_url("/healthz"), &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = get(&s.admin_url("/readyz"), &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = get(&s.admin_url("/v1/policies"), &[]).await;
    let j = r.json();
    assert_eq!(j["policies"][0]["name"], "api");
    assert_eq!(j["policies"][1]["match"]["methods"][0], "POST");
    post_json(&s.url("/v1/check"), r#"{"policy":"api","key":"a"}"#).await;
    let r = get(&s.admin_url("/metrics"), &[]).await;
    let text = String::from_utf8_lossy(&r.body).into_owned();
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    for needle in [
        "tollgate_decisions_total{policy=\"api\",outcome=\"allowed\"} 1",
        "tollgate_decision_duration_seconds_bucket{le=\"+Inf\"} 1",
        "tollgate_store_errors_total 0",
        "tollgate_keys_tracked 1",
        "tollgate_requests_delayed_total 0",
        "tollgate_config_reloads_total{result=\"failed\"} 0",
    ] {
        assert!(text.contains(needle), "{needle} in\n{text}");
    }
    s.stop().await;

    let config = tollgate_server::Config::parse(
        "t.toml",
        "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"s3cret\"\n",
    )
    .unwrap();
    let s = start(config).await;
    let r = get(&s.admin_url("/metrics"), &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = get(
        &s.admin_url("/metrics"),
        &[("authorization", "Bearer wrong")],
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    // The scheme is case-insensitive (RFC 9110); the token is not.
    for given in ["Bearer s3cret", "bearer s3cret", "BEARER  s3cret"] {
        let r = get(&s.admin_url("/metrics"), &[("authorization", given)]).await;
        assert_eq!(r.status, StatusCode::OK, "{given}");
    }
    for given in ["Bearer S3CRET", "Bearers3cret", "Basic s3cret", "Bearer"] {
        let r = get(&s.admin_url("/metrics"), &[("authorization", given)]).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{given}");
    }
    s.stop().await;
}

#[tokio::test]
async fn reload_on_file_change_keeps_counters_and_rejects_bad_files() {
    let dir = std::env::temp_dir().join(format!("tollgate-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tollgate.toml");
    let policy = |extra: &str| {
        with_ports(&format!(
            "[[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 3\nwindow = \"1h\"\n{extra}"
        ))
    };
    std::fs::write(&path, policy("")).unwrap();
    let s = start(tollgate_server::Config::load(&path).unwrap()).await;
    let check = r#"{"policy":"api","key":"k"}"#;
    let r = post_json(&s.url("/v1/check"), check).await;
    assert_eq!(r.json()["remaining"], 2);

    // A good change that leaves "api" alone: api keeps its count, the new policy appears.
    std::fs::write(
        &path,
        policy("\n[[policy]]\nname = \"new\"\nlimit = 1\nwindow = \"1m\"\n"),
    )
    .unwrap();
    wait_for(|| async {
        get(&s.admin_url("/v1/policies"), &[]).await.json()["policies"]
            .as_array()
            .unwrap()
            .len()
            == 2
    })
    .await;
    let r = post_json(&s.url("/v1/check"), check).await;
    assert_eq!(
        r.json()["remaining"],
        1,
        "counters of unchanged policies survive a reload"
    );

    // A bad file is rejected: the running configuration stays, and the metric says so.
    std::fs::write(&path, "[[policy]]\nname = \"api\"\nlimit = \"lots\"\n").unwrap();
    wait_for(|| async {
        let m = get(&s.admin_url("/metrics"), &[]).await;
        String::from_utf8_lossy(&m.body)
            .contains("tollgate_config_reloads_total{result=\"failed\"} 1")
    })
    .await;
    let r = post_json(&s.url("/v1/check"), r#"{"policy":"new","key":"k"}"#).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = post_json(&s.url("/v1/check"), check).await;
    assert_eq!(r.json()["remaining"], 0);

    // Changing a policy's quota starts it afresh.
    std::fs::write(&path, policy("").replace("limit = 3", "limit = 5")).unwrap();
    wait_for(|| async {
        post_json(&s.url("/v1/check"), r#"{"policy":"api","key":"fresh"}"#)
            .await
            .json()["limit"]
            == 5
    })
    .await;
    let r = post_json(&s.url("/v1/check"), check).await;
    assert_eq!(r.json()["remaining"], 4);
    s.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// An edit made after the file was read but before the server watches it (while the store
/// connects, the state is restored, the listeners start) is a change like any other: the watch
/// compares the files with what the running configuration was read from, not with what they
/// held when it first looked.
#[tokio::test]
async fn an_edit_made_while_the_server_starts_is_taken_in() {
    let dir = std::env::temp_dir().join(format!("tollgate-reload-early-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tollgate.toml");
    let policy = |limit: u32| {
        with_ports(&format!(
            "[[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = {limit}\nwindow = \"1h\"\n"
        ))
    };
    std::fs::write(&path, policy(3)).unwrap();
    let config = tollgate_server::Config::load(&path).unwrap();
    std::fs::write(&path, policy(5)).unwrap();
    let s = start(config).await;
    wait_for(|| async {
        post_json(&s.url("/v1/check"), r#"{"policy":"api","key":"k"}"#)
            .await
            .json()["limit"]
            == 5
    })
    .await;
    s.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

fn proxy_config(upstream: std::net::SocketAddr, extra: &str) -> String {
    format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{upstream}\"\ntimeout = \"1s\"\n\n{extra}"
    )
}

#[tokio::test]
async fn proxy_forwards_streams_and_limits() {
    let up = upstream().await;
    let s = start_text(&proxy_config(
        up,
        "[[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 3\nwindow = \"1m\"\nkey = [\"header:x-api-key\", \"ip\"]\nmatch = { path = \"/v1/**\" }\n",
    ))
    .await;
    // Body streamed to the upstream and back, 8 MiB, Host kept, X-Forwarded-For appended.
    let big = vec![b'a'; 8 * 1024 * 1024];
    let r = send(
        "POST",
        &s.proxy_url("/echo"),
        &[
            ("host", "api.example.com"),
            ("x-forwarded-for", "192.0.2.1"),
        ],
        big.clone(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body.len(), big.len());
    assert_eq!(r.header("x-seen-host"), Some("api.example.com"));
    assert_eq!(r.header("x-seen-xff"), Some("192.0.2.1, 127.0.0.1"));
    assert!(r.header("ratelimit").is_none(), "no policy matched /echo");
    // A large response streamed down.
    let r = get(&s.proxy_url("/big?n=16777216"), &[]).await;
    assert_eq!(r.body.len(), 16 * 1024 * 1024);
    // Limited paths carry the headers; the fourth is refused by Tollgate, not the upstream.
    for i in 0..3 {
        let r = get(&s.proxy_url("/v1/items"), &[("x-api-key", "k")]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.header("x-ratelimit-remaining"), Some(["2", "1", "0"][i]));
        assert!(r.header("ratelimit-policy").is_some());
    }
    let r = get(&s.proxy_url("/v1/items"), &[("x-api-key", "k")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.json()["violated-policies"][0], "api");
    assert!(
        r.header("x-seen-host").is_none(),
        "a refused request never reaches the upstream"
    );
    // Upstream too slow → 504.
    let r = get(&s.proxy_url("/slow"), &[]).await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    s.stop().await;
}

#[tokio::test]
async fn proxy_answers_502_when_upstream_is_down() {
    // Bind then drop: a port nobody listens on.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let s = start_text(&proxy_config(dead, "")).await;
    let r = get(&s.proxy_url("/anything"), &[]).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(r.json()["status"], 502);
    let m = get(&s.admin_url("/metrics"), &[]).await;
    assert!(String::from_utf8_lossy(&m.body).contains("tollgate_upstream_errors_total 1"));
    s.stop().await;
}

#[tokio::test]
async fn proxy_holds_delay_requests_for_their_slot() {
    let up = upstream().await;
    let s = start_text(&proxy_config(
        up,
        "[[policy]]\nname = \"hooks\"\nalgorithm = \"leaky_bucket\"\nrate = \"4/s\"\nqueue = 2\naction = \"delay\"\nmax_delay = \"1s\"\nkey = [\"header:x-tenant\"]\n",
    ))
    .await;
    let started = Instant::now();
    let mut statuses = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..5 {
        let url = s.proxy_url("/hook");
        tasks.push(tokio::spawn(async move {
            get(&url, &[("x-tenant", "t1")]).await.status
        }));
    }
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!(ok + refused, 5);
    assert!(ok >= 3, "{statuses:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "held for their slots"
    );
    let m = get(&s.admin_url("/metrics"), &[]).await;
    assert!(!String::from_utf8_lossy(&m.body).contains("tollgate_requests_delayed_total 0"));
    s.stop().await;
}

#[tokio::test]
async fn shutdown_drains_in_flight_requests() {
    let up = upstream().await;
    let mut s =
        start_text(&proxy_config(up, "").replace("timeout = \"1s\"", "timeout = \"10s\"")).await;
    let url = s.proxy_url("/slow");
    let inflight = tokio::spawn(async move { get(&url, &[]).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.trigger_stop();
    // While the request drains, the admin listener still answers: live, not ready (a load
    // balancer that reads /readyz sends new traffic elsewhere), metrics still served.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !inflight.is_finished(),
        "the slow request is still in flight"
    );
    let ready = get(&s.admin_url("/readyz"), &[]).await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(&ready.body[..], b"draining\n");
    assert_eq!(
        get(&s.admin_url("/healthz"), &[]).await.status,
        StatusCode::OK
    );
    assert_eq!(
        get(&s.admin_url("/metrics"), &[]).await.status,
        StatusCode::OK
    );
    let r = inflight.await.unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(&r.body[..], b"slow");
    tokio::time::timeout(Duration::from_secs(10), &mut s.task)
        .await
        .unwrap()
        .unwrap();
    // New connections are refused once it has stopped, the admin listener's too.
    assert!(tokio::net::TcpStream::connect(s.api).await.is_err());
    assert!(tokio::net::TcpStream::connect(s.admin).await.is_err());
}

/// `[server] drain_timeout` bounds the wait: a request still in flight when it ends is cut off,
/// and the server stops.
#[tokio::test]
async fn the_drain_ends_at_drain_timeout() {
    let up = upstream().await;
    let text = with_ports(&proxy_config(up, "").replace("timeout = \"1s\"", "timeout = \"10s\""))
        .replace("[server]\n", "[server]\ndrain_timeout = \"200ms\"\n");
    let config = tollgate_server::Config::parse("test.toml", &text).expect("valid config");
    assert_eq!(config.limits.drain, Duration::from_millis(200));
    let mut s = start(config).await;
    let url = s.proxy_url("/slow");
    let inflight = tokio::spawn(async move {
        let client: hyper_util::client::legacy::Client<_, http_body_util::Empty<bytes::Bytes>> =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http();
        client.get(url.parse().unwrap()).await.map(|r| r.status())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.trigger_stop();
    // The server ends while the upstream still holds the request (it answers after 3 s)...
    tokio::time::timeout(Duration::from_secs(10), &mut s.task)
        .await
        .unwrap()
        .unwrap();
    // ...and its client never got an answer.
    let answered = inflight.await.unwrap();
    assert!(answered.is_err(), "{answered:?}");
}

/// `delay` in an answer is a wait only a `delay` policy imposes: a leaky bucket that rejects
/// lets an admitted request pass at once, so its answers say `null`, by name and described.
#[tokio::test]
async fn only_a_delay_policy_answers_a_delay() {
    let s = start_text(
        "[[policy]]\nname = \"lb\"\nalgorithm = \"leaky_bucket\"\nqueue = 5\nrate = \"1/s\"\nkey = [\"ip\"]\n\n\
         [[policy]]\nname = \"held\"\nalgorithm = \"leaky_bucket\"\nqueue = 5\nrate = \"1/s\"\nkey = [\"ip\"]\n\
         action = \"delay\"\nmax_delay = \"10s\"\nmatch = { path = \"/held/**\" }\n",
    )
    .await;
    for _ in 0..3 {
        let r = post_json(&s.url("/v1/check"), r#"{"policy":"lb","key":"k"}"#).await;
        assert_eq!(r.status, StatusCode::OK);
        assert!(r.json()["delay"].is_null(), "{}", r.json());
        let r = post_json(
            &s.url("/v1/check"),
            r#"{"method":"GET","path":"/a","ip":"192.0.2.1"}"#,
        )
        .await;
        assert!(r.json()["decisions"][0]["delay"].is_null(), "{}", r.json());
    }
    post_json(&s.url("/v1/check"), r#"{"policy":"held","key":"k"}"#).await;
    let r = post_json(&s.url("/v1/check"), r#"{"policy":"held","key":"k"}"#).await;
    assert!(
        r.json()["delay"].as_f64().is_some_and(|d| d > 0.0),
        "{}",
        r.json()
    );
    s.stop().await;
}
