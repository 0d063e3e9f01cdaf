//! Helpers of the `queue` action's tests: a recording upstream whose answers the test sets per
//! path, a status poller, and the queue policy's configuration.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{HeaderMap, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::common::raw::{Client, Resp};
use crate::common::{Reply, get};

/// One request the upstream read.
#[derive(Clone, Debug)]
pub struct Arrival {
    pub method: String,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub at: Instant,
}

impl Arrival {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    pub fn key(&self) -> Option<&str> {
        self.header("idempotency-key")
    }
}

/// An upstream that records every request and answers the status set for its path (200 by
/// default).
#[derive(Clone)]
pub struct Recorder {
    pub addr: SocketAddr,
    arrivals: Arc<Mutex<Vec<Arrival>>>,
    answers: Arc<Mutex<HashMap<String, u16>>>,
}

impl Recorder {
    pub async fn start() -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let rec = Recorder {
            addr: listener.local_addr().unwrap(),
            arrivals: Arc::default(),
            answers: Arc::default(),
        };
        let r = rec.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let r = r.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let r = r.clone();
                        async move { Ok::<_, Infallible>(r.record(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        rec
    }

    async fn record(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let (parts, body) = req.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let path = parts.uri.path().to_owned();
        let status = self
            .answers
            .lock()
            .unwrap()
            .get(&path)
            .copied()
            .unwrap_or(200);
        self.arrivals.lock().unwrap().push(Arrival {
            method: parts.method.to_string(),
            path,
            headers: parts.headers,
            body,
            at: Instant::now(),
        });
        let mut res = Response::new(Full::new(Bytes::from_static(b"recorded")));
        *res.status_mut() = StatusCode::from_u16(status).unwrap();
        res
    }

    /// Answers `status` to requests for `path` from now on.
    pub fn answer(&self, path: &str, status: u16) {
        self.answers.lock().unwrap().insert(path.to_owned(), status);
    }

    pub fn arrivals(&self) -> Vec<Arrival> {
        self.arrivals.lock().unwrap().clone()
    }

    /// The arrivals carrying idempotency key `id`.
    pub fn with_key(&self, id: &str) -> Vec<Arrival> {
        self.arrivals()
            .into_iter()
            .filter(|a| a.key() == Some(id))
            .collect()
    }
}

/// A proxy to `upstream` with one `queue` policy, `hooks`, on `/hooks/**`, keyed by
/// `x-tenant`, plus `extra` fields for it and `tail` after it.
pub fn queue_config(upstream: SocketAddr, rate: &str, extra: &str, tail: &str) -> String {
    format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{upstream}\"\ntimeout = \"2s\"\n\n\
         [[policy]]\nname = \"hooks\"\nalgorithm = \"leaky_bucket\"\nrate = \"{rate}\"\n\
         action = \"queue\"\nkey = [\"header:x-tenant\"]\nmatch = {{ path = \"/hooks/**\" }}\n{extra}\n{tail}"
    )
}

/// The id of a `202 Accepted`, checked against its `Location`.
pub fn accepted_id(reply: &Reply) -> String {
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{:?}", reply.body);
    let json = reply.json();
    let id = json["id"].as_str().expect("an id").to_owned();
    assert_eq!(
        reply.header("location"),
        Some(format!("/v1/queue/{id}").as_str())
    );
    assert_eq!(json["state"], "queued");
    id
}

/// Polls `GET /v1/queue/{id}` on `proxy` until its state is `state` (within 20 s); the
/// status JSON.
pub async fn wait_state(proxy: SocketAddr, id: &str, state: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = get(&format!("http://{proxy}/v1/queue/{id}"), &[]).await;
        if r.status == StatusCode::OK && r.json()["state"] == state {
            return r.json();
        }
        assert!(
            Instant::now() < deadline,
            "{id} never reached {state}: {} {:?}",
            r.status,
            r.body
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `cond` every 50 ms until it holds (within 20 s).
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends `requests` (path, tenant, body) pipelined on one connection, as POSTs, so they reach
/// the proxy together; their answers, in order.
pub async fn burst(proxy: SocketAddr, requests: &[(&str, &str, &str)]) -> Vec<Resp> {
    let mut c = Client::connect(proxy).await;
    let mut bytes = String::new();
    for (path, tenant, body) in requests {
        bytes.push_str(&format!(
            "POST {path} HTTP/1.1\r\nHost: hooks.test\r\nX-Tenant: {tenant}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ));
    }
    c.send(bytes).await;
    let mut out = Vec::new();
    for _ in requests {
        out.push(c.response().await);
    }
    out
}

/// The id a raw `202 Accepted` gives, checked against its `Location`.
pub fn raw_accepted_id(r: &Resp) -> String {
    assert_eq!(r.status, 202, "{r:?}");
    let json: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
    let id = json["id"].as_str().expect("an id").to_owned();
    assert_eq!(
        r.header("location"),
        Some(format!("/v1/queue/{id}").as_str())
    );
    id
}
