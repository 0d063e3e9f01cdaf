//! The proxy cannot be walked around: raw-socket regressions, one per way a request once reached
//! the upstream uncounted or counted as another request, or a client saw another's response.
//! Each test failed on the relay before these fixes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
// Only this test uses them: included here rather than in `common/mod.rs`, which every test
// binary compiles.
#[path = "common/never_reads.rs"]
mod never_reads;

use std::net::SocketAddr;

use common::raw::*;
use common::{Running, start_text};
use never_reads::*;
use tokio::io::AsyncWriteExt;

/// The proxy in front of `up` with `policies` (TOML `[[policy]]` tables) and proxy options.
async fn proxy_with(up: &Up, options: &str, policies: &str) -> (Running, SocketAddr) {
    let text = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{}\"\ntimeout = \"2s\"\n{options}\n{policies}",
        up.addr
    );
    let s = start_text(&text).await;
    let addr = s.proxy.unwrap();
    (s, addr)
}

/// A policy of `limit` a minute on every request that `matcher` (a TOML inline table) fits.
fn policy(name: &str, limit: u32, key: &str, matcher: &str) -> String {
    format!(
        "[[policy]]\nname = \"{name}\"\nalgorithm = \"fixed_window\"\nlimit = {limit}\nwindow = \"1m\"\nkey = [{key}]\nmatch = {matcher}\n"
    )
}

/// Sends `bytes` on a fresh connection and reads every answer until the proxy closes: the
/// statuses, in order.
async fn statuses(addr: SocketAddr, bytes: &[u8]) -> Vec<u16> {
    let mut c = Client::connect(addr).await;
    c.send(bytes).await;
    let mut got = Vec::new();
    while let Ok(r) = c.try_response(false).await {
        got.push(r.status);
        if r.header("connection") == Some("close") {
            break;
        }
    }
    got
}

