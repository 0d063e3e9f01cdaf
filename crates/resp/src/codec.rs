//! The RESP codec: requests in (arrays of bulk strings, or inline commands as `redis-cli` and
//! `telnet` send them), replies out in RESP2 or RESP3.
//!
//! Parsing never panics and never allocates for a request of up to eight arguments sent as an
//! array: the arguments borrow the read buffer. Only an inline argument with quotes or escapes
//! is copied, to hold its unescaped bytes.
//!
//! ```
//! use tollgate_resp::codec::{FrameLimits, Parsed, parse_request};
//!
//! let limits = FrameLimits::default();
//! let buf = b"*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\nPING\r\n";
//! let Parsed::Request(first, used) = parse_request(buf, &limits)? else { panic!() };
//! assert_eq!(first.args(), [&b"ECHO"[..], &b"hi"[..]]);
//! let Parsed::Request(second, _) = parse_request(&buf[used..], &limits)? else { panic!() };
//! assert_eq!(second.args(), [&b"PING"[..]]);
//! # Ok::<(), tollgate_resp::codec::ProtocolError>(())
//! ```

mod inline;
mod multibulk;
mod reply;

use std::borrow::Cow;
use std::fmt;

use smallvec::SmallVec;

pub use reply::{Protocol, ReplyBuf};

/// Bounds on one request, checked while it is parsed (before its bytes have all arrived).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameLimits {
    /// The largest request in bytes: a whole array frame with its headers, any one bulk string
    /// in it, and an inline command line. Default 64 KiB, Redis's inline limit.
    pub max_request_bytes: usize,
    /// The most arguments in one request, command name included. Default 1024.
    pub max_args: usize,
}

impl Default for FrameLimits {
    fn default() -> Self {
        FrameLimits {
            max_request_bytes: 64 * 1024,
            max_args: 1024,
        }
    }
}

/// One command and its arguments.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request<'a> {
    args: SmallVec<[Cow<'a, [u8]>; 8]>,
}

impl<'a> Request<'a> {
    /// The arguments, the command name first.
    #[inline]
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u8]> {
        self.args.iter().map(|a| a.as_ref())
    }

    /// The arguments collected, the command name first (for tests and logs).
    pub fn args(&self) -> Vec<&[u8]> {
        self.iter().collect()
    }

    /// The `i`th argument (0 is the command name).
    #[inline]
    pub fn arg(&self, i: usize) -> Option<&[u8]> {
        self.args.get(i).map(|a| a.as_ref())
    }

    /// How many arguments, the command name included.
    #[inline]
    pub fn len(&self) -> usize {
        self.args.len()
    }

    /// Whether there is no command at all (an empty array or a blank line, which Redis skips).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.args.is_empty()
    }

    #[inline]
    fn push(&mut self, arg: Cow<'a, [u8]>) {
        self.args.push(arg);
    }
}

/// What [`parse_request`] found at the start of a buffer.
// The request is large (its arguments inline) and moved once, to the caller: boxing it would
// cost an allocation per request.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed<'a> {
    /// A complete request and the bytes it took. It may be [empty](Request::is_empty): an
    /// empty array or a blank inline line, which take bytes but are no command.
    Request(Request<'a>, usize),
    /// The buffer holds the start of a request, within the limits: read more.
    Incomplete,
}

/// A request that breaks the protocol or a limit; Redis answers `-ERR Protocol error: ...`
/// and closes the connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtocolError {
    message: Cow<'static, str>,
}

impl ProtocolError {
    fn new(message: &'static str) -> Self {
        ProtocolError {
            message: Cow::Borrowed(message),
        }
    }

    fn owned(message: String) -> Self {
        ProtocolError {
            message: Cow::Owned(message),
        }
    }

    /// The error as the reply carries it, after `-ERR `: `Protocol error: ...`.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ProtocolError {}

/// Parses the request at the start of `buf`: an array of bulk strings when it starts with
/// `*`, else an inline command line, as redis-server tells them apart.
///
/// Stricter than redis-server in one way: a bulk string must be followed by CRLF, where Redis
/// skips the two bytes unread; a client whose lengths are wrong gets a protocol error rather
/// than a misread command.
pub fn parse_request<'a>(buf: &'a [u8], limits: &FrameLimits) -> Result<Parsed<'a>, ProtocolError> {
    match buf.first() {
        None => Ok(Parsed::Incomplete),
        Some(b'*') => multibulk::parse(buf, limits),
        Some(_) => inline::parse(buf, limits),
    }
}

/// Redis's `string2ll`, which reads every length and number of the protocol: an optional `-`
/// then digits, no leading zero (but `0` itself), no `+`, no space, within `i64`.
pub(crate) fn strict_i64(s: &[u8]) -> Option<i64> {
    let (negative, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    match digits {
        [] => return None,
        [b'0'] => return (!negative).then_some(0),
        [b'0', ..] => return None,
        _ => {}
    }
    decimal(digits, negative)
}

/// `digits` (ASCII, at least one) as an `i64`, negated when `negative`; `None` for any other
/// byte or past `i64`. The sign and leading-zero rules are the caller's.
pub(crate) fn decimal(digits: &[u8], negative: bool) -> Option<i64> {
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        let d = i64::from(d - b'0');
        n = n.checked_mul(10)?;
        n = if negative {
            n.checked_sub(d)?
        } else {
            n.checked_add(d)?
        };
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_numbers_are_redis_string2ll() {
        for (s, n) in [
            ("0", Some(0)),
            ("7", Some(7)),
            ("-12", Some(-12)),
            ("9223372036854775807", Some(i64::MAX)),
            ("-9223372036854775808", Some(i64::MIN)),
            ("9223372036854775808", None),
            ("-0", None),
            ("00", None),
            ("01", None),
            ("+1", None),
            ("", None),
            ("-", None),
            (" 1", None),
            ("1 ", None),
            ("1a", None),
        ] {
            assert_eq!(strict_i64(s.as_bytes()), n, "{s:?}");
        }
    }
}
