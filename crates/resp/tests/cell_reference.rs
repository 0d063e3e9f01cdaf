//! `CL.THROTTLE` held to a model of redis-cell: its generic cell rate algorithm as the module
//! computes it (nanoseconds, its `f64` interval and rounding), with one state per key kept
//! until its theoretical arrival time passes. The door runs on a `ManualClock` (whole
//! microseconds, as Tollgate's clock), the model at the same instants.
//!
//! - Wherever redis-cell's emission interval is a whole number of microseconds, every answer
//!   is redis-cell's, to the integer.
//! - Elsewhere every answer is the one redis-cell would give with the interval rounded up to
//!   the next microsecond: Tollgate never runs faster than the rate asked for.
//!
//! Not modelled: Redis expiring the module's key up to 2 ms before its arrival time (its TTL
//! is set in truncated milliseconds), after which redis-cell forgets that much debt.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use proptest::prelude::*;
use tollgate::{Limiter, ManualClock, MemoryStore, Timestamp};
use tollgate_resp::Throttle;

/// redis-cell, modelled. Times are nanoseconds since the epoch.
#[derive(Default)]
struct Model {
    tat: HashMap<Vec<u8>, i128>,
    /// When set, the emission interval is rounded up to whole microseconds first.
    round_interval_up: bool,
}

impl Model {
    /// The interval of a quota, as redis-cell computes it (rounded up when asked).
    fn interval(&self, count: i64, period: i64) -> i128 {
        // Period over count, in f64, truncated to whole nanoseconds.
        let interval = ((period as i128 * 1_000_000_000) as f64 / count as f64) as i128;
        assert!(interval > 0);
        if self.round_interval_up {
            (interval + 999) / 1_000 * 1_000
        } else {
            interval
        }
    }

    /// Nanoseconds from `now` until `quantity` for `key` is admitted (0 if it is now).
    fn wait(
        &self,
        now: i128,
        key: &[u8],
        (max_burst, count, period): (i64, i64, i64),
        quantity: i64,
    ) -> i128 {
        let interval = self.interval(count, period);
        let tat = self.tat.get(key).copied().unwrap_or(now).max(now);
        (tat + interval * i128::from(quantity) - interval * (i128::from(max_burst) + 1) - now)
            .max(0)
    }

    fn throttle(
        &mut self,
        now: i128,
        key: &[u8],
        max_burst: i64,
        count: i64,
        period: i64,
        quantity: i64,
    ) -> [i64; 5] {
        let interval = self.interval(count, period);
        let limit = i128::from(max_burst) + 1;
        let tolerance = interval * limit;
        let increment = interval * i128::from(quantity);
        // A key past its arrival time is as good as none.
        let tat = self
            .tat
            .get(key)
            .copied()
            .filter(|&t| t > now)
            .unwrap_or(now);
        let new_tat = tat.max(now) + increment;
        let wait = new_tat - tolerance - now;
        let (limited, ttl, retry) = if wait > 0 {
            let retry = (increment <= tolerance).then_some(wait);
            (true, tat - now, retry)
        } else {
            self.tat.insert(key.to_vec(), new_tat);
            (false, new_tat - now, None)
        };
        let left = tolerance - ttl;
        let remaining = if left > -interval {
            ((left / 1_000) as f64 / (interval / 1_000) as f64) as i64
        } else {
            0
        };
        let seconds = |ns: i128| {
            let whole = ns / 1_000_000_000;
            let fraction = ns % 1_000_000_000;
            let s = (whole as f64 + fraction as f64 / 1e9) as i64;
            s + i64::from(fraction / 1_000_000 > 0)
        };
        [
            i64::from(limited),
            limit as i64,
            remaining,
            retry.map_or(-1, seconds),
            seconds(ttl),
        ]
    }
}

/// The memory store decides on the first poll.
fn ready<F: Future>(f: F) -> F::Output {
    match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the memory store waited"),
    }
}

/// One step of a run: wait, then throttle key number `key` by `quantity`.
#[derive(Clone, Debug)]
struct Step {
    advance: Advance,
    key: u8,
    quantity: i64,
}

/// How long a step waits.
#[derive(Clone, Copy, Debug)]
enum Advance {
    /// So many microseconds.
    By(u64),
    /// To the microsecond the request would first be admitted, give or take a few.
    ToBoundary(i64),
}

