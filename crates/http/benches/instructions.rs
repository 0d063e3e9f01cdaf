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
//! `governor` (tower_governor with `use_headers()`), `layer` (sliding window counter, five
//! header lines), `layer-tb` (token bucket, five lines), `layer-tb-2h` and `layer-2h` (the two
//! lines tower_governor sends) or `unmatched`; each runs `TOLLGATE_REQUESTS` requests (default
//! 200 000).
//! Without `--bench` (as under `cargo test --benches`) it runs a few requests of each.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use tower::ServiceExt;

use common::{app, limited, request};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let benching = args.iter().any(|a| a == "--bench");
    let variants: Vec<&str> = match args.iter().skip(1).find(|a| !a.starts_with('-')) {
        Some(v) => vec![v.as_str()],
        None => vec![
            "plain",
            "governor",
            "layer",
            "layer-tb",
            "layer-tb-2h",
            "unmatched",
        ],
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
            "unmatched" => (limited(), "/open"),
            other => (app(other), "/v1/hello"),
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
