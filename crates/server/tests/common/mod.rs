//! Test helpers: start the server on 127.0.0.1:0 as a library function, a tiny upstream, and a
//! small HTTP client.
#![allow(dead_code, unreachable_pub)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{HeaderMap, Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tollgate_server::{Config, Listeners};

pub mod log;
pub mod otlp;
pub mod raw;

pub struct Running {
    pub api: SocketAddr,
    pub admin: SocketAddr,
    pub proxy: Option<SocketAddr>,
    pub grpc: Option<SocketAddr>,
    pub resp: Option<SocketAddr>,
    stop: Option<oneshot::Sender<()>>,
    pub task: tokio::task::JoinHandle<()>,
}

impl Running {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.api)
    }
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }
    pub fn proxy_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.proxy.unwrap())
    }
    /// Triggers shutdown and waits for the drain.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), &mut self.task).await;
    }
    /// Triggers shutdown and waits for the server to end; panics if it failed.
    pub async fn stop_cleanly(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        (&mut self.task).await.expect("the server ends cleanly");
    }
    pub fn trigger_stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// Every listener on port 0, whatever the text says.
pub fn with_ports(text: &str) -> String {
    let mut t =
        String::from("[server]\nlisten = \"127.0.0.1:0\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n");
    t.push_str(text);
    t
}

pub async fn start(config: Config) -> Running {
    let limits = config.limits;
    start_with_limits(config, limits).await
}

/// [`start`] with listener limits of the test's own (a short header read timeout) in place of
/// the configuration's.
pub async fn start_with_limits(config: Config, limits: tollgate_server::Limits) -> Running {
    let listeners = Listeners::bind(&config).await.expect("bind");
    let addrs = listeners.local_addrs();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let shutdown = async {
            let _ = rx.await;
        };
        tollgate_server::run_with(config, listeners, shutdown, limits)
            .await
            .expect("run");
    });
    Running {
        api: addrs.api.unwrap(),
        admin: addrs.admin.unwrap(),
        proxy: addrs.proxy,
        grpc: addrs.grpc,
        resp: addrs.resp,
        stop: Some(tx),
        task,
    }
}

pub async fn start_text(text: &str) -> Running {
    let config = Config::parse("test.toml", &with_ports(text)).expect("valid config");
    start(config).await
}

#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("json body")
    }
}

pub async fn send(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Reply {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut req = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(body.into())).unwrap();
    let res = client.request(req).await.expect("request");
    let (parts, body) = res.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

pub async fn post_json(url: &str, json: &str) -> Reply {
    send(
        "POST",
        url,
        &[("content-type", "application/json")],
        json.to_owned(),
    )
    .await
}

pub async fn get(url: &str, headers: &[(&str, &str)]) -> Reply {
    send("GET", url, headers, Bytes::new()).await
}

/// A tiny upstream: echoes the body; answers with the Host and X-Forwarded-For it saw in
/// `x-seen-host` / `x-seen-xff`; `/slow` waits 3 s; `/big?n=BYTES` streams n bytes.
pub async fn upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    Ok::<_, Infallible>(echo(req).await)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

type UpBody = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

async fn echo(req: Request<Incoming>) -> Response<UpBody> {
    let host = req.headers().get("host").cloned();
    let xff = req.headers().get("x-forwarded-for").cloned();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let mut res = if path == "/slow" {
        tokio::time::sleep(Duration::from_secs(3)).await;
        Response::new(
            Full::new(Bytes::from_static(b"slow"))
                .map_err(|n| match n {})
                .boxed(),
        )
    } else if path == "/big" {
        let n: usize = query.trim_start_matches("n=").parse().unwrap_or(0);
        let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
        let chunks = n / chunk.len();
        let stream = futures_stream(chunk, chunks);
        Response::new(StreamBody::new(stream).boxed())
    } else {
        // Stream the request body straight back.
        Response::new(req.into_body().boxed())
    };
    if let Some(h) = host {
        res.headers_mut().insert("x-seen-host", h);
    }
    if let Some(x) = xff {
        res.headers_mut().insert("x-seen-xff", x);
    }
    res
}

fn futures_stream(
    chunk: Bytes,
    n: usize,
) -> impl futures_core::Stream<Item = Result<Frame<Bytes>, hyper::Error>> + Send + Sync {
    struct S(Bytes, usize);
    impl futures_core::Stream for S {
        type Item = Result<Frame<Bytes>, hyper::Error>;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Self::Item>> {
            if self.1 == 0 {
                return std::task::Poll::Ready(None);
            }
            self.1 -= 1;
            std::task::Poll::Ready(Some(Ok(Frame::data(self.0.clone()))))
        }
    }
    S(chunk, n)
}

pub async fn wait_for<F, Fut>(mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("condition not met within 10 s");
}

/// A request as a test upstream reads it: the head in lower case, and its body.
pub struct UpstreamRequest {
    pub head: String,
    pub body: Vec<u8>,
}

impl UpstreamRequest {
    /// The value of header `name` (lower case), if the request has it.
    pub fn header(&self, name: &str) -> Option<String> {
        self.head
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .map(str::to_owned)
    }
}

/// Reads the next request of a keep-alive connection (a `content-length` body), keeping what
/// follows it in `buf`; `None` when the connection ends first.
pub async fn next_request(
    stream: &mut tokio::net::TcpStream,
    buf: &mut Vec<u8>,
) -> Option<UpstreamRequest> {
    use tokio::io::AsyncReadExt;
    let mut chunk = [0u8; 8192];
    let end = loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    buf.drain(..end + 4);
    let mut request = UpstreamRequest {
        head,
        body: Vec::new(),
    };
    let length: usize = request
        .header("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    while buf.len() < length {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    request.body = buf.drain(..length).collect();
    Some(request)
}
