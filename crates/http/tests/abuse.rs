//! Lockouts and allow/deny lists through the tower layer (the engine every door shares): a
//! banned client's 429 says it is a ban and lasts past its window; a denied range gets a 403
//! naming its list before any policy; an allowed partner is never limited; live entries change
//! what the next request sees.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use http::StatusCode;
use tollgate::Ban;
use tollgate_http::{HttpPolicy, KeyChain, ListAction, ListEntry, ListSpec, RequestInfo};

fn entries(items: &[&str]) -> Vec<ListEntry> {
    items.iter().map(|e| ListEntry::parse(e).unwrap()).collect()
}

fn lists() -> Vec<ListSpec> {
    vec![
        ListSpec {
            name: "partners".into(),
            action: ListAction::Allow,
            entries: entries(&["203.0.113.0/24", "2001:db8::/32"]),
        },
        ListSpec {
            name: "blocked".into(),
            action: ListAction::Deny,
            entries: entries(&["198.51.100.0/24", "203.0.113.66"]),
        },
    ]
}

fn one_per_minute() -> HttpPolicy {
    policy(fixed("api", 1, 60), &["ip"], None)
}

#[tokio::test]
async fn deny_lists_refuse_allow_lists_pass_and_deny_wins() {
    let engine = builder(manual_clock())
        .policy(one_per_minute())
        .lists(lists())
        .build()
        .unwrap();
    let app = app(engine);
    let r = send(&app, get("/x", "198.51.100.9", &[])).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(header(&r, "content-type"), Some("application/problem+json"));
    let body = body_json(r).await;
    assert_eq!(body["title"], "Forbidden");
    assert!(
        body["detail"].as_str().unwrap().contains("\"blocked\""),
        "{body}"
    );
    assert!(
        !body.to_string().contains("198.51.100"),
        "never the entry: {body}"
    );
    // An IPv4-mapped IPv6 peer is its IPv4 address.
    assert_eq!(
        status(&app, get("/x", "::ffff:198.51.100.200", &[])).await,
        StatusCode::FORBIDDEN
    );
    // Partners are never limited (the policy allows one a minute), with no rate-limit headers.
    for ip in ["203.0.113.5", "2001:db8:7::1"] {
        for _ in 0..5 {
            let r = send(&app, get("/x", ip, &[])).await;
            assert_eq!(r.status(), StatusCode::OK, "{ip}");
            assert!(header(&r, "ratelimit").is_none());
        }
    }
    // Inside the partners' range, but on the deny list too: deny wins.
    assert_eq!(
        status(&app, get("/x", "203.0.113.66", &[])).await,
        StatusCode::FORBIDDEN
    );
    // Anyone else is limited as usual.
    assert_eq!(
        status(&app, get("/x", "192.0.2.1", &[])).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&app, get("/x", "192.0.2.1", &[])).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn key_entries_match_the_key_as_top_shows_it_and_live_entries_apply_at_once() {
    let keyed = policy(fixed("keyed", 1, 60), &["header:x-api-key", "ip"], None);
    let engine = builder(manual_clock())
        .policy(keyed)
        .lists(lists())
        .build()
        .unwrap();
    // The key the store counts this API key under: what /v1/top shows.
    let headers = {
        let mut h = http::HeaderMap::new();
        h.insert("x-api-key", "secret-partner-key".parse().unwrap());
        h
    };
    let method = http::Method::GET;
    let info =
        RequestInfo::new(&method, "/x", &headers).with_peer(Some("192.0.2.9".parse().unwrap()));
    let prepared = engine.prepare(&info);
    let (_, key) = prepared.keys().next().unwrap();
    let key = String::from_utf8(key.to_vec()).unwrap();
    assert!(key.starts_with("header:x-api-key:"), "{key}");

    let app = app(engine.clone());
    let with_key = [("x-api-key", "secret-partner-key")];
    assert_eq!(
        status(&app, get("/x", "192.0.2.9", &with_key)).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&app, get("/x", "192.0.2.9", &with_key)).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    engine.set_live_list_entries(vec![("partners".into(), ListEntry::parse(&key).unwrap())]);
    for _ in 0..3 {
        assert_eq!(
            status(&app, get("/x", "192.0.2.9", &with_key)).await,
            StatusCode::OK
        );
    }
    engine.set_live_list_entries(vec![(
        "blocked".into(),
        ListEntry::parse("192.0.2.0/28").unwrap(),
    )]);
    assert_eq!(
        status(&app, get("/x", "192.0.2.9", &with_key)).await,
        StatusCode::FORBIDDEN
    );
    engine.set_live_list_entries(Vec::new());
    assert_eq!(
        status(&app, get("/x", "192.0.2.9", &with_key)).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Entries of a list the engine does not have are ignored.
    engine.set_live_list_entries(vec![(
        "nope".into(),
        ListEntry::parse("192.0.2.9").unwrap(),
    )]);
    assert_eq!(
        status(&app, get("/x", "192.0.2.9", &with_key)).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[test]
fn entries_are_checked() {
    assert!(matches!(
        ListEntry::parse("10.0.0.0/8").unwrap(),
        ListEntry::Ip(_)
    ));
    for bad in ["10.0.0.0/33", "300.1.2.3", "2001:db8::/129", "10.0.0.0/x"] {
        assert!(ListEntry::parse(bad).is_err(), "{bad}");
    }
    assert!(ListEntry::parse("header:x-api-key:0123456789abcdef0123456789abcdef").is_ok());
    // A credential in clear is refused: keys take its hash.
    let e = ListEntry::parse("header:x-api-key:my-secret").unwrap_err();
    assert!(e.reason().contains("hash"), "{e}");
    assert!(ListEntry::parse("ip:203.0.113.7").is_ok());
    assert!(ListEntry::parse("ip:2001:db8:1:2::/64").is_ok());
    // An `ip:` key that no request's key could equal is refused, saying what to write.
    for (bad, says) in [
        ("ip:10.0.0.0/8", "without ip:"),
        ("ip:0.0.0.0/0", "without ip:"),
        ("ip:::ffff:203.0.113.7", "\"ip:203.0.113.7\""),
        ("ip:2001:db8::1", "its network"),
        ("ip:2001:DB8:1:2::/64", "\"ip:2001:db8:1:2::/64\""),
        ("ip:2001:db8:1:2::5/64", "\"ip:2001:db8:1:2::/64\""),
        ("ip:2001:db8::/200", "prefix length"),
        ("ip:not-an-address", "ip:203.0.113.7"),
    ] {
        let e = ListEntry::parse(bad).map(|_| ()).unwrap_err();
        assert!(e.reason().contains(says), "{bad}: {e}");
    }
    // An IPv6 network key matches only at the length clients are keyed by.
    let v6 = ListEntry::parse("ip:2001:db8:1::/48").unwrap();
    assert!(v6.fits_ipv6_prefix(48).is_ok());
    let e = v6.fits_ipv6_prefix(64).unwrap_err();
    assert!(e.contains("/64 network"), "{e}");
    assert!(
        ListEntry::parse("ip:203.0.113.7")
            .unwrap()
            .fits_ipv6_prefix(64)
            .is_ok()
    );
    assert!(ListEntry::parse("user:alice").is_ok());
    assert!(ListEntry::parse("cookie:x").is_err());
    assert!(ListEntry::parse("whatever").is_err());
}

#[tokio::test]
async fn a_banned_client_is_told_so_until_the_ban_ends() {
    let clock = manual_clock();
    let ban = Ban::new(3, Duration::from_secs(60), Duration::from_secs(30)).unwrap();
    let login = HttpPolicy::new(fixed("login", 2, 1).with_ban(ban).unwrap())
        .keys(KeyChain::parse(["ip"]).unwrap());
    let engine = builder(clock.clone()).policy(login).build().unwrap();
    let app = app(engine);
    let ip = "192.0.2.50";
    for _ in 0..2 {
        assert_eq!(status(&app, get("/login", ip, &[])).await, StatusCode::OK);
    }
    for _ in 0..2 {
        let r = send(&app, get("/login", ip, &[])).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        let body = body_json(r).await;
        assert_ne!(body["title"], "Banned");
    }
    let r = send(&app, get("/login", ip, &[])).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header_u64(&r, "retry-after"), 30);
    let body = body_json(r).await;
    assert_eq!(body["title"], "Banned", "{body}");
    assert_eq!(body["violated-policies"][0], "login");
    assert!(body["detail"].as_str().unwrap().contains("until"), "{body}");
    // The window resets every second; the ban holds.
    clock.advance(Duration::from_secs(10));
    let r = send(&app, get("/login", ip, &[])).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header_u64(&r, "retry-after"), 20);
    assert_eq!(body_json(r).await["title"], "Banned");
    clock.advance(Duration::from_secs(20));
    assert_eq!(status(&app, get("/login", ip, &[])).await, StatusCode::OK);
}

#[tokio::test]
async fn a_banned_client_is_never_queued() {
    let ban = Ban::new(2, Duration::from_secs(60), Duration::from_secs(30)).unwrap();
    let queued = tollgate::Policy::new(
        "inbound",
        tollgate::Quota::leaky_bucket("1/m".parse().unwrap(), 0).unwrap(),
    )
    .unwrap()
    .with_ban(ban)
    .unwrap();
    let engine = builder(manual_clock())
        .policy(
            HttpPolicy::new(queued)
                .keys(KeyChain::parse(["ip"]).unwrap())
                .action(tollgate_http::Action::Queue),
        )
        .build()
        .unwrap();
    let headers = http::HeaderMap::new();
    let method = http::Method::POST;
    let info = RequestInfo::new(&method, "/events", &headers)
        .with_client_ip(Some("192.0.2.60".parse().unwrap()));
    let mut tickets = Vec::new();
    for _ in 0..4 {
        let evaluation = engine.evaluate(&info).await;
        tickets.push(match evaluation.disposition() {
            tollgate_http::Disposition::Respond(a) => Some(a.queue_ticket().is_some()),
            _ => None,
        });
    }
    // Admitted; over the rate (queueable); the second denial starts a ban; banned.
    assert_eq!(tickets, [None, Some(true), Some(false), Some(false)]);
}
