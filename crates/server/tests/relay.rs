//! The proxy listener's relay, over raw sockets: pipelining, framing, keep-alive, and the
//! requests it hands to the hyper path.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn proxy_config(upstream: SocketAddr, extra: &str) -> String {
    format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{upstream}\"\ntimeout = \"2s\"\n\n{extra}"
    )
}

const LIMITED: &str = "[[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\nkey = [\"header:x-api-key\"]\nmatch = { path = \"/v1/**\" }\n";

/// Writes `bytes`, then reads until the proxy closes the connection.
async fn exchange(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut out))
        .await
        .expect("the proxy closes the connection")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// The status codes of the responses in `text`, in order.
fn statuses(text: &str) -> Vec<u16> {
    text.match_indices("HTTP/1.")
        .filter_map(|(i, _)| text.get(i + 9..i + 12)?.parse().ok())
        .collect()
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_with_their_bodies() {
    let up = upstream().await;
    let s = start_text(&proxy_config(up, LIMITED)).await;
    let addr = s.proxy.unwrap();
    let chunked = "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nchunk-\r\n4;x=y\r\nbody\r\n0\r\n\r\n";
    let text = exchange(
        addr,
        format!(
            "GET /v1/items HTTP/1.1\r\nHost: a\r\nX-Api-Key: k\r\n\r\n\
             POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\nhello world\
             HEAD /echo HTTP/1.1\r\nHost: a\r\n\r\n\
             GET /v1/items HTTP/1.1\r\nHost: a\r\nX-Api-Key: k\r\n\r\n\
             {chunked}\
             GET /echo HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    assert_eq!(statuses(&text), [200, 200, 200, 429, 200, 200], "{text}");
    let lower = text.to_ascii_lowercase();
    assert!(text.contains("hello world"), "{text}");
    // The chunked body went up and came back framed as it was sent.
    assert!(text.contains("chunk-") && text.contains("body"), "{text}");
    assert!(lower.contains("x-ratelimit-remaining: 0"), "{text}");
    assert!(lower.contains("retry-after:"), "{text}");
    assert!(lower.contains("application/problem+json"), "{text}");
    assert!(lower.contains("x-seen-xff: 127.0.0.1"), "{text}");
    assert!(lower.contains("connection: close"), "{text}");
    s.stop().await;
}

#[tokio::test]
async fn http10_and_expect_continue_go_through_the_relay() {
    let up = upstream().await;
    let s = start_text(&proxy_config(up, "")).await;
    let addr = s.proxy.unwrap();
    // HTTP/1.0 without Host: the upstream gets its own authority as Host.
    let text = exchange(addr, b"GET /echo HTTP/1.0\r\n\r\n").await;
    assert_eq!(statuses(&text).first(), Some(&200), "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains(&format!("x-seen-host: {up}")),
        "{text}"
    );
    // Expect: 100-continue: the client hears back (an interim 100, or the final head when the
    // upstream answers at once, as this echo does) before it sends the body.
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"POST /echo HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 4\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf))
        .await
        .expect("an answer before the body")
        .unwrap();
    let mut all = buf[..n].to_vec();
    c.write_all(b"ping").await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut all))
        .await
        .expect("the final answer")
        .unwrap();
    let all = String::from_utf8_lossy(&all);
    let codes = statuses(&all);
    assert!(codes == [100, 200] || codes == [200], "{all}");
    assert!(all.ends_with("ping"), "{all}");
    s.stop().await;
}

#[tokio::test]
async fn oversized_heads_get_431() {
    let up = upstream().await;
    let s = start_text(&proxy_config(up, "")).await;
    let addr = s.proxy.unwrap();
    let big = "a".repeat(100 * 1024);
    let text = exchange(
        addr,
        format!("GET / HTTP/1.1\r\nHost: a\r\nX-Big: {big}\r\n\r\n").as_bytes(),
    )
    .await;
    assert_eq!(statuses(&text), [431], "{text}");
    s.stop().await;
}

#[tokio::test]
async fn garbage_gets_400() {
    let up = upstream().await;
    let s = start_text(&proxy_config(up, "")).await;
    let addr = s.proxy.unwrap();
    let text = exchange(addr, b"NOT HTTP AT ALL\r\n\r\n").await;
    assert_eq!(statuses(&text), [400], "{text}");
    s.stop().await;
}

/// A raw upstream: runs `serve` on every connection it accepts.
async fn raw_upstream<F, Fut>(serve: F) -> SocketAddr
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((c, _)) = listener.accept().await {
            tokio::spawn(serve(c));
        }
    });
    addr
}

