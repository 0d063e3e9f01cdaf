//! One decision, every door: the same request described to each way into Tollgate (the reverse
//! proxy, `/v1/forward-auth`, `POST /v1/check` by attributes, the tower layer, and `tollgate
//! replay` of the line a server would log) is judged the same way: the same policy, the same
//! key (a quota shared by the doors of one server), the same status class and headers. When the
//! store fails, every door (Envoy's service too) answers by the one failure rule and counts it
//! in the same metrics; the Redis-protocol door too, `TOLLGATE.CHECK` and `CL.THROTTLE` alike.
//!
//! A concurrency limit is held to each door's way of seeing a request end: the proxy and the
//! layer give the slot back when the exchange ends, forward-auth leaves it to its lease_ttl,
//! `/v1/check` answers a lease to give back, the library's `take_slot` a slot to release, replay
//! holds it for the logged duration; the Redis-protocol door refuses it (Envoy's refuses it in
//! its configuration).
//!
//! Allow and deny lists are decided before any policy at every door too: a client on a deny
//! list is refused with the same 403, a partner on an allow list passes uncounted.
//!
//! A calendar quota (a day in a zone 14 hours ahead of UTC) ends at the same instant at every
//! door: each refusal's retry time is the time left until local midnight (Envoy's door keeps
//! its own fixed units and has no calendar).
//!
//! A rule a door does not apply is a row that says why: `/v1/check` and replay are told the
//! client's address outright, so a forwarding header is nothing to them; the tower layer gets
//! its target from hyper, whose URI parser never hands a fragment on.

use std::net::SocketAddr;

use http::{Request, StatusCode};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tollgate::SystemClock;
use tollgate_http::{PeerAddr, RateLimitLayer};
use tower::{Layer, Service, ServiceExt};

mod every_door_support;

use every_door_support::*;

/// The policy every row is judged by: three an hour per API key, else per client address, on
/// one host's API.
const POLICY: &str = r#"
[[policy]]
name = "per-key"
algorithm = "fixed_window"
limit = 3
window = "1h"
key = ["header:x-api-key", "ip"]
match = { path = "/v1/**", host = "api.example.com" }
"#;

/// The lists every row is also judged by (the rows' other clients are on neither).
const LISTS: &str = r#"
[[list]]
name = "partners"
action = "allow"
ips = ["192.0.2.0/24"]

[[list]]
name = "blocked"
action = "deny"
ips = ["198.51.100.0/24"]
"#;

