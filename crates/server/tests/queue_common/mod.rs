//! Helpers of the `queue` action's tests: a recording upstream whose answers the test sets per
//! path (a status, a stall that never answers, a hang-up that closes unanswered, a gate the
//! test opens), a status poller, a metrics reader, and the queue policy's configuration.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

pub mod cases;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{HeaderMap, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::common::raw::{Client, Resp};
use crate::common::{Reply, get};

/// One request the upstream read.
#[derive(Clone, Debug)]
pub struct Arrival {
    pub method: String,
    pub path: String,
    /// The request target as it arrived: the path and the query.
    pub target: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub at: Instant,
    /// The upstream connection it came on, numbered in the order they were accepted from 0.
    pub conn: usize,
}

impl Arrival {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    pub fn key(&self) -> Option<&str> {
        self.header("idempotency-key")
    }
}

/// A gate the upstream holds requests at until the test opens it.
pub struct Gate(watch::Sender<bool>);

impl Gate {
    /// Lets every request held at this gate, and every later one, be answered.
    pub fn release(&self) {
        self.0.send_replace(true);
    }
}

/// An upstream that records every request as it arrives, then answers the status set for its
/// path (200 by default): after holding it at the path's gate, if there is one, or never, for
/// as many requests as the path has stalls left; or, for as many as it has hang-ups left, not
/// at all: their connection closes once the request is read whole.
#[derive(Clone)]
pub struct Recorder {
    pub addr: SocketAddr,
    arrivals: Arc<Mutex<Vec<Arrival>>>,
    answers: Arc<Mutex<HashMap<String, u16>>>,
    stalls: Arc<Mutex<HashMap<String, u32>>>,
    hang_ups: Arc<Mutex<HashMap<String, u32>>>,
    gates: Arc<Mutex<HashMap<String, watch::Receiver<bool>>>>,
}

impl Recorder {
    pub async fn start() -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let rec = Recorder {
            addr: listener.local_addr().unwrap(),
            arrivals: Arc::default(),
            answers: Arc::default(),
            stalls: Arc::default(),
            hang_ups: Arc::default(),
            gates: Arc::default(),
        };
        let r = rec.clone();
        tokio::spawn(async move {
            for conn in 0.. {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let r = r.clone();
                tokio::spawn(async move {
                    // A request the service fails closes the connection without an answer.
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let r = r.clone();
                        async move { r.record(req, conn).await }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        rec
    }

    async fn record(
        &self,
        req: Request<Incoming>,
        conn: usize,
    ) -> Result<Response<Full<Bytes>>, std::io::Error> {
        let (parts, body) = req.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let path = parts.uri.path().to_owned();
        let target = parts
            .uri
            .path_and_query()
            .map_or_else(|| path.clone(), ToString::to_string);
        let take =
            |counts: &Mutex<HashMap<String, u32>>| match counts.lock().unwrap().get_mut(&path) {
                Some(left) if *left > 0 => {
                    *left -= 1;
                    true
                }
                _ => false,
            };
        let stall = take(&self.stalls);
        let hang_up = take(&self.hang_ups);
        let gate = self.gates.lock().unwrap().get(&path).cloned();
        self.arrivals.lock().unwrap().push(Arrival {
            method: parts.method.to_string(),
            path: path.clone(),
            target,
            headers: parts.headers,
            body,
            at: Instant::now(),
            conn,
        });
        if hang_up {
            // Read whole, and no answer: the connection closes.
            return Err(std::io::Error::other("hung up"));
        }
        if stall {
            // No answer and no close: only the proxy's timeout ends this exchange.
            std::future::pending::<()>().await;
        }
        if let Some(mut gate) = gate {
            let _ = gate.wait_for(|open| *open).await;
        }
        let status = self
            .answers
            .lock()
            .unwrap()
            .get(&path)
            .copied()
            .unwrap_or(200);
        let mut res = Response::new(Full::new(Bytes::from_static(b"recorded")));
        *res.status_mut() = StatusCode::from_u16(status).unwrap();
        Ok(res)
    }

    /// Answers `status` to requests for `path` from now on.
    pub fn answer(&self, path: &str, status: u16) {
        self.answers.lock().unwrap().insert(path.to_owned(), status);
    }

    /// Never answers the next `n` requests for `path` (they are recorded, then left hanging).
    pub fn stall(&self, path: &str, n: u32) {
        self.stalls.lock().unwrap().insert(path.to_owned(), n);
    }

    /// Reads the next `n` requests for `path` whole, records them, then closes their connection
    /// without an answer.
    pub fn hang_up(&self, path: &str, n: u32) {
        self.hang_ups.lock().unwrap().insert(path.to_owned(), n);
    }

    /// Holds the requests for `path` from now on until the gate is released.
    pub fn hold(&self, path: &str) -> Gate {
        let (open, held) = watch::channel(false);
        self.gates.lock().unwrap().insert(path.to_owned(), held);
        Gate(open)
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
    queue_config_timeout(upstream, "2s", rate, extra, tail)
}

/// [`queue_config`] with `timeout` as the proxy's (and so each delivery's) timeout.
pub fn queue_config_timeout(
    upstream: SocketAddr,
    timeout: &str,
    rate: &str,
    extra: &str,
    tail: &str,
) -> String {
    format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{upstream}\"\ntimeout = \"{timeout}\"\n\n\
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

/// The value of `series` (the whole name with its labels) in a `/metrics` text; `None` when the
/// text has no such series, so a wait for a value cannot pass on a series that is missing.
pub fn series_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// The value of `series` on the admin listener `admin`; panics naming it when it is missing.
pub async fn metric(admin: SocketAddr, series: &str) -> f64 {
    let r = get(&format!("http://{admin}/metrics"), &[]).await;
    let text = String::from_utf8_lossy(&r.body);
    series_value(&text, series).unwrap_or_else(|| panic!("no series {series} in\n{text}"))
}

/// Polls `series` on `admin` every 50 ms until its value passes `ok` (within 20 s); the value.
pub async fn metric_until(admin: SocketAddr, series: &str, ok: impl Fn(f64) -> bool) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let value = metric(admin, series).await;
        if ok(value) {
            return value;
        }
        assert!(Instant::now() < deadline, "{series} stayed at {value}");
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
