//! Throughput over loopback TCP: the same axum hello-world served without the layer, with only
//! the five response headers the layer adds (fixed values, no limiter), and with the layer,
//! loaded in turns by an in-process keep-alive HTTP/1 client, many short rounds so that noise
//! from other processes hits all alike; the overheads reported are medians of the per-round
//! ratios. Run with `cargo bench -p tollgate-http --bench tcp` (`TOLLGATE_BENCH_SECS` per turn,
//! default 1; `TOLLGATE_BENCH_ROUNDS`, default 11; `TOLLGATE_BENCH_THREADS`, runtime workers
//! shared by server and client, default 2).
//!
//! With `TOLLGATE_BENCH_SERVE=VARIANT` it only serves one variant for an external load
//! generator (scripts/bench-layer.sh): `plain`, `headers`, `outer` or any app of
//! `common::app` (`governor`, `layer`, `layer-tb`, `layer-tb-2h`, `layer-2h`,
//! `layer-tb-2h-wrap`).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ConnectInfo;
use axum::routing::get;
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tollgate::{Policy, Quota};
use tollgate_http::{Engine, HttpPolicy, InnerBody, KeyChain, RateLimitLayer};

const CONNECTIONS: usize = 32;

fn hello() -> Router {
    Router::new().route("/v1/hello", get(|| async { "Hello, World!" }))
}

fn limited() -> Router {
    hello().layer(limiter())
}

fn limiter() -> RateLimitLayer<tollgate::MemoryStore, tollgate::SystemClock, InnerBody> {
    let engine = Engine::builder()
        .policy(
            HttpPolicy::new(
                Policy::new(
                    "api",
                    Quota::sliding_window_counter(10_000, Duration::from_secs(3600)).unwrap(),
                )
                .unwrap(),
            )
            .keys(KeyChain::parse(["header:x-api-key", "ip"]).unwrap()),
        )
        .build()
        .unwrap();
    RateLimitLayer::new(engine)
        .peer_addr(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()))
        .inner_body()
}

/// The hello-world with the five headers the layer adds, as fixed values and no limiter: what
/// the headers alone cost (hyper writes them, the client parses them, on the same cores).
fn headers_only() -> Router {
    use http::{HeaderName, HeaderValue};
    // Names parsed once, as the layer's are.
    const NAMES: [HeaderName; 5] = [
        HeaderName::from_static("x-ratelimit-limit"),
        HeaderName::from_static("x-ratelimit-remaining"),
        HeaderName::from_static("x-ratelimit-reset"),
        HeaderName::from_static("ratelimit-policy"),
        HeaderName::from_static("ratelimit"),
    ];
    const VALUES: [HeaderValue; 5] = [
        HeaderValue::from_static("10000"),
        HeaderValue::from_static("9998"),
        HeaderValue::from_static("1795990000"),
        HeaderValue::from_static("\"api\";q=10000;w=3600"),
        HeaderValue::from_static("\"api\";r=9998;t=3600"),
    ];
    hello().layer(tower::util::MapResponseLayer::new(
        |mut response: http::Response<axum::body::Body>| {
            let h = response.headers_mut();
            h.reserve(NAMES.len());
            for (name, value) in NAMES.into_iter().zip(VALUES) {
                h.insert(name, value);
            }
            response
        },
    ))
}

async fn serve(app: Router) -> SocketAddr {
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
    addr
}

/// The layer around the whole router rather than through `Router::layer`: axum then boxes
/// nothing per route for it, and the limit applies before routing (unknown paths count too).
async fn serve_outer() -> SocketAddr {
    use tower::Layer;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // axum::serve wants axum's body type, which `inner_body` keeps.
    let app = limiter().layer(hello());
    tokio::spawn(async move {
        axum::serve(
            listener,
            axum::ServiceExt::<axum::extract::Request>::into_make_service_with_connect_info::<
                SocketAddr,
            >(app),
        )
        .await
        .unwrap();
    });
    addr
}

/// Requests per second over `CONNECTIONS` keep-alive connections for `secs`.
async fn load(addr: SocketAddr, secs: f64) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for c in 0..CONNECTIONS {
        let done = Arc::clone(&done);
        tasks.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            stream.set_nodelay(true).unwrap();
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .unwrap();
            tokio::spawn(conn);
            // 1000 clients, so no run comes near the 10 000 an hour each may send.
            let mut n = c;
            while Instant::now() < deadline {
                let request = Request::builder()
                    .uri("/v1/hello")
                    .header("host", "bench")
                    .header("x-api-key", format!("customer-{}", n % 1000))
                    .body(Empty::<Bytes>::new())
                    .unwrap();
                // A keep-alive connection is ready again only once the previous exchange is done.
                sender.ready().await.unwrap();
                let response = sender.send_request(request).await.unwrap();
                assert!(response.status().is_success());
                response.into_body().collect().await.unwrap();
                done.fetch_add(1, Ordering::Relaxed);
                n += CONNECTIONS;
            }
        }));
    }
    let start = Instant::now();
    for t in tasks {
        t.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    // `cargo bench` passes `--bench`; a test run (`cargo test --benches`) passes nothing:
    // keep that run short.
    let benching = std::env::args().any(|a| a == "--bench");
    let secs: f64 = std::env::var("TOLLGATE_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if benching { 1.0 } else { 0.1 });
    let rounds: usize = std::env::var("TOLLGATE_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if benching { 11 } else { 1 });
    let threads: usize = std::env::var("TOLLGATE_BENCH_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        if let Ok(variant) = std::env::var("TOLLGATE_BENCH_SERVE") {
            // For an external load generator (scripts/bench-layer.sh runs wrk, and reads this
            // process's CPU time): serve one variant, print its URL and serve until killed.
            let addr = match variant.as_str() {
                "plain" => serve(hello()).await,
                "headers" => serve(headers_only()).await,
                "outer" => serve_outer().await,
                other => serve(common::app(other)).await,
            };
            println!("http://{addr}/v1/hello");
            std::future::pending::<()>().await;
        }
        let plain = serve(hello()).await;
        let headers = serve(headers_only()).await;
        let with = serve(limited()).await;
        for addr in [plain, headers, with] {
            load(addr, secs / 2.0).await; // warm-up
        }
        let (mut a, mut h, mut b) = (Vec::new(), Vec::new(), Vec::new());
        let (mut oh, mut ol) = (Vec::new(), Vec::new());
        for round in 1..=rounds {
            // Rotate the order, so that none always gets the quieter moment.
            let mut order = [0, 1, 2];
            order.rotate_left(round % 3);
            let mut rates = [0.0; 3];
            for i in order {
                rates[i] = load([plain, headers, with][i], secs).await;
            }
            let [x, y, z] = rates;
            println!(
                "round {round}: without layer {x:>9.0} req/s, headers only {y:>9.0} req/s, \
                 with layer {z:>9.0} req/s"
            );
            a.push(x);
            h.push(y);
            b.push(z);
            oh.push((1.0 - y / x) * 100.0);
            ol.push((1.0 - z / x) * 100.0);
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "median: without layer {:.0} req/s, headers only {:.0} req/s, with layer {:.0} req/s",
            median(&mut a),
            median(&mut h),
            median(&mut b)
        );
        println!(
            "median per-round overhead: headers only {:.1}%, with layer {:.1}%",
            median(&mut oh),
            median(&mut ol)
        );
    });
}
