//! Clients that never read what the proxy answers, for the write-deadline tests: a flood of
//! pipelined requests, and a response sized to fill, to the byte, every buffer between the
//! proxy and such a client, so that the next answer's own write must wait.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpSocket;

use super::common::raw::{Client, T, Up, find, target, upstream};

/// Pipelines refused requests at the proxy without ever reading, from a socket with a small
/// receive buffer, until the proxy gives up on it: the write then fails. `Err` if the proxy is
/// still taking requests after `T`.
pub async fn flood_without_reading(addr: SocketAddr, request: &'static [u8]) -> Result<(), String> {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let stream = socket.connect(addr).await.unwrap();
    let (_read, mut write) = stream.into_split();
    let batch = request.repeat(256);
    tokio::time::timeout(T * 3, async {
        loop {
            if write.write_all(&batch).await.is_err() {
                return;
            }
        }
    })
    .await
    .map_err(|_| "the proxy kept the connection of a client that never reads".to_owned())
}

/// An upstream answering `/fill/N` with N bytes; `dropped` counts the answers it could not
/// send whole (the proxy closed the connection).
pub async fn fill_upstream(dropped: tokio::sync::watch::Sender<usize>) -> Up {
    let dropped = std::sync::Arc::new(dropped);
    upstream(move |mut c| {
        let dropped = std::sync::Arc::clone(&dropped);
        async move {
            while let Some(head) = c.head().await {
                let n: usize = target(&head).trim_start_matches("/fill/").parse().unwrap();
                // One write: the proxy then reads it in whole chunks, and writes it on in the
                // same pieces every time.
                let mut answer =
                    format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n").into_bytes();
                answer.resize(answer.len() + n, b'x');
                if !c.send(answer).await {
                    dropped.send_modify(|d| *d += 1);
                    return;
                }
            }
        }
    })
    .await
}

/// A client with a 4 KiB receive buffer (which it never reads): what the proxy writes to it
/// piles up in the proxy's send buffer until a write waits.
pub async fn never_reading_client(addr: SocketAddr) -> tokio::net::TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(addr).await.unwrap()
}

/// How many bytes the proxy's writes to a client that never reads take before one waits, and
/// the length of the head they start with: a response larger than that is asked for, the proxy
/// gives up on it (the upstream sees its connection dropped), and all that got through is read.
pub async fn room_for_a_client_that_never_reads(
    addr: SocketAddr,
    mut dropped: tokio::sync::watch::Receiver<usize>,
) -> (usize, usize) {
    let mut c = never_reading_client(addr).await;
    c.write_all(b"GET /fill/50000000 HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    tokio::time::timeout(T, dropped.wait_for(|d| *d == 1))
        .await
        .expect("the proxy gives up on a client that never reads")
        .unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(T, tokio::io::AsyncReadExt::read_to_end(&mut c, &mut got))
        .await
        .unwrap()
        .unwrap();
    let head = find(&got, b"\r\n\r\n").unwrap() + 4;
    (got.len(), head)
}

/// The body size for a response of `total` bytes, given the `head` of the one that measured
/// the room (whose length said 50000000).
pub fn fill_size(total: usize, head: usize) -> usize {
    let bare = head - "50000000".len();
    (1..20)
        .map(|digits| (digits, total - bare - digits))
        .find(|(digits, n)| n.to_string().len() == *digits)
        .map(|(_, n)| n)
        .unwrap()
}

/// The refusal `bytes` draw on a connection of their own: its bytes, and how many.
pub async fn answer_size(addr: SocketAddr, bytes: &[u8]) -> (Vec<u8>, usize) {
    let mut c = Client::connect(addr).await;
    c.send(bytes).await;
    let all = c.rest().await.into_bytes();
    let n = all.len();
    (all, n)
}

/// Writes a byte at a time, without reading, until the proxy has closed the connection (a write
/// then fails); `Err` if it is still open after `T`.
pub async fn closed_by_the_proxy(
    mut write: tokio::net::tcp::OwnedWriteHalf,
) -> Result<(), &'static str> {
    tokio::time::timeout(T, async {
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(50));
        loop {
            tick.tick().await;
            if write.write_all(b"x").await.is_err() {
                return;
            }
        }
    })
    .await
    .map_err(|_| "the proxy kept the connection of a client that never reads")
}