struct Row {
    name: &'static str,
    request: Described,
    expect: Expect,
    /// Doors that are given the client rather than a forwarding header (`/v1/check`,
    /// replay) expect this instead, and why.
    told_the_client: Option<(Expect, &'static str)>,
    /// What the layer expects instead, and why.
    layer: Option<(Expect, &'static str)>,
}

fn rows() -> Vec<Row> {
    let base = Described {
        method: "GET",
        target: "/v1/items",
        host: "api.example.com",
        xff: "203.0.113.9",
        client: "203.0.113.9",
        api_key: None,
    };
    vec![
        Row {
            name: "an API key",
            request: Described {
                api_key: Some("k-every-door"),
                ..base
            },
            expect: Expect::Counted("header:x-api-key:"),
            told_the_client: None,
            layer: None,
        },
        Row {
            name: "a client behind two proxies",
            request: Described {
                target: "/v1/items?page=2",
                xff: "6.6.6.6, 203.0.113.10",
                client: "203.0.113.10",
                ..base
            },
            expect: Expect::Counted("ip:203.0.113.10"),
            told_the_client: None,
            layer: None,
        },
        Row {
            name: "a host with its port",
            request: Described {
                host: "api.example.com:8443",
                xff: "203.0.113.11",
                client: "203.0.113.11",
                ..base
            },
            expect: Expect::Counted("ip:203.0.113.11"),
            told_the_client: None,
            layer: None,
        },
        Row {
            name: "another host",
            request: Described {
                host: "other.example",
                ..base
            },
            expect: Expect::Unmatched,
            told_the_client: None,
            layer: None,
        },
        Row {
            name: "a host with an empty port",
            request: Described {
                host: "api.example.com:",
                ..base
            },
            expect: Expect::Refused,
            told_the_client: None,
            layer: None,
        },
        Row {
            name: "a target with a fragment",
            request: Described {
                target: "/v1/items?y=1#f",
                ..base
            },
            expect: Expect::Refused,
            told_the_client: None,
            layer: Some((
                Expect::Counted("ip:203.0.113.9"),
                "hyper's URI parser drops the fragment before any service sees the request, so \
                 the application and the limiter read the same path",
            )),
        },
        Row {
            name: "an unreadable client address from the trusted proxy",
            request: Described {
                xff: "203.0.113.12, not-an-address",
                client: "203.0.113.12",
                ..base
            },
            expect: Expect::Refused,
            told_the_client: Some((
                Expect::Counted("ip:203.0.113.12"),
                "the caller states the client's address; no forwarding header is read",
            )),
            layer: None,
        },
        Row {
            name: "a client on a deny list",
            request: Described {
                xff: "198.51.100.20",
                client: "198.51.100.20",
                ..base
            },
            expect: Expect::Forbidden,
            told_the_client: None,
            layer: None,
        },
        Row {
            name: "a partner on an allow list",
            request: Described {
                xff: "192.0.2.40",
                client: "192.0.2.40",
                ..base
            },
            expect: Expect::Unmatched,
            told_the_client: None,
            layer: None,
        },
        Row {
            name: "a long API key",
            request: Described {
                api_key: Some(LONG_KEY),
                xff: "203.0.113.13",
                client: "203.0.113.13",
                ..base
            },
            expect: Expect::Counted("header:x-api-key:"),
            told_the_client: None,
            layer: None,
        },
    ]
}

const LONG_KEY: &str = "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_door_judges_a_request_alike() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let up = upstream().await;
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{up}\"\n\
         trusted_proxies = [\"127.0.0.0/8\"]\n{POLICY}{LISTS}"
    );
    let server = Server::start(&text, dir.path()).await;
    let proxy_addr = server.proxy.unwrap_or_else(|| panic!("no proxy"));
    let mut service = layered(&server.config);
    let rows = rows();
    // Replay sees the lines a server would log: the client as it resolved it.
    let replay = replayed(
        &server.config,
        dir.path(),
        &rows.iter().map(|r| r.request).collect::<Vec<_>>(),
    );
    for (row, (replay_status, replay_key)) in rows.iter().zip(replay) {
        let d = &row.request;
        let told = row.told_the_client.map_or(row.expect, |(e, _)| e);
        proxy(proxy_addr, d)
            .await
            .assert("the proxy", row.name, row.expect);
        forward_auth(server.api, "/v1/forward-auth", d)
            .await
            .assert("forward-auth", row.name, row.expect);
        check(server.api, d)
            .await
            .assert("/v1/check", row.name, told);
        let layer_expect = row.layer.map_or(row.expect, |(e, _)| e);
        match layer(&mut service, d).await {
            Some(answer) => answer.assert("the tower layer", row.name, layer_expect),
            None => panic!("{}: the layer could not build the request", row.name),
        }
        // Replay: the status a server would have answered, and the key it counted under.
        let expected_status = match told {
            Expect::Refused => 400,
            Expect::Forbidden => 403,
            _ => 200,
        };
        assert_eq!(replay_status, expected_status, "{} at replay", row.name);
        if let Expect::Counted(prefix) = told {
            let key = replay_key.unwrap_or_default();
            assert!(
                key.starts_with(prefix),
                "{}: replay counted {key}",
                row.name
            );
            // The layer's engine, the replay and (below) the server count one key.
            if row.layer.is_none() && row.told_the_client.is_none() {
                assert_eq!(
                    layer_key(&server.config, d),
                    Some(key.clone()),
                    "{}",
                    row.name
                );
            }
            if row.told_the_client.is_none() {
                // The server's doors share one quota: three counts of one key (the proxy,
                // forward-auth, /v1/check) are what /v1/top shows for it.
                let top = server.admin("/v1/top?policy=per-key&n=100").await.json();
                let counted = top["requests"]["keys"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|k| k["key"] == key.as_str())
                    .and_then(|k| k["count"].as_u64());
                assert_eq!(counted, Some(3), "{}: {key} in /v1/top: {top}", row.name);
            }
        }
    }
    // The partner is never limited: three more requests at each door, all passed uncounted.
    let partner = rows
        .iter()
        .find(|r| r.name == "a partner on an allow list")
        .map(|r| r.request)
        .unwrap_or_else(|| panic!("no partner row"));
    for _ in 0..3 {
        for (door, answer) in [
            ("the proxy", proxy(proxy_addr, &partner).await),
            (
                "forward-auth",
                forward_auth(server.api, "/v1/forward-auth", &partner).await,
            ),
            ("/v1/check", check(server.api, &partner).await),
        ] {
            answer.assert(door, "a partner, again", Expect::Unmatched);
        }
    }
    let metrics = String::from_utf8_lossy(&server.admin("/metrics").await.body).into_owned();
    for (list, action, n) in [("partners", "allow", 12), ("blocked", "deny", 3)] {
        let line =
            format!("tollgate_list_matches_total{{list=\"{list}\",action=\"{action}\"}} {n}");
        assert!(metrics.contains(&line), "{line}:\n{metrics}");
    }
    // The quota is shared: the API key row was counted three times (proxy, forward-auth,
    // /v1/check), so its fourth request is refused at every door of the server.
    let spent = rows[0].request;
    for (door, answer) in [
        ("the proxy", proxy(proxy_addr, &spent).await),
        (
            "forward-auth",
            forward_auth(server.api, "/v1/forward-auth", &spent).await,
        ),
        ("/v1/check", check(server.api, &spent).await),
    ] {
        assert_eq!(answer.status, 429, "{door}");
        assert_eq!(answer.header("x-ratelimit-remaining"), Some("0"), "{door}");
        let retry: u64 = answer
            .header("retry-after")
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        assert!(retry >= 1, "{door}: Retry-After {retry}");
    }
    server.stop().await;
}

