//! The admin listener's live operations with the memory store: `/v1/top` (who is limited,
//! credentials only as their hash), `/v1/overrides` (decisions and headers follow them, they
//! show in `/v1/policies`, survive a reload, refuse bad input by field), who may write them,
//! `/v1/stats` and the dashboard's files.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use hyper::StatusCode;
use serde_json::{Value, json};

const POLICIES: &str = "[[policy]]\nname = \"api\"\nalgorithm = \"sliding_window_counter\"\nlimit = 3\nwindow = \"1m\"\nkey = [\"header:x-api-key\", \"ip\"]\n\n[[policy]]\nname = \"export\"\nalgorithm = \"token_bucket\"\ncapacity = 4\nrefill = \"1/m\"\nkey = [\"ip\"]\nmatch = { path = \"/export/**\" }\n";

fn attrs(ip: &str, api_key: Option<&str>, path: &str) -> String {
    let mut v = json!({"method": "GET", "path": path, "ip": ip});
    if let Some(k) = api_key {
        v["headers"] = json!({"x-api-key": k});
    }
    v.to_string()
}

async fn put(s: &Running, path: &str, body: Value, headers: &[(&str, &str)]) -> Reply {
    let mut h = vec![("content-type", "application/json")];
    h.extend_from_slice(headers);
    send("PUT", &s.admin_url(path), &h, body.to_string()).await
}

