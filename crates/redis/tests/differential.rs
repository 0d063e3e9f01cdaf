//! Differential property test: random traffic (single and multi-policy requests, refunds,
//! bursts and gaps across window boundaries) decides identically on the in-memory store and on
//! the Redis store, decision by decision.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::RedisServer;
use proptest::prelude::*;
use tollgate::algorithm::LeakyBucket;
use tollgate::testing::{T0, not_behind, unique};
use tollgate::{Check, MemoryStore, Policy, Quota, Store};

fn server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

fn policies(prefix: &str) -> Vec<Policy> {
    let ms = Duration::from_millis;
    let quotas = [
        Quota::fixed_window(6, ms(500)),
        Quota::sliding_window_log(6, ms(500)),
        Quota::sliding_window_counter(6, ms(500)),
        "4/300ms".parse().and_then(|r| Quota::token_bucket(6, r)),
        "4/300ms".parse().and_then(|r| Quota::leaky_bucket(r, 5)),
        "6/500ms".parse().and_then(|r| {
            LeakyBucket::new(r, 5).map(|l| Quota::LeakyBucket(l.with_max_delay(ms(200))))
        }),
    ];
    quotas
        .into_iter()
        .enumerate()
        .map(|(i, q)| Policy::new(&format!("{prefix}-{i}"), q.unwrap()).unwrap())
        .collect()
}

#[derive(Clone, Debug)]
struct Op {
    advance_us: u64,
    refund: bool,
    /// (policy index, key index, cost)
    checks: Vec<(usize, u8, u32)>,
}

fn op() -> impl Strategy<Value = Op> {
    (
        prop_oneof![
            4 => Just(0u64),
            // Exactly a window or a refill interval: the boundaries where an off-by-one shows.
            2 => prop_oneof![Just(500_000u64), Just(300_000), Just(75_000), Just(83_334)],
            3 => 0u64..40_000,
            2 => 0u64..300_000,
            1 => 0u64..1_200_000,
        ],
        prop::bool::weighted(0.05),
        prop::collection::vec((0usize..6, 0u8..3, 0u32..5), 1..4),
    )
        .prop_map(|(advance_us, refund, checks)| Op {
            advance_us,
            refund,
            checks,
        })
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn memory_and_redis_decide_alike(ops in prop::collection::vec(op(), 1..60)) {
        let rt = runtime();
        let redis = rt.block_on(common::local_store(&server().url()));
        let memory = MemoryStore::new();
        let prefix = unique("diff");
        let policies = policies(&prefix);
        let keys: Vec<String> = (0..3).map(|k| format!("{prefix}-key{k}")).collect();
        let mut now = T0;
        let start = Instant::now();
        for (step, op) in ops.iter().enumerate() {
            now = not_behind(now.saturating_add(Duration::from_micros(op.advance_us)), T0, start);
            let checks: Vec<Check<'_>> = op
                .checks
                .iter()
                .map(|&(p, k, c)| Check::new(&policies[p], keys[usize::from(k)].as_bytes(), c))
                .collect();
            if op.refund {
                memory.refund_now(now, &checks);
                rt.block_on(redis.refund(now, &checks)).unwrap();
                continue;
            }
            let want = memory.apply_now(now, &checks);
            let got = rt.block_on(redis.apply_redis(now, &checks)).unwrap();
            prop_assert_eq!(got, want, "step {} at {} checks {:?}", step, now, op.checks);
        }
    }
}

/// Sliding window counters whose products (count × window_µs) exceed 2^53, up to the largest
/// quota the core accepts, decide exactly like the pure algorithm (the script switches to
/// exact limb arithmetic there); so do fixed windows whose one-integer reply ((µs left) ×
/// (limit + 1) + count) would pass 2^53 (the script replies an array there). A counter packs an
/// admission into one integer where its denials do not fit (10^6 a second, 100,000 a day), and
/// neither fits at 10^9 a day.
#[test]
fn huge_window_counters_are_exact() {
    let rt = runtime();
    let redis = rt.block_on(common::local_store(&server().url()));
    let memory = MemoryStore::new();
    let prefix = unique("huge");
    let day = Duration::from_secs(86_400);
    let quotas = [
        (u32::MAX, day * 400),
        (1_000_000_000, day),
        (100_000, day),
        (1_000_000, Duration::from_secs(1)),
        (3, day * 400),
    ];
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n.max(1)
    };
    let algorithms: [fn(u32, Duration) -> Quota; 2] = [
        |limit, window| Quota::sliding_window_counter(limit, window).unwrap(),
        |limit, window| Quota::fixed_window(limit, window).unwrap(),
    ];
    let quotas = algorithms
        .iter()
        .flat_map(|quota| quotas.map(|(limit, window)| (limit, window, quota(limit, window))));
    for (i, (limit, window, quota)) in quotas.enumerate() {
        let policy = Policy::new(&format!("{prefix}-{i}"), quota).unwrap();
        let window_us = window.as_micros() as u64;
        let mut now = T0;
        let start = Instant::now();
        for step in 0..300 {
            let advance = Duration::from_micros(match next(4) {
                0 => 0,
                1 => next(window_us / 50),
                2 => next(window_us / 3),
                _ => next(window_us + window_us / 2),
            });
            now = not_behind(now.saturating_add(advance), T0, start);
            let cost = match next(4) {
                0 => next(u64::from(limit) / 2 + 1),
                1 => next(u64::from(limit) / 10 + 1),
                2 => next(u64::from(limit) + 1),
                _ => next(5),
            } as u32;
            let key = format!("{prefix}-k{}", next(2));
            let checks = [Check::new(&policy, key.as_bytes(), cost)];
            let want = memory.apply_now(now, &checks);
            let got = rt.block_on(redis.apply_redis(now, &checks)).unwrap();
            assert_eq!(got, want, "limit {limit} step {step} at {now} cost {cost}");
        }
    }
}
