//! Charging what a response really cost: the usage (tokens, for an AI API) read from the
//! response as its bytes pass, without holding them back and in bounded memory.
//!
//! A policy names where the cost is with a [`CostFrom`]: `header:x-usage-tokens` (a response
//! header) or `json:usage.total_tokens` (a path of object keys into a JSON body, or into the
//! events of a `text/event-stream` answer). One [`UsageMeter`] per response is built from the
//! response's headers, fed each body chunk as it is relayed, and [finished](UsageMeter::finish)
//! when the body ends; it answers a [`Usage`]:
//!
//! - [`Usage::Found`]: the cost, a non-negative integer no larger than [`CostFrom::max`].
//! - [`Usage::Missing`]: the response never carried it (no such header, no such path, a body
//!   that is not read: see [`MissingReason`]).
//! - [`Usage::Bad`]: it was there but is not a cost (negative, fractional, an exponent, not a
//!   number, too large), or the JSON around it is malformed: see [`BadReason`].
//!
//! The caller charges a fallback for `Missing` and `Bad`, and logs and counts them; this module
//! only says which.
//!
//! ```
//! use http::HeaderMap;
//! use tollgate_http::usage::{CostFrom, Usage, UsageMeter};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cost_from: CostFrom = "json:usage.total_tokens".parse()?;
//! let mut headers = HeaderMap::new();
//! headers.insert("content-type", "application/json".parse()?);
//! let mut meter = UsageMeter::new(&cost_from, &headers);
//! for chunk in [&b"{\"id\":\"x\",\"usage\":{\"total_"[..], b"tokens\": 42}}"] {
//!     meter.feed(chunk); // and relay the chunk, unchanged and undelayed
//! }
//! assert_eq!(meter.finish(), Usage::Found(42));
//! # Ok(())
//! # }
//! ```
//!
//! # What is read, and how
//!
//! - **`header:NAME`**: the response header, which must appear once and hold a non-negative
//!   integer in ASCII decimal (surrounding spaces and tabs aside). The body is not looked at.
//! - **`json:PATH` on a JSON body** (`Content-Type: application/json` or `application/*+json`):
//!   the body is scanned by an incremental JSON scanner, a state machine over bytes that keeps
//!   no tree and no copy of the body: it validates the whole document's syntax as strictly as
//!   `serde_json` does (escapes, surrogate pairs, number grammar, control characters, no
//!   trailing commas or trailing bytes) and captures the scalar at PATH. Nesting deeper than
//!   [`MAX_DEPTH`] makes the result `Bad`. A JSON key on the path is compared as it is decoded
//!   (escapes included), never copied, so a key of any length costs no memory.
//! - **The bytes inside strings are not checked to be UTF-8** (`serde_json` would refuse the
//!   document): the meter reads a document's structure, not its text. Checking costs about a
//!   nanosecond per byte of non-ASCII text (a 4 KiB answer in Chinese: several microseconds,
//!   more than the rest of a proxied request's overhead), a stray byte in an answer does not
//!   make the upstream's own count of its tokens wrong, and the event-stream specification
//!   itself decodes with replacement characters. A non-ASCII byte outside a string is still a
//!   syntax error, and a key matches the path only byte for byte.
//! - **`json:PATH` on an event stream** (`Content-Type: text/event-stream`): Server-Sent Events
//!   per the WHATWG specification (lines ended by LF, CRLF or CR; `data:` fields, one leading
//!   space stripped, several joined by LF; an event dispatched at a blank line; comments and
//!   other fields ignored; a leading byte-order mark skipped). Each event's data is scanned as
//!   it arrives, as its own JSON document, never buffered; **the last event that carries the
//!   path** gives the result. An event whose data is not JSON (OpenAI's `[DONE]`, a
//!   truncated or malformed event) carries nothing. All events count, whatever their `event:`
//!   type. An event not ended by a blank line when the stream ends is discarded, as the
//!   specification says.
//! - **Duplicate keys: the last one wins**, at every level, as in `serde_json` (and
//!   JavaScript's `JSON.parse`): `{"usage":{"total_tokens":5},"usage":{}}` has no
//!   `usage.total_tokens`. Upstreams do not send duplicates on purpose; when something in the
//!   path does send them, answering what every common JSON reader would answer means the
//!   client, the upstream's own accounting and Tollgate agree.
//! - **`null` at the path counts as absent** (`Missing`, and in a stream an event with
//!   `"usage": null` does not carry the path): APIs write `null` for "not reported here", as
//!   OpenAI does in every chunk but the last.
//! - **Only integers are costs.** `12.0`, `1e3`, `-0`, `"12"`, `true`, an object or an array at
//!   the path are `Bad`: a token count is an integer, and anything else means the upstream
//!   reports something other than what the policy expects; charging the fallback and saying
//!   so beats guessing.
//! - **Compressed bodies** (a `Content-Encoding` other than `identity`) are not decompressed:
//!   the result is [`MissingReason::Compressed`]. A door must ask the upstream for an
//!   identity body (the server's proxy sends `Accept-Encoding: identity` when a policy reads
//!   the body), or a client could hide its usage by accepting gzip.
//! - **Bodies of other content types** (and responses without a `Content-Type`) are not read:
//!   [`MissingReason::NotJson`], and feeding their chunks does nothing.
//! - **Empty bodies** (nothing but whitespace) are [`MissingReason::EmptyBody`], not malformed:
//!   a 204, a HEAD answer or an empty error carries no usage rather than a bad one.
//!
//! Feed the body's content (after any `Transfer-Encoding: chunked` framing is removed), as it
//! comes. Trailers are not read.

