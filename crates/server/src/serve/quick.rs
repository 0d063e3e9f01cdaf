//! The decision listener's quick lane: `POST /v1/check` over HTTP/1.1 keep-alive, the call
//! other services make on every request they serve, read and answered without hyper.
//!
//! Why: over loopback a check costs the server about 9 µs of CPU, two thirds of it the kernel's
//! one read and one write; of the rest, hyper's connection machinery (its dispatcher, header
//! maps both ways, a boxed timer and body channel per request) took more than the decision.
//! This lane reads the head with `httparse` (the parser hyper uses), the body by its
//! `Content-Length`, and writes the answer the handler built in one write.
//!
//! It takes only what it reads exactly as hyper would and cannot mean anything else:
//! `POST /v1/check HTTP/1.1`, one `Content-Length` of at most 64 KiB, no `Transfer-Encoding`,
//! `Expect`, `Upgrade` or `Connection` other than `keep-alive`. Anything else, the first bytes
//! it cannot parse included, and the rest of the connection go to hyper with every byte not
//! yet answered, so hyper answers (or refuses) them as it always did. The bounds are hyper's:
//! the header read timeout (from the moment a head is awaited, idle keep-alive included; a
//! head late is closed without an answer), as long again for the body from the end of its head
//! (late, it is answered 408 and the connection closed, as the decision API's handler answers
//! it behind hyper), the head size bound, and the write timeout on answers.
//! `tests/quick_lane.rs` holds its answers to hyper's, byte for byte but the date, and
//! `tests/bounds.rs` its 408.

mod write;

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Instant;

use super::Limits;

pub(crate) use write::{finish, status_line, write_response};

/// The largest body the lane reads (the decision API's bound; a larger one goes to hyper,
/// whose handler refuses it).
pub(crate) const MAX_BODY: usize = 64 * 1024;

/// The most header fields the lane parses; a head with more goes to hyper.
const MAX_HEADERS: usize = 32;

/// What answers a check the lane read: the decision API's handler.
pub(crate) trait Quick: Send + Sync + 'static {
    /// Answers `POST /v1/check` with `body` (its request head is `head`, for the trace
    /// context): the whole HTTP/1.1 response appended to `out` (see [`write_response`]);
    /// `false` when it could not be written.
    fn check<'a>(
        &'a self,
        head: &'a [u8],
        body: &'a [u8],
        out: &'a mut Vec<u8>,
    ) -> impl Future<Output = bool> + Send + 'a;
}

/// No quick lane (a listener that serves no checks).
pub(crate) enum Never {}

impl Quick for Never {
    #[allow(clippy::manual_async_fn)]
    fn check<'a>(
        &'a self,
        _: &'a [u8],
        _: &'a [u8],
        _: &'a mut Vec<u8>,
    ) -> impl Future<Output = bool> + Send + 'a {
        async { match *self {} }
    }
}

/// The caller's trace context in a head the lane took: `traceparent` and `tracestate`.
pub(crate) fn trace_context(head: &[u8]) -> (Option<&[u8]>, Option<&[u8]>) {
    match parse(head, true) {
        Parsed::Take(h) => (h.parent, h.state),
        _ => (None, None),
    }
}

/// How a connection left the lane.
pub(crate) enum Left<S> {
    /// Closed, or to be closed: the client went, timed out, or the server is stopping.
    Closed,
    /// For hyper: the connection and the bytes read from it that were not answered.
    HandOff(S, Bytes),
}

/// A request head the lane takes.
struct Head<'b> {
    /// The head's length in bytes.
    len: usize,
    body: usize,
    parent: Option<&'b [u8]>,
    state: Option<&'b [u8]>,
}

