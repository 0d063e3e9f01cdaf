//! What allow and deny lists cost `Engine::prepare` (the synchronous half of every request at
//! every door), and what a change to the live entries costs, at 100,000 entries:
//!
//! ```text
//! cargo bench -p tollgate-http --bench lists
//! ```
//!
//! `prepare/no_lists` and `prepare/deny_100k` prepare the same request (one policy keyed by
//! client address), the second with a deny list of 100,000 networks the client is not on;
//! `prepare/deny_100k_hit` with one it is on. `change/100k_live` replaces 100,000 live entries,
//! as one admin change does (every change rebuilds the list).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;
use std::net::IpAddr;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use http::{HeaderMap, Method};
use tollgate::{Policy, Quota};
use tollgate_http::{Engine, HttpPolicy, ListAction, ListEntry, ListSpec, RequestInfo};

/// `n` distinct networks in 10.0.0.0/8 (four in five single addresses, the rest /24s).
fn entries(n: usize) -> Vec<ListEntry> {
    let mut out = Vec::with_capacity(n);
    let mut x: u32 = 0x1234_5678;
    let mut seen = std::collections::HashSet::new();
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let ip = 0x0a00_0000 | (x & 0x00ff_ffff);
        let text = if x.is_multiple_of(5) {
            format!("{}/24", std::net::Ipv4Addr::from(ip & 0xffff_ff00))
        } else {
            std::net::Ipv4Addr::from(ip).to_string()
        };
        if seen.insert(text.clone()) {
            out.push(ListEntry::parse(&text).unwrap());
        }
    }
    out
}

fn engine(lists: Vec<ListSpec>) -> Engine {
    let policy = Policy::new(
        "api",
        Quota::fixed_window(4_000_000_000, Duration::from_secs(1)).unwrap(),
    )
    .unwrap();
    Engine::builder()
        .policy(HttpPolicy::new(policy))
        .lists(lists)
        .build()
        .unwrap()
}

fn bench(c: &mut Criterion) {
    let headers = HeaderMap::new();
    let method = Method::GET;
    let prepare = |engine: &Engine, ip: IpAddr| {
        let info = RequestInfo::new(&method, "/v1/items", &headers).with_client_ip(Some(ip));
        black_box(engine.prepare(&info))
    };
    let client: IpAddr = "192.0.2.7".parse().unwrap();
    let listed = entries(100_000);
    let deny = ListSpec {
        name: "blocked".into(),
        action: ListAction::Deny,
        entries: listed.clone(),
    };
    let inside: IpAddr = match &listed[0] {
        ListEntry::Ip(cidr) => cidr.addr(),
        ListEntry::Key { .. } => unreachable!(),
    };
    let plain = engine(Vec::new());
    let with_list = engine(vec![deny]);
    let mut group = c.benchmark_group("prepare");
    group.bench_function("no_lists", |b| b.iter(|| prepare(&plain, client)));
    group.bench_function("deny_100k", |b| b.iter(|| prepare(&with_list, client)));
    group.bench_function("deny_100k_hit", |b| b.iter(|| prepare(&with_list, inside)));
    group.finish();

    let live = engine(vec![ListSpec {
        name: "blocked".into(),
        action: ListAction::Deny,
        entries: Vec::new(),
    }]);
    let changes: Vec<(String, ListEntry)> = listed
        .into_iter()
        .map(|e| ("blocked".to_owned(), e))
        .collect();
    let mut group = c.benchmark_group("change");
    group.sample_size(10);
    group.bench_function("100k_live", |b| {
        b.iter(|| live.set_live_list_entries(black_box(changes.clone())))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
