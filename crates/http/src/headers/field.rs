//! One rate-limit header as it is written: which it is and its value, made from a
//! [`HeaderList`](super::HeaderList) one at a time, and the number formatting the values share.

use std::io::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use http::{HeaderName, HeaderValue};
use tollgate::headers as fields;

use super::{
    PolicyText, RATELIMIT, RATELIMIT_POLICY, TextRef, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING,
    X_RATELIMIT_RESET,
};

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
    /// The order fields are written in.
    pub(crate) const ORDER: [Which; 6] = [
        Which::Limit,
        Which::Remaining,
        Which::Reset,
        Which::Policy,
        Which::RateLimit,
        Which::RetryAfter,
    ];

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
    pub(super) fn line_start(self) -> &'static [u8] {
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
#[derive(Clone, Copy, Debug)]
pub(crate) enum Value<'a> {
    /// An integer in decimal.
    Number(u64),
    /// Text fixed per policy: interned, or a key override's.
    Text(TextRef<'a>),
    /// A `RateLimit` item: `quoted;r=<r>;t=<t>`.
    Item { quoted: &'a str, r: u64, t: u64 },
    /// Several policies' `RateLimit-Policy` items, joined by the list separator.
    Items(&'a [PolicyText]),
    /// An HTTP date, this many seconds after the epoch.
    Date(u64),
}

/// One rate-limit header of a response, made from a [`HeaderList`](super::HeaderList) as it is
/// written.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Field<'a> {
    pub(crate) which: Which,
    pub(crate) value: Value<'a>,
}

impl Field<'_> {
    /// The value as a `HeaderValue` (for a `HeaderMap`).
    pub(crate) fn header_value(&self) -> HeaderValue {
        match self.value {
            // The reset's epoch second repeats from one request to the next.
            Value::Number(n) if self.which == Which::Reset => recent_number(n),
            Value::Number(n) => number(n),
            Value::Text(TextRef::Static(s)) => HeaderValue::from_static(s),
            Value::Text(TextRef::Borrowed(s)) => {
                HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static(""))
            }
            Value::Item { .. } | Value::Items(_) | Value::Date(_) => {
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
        }
    }

    /// Appends the value's bytes to `out`.
    pub(crate) fn write_value(&self, out: &mut Vec<u8>) {
        match self.value {
            Value::Number(n) => fields::write_decimal(out, n),
            Value::Text(TextRef::Static(s) | TextRef::Borrowed(s)) => {
                out.extend_from_slice(s.as_bytes());
            }
            Value::Item { quoted, r, t } => {
                out.extend_from_slice(quoted.as_bytes());
                out.extend_from_slice(b";r=");
                fields::write_decimal(out, r);
                out.extend_from_slice(b";t=");
                fields::write_decimal(out, t);
            }
            Value::Items(items) => {
                for (i, text) in items.iter().enumerate() {
                    if i > 0 {
                        out.extend_from_slice(fields::LIST_SEPARATOR.as_bytes());
                    }
                    out.extend_from_slice(text.headers().policy_item.as_bytes());
                }
            }
            Value::Date(secs) => {
                // HTTP dates end with the year 9999; `httpdate` refuses later ones.
                let at = UNIX_EPOCH + Duration::from_secs(secs.min(LAST_HTTP_DATE));
                // Writing to a `Vec` cannot fail.
                let _ = write!(out, "{}", httpdate::HttpDate::from(at));
            }
        }
    }
}

/// 9999-12-31T23:59:59Z, the last second an HTTP date can name, in seconds after the epoch.
const LAST_HTTP_DATE: u64 = 253_402_300_799;

thread_local! {
    /// Where a `RateLimit` value is written before it becomes a header value.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Numbers up to this are rendered once per process: limits, remaining counts and second
/// counts are nearly always small, and a `'static` value costs no allocation.
const CACHED_NUMBERS: usize = 10_000;

/// `n` as a header value.
pub(super) fn number(n: u64) -> HeaderValue {
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
        if let (Some(&a), Some(&b)) = (starts.get(i), starts.get(i + 1))
            && let Some(digits) = text.get(a as usize..b as usize)
        {
            return HeaderValue::from_static(digits);
        }
    }
    HeaderValue::from(n)
}

/// `n` as a header value, for numbers that repeat from one request to the next (the epoch
/// second of a reset): the last one is kept per thread, so a repeat is a reference-count
/// update rather than an allocation and formatting.
pub(super) fn recent_number(n: u64) -> HeaderValue {
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
