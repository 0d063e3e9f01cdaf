//! Every algorithm at the extremes of time: the epoch, the end of `u64`, the instants next to
//! them, and jumps between them both ways (a clock that is wrong, a state written by a clock
//! that was). Debug builds check every addition and multiplication, so an overflow anywhere is
//! a panic here; in release builds it would wrap round to a wrong decision, which the bounds
//! below catch.
//!
//! Checked at every step: nothing panics; `remaining` is at most the limit; an admission has no
//! `retry_after`; a cost above the quota is refused for good. Going forward in time from a
//! fresh key, a peek is admitted and `reset`, `retry_after` and `delay` stay within the
//! algorithm's own span (a window, a bucket's horizon): a wrapped sum would be near 2⁶⁴. A
//! fresh key is held to its quota. And the memory store decides as the pure algorithms do at
//! every one of these instants, until the clock steps back (see `drive_store`).

use std::time::Duration;

use tollgate::algorithm::{Algorithm, Concurrency, ConcurrencyState, LeakyBucket};
use tollgate::{Calendar, CalendarUnit, Check, MemoryStore, Policy, Quota, Timestamp, Verdict};

/// The latest time a bucket's state holds (`algorithm::MAX_TIME`, year 292,277).
const MAX_TIME: u64 = u64::MAX >> 1;
const SECOND: u64 = 1_000_000;
const DAY: u64 = 86_400 * SECOND;

/// The instants every sequence is made of.
const POINTS: [u64; 16] = [
    0,
    1,
    SECOND - 1,
    SECOND,
    1_800_000_000 * SECOND,
    MAX_TIME - 400 * DAY,
    MAX_TIME - 1,
    MAX_TIME,
    MAX_TIME + 1,
    u64::MAX - 401 * DAY,
    u64::MAX - DAY,
    u64::MAX - SECOND - 1,
    u64::MAX - SECOND,
    u64::MAX - 5,
    u64::MAX - 1,
    u64::MAX,
];

/// One quota of each algorithm, small and at the largest spans the bounds allow, with the most
/// that any `reset`, `retry_after` or `delay` of a fresh key may be when time only moves on.
fn quotas() -> Vec<(Quota, u64)> {
    let build = || -> Result<Vec<(Quota, u64)>, tollgate::QuotaError> {
        let per_second = "10/s".parse()?;
        let slowest = "1/400d".parse()?;
        let leaky_delay = LeakyBucket::new(per_second, 4)?.with_max_delay(Duration::from_secs(2));
        Ok(vec![
            (Quota::fixed_window(3, Duration::from_secs(1))?, SECOND),
            (Quota::fixed_window(3, Duration::from_micros(1))?, 1),
            (
                Quota::fixed_window(u32::MAX, Duration::from_secs(400 * 86_400))?,
                400 * DAY,
            ),
            // Past the year 9999 a calendar has one last period, which ends at MAX_TIME.
            (
                Quota::fixed_calendar(3, Calendar::new(CalendarUnit::Day, "UTC")?)?,
                MAX_TIME,
            ),
            (
                Quota::sliding_window_log(3, Duration::from_secs(1))?,
                SECOND,
            ),
            (
                Quota::sliding_window_log(3, Duration::from_secs(400 * 86_400))?,
                400 * DAY,
            ),
            (
                Quota::sliding_window_counter(3, Duration::from_secs(1))?,
                2 * SECOND,
            ),
            (
                Quota::sliding_window_counter(3, Duration::from_micros(1))?,
                2,
            ),
            (
                Quota::sliding_window_counter(u32::MAX, Duration::from_secs(400 * 86_400))?,
                800 * DAY,
            ),
            (Quota::token_bucket(3, per_second)?, 300_000),
            (Quota::token_bucket(91, slowest)?, 91 * 400 * DAY),
            (Quota::leaky_bucket(per_second, 2)?, 300_000),
            (Quota::LeakyBucket(leaky_delay), 500_000),
            (Quota::leaky_bucket(slowest, 90)?, 91 * 400 * DAY),
            (Quota::concurrency(3, Duration::from_secs(1))?, SECOND),
            (
                Quota::concurrency(3, Duration::from_secs(400 * 86_400))?,
                SECOND,
            ),
        ])
    };
    build().unwrap_or_else(|e| panic!("quota: {e}"))
}

