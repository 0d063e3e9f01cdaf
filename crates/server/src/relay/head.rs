//! Request heads on the client side of the relay: found in linear time, parsed with httparse,
//! checked, and written again for the upstream.
//!
//! The rule every check here serves: the upstream reads the request the rate limiter decided
//! on, or the request is refused with a 4xx. So the head sent upstream is built by the relay
//! from what it parsed (one `Host`, the framing it will itself write, its own
//! `X-Forwarded-For`), never copied where a difference of reading could hide a second request
//! or another host.

use std::borrow::Cow;

use hyper::StatusCode;
use hyper::http::uri::Authority;

use tollgate_http::normalize;

use super::body::Framing;

/// Where a search for the end of a head goes on from, so that a head that arrives a byte at a
/// time is scanned once, not once per byte.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct HeadScan {
    from: usize,
}

impl HeadScan {
    /// Where the head at the start of `buf` ends (just past its empty line), if it has. Lines
    /// may end in CRLF or a bare LF (RFC 9112 §2.2): httparse reads both, and the head sent on
    /// is written again with CRLF.
    pub(super) fn end(&mut self, buf: &[u8]) -> Option<usize> {
        let mut i = self.from;
        while let Some(lf) = buf
            .get(i..)
            .and_then(|rest| rest.iter().position(|&b| b == b'\n'))
        {
            let lf = i + lf;
            match buf.get(lf + 1..lf + 3) {
                Some([b'\n', _]) => return Some(lf + 2),
                Some([b'\r', b'\n']) => return Some(lf + 3),
                Some(_) => i = lf + 1,
                None if buf.get(lf + 1) == Some(&b'\n') => return Some(lf + 2),
                // The line's end is at the buffer's end: look at it again with the next bytes.
                None => {
                    self.from = lf;
                    return None;
                }
            }
        }
        self.from = buf.len();
        None
    }

    /// A new head starts.
    pub(super) fn reset(&mut self) {
        self.from = 0;
    }
}

/// A request the relay answers itself instead of forwarding it: the refusal every door gives.
pub(super) use tollgate_http::Refusal;

const fn refuse(status: StatusCode, title: &'static str, detail: &'static str) -> Refusal {
    Refusal::new(status, title, detail)
}

const BAD_REQUEST: &str = "Bad Request";
pub(super) const MALFORMED: Refusal = refuse(
    StatusCode::BAD_REQUEST,
    BAD_REQUEST,
    "the request head is not valid HTTP/1.1",
);
const AMBIGUOUS: Refusal = refuse(
    StatusCode::BAD_REQUEST,
    "Ambiguous message framing",
    "send one Content-Length, or Transfer-Encoding: chunked alone, not both",
);
pub(super) const MALFORMED_BODY: Refusal = refuse(
    StatusCode::BAD_REQUEST,
    "Malformed chunked body",
    "the chunked body does not follow RFC 9112 section 7.1",
);

/// The HTTP version of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Version {
    Http10,
    Http11,
}

/// What the `Host` sent upstream is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Host<'b> {
    /// The client's `Host` header, checked.
    Header(&'b str),
    /// The authority of an absolute-form target, which replaces any `Host` (RFC 9112 §3.2.2).
    Target(&'b str),
    /// None was sent (HTTP/1.0): the upstream's own authority.
    Upstream,
}

/// A request head the relay forwards, as it parsed and checked it.
#[derive(Clone, Debug)]
pub(super) struct RequestHead<'b> {
    pub(super) method: &'b str,
    /// Origin-form: path and query.
    pub(super) target: Cow<'b, str>,
    pub(super) host: Host<'b>,
    pub(super) version: Version,
    pub(super) framing: Framing,
    /// The client connection ends after this exchange.
    pub(super) close: bool,
    pub(super) is_head: bool,
    /// Safe to send again when a reused upstream connection turns out to be dead.
    pub(super) idempotent: bool,
    /// `Expect: 100-continue`: the client waits for a `100 Continue` before its body.
    pub(super) expect_continue: bool,
}

