//! The rate-limit response headers of SPEC §5: the `X-RateLimit-*` family and the IETF
//! `RateLimit-Policy` / `RateLimit` structured fields, plus `Retry-After`.
//!
//! The text itself comes from [`tollgate::headers`], which the server and the Envoy service use
//! too, so every way into Tollgate writes the same bytes. Everything that depends only on a
//! policy (its quoted name, its `RateLimit-Policy` item) is rendered once when the engine is
//! built; a request only formats its numbers, mostly from a table of rendered ones.

use std::io::Write as _;
use std::str::FromStr;
use std::time::{Duration, UNIX_EPOCH};

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

/// A policy's header text, rendered once by [`tollgate::headers`] and interned, as the text in
/// it is: a response refers to it with one word, without copying it or touching a reference
/// count.
#[derive(Debug, PartialEq, Eq, Hash)]
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
    /// The text of `policy`'s headers. Interned: policies (and key overrides) with the same
    /// name and quota share one, so reloads and overrides add nothing once seen.
    pub(crate) fn new(policy: &Policy) -> Result<&'static Self, ConfigError> {
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
        Ok(intern(PolicyHeaders {
            quoted_name: tollgate::intern(&quoted),
            policy_item: tollgate::intern(&item),
            limit,
            limit_text: tollgate::intern(&digits),
        }))
    }
}

/// `text`, leaked once per distinct value.
fn intern(text: PolicyHeaders) -> &'static PolicyHeaders {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock, PoisonError};
    static TEXTS: OnceLock<Mutex<HashSet<&'static PolicyHeaders>>> = OnceLock::new();
    let mut texts = TEXTS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(&known) = texts.get(&text) {
        return known;
    }
    let leaked: &'static PolicyHeaders = Box::leak(Box::new(text));
    texts.insert(leaked);
    leaked
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
#[derive(Clone, Copy, Debug)]
pub(crate) enum Value<'a> {
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
    /// Several policies' `RateLimit-Policy` items, joined by the list separator.
    Items(&'a [&'static PolicyHeaders]),
    /// An HTTP date, this many seconds after the epoch.
    Date(u64),
}

/// One rate-limit header of a response, made from a [`HeaderList`] as it is written.
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
            Value::Static(s) => HeaderValue::from_static(s),
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
            Value::Static(s) => out.extend_from_slice(s.as_bytes()),
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
                    out.extend_from_slice(text.policy_item.as_bytes());
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

/// `Retry-After`, when a response carries it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Retry {
    #[default]
    None,
    /// Whole seconds.
    Seconds(u64),
    /// An HTTP date, this many seconds after the epoch.
    Date(u64),
}

/// The form of a [`HeaderList`]'s `Retry-After`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum RetryKind {
    #[default]
    None,
    Seconds,
    Date,
}

/// The rate-limit headers of one response, kept as what they are written from: the numbers of
/// the most restrictive decision and references to the policies' interned text. The fields
/// themselves ([`HeaderList::fields`]) are made as they are written.
///
/// Small on purpose (80 bytes, no allocation for one or two policies): a tower response future
/// carries it while the inner service runs, and every byte of it is moved with the future.
#[derive(Clone, Debug, Default)]
pub(crate) struct HeaderList {
    /// The policies `RateLimit-Policy` lists, in order; empty when no decision is reported.
    policies: smallvec::SmallVec<[&'static PolicyHeaders; 2]>,
    /// The most restrictive decision's policy text (its quoted name for `RateLimit`).
    worst: Option<&'static PolicyHeaders>,
    /// Its limit, remaining count, `X-RateLimit-Reset` and `RateLimit`'s `t`.
    limit: u64,
    remaining: u64,
    reset: u64,
    t: u64,
    /// `Retry-After`: which form, and its seconds or date. Kept apart rather than as a
    /// [`Retry`], whose tag would take a word of its own.
    retry_kind: RetryKind,
    retry: u64,
    /// Which families to write (the `[headers]` config), and whether `reset` is written.
    legacy: bool,
    ietf: bool,
    has_reset: bool,
}

impl HeaderList {
    /// No headers.
    pub(crate) fn new() -> Self {
        HeaderList::default()
    }

