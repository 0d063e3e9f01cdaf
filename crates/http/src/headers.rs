//! The rate-limit response headers of SPEC §5: the `X-RateLimit-*` family and the IETF
//! `RateLimit-Policy` / `RateLimit` structured fields, plus `Retry-After`.
//!
//! The text itself comes from [`tollgate::headers`], which the server and the Envoy service use
//! too, so every way into Tollgate writes the same bytes. Everything that depends only on a
//! policy (its quoted name, its `RateLimit-Policy` item) is rendered once when the engine is
//! built; a request only formats its numbers, mostly from a table of rendered ones.

use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use tollgate::headers as fields;
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

/// What `X-RateLimit-Reset` holds: one definition in the core, shared with the server and the
/// Envoy rate limit service.
pub use tollgate::headers::ResetFormat;

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

/// A policy's header text, rendered once by [`tollgate::headers`] and interned: the text is
/// `'static`, so a response refers to it without copying it or touching a reference count.
#[derive(Clone, Debug)]
pub(crate) struct PolicyHeaders {
    /// `"name"`: a structured-field string.
    pub(crate) quoted_name: &'static str,
    /// `"name";q=100;w=60`, the policy's `RateLimit-Policy` item (and the whole value when it
    /// is the only policy that applies).
    pub(crate) policy_item: &'static str,
    /// The quota's limit, as `X-RateLimit-Limit` writes it.
    pub(crate) limit: u64,
    /// `limit` in decimal.
    pub(crate) limit_text: &'static str,
}

impl PolicyHeaders {
    pub(crate) fn new(policy: &Policy) -> Result<Self, ConfigError> {
        let name = policy.name();
        let quoted = fields::quoted(name).ok_or_else(|| {
            ConfigError::new(
                name,
                "a policy name must be printable ASCII to appear in RateLimit headers",
            )
        })?;
        let quota = policy.quota();
        let mut item = String::with_capacity(quoted.len() + 32);
        fields::write_policy_item(&mut item, &quoted, quota);
        let limit = u64::from(quota.limit());
        let mut digits = String::new();
        fields::write_u64(&mut digits, limit);
        Ok(PolicyHeaders {
            quoted_name: tollgate::intern(&quoted),
            policy_item: tollgate::intern(&item),
            limit,
            limit_text: tollgate::intern(&digits),
        })
    }
}

/// Which header a [`Field`] is: only these six are ever set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Which {
    Limit,
    Remaining,
    Reset,
    Policy,
    RateLimit,
    RetryAfter,
}

impl Which {
    /// The header's name, lower case as HTTP/2 and most servers write it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Which::Limit => "x-ratelimit-limit",
            Which::Remaining => "x-ratelimit-remaining",
            Which::Reset => "x-ratelimit-reset",
            Which::Policy => "ratelimit-policy",
            Which::RateLimit => "ratelimit",
            Which::RetryAfter => "retry-after",
        }
    }

    /// `name: `, as an HTTP/1.1 header line starts: one copy where name and separator would be
    /// two.
    fn line_start(self) -> &'static [u8] {
        match self {
            Which::Limit => b"x-ratelimit-limit: ",
            Which::Remaining => b"x-ratelimit-remaining: ",
            Which::Reset => b"x-ratelimit-reset: ",
            Which::Policy => b"ratelimit-policy: ",
            Which::RateLimit => b"ratelimit: ",
            Which::RetryAfter => b"retry-after: ",
        }
    }

    pub(crate) fn name(self) -> HeaderName {
        match self {
            Which::Limit => X_RATELIMIT_LIMIT,
            Which::Remaining => X_RATELIMIT_REMAINING,
            Which::Reset => X_RATELIMIT_RESET,
            Which::Policy => RATELIMIT_POLICY,
            Which::RateLimit => RATELIMIT,
            Which::RetryAfter => http::header::RETRY_AFTER,
        }
    }
}

