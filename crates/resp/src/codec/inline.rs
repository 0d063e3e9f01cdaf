//! Inline commands: one line of words (`PING`, `CL.THROTTLE k 10 5 60`), as `telnet` and
//! hand-written scripts send them, split the way redis-server splits them (its
//! `sdssplitargs`): blanks separate words; `"..."` takes `\n \r \t \b \a \\ \"` and `\xHH`
//! escapes; `'...'` takes `\'`; a closing quote must end its word; a NUL ends the line.

use std::borrow::Cow;

use super::{FrameLimits, Parsed, ProtocolError, Request};

/// Parses the inline command at the start of `buf`.
pub(super) fn parse<'a>(buf: &'a [u8], limits: &FrameLimits) -> Result<Parsed<'a>, ProtocolError> {
    let Some(newline) = memchr::memchr(b'\n', buf) else {
        if buf.len() > limits.max_request_bytes {
            return Err(too_big());
        }
        return Ok(Parsed::Incomplete);
    };
    if newline > limits.max_request_bytes {
        return Err(too_big());
    }
    let mut line = &buf[..newline];
    if let [rest @ .., b'\r'] = line {
        line = rest;
    }
    // sdssplitargs reads a C string: nothing after a NUL counts.
    if let Some(nul) = memchr::memchr(0, line) {
        line = &line[..nul];
    }
    let request = split(line, limits)?;
    Ok(Parsed::Request(request, newline + 1))
}

#[cold]
fn too_big() -> ProtocolError {
    ProtocolError::new("Protocol error: too big inline request")
}

#[cold]
fn unbalanced() -> ProtocolError {
    ProtocolError::new("Protocol error: unbalanced quotes in request")
}

/// C's `isspace`, which separates words before they start.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

/// Splits `line` into words.
fn split<'a>(line: &'a [u8], limits: &FrameLimits) -> Result<Request<'a>, ProtocolError> {
    let mut request = Request::default();
    let mut p = 0;
    loop {
        while p < line.len() && is_space(line[p]) {
            p += 1;
        }
        if p == line.len() {
            return Ok(request);
        }
        if request.len() == limits.max_args {
            return Err(ProtocolError::new(
                "Protocol error: too many arguments in inline request",
            ));
        }
        let (word, next) = word(line, p)?;
        request.push(word);
        p = next;
    }
}

/// Where a quoted part of a word stands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Quote {
    None,
    Double,
    Single,
}

/// The word starting at `start` (not a blank), and where scanning resumes.
fn word(line: &[u8], start: usize) -> Result<(Cow<'_, [u8]>, usize), ProtocolError> {
    let at = |i: usize| line.get(i).copied();
    // Borrowed until a quote turns up; from then on the unescaped bytes are collected.
    let mut owned: Option<Vec<u8>> = None;
    let mut quote = Quote::None;
    let mut p = start;
    loop {
        match quote {
            Quote::None => match at(p) {
                None | Some(b' ' | b'\n' | b'\r' | b'\t') => {
                    let word = match owned {
                        Some(bytes) => Cow::Owned(bytes),
                        None => Cow::Borrowed(&line[start..p]),
                    };
                    return Ok((word, p));
                }
                Some(q @ (b'"' | b'\'')) => {
                    if owned.is_none() {
                        owned = Some(line[start..p].to_vec());
                    }
                    quote = if q == b'"' {
                        Quote::Double
                    } else {
                        Quote::Single
                    };
                    p += 1;
                }
                Some(b) => {
                    if let Some(bytes) = owned.as_mut() {
                        bytes.push(b);
                    }
                    p += 1;
                }
            },
            Quote::Double => {
                let bytes = owned.get_or_insert_with(Vec::new);
                match (at(p), at(p + 1)) {
                    (None, _) => return Err(unbalanced()),
                    (Some(b'\\'), Some(b'x'))
                        if at(p + 2).is_some_and(|b| b.is_ascii_hexdigit())
                            && at(p + 3).is_some_and(|b| b.is_ascii_hexdigit()) =>
                    {
                        bytes.push(hex(line[p + 2]) * 16 + hex(line[p + 3]));
                        p += 4;
                    }
                    (Some(b'\\'), Some(escaped)) => {
                        bytes.push(match escaped {
                            b'n' => b'\n',
                            b'r' => b'\r',
                            b't' => b'\t',
                            b'b' => 0x08,
                            b'a' => 0x07,
                            other => other,
                        });
                        p += 2;
                    }
                    (Some(b'"'), next) => {
                        close_quote(next)?;
                        return Ok((Cow::Owned(std::mem::take(bytes)), p + 1));
                    }
                    (Some(b), _) => {
                        bytes.push(b);
                        p += 1;
                    }
                }
            }
            Quote::Single => {
                let bytes = owned.get_or_insert_with(Vec::new);
                match (at(p), at(p + 1)) {
                    (None, _) => return Err(unbalanced()),
                    (Some(b'\\'), Some(b'\'')) => {
                        bytes.push(b'\'');
                        p += 2;
                    }
                    (Some(b'\''), next) => {
                        close_quote(next)?;
                        return Ok((Cow::Owned(std::mem::take(bytes)), p + 1));
                    }
                    (Some(b), _) => {
                        bytes.push(b);
                        p += 1;
                    }
                }
            }
        }
    }
}