/// Serves checks on `io` (whose first bytes, already read, are `read`) until the connection
/// ends or a request the lane does not take arrives.
pub(crate) async fn serve<S, Q: Quick>(
    mut io: S,
    read: &[u8],
    quick: &Q,
    limits: Limits,
    stop: &mut watch::Receiver<bool>,
) -> Left<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut buf = BytesMut::with_capacity(4096);
    buf.extend_from_slice(read);
    let mut out = Vec::with_capacity(1024);
    // Waits for the stop once for the whole connection: a wait per request would register and
    // unregister with the listener's one channel, which every connection shares, each time.
    let stopping = super::stopped(stop);
    tokio::pin!(stopping);
    // One timer for the connection, set again for each head, and for a body not whole with it.
    let timeout = tokio::time::sleep(limits.header_read_timeout);
    tokio::pin!(timeout);
    loop {
        // A whole head within the header read timeout from now, then its body within as long
        // again from the end of the head: the time the decision API's handler gives a body
        // behind hyper (`response::read_body`, started once hyper has read the head).
        timeout
            .as_mut()
            .reset(Instant::now() + limits.header_read_timeout);
        // The head read whole (its length and its body's), once its body is awaited.
        let mut awaited: Option<(usize, usize)> = None;
        let (len, body) = loop {
            match awaited {
                Some((len, body)) if buf.len() >= len + body => break (len, body),
                Some(_) => {}
                None => match parse(&buf, false) {
                    Parsed::Take(head) => {
                        if buf.len() >= head.len + head.body {
                            break (head.len, head.body);
                        }
                        // The body has its own time from here (no clock read when it came
                        // with its head, as it usually does).
                        awaited = Some((head.len, head.body));
                        timeout
                            .as_mut()
                            .reset(Instant::now() + limits.header_read_timeout);
                    }
                    Parsed::Partial if buf.len() < limits.max_header_bytes => {}
                    Parsed::Partial | Parsed::Other => return Left::HandOff(io, buf.freeze()),
                },
            }
            let idle = buf.is_empty();
            let more = tokio::select! {
                r = io.read_buf(&mut buf) => r,
                () = &mut timeout => {
                    // A head late is closed without an answer, as hyper closes it; a body
                    // late is answered 408, as hyper's path answers it.
                    if awaited.is_some() {
                        body_timed_out(&mut io, &mut out, limits.header_read_timeout).await;
                    }
                    return Left::Closed;
                }
                // Stopping: a connection between requests has nothing in flight.
                _ = &mut stopping, if idle => return Left::Closed,
            };
            if !matches!(more, Ok(n) if n > 0) {
                return Left::Closed;
            }
        };
        out.clear();
        let answered = quick
            .check(&buf[..len], &buf[len..len + body], &mut out)
            .await;
        let _ = buf.split_to(len + body);
        if !answered || !send(&mut io, &out, limits.header_read_timeout).await {
            return Left::Closed;
        }
    }
}

/// Writes `out` to `io`, within `within` when the first write does not take it whole.
async fn send<S: AsyncWrite + Unpin>(io: &mut S, out: &[u8], within: Duration) -> bool {
    // One write first: an answer fits the socket's buffer, so it is usually taken whole at
    // once, and the timer a slow reader needs (a clock read to set) is not set.
    let first = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *io).poll_write(cx, out)));
    let sent = match first.await {
        Poll::Ready(Ok(n)) => n,
        Poll::Ready(Err(_)) => return false,
        Poll::Pending => 0,
    };
    if sent < out.len() {
        let rest = io.write_all(&out[sent..]);
        let written = tokio::time::timeout(within, rest).await;
        if !matches!(written, Ok(Ok(()))) {
            return false;
        }
    }
    true
}

/// Answers a check whose body did not arrive within its time with the decision API's own 408
/// ([`crate::response::body_too_late`]), then closes `io`, as hyper does after an answer with
/// `connection: close`.
async fn body_timed_out<S: AsyncWrite + Unpin>(io: &mut S, out: &mut Vec<u8>, within: Duration) {
    out.clear();
    if write_response(crate::response::body_too_late(true), out) && send(io, out, within).await {
        let _ = tokio::time::timeout(within, io.shutdown()).await;
    }
}

enum Parsed<'b> {
    /// A check the lane takes.
    Take(Head<'b>),
    /// Not a whole head yet.
    Partial,
    /// Anything else: hyper's.
    Other,
}

/// Reads the head at the start of `buf`.
fn parse(buf: &[u8], traced: bool) -> Parsed<'_> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Other,
    };
    if req.method != Some("POST") || req.path != Some("/v1/check") || req.version != Some(1) {
        return Parsed::Other;
    }
    let mut body = None;
    let (mut parent, mut state) = (None, None);
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            if body.is_some() {
                return Parsed::Other;
            }
            match content_length(h.value) {
                Some(n) if n <= MAX_BODY => body = Some(n),
                _ => return Parsed::Other,
            }
        } else if name.eq_ignore_ascii_case(b"connection") {
            if !h.value.eq_ignore_ascii_case(b"keep-alive") {
                return Parsed::Other;
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding")
            || name.eq_ignore_ascii_case(b"expect")
            || name.eq_ignore_ascii_case(b"upgrade")
        {
            return Parsed::Other;
        } else if traced && name.eq_ignore_ascii_case(b"traceparent") {
            parent = Some(h.value);
        } else if traced && name.eq_ignore_ascii_case(b"tracestate") {
            state = Some(h.value);
        }
    }
    match body {
        Some(body) => Parsed::Take(Head {
            len,
            body,
            parent,
            state,
        }),
        None => Parsed::Other,
    }
}