/// What a [`Field`] holds: numbers stay numbers until the field is written. A server that
/// writes HTTP/1.1 itself formats them straight into its output buffer, with no allocation;
/// everyone else gets a `HeaderValue` made when asked for ([`Field::header_value`]).
#[derive(Clone, Debug)]
pub(crate) enum Value {
    /// An integer in decimal.
    Number(u64),
    /// Text fixed per policy (interned) or per process.
    Static(&'static str),
    /// A `RateLimit` item: `quoted;r=<r>;t=<t>`.
    Item {
        quoted: &'static str,
        r: u64,
        t: u64,
    },
    /// Text made for this response (several policies' items joined, an HTTP date).
    Text(HeaderValue),
}

/// One rate-limit header of a response.
#[derive(Clone, Debug)]
pub(crate) struct Field {
    pub(crate) which: Which,
    pub(crate) value: Value,
}

impl Field {
    fn new(which: Which, value: Value) -> Self {
        Field { which, value }
    }

    /// The value as a `HeaderValue` (for a `HeaderMap`).
    pub(crate) fn header_value(&self) -> HeaderValue {
        match &self.value {
            // The reset's epoch second repeats from one request to the next.
            Value::Number(n) if self.which == Which::Reset => recent_number(*n),
            Value::Number(n) => number(*n),
            Value::Static(s) => HeaderValue::from_static(s),
            Value::Item { .. } => {
                // Written into this thread's buffer by the one formatter, and copied once into
                // an exactly sized value: one allocation.
                let value = SCRATCH.try_with(|scratch| {
                    let mut scratch = scratch.try_borrow_mut().ok()?;
                    scratch.clear();
                    self.write_value(&mut scratch);
                    HeaderValue::from_bytes(&scratch).ok()
                });
                value
                    .ok()
                    .flatten()
                    .unwrap_or_else(|| HeaderValue::from_static(""))
            }
            Value::Text(v) => v.clone(),
        }
    }

