//! The doors of the every-door test, each as a client reaches it: raw HTTP/1.1 to the proxy,
//! forward-auth and `/v1/check`, the tower layer called as hyper would, replay of a log, a RESP
//! exchange; and the server and upstream they run against.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Request, Response};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate::{MemoryStore, SystemClock};
use tollgate_http::{PeerAddr, RateLimitLayer, RequestInfo};
use tollgate_server::{Config, Listeners};
use tower::{Layer, Service, ServiceExt};

/// A request as a row describes it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Described {
    pub(super) method: &'static str,
    pub(super) target: &'static str,
    pub(super) host: &'static str,
    /// `X-Forwarded-For` as the proxy in front (a trusted peer on loopback) sends it.
    pub(super) xff: &'static str,
    /// The client's address, for the doors that are told it outright.
    pub(super) client: &'static str,
    pub(super) api_key: Option<&'static str>,
}

/// What every door must answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Expect {
    /// Counted by `per-key` under a key starting with this.
    Counted(&'static str),
    /// No policy applies: passed on, no rate-limit headers.
    Unmatched,
    /// Refused with 400, the problem naming the field as each door knows it.
    Refused,
    /// Refused with 403 by the deny list, before any policy.
    Forbidden,
}

/// One door's answer, reduced to what rows compare.
#[derive(Clone, Debug)]
pub(super) struct Answer {
    pub(super) status: u16,
    pub(super) headers: Vec<(String, String)>,
    pub(super) body: Vec<u8>,
}

impl Answer {
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub(super) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// Checks the answer against `expect`, with `field` the name this door gives the field
    /// a refusal is about.
    pub(super) fn assert(&self, door: &str, row: &str, expect: Expect) {
        let at = format!("{row} at {door}");
        match expect {
            Expect::Counted(_) => {
                assert!(
                    self.status == 200 || self.status == 429,
                    "{at}: {}",
                    self.status
                );
                assert_eq!(self.header("x-ratelimit-limit"), Some("3"), "{at}");
                let policy = self.header("ratelimit-policy").unwrap_or_default();
                assert_eq!(policy, "\"per-key\";q=3;w=3600", "{at}");
            }
            Expect::Unmatched => {
                assert_eq!(self.status, 200, "{at}");
                assert_eq!(self.header("x-ratelimit-limit"), None, "{at}");
                assert_eq!(self.header("ratelimit-policy"), None, "{at}");
            }
            Expect::Refused => {
                assert_eq!(
                    self.status,
                    400,
                    "{at}: {}",
                    String::from_utf8_lossy(&self.body)
                );
                assert_eq!(
                    self.header("content-type"),
                    Some("application/problem+json"),
                    "{at}"
                );
                let problem = self.json();
                assert!(problem["field"].is_string(), "{at}: {problem}");
                assert_eq!(problem["status"], 400, "{at}");
                assert_eq!(self.header("x-ratelimit-limit"), None, "{at}");
            }
            Expect::Forbidden => {
                assert_eq!(self.status, 403, "{at}");
                assert_eq!(
                    self.header("content-type"),
                    Some("application/problem+json"),
                    "{at}"
                );
                let problem = self.json();
                assert_eq!(problem["title"], "Forbidden", "{at}: {problem}");
                let detail = problem["detail"].as_str().unwrap_or_default();
                assert!(detail.contains("\"blocked\""), "{at}: {problem}");
                assert_eq!(self.header("x-ratelimit-limit"), None, "{at}");
            }
        }
    }
}

