//! Quotas: how much a key may do, in the notation of the configuration (`"100/1m"`, `"10/s"`,
//! `"250ms"`), parsed once into types that cannot hold an invalid value.

use std::fmt;
use std::num::NonZeroU32;
use std::str::FromStr;
use std::time::Duration;

use crate::algorithm::{
    Concurrency, FixedWindow, LeakyBucket, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};
use crate::error::QuotaError;

/// The longest window or refill period a quota accepts: 400 days.
///
/// The bound keeps every product the algorithms compute (limit × window in microseconds,
/// capacity × refill interval) inside the range where the Redis scripts' doubles are exact.
pub const MAX_PERIOD: Duration = Duration::from_secs(400 * 86_400);

/// Parses a duration of the configuration: a whole number followed by `us` (or `µs`), `ms`,
/// `s`, `m`, `h` or `d` (`"250ms"`, `"1s"`, `"5m"`, `"1h"`, `"1d"`), or several such parts
/// (`"1h30m"`).
///
/// Microseconds are read because they are the store's resolution, and so what
/// [`format_duration`] writes for a duration that is no whole number of milliseconds: every
/// duration it formats reads back here.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(tollgate::parse_duration("1m")?, Duration::from_secs(60));
/// assert_eq!(tollgate::parse_duration("1h30m")?, Duration::from_secs(5400));
/// assert_eq!(tollgate::parse_duration("1500us")?, Duration::from_micros(1500));
/// assert!(tollgate::parse_duration("10 parsecs").is_err());
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
pub fn parse_duration(input: &str) -> Result<Duration, QuotaError> {
    let err = |reason: &str| QuotaError::new(input, reason);
    let text = input.trim();
    if text.is_empty() {
        return Err(err(
            "empty duration; write a number and a unit, like \"500ms\", \"1s\", \"5m\", \"1h\" or \"1d\"",
        ));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(err(
                "expected a whole number before the unit, like \"500ms\" or \"5m\"",
            ));
        }
        let number: u64 = rest[..digits]
            .parse()
            .map_err(|_| err("number too large"))?;
        rest = &rest[digits..];
        if rest.starts_with(['.', ',']) {
            return Err(err(
                "use whole numbers in a smaller unit: \"1500ms\" rather than \"1.5s\"",
            ));
        }
        // The unit: ASCII letters, or the micro sign (U+00B5, or the Greek mu U+03BC that some
        // keyboards give for it) of "µs". Measured in bytes, so the slices stay on char
        // boundaries.
        let unit_len = rest
            .char_indices()
            .find(|&(_, c)| !(c.is_ascii_alphabetic() || c == 'µ' || c == 'μ'))
            .map_or(rest.len(), |(at, _)| at);
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let part = match unit {
            "us" | "µs" | "μs" => Duration::from_micros(number),
            "ms" => Duration::from_millis(number),
            "s" => Duration::from_secs(number),
            "m" => Duration::from_secs(number.saturating_mul(60)),
            "h" => Duration::from_secs(number.saturating_mul(3_600)),
            "d" => Duration::from_secs(number.saturating_mul(86_400)),
            "" => {
                return Err(err(
                    "missing unit; write \"us\", \"ms\", \"s\", \"m\", \"h\" or \"d\" after the number",
                ));
            }
            _ => {
                return Err(err(
                    "unknown unit; use \"us\", \"ms\", \"s\", \"m\", \"h\" or \"d\"",
                ));
            }
        };
        total = total.saturating_add(part);
    }
    Ok(total)
}

/// Formats a duration in the configuration notation, choosing the largest exact unit: what
/// [`parse_duration`] reads back, to the microsecond (the store's resolution: a fraction of a
/// microsecond is dropped, and a duration past `u64::MAX` microseconds is written as that).
///
/// ```
/// use std::time::Duration;
/// assert_eq!(tollgate::format_duration(Duration::from_secs(5400)), "90m");
/// assert_eq!(tollgate::format_duration(Duration::from_nanos(1500)), "1us");
/// assert_eq!(tollgate::parse_duration("1us")?, Duration::from_micros(1));
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
pub fn format_duration(d: Duration) -> String {
    let micros = crate::clock::duration_micros(d);
    const UNITS: [(u64, &str); 5] = [
        (86_400_000_000, "d"),
        (3_600_000_000, "h"),
        (60_000_000, "m"),
        (1_000_000, "s"),
        (1_000, "ms"),
    ];
    for (size, unit) in UNITS {
        if micros >= size && micros.is_multiple_of(size) {
            return format!("{}{unit}", micros / size);
        }
    }
    format!("{micros}us")
}

