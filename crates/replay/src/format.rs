//! Access-log formats: what a line of a log says about the request it records.
//!
//! - **combined**: nginx's and Apache's `combined` format (Apache's `common` too, which stops
//!   after the size), optionally followed by the fields Tollgate's documented `log_format`
//!   adds: `"$http_x_api_key"`, `$msec` (when nginx wrote the line, to the millisecond, used
//!   instead of the whole-second `$time_local`) and `$request_time` (how long the request
//!   took: the request is replayed at its arrival, the line's time less this).
//! - **json**: one JSON object per line, with field names given by [`JsonFields`].
//! - **auto**: decided per file from its first non-blank line (`{` means JSON).

mod combined;
mod json;
mod time;

use std::borrow::Cow;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use tollgate::Timestamp;

pub use json::JsonFields;

/// Which format the logs are in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// nginx/Apache combined (or common) log format.
    Combined,
    /// JSON lines.
    Json,
    /// Decided per file from its first non-blank line.
    #[default]
    Auto,
}

impl FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "combined" => Ok(Format::Combined),
            "json" => Ok(Format::Json),
            "auto" => Ok(Format::Auto),
            _ => Err(format!(
                "unknown log format {s:?}; use combined, json or auto"
            )),
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Combined => "combined",
            Format::Json => "json",
            Format::Auto => "auto",
        })
    }
}

impl Format {
    /// The format of a file whose first non-blank line is `line`, when this one is `Auto`.
    pub fn resolve(self, line: &[u8]) -> Format {
        match self {
            Format::Auto if line.trim_ascii_start().starts_with(b"{") => Format::Json,
            Format::Auto => Format::Combined,
            other => other,
        }
    }
}

/// One logged request, borrowed from its line (or from the parser that read it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedRequest<'a> {
    /// When it was made.
    pub time: Timestamp,
    /// The method.
    pub method: http::Method,
    /// The request target: the path and the query, as sent.
    pub target: Cow<'a, str>,
    /// The host it was for, when the log says.
    pub host: Option<Cow<'a, str>>,
    /// The client's address.
    pub ip: Option<IpAddr>,
    /// The API key it carried (the `x-api-key` header unless told otherwise).
    pub api_key: Option<Cow<'a, [u8]>>,
    /// The authenticated user, for the `user` key selector.
    pub user: Option<Cow<'a, str>>,
    /// The status the server answered with (`count_status` counts by it): a code from 100 to
    /// 999, or none.
    pub status: Option<u16>,
    /// What the request cost, when the log says (`charge = "response"` charges it).
    pub cost: Option<Cost>,
    /// How long the request took, when the log says (`$request_time`): a concurrency limit's
    /// slot is held for it.
    pub took: Option<std::time::Duration>,
}

/// What a line says a request cost, for the policies charged by the response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cost {
    /// A whole number (digits only; more than a `u64` holds reads as `u64::MAX`, above every
    /// policy's bound like the number it stands for).
    Whole(u64),
    /// Not a whole number (`12.5`, `-3`, `1e3`, `+5`, `abc`, `true`): the request is still
    /// replayed, and a policy charged by the response charges it its `cost`, as the server does
    /// a response whose cost is bad.
    Bad,
}

impl Cost {
    /// `text` read as the server reads a `header:` cost: ASCII digits, spaces around them
    /// allowed, and nothing else.
    pub(crate) fn read(text: &[u8]) -> Cost {
        let digits = text.trim_ascii();
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return Cost::Bad;
        }
        let value = digits.iter().try_fold(0u64, |n, d| {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        });
        Cost::Whole(value.unwrap_or(u64::MAX))
    }
}

/// `text` as a status the server could have answered with, a code from 100 to 999: nginx's
/// `000` (no response was sent) and anything else say nothing of how the request ended.
fn status_code(text: &[u8]) -> Option<u16> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|s| (100..=999).contains(s))
}

/// Why a line is not a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineError(pub Cow<'static, str>);

