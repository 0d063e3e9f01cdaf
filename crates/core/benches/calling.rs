//! What the way an application calls the limiter costs: the same token bucket decision over
//! the memory store, reached four ways, next to governor's synchronous `check_key` in the same
//! run.
//!
//! - `check_now`: `Limiter::check_now`, synchronous;
//! - `poll once`: `Limiter::check`'s future polled once with a no-op waker (the memory store
//!   never waits), as `benches/check.rs` does;
//! - `await (tokio)`: `check(..).await` in a loop inside one `async` block, run by a tokio
//!   current-thread runtime: an async handler's call;
//! - `block_on (futures)`: `futures::executor::block_on(check(..))` around every check.
//!
//! `String` keys (what a server has): one hot key, or 100,000 visited in order; every decision
//! admitted (a quota no run reaches) or denied (a quota of one, spent before the run). The
//! contenders run interleaved: in each round every one runs a burst, each with a store of its
//! own; the figure is the median over the rounds of governor's time over the contender's, and
//! their middle half (above 1.00 the contender is faster).
//!
//! Why it matters: an executor's own work is a few nanoseconds a poll, and a decision is an
//! 88-byte value that an executor may move through several frames; a copy read back right
//! after it was written, in pieces of another size, waits for the writes to reach the cache
//! (`limiter/check.rs` says how the limiter's own handback avoids that). `check_now` hands the
//! decision straight to its caller. Over the memory store, async code can call it too: it never
//! blocks.
//!
//! `cargo bench -p tollgate --bench calling` (`scripts/bench-core.sh` runs it too);
//! `TOLLGATE_BENCH_ROUNDS` (default 11) and `TOLLGATE_BENCH_OPS` (per burst, default 200,000).
//! `TOLLGATE_BENCH_PROFILE="hot,admit,await (tokio)"` runs one contender alone, for a profiler.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Instant;

use governor::{Quota as GovQuota, RateLimiter};
use tollgate::{Limiter, MemoryStore, Policy, Quota};

mod common;
use common::{env, now_or_never, summary};

const KEYS: usize = 100_000;
const POLICY: &str = "api";

/// One contender: runs `ops` decisions and returns how long they took, in seconds.
type Burst<'a> = Box<dyn Fn(u64) -> f64 + 'a>;

/// The key of operation `i`: the hot key, or the next of the 100,000.
fn key(keys: &[String], i: u64) -> &String {
    &keys[i as usize % keys.len()]
}

fn limiter(deny: bool) -> Limiter<MemoryStore> {
    let quota = if deny {
        Quota::token_bucket(1, "1/h".parse().unwrap())
    } else {
        Quota::token_bucket(50_000_000, "1/m".parse().unwrap())
    };
    Limiter::builder()
        .store(MemoryStore::builder().max_keys(4 * KEYS).build())
        .policy(Policy::new(POLICY, quota.unwrap()).unwrap())
        .build()
        .unwrap()
}

fn contenders<'a>(keys: &'a [String], deny: bool) -> Vec<(&'static str, Burst<'a>)> {
    // Every key seen once, so a denying run denies.
    let seeded = || {
        let l = limiter(deny);
        for k in keys {
            l.check_now(POLICY, k, 1).unwrap();
        }
        l
    };
    let (now, polled, awaited, blocked) = (seeded(), seeded(), seeded(), seeded());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let quota = if deny {
        GovQuota::per_hour(NonZeroU32::new(1).unwrap())
    } else {
        GovQuota::per_minute(NonZeroU32::new(1).unwrap())
            .allow_burst(NonZeroU32::new(50_000_000).unwrap())
    };
    let gov: RateLimiter<String, _, _> = RateLimiter::keyed(quota);
    for k in keys {
        let _ = gov.check_key(k);
    }
    let timed = |run: &dyn Fn()| {
        let start = Instant::now();
        run();
        start.elapsed().as_secs_f64()
    };
    vec![
        (
            "check_now",
            Box::new(move |ops| {
                timed(&|| {
                    for i in 0..ops {
                        let d = now.check_now(POLICY, key(keys, i), 1);
                        black_box(d.map(|d| d.allowed).unwrap_or(false));
                    }
                })
            }),
        ),
        (
            "poll once",
            Box::new(move |ops| {
                timed(&|| {
                    for i in 0..ops {
                        let d = now_or_never(polled.check(POLICY, key(keys, i), 1));
                        black_box(d.map(|d| d.allowed).unwrap_or(false));
                    }
                })
            }),
        ),
        (
            "await (tokio)",
            Box::new(move |ops| {
                timed(&|| {
                    runtime.block_on(async {
                        for i in 0..ops {
                            let d = awaited.check(POLICY, key(keys, i), 1).await;
                            black_box(d.map(|d| d.allowed).unwrap_or(false));
                        }
                    })
                })
            }),
        ),
        (
            "block_on (futures)",
            Box::new(move |ops| {
                timed(&|| {
                    for i in 0..ops {
                        let d = futures_executor::block_on(blocked.check(POLICY, key(keys, i), 1));
                        black_box(d.map(|d| d.allowed).unwrap_or(false));
                    }
                })
            }),
        ),
        (
            "governor",
            Box::new(move |ops| {
                timed(&|| {
                    for i in 0..ops {
                        black_box(gov.check_key(key(keys, i)).is_ok());
                    }
                })
            }),
        ),
    ]
}

