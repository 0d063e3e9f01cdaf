//! The gRPC server: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` and
//! `grpc.health.v1.Health` (`Check`, `Watch`) on one listener, over hyper's HTTP/2 server, at
//! most [`ServeOptions::max_connections`] connections at once.

mod health;
mod unary;

pub use health::Health;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use prost::Message as _;
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, watch};
use tollgate::{Clock, Store};
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, StdError, http};
use tonic::server::Grpc;
use tonic_prost::ProstCodec;

use crate::RlsService;
use crate::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use crate::proto::grpc::health::v1::{HealthCheckRequest, HealthCheckResponse};
use crate::proto::{HEALTH_CHECK_PATH, HEALTH_WATCH_PATH, SHOULD_RATE_LIMIT_PATH};
use health::{HealthCheck, HealthWatch};

/// The service name Envoy's rate limit client calls, as the health service reports it.
pub const RLS_SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// The most calls one connection may have in flight.
const MAX_CONCURRENT_STREAMS: u32 = 1024;

/// The largest request accepted, in bytes (tonic's default: 4 MiB).
pub const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// Bounds of [`serve_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServeOptions {
    /// Connections served at once; further ones wait in the kernel's accept queue until one
    /// closes (Envoy keeps one long-lived HTTP/2 connection per worker thread, so this bounds
    /// memory and descriptors, not calls). Default 10,000, as Tollgate's other listeners.
    pub max_connections: usize,
    /// How long shutdown waits for connections to finish their calls. Default 30 s.
    pub drain: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            max_connections: 10_000,
            drain: Duration::from_secs(30),
        }
    }
}

/// Serves `service` over gRPC (HTTP/2, plaintext) on `listener` until `shutdown` completes,
/// then lets in-flight calls finish: [`serve_with`] and the default [`ServeOptions`].
pub async fn serve<S, C>(
    listener: tokio::net::TcpListener,
    service: RlsService<S, C>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    S: Store,
    C: Clock,
{
    serve_with(listener, service, shutdown, ServeOptions::default()).await
}

/// Serves `service` over gRPC (HTTP/2, plaintext) on `listener`, at most
/// `options.max_connections` connections at once, until `shutdown` completes; then lets
/// in-flight calls finish for up to `options.drain`.
///
/// Answers `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`,
/// `grpc.health.v1.Health/Check` (the service's [`Health`] for `""` and [`RLS_SERVICE_NAME`],
/// `NOT_FOUND` otherwise) and `grpc.health.v1.Health/Watch` (that status now and at each
/// change; `SERVICE_UNKNOWN` for another name); any other method is `UNIMPLEMENTED`. At
/// shutdown, `Watch` streams say `NOT_SERVING` and end.
///
/// The connections are hyper's HTTP/2 server directly, without tonic's transport stack (its
/// tower layers and boxed futures cost about a tenth of a call), and `ShouldRateLimit`
/// decodes and encodes its one message itself. Errors accepting a connection (out of file
/// descriptors, a reset before accept) are retried after a short pause, never fatal.
pub async fn serve_with<S, C>(
    listener: tokio::net::TcpListener,
    service: RlsService<S, C>,
    shutdown: impl Future<Output = ()>,
    options: ServeOptions,
) -> std::io::Result<()>
where
    S: Store,
    C: Clock,
{
    serve_with_io(listener, service, shutdown, options, |stream| async move {
        Some(stream)
    })
    .await
}

/// [`serve_with`] over the streams `wrap` makes of each accepted connection: a TLS handshake,
/// say. `wrap` runs in the connection's own task (a slow handshake holds up no other
/// connection), under the connection's permit; `None` drops the connection. `wrap` bounds its
/// own time: a client that never completes it holds a permit until it gives up.
pub async fn serve_with_io<S, C, W, F, I>(
    listener: tokio::net::TcpListener,
    service: RlsService<S, C>,
    shutdown: impl Future<Output = ()>,
    options: ServeOptions,
    wrap: W,
) -> std::io::Result<()>
where
    S: Store,
    C: Clock,
    W: Fn(TcpStream) -> F,
    F: Future<Output = Option<I>> + Send + 'static,
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
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
    // Health/Watch streams never end on their own: this tells them the server is going, so
    // the drain does not wait for them.
    let (stop_tx, stop_rx) = watch::channel(false);
    // A permit per connection, taken before accepting: past the bound, clients wait in the
    // kernel's accept queue, as on Tollgate's other listeners.
    let permits = Arc::new(Semaphore::new(options.max_connections.max(1)));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = Arc::clone(&permits).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
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
            stop: stop_rx.clone(),
        });
        let io = wrap(stream);
        let watcher = graceful.watcher();
        let http2 = http2.clone();
        tokio::spawn(async move {
            if let Some(io) = io.await {
                let connection = http2.serve_connection(hyper_util::rt::TokioIo::new(io), svc);
                let _ = watcher.watch(connection).await;
            }
            drop(permit);
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(options.drain, graceful.shutdown()).await;
    Ok(())
}

/// The HTTP/2 service routing gRPC paths to the rate limit and health services.
#[derive(Debug)]
struct GrpcService<S: Store, C: Clock> {
    service: RlsService<S, C>,
    /// Turns true at shutdown.
    stop: watch::Receiver<bool>,
}

impl<S: Store, C: Clock> Clone for GrpcService<S, C> {
    fn clone(&self) -> Self {
        GrpcService {
            service: self.service.clone(),
            stop: self.stop.clone(),
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
            HEALTH_CHECK_PATH => {
                let check = HealthCheck(self.service.health().clone());
                Box::pin(async move {
                    let mut grpc =
                        Grpc::new(ProstCodec::<HealthCheckResponse, HealthCheckRequest>::default());
                    Ok(grpc.unary(check, req).await)
                })
            }
            HEALTH_WATCH_PATH => {
                let watch = HealthWatch {
                    health: self.service.health().clone(),
                    stop: self.stop.clone(),
                };
                Box::pin(async move {
                    let mut grpc =
                        Grpc::new(ProstCodec::<HealthCheckResponse, HealthCheckRequest>::default());
                    Ok(grpc.server_streaming(watch, req).await)
                })
            }
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

/// `ShouldRateLimit` through the fast unary codec ([`unary`]), within the client's deadline.
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
    if let Some(encoding) = req.headers().get("grpc-encoding")
        && encoding.as_bytes() != b"identity"
    {
        return Status::unimplemented("compressed requests are not supported").into_http();
    }
    let deadline = req
        .headers()
        .get("grpc-timeout")
        .and_then(|v| unary::grpc_timeout(v.as_bytes()));
    let mut span = service.begin_span(req.headers());
    let answer = async move {
        let message = unary::read_message(req.into_body()).await?;
        let request = RateLimitRequest::decode(message)
            .map_err(|e| Status::internal(format!("cannot decode the request: {e}")))?;
        service
            .should_rate_limit_traced(&request, span.as_deref_mut())
            .await
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
        Ok(response) => unary::unary_response(&response),
        Err(status) => status.into_http(),
    }
}
