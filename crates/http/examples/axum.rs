//! An axum app behind Tollgate's layer: `cargo run -p tollgate-http --example axum [ADDR]`
//! (default 127.0.0.1:3000), then follow the curl lines it prints.
//!
//! Policies: `api` allows 5 requests a minute per API key (or per client IP without one) on
//! `/api/**`; `export` is a token bucket of 20 refilled at 1/s where a POST to
//! `/api/export/{id}` costs 5, so a burst of four exports passes and the fifth gets a 429.

use std::error::Error;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Path};
use axum::routing::{get, post};
use tollgate::{Policy, Quota};
use tollgate_http::{Engine, HttpPolicy, KeyChain, RateLimitLayer, RouteMatch};

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3000".to_owned());
    let engine = Engine::builder()
        .policy(
            HttpPolicy::new(Policy::new(
                "api",
                Quota::sliding_window_counter(5, Duration::from_secs(60))?,
            )?)
            .keys(KeyChain::parse(["header:x-api-key", "ip"])?)
            .route(RouteMatch::any().path("/api/**")?),
        )
        .policy(
            HttpPolicy::new(Policy::new(
                "export",
                Quota::token_bucket(20, "1/s".parse()?)?,
            )?)
            .keys(KeyChain::parse(["header:x-api-key", "ip"])?)
            .route(RouteMatch::any().path("/api/export/*")?.methods(["POST"])?)
            .cost(5),
        )
        .build()?;
    // axum puts the peer address in `ConnectInfo` (see `into_make_service_with_connect_info`);
    // `inner_body` keeps axum's own body type, which axum would otherwise box on every response.
    let layer = RateLimitLayer::new(engine)
        .peer_addr(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()))
        .inner_body();
    let app = Router::new()
        .route("/", get(|| async { "not rate limited\n" }))
        .route("/api/hello", get(|| async { "hello\n" }))
        .route(
            "/api/export/{id}",
            post(|Path(id): Path<String>| async move { format!("exported {id}\n") }),
        )
        .layer(layer);

    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    println!("  curl -i http://{addr}/api/hello");
    println!(
        "  for i in $(seq 7); do curl -s -o /dev/null -w '%{{http_code}}\\n' http://{addr}/api/hello; done"
    );
    println!("  curl -i -H 'x-api-key: k1' http://{addr}/api/hello");
    println!("  for i in $(seq 5); do curl -s -X POST http://{addr}/api/export/7; done");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
