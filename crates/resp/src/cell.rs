//! redis-cell's arithmetic, reproduced: how `CL.THROTTLE` reads its numbers, derives its
//! emission interval, and turns a GCRA outcome into its five integers.
//!
//! Tollgate's token bucket decides (the state lives in Tollgate's store); this module only
//! makes the answer read as redis-cell's, where the two round differently:
//!
//! - redis-cell's interval is `period × 10⁹ / count` nanoseconds in `f64`, truncated; Tollgate
//!   counts whole microseconds, so the bucket's interval is that rounded up to a microsecond
//!   (equal to redis-cell's whenever it is a whole number of microseconds, as for `30 per 60`,
//!   `100 per 1` or `1000 per 3600`; otherwise never faster than it).
//! - `remaining` is the microseconds left under the tolerance divided by the interval's, in
//!   `f64`, truncated.
//! - The two times are seconds truncated from `f64`, plus one when a whole millisecond remains
//!   (so 2.0005 s reads 2 and 2.001 s reads 3), and `-1` for a retry that does not apply.
//!
//! `tests/cell_reference.rs` holds the whole command to a model of redis-cell's algorithm.

/// The usage error, as redis-cell words it (its errors read `Cell error: Store error: ...`).
pub(crate) const USAGE: &str = "Cell error: Store error: Usage: cl.throttle <key> <max_burst> \
                                <count per period> <period> [<quantity>]";

/// The error for a rate of zero, or one under a nanosecond per unit, as redis-cell words it.
pub(crate) const ZERO_RATE: &str = "Cell error: Store error: Zero rates are not supported";

/// What `CL.THROTTLE` answers: five integers, in this order on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CellReply {
    /// Whether the request was refused (1 on the wire) or admitted (0).
    pub limited: bool,
    /// The total limit: `max_burst + 1`.
    pub limit: i64,
    /// What the key can still spend now.
    pub remaining: i64,
    /// Seconds until this request would be admitted, or `-1`: when admitted, and when it can
    /// never be (a quantity over the limit).
    pub retry_after: i64,
    /// Seconds until the key's quota is fully available again.
    pub reset_after: i64,
}

impl CellReply {
    /// The five integers in wire order.
    pub fn to_array(self) -> [i64; 5] {
        [
            i64::from(self.limited),
            self.limit,
            self.remaining,
            self.retry_after,
            self.reset_after,
        ]
    }
}

/// Reads an integer argument as redis-cell does (Rust's `i64::from_str`): an optional `+` or
/// `-`, then at least one ASCII digit, within `i64`; leading zeros allowed.
pub(crate) fn parse_i64(arg: &[u8]) -> Option<i64> {
    let (negative, digits) = match arg.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        _ => (false, arg),
    };
    if digits.is_empty() {
        return None;
    }
    crate::codec::decimal(digits, negative)
}

/// redis-cell's error for an argument that is no integer (its text as sent, lossily).
pub(crate) fn not_an_integer(arg: &[u8]) -> String {
    format!(
        "Cell error: Store error: Couldn't parse as integer: {}",
        String::from_utf8_lossy(arg)
    )
}

/// redis-cell's emission interval for `count` per `period` seconds, in nanoseconds:
/// `period × 10⁹ / count` computed in `f64` and truncated (saturating), or 0 for a zero count
/// or period. Zero (also for a rate faster than one per nanosecond) is what redis-cell refuses
/// as a zero rate; a negative interval comes from a count and a period of opposite signs.
pub fn emission_interval_ns(count: i64, period_secs: i64) -> i64 {
    let ns = i128::from(period_secs) * 1_000_000_000;
    if count == 0 || ns == 0 {
        return 0;
    }
    // As redis-cell: both operands rounded to `f64`, the quotient truncated toward zero (an
    // `as` cast saturates and takes NaN to 0).
    (ns as f64 / count as f64) as i64
}

/// The reply for a GCRA outcome, all times in nanoseconds: the total `limit`, the bucket's
/// emission `interval_ns`, whether the request was `limited`, `ttl_ns` (the time until the
/// key's state is spent: after this request when admitted, as it stands when refused) and,
/// when refused, `retry_ns`, the wait until it would be admitted (`None` when it never can be).
pub fn reply(
    limit: i64,
    interval_ns: i64,
    limited: bool,
    ttl_ns: i64,
    retry_ns: Option<i64>,
) -> CellReply {
    CellReply {
        limited,
        limit,
        remaining: remaining(limit, interval_ns, ttl_ns),
        retry_after: match (limited, retry_ns) {
            (true, Some(retry)) => seconds(retry),
            _ => -1,
        },
        reset_after: seconds(ttl_ns),
    }
}