/// Sends `request` as raw HTTP/1.1 bytes (so that nothing on the way tidies them up) and
/// reads the answer to its end.
pub(super) async fn raw(addr: SocketAddr, request: String, body: &[u8]) -> Answer {
    let mut stream = TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    stream
        .write_all(request.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    stream
        .write_all(body)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut bytes = Vec::new();
    stream
        .read_to_end(&mut bytes)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    parse(&bytes)
}

pub(super) fn parse(bytes: &[u8]) -> Answer {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut headers);
    let head = match response.parse(bytes) {
        Ok(httparse::Status::Complete(n)) => n,
        other => panic!(
            "not an HTTP response ({other:?}): {}",
            String::from_utf8_lossy(bytes)
        ),
    };
    Answer {
        status: response.code.unwrap_or(0),
        headers: response
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_owned(),
                    String::from_utf8_lossy(h.value).into_owned(),
                )
            })
            .collect(),
        body: bytes[head..].to_vec(),
    }
}

/// The reverse proxy, from a trusted proxy on loopback.
pub(super) async fn proxy(addr: SocketAddr, d: &Described) -> Answer {
    let mut head = format!(
        "{} {} HTTP/1.1\r\nhost: {}\r\nx-forwarded-for: {}\r\nconnection: close\r\n",
        d.method, d.target, d.host, d.xff
    );
    if let Some(key) = d.api_key {
        head.push_str(&format!("x-api-key: {key}\r\n"));
    }
    head.push_str("\r\n");
    raw(addr, head, b"").await
}

/// `/v1/forward-auth` (or its nginx flavour), as a proxy on loopback asks it.
pub(super) async fn forward_auth(addr: SocketAddr, path: &str, d: &Described) -> Answer {
    let mut head = format!(
        "GET {path} HTTP/1.1\r\nhost: tollgate\r\nx-forwarded-method: {}\r\n\
         x-forwarded-uri: {}\r\nx-forwarded-host: {}\r\nx-forwarded-for: {}\r\n\
         connection: close\r\n",
        d.method, d.target, d.host, d.xff
    );
    if let Some(key) = d.api_key {
        head.push_str(&format!("x-api-key: {key}\r\n"));
    }
    head.push_str("\r\n");
    raw(addr, head, b"").await
}

/// `POST /v1/check` by attributes: the caller states the client.
pub(super) async fn check(addr: SocketAddr, d: &Described) -> Answer {
    let mut body = json!({"method": d.method, "path": d.target, "host": d.host, "ip": d.client});
    if let Some(key) = d.api_key {
        body["headers"] = json!({"x-api-key": key});
    }
    let body = body.to_string();
    let head = format!(
        "POST /v1/check HTTP/1.1\r\nhost: tollgate\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    raw(addr, head, body.as_bytes()).await
}

pub(super) type Layered = tollgate_http::RateLimitService<
    tower::util::ServiceFn<
        fn(
            Request<http_body_util::Empty<Bytes>>,
        ) -> std::future::Ready<Result<Response<Bytes>, Infallible>>,
    >,
    MemoryStore,
    SystemClock,
    tollgate_http::InnerBody,
>;

pub(super) fn ok(
    _: Request<http_body_util::Empty<Bytes>>,
) -> std::future::Ready<Result<Response<Bytes>, Infallible>> {
    std::future::ready(Ok(Response::new(Bytes::from_static(b"ok"))))
}

/// The tower layer over the engine the configuration describes, in front of a service that
/// answers 200, called as hyper would call it for a connection from a trusted proxy.
pub(super) fn layered(config: &Config) -> Layered {
    let engine = tollgate_config::http_engine(config, MemoryStore::new(), SystemClock::new())
        .unwrap_or_else(|e| panic!("{e}"));
    let service: fn(_) -> _ = ok;
    RateLimitLayer::new(engine)
        .inner_body()
        .layer(tower::service_fn(service))
}

/// The layer's answer, or `None` when the request cannot even be built (an invalid URI).
pub(super) async fn layer(service: &mut Layered, d: &Described) -> Option<Answer> {
    let mut builder = Request::builder()
        .method(d.method)
        .uri(d.target)
        .header("host", d.host)
        .header("x-forwarded-for", d.xff)
        .extension(PeerAddr(SocketAddr::from(([127, 0, 0, 1], 40_000))));
    if let Some(key) = d.api_key {
        builder = builder.header("x-api-key", key);
    }
    let request = builder.body(http_body_util::Empty::new()).ok()?;
    let response = service
        .ready()
        .await
        .unwrap_or_else(|e| match e {})
        .call(request)
        .await
        .unwrap_or_else(|e| match e {});
    Some(Answer {
        status: response.status().as_u16(),
        headers: response
            .headers()
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    v.to_str().unwrap_or_default().to_owned(),
                )
            })
            .collect(),
        body: response.into_body().to_vec(),
    })
}

