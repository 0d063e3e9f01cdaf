//! The text of the rate-limit response headers (`X-RateLimit-*`, IETF `RateLimit`), as pure functions over [`Decision`]s
//! and [`Quota`]s, so that every way into Tollgate (the tower layer, the server, the Envoy rate
//! limit service) writes the same bytes.
//!
//! - `X-RateLimit-Limit`, `X-RateLimit-Remaining`: plain integers ([`write_u64`]);
//!   `X-RateLimit-Reset`: [`reset_epoch_secs`] (Unix seconds, as GitHub does) or
//!   [`reset_delta_secs`].
//! - The IETF fields of draft-ietf-httpapi-ratelimit-headers-11 (wire format unchanged since
//!   -08): Structured-Field (RFC 8941) lists of items whose bare item is a string, the policy
//!   name, with integer parameters and `;` without spaces. `RateLimit-Policy` lists one
//!   [`write_policy_item`] per matching policy (`"burst";q=100;w=60`), joined by
//!   [`LIST_SEPARATOR`]; `RateLimit` holds one [`write_ratelimit_item`] for the most restrictive
//!   decision (`"burst";r=0;t=12`).
//! - `Retry-After`: [`retry_after_secs`], whole seconds rounded up, never 0 and never earlier
//!   than the `t` that `RateLimit` reports.
//!
//! The functions write into a caller's `String` (no allocation of their own): a caller renders
//! what depends only on a policy (its [`quoted`] name, its policy item) once, and formats only
//! the numbers per request. The "most restrictive" decision is the first in
//! [`cmp_restrictive`] order.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{Decision, Quota, headers};
//!
//! let quota = Quota::fixed_window(100, Duration::from_secs(60)).unwrap();
//! let name = headers::quoted("burst").unwrap();
//! let mut policy = String::new();
//! headers::write_policy_item(&mut policy, &name, &quota);
//! assert_eq!(policy, r#""burst";q=100;w=60"#);
//!
//! let d = Decision {
//!     policy: "burst",
//!     allowed: false,
//!     limit: 100,
//!     remaining: 0,
//!     reset: Duration::from_millis(11_200),
//!     retry_after: Some(Duration::from_millis(1_500)),
//!     delay: None,
//!     ban: tollgate::BanStatus::None,
//! };
//! let mut field = String::new();
//! headers::write_ratelimit_item(&mut field, &name, &d);
//! assert_eq!(field, r#""burst";r=0;t=2"#);
//! assert_eq!(headers::retry_after_secs(d.retry_after.unwrap(), headers::t_secs(&d)), 2);
//! ```

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::{Decision, Quota, Timestamp};

/// What separates the members of a Structured-Field list (`RateLimit-Policy` with several
/// policies): a comma and one space, as RFC 8941 serializes lists.
pub const LIST_SEPARATOR: &str = ", ";

/// Whole seconds in `d`, rounded up: a client told to wait `ceil` seconds never comes back
/// early, and the draft's `t` and `w` and `Retry-After` are integers.
#[inline]
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// `X-RateLimit-Reset` as seconds from now: when the quota is fully available again, rounded
/// up.
#[inline]
pub fn reset_delta_secs(d: &Decision) -> u64 {
    ceil_secs(d.reset)
}

/// `X-RateLimit-Reset` as Unix epoch seconds (the default, as GitHub writes it): `now` plus the
/// time until the quota is fully available again, rounded up.
#[inline]
pub fn reset_epoch_secs(now: Timestamp, d: &Decision) -> u64 {
    ceil_secs(Duration::from_micros(now.as_micros()).saturating_add(d.reset))
}

/// What `X-RateLimit-Reset` holds. One definition for every way into Tollgate: the tower
/// layer's `[headers]`, the server's configuration and the Envoy rate limit service all use
/// this type, so the three cannot drift apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ResetFormat {
    /// Unix epoch seconds when the quota is fully available again (as GitHub does). The
    /// default.
    #[default]
    Epoch,
    /// Seconds from now.
    Delta,
    /// No `X-RateLimit-Reset` at all: `X-RateLimit-Limit` and `X-RateLimit-Remaining` only, the
    /// two lines `tower_governor` sends (and all many clients read).
    Omitted,
}

