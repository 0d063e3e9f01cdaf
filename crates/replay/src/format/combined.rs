//! nginx/Apache `combined` (and `common`) lines:
//!
//! ```text
//! $remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent" ["$http_x_api_key"] [$msec] [$request_time]
//! ```
//!
//! nginx writes `$time_local` and `$msec` when the request ends (`$msec` to the millisecond);
//! `$request_time` is how long the request took, so a line that has it is replayed at the
//! request's arrival, when the server decided it: its time less `$request_time`.
//!
//! Quoted fields are read as nginx and Apache escape them (`\xHH`, `\"`, `\\`), so an API key
//! with odd bytes becomes the same bytes the server received, and hashes to the same key.

use std::borrow::Cow;
use std::time::Duration;

use memchr::{memchr, memchr2};

use tollgate::Timestamp;

use super::time::{TimeCache, from_epoch_number};
use super::{Cost, LineError, LoggedRequest, method, present, split_target, status_code};

/// Reads combined lines.
#[derive(Debug, Default)]
pub(crate) struct Parser {
    times: TimeCache,
}

impl Parser {
    pub(crate) fn parse<'a>(&mut self, line: &'a [u8]) -> Result<LoggedRequest<'a>, LineError> {
        let space = memchr(b' ', line).ok_or_else(|| LineError::new("not a combined log line"))?;
        let ip = std::str::from_utf8(&line[..space])
            .ok()
            .and_then(|s| s.parse().ok());
        let open = memchr(b'[', line).ok_or_else(|| LineError::new("no [time] field"))?;
        let close = memchr(b']', &line[open..])
            .map(|i| open + i)
            .ok_or_else(|| LineError::new("the [time] field is not closed"))?;
        let mut time = self.times.local(&line[open + 1..close])?;
        let mut rest = &line[close + 1..];
        let request = quoted(&mut rest)?.ok_or_else(|| LineError::new("no \"request\" field"))?;
        let status = token(&mut rest).ok_or_else(|| LineError::new("no status field"))?;
        // nginx writes `$status` as three digits (`000` when there was none) and Apache a
        // number or `-`: anything else means the fields have slipped, as when the request's
        // closing quote is misplaced, and the rest of the line cannot be trusted either.
        if status != b"-" && !status.iter().all(u8::is_ascii_digit) {
            return Err(LineError::new(
                "the field after the request is not a status",
            ));
        }
        let status = status_code(status);
        let _size = token(&mut rest);
        let _referer = quoted(&mut rest)?;
        let _agent = quoted(&mut rest)?;
        let api_key = quoted(&mut rest)?;
        let (msec, took, cost) = trailing_times(&mut rest)?;
        if let Some(msec) = msec {
            time = msec;
        }
        if let Some(took) = took {
            time = time.saturating_sub(took);
        }
        let (method, target) = request_line(request)?;
        let (target, host) = split_target(target)?;
        Ok(LoggedRequest {
            time,
            method,
            target,
            host,
            ip,
            api_key: api_key.filter(|k| present(k).is_some()),
            user: None,
            status,
            cost,
            took,
        })
    }
}

/// Seconds below this are a duration (`$request_time`), from it a time (`$msec`): 10^8 s is
/// three years as the one and March 1973 as the other, and no log holds either.
const TIME_FROM: f64 = 1e8;

/// What ends a line: `[$msec] [$request_time] [cost]`.
type Trailing = (Option<Timestamp>, Option<Duration>, Option<Cost>);

