//! Throughput of `ShouldRateLimit` over loopback: a server with the memory store (or Redis) and
//! a load generator, for `--seconds`.
//!
//! ```text
//! cargo run --release -p tollgate-envoy --example bench -- --seconds 5 --connections 4 --concurrency 64
//! cargo run --release -p tollgate-envoy --example bench -- --split   # server in a child process
//! cargo run --release -p tollgate-envoy --example bench -- --redis redis://127.0.0.1:6379
//! cargo run --release -p tollgate-envoy --example bench -- --serve   # server only: prints its address
//! cargo run --release -p tollgate-envoy --example bench -- --h2 --addr 127.0.0.1:8081
//! cargo run --release -p tollgate-envoy --example bench -- --encode req.bin   # body for h2load -d
//! ```
//!
//! By default client (tonic, `RlsClient`) and server share this process. With `--split` the
//! server runs in a child process (this same program with `--serve`), so its own CPU time is
//! measured: calls per server CPU-second is what one core of a server machine would sustain.
//!
//! `--h2` is a lean load generator for a server at `--addr` (or, without `--addr`, a `--serve`
//! child): raw HTTP/2 over the `h2` crate on one thread, each request body encoded once per key
//! up front, no tower stack and no response decoding beyond the gRPC status and the overall
//! code, so most of the machine is left to the server. Every call whose `grpc-status` is not 0
//! (or that fails in transport) counts as a failure. `--encode FILE` writes one gRPC-framed
//! request (key `key-0`) for `h2load -d FILE` (see `scripts/bench-envoy.sh`).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate::Limiter;
use tollgate_envoy::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_envoy::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_envoy::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate_envoy::{Config, Descriptor, Domain, RateLimit, RlsClient, RlsService, Unit, serve};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct Args {
    seconds: u64,
    h2: bool,
    addr: Option<String>,
    encode: Option<String>,
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
        h2: false,
        addr: None,
        encode: None,
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
            "--h2" => {
                a.h2 = true;
                continue;
            }
            _ => {}
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--redis" => {
                a.redis = Some(value);
                continue;
            }
            "--addr" => {
                a.addr = Some(value);
                continue;
            }
            "--encode" => {
                a.encode = Some(value);
                continue;
            }
            _ => {}
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

