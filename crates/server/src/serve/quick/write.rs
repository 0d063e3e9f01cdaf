//! Writing the lane's answers: a response in the bytes hyper would write for it, with the
//! `Date` field cached once a second per thread. Apart from the reading of requests (the rest
//! of the lane) because the decision API's handler writes its answers with these too.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use hyper::body::Body as _;
use hyper::{Response, StatusCode};

use crate::response::Body;

/// Appends `response` as HTTP/1.1 to `out`, in the bytes hyper writes: the status line, the
/// fields in their order, then `content-length` and `date` when the response has none, and the
/// body. `false` for a body that is not there at once (a stream; never one of the API's).
pub(crate) fn write_response(response: Response<Body>, out: &mut Vec<u8>) -> bool {
    let (parts, mut body) = response.into_parts();
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let bytes = match Pin::new(&mut body).poll_frame(&mut cx) {
        Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
            Ok(data) => data,
            Err(_) => return false,
        },
        Poll::Ready(None) => Bytes::new(),
        _ => return false,
    };
    if !body.is_end_stream() {
        return false;
    }
    status_line(parts.status, out);
    let mut length = false;
    let mut date = false;
    for (name, value) in &parts.headers {
        length |= name == hyper::header::CONTENT_LENGTH;
        date |= name == hyper::header::DATE;
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    // Never set by the API's handlers; kept as they are when set.
    if !length {
        content_length_line(bytes.len(), out);
    }
    if !date {
        date_line(out);
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&bytes);
    true
}

/// `HTTP/1.1 <code> <reason>` and CRLF.
pub(crate) fn status_line(status: StatusCode, out: &mut Vec<u8>) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// The `content-length` and `date` fields, the blank line, and `body`.
pub(crate) fn finish(body: &[u8], out: &mut Vec<u8>) {
    content_length_line(body.len(), out);
    date_line(out);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
}

fn content_length_line(len: usize, out: &mut Vec<u8>) {
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(itoa::Buffer::new().format(len).as_bytes());
    out.extend_from_slice(b"\r\n");
}

fn date_line(out: &mut Vec<u8>) {
    out.extend_from_slice(b"date: ");
    DATE.with(|d| d.borrow_mut().write(out));
    out.extend_from_slice(b"\r\n");
}

thread_local! {
    static DATE: std::cell::RefCell<CachedDate> = const {
        std::cell::RefCell::new(CachedDate { second: u64::MAX, text: [0; 29] })
    };
}

/// The `Date` field's value, formatted once a second per thread (as hyper caches it).
struct CachedDate {
    second: u64,
    text: [u8; 29],
}

impl CachedDate {
    fn write(&mut self, out: &mut Vec<u8>) {
        let second = unix_second();
        if second != self.second {
            let text =
                httpdate::fmt_http_date(SystemTime::UNIX_EPOCH + Duration::from_secs(second));
            if text.len() == self.text.len() {
                self.text.copy_from_slice(text.as_bytes());
                self.second = second;
            } else {
                out.extend_from_slice(text.as_bytes());
                return;
            }
        }
        out.extend_from_slice(&self.text);
    }
}

/// The current Unix second, from the kernel's coarse clock where there is one: its last tick,
/// read from memory (about 3 ns, against 29 for `SystemTime::now` on a virtual machine), and
/// ticks are milliseconds apart, well inside a date's second.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn unix_second() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::RealtimeCoarse);
    u64::try_from(now.tv_sec).unwrap_or(0)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn unix_second() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