fn steps(limit: i64) -> impl Strategy<Value = Vec<Step>> {
    let step = (
        prop_oneof![
            3 => (0..2_000_000u64).prop_map(Advance::By),
            1 => (0..20_000u64).prop_map(Advance::By),
            1 => Just(Advance::By(0)),
            1 => (0..400_000_000u64).prop_map(Advance::By),
            3 => (-2..=2i64).prop_map(Advance::ToBoundary),
        ],
        0..3u8,
        prop_oneof![4 => Just(1i64), 2 => 0..=limit + 2, 1 => 0..=2i64],
    )
        .prop_map(|(advance, key, quantity)| Step {
            advance,
            key,
            quantity,
        });
    prop::collection::vec(step, 1..60)
}

/// Runs `steps` through the door and the model; returns the first disagreement.
fn compare(
    (max_burst, count, period): (i64, i64, i64),
    start_us: u64,
    steps: &[Step],
    round_interval_up: bool,
) -> Result<(), String> {
    let clock = ManualClock::new(Timestamp::from_micros(start_us));
    let limiter = Limiter::builder()
        .store(MemoryStore::default())
        .clock(clock.clone())
        .build()
        .unwrap();
    let throttle = Throttle::new(limiter);
    let mut model = Model {
        round_interval_up,
        ..Model::default()
    };
    let mut now_us = start_us;
    let quota = (max_burst, count, period);
    for (i, step) in steps.iter().enumerate() {
        let key = format!("key{}", step.key);
        let advance_us = match step.advance {
            Advance::By(us) => us,
            Advance::ToBoundary(delta) => {
                let wait = model.wait(
                    i128::from(now_us) * 1_000,
                    key.as_bytes(),
                    quota,
                    step.quantity,
                );
                let wait_us = (wait + 999) / 1_000;
                u64::try_from(wait_us as i64 + delta).unwrap_or(0)
            }
        };
        clock.advance(Duration::from_micros(advance_us));
        now_us += advance_us;
        let numbers = [max_burst, count, period, step.quantity].map(|n| n.to_string());
        let args: Vec<&[u8]> = std::iter::once(key.as_bytes())
            .chain(numbers.iter().map(|n| n.as_bytes()))
            .collect();
        let ours = ready(throttle.throttle(&args))
            .map_err(|e| e.to_string())?
            .to_array();
        let theirs = model.throttle(
            i128::from(now_us) * 1_000,
            key.as_bytes(),
            max_burst,
            count,
            period,
            step.quantity,
        );
        if ours != theirs {
            return Err(format!(
                "step {i} ({step:?}): door {ours:?}, redis-cell {theirs:?}"
            ));
        }
    }
    Ok(())
}

/// Quotas whose interval is a whole number of microseconds.
fn whole_micro_quota() -> impl Strategy<Value = (i64, i64, i64)> {
    (0..30i64, 1..2_000i64, 1..7_200i64).prop_filter("whole microseconds", |&(_, count, period)| {
        ((period as i128 * 1_000_000_000) as f64 / count as f64) as i128 % 1_000 == 0
    })
}

fn start() -> impl Strategy<Value = u64> {
    // From 2023 to 2033, at any microsecond.
    1_700_000_000_000_000..2_000_000_000_000_000u64
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1_000, ..ProptestConfig::default() })]

    #[test]
    fn whole_microsecond_intervals_answer_exactly_as_redis_cell(
        quota in whole_micro_quota(), start in start(), steps in steps(30)
    ) {
        compare(quota, start, &steps, false).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn other_intervals_answer_as_redis_cell_with_the_interval_rounded_up(
        quota in (0..30i64, 1..5_000i64, 1..7_200i64), start in start(), steps in steps(30)
    ) {
        compare(quota, start, &steps, true).map_err(TestCaseError::fail)?;
    }
}

/// Rates from redis-cell's README and issues, and the fast and slow ends.
#[test]
fn common_quotas_answer_exactly() {
    let steps: Vec<Step> = (0..200)
        .map(|i| Step {
            advance: match i % 9 {
                7 => Advance::ToBoundary(0),
                8 => Advance::ToBoundary(-1),
                k => Advance::By([0, 1, 999, 1_000, 250_000, 1_999_999, 3_000_000][k]),
            },
            key: (i % 2) as u8,
            quantity: [1, 1, 1, 2, 0, 1, 7][i % 7],
        })
        .collect();
    for quota in [
        (15, 30, 60),
        (4, 1, 1),
        (0, 1, 2),
        (99, 100, 1),
        (1000, 1000, 3600),
        (10, 100_000, 1),
        (5, 1_000_000, 1),
        (100, 1_000_000, 1),
        (9, 10, 86_400),
        (59, 60, 60),
    ] {
        compare(quota, 1_764_000_000_123_456, &steps, false).unwrap();
    }
}
