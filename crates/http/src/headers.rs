//! The rate-limit response headers of SPEC §5: the `X-RateLimit-*` family and the IETF
//! `RateLimit-Policy` / `RateLimit` structured fields, plus `Retry-After`.
//!
//! Everything that depends only on a policy (its quoted name, its `RateLimit-Policy` item) is
//! rendered once when the engine is built; a request only formats its numbers.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderName, HeaderValue};
use tollgate::{Decision, Policy, Timestamp};

use crate::ConfigError;

/// `X-RateLimit-Limit`.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`.
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// What `X-RateLimit-Reset` holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ResetFormat {
    /// Unix epoch seconds when the quota is fully available again (as GitHub does).
    #[default]
    Epoch,
    /// Seconds from now.
    Delta,
}

impl FromStr for ResetFormat {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s.trim() {
            "epoch" => Ok(ResetFormat::Epoch),
            "delta" => Ok(ResetFormat::Delta),
            _ => Err(ConfigError::new(s, "use \"epoch\" or \"delta\"")),
        }
    }
}

/// How `Retry-After` is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RetryAfterFormat {
    /// Whole seconds (rounded up, at least 1).
    #[default]
    Seconds,
    /// An HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`).
    HttpDate,
}

impl FromStr for RetryAfterFormat {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s.trim() {
            "seconds" => Ok(RetryAfterFormat::Seconds),
            "http-date" => Ok(RetryAfterFormat::HttpDate),
            _ => Err(ConfigError::new(s, "use \"seconds\" or \"http-date\"")),
        }
    }
}

/// Which headers responses carry (the `[headers]` section of the config).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HeaderConfig {
    /// `X-RateLimit-Limit/Remaining/Reset` (default on).
    pub legacy: bool,
    /// What `X-RateLimit-Reset` holds (default epoch seconds).
    pub reset_format: ResetFormat,
    /// `RateLimit-Policy` and `RateLimit` (default on).
    pub ietf: bool,
    /// How `Retry-After` is written on a 429 (default seconds).
    pub retry_after_format: RetryAfterFormat,
}

impl Default for HeaderConfig {
    fn default() -> Self {
        HeaderConfig {
            legacy: true,
            reset_format: ResetFormat::Epoch,
            ietf: true,
            retry_after_format: RetryAfterFormat::Seconds,
        }
    }
}

/// A policy's header text, rendered once.
#[derive(Clone, Debug)]
pub(crate) struct PolicyHeaders {
    /// `"name"`: a structured-field string.
    pub(crate) quoted_name: Bytes,
    /// `"name";q=100;w=60`.
    pub(crate) policy_item: Bytes,
    /// The same item as a whole header value, for the common single-policy case.
    pub(crate) policy_value: HeaderValue,
    /// The quota's limit, as `X-RateLimit-Limit` writes it.
    pub(crate) limit: u64,
    /// `limit` as a header value (cloning it is a reference-count update at most).
    pub(crate) limit_value: HeaderValue,
}

impl PolicyHeaders {
    pub(crate) fn new(policy: &Policy) -> Result<Self, ConfigError> {
        let name = policy.name();
        // A structured-field string holds printable ASCII only.
        if !name.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
            return Err(ConfigError::new(
                name,
                "a policy name must be printable ASCII to appear in RateLimit headers",
            ));
        }
        let mut quoted = BytesMut::with_capacity(name.len() + 2);
        quoted.put_u8(b'"');
        for b in name.bytes() {
            if b == b'"' || b == b'\\' {
                quoted.put_u8(b'\\');
            }
            quoted.put_u8(b);
        }
        quoted.put_u8(b'"');
        let quoted_name = quoted.freeze();
        let quota = policy.quota();
        let mut item = BytesMut::with_capacity(quoted_name.len() + 32);
        item.put_slice(&quoted_name);
        item.put_slice(b";q=");
        item.put_slice(itoa::Buffer::new().format(quota.limit()).as_bytes());
        item.put_slice(b";w=");
        item.put_slice(
            itoa::Buffer::new()
                .format(ceil_secs(quota.window()))
                .as_bytes(),
        );
        let policy_item = item.freeze();
        let policy_value = HeaderValue::from_maybe_shared(policy_item.clone())
            .map_err(|_| ConfigError::new(name, "cannot be written as a header value"))?;
        let limit = u64::from(quota.limit());
        Ok(PolicyHeaders {
            quoted_name,
            policy_item,
            policy_value,
            limit,
            limit_value: number(limit),
        })
    }
}

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The headers of one response.
pub(crate) type HeaderList = smallvec::SmallVec<[(HeaderName, HeaderValue); 6]>;

