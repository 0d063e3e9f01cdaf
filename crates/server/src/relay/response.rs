//! Responses on their way to the client: the upstream's head written again for the client, and
//! the relay's own answers (429, 400, 431, 502, ...).

use std::time::{SystemTime, UNIX_EPOCH};

use hyper::StatusCode;
use tollgate_http::RateLimitHeaders;

use super::body::{Encoding, Framing};
use super::head::{Version, connection_listed, hop_by_hop, parse_length};

/// Largest upstream response head accepted.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// Headers parsed on the stack; a response with more is parsed again with room for
/// [`MAX_RESPONSE_HEADERS`] (a response setting many cookies can have hundreds).
const STACK_HEADERS: usize = 64;
pub(super) const MAX_RESPONSE_HEADERS: usize = 1024;

/// What the request said that shapes its response.
#[derive(Clone, Copy, Debug)]
pub(super) struct ForClient {
    pub(super) version: Version,
    pub(super) is_head: bool,
    /// The client connection ends after this response.
    pub(super) close: bool,
}

/// An upstream response head, already written again for the client.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ResponseHead {
    /// Its length in the upstream's bytes.
    pub(super) len: usize,
    /// A 1xx before the final answer.
    pub(super) interim: bool,
    /// How the upstream delimits the body.
    pub(super) framing: Framing,
    /// How the relay writes it to the client.
    pub(super) encoding: Encoding,
    /// The upstream connection cannot carry another request.
    pub(super) upstream_close: bool,
    /// The client connection ends after this response (an HTTP/1.0 client whose body is
    /// delimited by the close, say).
    pub(super) client_close: bool,
}

/// The upstream sent something that is not an HTTP/1.1 response the relay can pass on: 502.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct BadResponse;

/// Parses the upstream's response head at the start of `upbuf` and writes the client's version
/// into `out` (empty for an interim answer an HTTP/1.0 client must not get). `Ok(None)`: not
/// all here yet. Kept out of the async code so the parser's header array lives on the stack,
/// not in every exchange's future.
pub(super) fn response_head(
    upbuf: &[u8],
    out: &mut Vec<u8>,
    rate_limit: &RateLimitHeaders,
    client: ForClient,
) -> Result<Option<ResponseHead>, BadResponse> {
    if upbuf.is_empty() {
        return Ok(None);
    }
    let mut h = [httparse::EMPTY_HEADER; STACK_HEADERS];
    let mut res = httparse::Response::new(&mut h);
    match res.parse(upbuf) {
        Ok(httparse::Status::Complete(n)) => rewrite(&res, n, out, rate_limit, client).map(Some),
        Ok(httparse::Status::Partial) if upbuf.len() <= MAX_RESPONSE_HEAD => Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            let mut h = vec![httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
            let mut res = httparse::Response::new(&mut h);
            match res.parse(upbuf) {
                Ok(httparse::Status::Complete(n)) => {
                    rewrite(&res, n, out, rate_limit, client).map(Some)
                }
                Ok(httparse::Status::Partial) if upbuf.len() <= MAX_RESPONSE_HEAD => Ok(None),
                _ => Err(BadResponse),
            }
        }
        _ => Err(BadResponse),
    }
}