fn main() -> Result<(), BoxError> {
    let a = args()?;
    if let Some(path) = &a.encode {
        std::fs::write(path, grpc_frame(&request("key-0", a.descriptors)))?;
        return Ok(());
    }
    if a.h2 {
        // One thread: the load generator takes at most one core, the server the rest.
        return tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(h2_main(&a));
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(async_main(a))
}

async fn async_main(a: Args) -> Result<(), BoxError> {
    if a.serve {
        return serve_until_stdin_closes(&a).await;
    }
    if a.split {
        let server = ServerChild::spawn(&a)?;
        let (total, _) = drive(&a, &server.addr).await?;
        server.finish(total)?;
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

/// A `--serve` child process: its address, and its CPU time once stopped.
struct ServerChild {
    child: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
    addr: String,
}

impl ServerChild {
    fn spawn(a: &Args) -> Result<Self, BoxError> {
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
        Ok(ServerChild { child, out, addr })
    }

    /// Stops the server (closing its stdin) and prints calls per server CPU-second.
    fn finish(mut self, total: u64) -> Result<(), BoxError> {
        drop(self.child.stdin.take());
        let mut line = String::new();
        self.out.read_line(&mut line)?;
        self.child.wait()?;
        let cpu: f64 = line.trim().parse()?;
        #[allow(clippy::cast_precision_loss)]
        let per_cpu = total as f64 / cpu;
        println!(
            "server process: {total} calls (warm-up included) in {cpu:.2} s of its CPU = \
             {per_cpu:.0} calls per server CPU-second"
        );
        Ok(())
    }
}

/// `message` as one gRPC message: uncompressed flag, 4-byte big-endian length, the protobuf.
fn grpc_frame(message: &RateLimitRequest) -> Vec<u8> {
    use prost::Message as _;
    let body = message.encode_to_vec();
    let mut framed = Vec::with_capacity(body.len() + 5);
    framed.push(0);
    framed.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_be_bytes());
    framed.extend_from_slice(&body);
    framed
}

/// What one `--h2` call saw.
enum Outcome {
    /// `grpc-status: 0` with this `overall_code`.
    Answered(u64),
    /// A gRPC error status, a non-200 answer or a transport error.
    Failed,
}

/// `--h2`: the lean load generator, against `--addr` or a `--serve` child.
async fn h2_main(a: &Args) -> Result<(), BoxError> {
    let server = match &a.addr {
        Some(_) => None,
        None => Some(ServerChild::spawn(a)?),
    };
    let addr = match (&a.addr, &server) {
        (Some(addr), _) => addr.clone(),
        (None, Some(s)) => s.addr.clone(),
        (None, None) => return Err("no server address".into()),
    };
    let total = drive_h2(a, &addr).await?;
    if let Some(server) = server {
        server.finish(total)?;
    }
    Ok(())
}

/// Runs `--concurrency` call loops over `--connections` raw HTTP/2 connections to `addr`;
/// returns the calls made in all (warm-up included).
async fn drive_h2(a: &Args, addr: &str) -> Result<u64, BoxError> {
    let uri: http::Uri =
        format!("http://{addr}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
            .parse()?;
    let mut senders = Vec::with_capacity(a.connections);
    let mut connections = Vec::with_capacity(a.connections);
    for _ in 0..a.connections {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let (send, connection) = h2::client::Builder::new()
            .initial_window_size(1 << 20)
            .initial_connection_window_size(8 << 20)
            .handshake::<_, bytes::Bytes>(tcp)
            .await?;
        connections.push(tokio::spawn(async move {
            let _ = connection.await;
        }));
        senders.push(send);
    }
    // Every key's request encoded once: a call clones a reference-counted buffer.
    let bodies: Arc<Vec<bytes::Bytes>> = Arc::new(
        (0..a.keys)
            .map(|i| bytes::Bytes::from(grpc_frame(&request(&format!("key-{i}"), a.descriptors))))
            .collect(),
    );
    let done = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let all = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(a.concurrency);
    for t in 0..a.concurrency {
        let send = senders[t % senders.len()].clone();
        let (bodies, done, measuring, all, uri) = (
            bodies.clone(),
            done.clone(),
            measuring.clone(),
            all.clone(),
            uri.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut i = t;
            let mut stats = H2Stats::default();
            while !done.load(Ordering::Relaxed) {
                let body = bodies[i % bodies.len()].clone();
                i = i.wrapping_add(7919);
                let sent = Instant::now();
                let outcome = h2_call(send.clone(), &uri, body).await;
                let took = u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX);
                all.fetch_add(1, Ordering::Relaxed);
                if measuring.load(Ordering::Relaxed) {
                    stats.record(outcome, took);
                }
            }
            stats
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    let cpu_start = cpu_seconds();
    tokio::time::sleep(Duration::from_secs(a.seconds)).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let cpu = cpu_seconds().zip(cpu_start).map(|(end, start)| end - start);
    done.store(true, Ordering::Relaxed);
    let mut stats = H2Stats::default();
    for t in tasks {
        if let Ok(s) = t.await {
            stats.merge(s);
        }
    }
    // Close the connections now: a server shutting down gracefully waits for them, and this
    // single-threaded runtime will not run their tasks again.
    drop(senders);
    for c in connections {
        c.abort();
        let _ = c.await;
    }
    stats.latencies.sort_unstable();
    let n = stats.latencies.len() as u64;
    let pct = |p: usize| {
        stats
            .latencies
            .get((stats.latencies.len() * p / 100).min(stats.latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    #[allow(clippy::cast_precision_loss)]
    let rate = n as f64 / elapsed.as_secs_f64();
    println!(
        "ShouldRateLimit via raw h2 ({} store, {} descriptor(s)/call): {n} calls in {:.2} s = \
         {rate:.0} calls/s ({} connections, {} concurrent calls, {} keys; {} OK, {} over limit, \
         {} failed)",
        if a.redis.is_some() { "redis" } else { "memory" },
        a.descriptors,
        elapsed.as_secs_f64(),
        a.connections,
        a.concurrency,
        a.keys,
        stats.ok,
        stats.over,
        stats.failed,
    );
    println!(
        "latency per call (µs, client side, under this load): p50 {} p90 {} p99 {} max {}",
        pct(50),
        pct(90),
        pct(99),
        stats.latencies.last().copied().unwrap_or(0)
    );
    if let Some(cpu) = cpu.filter(|c| *c > 0.0) {
        println!(
            "load generator: {cpu:.2} s CPU in {:.2} s wall ({:.0}% of one core)",
            elapsed.as_secs_f64(),
            100.0 * cpu / elapsed.as_secs_f64(),
        );
    }
    Ok(all.load(Ordering::Relaxed))
}

/// Counts and latencies of one call loop.
#[derive(Default)]
struct H2Stats {
    ok: u64,
    over: u64,
    failed: u64,
    latencies: Vec<u32>,
}

impl H2Stats {
    fn record(&mut self, outcome: Outcome, micros: u32) {
        match outcome {
            Outcome::Answered(1) => self.ok += 1,
            Outcome::Answered(2) => self.over += 1,
            // UNKNOWN (or a code this client does not know) is no answer Envoy can act on.
            Outcome::Answered(_) | Outcome::Failed => self.failed += 1,
        }
        self.latencies.push(micros);
    }

    fn merge(&mut self, other: H2Stats) {
        self.ok += other.ok;
        self.over += other.over;
        self.failed += other.failed;
        self.latencies.extend(other.latencies);
    }
}

/// One unary gRPC call over `send`: the request, then the answer's status, message and
/// trailers. Only the `overall_code` of the message is read.
async fn h2_call(
    send: h2::client::SendRequest<bytes::Bytes>,
    uri: &http::Uri,
    body: bytes::Bytes,
) -> Outcome {
    let Ok(mut send) = send.ready().await else {
        return Outcome::Failed;
    };
    let request = http::Request::post(uri.clone())
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(());
    let Ok(request) = request else {
        return Outcome::Failed;
    };
    let Ok((response, mut stream)) = send.send_request(request, false) else {
        return Outcome::Failed;
    };
    if stream.send_data(body, true).is_err() {
        return Outcome::Failed;
    }
    let Ok(response) = response.await else {
        return Outcome::Failed;
    };
    if response.status() != http::StatusCode::OK {
        return Outcome::Failed;
    }
    // A trailers-only answer carries its (error) status in the headers.
    if let Some(status) = response.headers().get("grpc-status") {
        return if status.as_bytes() == b"0" {
            Outcome::Answered(0)
        } else {
            Outcome::Failed
        };
    }
    let mut body = response.into_body();
    let mut message: Vec<u8> = Vec::new();
    while let Some(chunk) = body.data().await {
        let Ok(chunk) = chunk else {
            return Outcome::Failed;
        };
        let _ = body.flow_control().release_capacity(chunk.len());
        if message.len() < 7 {
            message.extend_from_slice(&chunk[..chunk.len().min(7 - message.len())]);
        }
    }
    match body.trailers().await {
        Ok(Some(trailers))
            if trailers.get("grpc-status").map(http::HeaderValue::as_bytes) == Some(b"0") => {}
        _ => return Outcome::Failed,
    }
    // After the 5-byte frame header, prost writes field 1 (overall_code, a varint) first;
    // absent, it is 0 (UNKNOWN).
    match message.get(5..7) {
        Some([0x08, code]) => Outcome::Answered(u64::from(*code)),
        _ => Outcome::Answered(0),
    }
}