fn targets(up: &Up) -> Vec<String> {
    up.heads()
        .iter()
        .map(|(_, h)| target(h).to_owned())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// 1. Smuggling through Connection.

#[tokio::test]
async fn a_connection_header_naming_the_framing_cannot_smuggle_a_request() {
    let up = echo_upstream().await;
    let policies = policy("api", 1, "\"ip\"", "{ path = \"/api/**\" }");
    let (s, addr) = proxy_with(&up, "", &policies).await;
    // The api policy's one request is spent.
    assert_eq!(
        statuses(
            addr,
            b"GET /api/x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
        )
        .await,
        [200]
    );
    assert_eq!(
        statuses(
            addr,
            b"GET /api/x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
        )
        .await,
        [429]
    );

    let smuggled = "GET /api/SMUGGLED HTTP/1.1\r\nHost: t\r\n\r\n";
    let by_length = format!(
        "POST /public HTTP/1.1\r\nHost: t\r\nConnection: content-length\r\nContent-Length: {}\r\n\r\n{smuggled}",
        smuggled.len()
    );
    let mut c = Client::connect(addr).await;
    c.send(&by_length).await;
    let r = c.response().await;
    // The body went up as a body, framed by the length the relay wrote.
    assert_eq!(
        (r.status, r.body()),
        (200, format!("/public:{smuggled}")),
        "{r:?}"
    );
    // And the next clients, on the pooled upstream connections, get their own answers (the
    // smuggled request's answer once waited there for them).
    for i in 0..3 {
        let mut next = Client::connect(addr).await;
        let path = format!("/next-{i}");
        assert_eq!(next.get(&path).await.body(), format!("{path}:"));
    }

    // The chunked variant: a chunk-size line that is valid hex followed by what a lenient
    // reader takes for an extension.
    let by_chunks = "POST /public HTTP/1.1\r\nHost: t\r\nConnection: transfer-encoding\r\nTransfer-Encoding: chunked\r\n\r\nACE /x HTTP/1.1\r\n\r\n";
    assert_eq!(statuses(addr, by_chunks.as_bytes()).await, [400]);
    drop(c);
    let seen = targets(&up);
    assert!(
        !seen.iter().any(|t| t.contains("SMUGGLED") || t == "/x"),
        "{seen:?}"
    );
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 2. Cross-client responses.

#[tokio::test]
async fn a_response_nobody_asked_for_never_reaches_the_next_client() {
    let (stray_sent_tx, stray_sent) = tokio::sync::watch::channel(false);
    let stray_sent_tx = std::sync::Arc::new(stray_sent_tx);
    // An upstream out of step: after its answer to /first it sends a second answer no request
    // asked for, on the same keep-alive connection.
    let up = upstream(move |mut c| {
        let tx = std::sync::Arc::clone(&stray_sent_tx);
        async move {
            while let Some(head) = c.head().await {
                let t = target(&head).to_owned();
                c.send(ok(&format!("for {t}"))).await;
                if t == "/first" {
                    c.send(ok("STRAY")).await;
                    let _ = tx.send(true);
                }
            }
        }
    })
    .await;
    let (s, addr) = proxy_with(&up, "", &policy("all", 1000, "\"ip\"", "{}")).await;
    let mut a = Client::connect(addr).await;
    assert_eq!(a.get("/first").await.body(), "for /first");
    let mut rx = stray_sent.clone();
    tokio::time::timeout(T, rx.wait_for(|s| *s))
        .await
        .unwrap()
        .unwrap();
    for i in 0..3 {
        let mut b = Client::connect(addr).await;
        let path = format!("/second-{i}");
        assert_eq!(b.get(&path).await.body(), format!("for {path}"));
    }
    assert_eq!(a.get("/third").await.body(), "for /third");
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 3. Chunked framing is checked, and written again.

#[tokio::test]
async fn malformed_chunked_bodies_get_400_and_reach_nobody() {
    let up = echo_upstream().await;
    let (s, addr) = proxy_with(&up, "", &policy("all", 1000, "\"ip\"", "{}")).await;
    for body in [
        "5 \r\nhello\r\n0\r\n\r\n",
        "5\r\nhello\r\n0\r\nGET /x HTTP/1.1\r\n\r\n",
        "5\r\nhello\r\n0\r\n\nGET /x HTTP/1.1\r\n\r\n",
        "zz\r\n",
    ] {
        let req =
            format!("POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n{body}");
        assert_eq!(statuses(addr, req.as_bytes()).await, [400], "{body:?}");
    }
    assert!(
        !targets(&up).iter().any(|t| t == "/x"),
        "{:?}",
        targets(&up)
    );
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 4. Absolute-form targets.

#[tokio::test]
async fn an_absolute_form_target_is_matched_on_the_host_the_upstream_gets() {
    let up = echo_upstream().await;
    let policies = policy("other", 1, "\"ip\"", "{ host = \"other.example\" }");
    let (s, addr) = proxy_with(&up, "", &policies).await;
    let req = b"GET http://other.example/x HTTP/1.1\r\nHost: api.example.com\r\nConnection: close\r\n\r\n";
    assert_eq!(statuses(addr, req).await, [200]);
    assert_eq!(statuses(addr, req).await, [429]);
    let heads = up.heads();
    assert_eq!(heads.len(), 1);
    let head = heads[0].1.to_ascii_lowercase();
    assert!(head.starts_with("get /x http/1.1\r\n"), "{head}");
    assert!(
        head.contains("\r\nhost: other.example\r\n") && !head.contains("api.example.com"),
        "{head}"
    );
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 5. Deep paths.

#[tokio::test]
async fn deep_paths_are_normalised_whole_or_refused() {
    let up = echo_upstream().await;
    let (s, addr) = proxy_with(
        &up,
        "",
        &policy("api", 1, "\"ip\"", "{ path = \"/api/**\" }"),
    )
    .await;
    let deep = format!("{}{}/api/x", "/a".repeat(257), "/..".repeat(257));
    let req = format!("GET {deep} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    assert_eq!(statuses(addr, req.as_bytes()).await, [200]);
    assert_eq!(statuses(addr, req.as_bytes()).await, [429]);
    let deeper = format!("{}/api/x", "/a".repeat(2000));
    let req = format!("GET {deeper} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    assert_eq!(statuses(addr, req.as_bytes()).await, [414]);
    assert_eq!(up.heads().len(), 1);
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 6. A client that never reads.

#[tokio::test]
async fn a_client_that_never_reads_its_429s_is_cut_off() {
    let up = echo_upstream().await;
    let (s, addr) = proxy_with(&up, "", &policy("none", 1, "\"ip\"", "{}")).await;
    // Pipelined 429s pile up until a write of one waits out `[proxy] timeout`.
    flood_without_reading(addr, b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    s.stop().await;
}

/// A 400 or a 431 is the last answer on its connection (the bytes after a request the proxy
/// could not read cannot be trusted to start another), so a pipeline of them is answered once:
/// the refusal's own write can only wait when the answers before it have filled every buffer
/// between the proxy and a client that never reads. This test fills them to the byte, then
/// refuses: the refusal's write waits, and its deadline (`header_read_timeout`) ends the
/// connection. Without that deadline, each of these connections stays open for good (checked by
/// taking the deadline out of `Conn::refuse`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_a_400_or_a_431_is_cut_off_and_others_are_served() {
    let (dropped_tx, dropped) = tokio::sync::watch::channel(0usize);
    let up = fill_upstream(dropped_tx).await;
    let config = tollgate_server::Config::parse(
        "test.toml",
        &format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nheader_read_timeout = \"1s\"\nmax_header_bytes = 1024\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n\
             [proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{}\"\ntimeout = \"1s\"\n",
            up.addr
        ),
    )
    .unwrap();
    let s = common::start(config).await;
    let addr = s.proxy.unwrap();
    let (room, head) = room_for_a_client_that_never_reads(addr, dropped).await;
    let malformed = b"NOT HTTP\r\n\r\n".repeat(100);
    let mut oversized = b"GET / HTTP/1.1\r\nHost: t\r\nX-Pad: ".to_vec();
    oversized.resize(4096, b'a');
    let mut stalled = Vec::new();
    for (status, refused) in [(400, &malformed), (431, &oversized)] {
        let answer = answer_size(addr, refused).await;
        assert_eq!(&answer.0[..12], format!("HTTP/1.1 {status}").as_bytes());
        // A response that leaves less room than the refusal needs: none, or half of it.
        for spare in [0, answer.1 / 2] {
            let c = never_reading_client(addr).await;
            let (read, mut write) = c.into_split();
            let fill = format!(
                "GET /fill/{} HTTP/1.1\r\nHost: t\r\n\r\n",
                fill_size(room - spare, head)
            );
            write.write_all(fill.as_bytes()).await.unwrap();
            write.write_all(refused).await.unwrap();
            stalled.push((status, spare, read, write));
        }
    }
    // Meanwhile, others are served.
    let mut other = Client::connect(addr).await;
    assert_eq!(other.get("/fill/5").await.body(), "xxxxx");
    for (status, spare, read, write) in stalled {
        let closed = closed_by_the_proxy(write).await;
        assert!(
            closed.is_ok(),
            "{status} with {spare} bytes to spare: {closed:?}"
        );
        drop(read);
    }
    s.stop().await;
}

#[tokio::test]
async fn a_client_that_never_reads_is_cut_off_on_the_api_listener_too() {
    let config = tollgate_server::Config::parse(
        "test.toml",
        "[server]\nlisten = \"127.0.0.1:0\"\nheader_read_timeout = \"1s\"\n[admin]\nlisten = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let s = common::start(config).await;
    flood_without_reading(s.api, b"GET /nothing-here HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 7. Bytes that are not ASCII.

#[tokio::test]
async fn a_clients_garbage_never_lets_it_out_of_its_own_key() {
    let up = echo_upstream().await;
    let (s, addr) = proxy_with(
        &up,
        "trusted_proxies = [\"127.0.0.1/32\"]",
        &policy("per-ip", 1, "\"ip\"", "{}"),
    )
    .await;
    // The trusted proxy (this test, on 127.0.0.1) appended the real client after the client's
    // own unreadable element.
    let req = b"GET / HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: \xe9, 198.51.100.77\r\nConnection: close\r\n\r\n";
    assert_eq!(statuses(addr, req).await, [200]);
    assert_eq!(statuses(addr, req).await, [429]);
    // Another client behind the same proxy, garbage and all, is someone else: not counted as
    // the proxy, whose one request is spent.
    let other = b"GET / HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: \xe9, 198.51.100.78\r\nConnection: close\r\n\r\n";
    assert_eq!(statuses(addr, other).await, [200]);
    // A target that cannot be read is refused, never matched as "/".
    assert_eq!(
        statuses(addr, b"GET /\xe9 HTTP/1.1\r\nHost: t\r\n\r\n").await,
        [400]
    );
    assert_eq!(up.heads().len(), 2);
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 8. Requests HTTP/1.1 does not allow, and a head a byte at a time.

#[tokio::test]
async fn requests_without_host_and_connect_are_refused() {
    let up = echo_upstream().await;
    let (s, addr) = proxy_with(&up, "", &policy("all", 1000, "\"ip\"", "{}")).await;
    assert_eq!(statuses(addr, b"GET / HTTP/1.1\r\n\r\n").await, [400]);
    assert_eq!(
        statuses(addr, b"CONNECT t:443 HTTP/1.1\r\nHost: t:443\r\n\r\n").await,
        [501]
    );
    assert!(up.heads().is_empty(), "{:?}", up.heads());
    s.stop().await;
}

#[tokio::test]
async fn two_hosts_are_refused_naming_the_field() {
    let up = echo_upstream().await;
    let (s, addr) = proxy_with(&up, "", &policy("all", 1000, "\"ip\"", "{}")).await;
    for two in [
        &b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n",
        // Behind an absolute-form target too, whose authority would replace both.
        b"GET http://a/ HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    ] {
        let mut c = Client::connect(addr).await;
        c.send(two).await;
        let r = c.response().await;
        assert_eq!(r.status, 400, "{r:?}");
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert!(r.body().contains("more than one Host header"), "{r:?}");
        assert_eq!(r.header("connection"), Some("close"), "{r:?}");
    }
    assert!(up.heads().is_empty(), "{:?}", up.heads());
    s.stop().await;
}

#[tokio::test]
async fn a_head_sent_a_byte_at_a_time_is_read_whole() {
    let up = echo_upstream().await;
    let (s, addr) = proxy_with(&up, "", &policy("all", 1000, "\"ip\"", "{}")).await;
    let mut c = Client::connect(addr).await;
    let mut head = b"GET /slow HTTP/1.1\r\nHost: t\r\nX-Long: ".to_vec();
    head.extend(std::iter::repeat_n(b'a', 2048));
    head.extend_from_slice(b"\r\n\r\n");
    for b in &head {
        c.send([*b]).await;
    }
    assert_eq!(c.response().await.body(), "/slow:");
    s.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 9. Duplicated identity fields.

#[tokio::test]
async fn a_key_sent_twice_is_refused_naming_the_field() {
    let up = echo_upstream().await;
    let policies = policy(
        "keys",
        1000,
        "\"header:x-api-key\", \"query:api_key\", \"ip\"",
        "{}",
    );
    let (s, addr) = proxy_with(&up, "", &policies).await;
    let mut c = Client::connect(addr).await;
    c.send(b"GET / HTTP/1.1\r\nHost: t\r\nX-Api-Key: a\r\nX-Api-Key: b\r\n\r\n")
        .await;
    let r = c.response().await;
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.body().contains("x-api-key"), "{r:?}");
    let mut c = Client::connect(addr).await;
    c.send(b"GET /?api_key=a&api_key=b HTTP/1.1\r\nHost: t\r\n\r\n")
        .await;
    let r = c.response().await;
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.body().contains("api_key"), "{r:?}");
    assert!(up.heads().is_empty(), "{:?}", up.heads());
    // Once each is fine.
    let mut c = Client::connect(addr).await;
    c.send(b"GET /?api_key=a HTTP/1.1\r\nHost: t\r\nX-Api-Key: a\r\n\r\n")
        .await;
    assert_eq!(c.response().await.status, 200);
    s.stop().await;
}