/// The key the layer's engine counts the request under.
pub(super) fn layer_key(config: &Config, d: &Described) -> Option<String> {
    let engine = tollgate_config::http_engine(config, MemoryStore::new(), SystemClock::new())
        .unwrap_or_else(|e| panic!("{e}"));
    let mut builder = Request::builder()
        .method(d.method)
        .uri(d.target)
        .header("host", d.host)
        .header("x-forwarded-for", d.xff);
    if let Some(key) = d.api_key {
        builder = builder.header("x-api-key", key);
    }
    let request = builder.body(()).ok()?;
    let info = RequestInfo::from_request(&request, Some([127, 0, 0, 1].into()));
    let prepared = engine.prepare(&info);
    prepared
        .keys()
        .next()
        .map(|(_, k)| String::from_utf8_lossy(k).into_owned())
}

/// A tiny upstream that answers 200 to every request.
pub(super) async fn upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                let mut filled = 0;
                loop {
                    let Ok(n) = stream.read(&mut buf[filled..]).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    filled += n;
                    while let Some(end) = find(&buf[..filled], b"\r\n\r\n") {
                        let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if stream.write_all(reply).await.is_err() {
                            return;
                        }
                        buf.copy_within(end + 4..filled, 0);
                        filled -= end + 4;
                    }
                }
            });
        }
    });
    addr
}

pub(super) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A server running `text`, on ports of its own.
pub(super) struct Server {
    pub(super) api: SocketAddr,
    pub(super) admin: SocketAddr,
    pub(super) proxy: Option<SocketAddr>,
    pub(super) grpc: Option<SocketAddr>,
    pub(super) resp: Option<SocketAddr>,
    pub(super) config: Config,
    pub(super) stop: tokio::sync::oneshot::Sender<()>,
    pub(super) task: tokio::task::JoinHandle<()>,
}

impl Server {
    pub(super) async fn start(text: &str, dir: &Path) -> Server {
        let file = dir.join("tollgate.toml");
        std::fs::write(&file, text).unwrap_or_else(|e| panic!("{e}"));
        let config = Config::load(&file).unwrap_or_else(|e| panic!("{e}"));
        let listeners = Listeners::bind(&config)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addrs = listeners.local_addrs();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn({
            let config = config.clone();
            async move {
                let run = tollgate_server::run(config, listeners, async {
                    let _ = stopped.await;
                });
                if let Err(e) = run.await {
                    panic!("{e}");
                }
            }
        });
        Server {
            api: addrs.api.unwrap_or_else(|| panic!("no api")),
            admin: addrs.admin.unwrap_or_else(|| panic!("no admin")),
            proxy: addrs.proxy,
            grpc: addrs.grpc,
            resp: addrs.resp,
            config,
            stop,
            task,
        }
    }

    pub(super) async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }

    pub(super) async fn admin(&self, path: &str) -> Answer {
        let head = format!("GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n");
        raw(self.admin, head, b"").await
    }

    /// `tollgate_decisions_total` of `policy` and `outcome`.
    pub(super) async fn decisions(&self, policy: &str, outcome: &str) -> u64 {
        let metrics = self.admin("/metrics").await;
        let wanted =
            format!("tollgate_decisions_total{{policy=\"{policy}\",outcome=\"{outcome}\"}} ");
        String::from_utf8_lossy(&metrics.body)
            .lines()
            .find_map(|l| l.strip_prefix(&wanted).and_then(|n| n.parse().ok()))
            .unwrap_or(0)
    }
}

