//! The gRPC server: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` and
//! `grpc.health.v1.Health/Check` on one listener, over hyper's HTTP/2 server.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body::Frame;
use http_body_util::BodyExt as _;
use prost::Message as _;
use tollgate::{Clock, Store};
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, StdError, http};
use tonic::server::{Grpc, UnaryService};
use tonic_prost::ProstCodec;

use crate::RlsService;
use crate::proto::envoy::service_ratelimit_v3::{
    RateLimitRequest, RateLimitResponse, SHOULD_RATE_LIMIT_PATH,
};
use crate::proto::health_v1::health_check_response::ServingStatus;
use crate::proto::health_v1::{CHECK_PATH, HealthCheckRequest, HealthCheckResponse, WATCH_PATH};

/// The service name Envoy's rate limit client calls, as the health service reports it.
pub const RLS_SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// The most calls one connection may have in flight.
const MAX_CONCURRENT_STREAMS: u32 = 1024;

/// The largest request accepted, in bytes (tonic's default: 4 MiB).
pub const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// Serves `service` over gRPC (HTTP/2, plaintext) on `listener` until `shutdown` completes,
/// then lets in-flight calls finish.
///
/// Answers `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` and
/// `grpc.health.v1.Health/Check` (`SERVING` for `""` and [`RLS_SERVICE_NAME`],
/// `NOT_FOUND` otherwise); any other method is `UNIMPLEMENTED`.
///
/// The connections are hyper's HTTP/2 server directly, without tonic's transport stack (its
/// tower layers and boxed futures cost about a tenth of a call), and `ShouldRateLimit`
/// decodes and encodes its one message itself. Errors accepting a connection (out of file
/// descriptors, a reset before accept) are retried after a short pause, never fatal.
pub async fn serve<S, C>(
    listener: tokio::net::TcpListener,
    service: RlsService<S, C>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    S: Store,
    C: Clock,
{
    let mut http2 = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
    http2
        // Envoy multiplexes every rate limit call of a worker over one connection: let many
        // run at once (hyper's default is 200) rather than queue them in Envoy.
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        // Requests and answers are tiny; larger windows only mean fewer WINDOW_UPDATE frames.
        .initial_stream_window_size(1 << 20)
        .initial_connection_window_size(8 << 20)
        // gRPC clients have no use for a `date` header on every answer.
        .auto_date_header(false);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => {
                    // EMFILE and the like: give the process a moment, keep serving.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Answers are small and latency-bound: no Nagle delay.
        let _ = stream.set_nodelay(true);
        let svc = hyper_util::service::TowerToHyperService::new(GrpcService {
            service: service.clone(),
        });
        let connection =
            graceful.watch(http2.serve_connection(hyper_util::rt::TokioIo::new(stream), svc));
        tokio::spawn(async move {
            let _ = connection.await;
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// The HTTP/2 service routing gRPC paths to the rate limit and health services.
#[derive(Debug)]
struct GrpcService<S: Store, C: Clock> {
    service: RlsService<S, C>,
}

impl<S: Store, C: Clock> Clone for GrpcService<S, C> {
    fn clone(&self) -> Self {
        GrpcService {
            service: self.service.clone(),
        }
    }
}

impl<S, C, B> tonic::codegen::Service<http::Request<B>> for GrpcService<S, C>
where
    S: Store,
    C: Clock,
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        match req.uri().path() {
            SHOULD_RATE_LIMIT_PATH => {
                let service = self.service.clone();
                Box::pin(async move { Ok(should_rate_limit(service, req).await) })
            }
            CHECK_PATH => Box::pin(async move {
                let mut grpc =
                    Grpc::new(ProstCodec::<HealthCheckResponse, HealthCheckRequest>::default());
                Ok(grpc.unary(HealthCheck, req).await)
            }),
            WATCH_PATH => Box::pin(async move {
                Ok(Status::unimplemented("Health/Watch is not implemented; use Check").into_http())
            }),
            path => {
                let message = format!(
                    "unknown method {:?}",
                    path.chars().take(200).collect::<String>()
                );
                Box::pin(async move { Ok(Status::unimplemented(message).into_http()) })
            }
        }
    }
}

/// `ShouldRateLimit`: one gRPC message in, one out. Done here rather than with tonic's
/// streaming codec, which buffers, boxes and maps for the general case: a call is one body
/// chunk to decode and one buffer to send. Error answers are tonic's (trailers-only).
async fn should_rate_limit<S, C, B>(
    service: RlsService<S, C>,
    req: http::Request<B>,
) -> http::Response<Body>
where
    S: Store,
    C: Clock,
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    if let Some(encoding) = req.headers().get("grpc-encoding") {
        if encoding.as_bytes() != b"identity" {
            return Status::unimplemented("compressed requests are not supported").into_http();
        }
    }
    let deadline = req
        .headers()
        .get("grpc-timeout")
        .and_then(|v| grpc_timeout(v.as_bytes()));
    let answer = async move {
        let message = read_message(req.into_body()).await?;
        let request = RateLimitRequest::decode(message)
            .map_err(|e| Status::internal(format!("cannot decode the request: {e}")))?;
        service.should_rate_limit(&request).await
    };
    // The client's deadline (Envoy sends its `timeout`): past it nobody waits for the answer,
    // so the call stops holding a store request, as tonic's server did.
    let answer = match deadline {
        Some(d) => match tokio::time::timeout(d, answer).await {
            Ok(answer) => answer,
            Err(_) => Err(Status::deadline_exceeded("the call's grpc-timeout passed")),
        },
        None => answer.await,
    };
    match answer {
        Ok(response) => unary_response(&response),
        Err(status) => status.into_http(),
    }
}

/// A `grpc-timeout` value (gRPC over HTTP/2: 1 to 8 digits and a unit, `H` `M` `S` `m` `u`
/// `n`); `None` when malformed, and then the call has no deadline, as tonic reads it.
fn grpc_timeout(value: &[u8]) -> Option<Duration> {
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
async fn read_message<B>(body: B) -> Result<Bytes, Status>
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
fn unary_response(message: &RateLimitResponse) -> http::Response<Body> {
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

struct HealthCheck;

impl UnaryService<HealthCheckRequest> for HealthCheck {
    type Response = HealthCheckResponse;
    type Future = BoxFuture<tonic::Response<HealthCheckResponse>, Status>;

    fn call(&mut self, request: tonic::Request<HealthCheckRequest>) -> Self::Future {
        // As the health checking protocol says: an unknown service is NOT_FOUND.
        let known = matches!(request.get_ref().service.as_str(), "" | RLS_SERVICE_NAME);
        Box::pin(async move {
            if !known {
                return Err(Status::not_found("unknown service"));
            }
            Ok(tonic::Response::new(HealthCheckResponse {
                status: ServingStatus::Serving as i32,
            }))
        })
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
