//! Conformance scenarios of calendar windows: fixed windows whose periods are days, weeks,
//! months or years in a time zone, with the clock under the test's control.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::{Xorshift, apply, not_behind, one, unique};
use crate::algorithm::{Algorithm, FixedWindow};
use crate::{Calendar, CalendarUnit, Check, Policy, Quota, Store, Timestamp};

/// µs since the epoch of a UTC date and time (Lisbon's winter time is UTC).
pub fn utc(y: i16, mo: i8, d: i8, h: i8, mi: i8, s: i8) -> Timestamp {
    let micros = jiff::civil::date(y, mo, d)
        .at(h, mi, s, 0)
        .to_zoned_datetime(jiff::tz::TimeZone::UTC)
        .map(|z| z.timestamp().as_microsecond())
        .unwrap_or_else(|e| panic!("scenario date: {e}"));
    Timestamp::from_micros(u64::try_from(micros).unwrap_or_else(|e| panic!("{e}")))
}

fn calendar_policy(prefix: &str, limit: u32, unit: CalendarUnit, zone: &str) -> Policy {
    let calendar = Calendar::new(unit, zone).unwrap_or_else(|e| panic!("scenario zone: {e}"));
    let quota = Quota::fixed_calendar(limit, calendar).unwrap_or_else(|e| panic!("{e}"));
    Policy::new(&unique(prefix), quota).unwrap_or_else(|e| panic!("scenario policy: {e}"))
}

const MICRO: Duration = Duration::from_micros(1);

/// A monthly quota in Europe/Lisbon resets exactly at 2027-02-01T00:00 local (UTC in winter):
/// denied a microsecond before, with a retry time to the boundary, admitted on it; the new
/// period's reset is February's end.
pub async fn calendar_month_resets_at_its_boundary<S: Store>(store: &S) {
    let policy = calendar_policy("cal-month", 3, CalendarUnit::Month, "Europe/Lisbon");
    let key = unique("cal-month-key");
    let key = key.as_bytes();
    let boundary = utc(2027, 2, 1, 0, 0, 0);
    let before = utc(2027, 1, 31, 23, 59, 59);
    for left in (0..3).rev() {
        let d = one(store, before, &policy, key, 1).await;
        assert!(d.allowed, "{d:?}");
        assert_eq!(d.remaining, left);
        assert_eq!(d.reset, Duration::from_secs(1));
    }
    let denied = one(store, before, &policy, key, 1).await;
    assert!(!denied.allowed, "{denied:?}");
    assert_eq!(denied.retry_after, Some(Duration::from_secs(1)));
    let last = Timestamp::from_micros(boundary.as_micros() - 1);
    let still = one(store, last, &policy, key, 1).await;
    assert!(!still.allowed, "a microsecond early: {still:?}");
    assert_eq!(still.retry_after, Some(MICRO));
    let d = one(store, boundary, &policy, key, 1).await;
    assert!(d.allowed, "on the boundary: {d:?}");
    assert_eq!(d.remaining, 2);
    // February 2027 has 28 days.
    assert_eq!(d.reset, Duration::from_secs(28 * 86_400));
}

/// A daily quota in Europe/Lisbon on 2027-03-28, a 23-hour day (clocks go forward at 01:00
/// UTC): the day's count holds across the change and resets at 23:00 UTC, local midnight.
pub async fn calendar_day_spans_a_23_hour_day<S: Store>(store: &S) {
    let policy = calendar_policy("cal-day", 2, CalendarUnit::Day, "Europe/Lisbon");
    let key = unique("cal-day-key");
    let key = key.as_bytes();
    let start = utc(2027, 3, 28, 0, 0, 0);
    let d = one(store, start, &policy, key, 1).await;
    assert_eq!(d.reset, Duration::from_secs(23 * 3_600), "{d:?}");
    let after_change = utc(2027, 3, 28, 1, 30, 0);
    assert!(one(store, after_change, &policy, key, 1).await.allowed);
    let late = utc(2027, 3, 28, 22, 59, 59);
    let denied = one(store, late, &policy, key, 1).await;
    assert!(!denied.allowed, "{denied:?}");
    assert_eq!(denied.retry_after, Some(Duration::from_secs(1)));
    let midnight = utc(2027, 3, 28, 23, 0, 0);
    let d = one(store, midnight, &policy, key, 1).await;
    assert!(d.allowed, "local midnight: {d:?}");
    assert_eq!(d.remaining, 1);
    assert_eq!(d.reset, Duration::from_secs(24 * 3_600));
}

