//! The pieces of the queue's end-to-end tests: a `redis-server` of the test's own, `tollgate
//! serve` processes, an upstream that counts arrivals, and a client that sends webhooks
//! pipelined over a few connections. Plain threads and sockets: the processes under test do
//! the async work.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `redis-server` of the test's own on a free port, killed when dropped.
pub use tollgate_testkit::redis::RedisProcess as Redis;

/// A running `tollgate serve`, killed when dropped.
pub struct Instance {
    child: Child,
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Instance {
    /// `tollgate serve` with `config` (its listeners on port 0), once it says where it listens.
    pub fn start(config: &str) -> Instance {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tollgate.toml");
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nmax_connections = 512\n\
             [admin]\nlisten = \"127.0.0.1:0\"\n{config}"
        );
        std::fs::write(&file, text).unwrap();
        let mut child = Command::new(BIN)
            .args(["serve", "--config"])
            .arg(&file)
            .env("TOLLGATE_LOG", "warn")
            .env("TG_TEST_KEY_SECRET", "queue-test-secret-0123456789")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (mut proxy, mut admin) = (None, None);
        while proxy.is_none() || admin.is_none() {
            let line = lines.next().expect("server output").unwrap();
            let addr = || -> SocketAddr {
                let url = line.split_whitespace().find(|w| w.starts_with("http://"));
                url.unwrap().trim_start_matches("http://").parse().unwrap()
            };
            match line.split_whitespace().next() {
                Some("proxy") => proxy = Some(addr()),
                Some("admin") => admin = Some(addr()),
                _ => {}
            }
        }
        std::thread::spawn(move || for _ in lines {});
        Instance {
            child,
            proxy: proxy.unwrap(),
            admin: admin.unwrap(),
            _dir: dir,
        }
    }

    /// SIGKILL: the instance stops as in a crash, without handing anything back.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The value of metric series `series` (the whole name with labels); panics naming it when
    /// `/metrics` has no such series, so that a wait for a value cannot pass on a missing one.
    pub fn metric(&self, series: &str) -> f64 {
        let (status, body) = request(self.admin, "GET", "/metrics", &[], "");
        assert_eq!(status, 200, "/metrics: {body}");
        series_value(&body, series)
            .unwrap_or_else(|| panic!("no series {series} in /metrics:\n{body}"))
    }
}

/// The value of `series` (the whole name with labels) in a `/metrics` text; `None` when the text
/// has no such series.
pub fn series_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// A queue policy `hooks` (leaky bucket at `rate`, a burst of `queue + 1`) over Redis, in
/// front of `upstream`, with `extra` fields.
pub fn queue_config(redis: &Redis, upstream: u16, rate: &str, queue: u32, extra: &str) -> String {
    format!(
        "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{}\"\ntimeout = \"1s\"\n\
         key_secret_env = \"TG_TEST_KEY_SECRET\"\n\n\
         [proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:{upstream}\"\ntimeout = \"5s\"\n\n\
         [[policy]]\nname = \"hooks\"\nalgorithm = \"leaky_bucket\"\nrate = \"{rate}\"\nqueue = {queue}\n\
         action = \"queue\"\nkey = [\"header:x-sender\"]\nmatch = {{ path = \"/hooks/**\" }}\n{extra}\n",
        redis.port()
    )
}

/// One HTTP/1.1 request on a new connection: status and body.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // `Host: t` unless the caller names one (an admin write must name the admin listener).
    let mut head = if headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n")
    } else {
        format!("{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n")
    };
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(head.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (status, body)
}