/// Checks a parsed request and reads what the relay needs of it.
pub(super) fn check<'b>(req: &httparse::Request<'_, 'b>) -> Result<RequestHead<'b>, Refusal> {
    let (Some(method), Some(raw_target), Some(minor)) = (req.method, req.path, req.version) else {
        return Err(MALFORMED);
    };
    let version = if minor == 0 {
        Version::Http10
    } else {
        Version::Http11
    };
    if method == "CONNECT" {
        return Err(refuse(
            StatusCode::NOT_IMPLEMENTED,
            "Not Implemented",
            "this proxy does not tunnel: CONNECT is not supported",
        ));
    }
    let (target, target_host) = origin_form(raw_target)?;

    let facts = HeaderFacts::read(req.headers, version)?;
    let host = facts.host(version, target_host)?;
    let framing = match (facts.chunked, facts.length) {
        (true, Some(_)) => return Err(AMBIGUOUS),
        (true, None) => Framing::Chunked,
        (false, Some(n)) => Framing::Length(n),
        (false, None) => Framing::None,
    };
    let bodyless = matches!(framing, Framing::None | Framing::Length(0));
    Ok(RequestHead {
        method,
        target,
        host,
        version,
        framing,
        close: facts.close,
        is_head: method == "HEAD",
        idempotent: bodyless
            && matches!(
                method,
                "GET" | "HEAD" | "OPTIONS" | "PUT" | "DELETE" | "TRACE"
            ),
        expect_continue: facts.expect_continue,
    })
}

/// What the request's headers say about its framing, its connection, its host and its
/// expectation, read in one pass.
struct HeaderFacts<'b> {
    length: Option<u64>,
    chunked: bool,
    close: bool,
    /// The last `Host` value, and how many there were.
    host: Option<&'b str>,
    hosts: usize,
    expect_continue: bool,
}

impl<'b> HeaderFacts<'b> {
    /// Refuses framing that two readers could take apart differently (RFC 9112 §6.3) and an
    /// expectation the proxy cannot meet.
    #[inline]
    fn read(headers: &[httparse::Header<'b>], version: Version) -> Result<Self, Refusal> {
        let mut f = HeaderFacts {
            length: None,
            chunked: false,
            close: version == Version::Http10,
            host: None,
            hosts: 0,
            expect_continue: false,
        };
        for h in headers.iter() {
            let name = h.name.as_bytes();
            // Most headers are none of these: ruled out by their first byte.
            if !matches!(
                name.first().map(u8::to_ascii_lowercase),
                Some(b'c' | b't' | b'h' | b'e')
            ) {
                continue;
            }
            if name.eq_ignore_ascii_case(b"content-length") {
                let n = parse_length(h.value).ok_or(AMBIGUOUS)?;
                if f.length.is_some_and(|l| l != n) {
                    return Err(AMBIGUOUS);
                }
                f.length = Some(n);
            } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
                // One coding, chunked, once; and never from HTTP/1.0, which has no chunking
                // (RFC 9112 §6.1: such framing is faulty).
                if f.chunked
                    || version == Version::Http10
                    || !h.value.trim_ascii().eq_ignore_ascii_case(b"chunked")
                {
                    return Err(AMBIGUOUS);
                }
                f.chunked = true;
            } else if name.eq_ignore_ascii_case(b"host") {
                f.hosts += 1;
                f.host = std::str::from_utf8(h.value.trim_ascii()).ok();
            } else if name.eq_ignore_ascii_case(b"connection") {
                for token in h.value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
                    if token.eq_ignore_ascii_case(b"close") {
                        f.close = true;
                    } else if token.eq_ignore_ascii_case(b"keep-alive")
                        && version == Version::Http10
                    {
                        f.close = false;
                    }
                }
            } else if name.eq_ignore_ascii_case(b"expect") {
                // `100-continue` is forwarded: the upstream's interim 100 reaches the client.
                if !h.value.trim_ascii().eq_ignore_ascii_case(b"100-continue") {
                    return Err(refuse(
                        StatusCode::EXPECTATION_FAILED,
                        "Expectation Failed",
                        "the only expectation this proxy meets is 100-continue",
                    ));
                }
                f.expect_continue = true;
            }
        }
        Ok(f)
    }

    /// Where the request goes: the absolute-form target's authority, else the `Host` header,
    /// else (HTTP/1.0 only) the upstream.
    #[inline]
    fn host(&self, version: Version, target_host: Option<&'b str>) -> Result<Host<'b>, Refusal> {
        // RFC 9112 §3.2: exactly one valid Host in HTTP/1.1; at most one in HTTP/1.0.
        if self.hosts > 1 {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                BAD_REQUEST,
                "the request has more than one Host header",
            ));
        }
        let host = match (self.host, self.hosts, version) {
            (_, 0, Version::Http11) => {
                return Err(refuse(
                    StatusCode::BAD_REQUEST,
                    BAD_REQUEST,
                    "an HTTP/1.1 request needs a Host header",
                ));
            }
            (Some(h), 1, _) => Some(normalize::authority(h.as_bytes(), "Host")?),
            (_, 1, _) => {
                return Err(Refusal::bad_field("Host", "is not UTF-8"));
            }
            _ => None,
        };
        Ok(match (target_host, host) {
            (Some(authority), _) => Host::Target(authority),
            (None, Some(h)) => Host::Header(h),
            (None, None) => Host::Upstream,
        })
    }
}

