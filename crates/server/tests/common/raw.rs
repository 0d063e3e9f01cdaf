//! A raw-socket HTTP/1.1 harness for the proxy's adversarial tests: a client that writes exactly
//! the bytes a test wants and reads responses by their framing, and raw upstreams that record
//! every request head they get and answer with exactly the bytes a test wants.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::{Running, start_text};

/// The longest any single wait may take: only there to turn a hang into a failure.
pub const T: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Reading HTTP/1.1 off a socket, for both sides.

/// A read half with what was read from it and not yet consumed.
pub struct Wire {
    pub r: OwnedReadHalf,
    pub buf: Vec<u8>,
    pub eof: bool,
    /// Each read fails the test past this (the client side); none upstream.
    pub limit: Option<Duration>,
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

pub fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

impl Wire {
    pub fn new(r: OwnedReadHalf, limit: Option<Duration>) -> Self {
        Wire {
            r,
            buf: Vec::new(),
            eof: false,
            limit,
        }
    }

    /// Reads more; `false` at the end of the stream (a close or a reset).
    pub async fn fill(&mut self) -> bool {
        if self.eof {
            return false;
        }
        let mut b = vec![0u8; 64 * 1024];
        let read = match self.limit {
            Some(l) => tokio::time::timeout(l, self.r.read(&mut b))
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "nothing more within {l:?}; unconsumed so far: {:?}",
                        lossy(&self.buf)
                    )
                }),
            None => self.r.read(&mut b).await,
        };
        match read {
            Ok(0) | Err(_) => {
                self.eof = true;
                false
            }
            Ok(n) => {
                self.buf.extend_from_slice(&b[..n]);
                true
            }
        }
    }

    /// Up to and including `delim`.
    pub async fn until(&mut self, delim: &[u8]) -> Result<Vec<u8>, String> {
        loop {
            if let Some(i) = find(&self.buf, delim) {
                return Ok(self.buf.drain(..i + delim.len()).collect());
            }
            if !self.fill().await {
                return Err(format!("closed; unconsumed: {:?}", lossy(&self.buf)));
            }
        }
    }

    /// One line, without its CRLF.
    pub async fn line(&mut self) -> Result<Vec<u8>, String> {
        let mut l = self.until(b"\r\n").await?;
        l.truncate(l.len() - 2);
        Ok(l)
    }

    pub async fn take(&mut self, n: usize) -> Result<Vec<u8>, String> {
        while self.buf.len() < n {
            if !self.fill().await {
                return Err(format!(
                    "closed after {} of {n} bytes: {:?}",
                    self.buf.len(),
                    lossy(&self.buf)
                ));
            }
        }
        Ok(self.buf.drain(..n).collect())
    }

    /// A chunked body: (decoded data, trailer section lower-cased, the raw bytes).
    pub async fn chunked(&mut self) -> Result<(Vec<u8>, String, Vec<u8>), String> {
        let mut data = Vec::new();
        let mut raw = Vec::new();
        let mut trailers = String::new();
        loop {
            let line = self.line().await?;
            raw.extend_from_slice(&line);
            raw.extend_from_slice(b"\r\n");
            let text = lossy(&line);
            let size = text.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size, 16)
                .map_err(|_| format!("bad chunk size line {text:?}"))?;
            if size == 0 {
                loop {
                    let t = self.line().await?;
                    raw.extend_from_slice(&t);
                    raw.extend_from_slice(b"\r\n");
                    if t.is_empty() {
                        return Ok((data, trailers, raw));
                    }
                    trailers.push_str(&lossy(&t).to_ascii_lowercase());
                    trailers.push('\n');
                }
            }
            let chunk = self.take(size + 2).await?;
            if !chunk.ends_with(b"\r\n") {
                return Err(format!("chunk not followed by CRLF: {:?}", lossy(&chunk)));
            }
            raw.extend_from_slice(&chunk);
            data.extend_from_slice(&chunk[..size]);
        }
    }

    /// Everything until the peer closes.
    pub async fn drain_all(&mut self) -> Vec<u8> {
        while self.fill().await {}
        std::mem::take(&mut self.buf)
    }
}