impl ResetFormat {
    /// The value of `X-RateLimit-Reset` for decision `d` at `now` ([`reset_epoch_secs`] or
    /// [`reset_delta_secs`]); `None` when the field is [`Omitted`](ResetFormat::Omitted).
    #[inline]
    pub fn reset_secs(self, now: Timestamp, d: &Decision) -> Option<u64> {
        match self {
            ResetFormat::Epoch => Some(reset_epoch_secs(now, d)),
            ResetFormat::Delta => Some(reset_delta_secs(d)),
            ResetFormat::Omitted => None,
        }
    }
}

impl FromStr for ResetFormat {
    type Err = UnknownResetFormat;

    /// `epoch`, `delta` or `none` (surrounding spaces ignored).
    fn from_str(s: &str) -> Result<Self, UnknownResetFormat> {
        match s.trim() {
            "epoch" => Ok(ResetFormat::Epoch),
            "delta" => Ok(ResetFormat::Delta),
            "none" => Ok(ResetFormat::Omitted),
            _ => Err(UnknownResetFormat {
                // Config values can be long or hostile; never echo more than a line of them.
                input: s.chars().take(80).collect(),
            }),
        }
    }
}

impl fmt::Display for ResetFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ResetFormat::Epoch => "epoch",
            ResetFormat::Delta => "delta",
            ResetFormat::Omitted => "none",
        })
    }
}

/// A [`ResetFormat`] name that is none of `epoch`, `delta` and `none`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("use \"epoch\", \"delta\" or \"none\"")]
pub struct UnknownResetFormat {
    input: String,
}

impl UnknownResetFormat {
    /// The rejected text (its first 80 characters).
    pub fn input(&self) -> &str {
        &self.input
    }
}

/// `RateLimit`'s `t` (draft-ietf-httpapi-ratelimit-headers-11 §4.2): seconds until the quota is
/// available again for this request when it was denied (at least 1, so a denial never says
/// "now"), until it is fully reset otherwise. A denial with no `retry_after` (a cost above the
/// quota, which no wait fixes) reports the full reset.
#[inline]
pub fn t_secs(d: &Decision) -> u64 {
    match (d.allowed, d.retry_after) {
        (false, Some(retry)) => ceil_secs(retry).max(1),
        _ => ceil_secs(d.reset),
    }
}

/// `Retry-After` in whole seconds for a wait of `wait` (RFC 9110 §10.2.3): rounded up, never 0
/// (0 would invite an immediate retry that is denied again) and never earlier than
/// `floor_secs`, the `t` the `RateLimit` field of the same response reports, so the two fields
/// never contradict each other.
#[inline]
pub fn retry_after_secs(wait: Duration, floor_secs: u64) -> u64 {
    ceil_secs(wait).max(1).max(floor_secs)
}

/// The wait `Retry-After` reports for a response denied by `denials` (the decisions of the
/// enforcing policies that denied): the latest `retry_after` among them, since the request
/// passes only once every one of them admits it. `None` when one of them can never admit it
/// (a cost above its quota: no `retry_after`) or when there are no denials.
///
/// What a caller does with `None` is its own product decision: the tower layer and the server
/// leave `Retry-After` out (no wait helps), while the Envoy rate limit service writes the full
/// reset of the most restrictive decision, because Envoy's filter always passes a wait on.
pub fn aggregate_retry_after<'d>(
    denials: impl IntoIterator<Item = &'d Decision>,
) -> Option<Duration> {
    let mut latest: Option<Duration> = None;
    for d in denials {
        let wait = d.retry_after?;
        latest = Some(latest.map_or(wait, |l| l.max(wait)));
    }
    latest
}

/// The order in which headers pick the decision they report: a denying decision
/// first, then the lowest `remaining`, ties broken by the latest `reset`. The most restrictive
/// decision compares [`Ordering::Less`]; `iter.min_by(|a, b| cmp_restrictive(a, b))` finds it
/// (as [`Decisions::most_restrictive`](crate::Decisions::most_restrictive) does).
#[inline]
pub fn cmp_restrictive(a: &Decision, b: &Decision) -> Ordering {
    a.allowed
        .cmp(&b.allowed)
        .then(a.remaining.cmp(&b.remaining))
        .then(b.reset.cmp(&a.reset))
}

/// Whether `name` can be written as a Structured-Field string: printable ASCII only
/// (RFC 8941 §3.3.3).
pub fn is_printable_ascii(name: &str) -> bool {
    name.bytes().all(|b| (0x20..=0x7e).contains(&b))
}

