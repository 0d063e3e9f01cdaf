//! A plain hyper server behind Tollgate's layer: `cargo run -p tollgate-http --example hyper
//! [ADDR]` (default 127.0.0.1:3000), then follow the curl lines it prints.
//!
//! hyper does not record the peer address in requests, so each connection's service inserts a
//! [`PeerAddr`] before the layer sees the request.

use std::convert::Infallible;
use std::error::Error;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tollgate::{Policy, Quota};
use tollgate_http::{Engine, HttpPolicy, KeyChain, PeerAddr, RateLimitLayer};
use tower::ServiceBuilder;

async fn hello(_request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(b"hello\n"))))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3000".to_owned());
    let engine = Engine::builder()
        .policy(
            HttpPolicy::new(Policy::new(
                "per-client",
                Quota::sliding_window_counter(3, Duration::from_secs(10))?,
            )?)
            .keys(KeyChain::parse(["header:x-api-key", "ip"])?),
        )
        .build()?;
    let layer = RateLimitLayer::new(engine);

    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    println!("  curl -i http://{addr}/");
    println!(
        "  for i in $(seq 5); do curl -s -o /dev/null -w '%{{http_code}}\\n' http://{addr}/; done"
    );
    loop {
        let (stream, peer) = listener.accept().await?;
        let service = ServiceBuilder::new()
            .map_request(move |mut request: Request<Incoming>| {
                request.extensions_mut().insert(PeerAddr(peer));
                request
            })
            .layer(layer.clone())
            .service_fn(hello);
        tokio::spawn(async move {
            let served = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
                .await;
            if let Err(error) = served {
                eprintln!("connection from {peer}: {error}");
            }
        });
    }
}