/// A closing quote must be followed by a blank or the end of the line.
fn close_quote(next: Option<u8>) -> Result<(), ProtocolError> {
    match next {
        Some(b) if !is_space(b) => Err(unbalanced()),
        _ => Ok(()),
    }
}

/// The value of an ASCII hex digit (checked by the caller).
fn hex(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        _ => b.wrapping_sub(b'A').wrapping_add(10),
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse_request;
    use super::*;

    fn words(line: &[u8]) -> Result<Vec<Vec<u8>>, String> {
        match parse_request(line, &FrameLimits::default()) {
            Ok(Parsed::Request(r, n)) => {
                assert_eq!(n, line.len());
                Ok(r.args().into_iter().map(<[u8]>::to_vec).collect())
            }
            Ok(Parsed::Incomplete) => Err("incomplete".to_owned()),
            Err(e) => Err(e.message().to_owned()),
        }
    }

    fn ok(ws: &[&[u8]]) -> Result<Vec<Vec<u8>>, String> {
        Ok(ws.iter().map(|w| w.to_vec()).collect())
    }

    #[test]
    fn words_split_as_redis_splits_them() {
        // Each answer below but the NUL's is what redis-server 7.0 answered to the same line.
        assert_eq!(words(b"PING\r\n"), ok(&[b"PING"]));
        assert_eq!(words(b"PING\n"), ok(&[b"PING"]));
        assert_eq!(words(b" \t PING  a\tb \r\n"), ok(&[b"PING", b"a", b"b"]));
        assert_eq!(words(b"   \r\n"), ok(&[]));
        assert_eq!(words(b"\r\n"), ok(&[]));
        assert_eq!(words(b"ECHO \"a b\"\r\n"), ok(&[b"ECHO", b"a b"]));
        assert_eq!(words(b"ECHO \"a\\x41\\n\"\r\n"), ok(&[b"ECHO", b"aA\n"]));
        assert_eq!(words(b"ECHO \"\\x4\"\r\n"), ok(&[b"ECHO", b"x4"]));
        assert_eq!(words(b"ECHO 'it\\'s'\r\n"), ok(&[b"ECHO", b"it's"]));
        assert_eq!(words(b"ECHO 'a\\nb'\r\n"), ok(&[b"ECHO", b"a\\nb"]));
        assert_eq!(words(b"ECHO a\"b c\" d\r\n"), ok(&[b"ECHO", b"ab c", b"d"]));
        assert_eq!(words(b"ECHO \"\"\r\n"), ok(&[b"ECHO", b""]));
        assert_eq!(words(b"ECHO a\x0bb\r\n"), ok(&[b"ECHO", b"a\x0bb"]));
        // Redis looks for the end of the line with `strchr`, which stops at a NUL, so it waits
        // for ever for this line; the door reads up to the NUL, as Redis's splitting does.
        assert_eq!(words(b"ECHO a\x00b c\r\n"), ok(&[b"ECHO", b"a"]));
        for bad in [
            &b"ECHO \"unbalanced\r\n"[..],
            b"ECHO \"a\"b\r\n",
            b"ECHO a\"b c\"d\r\n",
            b"ECHO 'x\r\n",
            b"ECHO \"a\\\r\n",
            b"ECHO \"a\x00\"\r\n",
        ] {
            assert_eq!(
                words(bad),
                Err("Protocol error: unbalanced quotes in request".to_owned()),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn lines_are_bounded() {
        let limits = FrameLimits {
            max_request_bytes: 16,
            max_args: 3,
        };
        assert_eq!(
            parse_request(&[b'a'; 17], &limits).map(|_| ()),
            Err(too_big())
        );
        assert_eq!(parse_request(&[b'a'; 16], &limits), Ok(Parsed::Incomplete));
        assert!(parse_request(b"a b c d\r\n", &limits).is_err());
        assert!(parse_request(b"a b c\r\n", &limits).is_ok());
    }
}