/// A count per period: `"100/1m"` (a limit of 100 per minute) or `"10/s"` (a rate of 10 per
/// second; a unit without a number means one of it).
///
/// Both numbers are positive and the period is at most [`MAX_PERIOD`].
///
/// ```
/// use std::time::Duration;
/// let rate: tollgate::Rate = "10/s".parse()?;
/// assert_eq!(rate.count(), 10);
/// assert_eq!(rate.period(), Duration::from_secs(1));
/// assert!("0/s".parse::<tollgate::Rate>().is_err());
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rate {
    count: NonZeroU32,
    period_micros: u64,
}

impl Rate {
    /// `count` per `period`; errors on a zero count, a zero period or a period over
    /// [`MAX_PERIOD`].
    pub fn new(count: u32, period: Duration) -> Result<Self, QuotaError> {
        let text = format!("{count}/{}", format_duration(period));
        let count = NonZeroU32::new(count)
            .ok_or_else(|| QuotaError::new(&text, "count must be at least 1"))?;
        let period_micros = checked_period(&text, period)?;
        Ok(Rate {
            count,
            period_micros,
        })
    }

    /// How many per period.
    pub fn count(&self) -> u32 {
        self.count.get()
    }

    /// The period.
    pub fn period(&self) -> Duration {
        Duration::from_micros(self.period_micros)
    }

    pub(crate) fn period_micros(&self) -> u64 {
        self.period_micros
    }

    /// The time between two units at this rate, in whole microseconds, rounded up so that the
    /// enforced rate never exceeds the configured one. Errors when the rate is faster than one
    /// per microsecond.
    pub(crate) fn interval_micros(&self, input: &str) -> Result<u64, QuotaError> {
        let count = u64::from(self.count.get());
        if count > self.period_micros {
            return Err(QuotaError::new(
                input,
                "rate is faster than one per microsecond; use a smaller count or a longer period",
            ));
        }
        Ok(self.period_micros.div_ceil(count))
    }
}

fn checked_period(input: &str, period: Duration) -> Result<u64, QuotaError> {
    if period.is_zero() {
        return Err(QuotaError::new(input, "period must be longer than zero"));
    }
    if period > MAX_PERIOD {
        return Err(QuotaError::new(input, "period must be at most 400 days"));
    }
    let micros = crate::clock::duration_micros(period);
    if micros == 0 {
        return Err(QuotaError::new(
            input,
            "period must be at least one microsecond",
        ));
    }
    Ok(micros)
}

impl FromStr for Rate {
    type Err = QuotaError;

    fn from_str(input: &str) -> Result<Self, QuotaError> {
        let Some((count, period)) = input.trim().split_once('/') else {
            return Err(QuotaError::new(
                input,
                "expected COUNT/PERIOD, like \"100/1m\" or \"10/s\"",
            ));
        };
        let count: u32 = count.trim().parse().map_err(|_| {
            QuotaError::new(
                input,
                "the count before '/' must be a whole number from 1 to 4294967295",
            )
        })?;
        if count == 0 {
            return Err(QuotaError::new(input, "count must be at least 1"));
        }
        let period = period.trim();
        if period.is_empty() {
            return Err(QuotaError::new(
                input,
                "missing the period after '/'; write it like \"100/1m\" or \"10/s\"",
            ));
        }
        // "10/s" means ten per one second.
        let period = if period.bytes().next().is_some_and(|b| b.is_ascii_digit()) {
            parse_duration(period)
        } else {
            parse_duration(&format!("1{period}"))
        }
        .map_err(|e| QuotaError::new(input, e.reason()))?;
        let period_micros = checked_period(input, period)?;
        Ok(Rate {
            count: NonZeroU32::new(count)
                .ok_or_else(|| QuotaError::new(input, "count must be at least 1"))?,
            period_micros,
        })
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.count, format_duration(self.period()))
    }
}