#[tokio::test]
async fn top_lists_the_limited_keys_with_credentials_hashed() {
    let s = start_text(POLICIES).await;
    for _ in 0..7 {
        post_json(&s.url("/v1/check"), &attrs("203.0.113.66", None, "/v1/x")).await;
    }
    for _ in 0..5 {
        post_json(
            &s.url("/v1/check"),
            &attrs("203.0.113.7", Some("secret-key-42"), "/v1/x"),
        )
        .await;
    }
    post_json(&s.url("/v1/check"), &attrs("203.0.113.8", None, "/v1/x")).await;
    let r = get(&s.admin_url("/v1/top?policy=api&n=5"), &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    let body = String::from_utf8_lossy(&r.body).into_owned();
    assert!(
        !body.contains("secret-key-42"),
        "a credential in clear: {body}"
    );
    let top = r.json();
    assert_eq!(top["policy"], "api");
    assert!(top["scope"].as_str().unwrap().starts_with("this instance"));
    let denied = &top["denied"];
    assert_eq!(denied["total"], 4 + 2);
    assert_eq!(
        denied["keys"][0],
        json!({"key": "ip:203.0.113.66", "count": 4, "error": 0})
    );
    let hashed = denied["keys"][1]["key"].as_str().unwrap();
    let hash = hashed.strip_prefix("header:x-api-key:").unwrap();
    assert!(
        hash.len() == 32 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
        "{hashed}"
    );
    assert_eq!(denied["keys"][1]["count"], 2);
    let requests = &top["requests"];
    assert_eq!(requests["total"], 13);
    assert_eq!(
        requests["keys"][2],
        json!({"key": "ip:203.0.113.8", "count": 1, "error": 0})
    );

    // Every policy at once; bad parameters by name; unknown policy 404.
    let all = get(&s.admin_url("/v1/top"), &[]).await.json();
    assert_eq!(all["policies"].as_array().unwrap().len(), 2);
    for (query, field) in [
        ("policy=api&n=0", "n"),
        ("n=x", "n"),
        ("colour=red", "colour"),
    ] {
        let r = get(&s.admin_url(&format!("/v1/top?{query}")), &[]).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{query}");
        assert_eq!(r.json()["field"], field);
    }
    let r = get(&s.admin_url("/v1/top?policy=nope"), &[]).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    s.stop().await;
}

#[tokio::test]
async fn an_override_changes_the_next_decisions_and_shows_everywhere() {
    let s = start_text(POLICIES).await;
    let check = attrs("198.51.100.9", None, "/v1/x");
    let r = put(
        &s,
        "/v1/overrides/api/ip:198.51.100.9",
        json!({"limit": 5, "reason": "incident 7: a partner's batch job"}),
        &[],
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.json());
    let set = r.json();
    assert_eq!(set["quota"], "sliding_window_counter limit=5 window=1m");
    assert_eq!(set["reason"], "incident 7: a partner's batch job");
    for i in 0..6 {
        let r = post_json(&s.url("/v1/check"), &check).await;
        assert_eq!(r.status == StatusCode::OK, i < 5, "request {i}");
        assert_eq!(r.header("x-ratelimit-limit"), Some("5"));
        assert_eq!(r.header("ratelimit-policy"), Some("\"api\";q=5;w=60"));
    }
    // Another key keeps the configured quota.
    let r = post_json(&s.url("/v1/check"), &attrs("198.51.100.10", None, "/v1/x")).await;
    assert_eq!(r.header("x-ratelimit-limit"), Some("3"));
    // By policy name too: the key as given is the store key.
    put(
        &s,
        "/v1/overrides/api/customer-42",
        json!({"limit": 1, "reason": "r"}),
        &[],
    )
    .await;
    let by_name = r#"{"policy":"api","key":"customer-42"}"#;
    let r = post_json(&s.url("/v1/check"), by_name).await;
    assert_eq!(
        (r.status, r.json()["limit"].clone()),
        (StatusCode::OK, json!(1))
    );
    assert_eq!(r.header("x-ratelimit-limit"), Some("1"));
    assert_eq!(
        post_json(&s.url("/v1/check"), by_name).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );

    // Listed, one by one, and in /v1/policies.
    let list = get(&s.admin_url("/v1/overrides"), &[]).await.json();
    assert_eq!(list["overrides"].as_array().unwrap().len(), 2);
    let one = get(&s.admin_url("/v1/overrides/api/ip%3A198.51.100.9"), &[]).await;
    assert_eq!(one.json()["limit"], 5);
    let policies = get(&s.admin_url("/v1/policies"), &[]).await.json();
    let api = &policies["policies"][0];
    assert_eq!(api["overrides"].as_array().unwrap().len(), 2);
    assert_eq!(policies["policies"][1]["overrides"], json!([]));

    // Removed: the key is back on the configured quota.
    let r = send(
        "DELETE",
        &s.admin_url("/v1/overrides/api/ip:198.51.100.9?reason=done"),
        &[],
        "",
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let r = post_json(&s.url("/v1/check"), &check).await;
    assert_eq!(r.header("x-ratelimit-limit"), Some("3"));
    let r = send(
        "DELETE",
        &s.admin_url("/v1/overrides/api/ip:198.51.100.9"),
        &[],
        "",
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    s.stop().await;
}

#[tokio::test]
async fn bad_overrides_are_refused_by_field_and_unknown_policies_by_404() {
    let s = start_text(POLICIES).await;
    for (path, body, field) in [
        (
            "/v1/overrides/api/ip:1.2.3.4",
            json!({"capacity": 3, "reason": "r"}),
            "capacity",
        ),
        (
            "/v1/overrides/export/ip:1.2.3.4",
            json!({"limit": 3, "reason": "r"}),
            "limit",
        ),
        (
            "/v1/overrides/export/ip:1.2.3.4",
            json!({"refill": "often", "reason": "r"}),
            "refill",
        ),
        (
            "/v1/overrides/api/ip:1.2.3.4",
            json!({"limit": 3}),
            "reason",
        ),
        (
            "/v1/overrides/api/ip:1.2.3.4",
            json!({"reason": "r"}),
            "limit",
        ),
        (
            "/v1/overrides/api/ip:1.2.3.4",
            json!({"limit": 3, "reason": "r", "expires": "never"}),
            "expires",
        ),
        (
            "/v1/overrides/api/%FF",
            json!({"limit": 3, "reason": "r"}),
            "key",
        ),
    ] {
        let r = put(&s, path, body.clone(), &[]).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{path} {body}");
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert_eq!(r.json()["field"], field, "{path} {body}");
    }
    let r = send("PUT", &s.admin_url("/v1/overrides/api/k"), &[], "{not json").await;
    assert_eq!(r.json()["field"], "body");
    let r = put(
        &s,
        "/v1/overrides/nope/ip:1.2.3.4",
        json!({"limit": 3, "reason": "r"}),
        &[],
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(
        get(&s.admin_url("/v1/overrides/nope"), &[]).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(&s.admin_url("/v1/overrides"), &[]).await.json()["overrides"],
        json!([])
    );
    s.stop().await;
}

#[tokio::test]
async fn overrides_survive_a_reload_and_follow_the_policy() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.toml");
    std::fs::write(&path, with_ports(POLICIES)).unwrap();
    let s = start(tollgate_server::Config::load(&path).unwrap()).await;
    put(
        &s,
        "/v1/overrides/api/ip:192.0.2.1",
        json!({"limit": 10, "reason": "r"}),
        &[],
    )
    .await;
    // A reload that changes the policy's window: the override keeps its limit, takes the new
    // window, and still applies.
    std::fs::write(
        &path,
        with_ports(&POLICIES.replace("window = \"1m\"", "window = \"1h\"")),
    )
    .unwrap();
    wait_for(|| async {
        get(&s.admin_url("/v1/policies"), &[]).await.json()["policies"][0]["window_seconds"]
            == 3600.0
    })
    .await;
    let r = post_json(&s.url("/v1/check"), &attrs("192.0.2.1", None, "/v1/x")).await;
    assert_eq!(r.header("ratelimit-policy"), Some("\"api\";q=10;w=3600"));
    // A reload that makes the policy a token bucket: the override no longer fits; it is kept,
    // shown as inactive with why, and the key is decided by the policy.
    let bucket = POLICIES.replacen(
        "algorithm = \"sliding_window_counter\"\nlimit = 3\nwindow = \"1m\"",
        "algorithm = \"token_bucket\"\ncapacity = 3\nrefill = \"1/s\"",
        1,
    );
    std::fs::write(&path, with_ports(&bucket)).unwrap();
    wait_for(|| async {
        get(&s.admin_url("/v1/policies"), &[]).await.json()["policies"][0]["algorithm"]
            == "token_bucket"
    })
    .await;
    let listed = get(&s.admin_url("/v1/overrides/api/ip:192.0.2.1"), &[])
        .await
        .json();
    assert_eq!(listed["active"], false);
    assert!(
        listed["inactive_reason"]
            .as_str()
            .unwrap()
            .contains("limit"),
        "{listed}"
    );
    let r = post_json(&s.url("/v1/check"), &attrs("192.0.2.1", None, "/v1/x")).await;
    assert_eq!(r.header("x-ratelimit-limit"), Some("3"));
    s.stop().await;
}

#[tokio::test]
async fn writes_need_the_token_unless_the_admin_listener_is_loopback_only() {
    let open = "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"0.0.0.0:0\"\n";
    let config = tollgate_server::Config::parse("t.toml", &format!("{open}{POLICIES}")).unwrap();
    let s = start(config).await;
    let url = format!("http://127.0.0.1:{}/v1/overrides/api/k", s.admin.port());
    let body = json!({"limit": 5, "reason": "r"}).to_string();
    let r = send("PUT", &url, &[], body.clone()).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(
        r.json()["detail"]
            .as_str()
            .unwrap()
            .contains("[admin] token")
    );
    assert_eq!(
        send("GET", &url, &[], "").await.status,
        StatusCode::NOT_FOUND
    );
    s.stop().await;

    let with_token = format!("{}token = \"sesame\"\n{POLICIES}", open);
    let s = start(tollgate_server::Config::parse("t.toml", &with_token).unwrap()).await;
    let url = format!("http://127.0.0.1:{}/v1/overrides/api/k", s.admin.port());
    assert_eq!(
        send("PUT", &url, &[], body.clone()).await.status,
        StatusCode::UNAUTHORIZED
    );
    let r = send("PUT", &url, &[("authorization", "Bearer sesame")], body).await;
    assert_eq!(r.status, StatusCode::CREATED);
    // The dashboard's files hold no data: served without the token.
    let page = get(&format!("http://127.0.0.1:{}/", s.admin.port()), &[]).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.header("content-security-policy")
            .unwrap()
            .contains("script-src 'self'")
    );
    s.stop().await;
}

/// Without a token, a write through a browser that was made to resolve another name to this
/// listener (DNS rebinding) names that other host, and is refused; a client that names this
/// listener (localhost, its address) is served. Liveness and readiness need no token even when
/// one is set: probes cannot carry a secret without writing it into a manifest.
#[tokio::test]
async fn writes_without_a_token_need_this_listeners_host_and_probes_need_no_token() {
    let s = start_text(POLICIES).await;
    let port = s.admin.port();
    let url = s.admin_url("/v1/overrides/api/k");
    let body = json!({"limit": 5, "reason": "r"}).to_string();
    for foreign in [
        format!("evil.example:{port}"),
        "evil.example".to_owned(),
        format!("198.51.100.7:{port}"),
    ] {
        let r = send("PUT", &url, &[("host", &foreign)], body.clone()).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "Host: {foreign}");
    }
    // Reads stay open to any name (a Prometheus scraping a service name).
    let r = get(&url, &[("host", "tollgate.monitoring.svc:9090")]).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    for own in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        "localhost".to_owned(),
    ] {
        let r = send("PUT", &url, &[("host", &own)], body.clone()).await;
        assert!(r.status.is_success(), "Host: {own}: {}", r.status);
    }
    s.stop().await;

    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"sesame\"\n{POLICIES}"
    );
    let s = start(tollgate_server::Config::parse("t.toml", &text).unwrap()).await;
    for probe in ["/healthz", "/readyz"] {
        assert_eq!(
            get(&s.admin_url(probe), &[]).await.status,
            StatusCode::OK,
            "{probe}"
        );
    }
    assert_eq!(
        get(&s.admin_url("/metrics"), &[]).await.status,
        StatusCode::UNAUTHORIZED
    );
    s.stop().await;
}

#[tokio::test]
async fn stats_count_decisions_per_policy_and_report_the_store() {
    let s = start_text(POLICIES).await;
    for _ in 0..4 {
        post_json(&s.url("/v1/check"), &attrs("203.0.113.1", None, "/v1/x")).await;
    }
    let stats = get(&s.admin_url("/v1/stats"), &[]).await.json();
    assert_eq!(stats["policies"][0]["name"], "api");
    assert_eq!(
        (
            stats["policies"][0]["allowed"].clone(),
            stats["policies"][0]["denied"].clone()
        ),
        (json!(3), json!(1))
    );
    assert_eq!(stats["store"]["kind"], "memory");
    assert_eq!(stats["store"]["ready"], true);
    assert!(stats["time_ms"].as_u64().unwrap() > 1_600_000_000_000);
    for (path, kind) in [
        ("/", "text/html"),
        ("/dashboard.js", "text/javascript"),
        ("/dashboard.css", "text/css"),
    ] {
        let r = get(&s.admin_url(path), &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert!(
            r.header("content-type").unwrap().starts_with(kind),
            "{path}"
        );
    }
    s.stop().await;
}
