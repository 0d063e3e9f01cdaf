//! Traces exported to a real OTLP/gRPC receiver (the collector's `TraceService` from its
//! protos): each decision a span with its door, policy, outcome and a keyed hash of the key,
//! never the credential; a caller's `traceparent` makes the span a child in the caller's trace
//! at every door that carries one (the proxy, `/v1/check`, forward-auth, Envoy's service), and
//! sampling follows the parent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;

use common::otlp::{Received, Receiver};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate_envoy::proto::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use tollgate_envoy::proto::envoy::service::ratelimit::v3::RateLimitRequest;

const SECRET: &str = "secret-key-123";

/// A trace id (32 hex) and a parent span id (16 hex) per door, and the `traceparent` naming them.
fn parent(door: u8, sampled: bool) -> (String, String, String) {
    let trace = format!("{door:02x}{}", "ab".repeat(15));
    let span = format!("{door:02x}{}", "cd".repeat(7));
    let flags = if sampled { "01" } else { "00" };
    let header = format!("00-{trace}-{span}-{flags}");
    (trace, span, header)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

async fn start_traced(
    dir: &std::path::Path,
    receiver: &Receiver,
    ratio: &str,
) -> (Running, Config) {
    let up = upstream().await;
    let ratelimit = dir.join("ratelimit");
    std::fs::create_dir_all(&ratelimit).unwrap();
    std::fs::write(
        ratelimit.join("edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit:\n      unit: hour\n      requests_per_unit: 100\n",
    )
    .unwrap();
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ngrpc_listen = \"127.0.0.1:0\"\nresp_listen = \"127.0.0.1:0\"\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n\
         [proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{up}\"\n\
         [envoy]\nconfig_dir = \"ratelimit\"\n\
         [telemetry]\notlp_endpoint = \"http://{}\"\nsample_ratio = {ratio}\nservice_name = \"edge-limiter\"\n\
         [[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1h\"\n\
         key = [\"header:x-api-key\"]\n",
        receiver.addr
    );
    let file = dir.join("tollgate.toml");
    std::fs::write(&file, text).unwrap();
    let config = Config::load(&file).unwrap();
    (start(config.clone()).await, config)
}

type Config = tollgate_server::Config;

async fn check(s: &Running, traceparent: Option<&str>) -> Reply {
    let mut headers = vec![("content-type", "application/json")];
    if let Some(t) = traceparent {
        headers.push(("traceparent", t));
    }
    let body = format!(r#"{{"policy":"api","key":"{SECRET}"}}"#);
    send("POST", &s.url("/v1/check"), &headers, body).await
}

async fn envoy(grpc: SocketAddr, traceparent: &str) {
    let mut client = tollgate_envoy::RlsClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let mut request = tonic::Request::new(RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "api_key".to_owned(),
                value: SECRET.to_owned(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    });
    request
        .metadata_mut()
        .insert("traceparent", traceparent.parse().unwrap());
    let answer = client.should_rate_limit_request(request).await.unwrap();
    assert_eq!(answer.overall_code, 1, "OK");
}

fn find<'a>(spans: &'a [Received], trace: &str) -> &'a Received {
    spans
        .iter()
        .find(|r| hex(&r.span.trace_id) == trace)
        .unwrap_or_else(|| panic!("no span in trace {trace}: {spans:#?}"))
}