/// The store failing, open and closed, at every door: the same status, headers and metric.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_store_is_answered_by_one_rule_at_every_door() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let up = upstream().await;
    // A Redis that is not there: a port nothing listens on.
    let closed = closed_port();
    let descriptors = dir.path().join("ratelimit");
    std::fs::create_dir_all(&descriptors).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(
        descriptors.join("edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit:\n      unit: hour\n      requests_per_unit: 3\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let d = Described {
        method: "GET",
        target: "/v1/items",
        host: "api.example.com",
        xff: "203.0.113.9",
        client: "203.0.113.9",
        api_key: Some("k-failed"),
    };
    for on_error in ["allow", "deny"] {
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\ngrpc_listen = \"127.0.0.1:0\"\n\
             resp_listen = \"127.0.0.1:0\"\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n\
             [store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{closed}\"\n\
             timeout = \"20ms\"\non_error = \"{on_error}\"\n\
             [proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{up}\"\n\
             trusted_proxies = [\"127.0.0.0/8\"]\n\
             [envoy]\nconfig_dir = \"ratelimit\"\n{POLICY}"
        );
        let server = Server::start(&text, dir.path()).await;
        let answers = at_three_doors(&server, &d).await;
        for (door, a) in &answers {
            let at = format!("on_error = {on_error} at {door}");
            // Neither answer claims a quota nobody counted.
            assert_eq!(a.header("x-ratelimit-limit"), None, "{at}");
            assert_eq!(a.header("x-ratelimit-remaining"), None, "{at}");
            assert_eq!(a.header("ratelimit"), None, "{at}");
            if on_error == "allow" {
                assert_eq!(a.status, 200, "{at}");
            } else {
                // Unavailable, never "too many requests": the client may be within its quota.
                assert_eq!(a.status, 503, "{at}");
                assert_eq!(a.header("retry-after"), Some("1"), "{at}");
                assert_eq!(
                    a.header("content-type"),
                    Some("application/problem+json"),
                    "{at}"
                );
                assert_eq!(a.json()["status"], 503, "{at}");
            }
        }
        if on_error == "allow" {
            // The described check names the policy it let through unchecked, knowing nothing.
            let body = answers[2].1.json();
            assert_eq!(body["fail_open"], true, "{body}");
            assert_eq!(body["policy"], "per-key", "{body}");
            assert_eq!(body["limit"], Value::Null, "{body}");
            let decisions = body["decisions"].as_array().cloned().unwrap_or_default();
            assert_eq!(decisions.len(), 1, "{body}");
            assert_eq!(decisions[0]["policy"], "per-key", "{body}");
            assert_eq!(decisions[0]["remaining"], Value::Null, "{body}");
        }
        let outcome = if on_error == "allow" {
            "fail_open"
        } else {
            "fail_closed"
        };
        assert_eq!(server.decisions("per-key", outcome).await, 3, "{on_error}");
        // The Redis-protocol door, by policy and as redis-cell: admitted with nothing known,
        // or unavailable.
        let resp = server.resp.unwrap_or_else(|| panic!("no resp door"));
        let mut stream = TcpStream::connect(resp)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let by_policy = b"*3\r\n$14\r\nTOLLGATE.CHECK\r\n$7\r\nper-key\r\n$8\r\nk-failed\r\n";
        let by_policy = resp_command(&mut stream, by_policy).await;
        let cell = b"*5\r\n$11\r\nCL.THROTTLE\r\n$1\r\nk\r\n$1\r\n4\r\n$1\r\n1\r\n$2\r\n60\r\n";
        let cell = resp_command(&mut stream, cell).await;
        if on_error == "allow" {
            assert_eq!(
                by_policy, "*5\r\n:1\r\n:0\r\n:0\r\n:0\r\n:-1\r\n",
                "{on_error}"
            );
            assert_eq!(cell, "*5\r\n:0\r\n:5\r\n:0\r\n:-1\r\n:0\r\n", "{on_error}");
        } else {
            for reply in [&by_policy, &cell] {
                assert!(
                    reply.starts_with("-ERR store unavailable"),
                    "{on_error}: {reply}"
                );
            }
        }
        // The tower layer over the same store settings.
        let store = tollgate_server::store::AnyStore::from_config(&server.config.store)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let engine = tollgate_config::http_engine(&server.config, store, SystemClock::new())
            .unwrap_or_else(|e| panic!("{e}"));
        let service: fn(_) -> _ = ok;
        let mut layered = RateLimitLayer::new(engine)
            .inner_body()
            .layer(tower::service_fn(service));
        let request = Request::builder()
            .uri(d.target)
            .header("host", d.host)
            .header("x-api-key", "k-failed")
            .extension(PeerAddr(SocketAddr::from(([127, 0, 0, 1], 40_000))))
            .body(http_body_util::Empty::new())
            .unwrap_or_else(|e| panic!("{e}"));
        let response = layered
            .ready()
            .await
            .unwrap_or_else(|e| match e {})
            .call(request)
            .await
            .unwrap_or_else(|e| match e {});
        let expected = if on_error == "allow" {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        assert_eq!(response.status(), expected, "{on_error} at the tower layer");
        assert!(response.headers().get("x-ratelimit-limit").is_none());
        // Envoy's service: OK with no limits, or UNAVAILABLE for Envoy's failure_mode_deny;
        // counted under the limit's policy in the same metrics.
        let grpc = server.grpc.unwrap_or_else(|| panic!("no grpc"));
        let mut client = tollgate_envoy::RlsClient::connect(format!("http://{grpc}"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let request = tollgate_envoy::proto::envoy::service::ratelimit::v3::RateLimitRequest {
            domain: "edge".to_owned(),
            descriptors: vec![tollgate_envoy::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor {
                entries: vec![tollgate_envoy::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry {
                    key: "api_key".to_owned(),
                    value: "k-failed".to_owned(),
                }],
                ..Default::default()
            }],
            hits_addend: 1,
        };
        let answer = client.should_rate_limit(request).await;
        if on_error == "allow" {
            let answer = answer.unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(answer.overall_code, 1, "OK");
            assert!(answer.response_headers_to_add.is_empty());
        } else {
            let code = answer.err().map(|s| s.code());
            assert_eq!(code, Some(tonic::Code::Unavailable));
        }
        let metrics = String::from_utf8_lossy(&server.admin("/metrics").await.body).into_owned();
        let envoy_line = metrics.lines().find(|l| {
            l.starts_with("tollgate_decisions_total{policy=\"edge.api_key\"")
                && l.contains(&format!("outcome=\"{outcome}\""))
        });
        assert_eq!(
            envoy_line.and_then(|l| l.rsplit(' ').next()),
            Some("1"),
            "{on_error}: Envoy's decision in /metrics:\n{metrics}"
        );
        server.stop().await;
    }
}

/// A concurrency limit of one request in flight per key, at every door, each key its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_limit_is_held_to_each_doors_view_of_the_end() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let up = upstream().await;
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nresp_listen = \"127.0.0.1:0\"\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n\
         [proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{up}\"\n\
         trusted_proxies = [\"127.0.0.0/8\"]\n\
         [[policy]]\nname = \"exports\"\nalgorithm = \"concurrency\"\nlimit = 1\n\
         key = [\"header:x-api-key\", \"ip\"]\nmatch = {{ path = \"/v1/export/**\" }}\n"
    );
    let server = Server::start(&text, dir.path()).await;
    let request = |key: &'static str| Described {
        method: "POST",
        target: "/v1/export/7",
        host: "api.example.com",
        xff: "203.0.113.9",
        client: "203.0.113.9",
        api_key: Some(key),
    };
    let assert_slot = |a: &Answer, at: &str, status: u16| {
        assert_eq!(
            a.status,
            status,
            "{at}: {}",
            String::from_utf8_lossy(&a.body)
        );
        assert_eq!(a.header("x-ratelimit-limit"), Some("1"), "{at}");
        assert_eq!(
            a.header("ratelimit-policy"),
            Some("\"exports\";q=1"),
            "{at}"
        );
    };
    // The proxy: each exchange ends, and gives its slot back.
    let proxy_addr = server.proxy.unwrap_or_else(|| panic!("no proxy"));
    for i in 0..3 {
        let a = proxy(proxy_addr, &request("px")).await;
        assert_slot(&a, &format!("the proxy, request {i}"), 200);
    }
    // The tower layer: the same.
    let mut service = layered(&server.config);
    for i in 0..3 {
        let a = layer(&mut service, &request("ly"))
            .await
            .unwrap_or_else(|| panic!("no request"));
        assert_slot(&a, &format!("the tower layer, request {i}"), 200);
    }
    // Forward-auth never learns the end: its slot is held for lease_ttl.
    let fa = request("fa");
    let first = forward_auth(server.api, "/v1/forward-auth", &fa).await;
    assert_slot(&first, "forward-auth", 200);
    let again = forward_auth(server.api, "/v1/forward-auth", &fa).await;
    assert_slot(&again, "forward-auth, again", 429);
    assert_eq!(again.header("retry-after"), Some("1"));
    // /v1/check by attributes answers a lease, and the slot is back once it is released.
    let first = check(server.api, &request("ck")).await;
    assert_slot(&first, "/v1/check", 200);
    let lease = first.json()["lease"].as_str().map(str::to_owned);
    let lease = lease.unwrap_or_else(|| panic!("no lease: {}", first.json()));
    assert_slot(
        &check(server.api, &request("ck")).await,
        "/v1/check, again",
        429,
    );
    let body = json!({ "lease": lease }).to_string();
    let head = format!(
        "POST /v1/release HTTP/1.1\r\nhost: tollgate\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let released = raw(server.api, head, body.as_bytes()).await;
    assert_eq!(
        released.status,
        200,
        "{}",
        String::from_utf8_lossy(&released.body)
    );
    assert_slot(
        &check(server.api, &request("ck")).await,
        "/v1/check, released",
        200,
    );
    // The Redis-protocol door has no release: it refuses the policy, saying why.
    let resp = server.resp.unwrap_or_else(|| panic!("no resp door"));
    let mut stream = TcpStream::connect(resp)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let reply = resp_command(
        &mut stream,
        b"*3\r\n$14\r\nTOLLGATE.CHECK\r\n$7\r\nexports\r\n$2\r\nrs\r\n",
    )
    .await;
    assert!(
        reply.starts_with("-ERR") && reply.contains("requests in flight"),
        "{reply}"
    );
    // The library: a slot taken with Limiter::take_slot is held until it is released (or
    // dropped); a plain check of the policy is refused, naming take_slot.
    let limiter = tollgate::Limiter::builder()
        .policies(server.config.policies.iter().map(|p| p.policy.clone()))
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let slot = limiter
        .take_slot("exports", "lb")
        .await
        .unwrap_or_else(|e| panic!("the library: {e}"));
    assert_eq!(slot.decision().limit, 1);
    let refused = limiter.take_slot("exports", "lb").await.err();
    assert!(
        refused.is_some_and(|e| matches!(e.kind(), tollgate::ErrorKind::Refused(_))),
        "the library, again"
    );
    assert!(
        slot.release().await.unwrap_or(false),
        "the library, released"
    );
    let again = limiter.take_slot("exports", "lb").await;
    assert!(again.is_ok(), "the library, after the release");
    let checked = limiter.check("exports", "lb", 1).await.err();
    assert!(
        checked.is_some_and(|e| e.to_string().contains("take_slot")),
        "the library, a plain check"
    );
    // Replay: without a logged duration, each request ends as it starts.
    let replay = replayed(&server.config, dir.path(), &[request("rp"), request("rp")]);
    assert_eq!(
        replay.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        [200, 200]
    );
    server.stop().await;
}

