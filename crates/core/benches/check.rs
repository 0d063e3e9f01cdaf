//! `check()` throughput of the in-memory store for every algorithm, next to the `governor`
//! crate's keyed limiter on the same workload in the same run.
//!
//! Scenarios: one hot key or 100,000 keys round-robin; one thread or two; every decision
//! admitted (a quota nothing reaches) or every decision denied (a quota of one, spent before
//! the run); keys as `String` API keys (what a server has) or as `u64` (governor's cheapest key
//! type; Tollgate gets its eight bytes). Tollgate's side calls `Limiter::check` — policy lookup
//! by name, one clock read, the store step — and polls its future once (the memory store never
//! waits), as the issue's harness did.
//!
//! The contenders run *interleaved*: in each of several rounds every contender runs a short
//! burst, and each one's median is kept. This machine is shared and noisy; interleaving makes
//! background load hit every contender alike, so the ratios to governor are the figures to
//! trust. `--criterion` also runs criterion on the hot-key token bucket and governor.
//!
//! `cargo bench -p tollgate --bench check` (or `scripts/bench-core.sh`, which also measures
//! bytes per key). `TOLLGATE_BENCH_ROUNDS` (default 11) and `TOLLGATE_BENCH_OPS` (per burst
//! and thread, default 100,000) set the length; `TOLLGATE_BENCH_ONLY=token_bucket` runs one
//! algorithm (and governor). `token_bucket_resolved` is the token bucket through
//! `Limiter::check_policy`, with the policy resolved once instead of looked up by name.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
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

/// Every algorithm with a quota no run reaches (`admit`) or a quota of one (`deny`). Every
/// key's state stays alive through the run (a consumed token takes a minute to come back,
/// windows last a minute), as a key in use does, rather than resetting between two requests.
/// The log's window is a second, which bounds what a hot key's log holds.
fn quotas(admit: bool) -> Vec<(&'static str, Quota)> {
    let (limit, window) = if admit {
        (u32::MAX, Duration::from_secs(60))
    } else {
        (1, Duration::from_secs(3600))
    };
    let rate = if admit { "1/m" } else { "1/h" }.parse().unwrap();
    let burst = if admit { 50_000_000 } else { 1 };
    vec![
        ("fixed_window", Quota::fixed_window(limit, window).unwrap()),
        (
            "sliding_window_log",
            Quota::sliding_window_log(limit, window.min(Duration::from_secs(1))).unwrap(),
        ),
        (
            "sliding_window_counter",
            Quota::sliding_window_counter(limit, window).unwrap(),
        ),
        ("token_bucket", Quota::token_bucket(burst, rate).unwrap()),
        (
            "leaky_bucket",
            Quota::leaky_bucket(rate, burst - 1).unwrap(),
        ),
    ]
}

type Tollgate = Limiter<MemoryStore, SystemClock>;

fn tollgate(name: &str, quota: Quota) -> Tollgate {
    Limiter::builder()
        .store(MemoryStore::builder().max_keys(4 * KEYS).build())
        .policy(Policy::new(name, quota).unwrap())
        .build()
        .unwrap()
}

fn governor_quota(admit: bool) -> GovQuota {
    if admit {
        GovQuota::per_minute(NonZeroU32::new(1).unwrap())
            .allow_burst(NonZeroU32::new(50_000_000).unwrap())
    } else {
        GovQuota::per_hour(NonZeroU32::new(1).unwrap())
    }
}

/// The wall time of a burst and the CPU time its threads spent, summed.
#[derive(Clone, Copy)]
struct Timing {
    wall: Duration,
    cpu: Duration,
}

/// Runs `per_thread` operations on each of `threads` threads.
fn timed(threads: usize, per_thread: u64, op: &(dyn Fn(usize, u64) + Sync)) -> Timing {
    let start = Instant::now();
    let cpu = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let cpu_start = thread_cpu();
                    for i in 0..per_thread {
                        op(t, i);
                    }
                    thread_cpu().saturating_sub(cpu_start)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    Timing {
        wall: start.elapsed(),
        cpu,
    }
}

/// The CPU time this thread has used (`CLOCK_THREAD_CPUTIME_ID`): unlike wall time, it does not
/// count the time the thread waited for a CPU that other work on the machine held.
#[cfg(unix)]
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

#[cfg(not(unix))]
fn thread_cpu() -> Duration {
    Duration::ZERO
}

/// Which key operation `i` of thread `t` uses: always the first, or round-robin with the two
/// threads half the key space apart.
fn picker(key_count: usize) -> impl Fn(usize, u64) -> usize + Copy + Send + Sync {
    move |t, i| {
        if key_count == 1 {
            0
        } else {
            (i as usize * 7 + t * (KEYS / 2)) % key_count
        }
    }
}

