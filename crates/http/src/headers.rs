//! The rate-limit response headers: the `X-RateLimit-*` family and the IETF
//! `RateLimit-Policy` / `RateLimit` structured fields, plus `Retry-After`.
//!
//! The text itself comes from [`tollgate::headers`], which the server and the Envoy service use
//! too, so every way into Tollgate writes the same bytes. Everything that depends only on a
//! policy (its quoted name, its `RateLimit-Policy` item) is rendered once when the engine is
//! built; a request only formats its numbers, mostly from a table of rendered ones.

use std::str::FromStr;
use std::sync::Arc;

use http::HeaderName;
use tollgate::Policy;
use tollgate::headers as fields;

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

/// A policy's header text, rendered once by [`tollgate::headers`]: a response refers to it
/// rather than format it again.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct PolicyHeaders {
    /// `"name"`: a structured-field string.
    pub(crate) quoted_name: Box<str>,
    /// `"name";q=100;w=60`, the policy's `RateLimit-Policy` item (and the whole value when it
    /// is the only policy that applies).
    pub(crate) policy_item: Box<str>,
    /// The quota's limit, as `X-RateLimit-Limit` writes it.
    pub(crate) limit: u64,
    /// `limit` in decimal.
    pub(crate) limit_text: Box<str>,
}

impl PolicyHeaders {
    /// The text of a configured policy's headers, interned: every response refers to it with
    /// one word, without copying it or touching a reference count that all threads would share.
    /// Policies with the same name and quota share one, so a reload that keeps them adds
    /// nothing; only the configuration's own text is interned this way, never a key override's
    /// ([`PolicyHeaders::shared`]).
    pub(crate) fn new(policy: &Policy) -> Result<&'static Self, ConfigError> {
        Ok(intern(Self::render(policy)?))
    }

    /// The text of a key override's headers: dropped with the override, since overrides come
    /// and go at runtime and a server that runs for months must not keep every quota it was
    /// ever given.
    pub(crate) fn shared(policy: &Policy) -> Result<Arc<Self>, ConfigError> {
        Ok(Arc::new(Self::render(policy)?))
    }

    fn render(policy: &Policy) -> Result<Self, ConfigError> {
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
            quoted_name: quoted.into(),
            policy_item: item.into(),
            limit,
            limit_text: digits.into(),
        })
    }
}

/// The header text a decision is reported with: a configured policy's (interned) or a key
/// override's (shared, and dropped with the override).
#[derive(Clone, Debug)]
pub(crate) enum PolicyText {
    /// A configured policy's.
    Interned(&'static PolicyHeaders),
    /// A key override's.
    Override(Arc<PolicyHeaders>),
}

impl PolicyText {
    /// The text.
    pub(crate) fn headers(&self) -> &PolicyHeaders {
        match self {
            PolicyText::Interned(t) => t,
            PolicyText::Override(t) => t,
        }
    }

    /// `which` of the text, as a `'static` string when it is interned (a header value made
    /// from it costs no allocation).
    pub(crate) fn text(&self, which: fn(&PolicyHeaders) -> &str) -> TextRef<'_> {
        match self {
            PolicyText::Interned(t) => TextRef::Static(which(t)),
            PolicyText::Override(t) => TextRef::Borrowed(which(t)),
        }
    }
}

/// A piece of a [`PolicyText`].
#[derive(Clone, Copy, Debug)]
pub(crate) enum TextRef<'a> {
    /// Interned: lives for the whole process.
    Static(&'static str),
    /// A key override's: lives as long as the response's headers.
    Borrowed(&'a str),
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

mod field;
mod list;
#[cfg(test)]
mod tests;

pub(crate) use list::{HeaderList, Retry, render, render_reporting, retry_after, write_lines};