/// The origin-form of a request target, and the authority of an absolute-form one. A target
/// of bytes outside visible ASCII, with a fragment, or of another form is refused: it would be
/// matched against the policies as one path and read by the upstream as another.
fn origin_form(target: &str) -> Result<(Cow<'_, str>, Option<&str>), Refusal> {
    const FIELD: &str = "the request target";
    if target.starts_with('/') {
        return Ok((
            Cow::Borrowed(normalize::target(target.as_bytes(), FIELD)?),
            None,
        ));
    }
    // Absolute-form: http(s)://authority[/path][?query].
    let not_a_uri = || {
        Refusal::bad_field(
            FIELD,
            "is not an origin-form or absolute-form URI of visible ASCII",
        )
    };
    let rest = strip_prefix_ignore_case(target, "http://")
        .or_else(|| strip_prefix_ignore_case(target, "https://"))
        .ok_or_else(not_a_uri)?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let authority = normalize::authority(authority.as_bytes(), FIELD).map_err(|_| not_a_uri())?;
    let path = if path.starts_with('/') {
        Cow::Borrowed(normalize::target(path.as_bytes(), FIELD)?)
    } else {
        let path = format!("/{path}");
        normalize::target(path.as_bytes(), FIELD)?;
        Cow::Owned(path)
    };
    Ok((path, Some(authority)))
}

fn strip_prefix_ignore_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &text[prefix.len()..])
}

pub(super) fn parse_length(v: &[u8]) -> Option<u64> {
    let v = v.trim_ascii();
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1).
pub(super) fn hop_by_hop(name: &[u8]) -> bool {
    // By length first: most headers are ruled out without a comparison.
    let candidates: &[&[u8]] = match name.len() {
        2 => &[b"te"],
        7 => &[b"trailer", b"upgrade"],
        10 => &[b"connection", b"keep-alive"],
        16 => &[b"proxy-connection"],
        18 => &[b"proxy-authenticate"],
        19 => &[b"proxy-authorization"],
        _ => return false,
    };
    candidates.iter().any(|h| name.eq_ignore_ascii_case(h))
}

/// The names `Connection` headers list besides its own options: hop-by-hop too.
pub(super) fn connection_listed<'a>(
    headers: &'a [httparse::Header<'_>],
) -> impl Iterator<Item = &'a [u8]> + 'a {
    headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"))
        .flat_map(|h| h.value.split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|t| {
            !t.is_empty()
                && !t.eq_ignore_ascii_case(b"close")
                && !t.eq_ignore_ascii_case(b"keep-alive")
        })
}

