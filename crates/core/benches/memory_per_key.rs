//! Bytes per tracked key at 1,000,000 keys: resident memory grown by a store holding a million
//! keys, divided by a million, for every algorithm and for `governor`'s keyed limiter (with
//! `u64` keys, its cheapest key type, and with the `String` API keys it must otherwise keep).
//!
//! Each case runs in a fresh child process (this binary re-run with the case name), so memory
//! freed by one case cannot be reused by the next and hide its cost. Resident memory is read
//! from `/proc/self/statm` (Linux).
//!
//! `cargo bench -p tollgate --bench memory_per_key`

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::num::NonZeroU32;
use std::process::Command;
use std::time::Duration;

use tollgate::{Check, MemoryStore, Policy, Quota, Timestamp};

const KEYS: u64 = 1_000_000;
const CASES: [&str; 7] = [
    "fixed_window",
    "sliding_window_counter",
    "token_bucket",
    "leaky_bucket",
    "sliding_window_log",
    "governor_keyed",
    "governor_keyed_string",
];

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn quota(case: &str) -> Quota {
    let window = Duration::from_secs(60);
    match case {
        "fixed_window" => Quota::fixed_window(100, window),
        "sliding_window_counter" => Quota::sliding_window_counter(100, window),
        "sliding_window_log" => Quota::sliding_window_log(100, window),
        "token_bucket" => Quota::token_bucket(100, "10/s".parse().unwrap()),
        _ => Quota::leaky_bucket("10/s".parse().unwrap(), 100),
    }
    .unwrap()
}

fn measure(case: &str) -> f64 {
    let before = resident_bytes();
    if case == "governor_keyed_string" {
        // The same API keys Tollgate hashes: governor keeps each one.
        let keys: Vec<String> = (0..KEYS).map(|i| format!("api-key-{i:08}")).collect();
        let before = resident_bytes();
        let limiter = governor::RateLimiter::<String, _, _>::keyed(governor::Quota::per_second(
            NonZeroU32::new(10).unwrap(),
        ));
        for key in &keys {
            black_box(limiter.check_key(key).is_ok());
        }
        let after = resident_bytes();
        black_box(&limiter);
        return (after - before) as f64 / KEYS as f64;
    }
    if case == "governor_keyed" {
        let limiter = governor::RateLimiter::<u64, _, _>::keyed(governor::Quota::per_second(
            NonZeroU32::new(10).unwrap(),
        ));
        for key in 0..KEYS {
            black_box(limiter.check_key(&key).is_ok());
        }
        let after = resident_bytes();
        black_box(&limiter);
        return (after - before) as f64 / KEYS as f64;
    }
    let store = MemoryStore::builder().max_keys(2 * KEYS as usize).build();
    let policy = Policy::new(case, quota(case)).unwrap();
    let now = Timestamp::from_secs(1_800_000_000);
    for key in 0..KEYS {
        store.apply_now(now, &[Check::new(&policy, &key.to_le_bytes(), 1)]);
    }
    let after = resident_bytes();
    assert_eq!(store.len() as u64, KEYS);
    (after - before) as f64 / KEYS as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(case) = args.iter().find_map(|a| a.strip_prefix("--case=")) {
        println!("{:.1}", measure(case));
        return;
    }
    // `cargo bench` passes `--bench`; any other run (cargo test --benches) just smoke-tests.
    if !args.iter().any(|a| a == "--bench") {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    println!("bytes per tracked key at {KEYS} keys (resident memory growth / keys)");
    for case in CASES {
        let out = Command::new(&exe)
            .arg(format!("--case={case}"))
            .output()
            .unwrap();
        let bytes = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        println!("{case:<24} {bytes:>8} B/key");
    }
}
