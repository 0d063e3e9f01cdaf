//! The fast unary gRPC codec of `ShouldRateLimit`: one message in, one out, without tonic's
//! streaming codec (which buffers, boxes and maps for the general case). A call is one body
//! chunk to decode and one buffer to send; error answers are tonic's (trailers-only).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body::Frame;
use http_body_util::BodyExt as _;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{StdError, http};

use crate::MAX_REQUEST_BYTES;

/// A `grpc-timeout` value (gRPC over HTTP/2: 1 to 8 digits and a unit, `H` `M` `S` `m` `u`
/// `n`); `None` when malformed, and then the call has no deadline, as tonic reads it.
pub(super) fn grpc_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3_600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The one message of a unary call's body, without its 5-byte gRPC prefix. A message longer
/// than [`MAX_REQUEST_BYTES`] is `OUT_OF_RANGE` as soon as its prefix says so (as tonic
/// answers), before it is read.
pub(super) async fn read_message<B>(body: B) -> Result<Bytes, Status>
where
    B: tonic::codegen::Body,
    B::Error: Into<StdError>,
{
    let mut body = std::pin::pin!(body);
    // Nearly always the whole message arrives in one DATA frame: keep that chunk as it is.
    let mut first: Option<Bytes> = None;
    let mut more: Vec<u8> = Vec::new();
    let mut declared: Option<usize> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Status::cancelled(format!("request body: {}", e.into())))?;
        let Ok(mut data) = frame.into_data() else {
            continue;
        };
        let chunk = data.copy_to_bytes(data.remaining());
        match &first {
            None if more.is_empty() => first = Some(chunk),
            _ => {
                if let Some(f) = first.take() {
                    more.extend_from_slice(&f);
                }
                more.extend_from_slice(&chunk);
            }
        }
        let have: &[u8] = first.as_deref().unwrap_or(&more);
        if declared.is_none() && have.len() >= 5 {
            if have[0] != 0 {
                return Err(Status::unimplemented(
                    "compressed messages are not supported",
                ));
            }
            let len = u32::from_be_bytes([have[1], have[2], have[3], have[4]]);
            let len = usize::try_from(len).unwrap_or(usize::MAX);
            if len > MAX_REQUEST_BYTES {
                return Err(Status::out_of_range(format!(
                    "the request is {len} bytes; at most {MAX_REQUEST_BYTES} are accepted"
                )));
            }
            declared = Some(len);
        }
        if have.len() > MAX_REQUEST_BYTES + 5 {
            return Err(Status::invalid_argument("a unary call carries one message"));
        }
    }
    let mut all = match first {
        Some(chunk) => chunk,
        None => Bytes::from(more),
    };
    let Some(len) = declared else {
        return Err(Status::internal("the request carries no message"));
    };
    if all.len() != len + 5 {
        return Err(if all.len() < len + 5 {
            Status::internal("the request message is cut short")
        } else {
            Status::invalid_argument("a unary call carries one message")
        });
    }
    all.advance(5);
    Ok(all)
}

/// A gRPC answer with one message: `200`, `content-type: application/grpc`, one DATA frame
/// (the prefixed message, encoded straight into one buffer), `grpc-status: 0` trailers.
pub(super) fn unary_response(message: &impl prost::Message) -> http::Response<Body> {
    let len = message.encoded_len();
    let mut buf = BytesMut::with_capacity(len + 5);
    buf.put_u8(0);
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    if message.encode(&mut buf).is_err() {
        return Status::internal("cannot encode the answer").into_http();
    }
    let mut response = http::Response::new(Body::new(UnaryBody {
        data: Some(buf.freeze()),
        trailers: true,
    }));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}

/// The body of [`unary_response`]: its message, then the `grpc-status: 0` trailers.
struct UnaryBody {
    data: Option<Bytes>,
    trailers: bool,
}

impl http_body::Body for UnaryBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if std::mem::take(&mut self.trailers) {
            let mut trailers = http::HeaderMap::with_capacity(1);
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && !self.trailers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_as_the_spec_writes_them() {
        assert_eq!(grpc_timeout(b"250m"), Some(Duration::from_millis(250)));
        assert_eq!(grpc_timeout(b"1S"), Some(Duration::from_secs(1)));
        assert_eq!(grpc_timeout(b"2M"), Some(Duration::from_secs(120)));
        assert_eq!(grpc_timeout(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(
            grpc_timeout(b"99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(grpc_timeout(b"5n"), Some(Duration::from_nanos(5)));
        for bad in [
            &b""[..],
            b"m",
            b"123456789m",
            b"12x",
            b"-1S",
            b"1.5S",
            b"10",
        ] {
            assert_eq!(
                grpc_timeout(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
