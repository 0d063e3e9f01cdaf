//! `ShouldRateLimit` over real gRPC on 127.0.0.1 at the edges: bad and huge input, malformed
//! HTTP/2 bodies, a passed `grpc-timeout`, store failures, shutdown. Never a panic, always a
//! clear status, and the server carries on.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::future::Future;
use std::time::Duration;

use common::{descriptor, edge, request, start, start_with};
use tollgate::{Check, Decisions, Store, StoreError, Timestamp};
use tollgate_envoy::OnError;
use tollgate_envoy::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate_envoy::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

#[tokio::test]
async fn bad_input_gets_a_clear_answer_never_a_panic() {
    let server = start(edge()).await;
    let mut c = server.client().await;
    let err = c
        .should_rate_limit(request("", &[&[("a", "b")]]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("domain"), "{}", err.message());
    let err = c.should_rate_limit(request("edge", &[])).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("descriptor"), "{}", err.message());

    // 1,000 descriptors, all matching one key-only node with distinct values.
    let values: Vec<String> = (0..1000).map(|i| format!("v{i}")).collect();
    let many = RateLimitRequest {
        domain: "edge".into(),
        descriptors: values
            .iter()
            .map(|v| descriptor(&[("api_key", v)]))
            .collect(),
        hits_addend: 1,
    };
    let r = c.should_rate_limit(many).await.unwrap();
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses.len(), 1000);
    assert!(r.statuses.iter().all(|s| s.limit_remaining == 4));

    // Huge values (1 MiB): hashed into a short store key, counted like any other.
    let big = "x".repeat(1 << 20);
    for i in 0..6 {
        let r = c
            .should_rate_limit(request("edge", &[&[("api_key", &big)]]))
            .await
            .unwrap();
        assert_eq!(r.overall_code, if i < 5 { OK } else { OVER });
    }
    let big_key = request("edge", &[&[(&big, "v")]]);
    let r = c.should_rate_limit(big_key).await.unwrap();
    assert_eq!(r.overall_code, OK);
    let big_domain = request(&big, &[&[("a", "b")]]);
    assert_eq!(
        c.should_rate_limit(big_domain).await.unwrap().overall_code,
        OK
    );
    // Over the 4 MiB message limit: a gRPC error, and the server carries on.
    let bigger = "y".repeat(5 << 20);
    let err = c
        .should_rate_limit(request("edge", &[&[("api_key", &bigger)]]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::OutOfRange, "{err:?}");
    // Control characters, empty keys and values, non-UTF-8 never reach the wire as such
    // (protobuf strings are UTF-8) but odd characters do.
    let r = c
        .should_rate_limit(request(
            "edge",
            &[&[("api_key", "\u{0}\n\"é")], &[("", "")]],
        ))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OK);
    let r = c.health_check("").await.unwrap();
    assert_eq!(r.status, 1);
    let r = c
        .health_check(tollgate_envoy::RLS_SERVICE_NAME)
        .await
        .unwrap();
    assert_eq!(r.status, 1);
    let err = c.health_check("other").await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
}

/// A store that always fails (written the way the trait declares it).
struct Down;

