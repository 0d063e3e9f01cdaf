//! The reverse proxy over TLS: bodies relayed both ways at once on one TLS connection, and a
//! concurrency slot given back as soon as a TLS client goes away while its request is upstream.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod tls_common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Running, get, start_text, wait_for};
use tls_common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const HTTP1: &[&[u8]] = &[b"http/1.1"];

/// The proxy over TLS (`dir/server.pem`, `dir/server.key`) in front of `upstream`, with a
/// policy of one request in flight per API key on `/v1/export/**`.
async fn start_proxy(dir: &Path, upstream: std::net::SocketAddr) -> Running {
    let text = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{upstream}\"\ntls_cert = {:?}\ntls_key = {:?}\n\n\
         [[policy]]\nname = \"exports\"\nalgorithm = \"concurrency\"\nlimit = 1\nlease_ttl = \"1h\"\n\
         key = [\"header:x-api-key\"]\nmatch = {{ path = \"/v1/export/**\" }}\n",
        dir.join("server.pem"),
        dir.join("server.key")
    );
    start_text(&text).await
}

#[tokio::test]
async fn the_proxy_relays_bodies_both_ways_over_tls() {
    let dir = temp_dir("proxy-bodies");
    let ca = Ca::new("server CA");
    install(&dir, &ca.server("tollgate"));
    let s = start_proxy(&dir, common::upstream().await).await;
    let config = client_config(&ca, None, HTTP1);
    let mut conn = Https::open(s.proxy.unwrap(), Arc::clone(&config))
        .await
        .unwrap();
    // A 4 MiB body streamed up while the upstream streams it back: the read and write halves
    // of one TLS connection busy at once.
    let body: String = (0..4 << 20)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let (status, echoed) = tokio::time::timeout(NO_HANG, conn.request("POST", "/echo", &body))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, 200);
    assert!(
        echoed == body,
        "{} bytes came back of {}",
        echoed.len(),
        body.len()
    );
    // The upstream answered before it had the whole body, so that connection closes (as in
    // plaintext: docs/proxy.md). A large download on a new one, then another request on it.
    let mut conn = Https::open(s.proxy.unwrap(), config).await.unwrap();
    let n = 8 << 20;
    let path = format!("/big?n={n}");
    let big = conn.request("GET", &path, "");
    let (status, big) = tokio::time::timeout(NO_HANG, big).await.unwrap().unwrap();
    assert_eq!((status, big.len()), (200, n));
    assert_eq!(conn.request("GET", "/after", "").await.unwrap().0, 200);
    s.stop().await;
}

/// An upstream that reads each request head, counts it, and never answers.
async fn silent_upstream() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let count = Arc::clone(&count);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut b = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut b).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&b[..n]),
                    }
                }
                count.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(120)).await;
                drop(stream);
            });
        }
    });
    (addr, seen)
}

/// The slot's lease lasts an hour: a second request admitted within the test was admitted
/// because the first one's slot was given back when its TLS client left.
#[tokio::test]
async fn a_tls_client_gone_while_upstream_is_quiet_frees_its_slot() {
    let dir = temp_dir("proxy-slot");
    let ca = Ca::new("server CA");
    install(&dir, &ca.server("tollgate"));
    let (up, seen) = silent_upstream().await;
    let s = start_proxy(&dir, up).await;
    let proxy = s.proxy.unwrap();
    let config = client_config(&ca, None, HTTP1);
    let request = b"GET /v1/export/1 HTTP/1.1\r\nhost: x\r\nx-api-key: k1\r\n\r\n";
    let mut first = connect(proxy, Arc::clone(&config)).await.unwrap();
    first.write_all(request).await.unwrap();
    wait_for(|| async { seen.load(Ordering::SeqCst) == 1 }).await;
    // The one slot is taken: a second request is refused.
    let mut second = connect(proxy, Arc::clone(&config)).await.unwrap();
    second.write_all(request).await.unwrap();
    let mut b = [0u8; 64];
    let n = tokio::time::timeout(NO_HANG, second.read(&mut b))
        .await
        .unwrap()
        .unwrap();
    assert!(
        b[..n].starts_with(b"HTTP/1.1 429"),
        "{}",
        String::from_utf8_lossy(&b[..n])
    );
    // The first client leaves before any answer: its slot comes back.
    drop(first);
    wait_for(|| async {
        let r = get(&s.admin_url("/metrics"), &[]).await;
        String::from_utf8_lossy(&r.body).contains("tollgate_in_flight{policy=\"exports\"} 0")
    })
    .await;
    let mut third = connect(proxy, config).await.unwrap();
    third.write_all(request).await.unwrap();
    wait_for(|| async { seen.load(Ordering::SeqCst) == 2 }).await;
    drop((second, third));
    s.stop().await;
}
