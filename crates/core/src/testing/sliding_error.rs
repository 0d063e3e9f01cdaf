//! How far the sliding window counter strays from the exact sliding window log, measured on a
//! long synthetic trace with realistic arrival patterns.
//!
//! The population: most clients far below the limit, some close to it, a few far above it (a
//! retry loop without backoff). Arrivals are Poisson, and a share of them come as page-load
//! bursts of several requests at once; clients start and stop sessions.
//!
//! Two settings are measured on the same trace:
//!
//! - **Every request counts** (the setting of the 0.003% anchor, where a denied request still
//!   counts towards the rate): both the exact log and the counter record every request, so both
//!   see the same history and every difference is the counter's estimation error.
//! - **Admitted requests count** (Tollgate's semantics: a denied request consumes nothing): the
//!   counter decides and its admissions are the history; the exact rule is asked about that same
//!   history. Here the differences concentrate on clients above their limit, where the two rules
//!   pick different instants at which the next excess request may pass.

use std::time::Duration;

use crate::Timestamp;
use crate::algorithm::{Algorithm, SlidingWindowCounter, SlidingWindowLog};

use super::Xorshift;

/// What [`measure`] found, in each setting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Measurement {
    /// Every request counts towards the rate, admitted or not.
    pub every_request: ErrorReport,
    /// Only admitted requests count (Tollgate's semantics).
    pub admitted_only: ErrorReport,
}

/// Decisions of the counter compared with the exact rule in one setting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorReport {
    /// Requests decided.
    pub requests: u64,
    /// Requests the exact rule would admit.
    pub admitted_exact: u64,
    /// Requests the counter admitted although the exact rule would deny them.
    pub wrongly_admitted: u64,
    /// Requests the counter denied although the exact rule would admit them.
    pub wrongly_denied: u64,
}

impl ErrorReport {
    fn record(&mut self, exact: bool, counter: bool) {
        self.requests += 1;
        self.admitted_exact += u64::from(exact);
        self.wrongly_admitted += u64::from(counter && !exact);
        self.wrongly_denied += u64::from(exact && !counter);
    }

    /// The share of requests the counter decided differently, as a fraction.
    pub fn wrong_share(&self) -> f64 {
        (self.wrongly_admitted + self.wrongly_denied) as f64 / self.requests.max(1) as f64
    }
}

/// How clients spread over request rates, in percent (the rest are light: 1 to 40 a minute).
#[derive(Clone, Copy, Debug)]
pub struct Population {
    /// Percent of clients close to the limit of 100 a minute (60 to 140 a minute).
    pub near_limit: u64,
    /// Percent of clients far above it (300 to 3,300 a minute: a retry loop).
    pub abusive: u64,
}

impl Population {
    /// Most clients far below the limit, 2.5% near it, 0.5% abusive.
    pub const REALISTIC: Population = Population {
        near_limit: 3,
        abusive: 1,
    };
    /// A quarter of clients near the limit and one in twenty abusive: a worst case.
    pub const HEAVY: Population = Population {
        near_limit: 25,
        abusive: 5,
    };
}

/// Runs `clients` clients for `minutes` against a limit of 100 per minute and compares the
/// counter's decisions with the exact rule's on the same history. Deterministic for a `seed`.
pub fn measure(population: Population, clients: u32, minutes: u32, seed: u64) -> Measurement {
    let window = Duration::from_secs(60);
    let (Ok(exact), Ok(counter)) = (
        SlidingWindowLog::new(100, window),
        SlidingWindowCounter::new(100, window),
    ) else {
        return Measurement::default();
    };
    let mut rng = Xorshift(seed | 1);
    let start = 1_800_000_000_000_000u64;
    let end = start + u64::from(minutes) * 60_000_000;
    let mut report = Measurement::default();
    for _ in 0..clients {
        let pick = rng.below(100);
        let rate_per_min = if pick < population.abusive {
            300 + rng.below(3_000)
        } else if pick < population.abusive + population.near_limit {
            60 + rng.below(80)
        } else {
            1 + rng.below(40)
        };
        let mean_gap = 60_000_000 / rate_per_min;
        let (mut log_all, mut counter_all) = (Default::default(), Default::default());
        let (mut log_admitted, mut counter_admitted) = (Default::default(), Default::default());
        let mut now = start + rng.below(60_000_000);
        let mut active_until = now + (1 + rng.below(30)) * 60_000_000;
        while now < end {
            if now > active_until {
                // Off for a while, then a new session.
                now += (1 + rng.below(20)) * 60_000_000;
                active_until = now + (1 + rng.below(30)) * 60_000_000;
                continue;
            }
            // A page load fires several requests at once; otherwise one.
            let burst = if rng.below(10) == 0 {
                2 + rng.below(7)
            } else {
                1
            };
            for _ in 0..burst {
                let t = Timestamp::from_micros(now);
                let a = exact.evaluate(&mut log_all, t, 1).allowed;
                let b = counter.evaluate(&mut counter_all, t, 1).allowed;
                exact.commit(&mut log_all, t, 1);
                counter.commit(&mut counter_all, t, 1);
                report.every_request.record(a, b);

                let b = counter.check(&mut counter_admitted, t, 1).allowed;
                let a = exact.evaluate(&mut log_admitted, t, 1).allowed;
                if b {
                    exact.commit(&mut log_admitted, t, 1);
                }
                report.admitted_only.record(a, b);
            }
            // Exponential gap: −ln(U) × mean.
            let u = (rng.below(1 << 30) + 1) as f64 / (1u64 << 30) as f64;
            now += (-(u.ln()) * mean_gap as f64 * burst as f64) as u64 + 1;
        }
    }
    report
}