/// `name` as a Structured-Field string (RFC 8941 §4.1.6): in double quotes, `"` and `\`
/// escaped with `\`. `None` when `name` holds anything but printable ASCII, which a string
/// cannot carry (see [`is_printable_ascii`]; callers either reject such names or replace the
/// offending characters first).
pub fn quoted(name: &str) -> Option<String> {
    if !is_printable_ascii(name) {
        return None;
    }
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for c in name.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    Some(out)
}

/// Appends one `RateLimit-Policy` item (draft-ietf-httpapi-ratelimit-headers-11 §3):
/// `quoted_name;q=<limit>;w=<window in whole seconds, rounded up>`, e.g.
/// `"burst";q=100;w=60`. For a token bucket `q` is the capacity and `w` the time to refill it
/// fully, as the quota reports them. A concurrency limit has no window: its item is
/// `"exports";q=4` (requests in flight), `w` left out as the draft allows. A fixed window by
/// the calendar advertises its period's nominal length (86400 for a day, 604800 for a week,
/// 2629746 for a month, 31556952 for a year), the same on every response; `t` and the reset
/// fields count to the period's true end. `quoted_name` comes from [`quoted`].
pub fn write_policy_item(out: &mut String, quoted_name: &str, quota: &Quota) {
    out.push_str(quoted_name);
    out.push_str(";q=");
    write_u64(out, u64::from(quota.limit()));
    if let Quota::Concurrency(_) = quota {
        return;
    }
    out.push_str(";w=");
    write_u64(out, ceil_secs(quota.window()));
}

/// Appends the `RateLimit` item (draft-ietf-httpapi-ratelimit-headers-11 §4) for decision `d`
/// of the policy whose [`quoted`] name is `quoted_name`: `quoted_name;r=<remaining>;t=<t>`,
/// e.g. `"burst";r=0;t=12`, with `t` from [`t_secs`].
pub fn write_ratelimit_item(out: &mut String, quoted_name: &str, d: &Decision) {
    out.push_str(quoted_name);
    out.push_str(";r=");
    write_u64(out, d.remaining);
    out.push_str(";t=");
    write_u64(out, t_secs(d));
}

