//! The live operations' edges: keys and policies in the path that are too long, not UTF-8,
//! hold control characters or are cut short are refused with a 400 naming the field (never a
//! panic, and the listener keeps serving), and every override change is logged with its reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::log::with_log;
use common::*;
use hyper::StatusCode;
use serde_json::json;

const POLICIES: &str = "[[policy]]\nname = \"api\"\nlimit = 3\nwindow = \"1m\"\nkey = [\"ip\"]\n";

#[tokio::test]
async fn malformed_and_oversized_path_segments_are_refused_by_field() {
    let s = start_text(POLICIES).await;
    let body = json!({"limit": 5, "reason": "edge test"}).to_string();
    let long = "k".repeat(513);
    let very_long = "%41".repeat(4000);
    let cases: Vec<(String, &str)> = vec![
        (format!("/v1/overrides/api/{long}"), "key"),
        (format!("/v1/overrides/api/{very_long}"), "key"),
        (format!("/v1/overrides/{long}/k"), "policy"),
        ("/v1/overrides/api/%FF%FE".into(), "key"),
        // A UTF-8 sequence cut short.
        ("/v1/overrides/api/ip%3A%E2%82".into(), "key"),
        ("/v1/overrides/api/a%00b".into(), "key"),
        ("/v1/overrides/api/line%0Abreak".into(), "key"),
        ("/v1/overrides/%C3/k".into(), "policy"),
        ("/v1/overrides/ap%7Fi/k".into(), "policy"),
    ];
    for (path, field) in &cases {
        for method in ["PUT", "GET", "DELETE"] {
            let r = send(
                method,
                &s.admin_url(path),
                &[("content-type", "application/json")],
                body.clone(),
            )
            .await;
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{method} {path}");
            assert_eq!(r.header("content-type"), Some("application/problem+json"));
            assert_eq!(r.json()["field"], *field, "{method} {path}");
        }
    }
    // Percent signs that encode nothing are taken as written: a key like any other.
    let r = send(
        "PUT",
        &s.admin_url("/v1/overrides/api/50%25%zz%"),
        &[],
        body.clone(),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(r.json()["key"], "50%%zz%");
    // A key at the limit is accepted, and so is a `/` inside it.
    let at_limit = "k".repeat(512);
    let r = send(
        "PUT",
        &s.admin_url(&format!("/v1/overrides/api/{at_limit}")),
        &[],
        body.clone(),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let r = send(
        "PUT",
        &s.admin_url("/v1/overrides/api/tenant/7/user"),
        &[],
        body.clone(),
    )
    .await;
    assert_eq!(r.json()["key"], "tenant/7/user");
    // Missing parts: no key to write, no policy to list.
    for (method, path) in [
        ("PUT", "/v1/overrides/api"),
        ("PUT", "/v1/overrides/api/"),
        ("DELETE", "/v1/overrides"),
        ("PUT", "/v1/overrides//k"),
    ] {
        let r = send(method, &s.admin_url(path), &[], body.clone()).await;
        assert!(r.status.is_client_error(), "{method} {path}: {}", r.status);
    }
    // The top list's parameters: an unknown policy is a 404 whatever its bytes.
    for query in ["policy=%FF", "policy=%00", &format!("policy={long}")] {
        let r = get(&s.admin_url(&format!("/v1/top?{query}")), &[]).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{query}");
    }
    let r = get(&s.admin_url("/v1/top?n=99999999999999999999999"), &[]).await;
    assert_eq!(r.json()["field"], "n");
    // A parameter given twice is refused, not settled by picking one.
    for (query, field) in [("policy=api&policy=nope", "policy"), ("n=2&n=3", "n")] {
        let r = get(&s.admin_url(&format!("/v1/top?{query}")), &[]).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{query}");
        assert_eq!(r.json()["field"], field, "{query}");
    }
    // The listener still serves, and only the three good overrides exist.
    assert_eq!(
        get(&s.admin_url("/healthz"), &[]).await.status,
        StatusCode::OK
    );
    let listed = get(&s.admin_url("/v1/overrides"), &[]).await.json();
    assert_eq!(listed["overrides"].as_array().unwrap().len(), 3, "{listed}");
    s.stop().await;
}

#[test]
fn every_override_change_is_logged_with_its_reason() {
    with_log(|captured| async move {
        let s = start_text(POLICIES).await;
        let url = s.admin_url("/v1/overrides/api/ip:192.0.2.44");
        let set = |limit: u32, reason: &str| {
            json!({"limit": limit, "expires": "2h", "reason": reason}).to_string()
        };
        let r = send("PUT", &url, &[], set(50, "ticket 1234: launch day")).await;
        assert_eq!(r.status, StatusCode::CREATED);
        let r = send("PUT", &url, &[], set(80, "ticket 1234: more")).await;
        assert_eq!(r.status, StatusCode::OK);
        let r = send("DELETE", &format!("{url}?reason=launch+over"), &[], "").await;
        assert_eq!(r.status, StatusCode::NO_CONTENT);
        // Refused changes change nothing and log no change.
        let r = send("PUT", &url, &[], json!({"limit": 9}).to_string()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        s.stop().await;
        let log = captured.text();
        let changes: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("override set") || l.contains("override removed"))
            .collect();
        assert_eq!(changes.len(), 3, "{log}");
        for (line, quota, reason) in [
            (changes[0], "limit=50", "ticket 1234: launch day"),
            (changes[1], "limit=80", "ticket 1234: more"),
            (changes[2], "", "launch over"),
        ] {
            assert!(line.contains("ip:192.0.2.44"), "{line}");
            assert!(line.contains("policy=api"), "{line}");
            assert!(line.contains(quota), "{line}");
            assert!(line.contains(&format!("reason={reason:?}")), "{line}");
        }
        assert!(changes[0].contains("expires="), "{}", changes[0]);
    });
}
