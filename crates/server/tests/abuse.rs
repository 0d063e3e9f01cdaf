//! Lockouts and allow/deny lists through a running server on the memory store: a hammering
//! client is banned past its window until the ban ends or an operator lifts it; lists refuse
//! or let through before any policy, change live through the admin API, survive a reload, and
//! bad input is refused naming the field. Short durations; every wait has a deadline.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use hyper::StatusCode;
use serde_json::{Value, json};

const LOGIN: &str = "[[policy]]\nname = \"login\"\nalgorithm = \"fixed_window\"\nlimit = 2\n\
window = \"1s\"\nkey = [\"ip\"]\nmatch = { path = \"/login\" }\n\
ban = { after = 3, within = \"10s\", for = \"3s\" }\n";

const LISTS: &str = "[[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 1\n\
window = \"1m\"\nkey = [\"ip\"]\n\n\
[[list]]\nname = \"partners\"\naction = \"allow\"\nips = [\"203.0.113.0/24\"]\n\n\
[[list]]\nname = \"blocked\"\naction = \"deny\"\nips = [\"198.51.100.0/24\"]\n";

fn login(ip: &str) -> String {
    json!({"path": "/login", "method": "POST", "ip": ip}).to_string()
}

fn check(ip: &str) -> String {
    json!({"path": "/v1/x", "ip": ip}).to_string()
}

/// Hammers `/login` as `ip` until it is banned (within a deadline): the reply that said so.
async fn hammer_until_banned(s: &Running, ip: &str) -> Reply {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = post_json(&s.url("/v1/check"), &login(ip)).await;
        if r.status == StatusCode::TOO_MANY_REQUESTS && r.json()["banned"] == true {
            return r;
        }
        assert!(std::time::Instant::now() < deadline, "never banned");
    }
}

async fn send_json(method: &str, url: &str, body: Value) -> Reply {
    send(
        method,
        url,
        &[("content-type", "application/json")],
        body.to_string(),
    )
    .await
}

