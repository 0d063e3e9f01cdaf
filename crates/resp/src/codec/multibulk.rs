//! Requests as arrays of bulk strings (`*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n`): what every client
//! library and `redis-benchmark` send. The arguments borrow the buffer.

use std::borrow::Cow;

use super::{FrameLimits, Parsed, ProtocolError, Request, strict_i64};

/// The longest length line accepted (`$` or `*` excluded): an `i64` has at most 20 characters,
/// so anything longer is garbage, refused without waiting for the rest of it.
const MAX_NUMBER_LINE: usize = 20;

/// Which header a length line is: their errors are worded differently, as Redis words them.
#[derive(Clone, Copy)]
enum Header {
    Count,
    Bulk,
}

/// Parses the array at the start of `buf`, which starts with `*`.
pub(super) fn parse<'a>(buf: &'a [u8], limits: &FrameLimits) -> Result<Parsed<'a>, ProtocolError> {
    let Some((count, mut pos)) = number_line(buf, 1, Header::Count)? else {
        return Ok(Parsed::Incomplete);
    };
    // Redis skips `*0` and `*-1` (no command); a count over the bound is refused before its
    // arguments arrive.
    if count <= 0 {
        return Ok(Parsed::Request(Request::default(), pos));
    }
    if count as u64 > limits.max_args as u64 {
        return Err(ProtocolError::new(
            "Protocol error: invalid multibulk length",
        ));
    }
    let mut request = Request::default();
    for _ in 0..count {
        match buf.get(pos) {
            None => return Ok(Parsed::Incomplete),
            Some(b'$') => {}
            Some(&other) => {
                return Err(ProtocolError::owned(format!(
                    "Protocol error: expected '$', got '{}'",
                    char::from(other)
                )));
            }
        }
        let Some((len, start)) = number_line(buf, pos + 1, Header::Bulk)? else {
            return Ok(Parsed::Incomplete);
        };
        if len < 0 || len as u64 > limits.max_request_bytes as u64 {
            return Err(ProtocolError::new("Protocol error: invalid bulk length"));
        }
        // `len` is at most `max_request_bytes` and `start` a few bytes into a bounded frame:
        // no sum here can overflow.
        let end = start + len as usize;
        if end + 2 > limits.max_request_bytes {
            return Err(too_big(limits));
        }
        let Some(terminator) = buf.get(end..end + 2) else {
            return Ok(Parsed::Incomplete);
        };
        if terminator != b"\r\n" {
            return Err(ProtocolError::new(
                "Protocol error: bulk string not terminated by CRLF",
            ));
        }
        request.push(Cow::Borrowed(&buf[start..end]));
        pos = end + 2;
    }
    Ok(Parsed::Request(request, pos))
}

/// The number on the line that starts at `at` (after its `*` or `$`), and where the next
/// line starts; `None` until the line is complete.
#[inline]
fn number_line(
    buf: &[u8],
    at: usize,
    header: Header,
) -> Result<Option<(i64, usize)>, ProtocolError> {
    let rest = buf.get(at..).unwrap_or_default();
    let window = &rest[..rest.len().min(MAX_NUMBER_LINE + 1)];
    let Some(cr) = window.iter().position(|&b| b == b'\r') else {
        if rest.len() > MAX_NUMBER_LINE {
            return Err(ProtocolError::new(match header {
                Header::Count => "Protocol error: too big mbulk count string",
                Header::Bulk => "Protocol error: too big bulk count string",
            }));
        }
        return Ok(None);
    };
    match rest.get(cr + 1) {
        None => return Ok(None),
        Some(b'\n') => {}
        Some(_) => {
            return Err(ProtocolError::new(
                "Protocol error: length not terminated by CRLF",
            ));
        }
    }
    match strict_i64(&rest[..cr]) {
        Some(n) => Ok(Some((n, at + cr + 2))),
        None => Err(ProtocolError::new(match header {
            Header::Count => "Protocol error: invalid multibulk length",
            Header::Bulk => "Protocol error: invalid bulk length",
        })),
    }
}

#[cold]
fn too_big(limits: &FrameLimits) -> ProtocolError {
    ProtocolError::owned(format!(
        "Protocol error: request larger than {} bytes",
        limits.max_request_bytes
    ))
}

#[cfg(test)]
mod tests {
    use super::super::parse_request;
    use super::*;

    fn parse_all(buf: &[u8]) -> Result<Parsed<'_>, ProtocolError> {
        parse_request(buf, &FrameLimits::default())
    }

    #[test]
    fn arrays_parse_and_every_prefix_is_incomplete() {
        let frame = b"*3\r\n$11\r\nCL.THROTTLE\r\n$0\r\n\r\n$3\r\na\nb\r\n";
        let Ok(Parsed::Request(r, n)) = parse_all(frame) else {
            panic!("not parsed")
        };
        assert_eq!(n, frame.len());
        assert_eq!(r.args(), [&b"CL.THROTTLE"[..], b"", b"a\nb"]);
        for cut in 0..frame.len() {
            assert_eq!(parse_all(&frame[..cut]), Ok(Parsed::Incomplete), "{cut}");
        }
    }

    #[test]
    fn empty_arrays_are_skipped_like_redis() {
        for frame in [&b"*0\r\n"[..], b"*-1\r\n", b"*-5\r\n"] {
            let Ok(Parsed::Request(r, n)) = parse_all(frame) else {
                panic!("not parsed")
            };
            assert!(r.is_empty());
            assert_eq!(n, frame.len());
        }
    }

    #[test]
    fn malformed_headers_are_redis_errors() {
        for (frame, message) in [
            (&b"*x\r\n"[..], "Protocol error: invalid multibulk length"),
            (b"*+1\r\n", "Protocol error: invalid multibulk length"),
            (b"*01\r\n", "Protocol error: invalid multibulk length"),
            (b"*1\r\n$x\r\n", "Protocol error: invalid bulk length"),
            (b"*1\r\n$-1\r\n", "Protocol error: invalid bulk length"),
            (b"*1\r\n:1\r\n", "Protocol error: expected '$', got ':'"),
            (
                b"*111111111111111111111111\r\n",
                "Protocol error: too big mbulk count string",
            ),
            (
                b"*1\r\n$4\r\nPINGxx",
                "Protocol error: bulk string not terminated by CRLF",
            ),
            (b"*1\rx", "Protocol error: length not terminated by CRLF"),
            (b"*2000\r\n", "Protocol error: invalid multibulk length"),
            (b"*1\r\n$70000\r\n", "Protocol error: invalid bulk length"),
        ] {
            assert_eq!(
                parse_all(frame).map_err(|e| e.message().to_owned()),
                Err(message.to_owned()),
                "{:?}",
                String::from_utf8_lossy(frame)
            );
        }
    }

    #[test]
    fn frames_over_the_size_bound_are_refused_before_they_arrive() {
        let limits = FrameLimits {
            max_request_bytes: 100,
            max_args: 8,
        };
        let head = b"*2\r\n$60\r\n";
        let mut frame = head.to_vec();
        frame.extend_from_slice(&[b'a'; 60]);
        frame.extend_from_slice(b"\r\n$30\r\n");
        let e = parse_request(&frame, &limits).map(|_| ());
        assert_eq!(
            e.map_err(|e| e.message().to_owned()),
            Err("Protocol error: request larger than 100 bytes".to_owned())
        );
    }
}