pub(super) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The lines a server would log for `rows`' requests, replayed: each line's status and the
/// key its decision was counted under.
pub(super) fn replayed(
    config: &Config,
    dir: &Path,
    requests: &[Described],
) -> Vec<(u16, Option<String>)> {
    let time = now_secs();
    let lines: Vec<String> = requests
        .iter()
        .map(|d| {
            let mut line = json!({"time": time, "method": d.method, "path": d.target,
                "host": d.host, "ip": d.client});
            if let Some(key) = d.api_key {
                line["api_key"] = json!(key);
            }
            line.to_string()
        })
        .collect();
    let log = dir.join("access.jsonl");
    std::fs::write(&log, lines.join("\n") + "\n").unwrap_or_else(|e| panic!("{e}"));
    let trace = dir.join("decisions.jsonl");
    let mut options = tollgate_replay::Options::new(config.clone(), vec![log]);
    options.format = tollgate_replay::Format::Json;
    options.decisions = Some(trace.clone());
    tollgate_replay::replay(&options, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"));
    std::fs::read_to_string(&trace)
        .unwrap_or_else(|e| panic!("{e}"))
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or(Value::Null);
            let status = u16::try_from(v["status"].as_u64().unwrap_or(0)).unwrap_or(0);
            let key = v["decisions"][0]["key"].as_str().map(str::to_owned);
            (status, key)
        })
        .collect()
}

/// Sends one RESP command on `stream`; the reply (one read: the door's replies are small).
pub(super) async fn resp_command(stream: &mut TcpStream, command: &[u8]) -> String {
    stream
        .write_all(command)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut reply = vec![0u8; 512];
    let n = stream
        .read(&mut reply)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    String::from_utf8_lossy(&reply[..n]).into_owned()
}

/// Sends a door's request twice to the proxy, forward-auth, `POST /v1/check` and the tower
/// layer (`request` makes it, given the door's own key so the doors do not share a count):
/// the first must pass, and `second` judges the second, told which door answered. The second
/// `/v1/check` answer is returned, for what its body says.
pub(super) async fn twice_at_each_door(
    server: &Server,
    request: impl Fn(&'static str) -> Described,
    second: impl Fn(&Answer, &str),
) -> Answer {
    let proxy_addr = server.proxy.unwrap_or_else(|| panic!("no proxy"));
    assert_eq!(proxy(proxy_addr, &request("px")).await.status, 200);
    second(&proxy(proxy_addr, &request("px")).await, "the proxy");
    let fa = request("fa");
    let path = "/v1/forward-auth";
    assert_eq!(forward_auth(server.api, path, &fa).await.status, 200);
    second(&forward_auth(server.api, path, &fa).await, "forward-auth");
    assert_eq!(check(server.api, &request("ck")).await.status, 200);
    let checked = check(server.api, &request("ck")).await;
    second(&checked, "/v1/check");
    let mut service = layered(&server.config);
    let first = layer(&mut service, &request("ly")).await;
    assert_eq!(first.map(|a| a.status), Some(200), "the tower layer");
    let again = layer(&mut service, &request("ly"))
        .await
        .unwrap_or_else(|| panic!("no answer"));
    second(&again, "the tower layer");
    checked
}

/// `d` at the three doors of a running server that decide a request as its upstream reads it:
/// the reverse proxy, `/v1/forward-auth` and `POST /v1/check` by attributes, each named.
pub(super) async fn at_three_doors(server: &Server, d: &Described) -> [(&'static str, Answer); 3] {
    let proxy_addr = server.proxy.unwrap_or_else(|| panic!("no proxy"));
    [
        ("the proxy", proxy(proxy_addr, d).await),
        (
            "forward-auth",
            forward_auth(server.api, "/v1/forward-auth", d).await,
        ),
        ("/v1/check", check(server.api, d).await),
    ]
}

/// A loopback port nothing listens on (bound, then let go): a Redis that is not there.
pub(super) fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap_or_else(|e| panic!("{e}"))
        .port()
}