/// Appends `n` in decimal, without going through `fmt` (this runs several times per response).
pub fn write_u64(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// Appends `n` in decimal to a byte buffer: for writers of bytes rather than `String`s (the
/// server's relay writes heads into byte buffers).
pub fn write_decimal(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn decision(allowed: bool, remaining: u64, reset_ms: u64, retry_ms: Option<u64>) -> Decision {
        Decision {
            policy: "p",
            allowed,
            limit: 10,
            remaining,
            reset: Duration::from_millis(reset_ms),
            retry_after: retry_ms.map(Duration::from_millis),
            delay: None,
            ban: crate::BanStatus::None,
        }
    }

    #[test]
    fn numbers_are_decimal() {
        for n in [0, 1, 9, 10, 99, 100, 4242, 1_700_000_000, u64::MAX] {
            let mut s = String::from("x");
            write_u64(&mut s, n);
            assert_eq!(s, format!("x{n}"));
            let mut b = b"x".to_vec();
            write_decimal(&mut b, n);
            assert_eq!(b, format!("x{n}").into_bytes());
        }
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_nanos(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2001)), 3);
        let d = decision(true, 3, 59_001, None);
        assert_eq!(reset_delta_secs(&d), 60);
        assert_eq!(
            reset_epoch_secs(Timestamp::from_millis(1_000_500), &d),
            1_060
        );
        assert_eq!(reset_epoch_secs(Timestamp::from_secs(1_000), &d), 1_060);
    }

    #[test]
    fn retry_after_is_never_zero_nor_before_t() {
        assert_eq!(retry_after_secs(Duration::ZERO, 0), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1), 0), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1500), 0), 2);
        assert_eq!(retry_after_secs(Duration::from_millis(1500), 7), 7);
    }

    #[test]
    fn t_follows_the_verdict() {
        // Denied: until this request would pass, at least 1.
        assert_eq!(t_secs(&decision(false, 0, 30_000, Some(1))), 1);
        assert_eq!(t_secs(&decision(false, 0, 30_000, Some(2_500))), 3);
        // Denied for good, or allowed: the full reset.
        assert_eq!(t_secs(&decision(false, 0, 30_000, None)), 30);
        assert_eq!(t_secs(&decision(true, 4, 12_001, None)), 13);
    }

    #[test]
    fn reset_formats_round_trip_and_render() {
        for (text, format) in [
            ("epoch", ResetFormat::Epoch),
            ("delta", ResetFormat::Delta),
            ("none", ResetFormat::Omitted),
        ] {
            assert_eq!(text.parse::<ResetFormat>().unwrap(), format);
            assert_eq!(format.to_string(), text);
        }
        let err = "utc".parse::<ResetFormat>().unwrap_err();
        assert_eq!(err.input(), "utc");
        assert_eq!(err.to_string(), r#"use "epoch", "delta" or "none""#);
        let d = decision(true, 3, 59_001, None);
        let now = Timestamp::from_secs(1_000);
        assert_eq!(ResetFormat::Epoch.reset_secs(now, &d), Some(1_060));
        assert_eq!(ResetFormat::Delta.reset_secs(now, &d), Some(60));
        assert_eq!(ResetFormat::Omitted.reset_secs(now, &d), None);
    }

    #[test]
    fn retry_after_waits_for_the_latest_denial() {
        let soon = decision(false, 0, 9_000, Some(1_000));
        let later = decision(false, 0, 9_000, Some(4_000));
        let never = decision(false, 0, 9_000, None);
        assert_eq!(
            aggregate_retry_after([&soon, &later]),
            Some(Duration::from_secs(4))
        );
        assert_eq!(aggregate_retry_after([&soon, &never, &later]), None);
        assert_eq!(aggregate_retry_after([]), None);
    }

    #[test]
    fn restrictive_order_is_denied_then_lowest_remaining_then_latest_reset() {
        let denied = decision(false, 5, 1_000, Some(10));
        let low = decision(true, 1, 1_000, None);
        let low_later = decision(true, 1, 9_000, None);
        let high = decision(true, 8, 1_000, None);
        assert_eq!(cmp_restrictive(&denied, &low), Ordering::Less);
        assert_eq!(cmp_restrictive(&low, &high), Ordering::Less);
        assert_eq!(cmp_restrictive(&low_later, &low), Ordering::Less);
        let all = [high, low, low_later, denied];
        let worst = all.iter().min_by(|a, b| cmp_restrictive(a, b)).unwrap();
        assert_eq!(*worst, denied);
    }

    #[test]
    fn names_are_structured_field_strings() {
        assert_eq!(quoted("api").as_deref(), Some("\"api\""));
        assert_eq!(quoted("a\"b\\c").as_deref(), Some(r#""a\"b\\c""#));
        assert_eq!(quoted("").as_deref(), Some("\"\""));
        assert_eq!(quoted("tab\there"), None);
        assert_eq!(quoted("é"), None);
        assert!(is_printable_ascii(" ~"));
        assert!(!is_printable_ascii("\u{7f}"));
    }

    #[test]
    fn items_match_the_draft_examples() {
        let name = quoted("daily").unwrap();
        let quota = Quota::fixed_window(5000, Duration::from_secs(86_400)).unwrap();
        let mut policy = String::from(r#""burst";q=100;w=60"#);
        policy.push_str(LIST_SEPARATOR);
        write_policy_item(&mut policy, &name, &quota);
        assert_eq!(policy, r#""burst";q=100;w=60, "daily";q=5000;w=86400"#);
        // A window that is not whole seconds rounds up.
        let odd = Quota::fixed_window(3, Duration::from_millis(1500)).unwrap();
        let mut s = String::new();
        write_policy_item(&mut s, &name, &odd);
        assert_eq!(s, r#""daily";q=3;w=2"#);
        let mut field = String::new();
        write_ratelimit_item(&mut field, &name, &decision(true, 100, 36_000_000, None));
        assert_eq!(field, r#""daily";r=100;t=36000"#);
        // A calendar period advertises its nominal length.
        let monthly = crate::Calendar::new(crate::CalendarUnit::Month, "Europe/Lisbon").unwrap();
        let monthly = Quota::fixed_calendar(10_000, monthly).unwrap();
        let mut s = String::new();
        write_policy_item(&mut s, &quoted("monthly").unwrap(), &monthly);
        assert_eq!(s, r#""monthly";q=10000;w=2629746"#);
    }
}