type Op = Box<dyn Fn(usize, u64) + Sync>;

/// The token bucket through `Limiter::check_policy`, its policy resolved once: what the name
/// lookup of `check` costs.
const RESOLVED: &str = "token_bucket_resolved";

fn resolved_op(
    limiter: &Tollgate,
    name: &str,
    strings: bool,
    names: &Arc<Vec<String>>,
    pick: impl Fn(usize, u64) -> usize + Copy + Send + Sync + 'static,
) -> Op {
    let limiter = limiter.clone();
    let policy = limiter.policy(name).unwrap().clone();
    if strings {
        let names = Arc::clone(names);
        Box::new(move |t, i| {
            let d = now_or_never(limiter.check_policy(&policy, &names[pick(t, i)], 1));
            black_box(d.map(|d| d.allowed).unwrap_or(false));
        })
    } else {
        Box::new(move |t, i| {
            let key = (pick(t, i) as u64).to_le_bytes();
            let d = now_or_never(limiter.check_policy(&policy, key, 1));
            black_box(d.map(|d| d.allowed).unwrap_or(false));
        })
    }
}

/// The contenders of one scenario, with every key already seen once (so a deny run denies).
fn contenders(
    key_count: usize,
    admit: bool,
    strings: bool,
    only: Option<&str>,
) -> Vec<(&'static str, Op)> {
    let pick = picker(key_count);
    let names: Arc<Vec<String>> = Arc::new((0..KEYS).map(|i| format!("api-key-{i:08}")).collect());
    let mut out: Vec<(&'static str, Op)> = Vec::new();
    for (name, quota) in quotas(admit) {
        let plain = only.is_none_or(|o| o == name);
        let resolved = name == "token_bucket" && only.is_none_or(|o| o == RESOLVED);
        if !plain && !resolved {
            continue;
        }
        // The keys of this scenario's shape only, as governor's limiter holds.
        let limiter = tollgate(name, quota);
        for k in 0..key_count {
            if strings {
                now_or_never(limiter.check(name, &names[k], 1)).unwrap();
            } else {
                now_or_never(limiter.check(name, (k as u64).to_le_bytes(), 1)).unwrap();
            }
        }
        if resolved {
            out.push((RESOLVED, resolved_op(&limiter, name, strings, &names, pick)));
        }
        if !plain {
            continue;
        }
        let op: Op = if strings {
            let names = Arc::clone(&names);
            Box::new(move |t, i| {
                let d = now_or_never(limiter.check(name, &names[pick(t, i)], 1));
                black_box(d.map(|d| d.allowed).unwrap_or(false));
            })
        } else {
            Box::new(move |t, i| {
                let key = (pick(t, i) as u64).to_le_bytes();
                let d = now_or_never(limiter.check(name, key, 1));
                black_box(d.map(|d| d.allowed).unwrap_or(false));
            })
        };
        out.push((name, op));
    }
    if only.is_some_and(|o| o != "governor") {
        return out;
    }
    if strings {
        let gov: RateLimiter<String, _, _> = RateLimiter::keyed(governor_quota(admit));
        for k in 0..key_count {
            let _ = gov.check_key(&names[k]);
        }
        let names = Arc::clone(&names);
        out.push((
            "governor",
            Box::new(move |t, i| {
                black_box(gov.check_key(&names[pick(t, i)]).is_ok());
            }),
        ));
    } else {
        let gov: RateLimiter<u64, _, _> = RateLimiter::keyed(governor_quota(admit));
        for k in 0..key_count {
            let _ = gov.check_key(&(k as u64));
        }
        out.push((
            "governor",
            Box::new(move |t, i| {
                black_box(gov.check_key(&(pick(t, i) as u64)).is_ok());
            }),
        ));
    }
    out
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Each contender's median ns per decision over interleaved rounds, with its ratio to
/// governor (governor's time / this time: above 1 is faster than governor).
fn interleaved(rounds: usize, per_round: u64, key_counts: &[usize]) {
    println!(
        "interleaved: median ns per decision over {rounds} rounds of {per_round} per thread; \
         ratio = governor's time / this time; cpu = CPU time of the threads per decision"
    );
    println!(
        "{:<8}{:<10}{:<4}{:<7}{:<24}{:>9}{:>9}{:>8}{:>9}{:>8}",
        "keys", "shape", "thr", "mode", "contender", "ns", "M/s", "ratio", "cpu-ns", "cpu-r"
    );
    for strings in [true, false] {
        for admit in [true, false] {
            for &key_count in key_counts {
                for threads in [1, 2] {
                    let only = std::env::var("TOLLGATE_BENCH_ONLY").ok();
                    let contenders = contenders(key_count, admit, strings, None)
                        .into_iter()
                        .filter(|(name, _)| {
                            *name == "governor"
                                || only.as_deref().is_none_or(|o| name.starts_with(o))
                        })
                        .collect::<Vec<_>>();
                    let mut wall: Vec<Vec<f64>> = vec![Vec::new(); contenders.len()];
                    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); contenders.len()];
                    let ops = (per_round * threads as u64) as f64;
                    for _ in 0..rounds {
                        for (c, (_, op)) in contenders.iter().enumerate() {
                            let timing = timed(threads, per_round, op.as_ref());
                            wall[c].push(timing.wall.as_nanos() as f64 / ops);
                            cpu[c].push(timing.cpu.as_nanos() as f64 / ops);
                        }
                    }
                    let (wall, cpu) = (medians(wall), medians(cpu));
                    let (governor_ns, governor_cpu) = (wall[wall.len() - 1], cpu[cpu.len() - 1]);
                    for (((name, _), ns), cpu_ns) in contenders.iter().zip(&wall).zip(&cpu) {
                        println!(
                            "{:<8}{:<10}{:<4}{:<7}{:<24}{ns:>9.1}{:>9.2}{:>8.2}{cpu_ns:>9.1}{:>8.2}",
                            if key_count == 1 { "1" } else { "100k" },
                            if strings { "String" } else { "u64" },
                            threads,
                            if admit { "admit" } else { "deny" },
                            name,
                            1e3 / ns * threads as f64,
                            governor_ns / ns,
                            governor_cpu / cpu_ns
                        );
                    }
                }
            }
        }
    }
}

