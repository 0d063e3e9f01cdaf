//! Throughput of [`RedisStore`] against one Redis.
//!
//! Spread keys (the default): `concurrency` callers decide single checks of one algorithm on
//! 10,000 random keys; the quota is large enough that nothing is denied (a denial would be
//! answered by the deny cache and flatter the numbers). `scripts/bench-redis.sh` runs it per
//! algorithm next to `redis-benchmark` sending the store's own script call and the minimal
//! script of the same algorithm.
//!
//! The keys are formatted once, before the run: a caller takes its key from the request (a
//! header, an address) without building a string, so the bench's own per-decision work stays
//! out of the store's figures. `--decisions N` stops after N decisions instead of a time (no
//! warm-up), for counting the client's instructions per decision under callgrind: run it with
//! two values of N and divide the difference of the totals by that of N.
//!
//! Hot key (`--hot-key`): `--instances` stores (3 by default, each with its own connection,
//! lease table and deny cache: separate instances in all but the process) with `concurrency`
//! callers each decide one key of a fixed window policy whose limit the run reaches; `--lease`
//! gives the policy hot-key leases. It prints the decisions per second, how many were
//! admitted, and how many were admitted beyond the limit of their window.
//!
//! ```text
//! cargo run --release -p tollgate-redis --example bench_redis -- \
//!     --url redis://127.0.0.1:6379 --concurrency 50 --seconds 5 [--algorithm NAME]
//! cargo run --release -p tollgate-redis --example bench_redis -- \
//!     --url URL --concurrency 50 --seconds 5 --hot-key [--lease [UNITS]]
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use tollgate::{Check, Policy, Quota, Store, Timestamp};
use tollgate_redis::{RedisConfig, RedisStore};

mod hot_key;

const KEYS: u64 = 10_000;

/// Before the measured interval: connections made, scripts loaded, the runtime warm.
pub(crate) const WARM_UP: Duration = Duration::from_millis(500);

struct Args {
    url: String,
    concurrency: usize,
    seconds: u64,
    algorithm: String,
    print_command: bool,
    print_minimal_args: bool,
    hot_key: bool,
    lease: Option<u32>,
    instances: usize,
    limit: u32,
    threads: usize,
    decisions: Option<u64>,
}

