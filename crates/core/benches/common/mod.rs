//! What the core's benchmarks share: polling the memory store's futures, reading the run's
//! settings, and summing up interleaved rounds against governor.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// Polls a future that is ready at once (the memory store's), without a runtime. Inline, as it
/// was when each benchmark defined it beside its loop: called across modules, it is not, and
/// the figures would count a call and a copy of the future that an application's own poll
/// does not pay.
#[inline]
pub(crate) fn now_or_never<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the memory store never waits"),
    }
}

/// The number in environment variable `name`, or `default`.
pub(crate) fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A contender's median time, and its ratio to governor (governor's time / its own) in each
/// round, where the two ran side by side: the median of those ratios and their middle half
/// (25th to 75th percentile).
pub(crate) fn summary(samples: &[f64], governor: &[f64]) -> (f64, f64, f64, f64) {
    let mut per_round: Vec<f64> = governor.iter().zip(samples).map(|(g, s)| g / s).collect();
    per_round.sort_by(f64::total_cmp);
    let n = per_round.len();
    (
        median(samples),
        per_round[n / 2],
        per_round[n / 4],
        per_round[(3 * n) / 4],
    )
}

fn median(samples: &[f64]) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}
