//! The hot-key run of `bench_redis`: several instances deciding one key of a fixed window
//! policy, with or without leases, and how far the admissions went past the limit.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use tollgate::{Check, Lease, Policy, Quota, Store, Timestamp};

/// Windows of one second: long against a round trip, short enough to see several per run.
const WINDOW: Duration = Duration::from_secs(1);

/// Admissions per window, by the window's index since the run began.
struct Windows {
    first: u64,
    counts: Vec<AtomicU64>,
}

impl Windows {
    fn new(seconds: u64) -> Self {
        let window = WINDOW.as_micros() as u64;
        Windows {
            first: now_micros() / window,
            counts: (0..seconds + 4).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Counts an admission decided by `completed` (µs) whose window ends `reset` later: the
    /// window it was admitted in is the one whose end is nearest that instant (a decision's
    /// reset is measured from its own moment, a round trip earlier at most).
    fn admit(&self, completed: u64, reset: Duration) {
        let window = WINDOW.as_micros() as u64;
        let end = (completed + reset.as_micros() as u64 + window / 2) / window;
        let index = end.saturating_sub(1).saturating_sub(self.first) as usize;
        if let Some(c) = self.counts.get(index) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn over(&self, limit: u64) -> (u64, u64) {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let over = counts.iter().map(|&c| c.saturating_sub(limit)).sum();
        let worst = counts.iter().copied().max().unwrap_or(0);
        (over, worst)
    }
}

fn now_micros() -> u64 {
    Timestamp::from_system_time(SystemTime::now()).as_micros()
}

pub(crate) async fn run(
    url: &str,
    instances: usize,
    concurrency: usize,
    seconds: u64,
    limit: u32,
    lease: Option<u32>,
) -> Result<(), Box<dyn std::error::Error>> {
    let quota = Quota::fixed_window(limit, WINDOW)?;
    // A policy of its own per run: a run just before must not leave its window's count here.
    let name = format!("bench-hot-key-{}", now_micros());
    let mut policy = Policy::new(&name, quota.clone())?;
    if let Some(size) = lease {
        policy = policy.with_lease(Lease::new(size, Lease::default_ttl(&quota))?)?;
    }
    let mut stores = Vec::with_capacity(instances);
    for _ in 0..instances {
        stores.push(super::store(url).await?);
    }
    let windows = Arc::new(Windows::new(seconds + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let mut tasks = tokio::task::JoinSet::new();
    for store in &stores {
        for _ in 0..concurrency {
            let (store, policy) = (store.clone(), policy.clone());
            let (stop, measuring, windows) = (stop.clone(), measuring.clone(), windows.clone());
            tasks.spawn(async move {
                let (mut decided, mut admitted) = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    // A decision from a lease or the deny cache is ready at once; a caller
                    // that loops on them must still let the connection's task run, as a
                    // server's request tasks do between requests.
                    tokio::task::coop::consume_budget().await;
                    let now = Timestamp::from_system_time(SystemTime::now());
                    let d = store.apply_one(now, Check::new(&policy, b"hot", 1)).await;
                    let Ok(d) = d else { continue };
                    if d.allowed {
                        // Every admission counts against its window, measured or not.
                        windows.admit(now_micros(), d.reset);
                    }
                    if measuring.load(Ordering::Relaxed) {
                        decided += 1;
                        admitted += u64::from(d.allowed);
                    }
                }
                (decided, admitted)
            });
        }
    }
    tokio::time::sleep(super::WARM_UP).await;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let (mut decided, mut admitted) = (0u64, 0u64);
    while let Some(r) = tasks.join_next().await {
        let (d, a) = r?;
        decided += d;
        admitted += a;
    }
    let (over, worst) = windows.over(u64::from(limit));
    let calls: u64 = stores.iter().map(|s| s.stats().script_calls).sum();
    let errors: u64 = stores.iter().map(|s| s.stats().errors).sum();
    let fallbacks: u64 = stores.iter().map(|s| s.stats().fallbacks).sum();
    println!(
        "hot key, {instances} instances x {concurrency} callers, fixed window {limit}/s, {}: \
         {:.0} decisions/s, admitted {admitted} ({:.0}/s), over-admitted {over} (fullest window \
         {worst} of {limit}), script calls {calls}, errors {errors}, fallbacks {fallbacks}",
        match lease {
            Some(size) => format!("leases of {size}"),
            None => "no lease".to_owned(),
        },
        decided as f64 / elapsed,
        admitted as f64 / elapsed,
    );
    Ok(())
}
