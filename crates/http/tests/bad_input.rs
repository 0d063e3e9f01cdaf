//! Hostile and malformed input: never a panic, never a 500, never a way around a policy.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use axum::body::Body;
use common::*;
use http::{HeaderValue, Request, StatusCode};
use tollgate_http::{ForwardedHeader, JwtVerifier, TrustedProxies};

fn engine_app(forwarded: ForwardedHeader) -> axum::Router {
    let engine = builder(manual_clock())
        .policy(policy(
            fixed("api", 1000, 60),
            &["header:x-api-key", "jwt:sub", "query:k", "user", "ip"],
            None,
        ))
        .policy(policy(fixed("admin", 1, 60), &["ip"], Some("/admin/**")))
        .policy(policy(fixed("x", 1, 60), &["ip"], Some("/v1/x")))
        .trusted_proxies(TrustedProxies::parse(["10.0.0.0/8", "::1"]).unwrap())
        .forwarded_header(forwarded)
        .jwt(JwtVerifier::hs256(b"secret").unwrap())
        .build()
        .unwrap();
    app(engine)
}

fn raw(uri: &str, ip: &str, headers: &[(&str, HeaderValue)]) -> Request<Body> {
    let mut r = get(uri, ip, &[]);
    for (n, v) in headers {
        r.headers_mut().append(
            http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
            v.clone(),
        );
    }
    r
}

fn ok_or_429(s: StatusCode) -> bool {
    s == StatusCode::OK || s == StatusCode::TOO_MANY_REQUESTS
}

#[tokio::test]
async fn non_utf8_and_huge_header_values() {
    for which in [ForwardedHeader::XForwardedFor, ForwardedHeader::Forwarded] {
        let app = engine_app(which);
        let big = "A".repeat(64 * 1024);
        let many_hops = vec!["10.0.0.1"; 10_000].join(", ");
        let values = [
            HeaderValue::from_bytes(b"\xff\xfe\x80 key").unwrap(),
            HeaderValue::from_str(&big).unwrap(),
            HeaderValue::from_str(&many_hops).unwrap(),
            HeaderValue::from_static(""),
            HeaderValue::from_static(",,,;;;===\"\"[[]]"),
        ];
        for value in &values {
            for name in [
                "x-api-key",
                "authorization",
                "x-forwarded-for",
                "forwarded",
                "host",
            ] {
                let r = raw("/v1/items", "10.0.0.7", &[(name, value.clone())]);
                let s = status(&app, r).await;
                // A field that says what the request is (its host, who the client is) and
                // cannot be read is refused with 400, as at every door; never a 5xx.
                let describes = name == "host"
                    || (name == "x-forwarded-for" && which == ForwardedHeader::XForwardedFor)
                    || (name == "forwarded" && which == ForwardedHeader::Forwarded);
                assert!(
                    ok_or_429(s) || (describes && s == StatusCode::BAD_REQUEST),
                    "{name}: {s}"
                );
            }
        }
    }
}

#[tokio::test]
async fn malformed_forwarded_falls_back_to_the_last_trusted_hop() {
    let app = engine_app(ForwardedHeader::Forwarded);
    // What the trusted proxy appended is not an address: refused, naming the header, rather
    // than counted under the proxy's own address.
    for value in [
        "for=",
        "for=\"[2001:db8::1\"",
        "for=1.2.3.4:notaport",
        "for=\"\"",
    ] {
        let s = status(
            &app,
            raw(
                "/admin/a",
                "10.0.0.9",
                &[("forwarded", HeaderValue::from_static(value))],
            ),
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{value}");
    }
    // No address on purpose (RFC 7239: no `for=`, `unknown`, an obfuscated identifier), or
    // a port too many: the walk ends at the trusted proxy.
    for value in [
        "for=unknown",
        "for=_hidden",
        "proto=https",
        "for=[::1]:80:80",
    ] {
        // Each is answered, keyed on the trusted proxy itself (10.0.0.9), so the second call of
        // the admin policy (limit 1) from it is limited whatever the garbage says.
        let s = status(
            &app,
            raw(
                "/admin/a",
                "10.0.0.9",
                &[("forwarded", HeaderValue::from_static(value))],
            ),
        )
        .await;
        assert!(ok_or_429(s), "{value}: {s}");
    }
    let s = status(&app, raw("/admin/a", "10.0.0.9", &[])).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn a_64_kib_jwt_is_absent() {
    let app = engine_app(ForwardedHeader::XForwardedFor);
    let token = format!(
        "Bearer {}.{}.{}",
        "e".repeat(32 * 1024),
        "f".repeat(32 * 1024),
        "g"
    );
    let r = raw(
        "/v1/items",
        "1.1.1.1",
        &[("authorization", HeaderValue::from_str(&token).unwrap())],
    );
    let r = send(&app, r).await;
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test]
async fn path_tricks_are_normalised_before_matching() {
    let app = engine_app(ForwardedHeader::XForwardedFor);
    // One admin request from this IP is allowed; every spelling of /admin counts against it.
    assert_eq!(
        status(&app, get("/admin/panel", "7.7.7.7", &[])).await,
        StatusCode::OK
    );
    for path in [
        "/v1/%2e%2e/admin/panel",
        "/v1/../admin/panel",
        "//admin//panel",
        "/admin/./panel",
        "/%61dmin/panel",
    ] {
        assert_eq!(
            status(&app, get(path, "7.7.7.7", &[])).await,
            StatusCode::TOO_MANY_REQUESTS,
            "{path}"
        );
    }
    assert_eq!(
        status(&app, get("//v1//x", "8.8.8.8", &[])).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&app, get("/v1/x/", "8.8.8.8", &[])).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn odd_paths_and_queries_never_fail() {
    let app = engine_app(ForwardedHeader::XForwardedFor);
    let deep = "/a".repeat(20_000);
    let long_query = format!("/v1?{}k=%ff%fe", "j=%ff%fe&".repeat(5_000));
    let repeated_key = format!("/v1?{}", "k=%ff%fe&".repeat(5_000));
    for uri in [
        "/%",
        "/%zz",
        "/%2f%2F%00",
        "/..",
        "/../../../../",
        "/v1?k=%",
        "/v1?=&=&&",
        long_query.as_str(),
    ] {
        let s = status(&app, get(uri, "1.1.1.1", &[])).await;
        assert!(ok_or_429(s), "{}: {s}", &uri[..uri.len().min(80)]);
    }
    // A key parameter sent 5,000 times: which one the upstream reads is its choice, so the
    // request is refused rather than counted under the first.
    assert_eq!(
        status(&app, get(&repeated_key, "1.1.1.1", &[])).await,
        StatusCode::BAD_REQUEST
    );
    // Too deep to normalise whole: refused, never matched half-normalised.
    assert_eq!(
        status(&app, get(&deep, "1.1.1.1", &[])).await,
        StatusCode::URI_TOO_LONG
    );
}

#[tokio::test]
async fn requests_without_a_peer_are_counted_anonymously() {
    let engine = builder(manual_clock())
        .policy(policy(fixed("api", 1, 60), &["ip"], None))
        .build()
        .unwrap();
    let app = app(engine);
    let bare = || Request::builder().uri("/").body(Body::empty()).unwrap();
    assert_eq!(status(&app, bare()).await, StatusCode::OK);
    assert_eq!(status(&app, bare()).await, StatusCode::TOO_MANY_REQUESTS);
}