/// The seconds `RateLimit`'s `t` reports for `d`: until the quota is available again for this
/// request when it was denied, until it is fully reset otherwise.
pub(crate) fn t_secs(d: &Decision) -> u64 {
    match (d.allowed, d.retry_after) {
        (false, Some(retry)) => ceil_secs(retry).max(1),
        _ => ceil_secs(d.reset),
    }
}

/// Writes the headers for `decisions` (with their policies' rendered text) into `out`.
pub(crate) fn render(
    config: &HeaderConfig,
    now: Timestamp,
    items: &[(&Decision, &PolicyHeaders)],
    out: &mut HeaderList,
) {
    let Some(&(worst, worst_text)) = most_restrictive(items) else {
        return;
    };
    if config.legacy {
        let reset = match config.reset_format {
            ResetFormat::Delta => ceil_secs(worst.reset),
            ResetFormat::Epoch => {
                ceil_secs(Duration::from_micros(now.as_micros()).saturating_add(worst.reset))
            }
        };
        let limit = if worst.limit == worst_text.limit {
            worst_text.limit_value.clone()
        } else {
            number(worst.limit)
        };
        out.push((X_RATELIMIT_LIMIT, limit));
        out.push((X_RATELIMIT_REMAINING, number(worst.remaining)));
        out.push((X_RATELIMIT_RESET, recent_number(reset)));
    }
    if config.ietf {
        let policy = if let [(_, only)] = items {
            only.policy_value.clone()
        } else {
            let mut joined = BytesMut::with_capacity(items.len() * 32);
            for (i, (_, text)) in items.iter().enumerate() {
                if i > 0 {
                    joined.put_slice(b", ");
                }
                joined.put_slice(&text.policy_item);
            }
            match HeaderValue::from_maybe_shared(joined.freeze()) {
                Ok(v) => v,
                Err(_) => return,
            }
        };
        out.push((RATELIMIT_POLICY, policy));
        // Written on the stack and copied once into an exactly sized value: one allocation
        // per response (a growing Vec would be a second one when frozen).
        let mut buf = smallvec::SmallVec::<[u8; 96]>::new();
        buf.extend_from_slice(&worst_text.quoted_name);
        buf.extend_from_slice(b";r=");
        buf.extend_from_slice(itoa::Buffer::new().format(worst.remaining).as_bytes());
        buf.extend_from_slice(b";t=");
        buf.extend_from_slice(itoa::Buffer::new().format(t_secs(worst)).as_bytes());
        if let Ok(v) = HeaderValue::from_bytes(&buf) {
            out.push((RATELIMIT, v));
        }
    }
}

/// Numbers up to this are rendered once per process: limits, remaining counts and second
/// counts are nearly always small, and a `'static` value costs no allocation.
const CACHED_NUMBERS: usize = 10_000;

/// `n` as a header value.
fn number(n: u64) -> HeaderValue {
    // The digits of 0..=CACHED_NUMBERS in one string leaked once per process (about 50 KB), and
    // where each starts: a value is a slice of it, so taking one copies two words.
    static DIGITS: std::sync::LazyLock<(&'static str, Vec<u32>)> = std::sync::LazyLock::new(|| {
        let mut text = String::new();
        let mut starts = vec![0];
        for n in 0..=CACHED_NUMBERS {
            text.push_str(itoa::Buffer::new().format(n));
            starts.push(u32::try_from(text.len()).unwrap_or(u32::MAX));
        }
        (Box::leak(text.into_boxed_str()), starts)
    });
    if let Some(i) = usize::try_from(n).ok().filter(|&i| i <= CACHED_NUMBERS) {
        let (text, starts) = &*DIGITS;
        if let (Some(&a), Some(&b)) = (starts.get(i), starts.get(i + 1)) {
            if let Some(digits) = text.get(a as usize..b as usize) {
                return HeaderValue::from_static(digits);
            }
        }
    }
    HeaderValue::from(n)
}