/// The headers the relay writes itself upstream: copies from the client are never sent.
fn written_by_relay(name: &[u8]) -> bool {
    let candidate: &[u8] = match name.len() {
        4 => b"host",
        14 => b"content-length",
        15 => b"x-forwarded-for",
        17 => b"transfer-encoding",
        _ => return false,
    };
    name.eq_ignore_ascii_case(candidate)
}

/// The request head for the upstream, written by the relay: the request line in origin-form
/// and HTTP/1.1; `Host` as decided; the client's headers except hop-by-hop ones and the ones
/// the relay writes; the framing the relay will use for the body; `X-Forwarded-For` with every
/// earlier hop and then `client`.
///
/// A name a `Connection` header lists is dropped as hop-by-hop unless `protected` says the
/// rate limiter read it (a key, a forwarding header): the upstream then sees what was decided
/// on. The framing and `Host` are the relay's own whatever `Connection` says.
///
/// `identity`: a policy reads the request's cost from the response body, which must then come
/// uncompressed: the client's `Accept-Encoding` is replaced by `identity`. Passed on, it would
/// let any client turn its usage unreadable (a compressed body) and pay only the fallback cost.
pub(super) fn write_upstream_head(
    out: &mut Vec<u8>,
    head: &RequestHead<'_>,
    headers: &[httparse::Header<'_>],
    upstream: &Authority,
    client: &[u8],
    (protected, identity): (impl Fn(&str) -> bool, bool),
) {
    out.clear();
    out.extend_from_slice(head.method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(head.target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(match &head.host {
        Host::Header(h) | Host::Target(h) => h.as_bytes(),
        Host::Upstream => upstream.as_str().as_bytes(),
    });
    out.extend_from_slice(b"\r\n");
    let listed = headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("connection"));
    for h in headers {
        let name = h.name.as_bytes();
        if hop_by_hop(name)
            || written_by_relay(name)
            || (identity && name.eq_ignore_ascii_case(b"accept-encoding"))
            || (listed
                && !protected(h.name)
                && connection_listed(headers).any(|l| l.eq_ignore_ascii_case(name)))
        {
            continue;
        }
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    match head.framing {
        Framing::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            tollgate::headers::write_decimal(out, n);
            out.extend_from_slice(b"\r\n");
        }
        Framing::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        Framing::None | Framing::Close => {}
    }
    if identity {
        out.extend_from_slice(b"accept-encoding: identity\r\n");
    }
    out.extend_from_slice(b"x-forwarded-for: ");
    for h in headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("x-forwarded-for"))
    {
        let v = h.value.trim_ascii();
        if !v.is_empty() {
            out.extend_from_slice(v);
            out.extend_from_slice(b", ");
        }
    }
    out.extend_from_slice(client);
    out.extend_from_slice(b"\r\n\r\n");
}

/// The head stored for a queued request: the upstream head the relay writes (hop-by-hop
/// headers dropped, `Host` and `X-Forwarded-For` as decided) without framing, without the
/// client's `Idempotency-Key` and `Expect` (the delivery writes its own key and sends the body
/// at once), and without the final empty line.
pub(super) fn write_queued_head(
    out: &mut Vec<u8>,
    head: &RequestHead<'_>,
    headers: &[httparse::Header<'_>],
    upstream: &Authority,
    client: &[u8],
    protected: impl Fn(&str) -> bool,
) {
    let kept: Vec<httparse::Header<'_>> = headers
        .iter()
        .filter(|h| {
            !h.name.eq_ignore_ascii_case("idempotency-key")
                && !h.name.eq_ignore_ascii_case("expect")
        })
        .copied()
        .collect();
    let mut bare = head.clone();
    bare.framing = Framing::None;
    write_upstream_head(out, &bare, &kept, upstream, client, (protected, false));
    if out.ends_with(b"\r\n\r\n") {
        out.truncate(out.len() - 2);
    }
}

#[cfg(test)]
#[path = "head_tests.rs"]
mod tests;