fn args() -> Result<Args, String> {
    let mut out = Args {
        url: "redis://127.0.0.1:6379".to_owned(),
        concurrency: 50,
        seconds: 10,
        algorithm: "sliding_window_counter".to_owned(),
        print_command: false,
        print_minimal_args: false,
        hot_key: false,
        lease: None,
        instances: 3,
        limit: 1_000_000,
        threads: 1,
        decisions: None,
    };
    let mut it = std::env::args().skip(1).peekable();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--url" => out.url = value()?,
            "--concurrency" => out.concurrency = number(value()?)? as usize,
            "--seconds" => out.seconds = number(value()?)?,
            "--algorithm" => out.algorithm = value()?,
            "--print-command" => out.print_command = true,
            "--print-minimal-args" => out.print_minimal_args = true,
            "--hot-key" => out.hot_key = true,
            "--instances" => out.instances = number(value()?)? as usize,
            "--threads" => out.threads = number(value()?)? as usize,
            "--decisions" => out.decisions = Some(number(value()?)?),
            "--limit" => out.limit = u32::try_from(number(value()?)?).map_err(|e| e.to_string())?,
            "--lease" => {
                // An optional size: `--lease` alone takes the default.
                let size = match it.peek() {
                    Some(v) if !v.starts_with("--") => number(it.next().unwrap_or_default())?,
                    _ => 100,
                };
                out.lease = Some(u32::try_from(size).map_err(|e| e.to_string())?);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(out)
}

/// One policy per algorithm, with room enough that nothing is denied.
fn spread_policy(algorithm: &str) -> Result<Policy, Box<dyn std::error::Error>> {
    let second = Duration::from_secs(1);
    let quota = match algorithm {
        "fixed_window" => Quota::fixed_window(1_000_000, second)?,
        "sliding_window_log" => Quota::sliding_window_log(1_000_000, second)?,
        "sliding_window_counter" => Quota::sliding_window_counter(1_000_000, second)?,
        "token_bucket" => Quota::token_bucket(1_000_000, "1000000/s".parse()?)?,
        "leaky_bucket" => Quota::leaky_bucket("1000000/s".parse()?, 1_000_000)?,
        other => return Err(format!("unknown algorithm {other}").into()),
    };
    Ok(Policy::new(&format!("bench-{algorithm}"), quota)?)
}

/// The `ARGV` of `examples/minimal/<algorithm>.lua` for the same quota.
fn minimal_args(policy: &Policy) -> String {
    match policy.quota() {
        Quota::FixedWindow(a) => format!("{} {}", a.window_micros(), a.limit()),
        Quota::SlidingWindowLog(a) => format!("{} {}", a.window_micros(), a.limit()),
        Quota::SlidingWindowCounter(a) => format!("{} {}", a.window_micros(), a.limit()),
        Quota::TokenBucket(a) => format!(
            "{} {}",
            a.interval_micros(),
            u64::from(a.capacity()) * a.interval_micros()
        ),
        Quota::LeakyBucket(a) => format!(
            "{} {}",
            a.interval_micros(),
            u64::from(a.burst()) * a.interval_micros()
        ),
        // Not benchmarked: no minimal script of its own.
        Quota::Concurrency(a) => format!("{} {}", a.lease_ttl_micros(), a.limit()),
    }
}

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub(crate) async fn store(url: &str) -> Result<RedisStore, Box<dyn std::error::Error>> {
    let mut config = RedisConfig::standalone(url);
    config.timeout = Duration::from_secs(1);
    let store = RedisStore::new(config).await?;
    if !store.is_ready() {
        return Err(format!("Redis at {url} does not answer").into());
    }
    store.load_scripts().await?;
    Ok(store)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args()?;
    // The callers' runtime: `--threads 0` is a current-thread runtime, otherwise that many
    // workers. One by default: on a 2-core machine that leaves Redis the other core, as it
    // would have on a machine of its own.
    let runtime = match args.threads {
        0 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build()?,
    };
    runtime.block_on(bench(args))
}

async fn bench(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    if args.hot_key {
        return hot_key::run(
            &args.url,
            args.instances,
            args.concurrency,
            args.seconds,
            args.limit,
            args.lease,
        )
        .await;
    }
    let policy = spread_policy(&args.algorithm)?;
    if args.print_minimal_args {
        println!("{}", minimal_args(&policy));
        return Ok(());
    }
    let store = store(&args.url).await?;
    if args.print_command {
        // The store's call for key "0", for redis-benchmark: the key's hash tag is replaced
        // by __rand_int__ so it spreads over keys like the store does.
        let mut cmd = store.script_command(&Check::new(&policy, b"0", 1))?;
        let key = cmd.get_mut(3).ok_or("unexpected command")?;
        let (head, tail) = key.split_once('{').ok_or("unexpected key")?;
        let (_, rest) = tail.split_once('}').ok_or("unexpected key")?;
        *key = format!("{head}{{__rand_int__}}{rest}");
        println!("{}", cmd.join(" "));
        return Ok(());
    }
    if let Some(n) = args.decisions {
        return count_decisions(&store, &policy, args.concurrency, n).await;
    }
    let keys: Arc<[String]> = (0..KEYS).map(|k| k.to_string()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..args.concurrency {
        let (store, policy, keys) = (store.clone(), policy.clone(), keys.clone());
        let (stop, measuring) = (stop.clone(), measuring.clone());
        tasks.spawn(async move {
            let mut latencies = Vec::with_capacity(200_000);
            let mut x = 0x9e37_79b9_7f4a_7c15_u64 ^ (t as u64);
            let mut denied = 0u64;
            while !stop.load(Ordering::Relaxed) {
                tokio::task::coop::consume_budget().await;
                let key = &keys[next_key(&mut x)];
                let now = Timestamp::from_system_time(SystemTime::now());
                let started = Instant::now();
                let d = store
                    .apply(now, &[Check::new(&policy, key.as_bytes(), 1)])
                    .await;
                if measuring.load(Ordering::Relaxed) {
                    latencies.push(started.elapsed());
                    denied += u64::from(!d.map(|d| d.allowed()).unwrap_or(false));
                }
            }
            (latencies, denied)
        });
    }
    tokio::time::sleep(WARM_UP).await;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    let cpu_started = process_cpu_secs();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = process_cpu_secs()
        .zip(cpu_started)
        .map(|(end, start)| end - start);
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    let mut denied = 0;
    while let Some(r) = tasks.join_next().await {
        let (l, d) = r?;
        all.extend(l);
        denied += d;
    }
    all.sort_unstable();
    let stats = store.stats();
    // The client's CPU time per decision (this process, every thread): what a Tollgate
    // instance spends per Redis decision, which background load inflates far less than it
    // lowers decisions/s.
    let cpu_us = cpu.map_or(f64::NAN, |c| c * 1e6 / all.len().max(1) as f64);
    println!(
        "store {}: {} decisions in {elapsed:.1}s = {:.0} decisions/s, p50 {:.3} ms, p99 {:.3} ms, \
         client CPU {cpu_us:.2} us/decision, not admitted {denied}, fallbacks {}, errors {}, \
         {:.1} calls per batch",
        args.algorithm,
        all.len(),
        all.len() as f64 / elapsed,
        percentile(&all, 0.50).as_secs_f64() * 1e3,
        percentile(&all, 0.99).as_secs_f64() * 1e3,
        stats.fallbacks,
        stats.errors,
        stats.script_calls as f64 / stats.batches.max(1) as f64,
    );
    Ok(())
}

/// The next key index of a caller's xorshift sequence.
fn next_key(x: &mut u64) -> usize {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    (*x % KEYS) as usize
}

/// `--decisions N`: `concurrency` callers decide N checks in all (the spread keys, as the
/// timed run does, without its clocks and latencies), then it prints how many were admitted.
async fn count_decisions(
    store: &RedisStore,
    policy: &Policy,
    concurrency: usize,
    decisions: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let keys: Arc<[String]> = (0..KEYS).map(|k| k.to_string()).collect();
    let left = Arc::new(AtomicU64::new(decisions));
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..concurrency {
        let (store, policy, keys, left) =
            (store.clone(), policy.clone(), keys.clone(), left.clone());
        tasks.spawn(async move {
            let mut x = 0x9e37_79b9_7f4a_7c15_u64 ^ (t as u64);
            let mut admitted = 0u64;
            while left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
            {
                let key = &keys[next_key(&mut x)];
                let now = Timestamp::from_system_time(SystemTime::now());
                let d = store
                    .apply(now, &[Check::new(&policy, key.as_bytes(), 1)])
                    .await;
                admitted += u64::from(d.map(|d| d.allowed()).unwrap_or(false));
            }
            admitted
        });
    }
    let mut admitted = 0;
    while let Some(r) = tasks.join_next().await {
        admitted += r?;
    }
    let stats = store.stats();
    println!(
        "store: {decisions} decisions, admitted {admitted}, script calls {}, errors {}",
        stats.script_calls, stats.errors
    );
    Ok(())
}

/// This process's CPU time (user and system, every thread) in seconds, from `/proc/self/stat`
/// (in ticks of 1/100 s, Linux's fixed `USER_HZ`); `None` off Linux.
fn process_cpu_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split(' ');
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let utime: f64 = fields.nth(11)?.parse().ok()?;
    let stime: f64 = fields.next()?.parse().ok()?;
    Some((utime + stime) / 100.0)
}