/// `[$msec] [$request_time] [cost]` at the end of the line: when nginx wrote it, how long the
/// request took, and what it cost (`$upstream_http_x_usage_tokens`: the usage the upstream
/// answered with; `-` for none, anything but digits a bad cost), which needs both times
/// before it. Either time may stand alone; a lone number is told apart by its size.
fn trailing_times(rest: &mut &[u8]) -> Result<Trailing, LineError> {
    let number = |t: &[u8]| {
        std::str::from_utf8(t)
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|n| n.is_finite() && *n >= 0.0)
    };
    let not_msec = || LineError::new("the field after the API key is not $msec or $request_time");
    let msec = |n: f64| from_epoch_number(n).ok_or_else(not_msec);
    let took = |n: f64| {
        Duration::try_from_secs_f64(n)
            .map_err(|_| LineError::new("the field after $msec is not $request_time"))
    };
    let first = token(rest);
    let second = token(rest);
    let cost = match token(rest) {
        None | Some(b"-") => None,
        Some(c) => Some(Cost::read(c)),
    };
    if !rest.trim_ascii().is_empty() {
        return Err(LineError::new(
            "unexpected fields after $msec $request_time cost",
        ));
    }
    let Some(first) = first else {
        return Ok((None, None, None));
    };
    let first = number(first).ok_or_else(not_msec)?;
    match second {
        None if first >= TIME_FROM => Ok((Some(msec(first)?), None, None)),
        None => Ok((None, Some(took(first)?), None)),
        Some(_) if first < TIME_FROM => Err(LineError::new(
            "the field after the API key is not $msec (seconds since the epoch)",
        )),
        Some(second) => {
            let second = number(second)
                .filter(|n| *n < TIME_FROM)
                .ok_or_else(|| LineError::new("the field after $msec is not $request_time"))?;
            Ok((Some(msec(first)?), Some(took(second)?), cost))
        }
    }
}

/// `METHOD TARGET [PROTOCOL]`.
fn request_line(request: Cow<'_, [u8]>) -> Result<(http::Method, Cow<'_, str>), LineError> {
    let bad = || LineError::new("the request is not METHOD TARGET PROTOCOL");
    let (method_end, target) = {
        let bytes: &[u8] = &request;
        let first = memchr(b' ', bytes).ok_or_else(bad)?;
        let after = &bytes[first + 1..];
        let second = memchr(b' ', after).unwrap_or(after.len());
        (first, first + 1..first + 1 + second)
    };
    let method = method(&request[..method_end])?;
    if target.is_empty() {
        return Err(bad());
    }
    let target = match request {
        Cow::Borrowed(b) => String::from_utf8_lossy(&b[target]),
        Cow::Owned(b) => Cow::Owned(String::from_utf8_lossy(&b[target]).into_owned()),
    };
    Ok((method, target))
}

/// The next space-separated token, if any.
fn token<'a>(rest: &mut &'a [u8]) -> Option<&'a [u8]> {
    let trimmed = rest.trim_ascii_start();
    if trimmed.is_empty() {
        *rest = trimmed;
        return None;
    }
    let end = memchr(b' ', trimmed).unwrap_or(trimmed.len());
    *rest = &trimmed[end..];
    Some(&trimmed[..end])
}

/// The next `"quoted"` field, unescaped; `None` when the line has no more fields.
fn quoted<'a>(rest: &mut &'a [u8]) -> Result<Option<Cow<'a, [u8]>>, LineError> {
    let trimmed = rest.trim_ascii_start();
    let Some(body) = trimmed.strip_prefix(b"\"") else {
        if trimmed.is_empty() || trimmed.first().is_some_and(u8::is_ascii_digit) {
            // The end of the line, or a number ($msec, $request_time) where the optional
            // quoted fields stop.
            return Ok(None);
        }
        return Err(LineError::new("expected a \"quoted\" field"));
    };
    let mut i = 0;
    let mut escaped = false;
    loop {
        let Some(at) = memchr2(b'"', b'\\', &body[i..]) else {
            return Err(LineError::new("a quoted field is not closed"));
        };
        i += at;
        if body[i] == b'"' {
            break;
        }
        escaped = true;
        i += 2;
        if i > body.len() {
            return Err(LineError::new("a quoted field is not closed"));
        }
    }
    let after = &body[i + 1..];
    // Both servers escape a quote inside a field (nginx `\x22`, Apache `\"`), so the quote
    // that closes one is followed by the space before the next field or by the end of the
    // line. A quote followed by anything else is not a closing one: the line's quotes are
    // misplaced (`"GET /a HTTP/1.1 200 10 "-" ...`), and reading on would take the next field
    // for the end of this one.
    if after.first().is_some_and(|b| !b.is_ascii_whitespace()) {
        return Err(LineError::new(
            "a quoted field's closing quote is not followed by a space: misplaced quotes",
        ));
    }
    *rest = after;
    let raw = &body[..i];
    Ok(Some(if escaped {
        Cow::Owned(unescape(raw))
    } else {
        Cow::Borrowed(raw)
    }))
}