/// A `Content-Length` value: decimal digits only, as hyper reads it.
fn content_length(value: &[u8]) -> Option<usize> {
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{Parsed, content_length, parse};

    fn head(fields: &[(&str, &str)]) -> Vec<u8> {
        let mut h = b"POST /v1/check HTTP/1.1\r\n".to_vec();
        for (name, value) in fields {
            h.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        h.extend_from_slice(b"\r\n");
        h
    }

    fn taken(bytes: &[u8]) -> Option<usize> {
        match parse(bytes, true) {
            Parsed::Take(h) => Some(h.body),
            _ => None,
        }
    }

    #[test]
    fn only_what_reads_one_way_is_taken() {
        assert_eq!(taken(&head(&[("Content-Length", "12")])), Some(12));
        assert_eq!(
            taken(&head(&[
                ("host", "t"),
                ("connection", "Keep-Alive"),
                ("content-length", "0")
            ])),
            Some(0)
        );
        for fields in [
            &[][..],
            &[("content-length", "5"), ("content-length", "5")],
            &[("content-length", "5"), ("transfer-encoding", "chunked")],
            &[("content-length", "5"), ("expect", "100-continue")],
            &[("content-length", "5"), ("connection", "close")],
            &[
                ("content-length", "5"),
                ("connection", "upgrade"),
                ("upgrade", "h2c"),
            ],
            &[("content-length", "+5")],
            &[("content-length", "0x5")],
            &[("content-length", "65537")],
            &[("content-length", "99999999999999999999999")],
        ] {
            assert_eq!(taken(&head(fields)), None, "{fields:?}");
        }
        for line in [
            &b"POST /v1/check?x=1 HTTP/1.1\r\ncontent-length: 1\r\n\r\n"[..],
            b"POST /v1/check HTTP/1.0\r\ncontent-length: 1\r\n\r\n",
            b"GET /v1/check HTTP/1.1\r\ncontent-length: 1\r\n\r\n",
            b"POST /v1/checks HTTP/1.1\r\ncontent-length: 1\r\n\r\n",
            b"POST //v1/check HTTP/1.1\r\ncontent-length: 1\r\n\r\n",
            b"POST http://x/v1/check HTTP/1.1\r\ncontent-length: 1\r\n\r\n",
        ] {
            assert_eq!(taken(line), None, "{}", String::from_utf8_lossy(line));
        }
        assert!(matches!(
            parse(b"POST /v1/check HTTP/1.1\r\ncontent-le", false),
            Parsed::Partial
        ));
        let traced = head(&[
            ("content-length", "2"),
            (
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
        ]);
        match parse(&traced, true) {
            Parsed::Take(h) => assert!(h.parent.is_some() && h.state.is_none()),
            _ => panic!("not taken"),
        }
    }

    #[test]
    fn lengths_are_decimal_digits_only() {
        assert_eq!(content_length(b"0"), Some(0));
        assert_eq!(content_length(b"00012"), Some(12));
        for bad in [&b""[..], b"-1", b"1.5", b" 1", b"1,1", b"\xff"] {
            assert_eq!(content_length(bad), None, "{bad:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Any bytes: no panic, and a head taken is one httparse reads whole.
        #[test]
        fn any_bytes_are_read_without_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            if let Parsed::Take(h) = parse(&bytes, true) {
                let mut fields = [httparse::EMPTY_HEADER; 64];
                let mut req = httparse::Request::new(&mut fields);
                prop_assert_eq!(req.parse(&bytes).ok(), Some(httparse::Status::Complete(h.len)));
            }
        }

        /// A well-formed check with fields in any order and case is taken exactly when the
        /// model says it is, with the model's body length.
        #[test]
        fn the_lane_takes_what_the_model_takes(
            fields in prop::collection::vec(
                (prop::sample::select(vec![
                    "content-length", "Content-Length", "transfer-encoding", "expect",
                    "connection", "upgrade", "x-api-key", "host", "traceparent",
                ]), prop::sample::select(vec!["12", "keep-alive", "close", "chunked", "abc", "70000"])),
                0..6,
            )
        ) {
            let pairs: Vec<(&str, &str)> = fields.iter().map(|(n, v)| (*n, *v)).collect();
            let lengths: Vec<&str> = pairs
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case("content-length"))
                .map(|(_, v)| *v)
                .collect();
            let refused = pairs.iter().any(|(n, v)| {
                matches!(*n, "transfer-encoding" | "expect" | "upgrade")
                    || (*n == "connection" && !v.eq_ignore_ascii_case("keep-alive"))
            });
            let model = match (refused, lengths.as_slice()) {
                (false, [one]) => one.parse::<usize>().ok().filter(|&n| n <= super::MAX_BODY),
                _ => None,
            };
            prop_assert_eq!(taken(&head(&pairs)), model);
        }
    }
}