impl LineError {
    pub(crate) fn new(reason: &'static str) -> Self {
        LineError(Cow::Borrowed(reason))
    }
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Reads lines of one format into requests.
#[derive(Debug)]
pub struct Parser {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Combined(combined::Parser),
    // Boxed: one parser per file, made once; the enum stays small either way.
    Json(Box<json::Parser>),
}

impl Parser {
    /// A parser for `format` (`Auto` reads combined; resolve it first with [`Format::resolve`]).
    pub fn new(format: Format, fields: &JsonFields) -> Self {
        let kind = match format {
            Format::Json => Kind::Json(Box::new(json::Parser::new(fields.clone()))),
            Format::Combined | Format::Auto => Kind::Combined(combined::Parser::default()),
        };
        Parser { kind }
    }

    /// The request `line` records (without its line ending).
    pub fn parse<'a>(&'a mut self, line: &'a [u8]) -> Result<LoggedRequest<'a>, LineError> {
        match &mut self.kind {
            Kind::Combined(p) => p.parse(line),
            Kind::Json(p) => p.parse(line),
        }
    }
}

/// A request target split into host (absolute form, as proxies receive it) and path.
fn split_target(target: Cow<'_, str>) -> Result<(Cow<'_, str>, Option<Cow<'_, str>>), LineError> {
    if target.starts_with('/') || target == "*" {
        return Ok((target, None));
    }
    let rest = target
        .strip_prefix("http://")
        .or_else(|| target.strip_prefix("https://"));
    let Some(rest) = rest else {
        return Err(LineError::new(
            "the request target is neither a path nor an absolute URL",
        ));
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let host = authority.rsplit('@').next().unwrap_or(authority);
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_owned()
    };
    Ok((Cow::Owned(path), Some(Cow::Owned(host.to_owned()))))
}

/// `"-"` and `""` mean the field was absent.
fn present(value: &[u8]) -> Option<&[u8]> {
    (!value.is_empty() && value != b"-").then_some(value)
}

/// The method named `name`; an unknown token is kept as an extension method, as a server
/// would receive it.
fn method(name: &[u8]) -> Result<http::Method, LineError> {
    http::Method::from_bytes(name).map_err(|_| LineError::new("the method is not an HTTP token"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_targets_give_host_and_path() -> Result<(), LineError> {
        let (path, host) = split_target(Cow::Borrowed("http://api.example.com:8080?x=1"))?;
        assert_eq!(path, "/?x=1");
        assert_eq!(host.as_deref(), Some("api.example.com:8080"));
        let (path, host) = split_target(Cow::Borrowed("/v1/a?b"))?;
        assert_eq!((path.as_ref(), host), ("/v1/a?b", None));
        assert!(split_target(Cow::Borrowed("\\x16\\x03")).is_err());
        Ok(())
    }

    #[test]
    fn costs_are_read_as_the_server_reads_a_header() {
        assert_eq!(Cost::read(b"12"), Cost::Whole(12));
        assert_eq!(Cost::read(b" 0 "), Cost::Whole(0));
        assert_eq!(
            Cost::read(b"99999999999999999999999"),
            Cost::Whole(u64::MAX)
        );
        for bad in [
            &b""[..],
            b"12.5",
            b"-3",
            b"+5",
            b"1e3",
            b"abc",
            b"1 2",
            b"0x10",
        ] {
            assert_eq!(
                Cost::read(bad),
                Cost::Bad,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn only_codes_from_100_to_999_are_statuses() {
        assert_eq!(status_code(b"401"), Some(401));
        for none in [&b"000"[..], b"0", b"99", b"1000", b"-", b"abc", b""] {
            assert_eq!(status_code(none), None, "{}", String::from_utf8_lossy(none));
        }
    }

    #[test]
    fn auto_looks_at_the_first_character() {
        assert_eq!(Format::Auto.resolve(b"  {\"a\":1}"), Format::Json);
        assert_eq!(Format::Auto.resolve(b"1.2.3.4 - -"), Format::Combined);
        assert_eq!(Format::Json.resolve(b"1.2.3.4"), Format::Json);
    }
}
