//! A shadow policy beside an enforcing one, at every door: the shadow policy is counted and
//! would deny, but it never blocks, and the answer's numbers are the enforcing policy's
//! (`X-RateLimit-*`, `RateLimit`, no `Retry-After` while it admits); `RateLimit-Policy` lists
//! both. The rule lives in one place (`tollgate_http`'s header rendering); each door is held to
//! it here: the reverse proxy, `/v1/forward-auth`, `POST /v1/check` by attributes, the tower
//! layer and `tollgate replay`.

#[allow(dead_code)]
mod every_door_support;

use every_door_support::*;

/// Three an hour per API key, enforced; one an hour per API key on trial.
const POLICIES: &str = r#"
[[policy]]
name = "per-key"
algorithm = "fixed_window"
limit = 3
window = "1h"
key = ["header:x-api-key"]
match = { path = "/v1/**" }

[[policy]]
name = "trial"
algorithm = "fixed_window"
limit = 1
window = "1h"
key = ["header:x-api-key"]
match = { path = "/v1/**" }
action = "shadow"
"#;

/// The second request of a key: the trial policy would deny it, the enforcing one admits it
/// with one left.
fn second(a: &Answer, door: &str) {
    let body = String::from_utf8_lossy(&a.body);
    assert_eq!(a.status, 200, "{door}: {body}");
    assert_eq!(a.header("x-ratelimit-limit"), Some("3"), "{door}");
    assert_eq!(a.header("x-ratelimit-remaining"), Some("1"), "{door}");
    assert_eq!(a.header("retry-after"), None, "{door}");
    let fields = a.header("ratelimit").unwrap_or_default();
    assert!(
        fields.starts_with("\"per-key\";r=1;"),
        "{door}: RateLimit {fields}"
    );
    let policies = a.header("ratelimit-policy").unwrap_or_default();
    assert!(
        policies.contains("\"per-key\";q=3") && policies.contains("\"trial\";q=1"),
        "{door}: RateLimit-Policy {policies}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_policy_never_speaks_for_an_enforcing_one() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let up = upstream().await;
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{up}\"\n\
         trusted_proxies = [\"127.0.0.0/8\"]\n{POLICIES}"
    );
    let server = Server::start(&text, dir.path()).await;
    let request = |key: &'static str| Described {
        method: "GET",
        target: "/v1/items",
        host: "api.example.com",
        xff: "203.0.113.9",
        client: "203.0.113.9",
        api_key: Some(key),
    };
    twice_at_each_door(&server, request, second).await;
    // Replay: the log's second request passes, as it did.
    let replay = replayed(&server.config, dir.path(), &[request("rp"), request("rp")]);
    assert_eq!(
        replay.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        [200, 200]
    );
    // The trial policy was counted by the server's doors: a shadow denial for each second
    // request (the layer and replay have engines of their own).
    assert_eq!(server.decisions("trial", "shadow").await, 3);
    server.stop().await;
}

/// A shadow policy alone, its store down under `on_error = "deny"`: it never blocks, so every
/// door lets the request through (fail open) where an enforcing policy would be a 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_policy_alone_never_fails_closed() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let up = upstream().await;
    // A Redis that is not there: a port nothing listens on.
    let closed = closed_port();
    let trial_only = POLICIES
        .split("[[policy]]")
        .find(|p| p.contains("shadow"))
        .unwrap_or_default();
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{closed}\"\ntimeout = \"20ms\"\n\
         on_error = \"deny\"\n\
         [proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{up}\"\n\
         trusted_proxies = [\"127.0.0.0/8\"]\n[[policy]]{trial_only}"
    );
    let server = Server::start(&text, dir.path()).await;
    let d = Described {
        method: "GET",
        target: "/v1/items",
        host: "api.example.com",
        xff: "203.0.113.9",
        client: "203.0.113.9",
        api_key: Some("k"),
    };
    let answers = at_three_doors(&server, &d).await;
    for (door, a) in &answers {
        let body = String::from_utf8_lossy(&a.body);
        assert_eq!(a.status, 200, "{door}: {body}");
    }
    assert_eq!(answers[2].1.json()["fail_open"], true);
    assert_eq!(server.decisions("trial", "fail_open").await, 3);
    server.stop().await;
}
