//! Shared test helpers: an axum app behind the layer, request builders, and header parsing with
//! the `sfv` structured-field parser (never a regex).
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code, unreachable_pub)]

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::any;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tollgate::{Clock, ManualClock, Policy, Quota, Store, Timestamp};
use tollgate_http::{
    Engine, EngineBuilder, HttpPolicy, KeyChain, PeerAddr, RateLimitLayer, RouteMatch,
};
use tower::ServiceExt;

/// 2023-11-14T00:00:00Z: a fixed wall-clock start, aligned to whole days so fixed windows
/// start there.
pub const START: u64 = 1_699_920_000;

pub fn manual_clock() -> ManualClock {
    ManualClock::new(Timestamp::from_secs(START))
}

/// A builder with the memory store and `clock`.
pub fn builder<C: Clock>(clock: C) -> EngineBuilder<tollgate::MemoryStore, C> {
    Engine::builder().clock(clock)
}

pub fn swc(name: &str, limit: u32, window_secs: u64) -> Policy {
    Policy::new(
        name,
        Quota::sliding_window_counter(limit, Duration::from_secs(window_secs)).unwrap(),
    )
    .unwrap()
}

pub fn fixed(name: &str, limit: u32, window_secs: u64) -> Policy {
    Policy::new(
        name,
        Quota::fixed_window(limit, Duration::from_secs(window_secs)).unwrap(),
    )
    .unwrap()
}

pub fn policy(p: Policy, keys: &[&str], path: Option<&str>) -> HttpPolicy {
    let mut route = RouteMatch::any();
    if let Some(path) = path {
        route = route.path(path).unwrap();
    }
    HttpPolicy::new(p)
        .keys(KeyChain::parse(keys).unwrap())
        .route(route)
}

/// An axum app answering 200 "hello" on every path, behind the layer.
pub fn app<S: Store, C: Clock>(engine: Engine<S, C>) -> Router {
    Router::new()
        .route("/", any(|| async { "hello" }))
        .route("/{*rest}", any(|| async { "hello" }))
        .layer(RateLimitLayer::new(engine))
}

/// [`app`] with the layer keeping axum's own body type ([`RateLimitLayer::inner_body`]).
pub fn app_inner_body<S: Store, C: Clock>(engine: Engine<S, C>) -> Router {
    Router::new()
        .route("/", any(|| async { "hello" }))
        .route("/{*rest}", any(|| async { "hello" }))
        .layer(RateLimitLayer::new(engine).inner_body())
}

pub fn peer(ip: &str) -> PeerAddr {
    PeerAddr(SocketAddr::new(ip.parse::<IpAddr>().unwrap(), 40_000))
}

/// GET `uri` from `ip` with `headers`.
pub fn get(uri: &str, ip: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut b = Request::builder().uri(uri).extension(peer(ip));
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    b.body(Body::empty()).unwrap()
}

pub async fn send(app: &Router, request: Request<Body>) -> Response<Body> {
    app.clone().oneshot(request).await.unwrap()
}

pub async fn status(app: &Router, request: Request<Body>) -> StatusCode {
    send(app, request).await.status()
}

pub async fn body_json(response: Response<Body>) -> serde_json::Value {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

pub fn header<'a, B>(response: &'a Response<B>, name: &str) -> Option<&'a str> {
    response.headers().get(name).map(|v| v.to_str().unwrap())
}

pub fn header_u64<B>(response: &Response<B>, name: &str) -> u64 {
    header(response, name).unwrap().parse().unwrap()
}

/// One item of `RateLimit-Policy` or `RateLimit`: its name and integer parameters.
#[derive(Debug, PartialEq, Eq)]
pub struct Item {
    pub name: String,
    pub params: Vec<(String, i64)>,
}

impl Item {
    pub fn param(&self, key: &str) -> i64 {
        self.params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("no {key} in {self:?}"))
    }
}

/// Parses a structured-field list of named items with integer parameters, as the IETF draft writes them
/// `RateLimit-Policy` and `RateLimit` are.
pub fn sf_items(value: &str) -> Vec<Item> {
    use sfv::{BareItem, ListEntry, Parser};
    let list = Parser::new(value).parse::<sfv::List>().unwrap();
    list.into_iter()
        .map(|entry| match entry {
            ListEntry::Item(item) => {
                let name = match item.bare_item {
                    BareItem::String(s) => s.as_str().to_owned(),
                    other => panic!("item is not a string: {other:?}"),
                };
                let params = item
                    .params
                    .into_iter()
                    .map(|(k, v)| match v {
                        BareItem::Integer(i) => (k.as_str().to_owned(), i64::from(i)),
                        other => panic!("parameter {k:?} is not an integer: {other:?}"),
                    })
                    .collect();
                Item { name, params }
            }
            ListEntry::InnerList(_) => panic!("inner list in {value:?}"),
        })
        .collect()
}