mod bytes;
mod cost_from;
mod json;
mod sse;

use std::fmt;
use std::sync::Arc;

use http::header::{CONTENT_ENCODING, CONTENT_TYPE};
use http::{HeaderMap, HeaderName};

pub use cost_from::CostFrom;
use cost_from::Source;
use json::{JsonEnd, JsonScanner};
use sse::SseScanner;

/// The largest cost [`Usage::Found`] reports unless [`CostFrom::with_max`] says otherwise:
/// 2^53, the largest integer every JSON reader (JavaScript's included) reads exactly. A larger
/// figure is not a token count but garbage.
pub const DEFAULT_MAX: u64 = 1 << 53;

/// The deepest nesting of objects and arrays a JSON body (or event) may have; deeper is
/// [`BadReason::TooDeep`]. Real API answers nest a handful of levels.
pub const MAX_DEPTH: usize = 64;

/// The most keys a `json:` path may have.
pub const MAX_PATH_KEYS: usize = 16;

/// The longest key of a `json:` path, in bytes.
pub const MAX_KEY_LEN: usize = 256;

/// The keys of a `json:` path, shared by every meter that reads it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct JsonPath(Arc<[Box<str>]>);

impl JsonPath {
    /// The number of keys (at least 1).
    fn len(&self) -> usize {
        self.0.len()
    }

    /// Key `index`, as bytes; `None` past the end.
    fn key(&self, index: usize) -> Option<&[u8]> {
        self.0.get(index).map(|key| key.as_bytes())
    }
}

/// What a response said it cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Usage {
    /// The cost: a non-negative integer, at most [`CostFrom::max`].
    Found(u64),
    /// The response did not carry the cost, or was not read; charge the fallback.
    Missing(MissingReason),
    /// The response carried something that is not a cost, or its JSON is malformed; charge the
    /// fallback, and tell the operator.
    Bad(BadReason),
}

impl Usage {
    /// The cost, if found.
    pub fn found(self) -> Option<u64> {
        match self {
            Usage::Found(cost) => Some(cost),
            Usage::Missing(_) | Usage::Bad(_) => None,
        }
    }
}

impl fmt::Display for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Usage::Found(cost) => write!(f, "found {cost}"),
            Usage::Missing(reason) => write!(f, "missing: {reason}"),
            Usage::Bad(reason) => write!(f, "bad: {reason}"),
        }
    }
}

/// Why a response's cost is [`Usage::Missing`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MissingReason {
    /// `header:NAME`: the response has no such header.
    NoHeader,
    /// `json:PATH`: the JSON body has nothing (or `null`) at the path.
    NotInBody,
    /// `json:PATH`: no event of the stream carried the path.
    NotInStream,
    /// `json:PATH`: the body is empty (or only whitespace).
    EmptyBody,
    /// `json:PATH`: the response's `Content-Type` is neither JSON nor `text/event-stream` (or
    /// is absent), so its body is not read.
    NotJson,
    /// `json:PATH`: the body is compressed (`Content-Encoding`); it is not decompressed.
    Compressed,
}