/// With a ratio of 0, only the callers' sampled traces are followed: one span per door, a
/// child of the caller's span, naming the door, the policy and the outcome, and never the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_door_joins_the_callers_trace() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let (s, _) = start_traced(dir.path(), &receiver, "0").await;

    let (check_trace, check_span, tp) = parent(1, true);
    assert_eq!(check(&s, Some(&tp)).await.status, hyper::StatusCode::OK);

    let (fa_trace, fa_span, tp) = parent(2, true);
    let r = get(
        &s.url("/v1/forward-auth"),
        &[
            ("x-forwarded-method", "GET"),
            ("x-forwarded-uri", "/v1/items"),
            ("x-forwarded-host", "api.example.com"),
            ("x-forwarded-for", "192.0.2.1"),
            ("x-api-key", SECRET),
            ("traceparent", &tp),
        ],
    )
    .await;
    assert_eq!(r.status, hyper::StatusCode::OK);

    let (proxy_trace, proxy_span, tp) = parent(3, true);
    let r = get(
        &s.proxy_url("/v1/items"),
        &[("x-api-key", SECRET), ("traceparent", &tp)],
    )
    .await;
    assert_eq!(r.status, hyper::StatusCode::OK);

    let (envoy_trace, envoy_span, tp) = parent(4, true);
    envoy(s.grpc.unwrap(), &tp).await;

    // Not traced: no trace context at a ratio of 0, and an unsampled parent.
    assert_eq!(check(&s, None).await.status, hyper::StatusCode::OK);
    let (unsampled, _, tp) = parent(5, false);
    assert_eq!(check(&s, Some(&tp)).await.status, hyper::StatusCode::OK);

    // Stopping exports what is pending.
    s.stop().await;
    let spans = receiver.spans();
    assert_eq!(spans.len(), 4, "{spans:#?}");
    for (trace, span, door, policy) in [
        (&check_trace, &check_span, "check", "api"),
        (&fa_trace, &fa_span, "forward_auth", "api"),
        (&proxy_trace, &proxy_span, "proxy", "api"),
        (&envoy_trace, &envoy_span, "envoy", "edge.api_key"),
    ] {
        let r = find(&spans, trace);
        assert_eq!(hex(&r.span.parent_span_id), *span, "{door}: {r:#?}");
        assert_eq!(r.service, "edge-limiter");
        assert_eq!(r.span.name, "tollgate.decision");
        assert_eq!(r.attr("tollgate.door").as_deref(), Some(door));
        assert_eq!(
            r.attr("tollgate.policies").as_deref(),
            Some(policy),
            "{r:#?}"
        );
        assert_eq!(r.attr("tollgate.outcome").as_deref(), Some("allowed"));
        let hash = r.attr("tollgate.key_hashes").unwrap_or_default();
        assert_eq!(hash.len(), 32, "{door}: {hash}");
        assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()));
        let all = format!("{:?}", r.span);
        assert!(!all.contains(SECRET), "{door}: the key leaked: {all}");
        assert!(
            !all.contains("192.0.2.1"),
            "{door}: the address leaked: {all}"
        );
    }
    assert!(spans.iter().all(|r| hex(&r.span.trace_id) != unsampled));
    // One key, one hash, whichever door: forward-auth and the proxy counted the same key
    // (`/v1/check` by policy counts the key as given, another key).
    let hashes: Vec<String> = [&fa_trace, &proxy_trace]
        .iter()
        .map(|t| {
            find(&spans, t)
                .attr("tollgate.key_hashes")
                .unwrap_or_default()
        })
        .collect();
    assert!(hashes.windows(2).all(|w| w[0] == w[1]), "{hashes:?}");
}

/// At a ratio of 1, a request without trace context starts a trace of its own; a denial says
/// so, with the status answered; the Redis-protocol door, which carries no trace context,
/// makes root spans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_parent_decisions_are_sampled_at_the_ratio() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    let (s, _) = start_traced(dir.path(), &receiver, "1.0").await;
    assert_eq!(check(&s, None).await.status, hyper::StatusCode::OK);
    let over = r#"{"policy":"api","key":"k","cost":101}"#;
    let r = post_json(&s.url("/v1/check"), over).await;
    assert_eq!(r.status, hyper::StatusCode::TOO_MANY_REQUESTS);
    let mut resp = TcpStream::connect(s.resp.unwrap()).await.unwrap();
    resp.write_all(b"*3\r\n$14\r\nTOLLGATE.CHECK\r\n$3\r\napi\r\n$1\r\nk\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 256];
    let n = resp.read(&mut buf).await.unwrap();
    assert!(
        buf[..n].starts_with(b"*"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    drop(resp);
    s.stop().await;
    let spans = receiver.spans();
    assert_eq!(spans.len(), 3, "{spans:#?}");
    assert!(
        spans.iter().all(|r| r.span.parent_span_id.is_empty()),
        "roots"
    );
    let denied = spans
        .iter()
        .find(|r| r.attr("tollgate.outcome").as_deref() == Some("denied"))
        .unwrap_or_else(|| panic!("no denial: {spans:#?}"));
    assert_eq!(
        denied.attr("http.response.status_code").as_deref(),
        Some("429")
    );
    assert!(
        spans
            .iter()
            .any(|r| r.attr("tollgate.door").as_deref() == Some("resp"))
    );
}
