//! Charging what a request really cost, behind the reverse proxy: an OpenAI-compatible fake
//! upstream answers JSON bodies and event streams carrying `usage.total_tokens`; each key is
//! charged exactly what its responses reported, and refused once its budget is spent, on the
//! memory store and on Redis. Failed logins counted by status: five 401s lock the sixth attempt,
//! successful logins cost nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;

use common::*;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate_testkit::redis::RedisProcess;

/// A fake AI API. `POST /v1/chat/completions` reports the tokens the `x-tokens` request header
/// asks for: as a JSON body (`usage.total_tokens` after the choices), or, with `x-stream: 1`,
/// as an event stream (chunked) whose last event before `[DONE]` carries the usage.
/// `POST /login` answers 401 unless `x-password: right`.
async fn ai_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                while let Some(request) = next_request(&mut stream, &mut buf).await {
                    let head = &request.head;
                    let header = |name: &str| request.header(name);
                    let reply = if head.starts_with("post /login") {
                        let ok = header("x-password").as_deref() == Some("right");
                        let status = if ok { "200 OK" } else { "401 Unauthorized" };
                        format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n").into_bytes()
                    } else {
                        let tokens = header("x-tokens").and_then(|t| t.parse::<u64>().ok());
                        if header("x-stream").is_some() {
                            stream_answer(tokens.unwrap_or(0))
                        } else {
                            // Compressed when the client accepts it, as real APIs do (the
                            // body stays plain: only the label matters to the meter).
                            let gzip =
                                header("accept-encoding").is_some_and(|v| v.contains("gzip"));
                            json_answer(tokens, gzip)
                        }
                    };
                    if stream.write_all(&reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A chat completion with `tokens` of usage (no usage at all without), about 4 KiB, the usage
/// last.
fn json_answer(tokens: Option<u64>, gzip: bool) -> Vec<u8> {
    let content = "lorem ipsum ".repeat(300);
    let usage = tokens.map_or(String::new(), |t| {
        format!(
            r#","usage":{{"prompt_tokens":{p},"completion_tokens":{c},"total_tokens":{t}}}"#,
            p = t / 3,
            c = t - t / 3
        )
    });
    let body = format!(
        r#"{{"id":"chatcmpl-1","object":"chat.completion","model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":"{content}"}},"finish_reason":"stop"}}]{usage}}}"#
    );
    let encoding = if gzip {
        "content-encoding: gzip\r\n"
    } else {
        ""
    };
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{encoding}content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The same as a stream: chunked events, the usage in the last before `[DONE]`.
fn stream_answer(tokens: u64) -> Vec<u8> {
    let mut events = Vec::new();
    for i in 0..5 {
        events.push(format!(
            "data: {{\"id\":\"c\",\"choices\":[{{\"delta\":{{\"content\":\"part {i} \"}}}}],\"usage\":null}}\n\n"
        ));
    }
    events.push(format!(
        "data: {{\"id\":\"c\",\"choices\":[],\"usage\":{{\"total_tokens\":{tokens}}}}}\n\n"
    ));
    events.push("data: [DONE]\n\n".to_owned());
    let mut out =
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            .to_vec();
    for e in events {
        out.extend_from_slice(format!("{:x}\r\n{e}\r\n", e.len()).as_bytes());
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

/// One request through the proxy from client `ip`; the status and the body.
async fn through(
    proxy: SocketAddr,
    path: &str,
    ip: &str,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nhost: api.example.com\r\nx-forwarded-for: {ip}\r\ncontent-length: 2\r\nconnection: close\r\n"
    );
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n{}");
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text)
}

/// What `key` has left under `policy`, read without spending (a peek of cost 0).
async fn left(s: &Running, policy: &str, key: &str) -> u64 {
    let r = post_json(
        &s.url("/v1/check"),
        &format!(r#"{{"policy":"{policy}","key":"{key}","cost":0}}"#),
    )
    .await;
    r.json()["remaining"].as_u64().unwrap_or(u64::MAX)
}

/// Waits (bounded) until `key` has exactly `want` left: the true-up lands as the exchange
/// ends, in a task of its own on Redis, so a peek right after the response may come first.
async fn settled(s: &Running, policy: &str, key: &str, want: u64) {
    let mut seen = u64::MAX;
    for _ in 0..200 {
        seen = left(s, policy, key).await;
        if seen == want {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("{key} has {seen} left under {policy}, not {want}");
}

fn config(up: SocketAddr, store: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n{store}\n\
         [proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{up}\"\ntrusted_proxies = [\"127.0.0.0/8\"]\n\
         [[policy]]\nname = \"tokens\"\nalgorithm = \"fixed_window\"\nlimit = 1000\nwindow = \"1h\"\n\
         key = [\"ip\"]\nmatch = {{ path = \"/v1/chat/completions\", methods = [\"POST\"] }}\n\
         charge = \"response\"\ncost_from = \"json:usage.total_tokens\"\n\
         [[policy]]\nname = \"failed-logins\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"15m\"\n\
         key = [\"ip\"]\nmatch = {{ path = \"/login\", methods = [\"POST\"] }}\ncount_status = [\"401\", \"403\"]\n"
    )
}

/// Each key is charged exactly what its responses reported (JSON and streamed), then refused
/// once its budget is spent.
async fn charges_what_the_responses_report(s: &Running) {
    let proxy = s.proxy.unwrap();
    let (ip, key) = ("203.0.113.5", "ip:203.0.113.5");
    let (status, body) = through(proxy, "/v1/chat/completions", ip, &[("x-tokens", "120")]).await;
    assert_eq!(status, 200, "{body}");
    // The answer reaches the client whole, the usage included.
    assert!(body.contains("\"total_tokens\":120"), "{body}");
    settled(s, "tokens", key, 880).await;
    let (status, body) = through(
        proxy,
        "/v1/chat/completions",
        ip,
        &[("x-tokens", "300"), ("x-stream", "1")],
    )
    .await;
    assert_eq!(status, 200);
    assert!(body.contains("data: [DONE]"), "{body}");
    settled(s, "tokens", key, 580).await;
    // Zero tokens reported: admission's charge is given back.
    let (status, _) = through(proxy, "/v1/chat/completions", ip, &[("x-tokens", "0")]).await;
    assert_eq!(status, 200);
    settled(s, "tokens", key, 580).await;
    // A response with no usage is charged the policy's cost (1), as admission did.
    let (status, _) = through(proxy, "/v1/chat/completions", ip, &[]).await;
    assert_eq!(status, 200);
    settled(s, "tokens", key, 579).await;
    // A client that accepts gzip still pays its usage: the upstream is asked for identity.
    let gzip = [("x-tokens", "79"), ("accept-encoding", "gzip, br")];
    let (status, _) = through(proxy, "/v1/chat/completions", ip, &gzip).await;
    assert_eq!(status, 200);
    settled(s, "tokens", key, 500).await;
    // Past the budget: the charge is taken all the same, and the next request is refused.
    let (status, _) = through(proxy, "/v1/chat/completions", ip, &[("x-tokens", "900")]).await;
    assert_eq!(status, 200);
    settled(s, "tokens", key, 0).await;
    let (status, body) = through(proxy, "/v1/chat/completions", ip, &[("x-tokens", "5")]).await;
    assert_eq!(status, 429, "{body}");
    // Another key is untouched.
    settled(s, "tokens", "ip:203.0.113.6", 1000).await;
}

/// Requests pipelined on one connection: each is decided on the count its predecessors'
/// usage left, on a shared store too (the true-up lands before the next request is read).
async fn pipelined_requests_see_the_true_up(s: &Running) {
    let proxy = s.proxy.unwrap();
    let request = |tokens: u64| {
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: api.example.com\r\n\
             x-forwarded-for: 203.0.113.7\r\nx-tokens: {tokens}\r\ncontent-length: 2\r\n\r\n{{}}"
        )
    };
    let mut all = String::new();
    for tokens in [10, 20, 0] {
        all.push_str(&request(tokens));
    }
    all.push_str(&request(0).replace(
        "content-length: 2",
        "connection: close\r\ncontent-length: 2",
    ));
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.write_all(all.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let text = String::from_utf8_lossy(&answer);
    let remaining: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("x-ratelimit-remaining: "))
        .collect();
    // Admission takes 1 each; the true-ups then charge the rest of 10 and 20, and give the
    // zeros' 1 back.
    assert_eq!(remaining, ["999", "989", "969", "969"], "{text}");
}

/// Five failed logins lock the sixth attempt; successful ones cost nothing.
async fn failed_logins_count_by_status(s: &Running) {
    let proxy = s.proxy.unwrap();
    let ip = "198.51.100.9";
    for _ in 0..3 {
        let (status, _) = through(proxy, "/login", ip, &[("x-password", "right")]).await;
        assert_eq!(status, 200);
    }
    for attempt in 0..5 {
        let (status, _) = through(proxy, "/login", ip, &[("x-password", "guess")]).await;
        assert_eq!(status, 401, "attempt {attempt}");
    }
    // The sixth attempt is refused by the limiter, the right password or not.
    let (status, body) = through(proxy, "/login", ip, &[("x-password", "right")]).await;
    assert_eq!(status, 429, "{body}");
    let problem: Value = body
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    assert_eq!(problem["violated-policies"][0], "failed-logins");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_is_charged_on_the_memory_store() {
    let up = ai_upstream().await;
    let s = start(tollgate_server::Config::parse("t.toml", &config(up, "")).unwrap()).await;
    charges_what_the_responses_report(&s).await;
    failed_logins_count_by_status(&s).await;
    pipelined_requests_see_the_true_up(&s).await;
    // No response went uncounted.
    let metrics = get(&s.admin_url("/metrics"), &[]).await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains("tollgate_usage_fallbacks_total{policy=\"tokens\"} 1"),
        "one response carried no usage:\n{text}"
    );
    s.stop().await;
}

/// An upstream that is not there: the client gets Tollgate's own 502, the request keeps
/// admission's charge, and nothing is counted as a response whose cost could not be read
/// (there was no response), so the fallback metric keeps meaning a misread cost.
#[tokio::test]
async fn an_upstream_failure_keeps_admissions_charge_and_is_no_fallback() {
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let s = start(tollgate_server::Config::parse("t.toml", &config(gone, "")).unwrap()).await;
    let proxy = s.proxy.unwrap();
    let (status, answer) = through(proxy, "/v1/chat/completions", "203.0.113.60", &[]).await;
    assert_eq!(status, 502);
    // Tollgate's own answer carries the rate-limit headers, as every answer does.
    assert!(
        answer.contains("\r\nx-ratelimit-remaining: 999\r\n"),
        "{answer}"
    );
    assert!(
        answer.contains("\r\nratelimit: \"tokens\";r=999;"),
        "{answer}"
    );
    settled(&s, "tokens", "ip:203.0.113.60", 999).await;
    let metrics = get(&s.admin_url("/metrics"), &[]).await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains("tollgate_usage_fallbacks_total{policy=\"tokens\"} 0"),
        "no response, no fallback:\n{text}"
    );
    s.stop().await;
}

/// The count of responses whose cost could not be read outlives a configuration reload, as the
/// decision counts do: it belongs to the policy, not to one configuration's engine.
#[tokio::test]
async fn the_fallback_count_outlives_a_reload() {
    let up = ai_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.toml");
    std::fs::write(&path, config(up, "")).unwrap();
    let s = start(tollgate_server::Config::load(&path).unwrap()).await;
    let proxy = s.proxy.unwrap();
    let fallbacks = || async {
        let metrics = get(&s.admin_url("/metrics"), &[]).await;
        String::from_utf8_lossy(&metrics.body)
            .lines()
            .find_map(|l| l.strip_prefix("tollgate_usage_fallbacks_total{policy=\"tokens\"} "))
            .and_then(|n| n.parse::<u64>().ok())
    };
    // A response with no usage in it: one fallback.
    let (status, _) = through(proxy, "/v1/chat/completions", "203.0.113.70", &[]).await;
    assert_eq!(status, 200);
    wait_for(|| async { fallbacks().await == Some(1) }).await;
    // A reload (the failed-login limit raised), then another such response: two.
    std::fs::write(&path, config(up, "").replace("limit = 5\n", "limit = 6\n")).unwrap();
    wait_for(|| async {
        get(&s.admin_url("/v1/policies"), &[]).await.json()["policies"][1]["limit"] == 6
    })
    .await;
    assert_eq!(fallbacks().await, Some(1), "the count survives the reload");
    let (status, _) = through(proxy, "/v1/chat/completions", "203.0.113.71", &[]).await;
    assert_eq!(status, 200);
    wait_for(|| async { fallbacks().await == Some(2) }).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_is_charged_on_redis() {
    let redis = RedisProcess::start(&[]);
    let up = ai_upstream().await;
    let store = format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\nclock = \"local\"\ntimeout = \"500ms\"\n",
        redis.url()
    );
    let s = start(tollgate_server::Config::parse("t.toml", &config(up, &store)).unwrap()).await;
    charges_what_the_responses_report(&s).await;
    failed_logins_count_by_status(&s).await;
    pipelined_requests_see_the_true_up(&s).await;
    s.stop().await;
}

/// `POST /v1/check` with `"mode": "report"`: the application reports what a request cost
/// (the way to pair forward-auth, which never sees the response, with usage charging). It is
/// charged whatever is left, never denied, and the answer says what is left.
#[tokio::test]
async fn reports_charge_and_never_deny() {
    let up = ai_upstream().await;
    let s = start(tollgate_server::Config::parse("t.toml", &config(up, "")).unwrap()).await;
    let report = |cost: u32| {
        format!(r#"{{"policy":"tokens","key":"ip:192.0.2.7","cost":{cost},"mode":"report"}}"#)
    };
    let r = post_json(&s.url("/v1/check"), &report(700)).await;
    assert_eq!(r.status, hyper::StatusCode::OK);
    assert_eq!(
        (
            r.json()["allowed"].as_bool(),
            r.json()["remaining"].as_u64()
        ),
        (Some(true), Some(300))
    );
    assert_eq!(r.header("x-ratelimit-remaining"), Some("300"));
    let r = post_json(&s.url("/v1/check"), &report(700)).await;
    assert_eq!(r.status, hyper::StatusCode::OK, "a report is never denied");
    assert_eq!(r.json()["remaining"], 0);
    // An ordinary check of the key is refused now.
    let r = post_json(
        &s.url("/v1/check"),
        r#"{"policy":"tokens","key":"ip:192.0.2.7","cost":1}"#,
    )
    .await;
    assert_eq!(r.status, hyper::StatusCode::TOO_MANY_REQUESTS);
    // A mode it does not know is a 400 naming the field.
    let r = post_json(
        &s.url("/v1/check"),
        r#"{"policy":"tokens","key":"k","mode":"charge"}"#,
    )
    .await;
    assert_eq!(r.status, hyper::StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["field"], "\"mode\"");
    s.stop().await;
}

/// Forward-auth (and a request described to /v1/check) answers before the upstream does. A
/// policy charged by the response is decided there by admission's charge (the upstream reports the rest with `"mode": "report"`); a
/// policy counted by status cannot be decided at all, and is refused loudly rather than
/// counting every login.
#[tokio::test]
async fn described_requests_are_admitted_by_cost_and_refused_status_counting() {
    let up = ai_upstream().await;
    let s = start(tollgate_server::Config::parse("t.toml", &config(up, "")).unwrap()).await;
    let asked = |uri: &'static str| {
        [
            ("x-forwarded-method", "POST"),
            ("x-forwarded-uri", uri),
            ("x-forwarded-host", "api.example.com"),
            ("x-forwarded-for", "192.0.2.9"),
        ]
    };
    let r = get(&s.url("/v1/forward-auth"), &asked("/v1/chat/completions")).await;
    assert_eq!(r.status, hyper::StatusCode::OK);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("999"));

    let r = get(&s.url("/v1/forward-auth"), &asked("/login")).await;
    assert_eq!(r.status, hyper::StatusCode::INTERNAL_SERVER_ERROR);
    let detail = r.json()["detail"].as_str().unwrap_or_default().to_owned();
    assert!(
        detail.contains("failed-logins") && detail.contains("count_status"),
        "{detail}"
    );
    // A request described to /v1/check is heard before its response too: the same refusal,
    // six times, and never a lockout of the client.
    for _ in 0..6 {
        let r = post_json(
            &s.url("/v1/check"),
            r#"{"method":"POST","path":"/login","ip":"192.0.2.9"}"#,
        )
        .await;
        assert_eq!(r.status, hyper::StatusCode::INTERNAL_SERVER_ERROR);
        let detail = r.json()["detail"].as_str().unwrap_or_default().to_owned();
        assert!(
            detail.contains("POST /v1/check by request attributes"),
            "{detail}"
        );
    }
    s.stop().await;
}
