//! `check()` throughput of the in-memory store for every algorithm, next to the `governor`
//! crate's keyed limiter on the same workload in the same run: one hot key or 100,000 keys
//! round-robin, on one thread or two.
//!
//! Tollgate's side calls `Limiter::check` — policy lookup by name, one clock read, the store
//! step — and polls its future once (the memory store never waits). Every decision admits, so
//! both sides do their full update path.
//!
//! After criterion's report, the same contenders run *interleaved*: in each of several rounds
//! every contender runs a short burst, and each one's median is kept. This machine is shared and
//! noisy; interleaving makes background load hit every contender alike, so the ratios to
//! governor printed at the end are the figures to trust.
//!
//! `cargo bench -p tollgate --bench check` (or `scripts/bench-core.sh`).

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group};
use governor::{Quota as GovQuota, RateLimiter};
use tollgate::{Limiter, MemoryStore, Policy, Quota, SystemClock};

const KEYS: usize = 100_000;

/// Polls a future that is ready at once (the memory store's), without a runtime.
fn now_or_never<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    match f.as_mut().poll(&mut cx) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the memory store never waits"),
    }
}

fn quotas() -> Vec<(&'static str, Quota)> {
    let window = Duration::from_secs(1);
    let fast = "1000000/s".parse().unwrap();
    vec![
        (
            "fixed_window",
            Quota::fixed_window(u32::MAX, window).unwrap(),
        ),
        (
            "sliding_window_log",
            Quota::sliding_window_log(u32::MAX, window).unwrap(),
        ),
        (
            "sliding_window_counter",
            Quota::sliding_window_counter(u32::MAX, window).unwrap(),
        ),
        (
            "token_bucket",
            Quota::token_bucket(1_000_000_000, fast).unwrap(),
        ),
        (
            "leaky_bucket",
            Quota::leaky_bucket(fast, 1_000_000_000).unwrap(),
        ),
    ]
}

fn keys(n: usize) -> Arc<Vec<String>> {
    Arc::new((0..n).map(|i| format!("api-key-{i:08}")).collect())
}

type Tollgate = Limiter<MemoryStore, SystemClock>;

fn tollgate(name: &str, quota: Quota) -> Tollgate {
    Limiter::builder()
        .store(MemoryStore::builder().max_keys(4 * KEYS).build())
        .policy(Policy::new(name, quota).unwrap())
        .build()
        .unwrap()
}

type Governor = RateLimiter<
    String,
    governor::state::keyed::DefaultKeyedStateStore<String>,
    governor::clock::DefaultClock,
>;

fn governor() -> Governor {
    let quota = GovQuota::per_second(NonZeroU32::new(1_000_000).unwrap())
        .allow_burst(NonZeroU32::new(1_000_000_000).unwrap());
    RateLimiter::keyed(quota)
}

/// Runs `per_thread` operations on each of `threads` threads and returns the wall time.
fn timed(threads: usize, per_thread: u64, op: impl Fn(usize, u64) + Sync) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let op = &op;
            s.spawn(move || {
                for i in 0..per_thread {
                    op(t, i);
                }
            });
        }
    });
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    let all_keys = keys(KEYS);
    for (threads, key_count) in [(1, 1), (1, KEYS), (2, 1), (2, KEYS)] {
        let mut group = c.benchmark_group(format!("check/{threads}t/{key_count}k"));
        group.throughput(Throughput::Elements(threads as u64));
        group.sample_size(20);
        group.measurement_time(Duration::from_secs(2));
        group.warm_up_time(Duration::from_millis(500));
        let keys = Arc::clone(&all_keys);
        let pick = move |t: usize, i: u64| -> usize {
            if key_count == 1 {
                0
            } else {
                (i as usize * 7 + t * 50_000) % key_count
            }
        };
        for (name, quota) in quotas() {
            let limiter = tollgate(name, quota);
            group.bench_function(name, |b| {
                b.iter_custom(|iters| {
                    timed(threads, iters, |t, i| {
                        let key = &keys[pick(t, i)];
                        let d = now_or_never(limiter.check(name, key, 1));
                        black_box(d.map(|d| d.allowed).unwrap_or(false));
                    })
                })
            });
        }
        let gov = governor();
        group.bench_function("governor_keyed", |b| {
            b.iter_custom(|iters| {
                timed(threads, iters, |t, i| {
                    let key = &keys[pick(t, i)];
                    black_box(gov.check_key(key).is_ok());
                })
            })
        });
        group.finish();
    }
}

type Op = Box<dyn Fn(usize, u64) + Sync>;

/// Each contender's median ns per decision over interleaved rounds, with its ratio to governor.
fn interleaved() {
    const ROUNDS: usize = 11;
    const PER_ROUND: u64 = 100_000;
    let all_keys = keys(KEYS);
    println!(
        "\ninterleaved: median ns per decision over {ROUNDS} rounds; ratio = governor time / this time"
    );
    println!(
        "{:<14}{:<26}{:>10}{:>12}{:>10}",
        "scenario", "contender", "ns", "M/s", "ratio"
    );
    for (threads, key_count) in [(1, 1), (1, KEYS), (2, 1), (2, KEYS)] {
        let pick = move |t: usize, i: u64| -> usize {
            if key_count == 1 {
                0
            } else {
                (i as usize * 7 + t * 50_000) % key_count
            }
        };
        let mut contenders: Vec<(&str, Op)> = Vec::new();
        for (name, quota) in quotas() {
            let limiter = tollgate(name, quota);
            let keys = Arc::clone(&all_keys);
            contenders.push((
                name,
                Box::new(move |t, i| {
                    let d = now_or_never(limiter.check(name, &keys[pick(t, i)], 1));
                    black_box(d.map(|d| d.allowed).unwrap_or(false));
                }),
            ));
        }
        let gov = governor();
        let keys = Arc::clone(&all_keys);
        contenders.push((
            "governor_keyed",
            Box::new(move |t, i| {
                black_box(gov.check_key(&keys[pick(t, i)]).is_ok());
            }),
        ));
        let mut samples: Vec<Vec<f64>> = vec![Vec::new(); contenders.len()];
        for _ in 0..ROUNDS {
            for (c, (_, op)) in contenders.iter().enumerate() {
                let elapsed = timed(threads, PER_ROUND, op);
                samples[c].push(elapsed.as_nanos() as f64 / (PER_ROUND * threads as u64) as f64);
            }
        }
        let medians: Vec<f64> = samples
            .iter_mut()
            .map(|s| {
                s.sort_by(f64::total_cmp);
                s[s.len() / 2]
            })
            .collect();
        let governor_ns = medians[medians.len() - 1];
        let scenario = format!("{threads}t/{key_count}k");
        for ((name, _), ns) in contenders.iter().zip(&medians) {
            println!(
                "{scenario:<14}{name:<26}{ns:>10.1}{:>12.2}{:>10.2}",
                1e3 / ns,
                governor_ns / ns
            );
        }
    }
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    // `cargo test --benches` runs this binary without `--bench`: keep that a quick smoke test.
    if std::env::args().any(|a| a == "--bench") {
        interleaved();
    }
}