/// [`response_head`] once the head is parsed (`len` bytes). The body's framing for the client
/// is the relay's own: the upstream's `Content-Length` and `Transfer-Encoding` are read, never
/// copied.
fn rewrite(
    res: &httparse::Response<'_, '_>,
    len: usize,
    out: &mut Vec<u8>,
    rate_limit: &RateLimitHeaders,
    client: ForClient,
) -> Result<ResponseHead, BadResponse> {
    let code = res.code.unwrap_or(0);
    if code == 101 || !(100..=999).contains(&code) {
        return Err(BadResponse);
    }
    let interim = code < 200;
    debug_assert!(
        rate_limit.names().all(|n| may_be_rate_limit(n.as_bytes())),
        "the pre-filter must pass every header Tollgate sets"
    );
    let ResponseFacts {
        length,
        chunked,
        mut upstream_close,
        keep_alive,
        listed,
    } = ResponseFacts::read(res.headers)?;
    // HTTP/1.0 closes after each response unless it says keep-alive.
    if res.version == Some(0) && !keep_alive {
        upstream_close = true;
    }
    // Both framings: chunked wins (RFC 9112 §6.3), and a connection that sent such a response
    // is not trusted with another request.
    if chunked && length.is_some() {
        upstream_close = true;
    }
    let bodyless = interim || client.is_head || code == 204 || code == 304;
    let framing = match (bodyless, chunked, length) {
        (true, ..) => Framing::None,
        (false, true, _) => Framing::Chunked,
        (false, false, Some(n)) => Framing::Length(n),
        (false, false, None) => Framing::Close,
    };
    if framing == Framing::Close {
        upstream_close = true;
    }
    // To the client: a length as it is; otherwise chunked, except to HTTP/1.0, which has no
    // chunking and gets the bare body up to the close.
    let http10 = client.version == Version::Http10;
    let encoding = match framing {
        Framing::Chunked | Framing::Close if !http10 => Encoding::Chunked,
        _ => Encoding::Identity,
    };
    let client_close =
        client.close || (http10 && matches!(framing, Framing::Chunked | Framing::Close));
    out.clear();
    // No 1xx to an HTTP/1.0 client (RFC 9110 §15.2).
    if interim && http10 {
        return Ok(ResponseHead {
            len,
            interim,
            framing,
            encoding,
            upstream_close,
            client_close,
        });
    }
    write_status(out, code, res.reason);
    copy_headers(out, res.headers, bodyless, interim, listed, rate_limit);
    if !interim {
        rate_limit.write(out);
        match (framing, encoding) {
            (Framing::Length(n), _) => {
                out.extend_from_slice(b"content-length: ");
                tollgate::headers::write_decimal(out, n);
                out.extend_from_slice(b"\r\n");
            }
            (_, Encoding::Chunked) => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
            _ => {}
        }
        connection_option(out, client.version, client_close);
    }
    out.extend_from_slice(b"\r\n");
    Ok(ResponseHead {
        len,
        interim,
        framing,
        encoding,
        upstream_close,
        client_close,
    })
}

/// What an upstream response's headers say about its framing and its connection, read in one
/// pass.
struct ResponseFacts {
    length: Option<u64>,
    chunked: bool,
    /// `Connection: close`.
    upstream_close: bool,
    /// `Connection: keep-alive` (an HTTP/1.0 upstream keeps the connection only then).
    keep_alive: bool,
    /// `Connection` lists other headers, which are hop-by-hop and not passed on.
    listed: bool,
}

impl ResponseFacts {
    /// Refuses framing the relay cannot pass on unambiguously: two different lengths, or a
    /// coding other than chunked.
    #[inline]
    fn read(headers: &[httparse::Header<'_>]) -> Result<Self, BadResponse> {
        let mut f = ResponseFacts {
            length: None,
            chunked: false,
            upstream_close: false,
            keep_alive: false,
            listed: false,
        };
        for h in headers.iter() {
            let name = h.name.as_bytes();
            if name.eq_ignore_ascii_case(b"content-length") {
                let n = parse_length(h.value).ok_or(BadResponse)?;
                if f.length.is_some_and(|l| l != n) {
                    return Err(BadResponse);
                }
                f.length = Some(n);
            } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
                // Chunked alone: another coding could not be passed on once the chunking is
                // written again (a 502, as nginx answers).
                if f.chunked || !h.value.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                    return Err(BadResponse);
                }
                f.chunked = true;
            } else if name.eq_ignore_ascii_case(b"connection") {
                for t in h.value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
                    if t.eq_ignore_ascii_case(b"close") {
                        f.upstream_close = true;
                    } else if t.eq_ignore_ascii_case(b"keep-alive") {
                        f.keep_alive = true;
                    } else if !t.is_empty() {
                        f.listed = true;
                    }
                }
            }
        }
        Ok(f)
    }
}

