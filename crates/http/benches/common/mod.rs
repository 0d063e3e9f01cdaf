//! The axum hello-world and the requests that the benches (`layer`, `instructions`, `tcp`)
//! share, so all measure exactly the same apps: plain, behind Tollgate's layer in its
//! configurations, and behind `tower_governor` 0.8 with `use_headers()`.
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
use tollgate::{Policy, Quota, Rate};
use tollgate_http::{
    Engine, HeaderConfig, HttpPolicy, KeyChain, PeerAddr, RateLimitLayer, ResetFormat, RouteMatch,
};
use tower_governor::GovernorError;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::KeyExtractor;

pub fn hello() -> Router {
    Router::new()
        .route("/v1/hello", get(|| async { "Hello, World!" }))
        .route("/open", get(|| async { "Hello, World!" }))
        // Turns the handlers into services once, as `axum::serve` does; without it a
        // `oneshot` on the router would redo that on every call.
        .with_state(())
}

/// Per key and hour. With [`KEYS`] clients taking turns no run comes near a denial, so every
/// call takes the full admitted path (match, key, store, headers), with realistic numbers.
pub const LIMIT: u32 = 10_000;
/// How many API keys take turns.
pub const KEYS: usize = 1_000;

/// The sliding window counter, [`LIMIT`] an hour.
pub fn sliding_window() -> Quota {
    Quota::sliding_window_counter(LIMIT, Duration::from_secs(3600)).unwrap()
}

/// The token bucket of [`LIMIT`], refilled at [`LIMIT`] an hour: what `governed` enforces.
pub fn token_bucket() -> Quota {
    Quota::token_bucket(LIMIT, Rate::new(LIMIT, Duration::from_secs(3600)).unwrap()).unwrap()
}

/// `X-RateLimit-Limit` and `X-RateLimit-Remaining` only: the two lines `tower_governor` sends.
pub fn two_headers() -> HeaderConfig {
    HeaderConfig {
        reset_format: ResetFormat::Omitted,
        ietf: false,
        ..HeaderConfig::default()
    }
}

/// Tollgate's layer with `quota` and `headers`, keyed by `x-api-key` (then the IP), on the
/// routes under `path` (every route, as tower_governor limits, when `None`), keeping axum's
/// body type as the docs advise for axum apps (`inner_body`).
pub fn limited_by(quota: Quota, headers: HeaderConfig, path: Option<&str>) -> Router {
    let layer = layer_by(quota, headers, path);
    hello().layer(layer.inner_body()).with_state(())
}

/// [`limited_by`] with the default body shape (the inner body or the answer's, in an `Either`
/// that axum boxes).
pub fn limited_wrapped(quota: Quota, headers: HeaderConfig) -> Router {
    hello().layer(layer_by(quota, headers, None)).with_state(())
}

fn layer_by(quota: Quota, headers: HeaderConfig, path: Option<&str>) -> RateLimitLayer {
    let route = match path {
        Some(path) => RouteMatch::any().path(path).unwrap(),
        None => RouteMatch::any(),
    };
    let engine = Engine::builder()
        .policy(
            HttpPolicy::new(Policy::new("api", quota).unwrap())
                .keys(KeyChain::parse(["header:x-api-key", "ip"]).unwrap())
                .route(route),
        )
        .headers(headers)
        .build()
        .unwrap();
    RateLimitLayer::new(engine)
}

/// The default: sliding window counter, all five header lines, on `/v1/**`.
pub fn limited() -> Router {
    limited_by(sliding_window(), HeaderConfig::default(), Some("/v1/**"))
}

/// `tower_governor`'s key: the `x-api-key` header, owned (its limiter keeps `String` keys).
#[derive(Clone, Copy, Debug)]
pub struct ApiKey;

impl KeyExtractor for ApiKey {
    type Key = String;

    fn extract<T>(&self, req: &Request<T>) -> Result<String, GovernorError> {
        req.headers()
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or(GovernorError::UnableToExtractKey)
    }
}

/// `tower_governor` 0.8 with `use_headers()`: the same token bucket as [`token_bucket`], keyed
/// by the same header, on every route.
pub fn governed() -> Router {
    let config = GovernorConfigBuilder::default()
        .key_extractor(ApiKey)
        .period(Duration::from_secs(3600) / LIMIT)
        .burst_size(LIMIT)
        .use_headers()
        .finish()
        .unwrap();
    hello()
        .layer(tower_governor::GovernorLayer::new(config))
        .with_state(())
}

/// The app of a variant name, as the benches and scripts/bench-layer.sh call them.
pub fn app(variant: &str) -> Router {
    match variant {
        "plain" => hello(),
        "governor" => governed(),
        "layer" => limited(),
        // Configured as `governed` is: every route, the token bucket.
        "layer-tb" => limited_by(token_bucket(), HeaderConfig::default(), None),
        "layer-tb-2h" => limited_by(token_bucket(), two_headers(), None),
        "layer-2h" => limited_by(sliding_window(), two_headers(), None),
        "layer-tb-2h-wrap" => limited_wrapped(token_bucket(), two_headers()),
        other => panic!(
            "unknown variant {other}; use plain, governor, layer, layer-tb, layer-tb-2h, \
             layer-2h or layer-tb-2h-wrap"
        ),
    }
}

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