/// Checks what holds of any verdict of a check of `cost` (`None`: a peek after charges), and,
/// when `span` is given (time has only moved on, nothing was charged), that a peek is admitted
/// and the verdict's times are within `span`.
fn sane(v: &Verdict, cost: Option<u32>, max_cost: u32, span: Option<u64>, what: &str) {
    assert!(v.remaining <= v.limit, "{what}: {v:?}");
    if v.allowed {
        assert_eq!(v.retry_after_micros, None, "{what}: {v:?}");
    }
    // A peek of a key within its quota; past it (charged past it, or, for the sliding window
    // counter, the previous window weighing fully again when the clock steps back) it is not.
    if cost == Some(0) && span.is_some() {
        assert!(v.allowed, "a peek is admitted; {what}: {v:?}");
    }
    if cost.is_some_and(|c| c > max_cost) {
        assert!(
            !v.allowed && v.retry_after_micros.is_none(),
            "{what}: {v:?}"
        );
    }
    if let Some(span) = span {
        let times = [
            v.reset_micros,
            v.retry_after_micros.unwrap_or(0),
            v.delay_micros,
        ];
        assert!(
            times.iter().all(|&t| t <= span),
            "{what}: over {span}: {v:?}"
        );
    }
}

/// A burst, a peek and an impossible cost at `now`.
fn burst<A: Algorithm>(
    alg: &A,
    state: &mut A::State,
    now: u64,
    span: Option<u64>,
    what: &str,
) -> u32 {
    let now_ts = Timestamp::from_micros(now);
    let max = alg.max_cost();
    let mut admitted = 0;
    for cost in [1, 1, 1, 1, 1, 0, max, max.saturating_add(1)] {
        let v = alg.check(state, now_ts, cost);
        sane(
            &v,
            Some(cost),
            max,
            span,
            &format!("{what} at {now}, cost {cost}"),
        );
        if v.allowed && cost == 1 {
            admitted += 1;
        }
    }
    admitted
}

/// `alg` through every pair of points, there and back: checks, then charges and refunds of
/// any size, and when the state expires. A fresh key is held to its quota at every point, or,
/// for a bucket (`bucket`), wherever its whole span fits before the latest time a bucket's
/// state holds: past it the state cannot be ahead of now, so the bucket is full again at once.
/// (The windows and the log still count there, in a last window cut short by the end of u64,
/// until u64::MAX itself, where every entry of a log has left its window.)
fn drive<A: Algorithm>(alg: &A, span: u64, bucket: bool, what: &str) {
    for &a in &POINTS {
        for &b in &POINTS {
            let mut state = A::State::default();
            let admitted = burst(alg, &mut state, a, Some(span), what);
            if a < u64::MAX && (!bucket || a.saturating_add(2 * span) <= MAX_TIME) {
                assert_eq!(
                    admitted,
                    alg.max_cost().min(5),
                    "{what}: a fresh key at {a}"
                );
            }
            burst(alg, &mut state, b, (b >= a).then_some(span), what);
            burst(alg, &mut state, a, (b <= a).then_some(span), what);
            for (now, cost) in [(b, u32::MAX), (a, 7), (b, 1), (b, u32::MAX), (a, u32::MAX)] {
                let now = Timestamp::from_micros(now);
                alg.charge(&mut state, now, cost);
                let _ = alg.expires_at(&state);
                sane(&alg.evaluate(&mut state, now, 0), None, 0, None, what);
                alg.refund(&mut state, now, cost);
                let _ = alg.expires_at(&state);
                sane(
                    &alg.check(&mut state, now, 1),
                    Some(1),
                    alg.max_cost(),
                    None,
                    what,
                );
            }
        }
    }
}

/// The concurrency algorithm through every pair of points: permits taken, renewed, released.
/// A fresh key holds `limit` permits wherever its lease ends before the end of u64 (there a
/// permit expires as it is taken).
fn drive_concurrency(alg: &Concurrency, what: &str) {
    let lease = alg.lease_ttl_micros();
    for &a in &POINTS {
        for &b in &POINTS {
            let mut state = ConcurrencyState::default();
            for (pass, (now, forward)) in [(a, true), (b, b >= a), (a, b <= a)]
                .into_iter()
                .enumerate()
            {
                let at = Timestamp::from_micros(now);
                let mut admitted = 0;
                for permit in 1..=5 {
                    let v = alg.check(&mut state, at, 1, permit);
                    let span = forward.then_some(SECOND);
                    sane(&v, Some(1), alg.limit(), span, &format!("{what} at {now}"));
                    admitted += u32::from(v.allowed);
                }
                if pass == 0 && a.checked_add(lease).is_some_and(|end| end < u64::MAX) {
                    assert_eq!(admitted, alg.limit(), "{what}: a fresh key at {a}");
                }
                let limit = alg.limit();
                sane(&alg.check(&mut state, at, 0, 9), Some(0), limit, None, what);
                sane(
                    &alg.check(&mut state, at, u32::MAX, 9),
                    Some(u32::MAX),
                    limit,
                    None,
                    what,
                );
                alg.release(&mut state, at, 2);
                let _ = alg.expires_at(&state);
            }
        }
    }
}

