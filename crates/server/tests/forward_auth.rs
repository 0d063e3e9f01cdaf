//! `/v1/forward-auth` and `/v1/check` by attributes over real sockets: what a description must
//! hold, what is refused with a 400 naming the field, who the client is, and the nginx flavour
//! of a denial.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use hyper::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ONE_PER_HOUR: &str = r#"
[[policy]]
name = "api"
algorithm = "sliding_window_log"
limit = 1
window = "1h"
key = ["header:x-api-key", "ip"]
match = { path = "/v1/**" }
"#;

fn described<'a>(target: &'a str, client: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("x-forwarded-method", "GET"),
        ("x-forwarded-uri", target),
        ("x-forwarded-host", "api.example.com"),
        ("x-forwarded-for", client),
    ]
}

#[tokio::test]
async fn nginx_flavour_denies_with_403_and_the_problem_in_a_header() {
    let s = start_text(ONE_PER_HOUR).await;
    let h = described("/v1/items", "198.51.100.1");
    let r = get(&s.url("/v1/forward-auth/nginx"), &h).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    assert!(r.header("tollgate-problem").is_none());
    let r = get(&s.url("/v1/forward-auth/nginx"), &h).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(r.header("retry-after").is_some());
    assert_eq!(r.header("x-ratelimit-limit"), Some("1"));
    assert!(r.header("ratelimit-policy").is_some());
    let in_header: serde_json::Value =
        serde_json::from_str(r.header("tollgate-problem").unwrap()).unwrap();
    assert_eq!(in_header, r.json(), "the header carries the body");
    assert_eq!(in_header["status"], 429);
    assert_eq!(in_header["violated-policies"][0], "api");
    assert_eq!(
        r.header("tollgate-status"),
        Some("429"),
        "what the client is to get"
    );
    // The standard endpoint answers the same denial with a 429 and no such header.
    let r = get(&s.url("/v1/forward-auth"), &h).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(r.header("tollgate-problem").is_none());
    s.stop().await;
}

#[tokio::test]
async fn an_incomplete_or_ambiguous_description_is_a_400_naming_the_header() {
    let s = start_text(ONE_PER_HOUR).await;
    let full = described("/v1/items", "198.51.100.1");
    for missing in [
        "x-forwarded-method",
        "x-forwarded-uri",
        "x-forwarded-host",
        "x-forwarded-for",
    ] {
        let h: Vec<_> = full
            .iter()
            .copied()
            .filter(|(n, _)| *n != missing)
            .collect();
        let r = get(&s.url("/v1/forward-auth"), &h).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "without {missing}");
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        let detail = r.json()["detail"].as_str().unwrap().to_ascii_lowercase();
        assert!(
            detail.starts_with(&format!("{missing} is missing")),
            "{detail}"
        );
    }
    let mut twice = full.clone();
    twice.push(("x-forwarded-host", "other.example"));
    let r = get(&s.url("/v1/forward-auth"), &twice).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(
        r.json()["detail"]
            .as_str()
            .unwrap()
            .starts_with("X-Forwarded-Host appears more than once")
    );
    // Nothing was counted: the one request of the hour is still there.
    let r = get(&s.url("/v1/forward-auth"), &full).await;
    assert_eq!(r.status, StatusCode::OK);
    s.stop().await;
}

/// A raw non-ASCII byte in X-Forwarded-Uri, written on the socket as is.
#[tokio::test]
async fn a_raw_non_ascii_target_is_refused_not_read_as_root() {
    let s = start_text(ONE_PER_HOUR).await;
    let mut stream = tokio::net::TcpStream::connect(s.api).await.unwrap();
    stream
        .write_all(
            b"GET /v1/forward-auth HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\
              X-Forwarded-Method: GET\r\nX-Forwarded-Uri: /v1/caf\xc3\xa9\r\n\
              X-Forwarded-Host: api.example.com\r\nX-Forwarded-For: 198.51.100.1\r\n\r\n",
        )
        .await
        .unwrap();
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).await.unwrap();
    let text = String::from_utf8_lossy(&reply);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains("X-Forwarded-Uri must be a path"), "{text}");
    s.stop().await;
}

#[tokio::test]
async fn an_untrusted_caller_is_the_client_whatever_it_forwards() {
    let s = start_text(&format!(
        "[forward_auth]\ntrusted_proxies = []\n{ONE_PER_HOUR}"
    ))
    .await;
    let r = get(
        &s.url("/v1/forward-auth"),
        &described("/v1/a", "198.51.100.1"),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    // Another "client" from the same caller shares its quota: X-Forwarded-For is not read.
    let r = get(
        &s.url("/v1/forward-auth"),
        &described("/v1/a", "198.51.100.2"),
    )
    .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    s.stop().await;
}

#[tokio::test]
async fn check_by_attributes_refuses_what_it_cannot_read() {
    let s = start_text(ONE_PER_HOUR).await;
    let url = s.url("/v1/check");
    for (body, says) in [
        (
            r#"{"path": "/v1/café", "ip": "198.51.100.1"}"#,
            "\"path\" must be a path",
        ),
        (
            r#"{"path": "v1/items", "ip": "198.51.100.1"}"#,
            "\"path\" must be a path",
        ),
        (
            r#"{"path": "/v1/a", "headers": {"X-Api-Key": "a", "x-api-key": "b"}}"#,
            "\"headers\" names x-api-key more than once",
        ),
        (
            r#"{"path": "/v1/a", "host": "h é.example"}"#,
            "\"host\" must be",
        ),
        (
            r#"{"path": "/v1/a", "headers": {"host": "a/b"}}"#,
            "\"headers\" Host must be",
        ),
        // What only a check by policy and key does is refused, not taken for a plain check.
        (
            r#"{"path": "/v1/a", "mode": "report"}"#,
            "\"mode\" of a described request is \"check\"",
        ),
        (
            r#"{"path": "/v1/a", "cost": 5}"#,
            "\"cost\" applies to a check by policy and key",
        ),
    ] {
        let r = post_json(&url, body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}");
        let detail = r.json()["detail"].as_str().unwrap().to_owned();
        assert!(detail.starts_with(says), "{body}: {detail}");
    }
    for (mode, ip) in [("check", "198.51.100.2"), ("acquire", "198.51.100.3")] {
        let body = format!(r#"{{"path": "/v1/a", "ip": "{ip}", "mode": "{mode}"}}"#);
        assert_eq!(
            post_json(&url, &body).await.status,
            StatusCode::OK,
            "{body}"
        );
    }
    // A check by policy and key names the field it cannot read, as the others do.
    let r = post_json(&url, r#"{"policy": "api", "key": "k", "cost": -1}"#).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["field"], "\"cost\"");
    let r = post_json(&url, r#"{"path": "/v1/caf%C3%A9", "ip": "198.51.100.1"}"#).await;
    assert_eq!(r.status, StatusCode::OK, "percent-encoded bytes are fine");
    s.stop().await;
}