/// The values of header `name` in `head` (a whole head, any case), trimmed.
pub fn header_values<'a>(head: &'a str, name: &str) -> Vec<&'a str> {
    head.split("\r\n")
        .skip(1)
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim())
        })
        .collect()
}

/// The request target of a request head.
pub fn target(head: &str) -> &str {
    head.split(' ').nth(1).unwrap_or("")
}

// ---------------------------------------------------------------------------------------------
// The client side.

pub struct Client {
    pub wire: Wire,
    pub w: Option<OwnedWriteHalf>,
}

/// One response as the client read it.
pub struct Resp {
    pub status: u16,
    /// The head, lower-cased.
    pub head: String,
    pub body: Vec<u8>,
    /// A chunked body's trailer section, lower-cased.
    pub trailers: String,
    /// The 1xx statuses that came before it.
    pub interim: Vec<u16>,
}

impl std::fmt::Debug for Resp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} interim {:?}, body {:?}, trailers {:?}",
            self.head,
            self.interim,
            self.body(),
            self.trailers
        )
    }
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        header_values(&self.head, name).first().copied()
    }
    pub fn body(&self) -> String {
        lossy(&self.body)
    }
}

impl Client {
    pub async fn connect(addr: SocketAddr) -> Self {
        let s = TcpStream::connect(addr).await.unwrap();
        let (r, w) = s.into_split();
        Client {
            wire: Wire::new(r, Some(T)),
            w: Some(w),
        }
    }

    pub async fn send(&mut self, bytes: impl AsRef<[u8]>) {
        self.w
            .as_mut()
            .unwrap()
            .write_all(bytes.as_ref())
            .await
            .unwrap();
    }

