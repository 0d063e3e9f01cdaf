//! The bounds every listener keeps against clients that hold it: a head or a body that never
//! ends is cut off after `header_read_timeout`, a head or a body past its size is refused, and
//! a listener holding every connection it may says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use hyper::StatusCode;

#[tokio::test]
async fn slow_loris_and_huge_headers_are_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config = tollgate_server::Config::parse("t.toml", &with_ports("")).unwrap();
    let limits = tollgate_server::Limits {
        header_read_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let s = start_with_limits(config, limits).await;
    let api = s.api;
    // Slow loris: half a request line, then silence → the server closes the connection.
    let mut c = tokio::net::TcpStream::connect(api).await.unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(3), c.read_to_end(&mut buf)).await;
    assert!(n.is_ok(), "connection closed by the header read timeout");
    // Huge headers → 431, no panic.
    let big = "a".repeat(100 * 1024);
    let r = get(&format!("http://{api}/healthz"), &[("x-big", big.as_str())]).await;
    assert_eq!(r.status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    s.stop_cleanly().await;
}

/// A body that starts and never ends is answered 408 within header_read_timeout, on the paths
/// the quick lane leaves to hyper (chunked here): it used to hold its connection for ever, and
/// enough such clients held every connection.
#[tokio::test]
async fn a_body_that_never_ends_is_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut config = tollgate_server::Config::parse("t.toml", &with_ports("")).unwrap();
    let limits = tollgate_server::Limits {
        header_read_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    config.limits = limits;
    let s = start_with_limits(config, limits).await;
    let mut c = tokio::net::TcpStream::connect(s.api).await.unwrap();
    c.write_all(
        b"POST /v1/check HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n",
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the connection was closed");
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    // A body over the limit is a 413.
    let big = format!("{{\"policy\":\"x\",\"key\":\"{}\"}}", "k".repeat(70 * 1024));
    let r = post_json(&format!("http://{}/v1/check", s.api), &big).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    // Announced past it, with Expect: 100-continue: refused at once, never invited to send.
    let mut c = tokio::net::TcpStream::connect(s.api).await.unwrap();
    c.write_all(
        b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n\
          Expect: 100-continue\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "answered at once");
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    s.stop_cleanly().await;
}

/// The admin endpoints that take a body read it as the decision API does: 408 when it stalls
/// past header_read_timeout (it held the connection for ever), 413 on an announced length past
/// 16 KiB before any is read, and a member named twice refused.
#[tokio::test]
async fn admin_bodies_are_bounded_as_the_decision_apis() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let text = with_ports(
        r#"
[[policy]]
name = "api"
algorithm = "fixed_window"
limit = 5
window = "1m"
key = ["ip"]
"#,
    );
    let mut config = tollgate_server::Config::parse("t.toml", &text).unwrap();
    let limits = tollgate_server::Limits {
        header_read_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    config.limits = limits;
    let s = start_with_limits(config, limits).await;
    let raw = |request: &'static [u8]| async move {
        let mut c = tokio::net::TcpStream::connect(s.admin).await.unwrap();
        c.write_all(request).await.unwrap();
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut buf)).await;
        assert!(read.is_ok(), "the connection was closed");
        String::from_utf8_lossy(&buf).into_owned()
    };
    let stalled = raw(
        b"PUT /v1/overrides/api/ip:192.0.2.1 HTTP/1.1\r\nHost: localhost\r\n\
        Content-Length: 40\r\n\r\n{\"limit\": 1",
    )
    .await;
    assert!(stalled.starts_with("HTTP/1.1 408"), "{stalled}");
    let huge = raw(
        b"PUT /v1/overrides/api/ip:192.0.2.1 HTTP/1.1\r\nHost: localhost\r\n\
        Content-Length: 10000000000\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(huge.starts_with("HTTP/1.1 413"), "{huge}");
    let url = s.admin_url("/v1/overrides/api/ip:192.0.2.1");
    let twice = r#"{"limit": 1000, "window": "1h", "reason": "a", "limit": 1}"#;
    let twice = send("PUT", &url, &[], twice).await;
    assert_eq!(twice.status, StatusCode::BAD_REQUEST, "{twice:?}");
    let said = String::from_utf8_lossy(&twice.body);
    assert!(said.contains(r#"\"limit\" is given twice"#), "{said}");
    let fine = r#"{"limit": 1000, "window": "1h", "reason": "a partner's batch"}"#;
    let fine = send("PUT", &url, &[], fine).await;
    assert!(fine.status.is_success(), "{fine:?}");
    s.stop_cleanly().await;
}

/// A listener holding every connection it may hold says so in the log (once a minute at most):
/// its new clients wait unseen in the accept queue otherwise.
#[test]
fn a_full_listener_says_so() {
    common::log::with_log(|captured| async move {
        let mut config = tollgate_server::Config::parse("t.toml", &with_ports("")).unwrap();
        let limits = tollgate_server::Limits {
            max_connections: 2,
            ..Default::default()
        };
        config.limits = limits;
        let s = start_with_limits(config, limits).await;
        let _held = [
            tokio::net::TcpStream::connect(s.api).await.unwrap(),
            tokio::net::TcpStream::connect(s.api).await.unwrap(),
        ];
        for _ in 0..200 {
            if captured.count("every connection this listener may hold is open") > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Once, and only for the API listener: each listener has its own connections.
        assert_eq!(
            captured.count("every connection this listener may hold is open"),
            1,
            "{}",
            captured.text()
        );
        assert_eq!(captured.count("listener=\"api\" max_connections=2"), 1);
        s.stop().await;
    });
}

/// A configuration with a short `header_read_timeout` of its own, and a policy to check.
fn timed(header_read_timeout: &str) -> tollgate_server::Config {
    let text = format!(
        r#"
[server]
listen = "127.0.0.1:0"
header_read_timeout = "{header_read_timeout}"

[admin]
listen = "127.0.0.1:0"

[[policy]]
name = "api"
algorithm = "fixed_window"
limit = 5
window = "1h"
key = ["ip"]
"#
    );
    tollgate_server::Config::parse("t.toml", &text).unwrap()
}

/// Writes each of `parts` to a new connection to `addr`, `pause` apart, then reads until the
/// server closes it: everything it answered.
async fn raw_exchange(addr: std::net::SocketAddr, parts: &[&[u8]], pause: Duration) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(pause).await;
        }
        c.write_all(part).await.unwrap();
    }
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the connection was closed");
    buf
}

