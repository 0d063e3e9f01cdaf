//! Hot-key leases against real Redis: several instances (each a `RedisStore` with its own
//! leases) spend one key's quota with time under the test's control, and what they admitted
//! together stays within the bound `docs/redis.md` proves: nothing beyond the limit for the
//! window algorithms, at most N × lease size beyond the bucket for a token bucket. Leases
//! spare Redis, and unspent units go back.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use common::RedisServer;
use proptest::prelude::*;
use tollgate::testing::{T0, unique};
use tollgate::{Check, Lease, Policy, Quota, Store};
use tollgate_redis::{ClockSource, OnError, RedisConfig, RedisStore};

const INSTANCES: usize = 3;

fn server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
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

/// An instance with the caller's clock; the first of a group keeps the deny cache.
async fn instance(deny_cache: bool) -> RedisStore {
    let mut config = RedisConfig::standalone(&server().url());
    config.clock = ClockSource::Local;
    config.on_error = OnError::Deny;
    config.timeout = Duration::from_secs(2);
    if !deny_cache {
        config.deny_cache_size = 0;
    }
    let store = RedisStore::new(config).await.unwrap();
    store.load_scripts().await.unwrap();
    store
}

/// A leased policy of each algorithm a lease is sound for: limit 20 per 50 s, leases of 4 for
/// 15 s. Long windows, because Redis expires keys in real time while the test's clock only
/// moves when it says: a window must outlast the real time a run takes.
fn leased_policies(prefix: &str) -> Vec<Policy> {
    let s = Duration::from_secs;
    let lease = Lease::new(4, s(15)).unwrap();
    [
        Quota::fixed_window(20, s(50)),
        Quota::sliding_window_log(20, s(50)),
        Quota::sliding_window_counter(20, s(50)),
        "20/50s".parse().and_then(|r| Quota::token_bucket(20, r)),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, q)| {
        Policy::new(&format!("{prefix}-{i}"), q.unwrap())
            .unwrap()
            .with_lease(lease)
            .unwrap()
    })
    .collect()
}

/// How far beyond the algorithm's own bound the admissions `(µs, cost)` went; 0 when within.
fn over_admitted(quota: &Quota, admitted: &[(u64, u32)], extra: u64) -> u64 {
    let sum = |from: u64, to: u64| -> u64 {
        admitted
            .iter()
            .filter(|(t, _)| (from..=to).contains(t))
            .map(|&(_, c)| u64::from(c))
            .sum()
    };
    let mut worst = 0;
    for &(t, _) in admitted {
        let over = match quota {
            Quota::FixedWindow(a) => {
                let w = a.window_micros();
                let start = t - t % w;
                sum(start, start + w - 1).saturating_sub(u64::from(a.limit()))
            }
            Quota::SlidingWindowLog(a) => {
                let w = a.window_micros();
                sum(t.saturating_sub(w - 1), t).saturating_sub(u64::from(a.limit()))
            }
            Quota::SlidingWindowCounter(a) => {
                // current x window + previous x overlap <= limit x window, at every admission.
                let w = a.window_micros();
                let start = t - t % w;
                let current = u128::from(sum(start, t));
                let previous = u128::from(sum(start.saturating_sub(w), start - 1));
                let overlap = u128::from(w - (t - start));
                let used = current * u128::from(w) + previous * overlap;
                let allowed = u128::from(a.limit()) * u128::from(w);
                u64::try_from(used.saturating_sub(allowed).div_ceil(u128::from(w))).unwrap()
            }
            Quota::TokenBucket(a) => admitted
                .iter()
                .filter(|(s, _)| *s <= t)
                .map(|&(s, _)| {
                    let bound = u64::from(a.capacity()) + (t - s) / a.interval_micros() + extra;
                    sum(s, t).saturating_sub(bound)
                })
                .max()
                .unwrap_or(0),
            Quota::LeakyBucket(_) | Quota::Concurrency(_) => unreachable!("not leased"),
        };
        worst = worst.max(over);
    }
    worst
}

#[derive(Clone, Debug)]
struct Op {
    instance: usize,
    advance_us: u64,
    cost: u32,
}

