//! The Redis-protocol door over an in-memory store, for trying it with `redis-cli` and for
//! `scripts/bench-resp.sh`, until `tollgate serve` has its `resp_listen`.
//!
//! ```sh
//! cargo run --release -p tollgate-resp --example resp_server -- --listen 127.0.0.1:6380
//! redis-cli -p 6380 CL.THROTTLE user123 15 30 60
//! redis-cli -p 6380 TOLLGATE.CHECK api customer-42
//! ```
//!
//! Options: `--listen ADDR` (default `127.0.0.1:6380`), `--threads N` (tokio worker threads,
//! default one per CPU). `TOLLGATE.CHECK` knows two policies: `api` (100 per minute, sliding
//! window counter) and `burst` (a token bucket of 20 refilled at 10/s). It prints the address
//! it listens on, and stops on SIGINT or SIGTERM.

use std::error::Error;
use std::time::Duration;

use tollgate::{Limiter, MemoryStore, Policy, Quota};
use tollgate_resp::{Handler, Limits, serve};

fn main() -> Result<(), Box<dyn Error>> {
    let mut listen = "127.0.0.1:6380".to_owned();
    let mut threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => listen = args.next().ok_or("--listen needs an address")?,
            "--threads" => threads = args.next().ok_or("--threads needs a number")?.parse()?,
            other => return Err(format!("unknown option {other:?}; see the file's header").into()),
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let limiter = Limiter::builder()
            .store(MemoryStore::default())
            .policy(Policy::new(
                "api",
                Quota::sliding_window_counter(100, Duration::from_secs(60))?,
            )?)
            .policy(Policy::new(
                "burst",
                Quota::token_bucket(20, "10/s".parse()?)?,
            )?)
            .build()?;
        let listener = tokio::net::TcpListener::bind(&listen).await?;
        println!("tollgate-resp listening on {}", listener.local_addr()?);
        serve(
            listener,
            Handler::for_limiter(limiter),
            Limits::default(),
            stopped(),
        )
        .await?;
        Ok(())
    })
}

/// Completes on SIGINT or SIGTERM.
async fn stopped() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