    /// Only `Retry-After: 1`, for an answer that asks for a retry soon without a decision
    /// behind it.
    pub(crate) fn retry_soon() -> Self {
        let mut list = HeaderList::default();
        list.set_retry(Retry::Seconds(1));
        list
    }

    /// Adds `Retry-After`, after the other fields.
    pub(crate) fn set_retry(&mut self, retry: Retry) {
        (self.retry_kind, self.retry) = match retry {
            Retry::None => (RetryKind::None, 0),
            Retry::Seconds(secs) => (RetryKind::Seconds, secs),
            Retry::Date(at) => (RetryKind::Date, at),
        };
    }

    /// `Retry-After`, if the list has it.
    pub(crate) fn retry(&self) -> Retry {
        match self.retry_kind {
            RetryKind::None => Retry::None,
            RetryKind::Seconds => Retry::Seconds(self.retry),
            RetryKind::Date => Retry::Date(self.retry),
        }
    }

    /// The `t` the `RateLimit` field reports, if the list has that field.
    pub(crate) fn t(&self) -> Option<u64> {
        (self.ietf && self.worst.is_some()).then_some(self.t)
    }

    /// The fields, in order: `X-RateLimit-Limit`, `-Remaining`, `-Reset`, `RateLimit-Policy`,
    /// `RateLimit`, `Retry-After`, each when configured and known. Made one at a time, as they
    /// are written: nothing is collected.
    pub(crate) fn fields(&self) -> Fields<'_> {
        Fields {
            list: self,
            next: 0,
        }
    }

    /// The `which` field, if the list has it.
    fn field(&self, which: Which) -> Option<Field<'_>> {
        let value = match which {
            Which::RetryAfter => match self.retry() {
                Retry::None => return None,
                Retry::Seconds(secs) => Value::Number(secs),
                Retry::Date(at) => Value::Date(at),
            },
            Which::Limit | Which::Remaining | Which::Reset if !self.legacy => return None,
            Which::Policy | Which::RateLimit if !self.ietf => return None,
            Which::Limit => {
                let worst = self.worst?;
                if self.limit == worst.limit {
                    Value::Static(worst.limit_text)
                } else {
                    Value::Number(self.limit)
                }
            }
            Which::Remaining => {
                self.worst?;
                Value::Number(self.remaining)
            }
            Which::Reset => {
                self.worst?;
                if !self.has_reset {
                    return None;
                }
                Value::Number(self.reset)
            }
            Which::Policy => {
                self.worst?;
                match self.policies.as_slice() {
                    [only] => Value::Static(only.policy_item),
                    many => Value::Items(many),
                }
            }
            Which::RateLimit => Value::Item {
                quoted: self.worst?.quoted_name,
                r: self.remaining,
                t: self.t,
            },
        };
        Some(Field { which, value })
    }

    /// Whether there are none.
    pub(crate) fn is_empty(&self) -> bool {
        self.retry_kind == RetryKind::None && (self.worst.is_none() || !(self.legacy || self.ietf))
    }
}

/// The fields of a [`HeaderList`], made as they are asked for.
#[derive(Clone, Debug)]
pub(crate) struct Fields<'a> {
    list: &'a HeaderList,
    /// The position in [`Which::ORDER`] to look at next.
    next: usize,
}

impl<'a> Iterator for Fields<'a> {
    type Item = Field<'a>;

    fn next(&mut self) -> Option<Field<'a>> {
        while let Some(&which) = Which::ORDER.get(self.next) {
            self.next += 1;
            if let Some(field) = self.list.field(which) {
                return Some(field);
            }
        }
        None
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = Which::ORDER
            .get(self.next..)
            .unwrap_or_default()
            .iter()
            .filter(|&&which| self.list.field(which).is_some())
            .count();
        (left, Some(left))
    }
}

impl ExactSizeIterator for Fields<'_> {}

/// Appends `list`'s fields to `out` as HTTP/1.1 header lines (`name: value` and CRLF each).
pub(crate) fn write_lines(list: &HeaderList, out: &mut Vec<u8>) {
    for f in list.fields() {
        out.extend_from_slice(f.which.line_start());
        f.write_value(out);
        out.extend_from_slice(b"\r\n");
    }
}