fn op() -> impl Strategy<Value = Op> {
    (
        0..INSTANCES,
        prop_oneof![
            6 => Just(0u64),
            3 => 0u64..2_000_000,
            1 => prop_oneof![Just(15_000_000u64), Just(50_000_000), 0u64..60_000_000],
        ],
        prop_oneof![6 => Just(1u32), 1 => 2u32..4],
    )
        .prop_map(|(instance, advance_us, cost)| Op {
            instance,
            advance_us,
            cost,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Three instances on one key: the window algorithms never admit beyond their limit, and
    /// a token bucket never beyond its bound plus 3 leases.
    #[test]
    fn instances_with_leases_stay_within_the_bound(ops in prop::collection::vec(op(), 1..250)) {
        let rt = runtime();
        let stores: Vec<RedisStore> =
            rt.block_on(async { vec![instance(true).await, instance(false).await, instance(false).await] });
        let policies = leased_policies(&unique("bound"));
        let key = unique("hot");
        let mut admitted: Vec<Vec<(u64, u32)>> = vec![Vec::new(); policies.len()];
        let mut now = T0;
        for op in &ops {
            now = now.saturating_add(Duration::from_micros(op.advance_us));
            for (p, policy) in policies.iter().enumerate() {
                let d = rt
                    .block_on(stores[op.instance].apply(now, &[Check::new(policy, key.as_bytes(), op.cost)]))
                    .unwrap();
                prop_assert_eq!(stores[op.instance].stats().errors, 0);
                if d.allowed() {
                    admitted[p].push((now.as_micros(), op.cost));
                }
            }
        }
        for (p, policy) in policies.iter().enumerate() {
            let extra = if matches!(policy.quota(), Quota::TokenBucket(_)) {
                INSTANCES as u64 * u64::from(policy.lease().unwrap().size())
            } else {
                0
            };
            let over = over_admitted(policy.quota(), &admitted[p], extra);
            prop_assert_eq!(over, 0, "{}: {:?}", policy.quota(), admitted[p]);
        }
    }
}

/// The checker catches what it must: a burst past the limit is over-admission.
#[test]
fn the_bound_checker_sees_over_admission() {
    let policies = leased_policies("checker");
    let t = T0.as_micros();
    let burst: Vec<(u64, u32)> = (0..21).map(|i| (t + i, 1)).collect();
    for policy in &policies {
        assert_eq!(over_admitted(policy.quota(), &burst[..20], 0), 0);
        assert_eq!(
            over_admitted(policy.quota(), &burst, 0),
            1,
            "{}",
            policy.quota()
        );
    }
}

/// One instance spends a hot key's quota with one script call per lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_spare_redis() {
    let store = instance(true).await;
    let policy = Policy::new(
        &unique("spare"),
        Quota::fixed_window(1_000, Duration::from_secs(60)).unwrap(),
    )
    .unwrap()
    .with_lease(Lease::new(50, Duration::from_secs(1)).unwrap())
    .unwrap();
    let mut admitted = 0;
    for i in 0..1_100u64 {
        let now = T0.saturating_add(Duration::from_micros(i));
        let d = store
            .apply(now, &[Check::new(&policy, b"hot", 1)])
            .await
            .unwrap();
        admitted += u32::from(d.allowed());
        if i < 1_000 {
            let d = d.into_first().unwrap();
            assert!(d.allowed, "request {i}");
            assert_eq!(d.remaining, 999 - i, "remaining counts down across leases");
        }
    }
    assert_eq!(admitted, 1_000);
    let stats = store.stats();
    assert_eq!(
        stats.script_calls, 21,
        "20 leases and one denial: {stats:?}"
    );
    assert_eq!(stats.leased, 980);
}

/// Unspent units go back: to the next lease's taker, and on `return_leases`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unspent_units_go_back() {
    let lisbon_day = tollgate::Calendar::new(tollgate::CalendarUnit::Day, "Europe/Lisbon");
    for quota in [
        Quota::fixed_window(100, Duration::from_secs(10)),
        lisbon_day.and_then(|c| Quota::fixed_calendar(100, c)),
        Quota::sliding_window_log(100, Duration::from_secs(10)),
        Quota::sliding_window_counter(100, Duration::from_secs(10)),
        "100/10s".parse().and_then(|r| Quota::token_bucket(100, r)),
    ] {
        let policy = Policy::new(&unique("return"), quota.unwrap())
            .unwrap()
            .with_lease(Lease::new(30, Duration::from_secs(1)).unwrap())
            .unwrap();
        let plain = Policy::new(policy.name(), policy.quota().clone()).unwrap();
        let (a, b) = (instance(false).await, instance(false).await);
        let key = unique("return-key");
        let check = |p| [Check::new(p, key.as_bytes(), 1)];
        assert!(a.apply(T0, &check(&policy)).await.unwrap().allowed());
        // Redis has counted the whole lease; `b`, without one, sees 100 - 30.
        let peek = [Check::new(&plain, key.as_bytes(), 0)];
        let seen = b.apply(T0, &peek).await.unwrap().into_first().unwrap();
        assert_eq!(seen.remaining, 70, "{}", policy.quota());
        a.return_leases(T0).await.unwrap();
        let seen = b.apply(T0, &peek).await.unwrap().into_first().unwrap();
        assert_eq!(seen.remaining, 99, "{}: 29 came back", policy.quota());
    }
}