#[allow(clippy::manual_async_fn)]
impl Store for Down {
    fn apply(
        &self,
        _now: Timestamp,
        _checks: &[Check<'_>],
    ) -> impl Future<Output = Result<Decisions, StoreError>> + Send {
        async {
            Err(StoreError::Unavailable {
                reason: "connection refused".into(),
            })
        }
    }

    fn charge(
        &self,
        _now: Timestamp,
        _checks: &[Check<'_>],
    ) -> impl Future<Output = Result<Decisions, StoreError>> + Send {
        async {
            Err(StoreError::Unavailable {
                reason: "connection refused".into(),
            })
        }
    }

    fn refund(
        &self,
        _now: Timestamp,
        _checks: &[Check<'_>],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        async { Ok(()) }
    }

    fn release(
        &self,
        _now: Timestamp,
        _checks: &[Check<'_>],
    ) -> impl Future<Output = Result<u32, StoreError>> + Send {
        async {
            Err(StoreError::Unavailable {
                reason: "connection refused".into(),
            })
        }
    }
}

#[tokio::test]
async fn store_failures_fail_open_or_unavailable() {
    let server = start_with(Down, edge()).await;
    let mut c = server.client().await;
    let r = c
        .should_rate_limit(request("edge", &[&[("api_key", "gold")]]))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OK);
    let server = start_with(Down, edge().failure_mode(OnError::Deny)).await;
    let mut c = server.client().await;
    let err = c
        .should_rate_limit(request("edge", &[&[("api_key", "gold")]]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(
        err.message().contains("connection refused"),
        "{}",
        err.message()
    );
    // Unmatched descriptors never touch the store.
    let r = c
        .should_rate_limit(request("edge", &[&[("nothing", "here")]]))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OK);
}

#[tokio::test]
async fn shutdown_stops_the_server() {
    let server = start(edge()).await;
    let addr = server.addr;
    let mut c = server.client().await;
    assert!(c.health_check("").await.is_ok());
    drop(server);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

/// The `grpc-status` of one raw HTTP/2 call to `ShouldRateLimit` with `body` as its body.
async fn raw_call(
    send: &h2::client::SendRequest<bytes::Bytes>,
    body: &[u8],
    encoding: Option<&str>,
) -> String {
    raw_call_with(send, body, encoding.map(|e| ("grpc-encoding", e))).await
}

/// [`raw_call`] with one more request header.
async fn raw_call_with(
    send: &h2::client::SendRequest<bytes::Bytes>,
    body: &[u8],
    header: Option<(&str, &str)>,
) -> String {
    let mut send = send.clone().ready().await.unwrap();
    let mut request = http::Request::post(format!(
        "http://localhost{}",
        tollgate_envoy::proto::SHOULD_RATE_LIMIT_PATH
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers");
    if let Some((name, value)) = header {
        request = request.header(name, value);
    }
    let (response, mut stream) = send.send_request(request.body(()).unwrap(), false).unwrap();
    stream
        .send_data(bytes::Bytes::copy_from_slice(body), true)
        .unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200);
    if let Some(status) = response.headers().get("grpc-status") {
        return status.to_str().unwrap().to_owned();
    }
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body.trailers().await.unwrap().unwrap();
    trailers["grpc-status"].to_str().unwrap().to_owned()
}

#[tokio::test]
async fn malformed_grpc_bodies_get_a_status_and_the_server_carries_on() {
    use prost::Message as _;
    let server = start(edge()).await;
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let (send, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let message = request("edge", &[&[("api_key", "raw")]]).encode_to_vec();
    let mut good = vec![0, 0, 0, 0, u8::try_from(message.len()).unwrap()];
    good.extend_from_slice(&message);
    assert_eq!(raw_call(&send, &good, None).await, "0");
    assert_eq!(raw_call(&send, &good, Some("identity")).await, "0");
    // Compressed (flag or header): UNIMPLEMENTED.
    let mut compressed = good.clone();
    compressed[0] = 1;
    assert_eq!(raw_call(&send, &compressed, None).await, "12");
    assert_eq!(raw_call(&send, &good, Some("gzip")).await, "12");
    // Cut short, no message at all, not protobuf: INTERNAL, as tonic answers them.
    assert_eq!(raw_call(&send, &good[..good.len() - 2], None).await, "13");
    assert_eq!(raw_call(&send, &[], None).await, "13");
    assert_eq!(
        raw_call(&send, &[0, 0, 0, 0, 2, 0xff, 0xff], None).await,
        "13"
    );
    // Two messages in a unary call: INVALID_ARGUMENT.
    let twice = [good.as_slice(), good.as_slice()].concat();
    assert_eq!(raw_call(&send, &twice, None).await, "3");
    // Declared over 4 MiB: OUT_OF_RANGE before the body is read.
    assert_eq!(raw_call(&send, &[0, 0x7f, 0, 0, 0], None).await, "11");
    // The same connection still answers.
    assert_eq!(raw_call(&send, &good, None).await, "0");
    let mut c = server.client().await;
    let r = c
        .should_rate_limit(request("edge", &[&[("api_key", "raw")]]))
        .await
        .unwrap();
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 1));
}

/// A store that never answers.
struct Stuck;

#[allow(clippy::manual_async_fn)]
impl Store for Stuck {
    fn apply(
        &self,
        _now: Timestamp,
        _checks: &[Check<'_>],
    ) -> impl Future<Output = Result<Decisions, StoreError>> + Send {
        std::future::pending()
    }

    fn charge(
        &self,
        _now: Timestamp,
        _checks: &[Check<'_>],
    ) -> impl Future<Output = Result<Decisions, StoreError>> + Send {
        std::future::pending()
    }

    fn refund(
        &self,
        _now: Timestamp,
        _checks: &[Check<'_>],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        async { Ok(()) }
    }

    fn release(
        &self,
        _now: Timestamp,
        _checks: &[Check<'_>],
    ) -> impl Future<Output = Result<u32, StoreError>> + Send {
        std::future::pending()
    }
}

#[tokio::test]
async fn a_passed_grpc_timeout_is_deadline_exceeded() {
    use prost::Message as _;
    let server = start_with(Stuck, edge()).await;
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let (send, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let message = request("edge", &[&[("api_key", "slow")]]).encode_to_vec();
    let mut body = vec![0, 0, 0, 0, u8::try_from(message.len()).unwrap()];
    body.extend_from_slice(&message);
    // DEADLINE_EXCEEDED is 4.
    let status = raw_call_with(&send, &body, Some(("grpc-timeout", "20m"))).await;
    assert_eq!(status, "4");
    // Unknown domains never reach the store: answered within any deadline.
    let message = request("nope", &[&[("api_key", "slow")]]).encode_to_vec();
    let mut body = vec![0, 0, 0, 0, u8::try_from(message.len()).unwrap()];
    body.extend_from_slice(&message);
    let status = raw_call_with(&send, &body, Some(("grpc-timeout", "10S"))).await;
    assert_eq!(status, "0");
}
