//! What the layer costs: an axum hello-world called in-process (tower `oneshot`), without the
//! layer, with it (one policy, memory store, a hot key; the common case), and with the layer on
//! a path no policy matches. Run with `cargo bench -p tollgate-http --bench layer`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::hint::black_box;
use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use criterion::{Criterion, criterion_group, criterion_main};
use http::Request;
use tollgate::{Policy, Quota};
use tollgate_http::{Engine, HttpPolicy, KeyChain};
use tower::ServiceExt;

use common::{hello, limited, request};

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("axum_hello");
    let plain = hello();
    group.bench_function("without_layer", |b| {
        b.to_async(&rt).iter(|| async {
            black_box(plain.clone().oneshot(request("/v1/hello")).await.unwrap())
        })
    });
    // The price of any layer in axum (it re-boxes every route), for comparison.
    let noop = hello()
        .layer(tower::util::MapRequestLayer::new(|r: Request<Body>| r))
        .with_state(());
    group.bench_function("with_noop_layer", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(noop.clone().oneshot(request("/v1/hello")).await.unwrap()) })
    });
    let with = limited();
    group.bench_function("with_layer", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(with.clone().oneshot(request("/v1/hello")).await.unwrap()) })
    });
    group.bench_function("with_layer_unmatched_path", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(with.clone().oneshot(request("/open")).await.unwrap()) })
    });
    group.finish();

    // Where the time goes: the engine alone, keyed by a hashed API key or by the IP.
    let mut group = c.benchmark_group("engine");
    for (name, keys) in [("api_key", "header:x-api-key"), ("ip", "ip")] {
        let engine = Engine::builder()
            .policy(
                HttpPolicy::new(
                    Policy::new(
                        "api",
                        // One key, called millions of times: a quota it never exhausts.
                        Quota::sliding_window_counter(u32::MAX, Duration::from_secs(3600)).unwrap(),
                    )
                    .unwrap(),
                )
                .keys(KeyChain::parse([keys]).unwrap()),
            )
            .build()
            .unwrap();
        let req = request("/v1/hello");
        let peer = Some(SocketAddr::from(([203, 0, 113, 9], 40000)).ip());
        group.bench_function(format!("prepare_{name}"), |b| {
            b.iter(|| {
                black_box(engine.prepare(&tollgate_http::RequestInfo::from_request(&req, peer)))
            })
        });
        group.bench_function(format!("evaluate_{name}"), |b| {
            b.to_async(&rt).iter(|| async {
                black_box(
                    engine
                        .evaluate(&tollgate_http::RequestInfo::from_request(&req, peer))
                        .await,
                )
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    targets = bench
}
criterion_main!(benches);