/// The headers for `decisions` (with their policies' text).
pub(crate) fn render(
    config: &HeaderConfig,
    now: Timestamp,
    items: &[(&Decision, &'static PolicyHeaders)],
) -> HeaderList {
    let Some(&(worst, worst_text)) = items
        .iter()
        .min_by(|(a, _), (b, _)| fields::cmp_restrictive(a, b))
    else {
        return HeaderList::new();
    };
    let reset = if config.legacy {
        config.reset_format.reset_secs(now, worst)
    } else {
        None
    };
    HeaderList {
        policies: items.iter().map(|&(_, text)| text).collect(),
        worst: Some(worst_text),
        limit: worst.limit,
        remaining: worst.remaining,
        reset: reset.unwrap_or(0),
        t: fields::t_secs(worst),
        retry_kind: RetryKind::None,
        retry: 0,
        legacy: config.legacy,
        ietf: config.ietf,
        has_reset: reset.is_some(),
    }
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

/// `Retry-After` for a wait of `wait`, and its whole seconds: rounded up, at least 1, and not
/// earlier than `floor_secs` (the `t` the `RateLimit` field reports).
pub(crate) fn retry_after(
    format: RetryAfterFormat,
    now: Timestamp,
    wait: Duration,
    floor_secs: u64,
) -> (u64, Retry) {
    let secs = fields::retry_after_secs(wait, floor_secs);
    let retry = match format {
        RetryAfterFormat::Seconds => Retry::Seconds(secs),
        // Whole seconds after now, rounded up, so the date is never earlier than the wait.
        RetryAfterFormat::HttpDate => Retry::Date(
            fields::ceil_secs(Duration::from_micros(now.as_micros())).saturating_add(secs),
        ),
    };
    (secs, retry)
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

    /// A list with only `retry` in it, written as HTTP/1.1 and as a `HeaderValue`.
    fn retry_text(retry: Retry) -> (String, Option<String>) {
        let mut list = HeaderList::new();
        list.set_retry(retry);
        let mut lines = Vec::new();
        write_lines(&list, &mut lines);
        let value = list
            .fields()
            .next()
            .and_then(|f| f.header_value().to_str().ok().map(str::to_owned));
        (String::from_utf8_lossy(&lines).into_owned(), value)
    }

    #[test]
    fn retry_after_in_seconds_and_as_a_date() {
        let (secs, retry) = retry_after(
            RetryAfterFormat::Seconds,
            Timestamp::from_secs(0),
            Duration::ZERO,
            0,
        );
        assert_eq!((secs, retry), (1, Retry::Seconds(1)));
        assert_eq!(
            retry_text(retry),
            ("retry-after: 1\r\n".into(), Some("1".into()))
        );
        let (_, retry) = retry_after(
            RetryAfterFormat::HttpDate,
            Timestamp::from_secs(784_111_777),
            Duration::from_millis(1),
            0,
        );
        let date = "Sun, 06 Nov 1994 08:49:38 GMT";
        assert_eq!(
            retry_text(retry),
            (format!("retry-after: {date}\r\n"), Some(date.into()))
        );
        // Past what an HTTP date can name: the last one, not a panic.
        let (_, far) = retry_text(Retry::Date(u64::MAX));
        assert_eq!(far.as_deref(), Some("Fri, 31 Dec 9999 23:59:59 GMT"));
        assert_eq!(
            retry_text(HeaderList::retry_soon().retry()),
            ("retry-after: 1\r\n".into(), Some("1".into()))
        );
    }

    fn text(name: &str, limit: u32) -> &'static PolicyHeaders {
        let quota = tollgate::Quota::fixed_window(limit, Duration::from_secs(60));
        let policy = quota.and_then(|q| Policy::new(name, q));
        match policy.ok().map(|p| PolicyHeaders::new(&p)) {
            Some(Ok(text)) => text,
            _ => panic!("a valid policy"),
        }
    }

    fn decision(policy: &'static str, limit: u64, remaining: u64, reset_secs: u64) -> Decision {
        Decision {
            policy,
            allowed: true,
            limit,
            remaining,
            reset: Duration::from_secs(reset_secs),
            retry_after: None,
            delay: None,
        }
    }

    /// Both ways out (a `HeaderValue`, bytes written for HTTP/1.1) carry the same text, for one
    /// policy and for several, every family on.
    #[test]
    fn header_values_and_written_lines_agree() {
        let api = text("api", 100);
        let burst = text("burst", 10);
        // Interned: the same policy text is one value.
        assert!(std::ptr::eq(api, text("api", 100)));
        let config = HeaderConfig::default();
        let now = Timestamp::from_secs(1_700_000_000);
        let one = decision("api", 100, 12, 3_600);
        let other = decision("burst", 10, 3, 5);
        let mut cases = vec![
            render(&config, now, &[(&one, api)]),
            render(&config, now, &[(&one, api), (&other, burst)]),
            render(&config, now, &[(&decision("api", 7, 99_999, 1), api)]),
        ];
        let mut with_retry = cases[1].clone();
        with_retry.set_retry(Retry::Date(784_111_778));
        cases.push(with_retry);
        for list in &cases {
            let mut lines = Vec::new();
            write_lines(list, &mut lines);
            let mut expected = String::new();
            for f in list.fields() {
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
            assert_eq!(list.fields().len(), list.fields().count());
            assert!(!list.is_empty());
        }
        let written = |list: &HeaderList| {
            let mut lines = Vec::new();
            write_lines(list, &mut lines);
            String::from_utf8_lossy(&lines).into_owned()
        };
        assert_eq!(
            written(&cases[0]),
            "x-ratelimit-limit: 100\r\nx-ratelimit-remaining: 12\r\n\
             x-ratelimit-reset: 1700003600\r\nratelimit-policy: \"api\";q=100;w=60\r\n\
             ratelimit: \"api\";r=12;t=3600\r\n"
        );
        assert_eq!(
            written(&cases[1]),
            "x-ratelimit-limit: 10\r\nx-ratelimit-remaining: 3\r\n\
             x-ratelimit-reset: 1700000005\r\n\
             ratelimit-policy: \"api\";q=100;w=60, \"burst\";q=10;w=60\r\n\
             ratelimit: \"burst\";r=3;t=5\r\n"
        );
        // A limit other than the policy's own (the decision's) is written as a number.
        assert!(written(&cases[2]).starts_with("x-ratelimit-limit: 7\r\n"));
        assert!(written(&cases[3]).ends_with("retry-after: Sun, 06 Nov 1994 08:49:38 GMT\r\n"));
        assert_eq!(cases[0].t(), Some(3_600));
    }

    /// The families follow the config, and a list with nothing to write says so.
    #[test]
    fn families_follow_the_config() {
        let api = text("api", 100);
        let now = Timestamp::from_secs(1_700_000_000);
        let one = decision("api", 100, 12, 3_600);
        let names = |config: HeaderConfig| {
            let list = render(&config, now, &[(&one, api)]);
            let names: Vec<&str> = list.fields().map(|f| f.which.as_str()).collect();
            (names, list.is_empty(), list.t())
        };
        let config = HeaderConfig::default();
        assert_eq!(
            names(HeaderConfig {
                ietf: false,
                ..config
            }),
            (
                vec![
                    "x-ratelimit-limit",
                    "x-ratelimit-remaining",
                    "x-ratelimit-reset"
                ],
                false,
                None
            )
        );
        assert_eq!(
            names(HeaderConfig {
                legacy: false,
                ..config
            }),
            (vec!["ratelimit-policy", "ratelimit"], false, Some(3_600))
        );
        assert_eq!(
            names(HeaderConfig {
                ietf: false,
                reset_format: ResetFormat::Omitted,
                ..config
            }),
            (
                vec!["x-ratelimit-limit", "x-ratelimit-remaining"],
                false,
                None
            )
        );
        assert_eq!(
            names(HeaderConfig {
                legacy: false,
                ietf: false,
                ..config
            }),
            (vec![], true, None)
        );
        assert!(render(&config, now, &[]).is_empty());
        assert!(HeaderList::new().is_empty());
        assert!(!HeaderList::retry_soon().is_empty());
    }

    /// What a response future carries: small enough to move cheaply, whatever the config.
    #[test]
    fn a_list_is_small() {
        assert!(std::mem::size_of::<HeaderList>() <= 80);
    }
}