/// Copies the upstream's end-to-end headers: not the hop-by-hop ones (nor those `Connection`
/// lists), not its framing (the relay writes its own), and not the rate limit headers this
/// answer carries from Tollgate.
#[inline]
fn copy_headers(
    out: &mut Vec<u8>,
    headers: &[httparse::Header<'_>],
    bodyless: bool,
    interim: bool,
    listed: bool,
    rate_limit: &RateLimitHeaders,
) {
    for h in headers.iter() {
        let name = h.name.as_bytes();
        let framing_header = name.eq_ignore_ascii_case(b"content-length")
            || name.eq_ignore_ascii_case(b"transfer-encoding");
        // A bodiless answer's Content-Length describes what a GET would get: kept as it is.
        let informational_length = bodyless && name.eq_ignore_ascii_case(b"content-length");
        if hop_by_hop(name)
            || (framing_header && !informational_length)
            || (listed && connection_listed(headers).any(|l| l.eq_ignore_ascii_case(name)))
            || (!interim && may_be_rate_limit(name) && replaced_by(rate_limit, name))
        {
            continue;
        }
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
}

/// `connection: close` when the connection ends; `connection: keep-alive` to an HTTP/1.0
/// client whose connection goes on (it closes otherwise).
fn connection_option(out: &mut Vec<u8>, version: Version, close: bool) {
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    } else if version == Version::Http10 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
}

fn write_status(out: &mut Vec<u8>, code: u16, reason: Option<&str>) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(&itoa3(code));
    out.push(b' ');
    match reason {
        Some(r) if !r.is_empty() => out.extend_from_slice(r.as_bytes()),
        _ => out.extend_from_slice(
            StatusCode::from_u16(code)
                .ok()
                .and_then(|s| s.canonical_reason())
                .unwrap_or("")
                .as_bytes(),
        ),
    }
    out.extend_from_slice(b"\r\n");
}

/// Whether `name` could be one of the headers Tollgate sets (`ratelimit*`, `retry-after`,
/// `x-ratelimit-*`): most upstream headers are ruled out by their first byte, before any
/// comparison with the list.
fn may_be_rate_limit(name: &[u8]) -> bool {
    matches!(name.first(), Some(b'r' | b'R' | b'x' | b'X'))
}

/// Whether the rate-limit headers replace the upstream's header `name`.
fn replaced_by(rate_limit: &RateLimitHeaders, name: &[u8]) -> bool {
    rate_limit
        .names()
        .any(|n| name.eq_ignore_ascii_case(n.as_bytes()))
}

/// A complete response of the relay's own (429, 502, ...): status line, `date`,
/// `content-type`, the lines `headers` writes (never framing or `connection`),
/// `content-length`, the connection option, and the body, in one buffer.
pub(super) fn write_answer(
    out: &mut Vec<u8>,
    status: StatusCode,
    headers: impl FnOnce(&mut Vec<u8>),
    body: &[u8],
    version: Version,
    close: bool,
) {
    // The constant is a `HeaderValue`: its bytes live for this statement.
    write_answer_as(
        out,
        status,
        tollgate_http::problem::PROBLEM_JSON.as_bytes(),
        headers,
        body,
        version,
        close,
    );
}

/// [`write_answer`] with a body of another `content_type` (the queue's JSON answers).
pub(super) fn write_answer_as(
    out: &mut Vec<u8>,
    status: StatusCode,
    content_type: &[u8],
    headers: impl FnOnce(&mut Vec<u8>),
    body: &[u8],
    version: Version,
    close: bool,
) {
    // Written piece by piece: the formatting machinery costs more than the rest of a 429.
    out.clear();
    write_status(out, status.as_u16(), None);
    out.extend_from_slice(b"date: ");
    push_date(out);
    out.extend_from_slice(b"\r\ncontent-type: ");
    out.extend_from_slice(content_type);
    out.extend_from_slice(b"\r\n");
    headers(out);
    out.extend_from_slice(b"content-length: ");
    tollgate::headers::write_decimal(out, u64::try_from(body.len()).unwrap_or(u64::MAX));
    out.extend_from_slice(b"\r\n");
    connection_option(out, version, close);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
}

/// The current time as an HTTP date, formatted once a second per thread.
fn push_date(out: &mut Vec<u8>) {
    thread_local! {
        static CACHE: std::cell::RefCell<(u64, String)> = const { std::cell::RefCell::new((0, String::new())) };
    }
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != secs || c.1.is_empty() {
            *c = (secs, httpdate::fmt_http_date(now));
        }
        out.extend_from_slice(c.1.as_bytes());
    });
}

/// A status code (100–999) as its three digits.
fn itoa3(code: u16) -> [u8; 3] {
    [
        b'0' + (code / 100 % 10) as u8,
        b'0' + (code / 10 % 10) as u8,
        b'0' + (code % 10) as u8,
    ]
}

#[cfg(test)]
#[path = "response_tests.rs"]
mod tests;