/// The JSON of `GET /v1/queue/{id}` on `proxy`.
pub fn status_of(proxy: SocketAddr, id: &str) -> serde_json::Value {
    let (status, body) = request(proxy, "GET", &format!("/v1/queue/{id}"), &[], "");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// What one webhook got back.
#[derive(Clone, Debug)]
pub struct Sent {
    pub number: usize,
    pub status: u16,
    /// The queue id of a 202.
    pub id: Option<String>,
}

/// Sends webhooks `numbers` as `POST /hooks/{n}` from sender `sender`, pipelined 50 at a time
/// over `connections` connections to `proxy`. A webhook whose body contains "poison" is the
/// one the upstream refuses (see [`Upstream`]).
pub fn send_webhooks(
    proxy: SocketAddr,
    numbers: std::ops::Range<usize>,
    connections: usize,
    poison: Option<usize>,
) -> Vec<Sent> {
    let numbers: Vec<usize> = numbers.collect();
    let per = numbers.len().div_ceil(connections.max(1)).max(1);
    let threads: Vec<_> = numbers
        .chunks(per)
        .map(|chunk| {
            let chunk = chunk.to_vec();
            std::thread::spawn(move || {
                let mut conn = TcpStream::connect(proxy).unwrap();
                conn.set_read_timeout(Some(Duration::from_secs(30)))
                    .unwrap();
                let mut reader = ResponseReader::default();
                let mut sent = Vec::new();
                for batch in chunk.chunks(50) {
                    let mut bytes = Vec::new();
                    for n in batch {
                        let body = if poison == Some(*n) {
                            format!("{{\"webhook\":{n},\"poison\":true}}")
                        } else {
                            format!("{{\"webhook\":{n}}}")
                        };
                        bytes.extend_from_slice(
                            format!(
                                "POST /hooks/{n} HTTP/1.1\r\nHost: hooks\r\nX-Sender: s\r\n\
                                 X-Webhook: {n}\r\nContent-Length: {}\r\n\r\n{body}",
                                body.len()
                            )
                            .as_bytes(),
                        );
                    }
                    conn.write_all(&bytes).unwrap();
                    for n in batch {
                        let (status, body) = reader.next(&mut conn);
                        let id = (status == 202).then(|| {
                            let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
                            json["id"].as_str().unwrap().to_owned()
                        });
                        sent.push(Sent {
                            number: *n,
                            status,
                            id,
                        });
                    }
                }
                sent
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect()
}

/// Sends webhooks `numbers` one per connection: for a proxy that closes the connection after
/// some answers (a 502 to a request with a body, while the upstream is down).
pub fn send_one_by_one(proxy: SocketAddr, numbers: std::ops::Range<usize>) -> Vec<Sent> {
    numbers
        .map(|n| {
            let body = format!("{{\"webhook\":{n}}}");
            let n_text = n.to_string();
            let headers = [("X-Sender", "s"), ("X-Webhook", n_text.as_str())];
            let (status, answer) = request(proxy, "POST", &format!("/hooks/{n}"), &headers, &body);
            let id = (status == 202).then(|| {
                let json: serde_json::Value = serde_json::from_str(&answer).unwrap();
                json["id"].as_str().unwrap().to_owned()
            });
            Sent {
                number: n,
                status,
                id,
            }
        })
        .collect()
}

/// Reads responses framed by `Content-Length` off a keep-alive connection.
#[derive(Default)]
struct ResponseReader {
    buf: Vec<u8>,
}

impl ResponseReader {
    fn next(&mut self, conn: &mut TcpStream) -> (u16, Vec<u8>) {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut res = httparse::Response::new(&mut headers);
            if let httparse::Status::Complete(len) = res.parse(&self.buf).unwrap() {
                let status = res.code.unwrap();
                let length: usize = res
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .map(|h| std::str::from_utf8(h.value).unwrap().parse().unwrap())
                    .unwrap_or(0);
                if (100..200).contains(&status) {
                    self.buf.drain(..len);
                    continue;
                }
                if self.buf.len() >= len + length {
                    let body = self.buf[len..len + length].to_vec();
                    self.buf.drain(..len + length);
                    return (status, body);
                }
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = conn.read(&mut chunk).unwrap();
            assert!(n > 0, "the proxy closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// One request the upstream read.
#[derive(Clone, Debug)]
pub struct Arrival {
    pub at: Instant,
    pub webhook: usize,
    pub key: Option<String>,
}

/// An upstream on `port` that records every request (when, which webhook, its idempotency key)
/// and answers 200, or 500 to a body that contains "poison" until [`Upstream::cure`]. Listening
/// starts at [`Upstream::listen`], so a test can keep it down for a while.
#[derive(Clone)]
pub struct Upstream {
    pub port: u16,
    arrivals: Arc<Mutex<Vec<Arrival>>>,
    cured: Arc<AtomicBool>,
}

impl Upstream {
    pub fn new() -> Upstream {
        Upstream {
            port: free_port(),
            arrivals: Arc::default(),
            cured: Arc::default(),
        }
    }

    /// Starts listening (a thread per connection).
    pub fn listen(&self) {
        let listener = TcpListener::bind(("127.0.0.1", self.port)).unwrap();
        let arrivals = Arc::clone(&self.arrivals);
        let cured = Arc::clone(&self.cured);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let arrivals = Arc::clone(&arrivals);
                let cured = Arc::clone(&cured);
                std::thread::spawn(move || serve(conn, &arrivals, &cured));
            }
        });
    }

    /// Answers 200 to poison too, from now on.
    pub fn cure(&self) {
        self.cured.store(true, Ordering::Relaxed);
    }

    pub fn arrivals(&self) -> Vec<Arrival> {
        self.arrivals.lock().unwrap().clone()
    }
}

fn serve(mut conn: TcpStream, arrivals: &Mutex<Vec<Arrival>>, cured: &AtomicBool) {
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        let parsed = match req.parse(&buf) {
            Ok(p) => p,
            Err(_) => return,
        };
        if let httparse::Status::Complete(len) = parsed {
            let header = |name: &str| {
                req.headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case(name))
                    .and_then(|h| std::str::from_utf8(h.value).ok())
            };
            let length: usize = header("content-length").map_or(0, |v| v.parse().unwrap());
            if buf.len() >= len + length {
                let body = String::from_utf8_lossy(&buf[len..len + length]).into_owned();
                let arrival = Arrival {
                    at: Instant::now(),
                    webhook: header("x-webhook").map_or(usize::MAX, |v| v.parse().unwrap()),
                    key: header("idempotency-key").map(str::to_owned),
                };
                arrivals.lock().unwrap().push(arrival);
                buf.drain(..len + length);
                let status = if body.contains("poison") && !cured.load(Ordering::Relaxed) {
                    "500 Internal Server Error"
                } else {
                    "200 OK"
                };
                let answer = format!("HTTP/1.1 {status}\r\ncontent-length: 2\r\n\r\nok");
                if conn.write_all(answer.as_bytes()).is_err() {
                    return;
                }
                continue;
            }
        }
        let mut chunk = [0u8; 16 * 1024];
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Polls `cond` every 100 ms until it holds, within `limit`.
pub fn eventually(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The most arrivals in any window of `window` (windows starting at each arrival).
pub fn most_in_window(arrivals: &[Arrival], window: Duration) -> usize {
    let mut at: Vec<Instant> = arrivals.iter().map(|a| a.at).collect();
    at.sort_unstable();
    let mut most = 0;
    let mut end = 0;
    for start in 0..at.len() {
        while end < at.len() && at[end] < at[start] + window {
            end += 1;
        }
        most = most.max(end - start);
    }
    most
}
