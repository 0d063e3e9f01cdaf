//! Runtime input never leaks memory: a server that runs for months while operators set, change
//! and lift per-key overrides keeps a flat heap. Every distinct quota an override is given has
//! its own header text (`RateLimit-Policy` advertises it); that text must go when the override
//! goes, not stay interned for the life of the process.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use http::{HeaderMap, HeaderValue, Method};
use peak_alloc::PeakAlloc;
use tollgate::{Clock, MemoryStore};
use tollgate_http::{Disposition, QuotaFields, RequestInfo};

#[global_allocator]
static HEAP: PeakAlloc = PeakAlloc;

/// Sets `rounds` overrides of the key, each with a quota never seen before, and decides a
/// request under each (so its headers, which carry the override's text, are made and dropped).
fn churn(
    engine: &tollgate_http::Engine<MemoryStore, tollgate::ManualClock>,
    clock: &tollgate::ManualClock,
    key: &[u8],
    from: u32,
    rounds: u32,
) {
    let mut headers = HeaderMap::new();
    headers.insert("x-api-key", HeaderValue::from_static("customer-42"));
    let method = Method::GET;
    for i in from..from + rounds {
        let fields = QuotaFields {
            limit: Some(1_000 + i),
            ..QuotaFields::default()
        };
        let over = engine.compile_override("api", &fields, None).unwrap();
        engine.set_overrides([(Box::from(key), over)]);
        let info = RequestInfo::new(&method, "/v1/items", &headers);
        let evaluation = futures_ready(engine.evaluate(&info));
        assert!(matches!(evaluation.disposition(), Disposition::Pass));
        let policy_field = evaluation
            .headers()
            .find(|(name, _)| name == "ratelimit-policy")
            .map(|(_, v)| v.to_str().unwrap().to_owned());
        let expected = format!("\"api\";q={};w=60", 1_000 + i);
        assert_eq!(policy_field.as_deref(), Some(expected.as_str()));
        // A day later: every window of this round's state has passed, so a purge drops it, as
        // the server's does every ten seconds.
        clock.advance(Duration::from_secs(86_400));
        engine.limiter().store().purge_expired(clock.now());
    }
}

/// Polls a future of the memory store, which is ready at once.
fn futures_ready<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let waker = std::task::Waker::noop();
    match future
        .as_mut()
        .poll(&mut std::task::Context::from_waker(waker))
    {
        std::task::Poll::Ready(out) => out,
        std::task::Poll::Pending => panic!("the memory store answers at once"),
    }
}

#[test]
fn changing_overrides_keep_the_heap_flat() {
    let clock = manual_clock();
    let engine = builder(clock.clone())
        .policy(policy(swc("api", 100, 60), &["header:x-api-key"], None))
        .build()
        .unwrap();
    // The key as the store sees it (hashed credential), from a first evaluation.
    let mut headers = HeaderMap::new();
    headers.insert("x-api-key", HeaderValue::from_static("customer-42"));
    let method = Method::GET;
    let prepared = engine.prepare(&RequestInfo::new(&method, "/v1/items", &headers));
    let key: Vec<u8> = prepared.keys().next().map(|(_, k)| k.to_vec()).unwrap();
    // Warm up: every lazily grown table, per-thread buffer and cache reaches its size.
    churn(&engine, &clock, &key, 0, 2_000);
    let before = HEAP.current_usage();
    churn(&engine, &clock, &key, 2_000, 20_000);
    let after = HEAP.current_usage();
    // 20,000 quotas never seen before: interned, each would keep well over 100 bytes (2 MB).
    let grown = after.saturating_sub(before);
    assert!(
        grown < 64 * 1024,
        "the heap grew by {grown} bytes over 20,000 distinct overrides"
    );
}
