//! A small gRPC client for the rate limit and health services (feature `client`): for tests,
//! benchmarks and tools.

use tonic::Status;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};
use tonic_prost::ProstCodec;

use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use crate::proto::grpc::health::v1::{HealthCheckRequest, HealthCheckResponse};
use crate::proto::{HEALTH_CHECK_PATH, HEALTH_WATCH_PATH, SHOULD_RATE_LIMIT_PATH};

/// A client of `RateLimitService` and `Health` over one HTTP/2 connection (clone it to share
/// the connection; connect again for another).
#[derive(Clone, Debug)]
pub struct RlsClient {
    inner: tonic::client::Grpc<Channel>,
}

impl RlsClient {
    /// Connects to `uri`, e.g. `http://127.0.0.1:8081`.
    pub async fn connect(uri: String) -> Result<Self, tonic::transport::Error> {
        let channel = Endpoint::from_shared(uri)?
            .tcp_nodelay(true)
            .connect()
            .await?;
        Ok(RlsClient::new(channel))
    }

    /// A client over `channel`.
    pub fn new(channel: Channel) -> Self {
        RlsClient {
            inner: tonic::client::Grpc::new(channel).max_decoding_message_size(64 * 1024 * 1024),
        }
    }

    /// Calls `ShouldRateLimit`.
    pub async fn should_rate_limit(
        &mut self,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, Status> {
        self.should_rate_limit_request(tonic::Request::new(request))
            .await
    }

    /// Calls `ShouldRateLimit` with a request of the caller's making: its metadata (a
    /// `traceparent`, a deadline) goes as it is.
    pub async fn should_rate_limit_request(
        &mut self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<RateLimitResponse, Status> {
        self.ready().await?;
        let codec = ProstCodec::<RateLimitRequest, RateLimitResponse>::default();
        let path = PathAndQuery::from_static(SHOULD_RATE_LIMIT_PATH);
        let response = self.inner.unary(request, path, codec).await?;
        Ok(response.into_inner())
    }

    /// Calls `grpc.health.v1.Health/Check` for `service` (`""`: the server).
    pub async fn health_check(&mut self, service: &str) -> Result<HealthCheckResponse, Status> {
        self.ready().await?;
        let codec = ProstCodec::<HealthCheckRequest, HealthCheckResponse>::default();
        let path = PathAndQuery::from_static(HEALTH_CHECK_PATH);
        let request = HealthCheckRequest {
            service: service.to_owned(),
        };
        let response = self
            .inner
            .unary(tonic::Request::new(request), path, codec)
            .await?;
        Ok(response.into_inner())
    }

    /// Calls `grpc.health.v1.Health/Watch` for `service`: the stream of its statuses, the
    /// current one first, then each change.
    pub async fn health_watch(
        &mut self,
        service: &str,
    ) -> Result<tonic::Streaming<HealthCheckResponse>, Status> {
        self.ready().await?;
        let codec = ProstCodec::<HealthCheckRequest, HealthCheckResponse>::default();
        let path = PathAndQuery::from_static(HEALTH_WATCH_PATH);
        let request = HealthCheckRequest {
            service: service.to_owned(),
        };
        let response = self
            .inner
            .server_streaming(tonic::Request::new(request), path, codec)
            .await?;
        Ok(response.into_inner())
    }

    async fn ready(&mut self) -> Result<(), Status> {
        self.inner
            .ready()
            .await
            .map_err(|e| Status::unavailable(format!("not connected: {e}")))
    }
}
