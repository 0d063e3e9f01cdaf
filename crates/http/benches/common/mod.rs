//! The axum hello-world and the requests that the in-process benches (`layer`, `instructions`)
//! share, so both measure exactly the same app.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    dead_code,
    unreachable_pub
)]

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::Request;
use tollgate::{Policy, Quota};
use tollgate_http::{Engine, HttpPolicy, KeyChain, PeerAddr, RateLimitLayer, RouteMatch};

pub fn hello() -> Router {
    Router::new()
        .route("/v1/hello", get(|| async { "Hello, World!" }))
        .route("/open", get(|| async { "Hello, World!" }))
        // Turns the handlers into services once, as `axum::serve` does; without it a
        // `oneshot` on the router would redo that on every call.
        .with_state(())
}

pub fn limited() -> Router {
    let engine = Engine::builder()
        .policy(
            HttpPolicy::new(
                Policy::new(
                    "api",
                    Quota::sliding_window_counter(LIMIT, Duration::from_secs(3600)).unwrap(),
                )
                .unwrap(),
            )
            .keys(KeyChain::parse(["header:x-api-key", "ip"]).unwrap())
            .route(RouteMatch::any().path("/v1/**").unwrap()),
        )
        .build()
        .unwrap();
    hello().layer(RateLimitLayer::new(engine)).with_state(())
}

/// Per key and hour. With [`KEYS`] clients taking turns no run comes near a denial, so every
/// call takes the full admitted path (match, key, store, headers), with realistic numbers.
pub const LIMIT: u32 = 10_000;
/// How many API keys take turns.
pub const KEYS: usize = 1_000;

pub fn request(path: &str) -> Request<Body> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static KEY_VALUES: std::sync::LazyLock<Vec<http::HeaderValue>> =
        std::sync::LazyLock::new(|| {
            (0..KEYS)
                .map(|i| http::HeaderValue::from_str(&format!("customer-{i}")).unwrap())
                .collect()
        });
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let key = KEY_VALUES[NEXT.fetch_add(1, Ordering::Relaxed) % KEYS].clone();
    Request::builder()
        .uri(path)
        .header("x-api-key", key)
        .extension(PeerAddr(SocketAddr::from(([203, 0, 113, 9], 40000))))
        .body(Body::empty())
        .unwrap()
}