/// Seconds from now until the next midnight at UTC+14 (`Pacific/Kiritimati`, no daylight
/// saving time), so a day's end that UTC's would never give.
fn until_kiritimati_midnight() -> u64 {
    let offset = 14 * 3600;
    let local = now_secs() + offset;
    (local / 86_400 + 1) * 86_400 - local
}

/// A calendar quota (one a day in a zone fourteen hours ahead of UTC) ends at the same instant
/// at every door: each answers its second request with the time left until local midnight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calendar_day_ends_at_the_same_instant_at_every_door() {
    if until_kiritimati_midnight() < 10 {
        // Not across a midnight: the first and second request of a door would fall on two days.
        tokio::time::sleep(std::time::Duration::from_secs(11)).await;
    }
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let up = upstream().await;
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nresp_listen = \"127.0.0.1:0\"\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n\
         [proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{up}\"\n\
         trusted_proxies = [\"127.0.0.0/8\"]\n\
         [[policy]]\nname = \"daily\"\nalgorithm = \"fixed_window\"\nlimit = 1\n\
         calendar = \"day\"\ntimezone = \"Pacific/Kiritimati\"\n\
         key = [\"header:x-api-key\", \"ip\"]\nmatch = {{ path = \"/v1/**\" }}\n"
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
    let near = |got: Option<u64>, at: &str| {
        let want = until_kiritimati_midnight();
        let got = got.unwrap_or_else(|| panic!("{at}: no retry time"));
        assert!(
            got.abs_diff(want) <= 2,
            "{at}: retry in {got} s, local midnight in {want} s"
        );
    };
    let second = |a: &Answer, at: &str| {
        assert_eq!(a.status, 429, "{at}: {}", String::from_utf8_lossy(&a.body));
        near(a.header("retry-after").and_then(|v| v.parse().ok()), at);
        // A day is advertised by its nominal length.
        assert_eq!(
            a.header("ratelimit-policy"),
            Some("\"daily\";q=1;w=86400"),
            "{at}"
        );
    };
    let checked = twice_at_each_door(&server, request, second).await;
    near(checked.json()["retry_after"].as_u64(), "/v1/check's body");
    // The Redis-protocol door: allowed, limit, remaining, reset, retry-after.
    let resp = server.resp.unwrap_or_else(|| panic!("no resp door"));
    let mut stream = TcpStream::connect(resp)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut replies = Vec::new();
    for _ in 0..2 {
        let command = b"*3\r\n$14\r\nTOLLGATE.CHECK\r\n$5\r\ndaily\r\n$2\r\nrs\r\n";
        replies.push(resp_command(&mut stream, command).await);
    }
    let ints = |reply: &str| -> Vec<i64> {
        reply
            .lines()
            .filter_map(|l| l.strip_prefix(':'))
            .filter_map(|n| n.parse().ok())
            .collect()
    };
    assert_eq!(ints(&replies[0]).first(), Some(&1), "{}", replies[0]);
    let refused = ints(&replies[1]);
    assert_eq!(refused.first(), Some(&0), "{}", replies[1]);
    near(
        refused.last().and_then(|&n| u64::try_from(n).ok()),
        "the Redis-protocol door",
    );
    // Replay judges the log's lines by the same day.
    let replay = replayed(&server.config, dir.path(), &[request("rp"), request("rp")]);
    assert_eq!(
        replay.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        [200, 429]
    );
    server.stop().await;
}
