//! A layer that finds no client address warns, once: its `ip` key falls back to `anonymous`,
//! one quota every client shares, which one client could then spend for all.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::Request;
use common::*;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_layer_with_no_client_address_warns_once_and_counts_anonymous() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let engine = builder(manual_clock())
        .policy(policy(fixed("api", 2, 60), &["ip"], None))
        .build()
        .unwrap();
    let app = app(engine);
    // No PeerAddr, SocketAddr or IpAddr in the extensions: every request is `anonymous`.
    let bare = || Request::builder().uri("/").body(Body::empty()).unwrap();
    for _ in 0..2 {
        assert_eq!(status(&app, bare()).await, axum::http::StatusCode::OK);
    }
    assert_eq!(
        status(&app, bare()).await,
        axum::http::StatusCode::TOO_MANY_REQUESTS
    );
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert_eq!(text.matches("found no client address").count(), 1, "{text}");
    assert!(text.contains("RateLimitLayer::peer_addr"), "{text}");
    // A request that has one is counted by it, and adds no warning.
    assert_eq!(
        status(&app, get("/", "192.0.2.7", &[])).await,
        axum::http::StatusCode::OK
    );
}