/// `n` as a header value, for numbers that repeat from one request to the next (the epoch
/// second of a reset): the last one is kept per thread, so a repeat is a reference-count
/// update rather than an allocation and formatting.
fn recent_number(n: u64) -> HeaderValue {
    thread_local! {
        static LAST: std::cell::RefCell<Option<(u64, HeaderValue)>> =
            const { std::cell::RefCell::new(None) };
    }
    if usize::try_from(n).is_ok_and(|i| i <= CACHED_NUMBERS) {
        return number(n);
    }
    LAST.try_with(|last| {
        let Ok(mut last) = last.try_borrow_mut() else {
            return number(n);
        };
        match &*last {
            Some((m, v)) if *m == n => v.clone(),
            _ => {
                let v = number(n);
                *last = Some((n, v.clone()));
                v
            }
        }
    })
    .unwrap_or_else(|_| number(n))
}

/// The SPEC §5 choice: a denying decision first, then the lowest remaining, ties broken by the
/// latest reset (as [`tollgate::Decisions::most_restrictive`]).
fn most_restrictive<'a, 'b>(
    items: &'a [(&'b Decision, &'b PolicyHeaders)],
) -> Option<&'a (&'b Decision, &'b PolicyHeaders)> {
    items.iter().min_by(|(a, _), (b, _)| {
        a.allowed
            .cmp(&b.allowed)
            .then(a.remaining.cmp(&b.remaining))
            .then(b.reset.cmp(&a.reset))
    })
}

/// The `Retry-After` value for a wait of `wait`: whole seconds rounded up, at least 1, and not
/// earlier than `floor_secs` (the `t` the `RateLimit` field reports).
pub(crate) fn retry_after(
    format: RetryAfterFormat,
    now: Timestamp,
    wait: Duration,
    floor_secs: u64,
) -> (u64, HeaderValue) {
    let secs = ceil_secs(wait).max(1).max(floor_secs);
    let value = match format {
        RetryAfterFormat::Seconds => HeaderValue::from(secs),
        RetryAfterFormat::HttpDate => {
            // Whole seconds after now, rounded up, so the date is never earlier than the wait.
            let at = UNIX_EPOCH
                + Duration::from_secs(ceil_secs(Duration::from_micros(now.as_micros())))
                + Duration::from_secs(secs);
            let text = httpdate::fmt_http_date(at.max(SystemTime::UNIX_EPOCH));
            HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from(secs))
        }
    };
    (secs, value)
}

impl fmt::Display for ResetFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ResetFormat::Epoch => "epoch",
            ResetFormat::Delta => "delta",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_and_uncached_numbers() {
        for n in [
            0,
            1,
            9,
            10,
            99,
            4242,
            9_999,
            10_000,
            1_700_000_000,
            u64::MAX,
        ] {
            assert_eq!(number(n).to_str().ok(), Some(n.to_string().as_str()));
        }
    }

    #[test]
    fn recent_numbers() {
        for n in [
            7,
            1_700_000_000,
            1_700_000_000,
            1_700_000_001,
            10_001,
            u64::MAX,
        ] {
            assert_eq!(recent_number(n).to_str().ok(), Some(n.to_string().as_str()));
        }
    }

    #[test]
    fn rounding_up() {
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2001)), 3);
        let (secs, v) = retry_after(
            RetryAfterFormat::Seconds,
            Timestamp::from_secs(0),
            Duration::ZERO,
            0,
        );
        assert_eq!((secs, v.to_str().ok()), (1, Some("1")));
        let (_, v) = retry_after(
            RetryAfterFormat::HttpDate,
            Timestamp::from_secs(784_111_777),
            Duration::from_millis(1),
            0,
        );
        assert_eq!(v.to_str().ok(), Some("Sun, 06 Nov 1994 08:49:38 GMT"));
    }
}
