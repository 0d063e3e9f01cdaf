//! The gRPC server: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` and
//! `grpc.health.v1.Health/Check` on one listener, with tonic's HTTP/2 transport.

use std::convert::Infallible;
use std::future::Future;
use std::task::{Context, Poll};

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
pub async fn serve<S, C>(
    listener: tokio::net::TcpListener,
    service: RlsService<S, C>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error>
where
    S: Store,
    C: Clock,
{
    use tokio_stream::StreamExt as _;
    // Answers are small and latency-bound: no Nagle delay. (Server::tcp_nodelay does not apply
    // to a listener passed in, so it is set on each accepted connection.)
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(|accepted| {
        let stream = accepted?;
        stream.set_nodelay(true)?;
        Ok::<_, std::io::Error>(stream)
    });
    tonic::transport::Server::builder()
        // Envoy multiplexes every rate limit call of a worker over one connection: let many
        // run at once (hyper's default is 200) rather than queue them in Envoy.
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        // Requests and answers are tiny; larger windows only mean fewer WINDOW_UPDATE frames.
        .initial_stream_window_size(1 << 20)
        .initial_connection_window_size(8 << 20)
        .serve_with_incoming_shutdown(GrpcService { service }, incoming, shutdown)
        .await
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
                let svc = ShouldRateLimit(Some(self.service.clone()));
                Box::pin(async move {
                    let mut grpc =
                        Grpc::new(ProstCodec::<RateLimitResponse, RateLimitRequest>::default())
                            .max_decoding_message_size(MAX_REQUEST_BYTES);
                    Ok(grpc.unary(svc, req).await)
                })
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

/// One call's service: tonic calls it exactly once, so the service is moved into the call's
/// future rather than cloned again.
struct ShouldRateLimit<S: Store, C: Clock>(Option<RlsService<S, C>>);

impl<S: Store, C: Clock> UnaryService<RateLimitRequest> for ShouldRateLimit<S, C> {
    type Response = RateLimitResponse;
    type Future = BoxFuture<tonic::Response<RateLimitResponse>, Status>;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let service = self.0.take();
        Box::pin(async move {
            let Some(service) = service else {
                return Err(Status::internal("the call was made twice"));
            };
            let request = request.into_inner();
            service
                .should_rate_limit(&request)
                .await
                .map(tonic::Response::new)
        })
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