/// The name of an algorithm, as written in the configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AlgorithmKind {
    /// `fixed_window`
    FixedWindow,
    /// `sliding_window_log`
    SlidingWindowLog,
    /// `sliding_window_counter`
    SlidingWindowCounter,
    /// `token_bucket`
    TokenBucket,
    /// `leaky_bucket`
    LeakyBucket,
    /// `concurrency`: requests in flight, not requests per time.
    Concurrency,
}

impl AlgorithmKind {
    /// Every algorithm, in the order of the specification.
    pub const ALL: [AlgorithmKind; 6] = [
        AlgorithmKind::FixedWindow,
        AlgorithmKind::SlidingWindowLog,
        AlgorithmKind::SlidingWindowCounter,
        AlgorithmKind::TokenBucket,
        AlgorithmKind::LeakyBucket,
        AlgorithmKind::Concurrency,
    ];

    /// The configuration name (`"sliding_window_counter"`).
    pub fn as_str(self) -> &'static str {
        match self {
            AlgorithmKind::FixedWindow => "fixed_window",
            AlgorithmKind::SlidingWindowLog => "sliding_window_log",
            AlgorithmKind::SlidingWindowCounter => "sliding_window_counter",
            AlgorithmKind::TokenBucket => "token_bucket",
            AlgorithmKind::LeakyBucket => "leaky_bucket",
            AlgorithmKind::Concurrency => "concurrency",
        }
    }
}

impl fmt::Display for AlgorithmKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AlgorithmKind {
    type Err = QuotaError;

    fn from_str(s: &str) -> Result<Self, QuotaError> {
        AlgorithmKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                QuotaError::new(
                    s,
                    "unknown algorithm; use fixed_window, sliding_window_log, \
                     sliding_window_counter, token_bucket, leaky_bucket or concurrency",
                )
            })
    }
}

/// A validated quota: one algorithm with its parameters.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Quota {
    /// Count per window aligned to the epoch; up to 2× the limit across a boundary.
    FixedWindow(FixedWindow),
    /// Exact sliding window; memory grows with the limit.
    SlidingWindowLog(SlidingWindowLog),
    /// Two counters, the previous one weighted; the recommended default.
    SlidingWindowCounter(SlidingWindowCounter),
    /// Bursts up to a capacity, then a steady refill.
    TokenBucket(TokenBucket),
    /// Constant outflow; requests queue for their slot.
    LeakyBucket(LeakyBucket),
    /// At most N requests in flight per key: a permit taken on admission, given back when the
    /// request ends, taken back after a TTL if it never is.
    Concurrency(Concurrency),
}

impl Quota {
    /// `limit` per `window`, counted in windows aligned to the Unix epoch.
    pub fn fixed_window(limit: u32, window: Duration) -> Result<Self, QuotaError> {
        FixedWindow::new(limit, window).map(Quota::FixedWindow)
    }

    /// `limit` per period of `calendar` (a day, week, month or year in a time zone).
    pub fn fixed_calendar(limit: u32, calendar: crate::Calendar) -> Result<Self, QuotaError> {
        FixedWindow::with_calendar(limit, calendar).map(Quota::FixedWindow)
    }

    /// At most `limit` in any sliding `window`, exactly.
    pub fn sliding_window_log(limit: u32, window: Duration) -> Result<Self, QuotaError> {
        SlidingWindowLog::new(limit, window).map(Quota::SlidingWindowLog)
    }

    /// `limit` per sliding `window`, estimated from two counters.
    pub fn sliding_window_counter(limit: u32, window: Duration) -> Result<Self, QuotaError> {
        SlidingWindowCounter::new(limit, window).map(Quota::SlidingWindowCounter)
    }

    /// Bursts up to `capacity`, refilled at `refill`.
    pub fn token_bucket(capacity: u32, refill: Rate) -> Result<Self, QuotaError> {
        TokenBucket::new(capacity, refill).map(Quota::TokenBucket)
    }

