//! The reverse proxy on `[proxy] listen`: checks every request, holds `delay` ones, answers 429
//! per SPEC §5, and otherwise streams the request to the upstream over pooled connections,
//! keeping `Host`, appending `X-Forwarded-For`, and adding the rate-limit headers to the answer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HOST, HeaderName, HeaderValue};
use hyper::{HeaderMap, Request, Response, StatusCode, Uri, Version};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use tollgate_http::RequestInfo;

use crate::Shared;
use crate::engine::Verdict;
use crate::response::{Body, full, problem};

/// The pooled HTTP/1.1 client to upstreams.
pub(crate) type UpstreamClient = Client<HttpConnector, Incoming>;

pub(crate) fn client() -> UpstreamClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(5)));
    connector.set_keepalive(Some(Duration::from_secs(60)));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(256)
        .build(connector)
}

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all("connection")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

pub(crate) async fn handle(
    shared: Arc<Shared>,
    peer: SocketAddr,
    mut req: Request<Incoming>,
) -> Response<Body> {
    let engine = shared.engine();
    let config = Arc::clone(engine.config());
    let Some(proxy) = config.proxy.as_ref() else {
        return problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "Proxy disabled",
            Some("the running configuration has no [proxy] section"),
        );
    };
    let (eval_headers, verdict) = {
        let info = RequestInfo::from_request(&req, Some(peer.ip()));
        let eval = engine.evaluate(&info).await;
        (eval.headers, eval.verdict)
    };
    match verdict {
        Verdict::Respond(r) => return r.map(full),
        // If the client goes away while held, the hold is dropped and its slot given back.
        Verdict::Hold(hold) => hold.wait().await,
        Verdict::Pass => {}
    }

    let pq = req
        .uri()
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_owned();
    let mut parts = proxy.upstream.clone().into_parts();
    parts.path_and_query = pq.parse().ok();
    let Ok(uri) = Uri::from_parts(parts) else {
        return problem(StatusCode::BAD_REQUEST, "Bad request target", None);
    };
    // Keep the client's Host; an HTTP/1.0 request without one gets the upstream's.
    if !req.headers().contains_key(HOST)
        && let Some(a) = uri.authority()
        && let Ok(v) = HeaderValue::from_str(a.as_str())
    {
        req.headers_mut().insert(HOST, v);
    }
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_11;
    let headers = req.headers_mut();
    strip_hop_by_hop(headers);
    let xff = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(prev) => format!("{prev}, {}", peer.ip()),
        None => peer.ip().to_string(),
    };
    if let Ok(v) = HeaderValue::from_str(&xff) {
        headers.insert("x-forwarded-for", v);
    }

    match tokio::time::timeout(proxy.timeout, shared.client.request(req)).await {
        Err(_) => {
            shared.metrics.upstream_error();
            problem(
                StatusCode::GATEWAY_TIMEOUT,
                "Upstream timed out",
                Some("the upstream did not answer in time"),
            )
        }
        Ok(Err(e)) => {
            shared.metrics.upstream_error();
            tracing::warn!(error = %e, "upstream request failed");
            problem(
                StatusCode::BAD_GATEWAY,
                "Upstream unavailable",
                Some("the upstream could not be reached or failed mid-answer"),
            )
        }
        Ok(Ok(res)) => {
            let mut res = res.map(|b| b.boxed());
            strip_hop_by_hop(res.headers_mut());
            for (name, value) in &eval_headers {
                res.headers_mut().insert(name.clone(), value.clone());
            }
            res
        }
    }
}
