//! A fixed number of in-process requests through one variant of the axum hello-world, for
//! counting instructions with `perf stat`, which unlike wall time does not depend on what else
//! the machine runs:
//!
//! ```text
//! cargo bench -p tollgate-http --bench instructions --no-run
//! perf stat -e instructions:u target/release/deps/instructions-* --bench VARIANT
//! TOLLGATE_REQUESTS=20000 valgrind --tool=callgrind target/release/deps/instructions-* --bench VARIANT
//! ```
//!
//! (the second where there are no hardware counters, as in most VMs). VARIANT is `plain`,
//! `layer` or `unmatched`; each runs `TOLLGATE_REQUESTS` requests (default 200 000).
//! Without `--bench` (as under `cargo test --benches`) it runs a few requests of each.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::Request;
use tollgate::{Policy, Quota};
use tollgate_http::{Engine, HttpPolicy, KeyChain, PeerAddr, RateLimitLayer, RouteMatch};
use tower::ServiceExt;

fn hello() -> Router {
    Router::new()
        .route("/v1/hello", get(|| async { "Hello, World!" }))
        .route("/open", get(|| async { "Hello, World!" }))
        // Turns the handlers into services once, as `axum::serve` does; without it a
        // `oneshot` on the router would redo that on every call.
        .with_state(())
}

fn limited() -> Router {
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
const LIMIT: u32 = 10_000;
/// How many API keys take turns.
const KEYS: usize = 1_000;

fn request(path: &str) -> Request<Body> {
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

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let benching = args.iter().any(|a| a == "--bench");
    let variants: Vec<&str> = match args.iter().skip(1).find(|a| !a.starts_with('-')) {
        Some(v) => vec![v.as_str()],
        None => vec!["plain", "layer", "unmatched"],
    };
    let n: u64 = std::env::var("TOLLGATE_REQUESTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if benching { 200_000 } else { 10 });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for variant in variants {
        let (app, path) = match variant {
            "plain" => (hello(), "/v1/hello"),
            "layer" => (limited(), "/v1/hello"),
            "unmatched" => (limited(), "/open"),
            other => panic!("unknown variant {other}; use plain, layer or unmatched"),
        };
        rt.block_on(async {
            for _ in 0..n {
                let response = app.clone().oneshot(request(path)).await.unwrap();
                assert!(response.status().is_success());
            }
        });
        println!("{variant}: {n} requests");
    }
}