/// Runs one contender alone, for a profiler: `TOLLGATE_BENCH_PROFILE="KEYS,MODE,CONTENDER"`
/// (`hot` or `seq`; `admit` or `deny`; a contender's name as printed, e.g. `block_on
/// (futures)`), `TOLLGATE_BENCH_OPS` decisions (default 10,000,000).
fn profile(spec: &str, all: &[String]) {
    let parts: Vec<&str> = spec.splitn(3, ',').collect();
    let [keys, mode, name] = parts[..] else {
        panic!("TOLLGATE_BENCH_PROFILE=KEYS,MODE,CONTENDER (hot,admit,check_now)");
    };
    let keys = if keys == "hot" { &all[..1] } else { all };
    let ops = env("TOLLGATE_BENCH_OPS", 10_000_000);
    for (contender, burst) in contenders(keys, mode == "deny") {
        if contender == name {
            let ns = burst(ops) * 1e9 / ops as f64;
            println!("{ops} decisions of {spec}: {ns:.1} ns each");
        }
    }
}

fn main() {
    let all: Vec<String> = (0..KEYS).map(|i| format!("api-key-{i:08}")).collect();
    if let Ok(spec) = std::env::var("TOLLGATE_BENCH_PROFILE") {
        profile(&spec, &all);
        return;
    }
    // `cargo test --benches` runs this binary without `--bench`: keep that a quick smoke test.
    let bench = std::env::args().any(|a| a == "--bench");
    let (rounds, ops) = if bench {
        (
            env("TOLLGATE_BENCH_ROUNDS", 11) as usize,
            env("TOLLGATE_BENCH_OPS", 200_000),
        )
    } else {
        (1, 100)
    };
    println!(
        "governor's time / the contender's, median over {rounds} rounds of {ops} decisions \
         (middle half); ns a decision; token bucket, String keys, one thread"
    );
    let scenarios: &[(&str, &[String])] = if bench {
        &[("one hot key", &all[..1]), ("100k keys in order", &all[..])]
    } else {
        &[("one hot key", &all[..1])]
    };
    for &(label, keys) in scenarios {
        for deny in [false, true] {
            let contenders = contenders(keys, deny);
            let mut times = vec![Vec::new(); contenders.len()];
            for round in 0..rounds {
                // Each round starts with the next contender.
                for c in (0..contenders.len()).map(|c| (c + round) % contenders.len()) {
                    times[c].push(contenders[c].1(ops) / ops as f64);
                }
            }
            let governor = &times[contenders.len() - 1];
            let mode = if deny { "deny" } else { "admit" };
            for ((name, _), own) in contenders.iter().zip(&times) {
                let (seconds, ratio, lo, hi) = summary(own, governor);
                println!(
                    "{label:<20} {mode:<6} {name:<20} {:>6.1} ns {ratio:>6.2} ({lo:.2}-{hi:.2})",
                    seconds * 1e9
                );
            }
        }
    }
}