    /// The next final response (1xx ones before it collected), read by its framing;
    /// `Err` when the proxy closes before it is whole.
    pub async fn try_response(&mut self, is_head: bool) -> Result<Resp, String> {
        let mut interim = Vec::new();
        loop {
            let head = lossy(&self.wire.until(b"\r\n\r\n").await?).to_ascii_lowercase();
            assert!(
                head.starts_with("http/1.1 ") || head.starts_with("http/1.0 "),
                "not a status line: {head:?}"
            );
            let status: u16 = head
                .get(9..12)
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("no status: {head:?}"));
            if (100..200).contains(&status) {
                interim.push(status);
                continue;
            }
            let mut resp = Resp {
                status,
                head,
                body: Vec::new(),
                trailers: String::new(),
                interim,
            };
            if is_head || status == 204 || status == 304 {
                return Ok(resp);
            }
            let te = header_values(&resp.head, "transfer-encoding").join(",");
            let length = resp.header("content-length").map(str::to_owned);
            if !te.is_empty() {
                if te.rsplit(',').next().unwrap_or("").trim() == "chunked" {
                    let (data, trailers, _) = self
                        .wire
                        .chunked()
                        .await
                        .map_err(|e| format!("{}{e}", resp.head))?;
                    resp.body = data;
                    resp.trailers = trailers;
                } else {
                    resp.body = self.wire.drain_all().await;
                }
            } else if let Some(n) = length {
                let n: usize = n.parse().unwrap_or_else(|_| panic!("{}", resp.head));
                resp.body = self
                    .wire
                    .take(n)
                    .await
                    .map_err(|e| format!("{}{e}", resp.head))?;
            } else {
                resp.body = self.wire.drain_all().await;
            }
            return Ok(resp);
        }
    }

    pub async fn response(&mut self) -> Resp {
        self.try_response(false)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Sends a keep-alive GET for `path` and reads its answer.
    pub async fn get(&mut self, path: &str) -> Resp {
        self.send(format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n"))
            .await;
        self.response().await
    }

    /// What arrives within `d`, and whether the proxy closed the connection by then.
    pub async fn rest_within(&mut self, d: Duration) -> (String, bool) {
        let limit = self.wire.limit.take();
        let closed = tokio::time::timeout(d, async { while self.wire.fill().await {} })
            .await
            .is_ok();
        self.wire.limit = limit;
        (lossy(&std::mem::take(&mut self.wire.buf)), closed)
    }

    /// What is left until the proxy closes the connection (fails the test if it stays open).
    pub async fn rest(&mut self) -> String {
        lossy(&self.wire.drain_all().await)
    }
}

// ---------------------------------------------------------------------------------------------
// Raw upstreams.

/// A raw upstream: every connection is handed to one handler.
pub struct Up {
    pub addr: SocketAddr,
    /// Every request head received, with the index of the connection it came on.
    pub seen: Arc<watch::Sender<Vec<(usize, String)>>>,
}

impl Up {
    pub fn heads(&self) -> Vec<(usize, String)> {
        self.seen.borrow().clone()
    }

    /// Waits until `n` request heads have arrived.
    pub async fn wait_heads(&self, n: usize) {
        let mut rx = self.seen.subscribe();
        tokio::time::timeout(T, rx.wait_for(|v| v.len() >= n))
            .await
            .expect("the upstream got the request")
            .unwrap();
    }
}

/// One upstream connection, as its handler sees it.
pub struct UpConn {
    pub wire: Wire,
    pub w: OwnedWriteHalf,
    /// Which connection this is (0 for the first accepted).
    pub n: usize,
    pub seen: Arc<watch::Sender<Vec<(usize, String)>>>,
}

impl UpConn {
    /// The next request head (recorded); `None` when the proxy closed.
    pub async fn head(&mut self) -> Option<String> {
        let head = lossy(&self.wire.until(b"\r\n\r\n").await.ok()?);
        let n = self.n;
        self.seen.send_modify(|v| v.push((n, head.clone())));
        Some(head)
    }

    /// The request body by the head's framing: (decoded, trailers, raw).
    pub async fn body(&mut self, head: &str) -> Option<(Vec<u8>, String, Vec<u8>)> {
        let te = header_values(head, "transfer-encoding").join(",");
        if te.to_ascii_lowercase().contains("chunked") {
            return self.wire.chunked().await.ok();
        }
        let n = header_values(head, "content-length")
            .first()
            .map_or(0, |v| v.parse::<usize>().unwrap());
        let data = self.wire.take(n).await.ok()?;
        Some((data.clone(), String::new(), data))
    }

    pub async fn send(&mut self, bytes: impl AsRef<[u8]>) -> bool {
        self.w.write_all(bytes.as_ref()).await.is_ok()
    }

    /// Keeps the connection open, reading nothing more, until the test ends.
    pub async fn hold(self) {
        std::future::pending::<()>().await;
        drop(self);
    }
}

pub async fn upstream<F, Fut>(handler: F) -> Up
where
    F: Fn(UpConn) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(watch::Sender::new(Vec::new()));
    let up = Up {
        addr,
        seen: Arc::clone(&seen),
    };
    let count = AtomicUsize::new(0);
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let _ = s.set_nodelay(true);
            let (r, w) = s.into_split();
            let conn = UpConn {
                wire: Wire::new(r, None),
                w,
                n: count.fetch_add(1, Ordering::SeqCst),
                seen: Arc::clone(&seen),
            };
            tokio::spawn(handler(conn));
        }
    });
    up
}

/// A 200 with `body` by Content-Length.
pub fn ok(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Answers every request (its body read first) with `answer(connection, head, body)` until
/// the proxy closes.
pub async fn serve(mut c: UpConn, answer: impl Fn(usize, &str, &[u8]) -> Vec<u8>) {
    while let Some(head) = c.head().await {
        let Some((body, _, _)) = c.body(&head).await else {
            return;
        };
        let reply = answer(c.n, &head, &body);
        if !c.send(reply).await {
            return;
        }
    }
}

/// A keep-alive upstream answering `{target}:{body}`.
pub async fn echo_upstream() -> Up {
    upstream(|c| {
        serve(c, |_, head, body| {
            ok(&format!("{}:{}", target(head), lossy(body)))
        })
    })
    .await
}

/// The proxy in front of `up`, with one policy every request matches (so every relayed
/// answer carries rate-limit headers).
pub async fn proxy(up: &Up, timeout: &str) -> (Running, SocketAddr) {
    let text = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{}\"\ntimeout = \"{timeout}\"\n\n\
         [[policy]]\nname = \"all\"\nalgorithm = \"fixed_window\"\nlimit = 1000000\nwindow = \"1h\"\nkey = [\"ip\"]\n",
        up.addr
    );
    let s = start_text(&text).await;
    let addr = s.proxy.unwrap();
    (s, addr)
}
