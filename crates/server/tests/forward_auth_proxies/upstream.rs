//! The application behind the proxy: answers every request with 200 and records what it
//! received, so a test can tell that a denied request never reached it. And a client that
//! connects from a chosen loopback address, so the proxies see several clients.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{HeaderMap, Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

/// A request as the application received it.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) method: String,
    pub(crate) target: String,
    pub(crate) headers: HeaderMap,
}

/// The recording application.
pub(crate) struct Upstream {
    pub(crate) addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Upstream {
    pub(crate) async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let log = Arc::clone(&log);
                        async move {
                            log.lock().unwrap().push(Seen {
                                method: req.method().to_string(),
                                target: req.uri().to_string(),
                                headers: req.headers().clone(),
                            });
                            let mut res = Response::new(Full::new(Bytes::from_static(b"app\n")));
                            res.headers_mut()
                                .insert("content-type", "text/plain".parse().unwrap());
                            Ok::<_, Infallible>(res)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Upstream { addr, seen, task }
    }

    /// Every request received so far.
    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Whether a request for `target` arrived.
    pub(crate) fn received(&self, target: &str) -> bool {
        self.seen().iter().any(|s| s.target == target)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A response as the client received it.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Reply {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Every value of `name` (a header the proxy sent twice would show here).
    pub(crate) fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect()
    }
}

/// Sends `method target` to `proxy` from the loopback address `from`.
pub(crate) async fn send(
    proxy: SocketAddr,
    from: IpAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
) -> Reply {
    try_send(proxy, from, method, target, headers)
        .await
        .unwrap_or_else(|e| panic!("{method} {target} via {proxy}: {e}"))
}

/// [`send`], with the failure as a value.
pub(crate) async fn try_send(
    proxy: SocketAddr,
    from: IpAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
) -> Result<Reply, String> {
    let mut connector = HttpConnector::new();
    connector.set_local_address(Some(from));
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
    let mut req = Request::builder()
        .method(method)
        .uri(format!("http://{proxy}{target}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let res = client.request(req).await.map_err(|e| e.to_string())?;
    let (parts, body) = res.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok(Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}