/// The median of each contender's samples.
fn medians(samples: Vec<Vec<f64>>) -> Vec<f64> {
    samples
        .into_iter()
        .map(|mut s| {
            s.sort_by(f64::total_cmp);
            s[s.len() / 2]
        })
        .collect()
}

/// Criterion on the hot key, one thread, String keys: the token bucket and governor.
fn criterion_hot_key() {
    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("check/1t/hot/String/admit");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(2));
    for (name, op) in contenders(1, true, true, None) {
        if name == "token_bucket" || name == "governor" {
            group.bench_function(name, |b| {
                b.iter_custom(|iters| timed(1, iters, op.as_ref()).wall)
            });
        }
    }
    group.finish();
    c.final_summary();
}

/// Runs one contender of one scenario on one thread, for a profiler: `TOLLGATE_BENCH_PROFILE=
/// "100k,String,admit,token_bucket"`, then `valgrind --tool=callgrind --collect-atstart=no
/// --toggle-collect='*profiled_loop*'` gives instructions per decision (divide by the count).
/// `TOLLGATE_BENCH_THREADS=2` runs it on two threads at once (for `perf`, on contention).
fn profile(spec: &str) {
    let parts: Vec<&str> = spec.split(',').collect();
    let [keys, shape, mode, name] = parts[..] else {
        panic!("TOLLGATE_BENCH_PROFILE=KEYS,SHAPE,MODE,CONTENDER (100k,String,admit,token_bucket)");
    };
    let key_count = if keys == "1" { 1 } else { KEYS };
    let ops = env("TOLLGATE_BENCH_OPS", 1_000_000);
    for (contender, op) in contenders(key_count, mode == "admit", shape == "String", Some(name)) {
        if contender == name {
            let threads = env("TOLLGATE_BENCH_THREADS", 1) as usize;
            let timing = timed(threads, 1, &|t, _| profiled_loop(t, op.as_ref(), ops));
            let all = (ops * threads as u64) as f64;
            let ns = timing.wall.as_nanos() as f64 / all;
            let cpu = timing.cpu.as_nanos() as f64 / all;
            println!(
                "{ops} decisions of {spec} on each of {threads} threads: {ns:.1} ns each \
                 ({cpu:.1} ns on the CPU)"
            );
        }
    }
}

#[inline(never)]
fn profiled_loop(thread: usize, op: &(dyn Fn(usize, u64) + Sync), ops: u64) {
    for i in 0..ops {
        op(thread, i);
    }
}

fn main() {
    if let Ok(spec) = std::env::var("TOLLGATE_BENCH_PROFILE") {
        profile(&spec);
        return;
    }
    let args: Vec<String> = std::env::args().collect();
    // `cargo test --benches` runs this binary without `--bench`: keep that a quick smoke test.
    if !args.iter().any(|a| a == "--bench") {
        interleaved(1, 100, &[1]);
        return;
    }
    if args.iter().any(|a| a == "--criterion") {
        criterion_hot_key();
    }
    interleaved(
        env("TOLLGATE_BENCH_ROUNDS", 11) as usize,
        env("TOLLGATE_BENCH_OPS", 100_000),
        &[KEYS, 1],
    );
}
