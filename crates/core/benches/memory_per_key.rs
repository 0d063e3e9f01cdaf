//! Bytes per tracked key at 1,000,000 keys: resident memory grown by a store holding a million
//! keys, divided by a million, for every algorithm and for `governor`'s keyed limiter, with
//! 13-byte `String` API keys (which governor must keep, and Tollgate hashes) and with `u64` keys
//! (governor's cheapest key type; Tollgate gets its eight bytes). Each quota keeps every key
//! alive for the whole run.
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
const CASES: [&str; 6] = [
    "fixed_window",
    "sliding_window_counter",
    "token_bucket",
    "leaky_bucket",
    "sliding_window_log",
    "governor",
];

/// The `i`-th API key: 13 bytes.
fn api_key(i: u64, out: &mut String) {
    use std::fmt::Write;
    out.clear();
    let _ = write!(out, "key-{i:09}");
}

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

fn measure(case: &str, strings: bool) -> f64 {
    let mut key = String::new();
    if case == "governor" && strings {
        // The same API keys Tollgate hashes: governor keeps each one.
        let keys: Vec<String> = (0..KEYS)
            .map(|i| {
                api_key(i, &mut key);
                key.clone()
            })
            .collect();
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
    let before = resident_bytes();
    if case == "governor" {
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
    // Budgets above what a million keys take: this measures what each key costs.
    let store = MemoryStore::builder()
        .max_keys(2 * KEYS as usize)
        .max_log_bytes(1 << 40)
        .build();
    let policy = Policy::new(case, quota(case)).unwrap();
    let now = Timestamp::from_secs(1_800_000_000);
    for i in 0..KEYS {
        if strings {
            api_key(i, &mut key);
            store.apply_now(now, &[Check::new(&policy, key.as_bytes(), 1)]);
        } else {
            store.apply_now(now, &[Check::new(&policy, &i.to_le_bytes(), 1)]);
        }
    }
    let after = resident_bytes();
    assert_eq!(store.len() as u64, KEYS);
    (after - before) as f64 / KEYS as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(case) = args.iter().find_map(|a| a.strip_prefix("--case=")) {
        let strings = args.iter().any(|a| a == "--strings");
        println!("{:.1}", measure(case, strings));
        return;
    }
    // `cargo bench` passes `--bench`; any other run (cargo test --benches) just smoke-tests.
    if !args.iter().any(|a| a == "--bench") {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    println!("bytes per tracked key at {KEYS} keys (resident memory growth / keys)");
    println!("{:<24} {:>14} {:>10}", "store", "13-byte String", "u64");
    for case in CASES {
        let run = |strings: bool| {
            let mut command = Command::new(&exe);
            command.arg(format!("--case={case}"));
            if strings {
                command.arg("--strings");
            }
            let out = command.output().unwrap();
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };
        println!("{case:<24} {:>14} {:>10}", run(true), run(false));
    }
}
