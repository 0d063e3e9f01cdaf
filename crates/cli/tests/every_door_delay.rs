//! A policy that delays rather than rejects, at every door that can hold a request: the
//! reverse proxy forwards the request when its slot comes, `/v1/forward-auth`, the tower layer
//! and the Redis-protocol door's `TOLLGATE.CHECK` answer then, and `POST /v1/check` answers at
//! once with the wait for its caller to keep (`delay`). The wait is the policy's, computed in
//! one place (`tollgate_http`'s evaluation); each door is held to how it keeps it.

#[allow(dead_code)]
mod every_door_support;

use std::time::{Duration, Instant};

use every_door_support::*;

/// Two a second per API key, smoothed: a second request right after the first waits for its
/// slot, half a second later.
const POLICY: &str = r#"
[[policy]]
name = "smooth"
algorithm = "leaky_bucket"
rate = "2/s"
queue = 1
action = "delay"
max_delay = "5s"
key = ["header:x-api-key"]
match = { path = "/v1/**" }
"#;

/// Held: answered no sooner than this after it was sent (the slot is 500 ms away; the margin
/// is for the clock's and the scheduler's grain, never for speed).
const HELD: Duration = Duration::from_millis(400);

fn request(key: &'static str) -> Described {
    Described {
        method: "GET",
        target: "/v1/items",
        host: "api.example.com",
        xff: "203.0.113.9",
        client: "203.0.113.9",
        api_key: Some(key),
    }
}

/// The first request of a door's key passes at once; its second is held until its slot.
async fn held_until_its_slot<F: std::future::Future<Output = Answer>>(
    door: &str,
    send: impl Fn() -> F,
) {
    let first = send().await;
    assert_eq!(
        first.status,
        200,
        "{door}: {}",
        String::from_utf8_lossy(&first.body)
    );
    let sent = Instant::now();
    let second = send().await;
    let waited = sent.elapsed();
    assert_eq!(
        second.status,
        200,
        "{door}: {}",
        String::from_utf8_lossy(&second.body)
    );
    assert!(
        waited >= HELD,
        "{door} answered the second request after {waited:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_policy_holds_the_request_at_every_door_that_can() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let up = upstream().await;
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nresp_listen = \"127.0.0.1:0\"\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n\
         [proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{up}\"\n\
         trusted_proxies = [\"127.0.0.0/8\"]\n{POLICY}"
    );
    let server = Server::start(&text, dir.path()).await;
    let proxy_addr = server.proxy.unwrap_or_else(|| panic!("no proxy"));
    let (px, fa) = (request("px"), request("fa"));
    held_until_its_slot("the proxy", || proxy(proxy_addr, &px)).await;
    held_until_its_slot("forward-auth", || {
        forward_auth(server.api, "/v1/forward-auth", &fa)
    })
    .await;
    let mut service = layered(&server.config);
    let first = layer(&mut service, &request("ly")).await;
    assert_eq!(first.map(|a| a.status), Some(200), "the tower layer");
    let sent = Instant::now();
    let second = layer(&mut service, &request("ly")).await;
    assert_eq!(second.map(|a| a.status), Some(200), "the tower layer");
    assert!(
        sent.elapsed() >= HELD,
        "the tower layer: {:?}",
        sent.elapsed()
    );

    // The Redis-protocol door by policy and key: its five integers have no field for a wait,
    // so it answers when the slot comes.
    let resp = server
        .resp
        .unwrap_or_else(|| panic!("no Redis-protocol door"));
    let mut stream = tokio::net::TcpStream::connect(resp)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let command = b"*3\r\n$14\r\nTOLLGATE.CHECK\r\n$6\r\nsmooth\r\n$2\r\nrs\r\n";
    let first = resp_command(&mut stream, command).await;
    assert!(first.starts_with("*5\r\n:1\r\n"), "{first}");
    let sent = Instant::now();
    let second = resp_command(&mut stream, command).await;
    assert!(second.starts_with("*5\r\n:1\r\n"), "{second}");
    assert!(
        sent.elapsed() >= HELD,
        "TOLLGATE.CHECK: {:?}",
        sent.elapsed()
    );

    // `/v1/check` holds nothing: it answers at once, admitted, with the wait to keep.
    // The wait is the slot's, half a second after the first, less the time between the two.
    let started = Instant::now();
    let first = check(server.api, &request("ck")).await;
    assert_eq!(first.status, 200);
    let second = check(server.api, &request("ck")).await;
    let between = started.elapsed().as_secs_f64();
    let body = second.json();
    assert_eq!(second.status, 200, "{body}");
    let delay = body["delay"]
        .as_f64()
        .unwrap_or_else(|| panic!("no delay in {body}"));
    assert!(
        delay <= 0.5 && delay >= 0.5 - between - 0.01,
        "delay {delay} with {between} s between the two, in {body}"
    );
    assert_eq!(body["decisions"][0]["delay"], body["delay"], "{body}");
    server.stop().await;
}
