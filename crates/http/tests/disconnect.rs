//! Over real TCP: a client that hangs up while its request is held for a leaky-bucket slot
//! gives the slot back, so the next client gets it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::ConnectInfo;
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate::{Policy, Quota};
use tollgate_http::{Action, HttpPolicy, KeyChain, RateLimitLayer};

async fn raw_get(addr: SocketAddr) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nx-tenant: t\r\n\r\n")
        .await
        .unwrap();
    s
}

async fn status_line(mut s: tokio::net::TcpStream) -> String {
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).await.unwrap();
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or("")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_up_while_held_frees_the_slot() {
    let clock = manual_clock();
    let bucket = Policy::new(
        "hooks",
        Quota::leaky_bucket("1/s".parse().unwrap(), 1).unwrap(),
    )
    .unwrap();
    let engine = builder(clock.clone())
        .policy(
            HttpPolicy::new(bucket)
                .keys(KeyChain::parse(["header:x-tenant"]).unwrap())
                .action(Action::Delay {
                    max_delay: Duration::from_secs(5),
                }),
        )
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(engine)
        .peer_addr(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()));
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    // The first departs at once; the second is held for the one queue place.
    assert!(status_line(raw_get(addr).await).await.contains("200"));
    let held = raw_get(addr).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Queue full: a third is refused.
    let third = tokio::time::timeout(Duration::from_secs(5), status_line(raw_get(addr).await));
    assert!(third.await.unwrap().contains("429"));
    // The held client hangs up; the server notices and gives its place back. Under load that
    // takes a moment: until then a new request is refused, afterwards it is held.
    drop(held);
    let mut attempts = 0;
    let next = loop {
        attempts += 1;
        assert!(attempts < 50, "the slot was never given back");
        let mut s = raw_get(addr).await;
        let mut buf = vec![0u8; 4096];
        match tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf)).await {
            Err(_) => break s, // no answer yet: held for the freed slot
            Ok(n) => {
                let text = String::from_utf8_lossy(&buf[..n.unwrap()]).into_owned();
                assert!(text.contains("429"), "{text}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    clock.advance(Duration::from_secs(1));
    let line = tokio::time::timeout(Duration::from_secs(5), status_line(next))
        .await
        .unwrap();
    assert!(line.contains("200"), "{line}");
}