/// `\xHH` (nginx), `\"`, `\\`, `\n`, `\t` (Apache) back to bytes.
fn unescape(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] != b'\\' || i + 1 == raw.len() {
            out.push(raw[i]);
            i += 1;
            continue;
        }
        let hex = |b: Option<&u8>| b.and_then(|&b| (b as char).to_digit(16));
        match raw[i + 1] {
            b'x' => {
                if let (Some(h), Some(l)) = (hex(raw.get(i + 2)), hex(raw.get(i + 3))) {
                    // Two hex digits: at most 255.
                    out.push(u8::try_from(h * 16 + l).unwrap_or(u8::MAX));
                    i += 4;
                    continue;
                }
                out.extend_from_slice(b"\\x");
            }
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'"' | b'\\' => out.push(raw[i + 1]),
            other => {
                out.push(b'\\');
                out.push(other);
            }
        }
        i += 2;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &[u8] = br#"203.0.113.9 - alice [10/Oct/2000:13:55:36 -0700] "GET /v1/items?page=2 HTTP/1.1" 200 2326 "http://example.com/" "curl/8.0""#;

    #[test]
    fn combined_lines_give_every_field() -> Result<(), LineError> {
        let mut p = Parser::default();
        let r = p.parse(LINE)?;
        assert_eq!(r.time, Timestamp::from_secs(971_211_336));
        assert_eq!(r.method, http::Method::GET);
        assert_eq!(r.target, "/v1/items?page=2");
        assert_eq!(r.ip, "203.0.113.9".parse().ok());
        assert_eq!((r.api_key, r.host, r.user), (None, None, None));
        Ok(())
    }

    #[test]
    fn the_tollgate_format_adds_the_key_and_msec() -> Result<(), LineError> {
        let mut p = Parser::default();
        let mut line = LINE.to_vec();
        line.extend_from_slice(br#" "k\x22ey\"1" 971211336.250"#);
        let r = p.parse(&line)?;
        assert_eq!(r.api_key.as_deref(), Some(&b"k\"ey\"1"[..]));
        assert_eq!(r.time, Timestamp::from_micros(971_211_336_250_000));
        let mut absent = LINE.to_vec();
        absent.extend_from_slice(br#" "-" 971211336.250"#);
        assert_eq!(p.parse(&absent)?.api_key, None);
        Ok(())
    }

    #[test]
    fn request_time_after_msec_gives_the_arrival() -> Result<(), LineError> {
        let mut p = Parser::default();
        let mut line = LINE.to_vec();
        line.extend_from_slice(br#" "k1" 971211336.250 0.125"#);
        let r = p.parse(&line)?;
        assert_eq!(r.api_key.as_deref(), Some(&b"k1"[..]));
        assert_eq!(r.time, Timestamp::from_micros(971_211_336_125_000));
        // Alone after the user agent (nginx's combined plus $request_time): taken from the
        // whole-second $time_local.
        let mut line = LINE.to_vec();
        line.extend_from_slice(b" 1.500");
        let r = p.parse(&line)?;
        assert_eq!(
            (r.api_key, r.time),
            (None, Timestamp::from_micros(971_211_334_500_000))
        );
        // After the key, without $msec.
        let mut line = LINE.to_vec();
        line.extend_from_slice(br#" "-" 0.004"#);
        assert_eq!(
            p.parse(&line)?.time,
            Timestamp::from_micros(971_211_335_996_000)
        );
        Ok(())
    }

    /// The cost after `$request_time`: digits, `-` for none, and anything else a bad cost
    /// (the request is replayed all the same); `000` and `-` statuses are none.
    #[test]
    fn the_cost_after_request_time() -> Result<(), LineError> {
        let mut p = Parser::default();
        for (status, cost, want) in [
            ("200", "12", (Some(200), Some(Cost::Whole(12)))),
            ("401", "-", (Some(401), None)),
            ("000", "2.5", (None, Some(Cost::Bad))),
            ("-", "-3", (None, Some(Cost::Bad))),
            ("200", "abc", (Some(200), Some(Cost::Bad))),
        ] {
            let line = format!(
                "1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] \"GET / HTTP/1.1\" {status} 1 \"r\" \"a\" \"k\" 971211336.250 0.1 {cost}"
            );
            let r = p.parse(line.as_bytes())?;
            assert_eq!((r.status, r.cost), want, "{line}");
        }
        Ok(())
    }

    #[test]
    fn the_common_format_stops_after_the_size() -> Result<(), LineError> {
        let mut p = Parser::default();
        let line = br#"::1 - - [10/Oct/2000:13:55:36 +0000] "POST http://api.example.com/v1/x HTTP/1.0" 201 -"#;
        let r = p.parse(line)?;
        assert_eq!(r.method, http::Method::POST);
        assert_eq!(
            (r.target.as_ref(), r.host.as_deref()),
            ("/v1/x", Some("api.example.com"))
        );
        Ok(())
    }

    #[test]
    fn broken_lines_say_why() {
        let mut p = Parser::default();
        for (line, needle) in [
            (&b"garbage"[..], "combined"),
            (b"1.2.3.4 - - 10/Oct/2000", "[time]"),
            (b"1.2.3.4 - - [10/Oct/2000:13:55:36 -0700", "not closed"),
            (b"1.2.3.4 - - [yesterday] \"GET / HTTP/1.1\" 200 1", "time"),
            (b"1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] \"-\" 400 0", "METHOD"),
            (b"1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] \"GET / HTTP/1.1", "not closed"),
            (b"1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] \"GET / HTTP/1.1\" 200 1 \"r\" \"a\" \"k\" soon", "$msec"),
            (b"1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] \"GET / HTTP/1.1\" 200 1 \"r\" \"a\" \"k\" 971211336.250 0.1 2 3", "unexpected"),
            (b"1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] \"GET / HTTP/1.1\" 200 1 \"r\" \"a\" \"k\" 1 2", "$msec"),
            (b"1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] \"GET / HTTP/1.1\" 200 1 \"r\" \"a\" \"k\" 971211336.250 971211336.250", "$request_time"),
            (b"1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] \"GET / HTTP/1.1\" 200 1 \"r\" \"a\" \"k\" 971211336.250 -0.5", "$request_time"),
            (b"1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] \"G(T / HTTP/1.1\" 200 1", "token"),
        ] {
            let err = p.parse(line).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains(needle), "{}: {err}", String::from_utf8_lossy(line));
        }
    }

    /// A request whose closing quote is misplaced shifts every field after it: the line is
    /// refused rather than replayed with whatever the shifted fields happen to read as.
    #[test]
    fn misplaced_quotes_make_a_bad_line() {
        let mut p = Parser::default();
        for (line, needle) in [
            (
                &br#"10.0.0.1 - - [10/Oct/2024:13:55:41 +0000] "GET /v1/a HTTP/1.1 200 10 "-" "curl""#[..],
                "misplaced quotes",
            ),
            (
                br#"10.0.0.1 - - [10/Oct/2024:13:55:41 +0000] "GET /v1/a" HTTP/1.1" 200 10 "-" "curl""#,
                "not a status",
            ),
            (
                br#"10.0.0.1 - - [10/Oct/2024:13:55:41 +0000] "GET /v1/a HTTP/1.1" 200 10 "-"x "curl""#,
                "misplaced quotes",
            ),
        ] {
            let err = p.parse(line).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains(needle), "{}: {err:?}", String::from_utf8_lossy(line));
        }
        // What the servers write stays readable: quotes escaped inside a field (nginx \x22,
        // Apache \"), a tab after a field, the status nginx writes for none (000), or `-`.
        for line in [
            &br#"10.0.0.1 - - [10/Oct/2024:13:55:41 +0000] "GET /v1/\x22a HTTP/1.1" 200 10 "-" "say \x22hi\x22""#[..],
            br#"10.0.0.1 - - [10/Oct/2024:13:55:41 +0000] "GET /v1/a HTTP/1.1" 200 10 "-" "say \"hi\"""#,
            b"10.0.0.1 - - [10/Oct/2024:13:55:41 +0000] \"GET /v1/a HTTP/1.1\"\t499 0 \"-\" \"curl\"",
            br#"10.0.0.1 - - [10/Oct/2024:13:55:41 +0000] "GET /v1/a HTTP/1.1" 000 0 "-" "curl""#,
            br#"10.0.0.1 - - [10/Oct/2024:13:55:41 +0000] "GET /v1/a HTTP/1.1" - -"#,
        ] {
            assert!(p.parse(line).is_ok(), "{}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn escapes_are_undone() {
        assert_eq!(unescape(br#"a\x41\\\"\xZZ\"#), br#"aA\"\xZZ\"#.to_vec());
    }
}