/// What is left under the tolerance (`interval × limit`) once `ttl_ns` of it is spent, in
/// units: both in whole microseconds (truncated), divided in `f64`, truncated.
fn remaining(limit: i64, interval_ns: i64, ttl_ns: i64) -> i64 {
    // In i64 whenever it fits, which Tollgate's quotas always do (a bucket spans at most a
    // hundred years); `i128` arithmetic goes through slow library calls.
    let left = interval_ns
        .checked_mul(limit)
        .and_then(|tolerance| tolerance.checked_sub(ttl_ns));
    match left {
        Some(left) if left > -interval_ns => {
            ((left / 1_000) as f64 / (interval_ns / 1_000) as f64) as i64
        }
        Some(_) => 0,
        None => {
            let left = i128::from(interval_ns) * i128::from(limit) - i128::from(ttl_ns);
            if left > -i128::from(interval_ns) {
                ((left / 1_000) as f64 / (interval_ns / 1_000) as f64) as i64
            } else {
                0
            }
        }
    }
}

/// A span of nanoseconds in seconds as redis-cell reports it: the seconds of the span in
/// `f64`, truncated toward zero, plus one when the fraction holds a whole millisecond.
pub fn seconds(ns: i64) -> i64 {
    let whole = ns / 1_000_000_000;
    let fraction = ns % 1_000_000_000;
    let truncated = (whole as f64 + fraction as f64 / 1e9) as i64;
    if fraction / 1_000_000 > 0 {
        truncated.saturating_add(1)
    } else {
        truncated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_read_as_rust_reads_them() {
        for (s, n) in [
            ("0", Some(0)),
            ("+5", Some(5)),
            ("-5", Some(-5)),
            ("-0", Some(0)),
            ("007", Some(7)),
            ("9223372036854775807", Some(i64::MAX)),
            ("-9223372036854775808", Some(i64::MIN)),
            ("9223372036854775808", None),
            ("", None),
            ("+", None),
            ("-", None),
            ("+-1", None),
            (" 1", None),
            ("1.5", None),
            ("1e3", None),
        ] {
            assert_eq!(parse_i64(s.as_bytes()), n, "{s:?}");
            assert_eq!(parse_i64(s.as_bytes()), s.parse::<i64>().ok(), "{s:?}");
        }
    }

    #[test]
    fn intervals_truncate_like_redis_cell() {
        assert_eq!(emission_interval_ns(30, 60), 2_000_000_000);
        assert_eq!(emission_interval_ns(3, 1), 333_333_333);
        assert_eq!(emission_interval_ns(0, 60), 0);
        assert_eq!(emission_interval_ns(5, 0), 0);
        assert_eq!(emission_interval_ns(2_000_000_000, 1), 0);
        assert_eq!(emission_interval_ns(-1, -60), 60_000_000_000);
        assert_eq!(emission_interval_ns(-1, 60), -60_000_000_000);
        assert_eq!(emission_interval_ns(1, i64::MAX), i64::MAX);
    }

    #[test]
    fn seconds_round_up_from_a_whole_millisecond() {
        let s = 1_000_000_000;
        assert_eq!(seconds(0), 0);
        assert_eq!(seconds(2 * s), 2);
        assert_eq!(seconds(2 * s + 500_000), 2);
        assert_eq!(seconds(2 * s + 1_000_000), 3);
        assert_eq!(seconds(999_999), 0);
        assert_eq!(seconds(-1_500_000), 0);
        assert_eq!(seconds(-2 * s), -2);
    }

    #[test]
    fn remaining_agrees_in_both_widths() {
        for (limit, interval, ttl) in [
            (5, 200_000_000, 200_000_000),
            (i64::MAX, 3, 7),
            (1 << 40, 1 << 30, -5),
            (10, 1_500, 2_999),
            (1, 999, 0),
            (2, 1_000, 4_000),
        ] {
            let left = i128::from(interval) * i128::from(limit) - i128::from(ttl);
            let wide = if left > -i128::from(interval) {
                ((left / 1_000) as f64 / (interval / 1_000) as f64) as i64
            } else {
                0
            };
            assert_eq!(
                remaining(limit, interval, ttl),
                wide,
                "{limit} {interval} {ttl}"
            );
        }
    }

    #[test]
    fn replies_count_in_whole_microseconds() {
        // 5 per second with a burst of 4 (limit 5), fresh key, one unit taken.
        let r = reply(5, 200_000_000, false, 200_000_000, None);
        assert_eq!(r.to_array(), [0, 5, 4, -1, 1]);
        // Refused: a retry in 0.2 s reads 1 second.
        let r = reply(5, 200_000_000, true, 1_000_000_000, Some(200_000_000));
        assert_eq!(r.to_array(), [1, 5, 0, 1, 1]);
        // More than the limit: no retry.
        let r = reply(5, 200_000_000, true, 0, None);
        assert_eq!(r.to_array(), [1, 5, 5, -1, 0]);
    }
}