#[tokio::test]
async fn a_hammering_client_is_banned_past_its_window_until_lifted() {
    let s = start_text(LOGIN).await;
    let ip = "192.0.2.77";
    let banned = hammer_until_banned(&s, ip).await;
    let retry: u64 = banned.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=3).contains(&retry), "{retry}");
    assert_eq!(banned.json()["policy"], "login");
    // Its window (1 s) resets; the ban (3 s) holds. Waiting past the window is the point.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = post_json(&s.url("/v1/check"), &login(ip)).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.json()["banned"], true);
    // A check by policy and key says so too, with the ban's end as its retry_after.
    let by_key = post_json(
        &s.url("/v1/check"),
        &json!({"policy": "login", "key": format!("ip:{ip}")}).to_string(),
    )
    .await;
    assert_eq!(by_key.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(by_key.json()["banned"], true, "{:?}", by_key.body);
    // Others are not banned with it, and a plain answer has no such field.
    let other = post_json(&s.url("/v1/check"), &login("192.0.2.78")).await;
    assert_eq!(other.status, StatusCode::OK);
    let other = post_json(
        &s.url("/v1/check"),
        &json!({"policy": "login", "key": "ip:192.0.2.79"}).to_string(),
    )
    .await;
    assert_eq!(other.json().get("banned"), None, "{:?}", other.body);

    // Operators see it, and lift it.
    let listed = get(&s.admin_url("/v1/bans"), &[]).await.json();
    let bans = listed["bans"].as_array().unwrap();
    assert_eq!(bans.len(), 1, "{listed}");
    assert_eq!(bans[0]["policy"], "login");
    assert_eq!(bans[0]["key"], format!("ip:{ip}"));
    assert!(bans[0]["denials"].as_u64().unwrap() >= 3, "{listed}");
    // To the millisecond, so the ban's length is its `for` exactly.
    let at = |field: &str| {
        let text = bans[0][field].as_str().unwrap();
        assert!(text.ends_with('Z'), "{listed}");
        let format = time::format_description::well_known::Rfc3339;
        time::OffsetDateTime::parse(text, &format).unwrap()
    };
    assert_eq!(
        at("until") - at("since"),
        time::Duration::seconds(3),
        "{listed}"
    );
    let lift = send_json(
        "DELETE",
        &s.admin_url("/v1/bans/login/ip%3A192.0.2.77"),
        json!({"reason": "false alarm"}),
    )
    .await;
    assert_eq!(lift.status, StatusCode::NO_CONTENT);
    let r = post_json(&s.url("/v1/check"), &login(ip)).await;
    assert_eq!(r.status, StatusCode::OK, "let in at once");
    assert_eq!(
        get(&s.admin_url("/v1/bans"), &[]).await.json()["bans"],
        json!([])
    );
    let again = send(
        "DELETE",
        &s.admin_url("/v1/bans/login/ip%3A192.0.2.77"),
        &[],
        "",
    )
    .await;
    assert_eq!(again.status, StatusCode::NOT_FOUND);

    // Banned again, the ban ends by itself.
    hammer_until_banned(&s, ip).await;
    wait_for(|| async {
        post_json(&s.url("/v1/check"), &login(ip)).await.status == StatusCode::OK
    })
    .await;
    let metrics =
        String::from_utf8(get(&s.admin_url("/metrics"), &[]).await.body.to_vec()).unwrap();
    assert!(
        metrics.contains("tollgate_bans_started_total{policy=\"login\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("# TYPE tollgate_bans_active gauge"),
        "{metrics}"
    );
    s.stop().await;
}

#[tokio::test]
async fn a_ban_through_the_proxy_is_a_429_that_says_banned() {
    let up = upstream().await;
    let text = format!("[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{up}\"\n\n{LOGIN}");
    let s = start_text(&text).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let body = loop {
        let r = send("POST", &s.proxy_url("/login"), &[], "").await;
        if r.status == StatusCode::TOO_MANY_REQUESTS {
            let body = r.json();
            if body["title"] == "Banned" {
                assert!(r.header("retry-after").is_some());
                assert_eq!(r.header("content-type"), Some("application/problem+json"));
                break body;
            }
        }
        assert!(std::time::Instant::now() < deadline, "never banned");
    };
    assert_eq!(body["violated-policies"], json!(["login"]));
    assert!(body["detail"].as_str().unwrap().contains("until"), "{body}");
    s.stop().await;
}

#[tokio::test]
async fn lists_refuse_or_let_through_and_change_live() {
    let s = start_text(LISTS).await;
    let r = post_json(&s.url("/v1/check"), &check("198.51.100.20")).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let body = r.json();
    assert_eq!(body["title"], "Forbidden");
    assert!(
        body["detail"].as_str().unwrap().contains("\"blocked\""),
        "{body}"
    );
    for _ in 0..5 {
        let r = post_json(&s.url("/v1/check"), &check("203.0.113.9")).await;
        assert_eq!(r.status, StatusCode::OK, "partners are never limited");
    }
    // A live deny entry applies at once; removing it unblocks.
    let ip = "192.0.2.44";
    assert_eq!(
        post_json(&s.url("/v1/check"), &check(ip)).await.status,
        StatusCode::OK
    );
    let put = send_json(
        "PUT",
        &s.admin_url("/v1/lists/blocked/entries/192.0.2.0%2F24"),
        json!({"reason": "credential stuffing", "expires": "2h"}),
    )
    .await;
    assert_eq!(put.status, StatusCode::CREATED, "{:?}", put.body);
    assert_eq!(put.json()["entry"], "192.0.2.0/24");
    assert_eq!(
        post_json(&s.url("/v1/check"), &check(ip)).await.status,
        StatusCode::FORBIDDEN
    );
    let lists = get(&s.admin_url("/v1/lists"), &[]).await.json();
    let blocked = &lists["lists"][1];
    assert_eq!(blocked["name"], "blocked");
    assert_eq!(blocked["action"], "deny");
    assert_eq!(blocked["entries"], json!(["198.51.100.0/24"]));
    assert_eq!(blocked["live"][0]["entry"], "192.0.2.0/24");
    assert_eq!(blocked["live"][0]["reason"], "credential stuffing");
    assert!(blocked["live"][0]["expires"].as_str().is_some(), "{lists}");
    // The memory store without a `path`: the process keeps them until it stops.
    assert_eq!(
        lists["shared"],
        "this process: kept across reloads, lost on restart"
    );
    // Setting it again replaces it (200).
    let again = send_json(
        "PUT",
        &s.admin_url("/v1/lists/blocked/entries/192.0.2.0/24"),
        json!({"reason": "still at it"}),
    )
    .await;
    assert_eq!(again.status, StatusCode::OK);
    let del = send_json(
        "DELETE",
        &s.admin_url("/v1/lists/blocked/entries/192.0.2.0%2F24"),
        json!({"reason": "over"}),
    )
    .await;
    assert_eq!(del.status, StatusCode::NO_CONTENT);
    assert_eq!(
        post_json(&s.url("/v1/check"), &check(ip)).await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "back under the policy, whose one request was spent"
    );
    let metrics =
        String::from_utf8(get(&s.admin_url("/metrics"), &[]).await.body.to_vec()).unwrap();
    assert!(
        metrics.contains("tollgate_list_matches_total{list=\"partners\",action=\"allow\"} 5"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tollgate_list_matches_total{list=\"blocked\",action=\"deny\"} 2"),
        "{metrics}"
    );
    s.stop().await;
}

#[tokio::test]
async fn bad_list_changes_are_refused_naming_the_field() {
    let s = start_text(LISTS).await;
    let url = |path: &str| s.admin_url(path);
    let cases = [
        (
            "/v1/lists/blocked/entries/10.0.0.0%2F33",
            json!({"reason": "r"}),
            "entry",
        ),
        (
            "/v1/lists/blocked/entries/header%3Ax-api-key%3Aplain",
            json!({"reason": "r"}),
            "entry",
        ),
        ("/v1/lists/blocked/entries/10.0.0.1", json!({}), "reason"),
        (
            "/v1/lists/blocked/entries/10.0.0.1",
            json!({"reason": 5}),
            "reason",
        ),
        (
            "/v1/lists/blocked/entries/10.0.0.1",
            json!({"reason": "r", "expires": "2001-01-01T00:00:00Z"}),
            "expires",
        ),
        (
            "/v1/lists/blocked/entries/10.0.0.1",
            json!({"reason": "r", "ttl": 5}),
            "ttl",
        ),
    ];
    for (path, body, field) in cases {
        let r = send_json("PUT", &url(path), body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(r.json()["field"], field, "{path}: {:?}", r.body);
    }
    // `ip:` keys that no request has: a network written as a key, an IPv6 network at another
    // length than clients are keyed by (64 here, the default).
    for (entry, says) in [
        ("ip%3A0.0.0.0%2F0", "without ip:"),
        ("ip%3A2001%3Adb8%3A1%3A%3A%2F48", "/64 network"),
    ] {
        let r = send_json(
            "PUT",
            &url(&format!("/v1/lists/blocked/entries/{entry}")),
            json!({"reason": "r"}),
        )
        .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{entry}");
        let detail = r.json()["detail"].as_str().unwrap_or_default().to_owned();
        assert!(detail.contains(says), "{entry}: {detail}");
    }
    // A header no policy or configured list reads could never match behind the proxy.
    let r = send_json(
        "PUT",
        &url("/v1/lists/blocked/entries/header%3Ax-other%3A0123456789abcdef0123456789abcdef"),
        json!({"reason": "r"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["field"], "entry");
    let r = send_json(
        "PUT",
        &url("/v1/lists/nope/entries/10.0.0.1"),
        json!({"reason": "r"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.json()["title"], "Unknown list");
    let r = send(
        "DELETE",
        &url("/v1/lists/blocked/entries/10.9.9.9"),
        &[],
        "",
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = send("DELETE", &url("/v1/bans/login/nobody"), &[], "").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    s.stop().await;
}

#[tokio::test]
async fn live_entries_survive_a_reload() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.toml");
    std::fs::write(&path, with_ports(LISTS)).unwrap();
    let s = start(tollgate_server::Config::load(&path).unwrap()).await;
    let put = send_json(
        "PUT",
        &s.admin_url("/v1/lists/partners/entries/192.0.2.8"),
        json!({"reason": "new partner"}),
    )
    .await;
    assert_eq!(put.status, StatusCode::CREATED);
    std::fs::write(
        &path,
        with_ports(&LISTS.replace("limit = 1\n", "limit = 2\n")),
    )
    .unwrap();
    wait_for(|| async {
        get(&s.admin_url("/v1/policies"), &[]).await.json()["policies"][0]["limit"] == 2
    })
    .await;
    for _ in 0..4 {
        let r = post_json(&s.url("/v1/check"), &check("192.0.2.8")).await;
        assert_eq!(r.status, StatusCode::OK, "still a partner after the reload");
    }
    s.stop().await;
}