    /// Appends the value's bytes to `out`.
    pub(crate) fn write_value(&self, out: &mut Vec<u8>) {
        match &self.value {
            Value::Number(n) => fields::write_decimal(out, *n),
            Value::Static(s) => out.extend_from_slice(s.as_bytes()),
            Value::Item { quoted, r, t } => {
                out.extend_from_slice(quoted.as_bytes());
                out.extend_from_slice(b";r=");
                fields::write_decimal(out, *r);
                out.extend_from_slice(b";t=");
                fields::write_decimal(out, *t);
            }
            Value::Text(v) => out.extend_from_slice(v.as_bytes()),
        }
    }
}

/// The headers of one response, in order.
pub(crate) type HeaderList = smallvec::SmallVec<[Field; 6]>;

/// Appends `fields` to `out` as HTTP/1.1 header lines (`name: value` and CRLF each).
pub(crate) fn write_lines(fields: &[Field], out: &mut Vec<u8>) {
    for f in fields {
        out.extend_from_slice(f.which.line_start());
        f.write_value(out);
        out.extend_from_slice(b"\r\n");
    }
}

/// Writes the headers for `decisions` (with their policies' rendered text) into `out`.
pub(crate) fn render(
    config: &HeaderConfig,
    now: Timestamp,
    items: &[(&Decision, &PolicyHeaders)],
    out: &mut HeaderList,
) {
    let Some(&(worst, worst_text)) = items
        .iter()
        .min_by(|(a, _), (b, _)| fields::cmp_restrictive(a, b))
    else {
        return;
    };
    if config.legacy {
        let reset = config.reset_format.reset_secs(now, worst);
        let limit = if worst.limit == worst_text.limit {
            Value::Static(worst_text.limit_text)
        } else {
            Value::Number(worst.limit)
        };
        out.push(Field::new(Which::Limit, limit));
        out.push(Field::new(Which::Remaining, Value::Number(worst.remaining)));
        if let Some(reset) = reset {
            out.push(Field::new(Which::Reset, Value::Number(reset)));
        }
    }
    if config.ietf {
        let policy = if let [(_, only)] = items {
            Value::Static(only.policy_item)
        } else {
            let mut joined = String::with_capacity(items.len() * 32);
            for (i, (_, text)) in items.iter().enumerate() {
                if i > 0 {
                    joined.push_str(fields::LIST_SEPARATOR);
                }
                joined.push_str(text.policy_item);
            }
            match HeaderValue::from_maybe_shared(Bytes::from(joined)) {
                Ok(v) => Value::Text(v),
                Err(_) => return,
            }
        };
        out.push(Field::new(Which::Policy, policy));
        out.push(Field::new(
            Which::RateLimit,
            Value::Item {
                quoted: worst_text.quoted_name,
                r: worst.remaining,
                t: fields::t_secs(worst),
            },
        ));
    }
}

/// The `t` of the `RateLimit` field among `fields`, if there is one.
pub(crate) fn t_of(fields: &[Field]) -> Option<u64> {
    fields.iter().find_map(|f| match f.value {
        Value::Item { t, .. } if f.which == Which::RateLimit => Some(t),
        _ => None,
    })
}

thread_local! {
    /// Where a `RateLimit` value is written before it becomes a header value.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
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

/// The `Retry-After` field for a wait of `wait`, and its whole seconds: rounded up, at least
/// 1, and not earlier than `floor_secs` (the `t` the `RateLimit` field reports).
pub(crate) fn retry_after(
    format: RetryAfterFormat,
    now: Timestamp,
    wait: Duration,
    floor_secs: u64,
) -> (u64, Field) {
    let secs = fields::retry_after_secs(wait, floor_secs);
    let value = match format {
        RetryAfterFormat::Seconds => Value::Number(secs),
        RetryAfterFormat::HttpDate => {
            // Whole seconds after now, rounded up, so the date is never earlier than the wait.
            let at = UNIX_EPOCH
                + Duration::from_secs(fields::ceil_secs(Duration::from_micros(now.as_micros())))
                + Duration::from_secs(secs);
            let text = httpdate::fmt_http_date(at.max(SystemTime::UNIX_EPOCH));
            HeaderValue::from_str(&text).map_or(Value::Number(secs), Value::Text)
        }
    };
    (secs, Field::new(Which::RetryAfter, value))
}

/// `Retry-After: 1`, for an answer that asks for a retry soon without a decision behind it.
pub(crate) fn retry_soon() -> Field {
    Field::new(Which::RetryAfter, Value::Static("1"))
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
    fn retry_after_in_seconds_and_as_a_date() {
        let (secs, v) = retry_after(
            RetryAfterFormat::Seconds,
            Timestamp::from_secs(0),
            Duration::ZERO,
            0,
        );
        assert_eq!((secs, v.header_value().to_str().ok()), (1, Some("1")));
        let (_, v) = retry_after(
            RetryAfterFormat::HttpDate,
            Timestamp::from_secs(784_111_777),
            Duration::from_millis(1),
            0,
        );
        assert_eq!(
            v.header_value().to_str().ok(),
            Some("Sun, 06 Nov 1994 08:49:38 GMT")
        );
    }

    /// Both ways out (a `HeaderValue`, bytes written for HTTP/1.1) carry the same text.
    #[test]
    fn header_values_and_written_lines_agree() {
        let fields = [
            Field::new(Which::Limit, Value::Static("100")),
            Field::new(Which::Remaining, Value::Number(0)),
            Field::new(Which::Remaining, Value::Number(u64::MAX)),
            Field::new(Which::Reset, Value::Number(1_700_000_000)),
            Field::new(Which::Policy, Value::Static("\"api\";q=100;w=60")),
            Field::new(
                Which::RateLimit,
                Value::Item {
                    quoted: "\"api\"",
                    r: 12,
                    t: 3_600,
                },
            ),
            Field::new(
                Which::RetryAfter,
                Value::Text(HeaderValue::from_static("Sun, 06 Nov 1994 08:49:38 GMT")),
            ),
            retry_soon(),
        ];
        let mut lines = Vec::new();
        write_lines(&fields, &mut lines);
        let mut expected = String::new();
        for f in &fields {
            assert_eq!(f.which.name().as_str(), f.which.as_str());
            assert_eq!(
                f.which.line_start(),
                format!("{}: ", f.which.as_str()).as_bytes()
            );
            let value = f.header_value();
            expected.push_str(&format!(
                "{}: {}\r\n",
                f.which.as_str(),
                value.to_str().unwrap_or("<not text>")
            ));
        }
        assert_eq!(String::from_utf8_lossy(&lines), expected);
        assert!(expected.contains("ratelimit: \"api\";r=12;t=3600\r\n"));
        assert_eq!(t_of(&fields), Some(3_600));
    }
}