/// A calendar policy checked with a fixed-window one in one request is all-or-nothing, charges
/// land in the period, and a refund gives back within it.
pub async fn calendar_all_or_nothing_charge_and_refund<S: Store>(store: &S) {
    let monthly = calendar_policy("cal-multi-m", 4, CalendarUnit::Month, "America/New_York");
    let tight = Policy::new(
        &unique("cal-multi-f"),
        Quota::fixed_window(2, Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let key = unique("cal-multi-key");
    let key = key.as_bytes();
    // 2027-02-01T04:59:59Z is still January in New York.
    let now = utc(2027, 2, 1, 4, 59, 0);
    let both = [Check::new(&monthly, key, 1), Check::new(&tight, key, 1)];
    for _ in 0..2 {
        assert!(
            (&apply(store, now, &both).await)
                .into_iter()
                .all(|d| d.allowed)
        );
    }
    let third = apply(store, now, &both).await;
    assert!(!(&third).into_iter().all(|d| d.allowed));
    // The monthly count took 2, not 3.
    let peek = one(store, now, &monthly, key, 0).await;
    assert_eq!(peek.remaining, 2, "{peek:?}");
    assert_eq!(peek.reset, Duration::from_secs(60));
    if let Err(e) = store.charge(now, &[Check::new(&monthly, key, 2)]).await {
        panic!("store failed: {e}");
    }
    assert!(!one(store, now, &monthly, key, 1).await.allowed);
    if let Err(e) = store.refund(now, &[Check::new(&monthly, key, 1)]).await {
        panic!("store failed: {e}");
    }
    let d = one(store, now, &monthly, key, 1).await;
    assert!(d.allowed, "refunded: {d:?}");
    // February starts at 05:00 UTC in New York.
    let february = utc(2027, 2, 1, 5, 0, 0);
    let d = one(store, february, &monthly, key, 4).await;
    assert!(d.allowed, "{d:?}");
}

/// Random traffic across day, week, month and year boundaries (DST days in Lisbon, a leap
/// February) decides exactly as the pure algorithm does, field by field.
pub async fn calendar_matches_the_pure_algorithm<S: Store>(store: &S) {
    let cases = [
        (
            CalendarUnit::Day,
            "Europe/Lisbon",
            utc(2027, 3, 27, 20, 0, 0),
        ),
        (
            CalendarUnit::Day,
            "Europe/Lisbon",
            utc(2027, 10, 30, 20, 0, 0),
        ),
        (
            CalendarUnit::Week,
            "Asia/Kolkata",
            utc(2027, 1, 31, 16, 0, 0),
        ),
        (
            CalendarUnit::Month,
            "Europe/Lisbon",
            utc(2028, 2, 28, 0, 0, 0),
        ),
        (
            CalendarUnit::Year,
            "Pacific/Auckland",
            utc(2026, 12, 31, 8, 0, 0),
        ),
    ];
    for (n, (unit, zone, start)) in cases.into_iter().enumerate() {
        let policy = calendar_policy(&format!("cal-model-{n}"), 6, unit, zone);
        let Quota::FixedWindow(alg) = policy.quota().clone() else {
            panic!("a calendar policy is a fixed window");
        };
        let mut model: HashMap<u8, <FixedWindow as Algorithm>::State> = HashMap::new();
        let mut rng = Xorshift(0x7f4a_7c15_9e37_79b9 ^ n as u64);
        let mut now = start;
        let started = Instant::now();
        let prefix = unique("cal-model-key");
        for step in 0..150 {
            // Gaps of up to 3 hours (a day passes in about 20 steps), or up to 8 days.
            let gap = match rng.below(10) {
                0..=3 => 0,
                4..=8 => rng.below(3 * 3_600_000_000),
                _ => rng.below(8 * 86_400_000_000),
            };
            now = not_behind(
                now.saturating_add(Duration::from_micros(gap)),
                start,
                started,
            );
            let key = rng.below(2) as u8;
            let cost = rng.below(4) as u32;
            let stored = format!("{prefix}-{key}");
            let got = one(store, now, &policy, stored.as_bytes(), cost).await;
            let want = alg
                .check(model.entry(key).or_default(), now, cost)
                .into_decision(policy.shared_name());
            assert_eq!(
                got, want,
                "{unit} in {zone}, step {step} at {now} cost {cost}"
            );
        }
    }
}
