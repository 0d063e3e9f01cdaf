//! Calendar windows through the real server: `tollgate serve` runs under libfaketime from a
//! chosen date (its clock then runs on at the real pace), and `/v1/check` answers say which
//! period each decision counted in: `X-RateLimit-Reset` (Unix seconds) is the period's end.
//!
//! The header is rendered a moment after the decision, so it may read one second past a
//! period's end that falls on a whole second; the assertions allow that second and no other.

mod serve_support;

use serve_support::{Answer, Server, dir};

/// 2027-02-01T00:00:00Z: February starts in Lisbon (UTC+0 in winter).
const FEB_1: u64 = 1_801_440_000;
/// 2027-03-01T00:00:00Z.
const MAR_1: u64 = 1_803_859_200;
/// 2027-03-28T23:00:00Z: midnight in Lisbon after the 23-hour day (clocks went forward at
/// 01:00 UTC that day).
const MAR_28_END: u64 = 1_806_274_800;
/// 2027-03-29T23:00:00Z: the next day's end.
const MAR_29_END: u64 = 1_806_361_200;

fn policy(name: &str, limit: u32, calendar: &str) -> String {
    format!(
        "[[policy]]\nname = \"{name}\"\nalgorithm = \"fixed_window\"\nlimit = {limit}\n\
         calendar = \"{calendar}\"\ntimezone = \"Europe/Lisbon\"\n"
    )
}

fn reset_of(a: &Answer) -> u64 {
    a.number("x-ratelimit-reset")
}

fn ends_at(a: &Answer, end: u64) -> bool {
    let reset = reset_of(a);
    reset == end || reset == end + 1
}

/// Checks every 20 ms until one is admitted (at most 3,000 tries); the denials before it.
fn denials_until_admitted(server: &Server, policy: &str, key: &str) -> (Vec<Answer>, Answer) {
    let mut denied = Vec::new();
    for _ in 0..3_000 {
        let a = server.check(policy, key, 1);
        if a.status == 200 {
            return (denied, a);
        }
        assert_eq!(a.status, 429, "{a:?}");
        denied.push(a);
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("never admitted again: {:?}", denied.last());
}

#[test]
fn a_monthly_count_resets_at_the_start_of_february_in_lisbon_and_not_a_second_earlier() {
    let d = dir();
    let server = Server::start(
        d.path(),
        &policy("monthly", 3, "month"),
        Some("2027-01-31 23:59:57"),
    );
    for left in (0..3).rev() {
        let a = server.check("monthly", "tenant-1", 1);
        assert_eq!(a.status, 200, "{a:?}");
        assert_eq!(a.number("x-ratelimit-remaining"), left);
        assert!(ends_at(&a, FEB_1), "January ends at {FEB_1}: {a:?}");
        // w is the nominal month.
        assert_eq!(a.headers["ratelimit-policy"], "\"monthly\";q=3;w=2629746");
    }
    let (denied, admitted) = denials_until_admitted(&server, "monthly", "tenant-1");
    assert!(
        !denied.is_empty(),
        "the fourth request was admitted in January"
    );
    for a in &denied {
        assert!(ends_at(a, FEB_1), "a denial counted in January: {a:?}");
        assert!(a.number("retry-after") >= 1, "{a:?}");
    }
    // The last denial came within January's final second: the count did not reset early.
    let last = denied.last().map(|a| a.number("retry-after"));
    assert_eq!(last, Some(1), "{:?}", denied.last());
    assert!(ends_at(&admitted, MAR_1), "February's count: {admitted:?}");
    assert_eq!(admitted.number("x-ratelimit-remaining"), 2);
}

#[test]
fn a_daily_count_spans_lisbons_23_hour_day() {
    let d = dir();
    // 2027-03-28: clocks go from 01:00 to 02:00 (WET to WEST) at 01:00 UTC.
    let server = Server::start(
        d.path(),
        &policy("daily", 2, "day"),
        Some("2027-03-28 00:59:58"),
    );
    for _ in 0..2 {
        let a = server.check("daily", "tenant-1", 1);
        assert_eq!(a.status, 200, "{a:?}");
        assert!(ends_at(&a, MAR_28_END), "the day ends at 23:00 UTC: {a:?}");
    }
    // Past the change (t, the seconds to the reset, below 22 hours) the count still holds.
    let mut after_change = None;
    for _ in 0..3_000 {
        let a = server.check("daily", "tenant-1", 1);
        assert_eq!(a.status, 429, "the count reset at the clock change: {a:?}");
        assert!(ends_at(&a, MAR_28_END), "{a:?}");
        let t: u64 = a.headers["ratelimit"]
            .rsplit("t=")
            .next()
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{a:?}"));
        if t < 22 * 3_600 {
            after_change = Some(a);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        after_change.is_some(),
        "the server's clock never passed 01:00 UTC"
    );

    // At the day's end, 23 hours after it began, the count resets.
    let d = dir();
    let server = Server::start(
        d.path(),
        &policy("daily", 2, "day"),
        Some("2027-03-28 22:59:58"),
    );
    for _ in 0..2 {
        let a = server.check("daily", "tenant-2", 1);
        assert_eq!(a.status, 200, "{a:?}");
        assert!(ends_at(&a, MAR_28_END), "{a:?}");
    }
    let (denied, admitted) = denials_until_admitted(&server, "daily", "tenant-2");
    assert!(denied.iter().all(|a| ends_at(a, MAR_28_END)), "{denied:?}");
    assert!(ends_at(&admitted, MAR_29_END), "the next day: {admitted:?}");
    assert_eq!(admitted.number("x-ratelimit-remaining"), 1);
}