impl fmt::Display for MissingReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MissingReason::NoHeader => "the response has no usage header",
            MissingReason::NotInBody => "the JSON body has no value at the path",
            MissingReason::NotInStream => "no event of the stream carried the path",
            MissingReason::EmptyBody => "the body is empty",
            MissingReason::NotJson => {
                "the response is neither JSON nor an event stream (Content-Type), so its body is \
                 not read"
            }
            MissingReason::Compressed => {
                "the body is compressed (Content-Encoding); ask the upstream for identity or read \
                 the usage from a header"
            }
        })
    }
}

/// Why a response's cost is [`Usage::Bad`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BadReason {
    /// A negative number (`-0` included).
    Negative,
    /// A number with a fraction, such as `12.0` or `1.5`.
    Fraction,
    /// A number with an exponent, such as `1e3`.
    Exponent,
    /// A string, boolean, object or array where the cost should be.
    NotANumber,
    /// An integer above [`CostFrom::max`].
    TooLarge,
    /// `header:NAME`: the header's value is not a decimal integer.
    NotDecimal,
    /// `header:NAME`: the header appears more than once.
    RepeatedHeader,
    /// The body is not valid JSON: the byte at `offset` (from the start of the body) is wrong.
    Malformed {
        /// Where, in bytes from the start of the body.
        offset: u64,
    },
    /// The JSON body ends (after `offset` bytes) before its document does.
    Truncated {
        /// The body's length.
        offset: u64,
    },
    /// The JSON body nests deeper than [`MAX_DEPTH`] at `offset`.
    TooDeep {
        /// Where, in bytes from the start of the body.
        offset: u64,
    },
}

impl fmt::Display for BadReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadReason::Negative => f.write_str("a negative number"),
            BadReason::Fraction => f.write_str("a number with a fraction, not an integer"),
            BadReason::Exponent => f.write_str("a number with an exponent, not an integer"),
            BadReason::NotANumber => f.write_str("not a number"),
            BadReason::TooLarge => f.write_str("a number above the maximum cost"),
            BadReason::NotDecimal => f.write_str("the header is not a decimal integer"),
            BadReason::RepeatedHeader => f.write_str("the header appears more than once"),
            BadReason::Malformed { offset } => write!(f, "malformed JSON at byte {offset}"),
            BadReason::Truncated { offset } => {
                write!(f, "the JSON ends early, after {offset} bytes")
            }
            BadReason::TooDeep { offset } => write!(
                f,
                "JSON nested deeper than {MAX_DEPTH} levels at byte {offset}"
            ),
        }
    }
}

/// Reads one response's cost as its body passes: built from the response's headers, fed each
/// body chunk, then [finished](UsageMeter::finish).
///
/// Feeding never holds a byte back, never allocates, and keeps a fixed, small state (no copy of
/// the body, of a key or of a number), whatever the body's size. When the response is not one
/// the meter reads (a `header:` source, another content type, a compressed body),
/// [`feed`](UsageMeter::feed) does nothing and [`reads_body`](UsageMeter::reads_body) says so.
#[derive(Clone, Debug)]
pub struct UsageMeter {
    inner: Meter,
}

#[derive(Clone, Debug)]
enum Meter {
    /// The answer is known from the headers.
    Known(Usage),
    Json(JsonPath, JsonScanner),
    Sse(JsonPath, SseScanner),
}

/// What kind of body a response's headers announce.
enum BodyKind {
    Json,
    EventStream,
    Other,
}

fn body_kind(headers: &HeaderMap) -> BodyKind {
    let Some(value) = headers.get(CONTENT_TYPE) else {
        return BodyKind::Other;
    };
    // The media type's essence: before any parameter, without spaces; compared as bytes, in
    // any case.
    let value = value.as_bytes();
    let essence = value
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    let Some(slash) = essence.iter().position(|&b| b == b'/') else {
        return BodyKind::Other;
    };
    let (kind, subtype) = essence.split_at(slash);
    let subtype = subtype.get(1..).unwrap_or_default().trim_ascii();
    if kind.eq_ignore_ascii_case(b"application")
        && (subtype.eq_ignore_ascii_case(b"json")
            || subtype.len() > 5
                && subtype
                    .get(subtype.len() - 5..)
                    .is_some_and(|tail| tail.eq_ignore_ascii_case(b"+json")))
    {
        BodyKind::Json
    } else if kind.eq_ignore_ascii_case(b"text") && subtype.eq_ignore_ascii_case(b"event-stream") {
        BodyKind::EventStream
    } else {
        BodyKind::Other
    }
}

