//! Over real TCP: axum served on a loopback listener with `ConnectInfo`, and a plain hyper
//! server with `PeerAddr`, both driven by a hyper client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;

use axum::extract::ConnectInfo;
use bytes::Bytes;
use common::*;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tollgate_http::{PeerAddr, RateLimitLayer};
use tower::ServiceBuilder;

/// Sends `n` GETs to `path` over one keep-alive connection; returns the responses.
async fn get_many(
    addr: SocketAddr,
    path: &str,
    n: usize,
) -> Vec<(StatusCode, http::HeaderMap, Bytes)> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut out = Vec::new();
    for _ in 0..n {
        let request = Request::builder()
            .uri(path)
            .header("host", addr.to_string())
            .body(Empty::<Bytes>::new())
            .unwrap();
        // A keep-alive connection is ready again only once the previous exchange is done.
        sender.ready().await.unwrap();
        let response = sender.send_request(request).await.unwrap();
        let (parts, body) = response.into_parts();
        out.push((
            parts.status,
            parts.headers,
            body.collect().await.unwrap().to_bytes(),
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_over_tcp() {
    let engine = builder(tollgate::SystemClock::new())
        .policy(policy(fixed("api", 2, 3600), &["ip"], Some("/v1/**")))
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(engine)
        .peer_addr(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()));
    let app = axum::Router::new()
        .route("/v1/hello", axum::routing::get(|| async { "hello" }))
        .route("/open", axum::routing::get(|| async { "open" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    let responses = get_many(addr, "/v1/hello", 3).await;
    assert_eq!(responses[0].0, StatusCode::OK);
    assert_eq!(responses[0].2, "hello");
    assert_eq!(responses[1].1["x-ratelimit-remaining"], "0");
    let (status, headers, body) = &responses[2];
    assert_eq!(*status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["content-type"], "application/problem+json");
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry >= 1);
    let body: serde_json::Value = serde_json::from_slice(body).unwrap();
    assert_eq!(body["violated-policies"], serde_json::json!(["api"]));
    let open = get_many(addr, "/open", 1).await;
    assert_eq!(open[0].0, StatusCode::OK);
    assert!(!open[0].1.contains_key("x-ratelimit-limit"));
}

async fn hello(_request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(b"hi"))))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hyper_over_tcp() {
    let engine = builder(tollgate::SystemClock::new())
        .policy(policy(fixed("per-client", 1, 3600), &["ip"], None))
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(engine);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, peer) = listener.accept().await.unwrap();
            let service = ServiceBuilder::new()
                .map_request(move |mut request: Request<Incoming>| {
                    request.extensions_mut().insert(PeerAddr(peer));
                    request
                })
                .layer(layer.clone())
                .service_fn(hello);
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service)),
            );
        }
    });
    let responses = get_many(addr, "/", 2).await;
    assert_eq!(responses[0].0, StatusCode::OK);
    assert_eq!(responses[0].2, "hi");
    let policy = sf_items(responses[0].1["ratelimit-policy"].to_str().unwrap());
    assert_eq!(policy[0].name, "per-client");
    assert_eq!(responses[1].0, StatusCode::TOO_MANY_REQUESTS);
    // A new connection from the same address shares the key.
    assert_eq!(
        get_many(addr, "/", 1).await[0].0,
        StatusCode::TOO_MANY_REQUESTS
    );
}
