//! Abuse controls at their edges: allow and deny list entries that no request could match are
//! refused, in the configuration and through the admin API, rather than accepted and silently
//! never applied; expiries far in the future are read as the times they are; an IPv4-mapped
//! entry is its IPv4 entry; and a policy that delays rather than rejects still bans.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use hyper::StatusCode;
use serde_json::json;

const LISTS: &str = "[[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 100\n\
window = \"1m\"\nkey = [\"header:x-api-key\", \"ip\"]\n\n\
[[list]]\nname = \"blocked\"\naction = \"deny\"\nips = [\"198.51.100.0/24\"]\n";

async fn put(s: &Running, entry: &str, body: serde_json::Value) -> Reply {
    send(
        "PUT",
        &s.admin_url(&format!("/v1/lists/blocked/entries/{entry}")),
        &[("content-type", "application/json")],
        body.to_string(),
    )
    .await
}

/// `/v1/top` shows a header key with the header's name in lower case, as HTTP/2 sends it and
/// as the request's key is built: an entry that spells it otherwise could never match, so it
/// is refused saying what to write, not accepted as a deny entry that denies nobody.
#[tokio::test]
async fn a_header_key_entry_in_another_case_is_refused_saying_what_to_write() {
    let s = start_text(LISTS).await;
    // The key a client with `x-api-key: k1` is counted under, as /v1/top shows it.
    let described = json!({"path": "/x", "headers": {"X-Api-Key": "k1"}, "ip": "192.0.2.9"});
    let r = post_json(&s.url("/v1/check"), &described.to_string()).await;
    assert_eq!(r.status, StatusCode::OK);
    let top = get(&s.admin_url("/v1/top?policy=api"), &[]).await.json();
    let key = top["requests"]["keys"][0]["key"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(key.starts_with("header:x-api-key:"), "{key}");
    let shouted = key.replacen("x-api-key", "X-Api-Key", 1);
    let r = put(&s, &shouted, json!({"reason": "r"})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{:?}", r.body);
    assert_eq!(r.json()["field"], "entry");
    let detail = r.json()["detail"].as_str().unwrap_or_default().to_owned();
    assert!(detail.contains(&key), "says what to write: {detail}");
    // As /v1/top shows it, it applies.
    let r = put(&s, &key, json!({"reason": "r"})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let r = post_json(&s.url("/v1/check"), &described.to_string()).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    s.stop().await;
}

#[test]
fn a_configured_header_key_in_another_case_is_a_configuration_error() {
    let text = with_ports(
        "[[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1m\"\n\
         key = [\"header:x-api-key\"]\n\n[[list]]\nname = \"blocked\"\naction = \"deny\"\n\
         keys = [\"header:X-Api-Key:0f1e2d3c4b5a69788796a5b4c3d2e1f0\"]\n",
    );
    let e = tollgate_server::Config::parse("test.toml", &text)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("header:x-api-key:0f1e2d3c4b5a69788796a5b4c3d2e1f0"),
        "refused, saying what to write: {e}"
    );
}

/// A `jwt:` entry in a configuration without `[jwt]` can never match (no request has such a
/// key): refused, as the admin API refuses it.
#[test]
fn a_configured_jwt_key_without_jwt_is_a_configuration_error() {
    let text = with_ports(
        "[[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1m\"\n\
         key = [\"ip\"]\n\n[[list]]\nname = \"blocked\"\naction = \"deny\"\n\
         keys = [\"jwt:sub:0f1e2d3c4b5a69788796a5b4c3d2e1f0\"]\n",
    );
    // Found where the engine is built: at start, at a reload, and by `tollgate validate`.
    let config = tollgate_server::Config::parse("test.toml", &text).unwrap();
    let built = tollgate_server::http_engine(
        &config,
        tollgate::MemoryStore::new(),
        tollgate::SystemClock::new(),
    );
    let e = built.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("[jwt]"), "refused, naming [jwt]: {e}");
}

/// A user id the store keys by its digest (longer than 256 bytes, or beginning with `#`) is
/// shown by `/v1/top` as `user:#<digest>`: an entry with the id itself could never match.
#[tokio::test]
async fn a_user_entry_no_key_can_have_is_refused() {
    let s = start_text(LISTS).await;
    let long = format!("user%3A{}", "a".repeat(300));
    for entry in [long.as_str(), "user%3A%23abc"] {
        let r = put(&s, entry, json!({"reason": "r"})).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{entry}: {:?}", r.body);
        assert_eq!(r.json()["field"], "entry");
    }
    // The digest form /v1/top shows is an entry like any other.
    let r = put(
        &s,
        "user%3A%230f1e2d3c4b5a69788796a5b4c3d2e1f0",
        json!({"reason": "r"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    s.stop().await;
}

/// An expiry as far as the calendar goes is a time like any other; one past it is refused
/// as too far, never answered "is not in the future" nor kept with `"expires": null`.
#[tokio::test]
async fn far_expiries_are_kept_or_refused_as_too_far() {
    let s = start_text(LISTS).await;
    let r = put(
        &s,
        "192.0.2.1",
        json!({"reason": "r", "expires": "9999-12-31T23:59:59Z"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    assert_eq!(r.json()["expires"], "9999-12-31T23:59:59Z");
    let r = put(
        &s,
        "192.0.2.2",
        json!({"reason": "r", "expires": "3000-01-01T00:00:00Z"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    assert_eq!(r.json()["expires"], "3000-01-01T00:00:00Z");
    for far in ["3000000d", "99999999999d"] {
        let r = put(&s, "192.0.2.3", json!({"reason": "r", "expires": far})).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{far}: {:?}", r.body);
        assert_eq!(r.json()["field"], "expires");
        let detail = r.json()["detail"].as_str().unwrap_or_default().to_owned();
        assert!(detail.contains("9999"), "{far}: {detail}");
    }
    s.stop().await;
}

/// An IPv4-mapped address (`::ffff:192.0.2.7`) is kept as its IPv4 entry, which it matches
/// anyway: one entry, which deleting either form removes, never two that look unrelated.
#[tokio::test]
async fn a_mapped_entry_is_its_ipv4_entry() {
    let s = start_text(LISTS).await;
    let described = json!({"path": "/x", "ip": "192.0.2.7"}).to_string();
    let r = put(&s, "%3A%3Affff%3A192.0.2.7", json!({"reason": "r"})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    assert_eq!(r.json()["entry"], "192.0.2.7/32");
    let r = put(&s, "192.0.2.7", json!({"reason": "again"})).await;
    assert_eq!(r.status, StatusCode::OK, "the same entry, replaced");
    let r = put(&s, "%3A%3Affff%3A192.0.2.0%2F120", json!({"reason": "r"})).await;
    assert_eq!(r.json()["entry"], "192.0.2.0/24");
    assert_eq!(
        post_json(&s.url("/v1/check"), &described).await.status,
        StatusCode::FORBIDDEN
    );
    for entry in ["192.0.2.7", "%3A%3Affff%3A192.0.2.0%2F120"] {
        let r = send(
            "DELETE",
            &s.admin_url(&format!("/v1/lists/blocked/entries/{entry}")),
            &[],
            "",
        )
        .await;
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{entry}");
    }
    assert_eq!(
        post_json(&s.url("/v1/check"), &described).await.status,
        StatusCode::OK
    );
    // A zone id names an interface of this host, not a client: refused as an address.
    let r = put(&s, "fe80%3A%3A1%25eth0", json!({"reason": "r"})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let detail = r.json()["detail"].as_str().unwrap_or_default().to_owned();
    assert!(detail.contains("zone"), "{detail}");
    s.stop().await;
}

/// A `delay` policy's denials (a request that would wait past `max_delay`) count towards its
/// ban like any policy's: the bound it is compiled with keeps the rule.
#[tokio::test]
async fn a_delay_policy_bans_too() {
    let s = start_text(
        "[[policy]]\nname = \"hooks\"\nalgorithm = \"leaky_bucket\"\nrate = \"1/m\"\nqueue = 0\n\
         action = \"delay\"\nmax_delay = \"1s\"\nkey = [\"ip\"]\n\
         ban = { after = 2, within = \"1m\", for = \"1h\" }\n",
    )
    .await;
    let ask = json!({"path": "/hooks", "ip": "192.0.2.5"}).to_string();
    let mut replies = Vec::new();
    for _ in 0..4 {
        let r = post_json(&s.url("/v1/check"), &ask).await;
        replies.push((r.status, r.json()["banned"].clone()));
    }
    assert_eq!(replies[0].0, StatusCode::OK);
    assert_eq!(replies[1].0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        replies[2],
        (StatusCode::TOO_MANY_REQUESTS, json!(true)),
        "the second denial starts the ban: {replies:?}"
    );
    assert_eq!(replies[3].1, json!(true), "{replies:?}");
    let bans = get(&s.admin_url("/v1/bans"), &[]).await.json();
    assert_eq!(bans["bans"][0]["policy"], "hooks", "{bans}");
    s.stop().await;
}
