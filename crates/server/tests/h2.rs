//! HTTP/2 with prior knowledge (h2c) on the decision listener, beside HTTP/1.1 on the same
//! port: multiplexed `POST /v1/check` on one connection with their answers and rate-limit
//! headers, `curl --http2-prior-knowledge`, HTTP/1.1 still served, the header bound, slow
//! HTTP/2 clients cut off by the header read timeout, and the drain on shutdown.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use common::{post_json, start_text, start_with_limits, with_ports};

const FIVE_PER_MINUTE: &str = r#"
[[policy]]
name = "api"
algorithm = "fixed_window"
limit = 5
window = "1m"
key = ["header:x-api-key", "ip"]
"#;

/// The HTTP/2 connection preface a client sends first (RFC 9113 §3.4), and an empty SETTINGS
/// frame.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];

struct Answer {
    status: StatusCode,
    version: Version,
    headers: hyper::HeaderMap,
    json: serde_json::Value,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// An HTTP/2 connection (prior knowledge) to `addr`.
async fn h2_connect(
    addr: std::net::SocketAddr,
) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    sender
}

async fn h2_check(
    mut sender: hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    addr: std::net::SocketAddr,
    body: &'static str,
) -> Answer {
    let req = Request::post(format!("http://{addr}/v1/check"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    sender.ready().await.unwrap();
    let res = sender.send_request(req).await.unwrap();
    let (parts, body) = res.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Answer {
        status: parts.status,
        version: parts.version,
        headers: parts.headers,
        json: serde_json::from_slice(&body).unwrap(),
    }
}

#[tokio::test]
async fn multiplexed_checks_on_one_connection_share_the_quota() {
    let s = start_text(FIVE_PER_MINUTE).await;
    let sender = h2_connect(s.api).await;
    // Eight checks of one key in flight at once on one connection, against a quota of five.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let sender = sender.clone();
        tasks.spawn(h2_check(
            sender,
            s.api,
            r#"{"policy": "api", "key": "h2-customer", "cost": 1}"#,
        ));
    }
    let mut remaining = Vec::new();
    let mut denied = 0;
    while let Some(answer) = tasks.join_next().await {
        let a = answer.unwrap();
        assert_eq!(a.version, Version::HTTP_2);
        assert_eq!(a.header("x-ratelimit-limit"), Some("5"));
        assert!(
            a.header("ratelimit-policy")
                .is_some_and(|p| p.contains("\"api\""))
        );
        assert_eq!(a.json["policy"], "api");
        match a.status {
            StatusCode::OK => {
                assert_eq!(a.json["allowed"], true);
                remaining.push(
                    a.header("x-ratelimit-remaining")
                        .unwrap()
                        .parse::<u64>()
                        .unwrap(),
                );
            }
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(a.json["allowed"], false);
                assert_eq!(a.header("x-ratelimit-remaining"), Some("0"));
                assert!(a.header("retry-after").is_some());
                denied += 1;
            }
            other => panic!("unexpected status {other}"),
        }
    }
    remaining.sort_unstable();
    assert_eq!(
        remaining,
        [0, 1, 2, 3, 4],
        "each admitted check took one unit"
    );
    assert_eq!(denied, 3);
    // The same port still speaks HTTP/1.1, on the same count.
    let r = post_json(
        &s.url("/v1/check"),
        r#"{"policy": "api", "key": "h2-customer"}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let r = post_json(
        &s.url("/v1/check"),
        r#"{"policy": "api", "key": "h1-customer"}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("4"));
    s.stop().await;
}

#[tokio::test]
async fn curl_with_prior_knowledge_gets_an_http2_answer() {
    let Ok(out) = std::process::Command::new("curl").arg("--version").output() else {
        eprintln!("curl is not installed: skipped");
        return;
    };
    if !String::from_utf8_lossy(&out.stdout).contains("HTTP2") {
        eprintln!("this curl has no HTTP/2: skipped");
        return;
    }
    let s = start_text(FIVE_PER_MINUTE).await;
    let url = s.url("/v1/check");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args([
                "-s",
                "-i",
                "--http2-prior-knowledge",
                "--max-time",
                "5",
                "-X",
                "POST",
            ])
            .args(["-H", "content-type: application/json"])
            .args(["-d", r#"{"policy":"api","key":"curl-customer","cost":1}"#])
            .arg(url)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(text.starts_with("http/2 200"), "{text}");
    assert!(text.contains("x-ratelimit-limit: 5"), "{text}");
    assert!(text.contains("x-ratelimit-remaining: 4"), "{text}");
    assert!(text.contains("\"allowed\":true"), "{text}");
    s.stop().await;
}

#[tokio::test]
async fn headers_past_the_bound_are_refused() {
    let s = start_text(FIVE_PER_MINUTE).await;
    let mut sender = h2_connect(s.api).await;
    let big = "a".repeat(100 * 1024);
    let req = Request::get(format!("http://{}/healthz", s.api))
        .header("x-big", big.as_str())
        .body(Full::new(Bytes::new()))
        .unwrap();
    sender.ready().await.unwrap();
    // The server answers 431, or the client, told the bound by the server's SETTINGS, refuses to
    // send the request at all.
    match sender.send_request(req).await {
        Ok(res) => assert_eq!(res.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE),
        Err(e) => eprintln!("refused by the client: {e}"),
    }
    // Within the bound, the connection still serves.
    let a = h2_check(sender, s.api, r#"{"policy": "api", "key": "small"}"#).await;
    assert_eq!(a.status, StatusCode::OK);
    s.stop().await;
}

/// Reads until the server closes the connection; how long that took, or `None` after 5 s.
async fn closed_within(mut c: TcpStream) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut buf))
        .await
        .ok()
        .map(|_| start.elapsed())
}

#[tokio::test]
async fn slow_http2_clients_are_cut_off() {
    let config = tollgate_server::Config::parse("t.toml", &with_ports("")).unwrap();
    let limits = tollgate_server::Limits {
        header_read_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let s = start_with_limits(config, limits).await;
    let api = s.api;
    // A client that connects and sends nothing.
    let c = TcpStream::connect(api).await.unwrap();
    assert!(closed_within(c).await.is_some(), "silent client cut off");
    // Half the preface, then silence.
    let mut c = TcpStream::connect(api).await.unwrap();
    c.write_all(&PREFACE[..3]).await.unwrap();
    assert!(closed_within(c).await.is_some(), "half a preface cut off");
    // The preface and SETTINGS, then no request.
    let mut c = TcpStream::connect(api).await.unwrap();
    c.write_all(PREFACE).await.unwrap();
    c.write_all(SETTINGS).await.unwrap();
    assert!(
        closed_within(c).await.is_some(),
        "idle HTTP/2 connection cut off"
    );
    // A header block that never ends: HEADERS on stream 1 without END_HEADERS, no
    // CONTINUATION (one literal header field, `:method: GET`, HPACK static index 2).
    let mut c = TcpStream::connect(api).await.unwrap();
    c.write_all(PREFACE).await.unwrap();
    c.write_all(SETTINGS).await.unwrap();
    c.write_all(&[0, 0, 1, 1, 0, 0, 0, 0, 1, 0x82])
        .await
        .unwrap();
    assert!(
        closed_within(c).await.is_some(),
        "unfinished header block cut off"
    );
    // A slow client trickling the preface a byte at a time is cut off all the same.
    let mut c = TcpStream::connect(api).await.unwrap();
    let trickle = tokio::spawn(async move {
        for b in PREFACE.iter().chain(SETTINGS) {
            if c.write_all(&[*b]).await.is_err() {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Some(c)
    });
    if let Some(c) = trickle.await.unwrap() {
        assert!(closed_within(c).await.is_some(), "trickling client cut off");
    }
    s.stop_cleanly().await;
}

#[tokio::test]
async fn shutdown_drains_http2_connections() {
    let mut s = start_text(FIVE_PER_MINUTE).await;
    let sender = h2_connect(s.api).await;
    let a = h2_check(
        sender.clone(),
        s.api,
        r#"{"policy": "api", "key": "drain"}"#,
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    // The open connection gets GOAWAY and the server stops without waiting out the drain.
    s.trigger_stop();
    tokio::time::timeout(Duration::from_secs(5), &mut s.task)
        .await
        .expect("stopped within 5 s")
        .unwrap();
}

/// An answer to HEAD carries no content over HTTP/2 either (strict clients refuse one that
/// does), and a 405 says which method the endpoint takes.
#[tokio::test]
async fn head_answers_have_no_content_and_a_405_names_the_method() {
    let s = start_text(FIVE_PER_MINUTE).await;
    let mut sender = h2_connect(s.api).await;
    for (path, status) in [
        ("/v1/check", StatusCode::METHOD_NOT_ALLOWED),
        ("/healthz", StatusCode::OK),
    ] {
        let req = Request::head(format!("http://{}{path}", s.api))
            .body(Full::new(Bytes::new()))
            .unwrap();
        sender.ready().await.unwrap();
        let res = sender.send_request(req).await.unwrap();
        assert_eq!(res.status(), status, "{path}");
        if status == StatusCode::METHOD_NOT_ALLOWED {
            assert_eq!(
                res.headers().get("allow").and_then(|v| v.to_str().ok()),
                Some("POST")
            );
        }
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert!(body.is_empty(), "{path}: {} bytes", body.len());
    }
    s.stop().await;
}

/// Over HTTP/2 the host is the `:authority`: a write without the admin token that names
/// another host (a browser made to resolve it to this listener) is refused as over HTTP/1.1,
/// and one that names this listener is served.
#[tokio::test]
async fn admin_writes_over_http2_need_this_listeners_authority() {
    let s = start_text(FIVE_PER_MINUTE).await;
    let port = s.admin.port();
    let mut h2 = h2_connect(s.admin).await;
    let body = r#"{"limit": 9, "reason": "r"}"#;
    let put = |authority: String| {
        Request::put(format!("http://{authority}/v1/overrides/api/k"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    };
    for foreign in [format!("evil.example:{port}"), "evil.example".to_owned()] {
        let r = h2.send_request(put(foreign.clone())).await.unwrap();
        assert_eq!(r.version(), Version::HTTP_2);
        assert_eq!(r.status(), StatusCode::FORBIDDEN, ":authority {foreign}");
    }
    let r = h2
        .send_request(put(format!("localhost:{port}")))
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    s.stop().await;
}
