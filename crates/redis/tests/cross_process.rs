//! Exactness across OS processes: 3 processes × 8 tasks on one key never over-admit, with and
//! without hot-key leases. The processes are this test binary run again with `TG_WORKER_*` set
//! (see `worker_entry_point`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use common::RedisServer;
use tollgate::testing::{T0, unique};
use tollgate::{Check, Lease, Policy, Quota, Store, Timestamp};
use tollgate_redis::{ClockSource, RedisConfig, RedisStore};

const PROCESSES: usize = 3;
const TASKS: usize = 8;

/// Runs `PROCESSES` copies of this binary's worker; returns the sum of what they admitted.
fn run_workers(url: &str, quota: &str, policy: &str, key: &str, per_task: usize) -> u64 {
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "worker_entry_point",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("TG_WORKER_URL", url)
                .env("TG_WORKER_QUOTA", quota)
                .env("TG_WORKER_POLICY", policy)
                .env("TG_WORKER_KEY", key)
                .env("TG_WORKER_REQUESTS", per_task.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            assert!(out.status.success(), "a worker process failed");
            let text = String::from_utf8_lossy(&out.stdout);
            // The harness prints "test worker_entry_point ... " on the same line.
            text.split("ADMITTED ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("worker printed no count: {text}"))
        })
        .sum()
}

/// Leases of this many units, for the `lease-` specs.
const LEASE: u32 = 7;

fn quota_of(spec: &str) -> Quota {
    match spec.trim_start_matches("lease-").split_once(':') {
        Some(("fixed", n)) => Quota::fixed_window(n.parse().unwrap(), Duration::from_secs(3600)),
        Some(("token", n)) => {
            let n: u32 = n.parse().unwrap();
            format!("{n}/s")
                .parse()
                .and_then(|r| Quota::token_bucket(n, r))
        }
        _ => panic!("unknown quota spec {spec}"),
    }
    .unwrap()
}

/// Not a test of its own: the body of each worker process. Without `TG_WORKER_URL` (a normal
/// test run) it has nothing to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_entry_point() {
    let Ok(url) = std::env::var("TG_WORKER_URL") else {
        return;
    };
    let var = |name: &str| std::env::var(name).unwrap();
    let quota = var("TG_WORKER_QUOTA");
    let mut policy = Policy::new(&var("TG_WORKER_POLICY"), quota_of(&quota)).unwrap();
    if quota.starts_with("lease-") {
        policy = policy
            .with_lease(Lease::new(LEASE, Duration::from_secs(60)).unwrap())
            .unwrap();
    }
    let key = var("TG_WORKER_KEY");
    let requests: usize = var("TG_WORKER_REQUESTS").parse().unwrap();
    let mut config = RedisConfig::standalone(&url);
    config.timeout = Duration::from_secs(5);
    config.deny_cache_size = 0;
    if quota.contains("fixed") {
        // One fixed instant, so the whole run is one window whatever the wall clock does.
        config.clock = ClockSource::Local;
    }
    config.on_error = tollgate_redis::OnError::Deny;
    let store = RedisStore::new(config).await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..TASKS {
        let (store, policy, key) = (store.clone(), policy.clone(), key.clone());
        tasks.spawn(async move {
            let mut admitted = 0u64;
            for _ in 0..requests {
                let now = Timestamp::from_system_time(SystemTime::now()).max(T0);
                // Through `apply`, the path leases take; `on_error = deny` and no errors below,
                // so every decision is Redis's or a lease's.
                let d = store
                    .apply(now, &[Check::new(&policy, key.as_bytes(), 1)])
                    .await
                    .unwrap();
                admitted += u64::from(d.allowed());
            }
            admitted
        });
    }
    let mut total = 0;
    while let Some(r) = tasks.join_next().await {
        total += r.unwrap();
    }
    assert_eq!(store.stats().errors, 0, "{:?}", store.stats());
    println!("ADMITTED {total}");
}

#[test]
fn fixed_window_admits_exactly_the_limit_across_processes() {
    let server = RedisServer::start();
    // 3 × 8 × 60 = 1440 requests against 1000.
    let admitted = run_workers(&server.url(), "fixed:1000", &unique("xproc"), "one-key", 60);
    assert_eq!(admitted, 1000);
}

#[test]
fn token_bucket_never_exceeds_capacity_plus_refill() {
    let server = RedisServer::start();
    let started = Instant::now();
    let admitted = run_workers(
        &server.url(),
        "token:100",
        &unique("xproc-tb"),
        "one-key",
        150,
    );
    // The bucket starts full (100) and refills 100/s over at most the whole run.
    let elapsed = started.elapsed().as_secs_f64();
    let bound = 100.0 + 100.0 * elapsed;
    assert!(
        (admitted as f64) <= bound,
        "{admitted} admitted in {elapsed:.2}s, bound {bound:.0}"
    );
    assert!(
        admitted >= 100,
        "the full bucket admits at least its capacity"
    );
}

#[test]
fn leased_fixed_window_never_exceeds_the_limit_across_processes() {
    let server = RedisServer::start();
    // 3 × 8 × 60 = 1440 requests against 1000, the tasks of a process sharing its leases of 7.
    let admitted = run_workers(
        &server.url(),
        "lease-fixed:1000",
        &unique("xproc-lease"),
        "one-key",
        60,
    );
    assert!(admitted <= 1000, "{admitted} admitted");
    // Only what the processes still held when they stopped went unspent.
    assert!(
        admitted >= 1000 - PROCESSES as u64 * u64::from(LEASE),
        "{admitted} admitted"
    );
}
