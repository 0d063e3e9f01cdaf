//! Throughput and latency of [`RedisStore`] against one Redis: `concurrency` callers deciding
//! single checks on random keys for `seconds`. `scripts/bench-redis.sh` runs it side by side
//! with `redis-benchmark` sending the raw EVALSHA of the same script.
//!
//! ```text
//! cargo run --release -p tollgate-redis --example bench_redis -- \
//!     --url redis://127.0.0.1:6379 --concurrency 50 --seconds 10 [--print-evalsha]
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use tollgate::{Check, Policy, Quota, Store, Timestamp};
use tollgate_redis::{RedisConfig, RedisStore};

const KEYS: u64 = 10_000;

struct Args {
    url: String,
    concurrency: usize,
    seconds: u64,
    print_evalsha: bool,
}

fn args() -> Result<Args, String> {
    let mut out = Args {
        url: "redis://127.0.0.1:6379".to_owned(),
        concurrency: 50,
        seconds: 10,
        print_evalsha: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--url" => out.url = value()?,
            "--concurrency" => out.concurrency = value()?.parse().map_err(|e| format!("{e}"))?,
            "--seconds" => out.seconds = value()?.parse().map_err(|e| format!("{e}"))?,
            "--print-evalsha" => out.print_evalsha = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(out)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args()?;
    // The recommended default algorithm, with room enough that every request is admitted (a
    // denial would be answered by the deny cache and flatter the numbers).
    let policy = Policy::new(
        "bench",
        Quota::sliding_window_counter(1_000_000, Duration::from_secs(1))?,
    )?;
    let mut config = RedisConfig::standalone(&args.url);
    config.timeout = Duration::from_secs(1);
    let store = RedisStore::new(config).await?;
    if !store.is_ready() {
        return Err(format!("Redis at {} does not answer", args.url).into());
    }
    if args.print_evalsha {
        // The same script call the store makes for key "0", for redis-benchmark: the key's
        // hash tag is replaced by __rand_int__ so it spreads over keys like the store does.
        let cmd = store.script_command(&Check::new(&policy, b"0", 1))?;
        println!("{}", cmd.join(" "));
        return Ok(());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..args.concurrency {
        let (store, policy, stop) = (store.clone(), policy.clone(), stop.clone());
        tasks.spawn(async move {
            let mut latencies = Vec::with_capacity(100_000);
            let mut x = 0x9e37_79b9_7f4a_7c15_u64 ^ (t as u64);
            let mut denied = 0u64;
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let key = (x % KEYS).to_string();
                let now = Timestamp::from_system_time(SystemTime::now());
                let started = Instant::now();
                let d = store
                    .apply(now, &[Check::new(&policy, key.as_bytes(), 1)])
                    .await;
                latencies.push(started.elapsed());
                if !d.map(|d| d.allowed()).unwrap_or(false) {
                    denied += 1;
                }
            }
            (latencies, denied)
        });
    }
    // Warm up, then measure a fixed interval.
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
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
    println!(
        "store: {} decisions in {}s = {:.0} decisions/s, p50 {:.3} ms, p99 {:.3} ms, \
         not admitted {denied}, fallbacks {}, errors {}",
        all.len(),
        args.seconds,
        all.len() as f64 / args.seconds as f64,
        percentile(&all, 0.50).as_secs_f64() * 1e3,
        percentile(&all, 0.99).as_secs_f64() * 1e3,
        stats.fallbacks,
        stats.errors,
    );
    Ok(())
}
