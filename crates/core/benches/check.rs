//! `check()` throughput of the in-memory store for every algorithm, next to the `governor`
//! crate's keyed limiter on the same workload in the same run.
//!
//! Scenarios: 100,000 keys visited in order (key 0, 1, 2, ... 99,999, 0, 1, ...) or scattered
//! (a fixed pseudo-random sequence), or one hot key; one thread or two (the second thread half
//! the key space ahead); keys as `String` API keys (what a server has) or as `u64` (governor's
//! cheapest key type; Tollgate gets its eight bytes). Three modes:
//!
//! - `admit`: a quota no run reaches, whose state outlives the run (a token consumed takes a
//!   minute to come back, windows last a minute);
//! - `renew`: every decision admitted, and each key's quota has fully come back before its next
//!   visit (a bucket refilled at 1,000 a second, 100,000 keys apart): what a per-second quota
//!   sees over many keys. A store may forget such a key between two visits; governor never
//!   forgets one by itself. Buckets only (a window that short would not be a window), and not
//!   on the hot key (its state never resets);
//! - `deny`: a quota of one, spent before the run.
//!
//! Tollgate's side calls `Limiter::check` — policy lookup by name, one clock read, the store
//! step — and polls its future once (the memory store never waits), as an embedding
//! application does.
//!
//! The contenders run *interleaved*: in each of several rounds every contender runs a short
//! burst, and each one's median is kept. This machine is shared and noisy; interleaving makes
//! background load hit every contender alike, so the ratios to governor are the figures to
//! trust: in each round, governor's time over the contender's (they ran side by side), and
//! the median and middle half of those ratios over the rounds. Each round starts with the next
//! contender, and each contender has a store of its own.
//! `--criterion` also runs criterion on the hot-key token bucket and governor.
//!
//! `cargo bench -p tollgate --bench check` (or `scripts/bench-core.sh`, which also measures
//! bytes per key). `TOLLGATE_BENCH_ROUNDS` (default 11) and `TOLLGATE_BENCH_OPS` (per burst
//! and thread, default 100,000) set the length; `TOLLGATE_BENCH_ONLY=token_bucket` runs one
//! algorithm (and governor); `TOLLGATE_BENCH_KEYS=seq,rnd`, `TOLLGATE_BENCH_MODES=renew` and
//! `TOLLGATE_BENCH_SHAPES=u64` pick scenarios. `token_bucket_resolved` is the token bucket through
//! `Limiter::check_policy`, with the policy resolved once instead of looked up by name, and
//! `token_bucket_now` through `Limiter::check_now`, synchronous as governor's `check_key` is.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use governor::{Quota as GovQuota, RateLimiter};
use tollgate::{Limiter, MemoryStore, Policy, Quota, SystemClock};

mod common;
use common::{env, now_or_never, summary};

const KEYS: usize = 100_000;

/// Which keys a scenario visits.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keys {
    /// Key 0, 1, 2, ... 99,999, 0, 1, ...
    InOrder,
    /// A fixed pseudo-random sequence over the 100,000 keys.
    Scattered,
    /// Key 0 only.
    Hot,
}

impl Keys {
    const ALL: [Keys; 3] = [Keys::InOrder, Keys::Scattered, Keys::Hot];

    fn label(self) -> &'static str {
        match self {
            Keys::InOrder => "seq",
            Keys::Scattered => "rnd",
            Keys::Hot => "hot",
        }
    }

    fn parse(label: &str) -> Keys {
        Keys::ALL
            .into_iter()
            .find(|k| k.label() == label)
            .unwrap_or_else(|| panic!("keys are seq, rnd or hot, not {label}"))
    }

    fn count(self) -> usize {
        if self == Keys::Hot { 1 } else { KEYS }
    }
}

/// What every decision of a scenario comes to (see the module's documentation).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Admit,
    Renew,
    Deny,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Admit, Mode::Renew, Mode::Deny];

    fn label(self) -> &'static str {
        match self {
            Mode::Admit => "admit",
            Mode::Renew => "renew",
            Mode::Deny => "deny",
        }
    }

    fn parse(label: &str) -> Mode {
        Mode::ALL
            .into_iter()
            .find(|m| m.label() == label)
            .unwrap_or_else(|| panic!("modes are admit, renew or deny, not {label}"))
    }
}

/// The algorithms and their quota in `mode`. `admit`: a quota no run reaches, and every key's
/// state stays alive through the run (a consumed token takes a minute to come back, windows
/// last a minute), as a key in use does. `renew`: the buckets at 1,000 a second, so a key's
/// quota has come back long before 100,000 other decisions have passed. `deny`: one an hour.
/// The log's window is a second, which bounds what a hot key's log holds.
fn quotas(mode: Mode) -> Vec<(&'static str, Quota)> {
    let (limit, window) = match mode {
        Mode::Admit | Mode::Renew => (u32::MAX, Duration::from_secs(60)),
        Mode::Deny => (1, Duration::from_secs(3600)),
    };
    let rate = match mode {
        Mode::Admit => "1/m",
        Mode::Renew => "1000/s",
        Mode::Deny => "1/h",
    }
    .parse()
    .unwrap();
    let burst = if mode == Mode::Deny { 1 } else { 50_000_000 };
    let buckets = vec![
        ("token_bucket", Quota::token_bucket(burst, rate).unwrap()),
        (
            "leaky_bucket",
            Quota::leaky_bucket(rate, burst - 1).unwrap(),
        ),
    ];
    if mode == Mode::Renew {
        return buckets;
    }
    let mut all = vec![
        ("fixed_window", Quota::fixed_window(limit, window).unwrap()),
        (
            "sliding_window_log",
            Quota::sliding_window_log(limit, window.min(Duration::from_secs(1))).unwrap(),
        ),
        (
            "sliding_window_counter",
            Quota::sliding_window_counter(limit, window).unwrap(),
        ),
    ];
    all.extend(buckets);
    all
}