/// True when a `Content-Encoding` other than `identity` is applied to the body.
fn compressed(headers: &HeaderMap) -> bool {
    headers.get_all(CONTENT_ENCODING).iter().any(|value| {
        // An unreadable value is an encoding we do not know: treat it as one.
        let Ok(text) = value.to_str() else {
            return true;
        };
        text.split(',').any(|coding| {
            let coding = coding.trim();
            !coding.is_empty() && !coding.eq_ignore_ascii_case("identity")
        })
    })
}

fn from_header(name: &HeaderName, headers: &HeaderMap, max: u64) -> Usage {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Usage::Missing(MissingReason::NoHeader);
    };
    if values.next().is_some() {
        return Usage::Bad(BadReason::RepeatedHeader);
    }
    // A field value has no surrounding spaces or tabs (RFC 9110), but a header set by code can.
    let digits = value.as_bytes().trim_ascii();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Usage::Bad(BadReason::NotDecimal);
    }
    let mut cost: u64 = 0;
    for &digit in digits {
        match cost
            .checked_mul(10)
            .and_then(|c| c.checked_add(u64::from(digit - b'0')))
        {
            Some(c) => cost = c,
            None => return Usage::Bad(BadReason::TooLarge),
        }
    }
    if cost > max {
        Usage::Bad(BadReason::TooLarge)
    } else {
        Usage::Found(cost)
    }
}

impl UsageMeter {
    /// A meter for one response, from its headers (status line and headers are all it needs
    /// before the body).
    pub fn new(cost_from: &CostFrom, headers: &HeaderMap) -> Self {
        let inner = match &cost_from.source {
            Source::Header(name) => Meter::Known(from_header(name, headers, cost_from.max)),
            Source::Json(path) => match body_kind(headers) {
                BodyKind::Other => Meter::Known(Usage::Missing(MissingReason::NotJson)),
                _ if compressed(headers) => Meter::Known(Usage::Missing(MissingReason::Compressed)),
                BodyKind::Json => Meter::Json(path.clone(), JsonScanner::new(cost_from.max)),
                BodyKind::EventStream => Meter::Sse(path.clone(), SseScanner::new(cost_from.max)),
            },
        };
        UsageMeter { inner }
    }

    /// Whether the body is read at all. When false, the answer is already known from the
    /// headers and the caller may skip [`feed`](UsageMeter::feed) (which would do nothing).
    pub fn reads_body(&self) -> bool {
        !matches!(self.inner, Meter::Known(_))
    }

    /// Reads the next chunk of the body. Chunks may split the body anywhere (inside a key, a
    /// number, an escape, a UTF-8 character or a line ending): the answer is the same.
    #[inline]
    pub fn feed(&mut self, chunk: &[u8]) {
        match &mut self.inner {
            Meter::Known(_) => {}
            Meter::Json(path, scanner) => scanner.feed(path, chunk),
            Meter::Sse(path, scanner) => scanner.feed(path, chunk),
        }
    }

    /// The answer, once the whole body has been fed. Finishing early (a body cut short) answers
    /// what a body ending there would: a JSON body is then [`BadReason::Truncated`], a stream
    /// answers from the events complete so far.
    #[must_use]
    pub fn finish(self) -> Usage {
        match self.inner {
            Meter::Known(usage) => usage,
            Meter::Json(_, scanner) => match scanner.finish() {
                JsonEnd::Empty => Usage::Missing(MissingReason::EmptyBody),
                JsonEnd::Invalid(reason) => Usage::Bad(reason),
                JsonEnd::Valid(None) => Usage::Missing(MissingReason::NotInBody),
                JsonEnd::Valid(Some(usage)) => usage,
            },
            Meter::Sse(_, scanner) => scanner
                .finish()
                .unwrap_or(Usage::Missing(MissingReason::NotInStream)),
        }
    }
}

/// The cost of a response whose whole body is at hand: a [`UsageMeter`] fed `body` in one
/// chunk.
pub fn read_usage(cost_from: &CostFrom, headers: &HeaderMap, body: &[u8]) -> Usage {
    let mut meter = UsageMeter::new(cost_from, headers);
    meter.feed(body);
    meter.finish()
}

#[cfg(test)]
mod tests;
