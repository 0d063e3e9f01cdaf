//! Throughput over loopback TCP: the same axum hello-world served with and without the layer,
//! loaded in turns by an in-process keep-alive HTTP/1 client, many short rounds so that noise
//! from other processes hits both alike; the overhead reported is the median of the per-round
//! ratios. Run with `cargo bench -p tollgate-http --bench tcp` (`TOLLGATE_BENCH_SECS` per turn,
//! default 1; `TOLLGATE_BENCH_ROUNDS`, default 11).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

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
use tollgate_http::{Engine, HttpPolicy, KeyChain, RateLimitLayer};

const CONNECTIONS: usize = 32;

fn hello() -> Router {
    Router::new().route("/v1/hello", get(|| async { "Hello, World!" }))
}

fn limited() -> Router {
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
    hello().layer(
        RateLimitLayer::new(engine)
            .peer_addr(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip())),
    )
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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let plain = serve(hello()).await;
        let with = serve(limited()).await;
        load(plain, secs / 2.0).await; // warm-up
        load(with, secs / 2.0).await;
        let (mut a, mut b, mut overhead) = (Vec::new(), Vec::new(), Vec::new());
        for round in 1..=rounds {
            // Alternate which goes first, so neither always gets the quieter half.
            let (x, y) = if round % 2 == 0 {
                let y = load(with, secs).await;
                (load(plain, secs).await, y)
            } else {
                let x = load(plain, secs).await;
                (x, load(with, secs).await)
            };
            println!("round {round}: without layer {x:>9.0} req/s, with layer {y:>9.0} req/s");
            a.push(x);
            b.push(y);
            overhead.push((1.0 - y / x) * 100.0);
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (x, y, o) = (median(&mut a), median(&mut b), median(&mut overhead));
        println!(
            "median: without layer {x:.0} req/s, with layer {y:.0} req/s; \
             median per-round overhead {o:.1}%"
        );
    });
}