type Tollgate = Limiter<MemoryStore, SystemClock>;

fn tollgate(name: &str, quota: Quota) -> Tollgate {
    Limiter::builder()
        .store(MemoryStore::builder().max_keys(4 * KEYS).build())
        .policy(Policy::new(name, quota).unwrap())
        .build()
        .unwrap()
}

fn governor_quota(mode: Mode) -> GovQuota {
    let burst = NonZeroU32::new(50_000_000).unwrap();
    match mode {
        Mode::Admit => GovQuota::per_minute(NonZeroU32::new(1).unwrap()).allow_burst(burst),
        Mode::Renew => GovQuota::per_second(NonZeroU32::new(1000).unwrap()).allow_burst(burst),
        Mode::Deny => GovQuota::per_hour(NonZeroU32::new(1).unwrap()),
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

/// Which key operation `i` of thread `t` uses. In order: the thread's own start (the second
/// thread half the key space ahead), then the next key each time. Scattered: a multiplicative
/// hash of the operation's number scaled to the key count, a few instructions that neither
/// contender's caches can predict. Both contenders pay the same for it.
fn picker(keys: Keys) -> impl Fn(usize, u64) -> usize + Copy + Send + Sync {
    move |t, i| match keys {
        Keys::Hot => 0,
        Keys::InOrder => (i as usize + t * (KEYS / 2)) % KEYS,
        Keys::Scattered => {
            let mixed = (i ^ (t as u64) << 40).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            ((u128::from(mixed >> 32) * KEYS as u128) >> 32) as usize
        }
    }
}

type Op = Box<dyn Fn(usize, u64) + Sync>;

/// The token bucket through `Limiter::check_policy`, its policy resolved once: what the name
/// lookup of `check` costs.
const RESOLVED: &str = "token_bucket_resolved";

/// The token bucket through `Limiter::check_now`: the same check with no future to poll.
const SYNC: &str = "token_bucket_now";

fn sync_op(
    limiter: Tollgate,
    name: &'static str,
    strings: bool,
    names: &Arc<Vec<String>>,
    pick: impl Fn(usize, u64) -> usize + Copy + Send + Sync + 'static,
) -> Op {
    if strings {
        let names = Arc::clone(names);
        Box::new(move |t, i| {
            let d = limiter.check_now(name, &names[pick(t, i)], 1);
            black_box(d.map(|d| d.allowed).unwrap_or(false));
        })
    } else {
        Box::new(move |t, i| {
            let key = (pick(t, i) as u64).to_le_bytes();
            let d = limiter.check_now(name, key, 1);
            black_box(d.map(|d| d.allowed).unwrap_or(false));
        })
    }
}

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
    keys: Keys,
    mode: Mode,
    strings: bool,
    only: Option<&str>,
) -> Vec<(&'static str, Op)> {
    let pick = picker(keys);
    let key_count = keys.count();
    let names: Arc<Vec<String>> = Arc::new((0..KEYS).map(|i| format!("api-key-{i:08}")).collect());
    let mut out: Vec<(&'static str, Op)> = Vec::new();
    for (name, quota) in quotas(mode) {
        let plain = only.is_none_or(|o| o == name);
        let resolved = name == "token_bucket" && only.is_none_or(|o| o == RESOLVED);
        let sync = name == "token_bucket" && only.is_none_or(|o| o == SYNC);
        if !plain && !resolved && !sync {
            continue;
        }
        // Each contender its own store (one shared by two would find its data in cache after
        // the other's burst), with the keys of this scenario's shape only, as governor's
        // limiter holds.
        let seeded = || {
            let limiter = tollgate(name, quota.clone());
            for k in 0..key_count {
                if strings {
                    now_or_never(limiter.check(name, &names[k], 1)).unwrap();
                } else {
                    now_or_never(limiter.check(name, (k as u64).to_le_bytes(), 1)).unwrap();
                }
            }
            limiter
        };
        if resolved {
            out.push((
                RESOLVED,
                resolved_op(&seeded(), name, strings, &names, pick),
            ));
        }
        if sync {
            out.push((SYNC, sync_op(seeded(), name, strings, &names, pick)));
        }
        if !plain {
            continue;
        }
        let limiter = seeded();
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
        let gov: RateLimiter<String, _, _> = RateLimiter::keyed(governor_quota(mode));
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
        let gov: RateLimiter<u64, _, _> = RateLimiter::keyed(governor_quota(mode));
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

/// Each contender's median ns per decision over interleaved rounds, with its ratio to
/// governor (governor's time / this time: above 1 is faster than governor) and the middle half
/// of the per-round ratios.
fn interleaved(rounds: usize, per_round: u64, keys: &[Keys]) {
    println!(
        "interleaved: median ns per decision over {rounds} rounds of {per_round} per thread; \
         ratio = median over the rounds of governor's time / this one's; lo-hi = middle half \
         of those ratios; cpu = CPU time of the threads per decision"
    );
    println!(
        "{:<6}{:<8}{:<4}{:<7}{:<24}{:>8}{:>8}{:>7}{:>6}{:>6}{:>8}{:>7}{:>6}{:>6}",
        "keys",
        "shape",
        "thr",
        "mode",
        "contender",
        "ns",
        "M/s",
        "ratio",
        "lo",
        "hi",
        "cpu-ns",
        "cpu-r",
        "lo",
        "hi"
    );
    let only = std::env::var("TOLLGATE_BENCH_ONLY").ok();
    let picked = |var: &str, label: &str| {
        std::env::var(var)
            .map(|list| list.split(',').any(|l| l == label))
            .unwrap_or(true)
    };
    for strings in [true, false] {
        if !picked(
            "TOLLGATE_BENCH_SHAPES",
            if strings { "String" } else { "u64" },
        ) {
            continue;
        }
        for mode in Mode::ALL {
            for &keys in keys {
                if keys == Keys::Hot && mode == Mode::Renew
                    || !picked("TOLLGATE_BENCH_MODES", mode.label())
                    || !picked("TOLLGATE_BENCH_KEYS", keys.label())
                {
                    continue;
                }
                for threads in [1, 2] {
                    let contenders = contenders(keys, mode, strings, None)
                        .into_iter()
                        .filter(|(name, _)| {
                            *name == "governor"
                                || only.as_deref().is_none_or(|o| name.starts_with(o))
                        })
                        .collect::<Vec<_>>();
                    let mut wall: Vec<Vec<f64>> = vec![Vec::new(); contenders.len()];
                    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); contenders.len()];
                    let ops = (per_round * threads as u64) as f64;
                    // Each round starts with the next contender, so none always follows the
                    // same one (whose data has just evicted its own from the caches).
                    let n = contenders.len();
                    for round in 0..rounds {
                        for c in (0..n).map(|c| (c + round) % n) {
                            let timing = timed(threads, per_round, contenders[c].1.as_ref());
                            wall[c].push(timing.wall.as_nanos() as f64 / ops);
                            cpu[c].push(timing.cpu.as_nanos() as f64 / ops);
                        }
                    }
                    let governor = contenders.len() - 1;
                    for (c, (name, _)) in contenders.iter().enumerate() {
                        let (ns, ratio, lo, hi) = summary(&wall[c], &wall[governor]);
                        let (cpu_ns, cpu_ratio, cpu_lo, cpu_hi) = summary(&cpu[c], &cpu[governor]);
                        println!(
                            "{:<6}{:<8}{:<4}{:<7}{:<24}{ns:>8.1}{:>8.2}{ratio:>7.2}{lo:>6.2}\
                             {hi:>6.2}{cpu_ns:>8.1}{cpu_ratio:>7.2}{cpu_lo:>6.2}{cpu_hi:>6.2}",
                            keys.label(),
                            if strings { "String" } else { "u64" },
                            threads,
                            mode.label(),
                            name,
                            1e3 / ns * threads as f64,
                        );
                    }
                }
            }
        }
    }
}

/// Criterion on the hot key, one thread, String keys: the token bucket and governor.
fn criterion_hot_key() {
    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("check/1t/hot/String/admit");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(2));
    for (name, op) in contenders(Keys::Hot, Mode::Admit, true, None) {
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
/// "seq,String,admit,token_bucket"` (keys seq, rnd or hot; mode admit, renew or deny), then
/// `valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*profiled_loop*'` gives
/// instructions per decision (divide by the count). `TOLLGATE_BENCH_THREADS=2` runs it on two
/// threads at once (for `perf`, on contention).
fn profile(spec: &str) {
    let parts: Vec<&str> = spec.split(',').collect();
    let [keys, shape, mode, name] = parts[..] else {
        panic!("TOLLGATE_BENCH_PROFILE=KEYS,SHAPE,MODE,CONTENDER (seq,String,admit,token_bucket)");
    };
    let (keys, mode) = (Keys::parse(keys), Mode::parse(mode));
    let ops = env("TOLLGATE_BENCH_OPS", 1_000_000);
    for (contender, op) in contenders(keys, mode, shape == "String", Some(name)) {
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
        interleaved(1, 100, &[Keys::Hot]);
        return;
    }
    if args.iter().any(|a| a == "--criterion") {
        criterion_hot_key();
    }
    interleaved(
        env("TOLLGATE_BENCH_ROUNDS", 11) as usize,
        env("TOLLGATE_BENCH_OPS", 100_000),
        &Keys::ALL,
    );
}