    /// Departures at `rate`, with at most `queue` requests waiting for their slot.
    pub fn leaky_bucket(rate: Rate, queue: u32) -> Result<Self, QuotaError> {
        LeakyBucket::new(rate, queue).map(Quota::LeakyBucket)
    }

    /// At most `limit` (at least 1) requests in flight per key; a permit not given back is
    /// taken back `lease_ttl` (above zero, at most [`MAX_PERIOD`]) after it was taken.
    pub fn concurrency(limit: u32, lease_ttl: Duration) -> Result<Self, QuotaError> {
        Concurrency::new(limit, lease_ttl).map(Quota::Concurrency)
    }

    /// Which algorithm this is.
    pub fn kind(&self) -> AlgorithmKind {
        match self {
            Quota::FixedWindow(_) => AlgorithmKind::FixedWindow,
            Quota::SlidingWindowLog(_) => AlgorithmKind::SlidingWindowLog,
            Quota::SlidingWindowCounter(_) => AlgorithmKind::SlidingWindowCounter,
            Quota::TokenBucket(_) => AlgorithmKind::TokenBucket,
            Quota::LeakyBucket(_) => AlgorithmKind::LeakyBucket,
            Quota::Concurrency(_) => AlgorithmKind::Concurrency,
        }
    }

    /// The quota as headers advertise it: `q`, the most a key can spend at once (for
    /// concurrency, the most requests in flight).
    pub fn limit(&self) -> u32 {
        match self {
            Quota::FixedWindow(a) => a.limit(),
            Quota::SlidingWindowLog(a) => a.limit(),
            Quota::SlidingWindowCounter(a) => a.limit(),
            Quota::TokenBucket(a) => a.capacity(),
            Quota::LeakyBucket(a) => a.burst(),
            Quota::Concurrency(a) => a.limit(),
        }
    }

    /// The window as headers advertise it: `w`, the time over which [`limit`](Self::limit)
    /// applies (for the buckets, the time to refill or drain completely; for concurrency, the
    /// permits' `lease_ttl`; for a calendar window, the period's nominal length).
    pub fn window(&self) -> Duration {
        let micros = match self {
            Quota::FixedWindow(a) => a.window_micros(),
            Quota::SlidingWindowLog(a) => a.window_micros(),
            Quota::SlidingWindowCounter(a) => a.window_micros(),
            Quota::TokenBucket(a) => a.interval_micros() * u64::from(a.capacity()),
            Quota::LeakyBucket(a) => a.interval_micros() * u64::from(a.burst()),
            Quota::Concurrency(a) => a.lease_ttl_micros(),
        };
        Duration::from_micros(micros)
    }

    /// The largest cost one request can ever have; a higher cost is refused outright.
    pub fn max_cost(&self) -> u32 {
        self.limit()
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Quota::FixedWindow(a) => match a.calendar() {
                Some(c) => write!(
                    f,
                    "fixed_window limit={} calendar={} timezone={}",
                    a.limit(),
                    c.unit(),
                    c.zone_name()
                ),
                None => write!(
                    f,
                    "fixed_window limit={} window={}",
                    a.limit(),
                    format_duration(Duration::from_micros(a.window_micros()))
                ),
            },
            Quota::SlidingWindowLog(a) => write!(
                f,
                "sliding_window_log limit={} window={}",
                a.limit(),
                format_duration(Duration::from_micros(a.window_micros()))
            ),
            Quota::SlidingWindowCounter(a) => write!(
                f,
                "sliding_window_counter limit={} window={}",
                a.limit(),
                format_duration(Duration::from_micros(a.window_micros()))
            ),
            Quota::TokenBucket(a) => {
                write!(
                    f,
                    "token_bucket capacity={} refill={}",
                    a.capacity(),
                    a.refill()
                )
            }
            Quota::LeakyBucket(a) => {
                write!(f, "leaky_bucket rate={} queue={}", a.rate(), a.queue())?;
                if let Some(d) = a.max_delay() {
                    write!(f, " max_delay={}", format_duration(d))?;
                }
                Ok(())
            }
            Quota::Concurrency(a) => write!(
                f,
                "concurrency limit={} lease_ttl={}",
                a.limit(),
                format_duration(a.lease_ttl())
            ),
        }
    }
}

#[cfg(test)]
mod tests;
