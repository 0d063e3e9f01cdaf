//! What the socket tests share: a door served on a free loopback port from a runtime of its
//! own (so tests may block, run clients as processes, and read with plain sockets), and raw
//! socket helpers.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tollgate::{Clock, Limiter, MemoryStore, Policy, Quota, Store, SystemClock};
use tollgate_resp::{Decide, Handler, Limits, Plain, Transport};

/// A door running until dropped.
pub struct Door {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Door {
    /// Stops accepting, drains, and waits for `serve` to return.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Door {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// The limiter of the tests' doors: `api`, 100 per minute (fixed window, so answers are
/// exact), and `tiny`, 2 per hour.
pub fn limiter() -> Limiter<MemoryStore, SystemClock> {
    Limiter::builder()
        .policy(
            Policy::new(
                "api",
                Quota::fixed_window(100, Duration::from_secs(60)).unwrap(),
            )
            .unwrap(),
        )
        .policy(
            Policy::new(
                "tiny",
                Quota::fixed_window(2, Duration::from_secs(3600)).unwrap(),
            )
            .unwrap(),
        )
        .build()
        .unwrap()
}

/// A door over [`limiter`] with `limits`.
pub fn start(limits: Limits) -> Door {
    start_with(Handler::for_limiter(limiter()), limits)
}

/// A door with `handler` and `limits`.
pub fn start_with<D: Decide, S: Store, C: Clock>(
    handler: Handler<D, S, C>,
    limits: Limits,
) -> Door {
    start_over(Plain, handler, limits)
}

/// A door with `handler` and `limits`, over `transport`.
pub fn start_over<T: Transport, D: Decide, S: Store, C: Clock>(
    transport: T,
    handler: Handler<D, S, C>,
    limits: Limits,
) -> Door {
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            tollgate_resp::serve_over(listener, transport, handler, limits, async {
                let _ = stop_rx.await;
            })
            .await
            .unwrap();
        });
    });
    let addr = addr_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    Door {
        addr,
        stop: Some(stop_tx),
        thread: Some(thread),
    }
}

/// A connection with a read timeout.
pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Reads exactly `n` bytes (or what came before EOF or the timeout).
pub fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut out = vec![0; n];
    let mut got = 0;
    while got < n {
        match s.read(&mut out[got..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => got += k,
        }
    }
    out.truncate(got);
    out
}

/// Reads until EOF; `None` if the connection stays open past `within`.
pub fn read_to_eof(s: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let deadline = Instant::now() + within;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        match s.read(&mut buf) {
            Ok(0) => return Some(out),
            Ok(k) => out.extend_from_slice(&buf[..k]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Some(out),
            Err(_) => return None,
        }
    }
}

/// Sends `request` and reads as many bytes as `expected` has, which they must equal.
pub fn exchange(s: &mut TcpStream, request: &[u8], expected: &[u8]) {
    s.write_all(request).unwrap();
    let got = read_n(s, expected.len());
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(expected),
        "after {:?}",
        String::from_utf8_lossy(request)
    );
}

/// A request as clients send it: an array of bulk strings.
pub fn frame(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// The length of the first complete reply in `buf`, if there is one (RESP2 and RESP3).
pub fn reply_len(buf: &[u8]) -> Option<usize> {
    let line_end = |from: usize| {
        buf.get(from..)?
            .windows(2)
            .position(|w| w == b"\r\n")
            .map(|p| from + p)
    };
    let end = line_end(0)?;
    let head = std::str::from_utf8(buf.get(1..end)?).ok()?;
    let next = end + 2;
    match buf.first()? {
        b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => Some(next),
        b'$' | b'!' | b'=' => {
            let n: i64 = head.parse().ok()?;
            if n < 0 {
                return Some(next);
            }
            let total = next + n as usize + 2;
            (buf.len() >= total).then_some(total)
        }
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let n: i64 = head.parse().ok()?;
            let items = match buf[0] {
                b'%' | b'|' => 2 * n.max(0),
                _ => n.max(0),
            };
            let mut at = next;
            for _ in 0..items {
                at += reply_len(&buf[at..])?;
            }
            Some(at)
        }
        _ => None,
    }
}
