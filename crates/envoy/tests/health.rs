//! `grpc.health.v1.Health` over real gRPC on 127.0.0.1: `Check` and `Watch` report the
//! service's `Health` as it changes, unknown services as the health checking protocol says,
//! and `Watch` streams end at shutdown without holding up the drain.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use tokio::sync::oneshot;
use tollgate::{Limiter, MemoryStore};
use tollgate_envoy::proto::grpc::health::v1::health_check_response::ServingStatus;
use tollgate_envoy::{
    Config, Descriptor, Domain, Health, RLS_SERVICE_NAME, RateLimit, RlsClient, RlsService,
    ServeOptions, Unit, serve_with,
};

const SERVING: i32 = ServingStatus::Serving as i32;
const NOT_SERVING: i32 = ServingStatus::NotServing as i32;
const SERVICE_UNKNOWN: i32 = ServingStatus::ServiceUnknown as i32;

/// A server with a long drain: one that waited for open `Watch` streams would not stop within
/// the tests' deadlines.
async fn start() -> (
    RlsClient,
    Health,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let config =
        Config::new()
            .domain(Domain::new("edge").descriptor(
                Descriptor::new("api_key").rate_limit(RateLimit::per(5, Unit::Minute)),
            ));
    let limiter = Limiter::builder()
        .store(MemoryStore::default())
        .build()
        .unwrap();
    let service = RlsService::new(limiter, &config).unwrap();
    let health = service.health().clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let options = ServeOptions {
        drain: Duration::from_secs(600),
        ..ServeOptions::default()
    };
    let task = tokio::spawn(async move {
        let shutdown = async {
            let _ = stopped.await;
        };
        serve_with(listener, service, shutdown, options)
            .await
            .unwrap();
    });
    let client = RlsClient::connect(format!("http://{addr}")).await.unwrap();
    (client, health, stop, task)
}

async fn next(
    stream: &mut tonic::Streaming<tollgate_envoy::proto::grpc::health::v1::HealthCheckResponse>,
) -> Option<i32> {
    tokio::time::timeout(Duration::from_secs(20), stream.message())
        .await
        .expect("a status within the deadline")
        .unwrap()
        .map(|r| r.status)
}

#[tokio::test]
async fn check_and_watch_report_the_status_as_it_changes() {
    let (mut client, health, _stop, _task) = start().await;
    let mut server = client.health_watch("").await.unwrap();
    let mut rls = client.health_watch(RLS_SERVICE_NAME).await.unwrap();
    assert_eq!(next(&mut server).await, Some(SERVING));
    assert_eq!(next(&mut rls).await, Some(SERVING));
    assert_eq!(client.health_check("").await.unwrap().status, SERVING);

    health.set_serving(false);
    assert_eq!(next(&mut server).await, Some(NOT_SERVING));
    assert_eq!(next(&mut rls).await, Some(NOT_SERVING));
    assert_eq!(client.health_check("").await.unwrap().status, NOT_SERVING);
    assert_eq!(
        client.health_check(RLS_SERVICE_NAME).await.unwrap().status,
        NOT_SERVING
    );
    // Setting what it already is sends nothing; the next change arrives as the next message.
    health.set_serving(false);
    health.set_serving(true);
    assert_eq!(next(&mut server).await, Some(SERVING));
    assert_eq!(next(&mut rls).await, Some(SERVING));

    // A watch opened now starts from the current status.
    health.set_serving(false);
    let mut late = client.health_watch("").await.unwrap();
    assert_eq!(next(&mut late).await, Some(NOT_SERVING));
}

#[tokio::test]
async fn an_unknown_service_is_not_found_or_streamed_service_unknown() {
    let (mut client, _health, _stop, _task) = start().await;
    let err = client.health_check("other").await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    let mut other = client.health_watch("other").await.unwrap();
    assert_eq!(next(&mut other).await, Some(SERVICE_UNKNOWN));
    // The call stays open (a known service's stream carries on beside it).
    let mut server = client.health_watch("").await.unwrap();
    assert_eq!(next(&mut server).await, Some(SERVING));
}

#[tokio::test]
async fn watch_streams_end_cleanly_at_shutdown() {
    let (mut client, _health, stop, task) = start().await;
    let mut server = client.health_watch("").await.unwrap();
    let mut other = client.health_watch("other").await.unwrap();
    assert_eq!(next(&mut server).await, Some(SERVING));
    assert_eq!(next(&mut other).await, Some(SERVICE_UNKNOWN));
    stop.send(()).unwrap();
    // Told it is going, then the stream ends with OK (no error status).
    assert_eq!(next(&mut server).await, Some(NOT_SERVING));
    assert_eq!(next(&mut server).await, None);
    assert_eq!(next(&mut other).await, None);
    // The drain did not wait for the streams (it would have waited 10 minutes).
    tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("the server stops once its streams have ended")
        .unwrap();
}