/// Reads from `c` until a request head has arrived; `false` when the peer closed first or sent
/// nothing for `idle`.
async fn read_head(c: &mut TcpStream, idle: Duration) -> bool {
    let mut buf = vec![0u8; 65536];
    let mut seen = Vec::new();
    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        match tokio::time::timeout(idle, c.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => seen.extend_from_slice(&buf[..n]),
            _ => return false,
        }
    }
    true
}

/// A raw upstream: answers each connection's first request with `reply`, then closes.
async fn one_shot_upstream(reply: &'static [u8]) -> SocketAddr {
    raw_upstream(move |mut c| async move {
        if read_head(&mut c, Duration::from_secs(10)).await {
            let _ = c.write_all(reply).await;
            let _ = c.shutdown().await;
        }
    })
    .await
}

#[tokio::test]
async fn an_upstream_that_closes_idle_connections_is_retried_on_a_fresh_one() {
    // Keep-alive by its headers, yet it closes after each answer: the second request finds
    // the pooled connection dead and goes out again on a new one.
    let up = one_shot_upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
    let s = start_text(&proxy_config(up, "")).await;
    let addr = s.proxy.unwrap();
    for _ in 0..3 {
        let text = exchange(
            addr,
            b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(statuses(&text), [200], "{text}");
        assert!(text.ends_with("ok"), "{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.stop().await;
}

/// A keep-alive upstream with a short idle timeout: answers each request after `delay`, and
/// closes a connection that stays idle for 100 ms.
async fn idle_timeout_upstream(delay: Duration) -> SocketAddr {
    raw_upstream(move |mut c| async move {
        while read_head(&mut c, Duration::from_millis(100)).await {
            tokio::time::sleep(delay).await;
            if c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                .await
                .is_err()
            {
                return;
            }
        }
    })
    .await
}

#[tokio::test]
async fn a_pool_emptied_by_the_upstreams_idle_timeout_costs_no_request() {
    // Twelve requests at once leave up to twelve pooled connections; the upstream then closes
    // them all on its idle timeout. Every later request must still be answered by the
    // upstream: none may fail because the pool held more than one dead connection.
    let up = idle_timeout_upstream(Duration::from_millis(50)).await;
    let s = start_text(&proxy_config(up, "")).await;
    let addr = s.proxy.unwrap();
    let burst: Vec<_> = (0..12)
        .map(|_| {
            tokio::spawn(exchange(
                addr,
                b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
            ))
        })
        .collect();
    for b in burst {
        let text = b.await.unwrap();
        assert_eq!(statuses(&text), [200], "{text}");
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    // On one connection, so that every request lands on the same worker and its pool.
    let mut c = TcpStream::connect(addr).await.unwrap();
    for i in 0..12 {
        c.write_all(b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .unwrap();
        let head = read_response(&mut c).await;
        assert_eq!(statuses(&head), [200], "request {i}: {head}");
    }
    s.stop().await;
}

/// Reads one response with a `Content-Length` body from `c`.
async fn read_response(c: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let len = text[..end]
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if got.len() >= end + 4 + len {
                return text;
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf))
            .await
            .expect("a response in time")
            .unwrap();
        assert!(n > 0, "closed mid-response: {text}");
        got.extend_from_slice(&buf[..n]);
    }
}

#[tokio::test]
async fn a_close_delimited_upstream_body_reaches_the_client_chunked() {
    let up = one_shot_upstream(b"HTTP/1.1 200 OK\r\nX-Up: 1\r\n\r\nuntil the end").await;
    let s = start_text(&proxy_config(up, "")).await;
    let addr = s.proxy.unwrap();
    let text = exchange(
        addr,
        b"GET /x HTTP/1.1\r\nHost: a\r\n\r\nGET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    // Both answered on one client connection, each re-framed as chunked.
    assert_eq!(statuses(&text), [200, 200], "{text}");
    assert_eq!(
        text.matches("d\r\nuntil the end\r\n0\r\n\r\n").count(),
        2,
        "{text}"
    );
    assert!(
        text.to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{text}"
    );
    s.stop().await;
}

#[tokio::test]
async fn a_malformed_upstream_answer_is_a_502() {
    let up = one_shot_upstream(b"this is not http\r\n\r\n").await;
    let s = start_text(&proxy_config(up, "")).await;
    let text = exchange(
        s.proxy.unwrap(),
        b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(statuses(&text), [502], "{text}");
    assert!(text.contains("\"status\":502"), "{text}");
    s.stop().await;
}

#[tokio::test]
async fn a_refused_request_with_an_unread_body_closes_the_connection() {
    let up = upstream().await;
    let s = start_text(&proxy_config(up, LIMITED)).await;
    let addr = s.proxy.unwrap();
    let first = exchange(
        addr,
        b"GET /v1/a HTTP/1.1\r\nHost: a\r\nX-Api-Key: z\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(statuses(&first), [200], "{first}");
    // Refused, with 10 bytes announced and 3 sent: answered, then closed (the next request
    // on this connection would otherwise be read from the middle of the body).
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"POST /v1/a HTTP/1.1\r\nHost: a\r\nX-Api-Key: z\r\nContent-Length: 10\r\n\r\nabc")
        .await
        .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut out))
        .await
        .expect("closed after the answer")
        .unwrap();
    let text = String::from_utf8_lossy(&out);
    assert_eq!(statuses(&text), [429], "{text}");
    assert!(
        text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );
    s.stop().await;
}

#[tokio::test]
async fn the_proxy_cuts_slow_loris_clients() {
    let up = upstream().await;
    let config =
        tollgate_server::Config::parse("t.toml", &with_ports(&proxy_config(up, ""))).unwrap();
    let limits = tollgate_server::Limits {
        header_read_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let s = start_with_limits(config, limits).await;
    let proxy = s.proxy.unwrap();
    // Half a head, then silence; and a connection that never sends anything.
    let partial = exchange(proxy, b"GET /echo HTTP/1.1\r\nHost: x\r\n").await;
    assert!(
        statuses(&partial).is_empty(),
        "closed unanswered: {partial}"
    );
    let silent = exchange(proxy, b"").await;
    assert!(silent.is_empty(), "{silent}");
    // A whole request on a new connection is still served.
    let ok = exchange(
        proxy,
        b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(statuses(&ok), [200], "{ok}");
    s.stop_cleanly().await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let up = upstream().await;
    let s = start_text(&proxy_config(up, "").replace(
        "timeout = \"2s\"\n",
        "timeout = \"2s\"\nidle_timeout = \"300ms\"\n",
    ))
    .await;
    // One request on a keep-alive connection, then silence: the proxy closes it.
    let text = exchange(s.proxy.unwrap(), b"GET /echo HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(statuses(&text), [200], "{text}");
    assert!(
        !text.to_ascii_lowercase().contains("connection: close"),
        "kept alive until idle: {text}"
    );
    s.stop().await;
}

#[tokio::test]
async fn a_held_request_whose_client_leaves_gives_its_slot_back() {
    let up = upstream().await;
    let s = start_text(&proxy_config(
        up,
        "[[policy]]\nname = \"hooks\"\nalgorithm = \"leaky_bucket\"\nrate = \"1/s\"\nqueue = 1\naction = \"delay\"\nmax_delay = \"5s\"\nkey = [\"header:x-tenant\"]\n",
    ))
    .await;
    let addr = s.proxy.unwrap();
    let req = |tenant: &str| {
        format!("GET /echo HTTP/1.1\r\nHost: a\r\nX-Tenant: {tenant}\r\nConnection: close\r\n\r\n")
    };
    for (tenant, leaves) in [("stays", false), ("leaves", true)] {
        // The first passes at once; the second is held for the next slot.
        let first = exchange(addr, req(tenant).as_bytes()).await;
        assert_eq!(statuses(&first), [200], "{first}");
        let mut held = TcpStream::connect(addr).await.unwrap();
        held.write_all(req(tenant).as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
        if leaves {
            drop(held);
            // The refund is its own task: give it a moment.
            tokio::time::sleep(Duration::from_millis(150)).await;
            let third = exchange(addr, req(tenant).as_bytes()).await;
            assert_eq!(statuses(&third), [200], "the slot came back: {third}");
        } else {
            let third = exchange(addr, req(tenant).as_bytes()).await;
            assert_eq!(statuses(&third), [429], "the queue is full: {third}");
            let mut rest = Vec::new();
            held.read_to_end(&mut rest).await.unwrap();
            assert_eq!(statuses(&String::from_utf8_lossy(&rest)), [200]);
        }
    }
    s.stop().await;
}

#[tokio::test]
async fn host_matched_policies_see_the_host_header() {
    let up = upstream().await;
    let s = start_text(&proxy_config(
        up,
        "[[policy]]\nname = \"api-host\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\nkey = [\"ip\"]\nmatch = { host = \"api.example.com\" }\n",
    ))
    .await;
    let addr = s.proxy.unwrap();
    let text = exchange(
        addr,
        b"GET /echo HTTP/1.1\r\nHost: api.example.com\r\n\r\nGET /echo HTTP/1.1\r\nHost: www.example.com\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(statuses(&text), [200, 200], "{text}");
    let lower = text.to_ascii_lowercase();
    assert_eq!(
        lower.matches("x-ratelimit-remaining: 4").count(),
        1,
        "{text}"
    );
    assert_eq!(
        lower.matches("x-ratelimit-limit").count(),
        1,
        "only the matching host: {text}"
    );
    s.stop().await;
}

/// Sends one keep-alive request on `c` and reads its answer's head (the echo answers a GET
/// with an empty body).
async fn head_on(c: &mut TcpStream, path: &str) -> String {
    c.write_all(format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut byte))
            .await
            .expect("an answer")
            .unwrap();
        assert_eq!(
            n,
            1,
            "closed mid-answer: {}",
            String::from_utf8_lossy(&head)
        );
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).to_ascii_lowercase()
}

#[tokio::test]
async fn a_reload_reaches_connections_already_open() {
    let up = upstream().await;
    let dir = std::env::temp_dir().join(format!("tollgate-relay-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tollgate.toml");
    let text = |limit: u32| {
        with_ports(&proxy_config(
            up,
            &format!(
                "[[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = {limit}\nwindow = \"1h\"\nkey = [\"ip\"]\n"
            ),
        ))
    };
    std::fs::write(&path, text(5)).unwrap();
    let s = start(tollgate_server::Config::load(&path).unwrap()).await;
    let mut c = TcpStream::connect(s.proxy.unwrap()).await.unwrap();
    let head = head_on(&mut c, "/echo").await;
    assert!(head.contains("x-ratelimit-limit: 5"), "{head}");
    std::fs::write(&path, text(7)).unwrap();
    // Same connection: once the file is re-read, its next request is decided by the new policy.
    let mut seen = head;
    for _ in 0..100 {
        seen = head_on(&mut c, "/echo").await;
        if seen.contains("x-ratelimit-limit: 7") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen.contains("x-ratelimit-limit: 7"), "{seen}");
    s.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
