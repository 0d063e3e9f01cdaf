//! Throughput of `ShouldRateLimit` over loopback: a server with the memory store and
//! `--concurrency` client tasks over `--connections` HTTP/2 connections, for `--seconds`.
//!
//! ```text
//! cargo run --release -p tollgate-envoy --example bench -- --seconds 5 --connections 4 --concurrency 64
//! cargo run --release -p tollgate-envoy --example bench -- --split   # server in a child process
//! cargo run --release -p tollgate-envoy --example bench -- --redis redis://127.0.0.1:6379
//! ```
//!
//! By default client and server share this process. With `--split` the server runs in a child
//! process (this same program with `--serve`), so its own CPU time is measured: calls per
//! server CPU-second is what one core of a server machine would sustain.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate::Limiter;
use tollgate_envoy::proto::envoy::common_ratelimit_v3::RateLimitDescriptor;
use tollgate_envoy::proto::envoy::common_ratelimit_v3::rate_limit_descriptor::Entry;
use tollgate_envoy::proto::envoy::service_ratelimit_v3::RateLimitRequest;
use tollgate_envoy::{Config, Descriptor, Domain, RateLimit, RlsClient, RlsService, Unit, serve};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct Args {
    seconds: u64,
    connections: usize,
    concurrency: usize,
    keys: usize,
    descriptors: usize,
    split: bool,
    serve: bool,
    redis: Option<String>,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        seconds: 5,
        connections: 4,
        concurrency: 64,
        keys: 10_000,
        descriptors: 1,
        split: false,
        serve: false,
        redis: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--split" => {
                a.split = true;
                continue;
            }
            "--serve" => {
                a.serve = true;
                continue;
            }
            _ => {}
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        if flag == "--redis" {
            a.redis = Some(value);
            continue;
        }
        let n: u64 = value.parse().map_err(|_| format!("{flag}: not a number"))?;
        let n_usize = usize::try_from(n).map_err(|_| format!("{flag}: too large"))?;
        match flag.as_str() {
            "--seconds" => a.seconds = n,
            "--connections" => a.connections = n_usize.max(1),
            "--concurrency" => a.concurrency = n_usize.max(1),
            "--keys" => a.keys = n_usize.max(1),
            "--descriptors" => a.descriptors = n_usize.clamp(1, 2),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(a)
}

fn request(key: &str, descriptors: usize) -> RateLimitRequest {
    let mut d = vec![RateLimitDescriptor {
        entries: vec![Entry {
            key: "api_key".into(),
            value: key.into(),
        }],
        limit: None,
        hits_addend: None,
    }];
    if descriptors > 1 {
        d.push(RateLimitDescriptor {
            entries: vec![
                Entry {
                    key: "generic_key".into(),
                    value: "global".into(),
                },
                Entry {
                    key: "remote_address".into(),
                    value: key.into(),
                },
            ],
            limit: None,
            hits_addend: None,
        });
    }
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: d,
        hits_addend: 1,
    }
}

fn service<S: tollgate::Store>(store: S) -> Result<RlsService<S, tollgate::SystemClock>, BoxError> {
    let config = Config::new().domain(
        Domain::new("bench")
            .descriptor(
                Descriptor::new("api_key").rate_limit(RateLimit::per(1_000_000, Unit::Second)),
            )
            .descriptor(
                Descriptor::new("generic_key").value("global").descriptor(
                    Descriptor::new("remote_address")
                        .rate_limit(RateLimit::per(1_000_000, Unit::Second)),
                ),
            ),
    );
    Ok(RlsService::new(
        Limiter::builder().store(store).build()?,
        &config,
    )?)
}

/// Serves with the memory store, or Redis at `redis` (Redis clock, default settings).
async fn serve_with(
    a: &Args,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), BoxError> {
    match &a.redis {
        None => {
            serve(
                listener,
                service(tollgate::MemoryStore::default())?,
                shutdown,
            )
            .await?
        }
        Some(url) => {
            let store = tollgate_redis::RedisStore::new(tollgate_redis::RedisConfig::standalone(
                url.as_str(),
            ))
            .await?;
            serve(listener, service(store)?, shutdown).await?;
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let a = args()?;
    if a.serve {
        return serve_until_stdin_closes(&a).await;
    }
    if a.split {
        let mut child = Command::new(std::env::current_exe()?)
            .arg("--serve")
            .args(a.redis.iter().flat_map(|url| ["--redis", url.as_str()]))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let mut out = BufReader::new(child.stdout.take().ok_or("no child stdout")?);
        let mut line = String::new();
        out.read_line(&mut line)?;
        let addr = line.trim().to_owned();
        let (total, _) = drive(&a, &addr).await?;
        // Closing its stdin stops the server, which reports its CPU time.
        drop(child.stdin.take());
        line.clear();
        out.read_line(&mut line)?;
        child.wait()?;
        let cpu: f64 = line.trim().parse()?;
        #[allow(clippy::cast_precision_loss)]
        let per_cpu = total as f64 / cpu;
        println!(
            "server process: {total} calls (warm-up included) in {cpu:.2} s of its CPU = \
             {per_cpu:.0} calls per server CPU-second"
        );
        return Ok(());
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = serve_with(&a, listener, async {
        let _ = stop_rx.await;
    });
    let client = async {
        let result = drive(&a, &addr).await;
        let _ = stop_tx.send(());
        result
    };
    let (served, driven) = tokio::join!(server, client);
    served?;
    driven?;
    Ok(())
}

/// `--serve`: prints the address, serves until stdin closes, then prints its CPU seconds.
async fn serve_until_stdin_closes(a: &Args) -> Result<(), BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("{}", listener.local_addr()?);
    std::io::stdout().flush()?;
    let stdin_closed = tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
    });
    serve_with(a, listener, async {
        let _ = stdin_closed.await;
    })
    .await?;
    println!("{}", cpu_seconds().unwrap_or(0.0));
    Ok(())
}