#[test]
fn every_algorithm_copes_with_any_timestamp() {
    for (quota, span) in quotas() {
        let what = quota.to_string();
        match &quota {
            Quota::FixedWindow(a) => drive(a, span, false, &what),
            Quota::SlidingWindowLog(a) => drive(a, span, false, &what),
            Quota::SlidingWindowCounter(a) => drive(a, span, false, &what),
            Quota::TokenBucket(a) => drive(a, span, true, &what),
            Quota::LeakyBucket(a) => drive(a, span, true, &what),
            Quota::Concurrency(a) => drive_concurrency(a, &what),
        }
    }
}

/// One check on the store and on the pure algorithm, compared field by field while `same`.
#[allow(clippy::too_many_arguments)]
fn compare<A: Algorithm>(
    alg: &A,
    state: &mut A::State,
    store: &MemoryStore,
    policy: &Policy,
    now: u64,
    cost: u32,
    same: bool,
    what: &str,
) {
    let at = Timestamp::from_micros(now);
    let expected = alg
        .check(state, at, cost)
        .into_decision(policy.shared_name());
    let got = store.apply_now(at, &[Check::new(policy, b"key", cost)]);
    if same {
        assert_eq!(
            got.as_slice(),
            [expected],
            "{} at {now}, cost {cost}, {what}",
            policy.quota()
        );
    }
}

/// `alg`'s policy on the memory store, through every pair of points: the same decisions as
/// the pure algorithm until the clock steps back, and checks, charges, refunds, sweeps and
/// snapshots that do not panic at all.
///
/// Not compared once the clock has stepped back: a denial normalises the pure state (a
/// sliding window counter rolls its windows over) but writes nothing in the store, and the
/// two then report different retry times at an instant before the roll-over.
fn drive_store<A: Algorithm>(alg: &A, quota: &Quota) {
    let policy = Policy::new("extreme", quota.clone()).unwrap_or_else(|e| panic!("{e}"));
    for &a in &POINTS {
        for &b in &POINTS {
            let store = MemoryStore::builder().shards(1).build();
            let mut state = A::State::default();
            let mut latest = 0;
            for now in [a, b, a] {
                latest = latest.max(now);
                for cost in [1, 1, 1, 1, 0, alg.max_cost().saturating_add(1)] {
                    let same = now == latest;
                    let what = format!("{a} then {b}");
                    compare(alg, &mut state, &store, &policy, now, cost, same, &what);
                }
            }
            // Charges well below u32::MAX: the memory store keeps a long sliding log's total in
            // 32 bits, and this test is about times, not costs.
            for (now, cost) in [(b, 1_000_000_000), (a, 7), (b, 1_000_000_000)] {
                let at = Timestamp::from_micros(now);
                let check = [Check::new(&policy, b"key", cost)];
                store.charge_now(at, &check);
                alg.charge(&mut state, at, cost);
                store.refund_now(at, &check);
                alg.refund(&mut state, at, cost);
                let what = format!("{a} then {b}: after a charge of {cost}");
                let same = a == b;
                compare(alg, &mut state, &store, &policy, now, 1, same, &what);
            }
            store.purge_expired(Timestamp::from_micros(b));
            let mut snapshot = Vec::new();
            let written = store.write_snapshot(Timestamp::from_micros(a), &mut snapshot);
            assert!(written.is_ok(), "{written:?}");
        }
    }
}

/// Permits on the memory store through every pair of points.
fn drive_store_concurrency(alg: &Concurrency, quota: &Quota) {
    let policy = Policy::new("extreme", quota.clone()).unwrap_or_else(|e| panic!("{e}"));
    for &a in &POINTS {
        for &b in &POINTS {
            let store = MemoryStore::builder().shards(1).build();
            let mut state = ConcurrencyState::default();
            for now in [a, b, a] {
                let at = Timestamp::from_micros(now);
                for permit in [1, 2, 3, 4, 1, 0] {
                    let expected = alg
                        .check(&mut state, at, 1, permit)
                        .into_decision(policy.shared_name());
                    let check = Check::new(&policy, b"key", 1).with_permit(permit);
                    let got = store.apply_now(at, &[check]);
                    assert_eq!(got.as_slice(), [expected], "{quota} at {now}");
                }
                alg.release(&mut state, at, 2);
                store.release_now(at, &[Check::new(&policy, b"key", 1).with_permit(2)]);
            }
            store.purge_expired(Timestamp::from_micros(b));
        }
    }
}

#[test]
fn the_memory_store_copes_with_any_timestamp() {
    for (quota, _) in quotas() {
        match &quota {
            Quota::FixedWindow(a) => drive_store(a, &quota),
            Quota::SlidingWindowLog(a) => drive_store(a, &quota),
            Quota::SlidingWindowCounter(a) => drive_store(a, &quota),
            Quota::TokenBucket(a) => drive_store(a, &quota),
            Quota::LeakyBucket(a) => drive_store(a, &quota),
            Quota::Concurrency(a) => drive_store_concurrency(a, &quota),
        }
    }
}