/// An answer's head lines (but the date) and its body.
fn head_and_body(answer: &[u8]) -> (Vec<String>, Vec<u8>) {
    let end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {:?}", String::from_utf8_lossy(answer)));
    let head = String::from_utf8_lossy(&answer[..end])
        .split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("date:"))
        .map(str::to_owned)
        .collect();
    (head, answer[end + 4..].to_vec())
}

/// A check whose body stalls on the quick lane (HTTP/1.1 keep-alive, `Content-Length`) is
/// answered 408 and closed, as the same check sent with `Connection: close` (hyper's) is, in
/// the same bytes but the date: the quick lane closed it without a word at the head's
/// timeout.
#[tokio::test]
async fn a_body_that_stalls_on_the_quick_lane_is_answered_as_hypers_408() {
    let s = common::start(timed("1s")).await;
    let quick = raw_exchange(
        s.api,
        &[b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{\"po"],
        Duration::ZERO,
    )
    .await;
    let hyper = raw_exchange(
        s.api,
        &[
            b"POST /v1/check HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
            Content-Length: 50\r\n\r\n{\"po",
        ],
        Duration::ZERO,
    )
    .await;
    let (quick_head, quick_body) = head_and_body(&quick);
    let (hyper_head, hyper_body) = head_and_body(&hyper);
    assert_eq!(
        hyper_head.first().map(String::as_str),
        Some("HTTP/1.1 408 Request Timeout"),
        "{hyper_head:?}"
    );
    assert!(
        hyper_head.iter().any(|l| l == "connection: close"),
        "{hyper_head:?}"
    );
    let said = String::from_utf8_lossy(&hyper_body);
    assert!(
        said.contains("the body did not arrive within header_read_timeout"),
        "{said}"
    );
    assert_eq!(quick_head, hyper_head);
    assert_eq!(
        String::from_utf8_lossy(&quick_body),
        String::from_utf8_lossy(&hyper_body)
    );
    s.stop().await;
}

/// A head that stalls is closed without an answer on the quick lane, as hyper closes one (here
/// after a request the quick lane hands it, answered).
#[tokio::test]
async fn a_head_that_stalls_is_closed_without_an_answer() {
    let s = common::start(timed("1s")).await;
    let quick = raw_exchange(
        s.api,
        &[b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Le"],
        Duration::ZERO,
    )
    .await;
    assert!(quick.is_empty(), "{:?}", String::from_utf8_lossy(&quick));
    // Keep-alive, after a check answered: the next head, stalled, is closed without an answer.
    let check = br#"{"policy":"api","key":"k"}"#;
    let whole = format!(
        "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        check.len()
    );
    let after = raw_exchange(
        s.api,
        &[
            whole.as_bytes(),
            check,
            b"POST /v1/check HTTP/1.1\r\nHost: x\r\n",
        ],
        Duration::ZERO,
    )
    .await;
    let text = String::from_utf8_lossy(&after);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert_eq!(text.matches("HTTP/1.1").count(), 1, "{text}");
    // Hyper's: a request it answers, then the same stalled head.
    let hyper = raw_exchange(
        s.api,
        &[b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nPOST /v1/check HTTP/1.1\r\nHost: x\r\n"],
        Duration::ZERO,
    )
    .await;
    let text = String::from_utf8_lossy(&hyper);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert_eq!(text.matches("HTTP/1.1").count(), 1, "{text}");
    s.stop().await;
}

/// A body has as long again as the head, from the end of the head: a head that takes most of
/// header_read_timeout and a body that takes most of it again are answered (the quick lane
/// counted head and body together, and closed such a check without an answer).
#[tokio::test]
async fn a_body_has_its_own_time_after_the_head() {
    let s = common::start(timed("3s")).await;
    let check = br#"{"policy":"api","key":"late"}"#;
    let head = format!(
        "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        check.len()
    );
    let (first, rest) = head.as_bytes().split_at(20);
    let (start, end) = check.split_at(5);
    let mut middle = rest.to_vec();
    middle.extend_from_slice(start);
    // The head whole after 2 s (of 3), the body after 2 s more (of 3 from there): 4 s in all,
    // past the 3 s one timer for head and body would have allowed.
    let answer = raw_exchange(s.api, &[first, &middle, end], Duration::from_secs(2)).await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    s.stop().await;
}
