//! A tight loop of `Limiter::check` on one key, for profilers:
//! `cargo build --release -p tollgate --example hot_loop && perf record target/release/examples/hot_loop`.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use tollgate::{Limiter, Policy, Quota};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let limiter = Limiter::builder()
        .policy(Policy::new(
            "api",
            Quota::token_bucket(1_000_000_000, "1000000/s".parse()?)?,
        )?)
        .build()?;
    let mut cx = Context::from_waker(Waker::noop());
    let n = 20_000_000u64;
    let start = Instant::now();
    let mut admitted = 0u64;
    for _ in 0..n {
        let mut f = pin!(limiter.check("api", "api-key-00000001", 1));
        if let Poll::Ready(Ok(d)) = f.as_mut().poll(&mut cx) {
            admitted += u64::from(d.allowed);
        }
    }
    let per = start.elapsed().as_nanos() as f64 / n as f64;
    println!("{admitted} admitted, {per:.1} ns per check");
    Ok(())
}