/// Runs the clients against `addr`; returns (calls in all, calls in the measured window).
async fn drive(a: &Args, addr: &str) -> Result<(u64, u64), BoxError> {
    let mut clients = Vec::with_capacity(a.connections);
    for _ in 0..a.connections {
        clients.push(RlsClient::connect(format!("http://{addr}")).await?);
    }
    let keys: Arc<Vec<String>> = Arc::new((0..a.keys).map(|i| format!("key-{i}")).collect());
    let done = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let all = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let over = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(a.concurrency);
    for t in 0..a.concurrency {
        let mut client = clients[t % clients.len()].clone();
        let (keys, done, measuring, all, calls, errors, over) = (
            keys.clone(),
            done.clone(),
            measuring.clone(),
            all.clone(),
            calls.clone(),
            errors.clone(),
            over.clone(),
        );
        let descriptors = a.descriptors;
        tasks.push(tokio::spawn(async move {
            let mut i = t;
            let mut latencies: Vec<u32> = Vec::new();
            while !done.load(Ordering::Relaxed) {
                let key = &keys[i % keys.len()];
                i = i.wrapping_add(7919);
                let sent = Instant::now();
                let result = client.should_rate_limit(request(key, descriptors)).await;
                let took = u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX);
                all.fetch_add(1, Ordering::Relaxed);
                if measuring.load(Ordering::Relaxed) {
                    latencies.push(took);
                    match result {
                        Ok(r) if r.overall_code == 1 => {}
                        Ok(_) => {
                            over.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    calls.fetch_add(1, Ordering::Relaxed);
                }
            }
            latencies
        }));
    }
    // Warm up, then measure.
    tokio::time::sleep(Duration::from_millis(500)).await;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    let cpu_start = cpu_seconds();
    tokio::time::sleep(Duration::from_secs(a.seconds)).await;
    let n = calls.load(Ordering::Relaxed);
    let elapsed = started.elapsed();
    let cpu = cpu_seconds().zip(cpu_start).map(|(end, start)| end - start);
    done.store(true, Ordering::Relaxed);
    let mut latencies = Vec::new();
    for t in tasks {
        if let Ok(l) = t.await {
            latencies.extend(l);
        }
    }
    latencies.sort_unstable();
    let pct = |p: usize| {
        latencies
            .get((latencies.len() * p / 100).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    #[allow(clippy::cast_precision_loss)]
    let rate = n as f64 / elapsed.as_secs_f64();
    println!(
        "ShouldRateLimit ({} store, {} descriptor(s)/call): {n} calls in {:.2} s = {rate:.0} \
         calls/s ({} connections, {} concurrent calls, {} keys; {} over limit, {} errors)",
        if a.redis.is_some() { "redis" } else { "memory" },
        a.descriptors,
        elapsed.as_secs_f64(),
        a.connections,
        a.concurrency,
        a.keys,
        over.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
    );
    println!(
        "latency per call (µs, client side, under this load): p50 {} p90 {} p99 {} max {}",
        pct(50),
        pct(90),
        pct(99),
        latencies.last().copied().unwrap_or(0)
    );
    if let Some(cpu) = cpu.filter(|c| *c > 0.0) {
        #[allow(clippy::cast_precision_loss)]
        let per_cpu = n as f64 / cpu;
        let who = if a.split {
            "client process"
        } else {
            "process (client and server together)"
        };
        println!(
            "{who}: {cpu:.2} s CPU in {:.2} s wall ({:.0}% of one core) = {per_cpu:.0} calls per \
             CPU-second",
            elapsed.as_secs_f64(),
            100.0 * cpu / elapsed.as_secs_f64(),
        );
    }
    Ok((all.load(Ordering::Relaxed), n))
}

/// User + system CPU time of this process (Linux `/proc/self/stat`, 100 ticks a second).
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}
