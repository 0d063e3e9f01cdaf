//! The door through a [`Transport`] other than plain TCP, as the server runs it over TLS: one
//! that holds written bytes until flushed (a buffered stream, as TLS holds the records it could
//! not send yet), and one whose bytes a fresh connection cannot be told in plain text.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;

use common::*;
use tokio::io::BufStream;
use tokio::net::TcpStream;
use tollgate_resp::{Limits, Transport};

/// Writes reach the client only when the door flushes them (or 8 KiB have piled up).
struct Buffered;

impl Transport for Buffered {
    type Io = BufStream<TcpStream>;

    async fn open(&self, stream: TcpStream, _peer: SocketAddr) -> Option<Self::Io> {
        Some(BufStream::new(stream))
    }

    fn is_plain(&self) -> bool {
        false
    }
}

#[test]
fn replies_are_flushed_through_the_transport() {
    let door = start_over(
        Buffered,
        tollgate_resp::Handler::for_limiter(limiter()),
        Limits::default(),
    );
    let mut s = connect(door.addr);
    // One small reply, then a pipelined pair: each is far below the buffer's size, so only a
    // flush sends it.
    s.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
    assert_eq!(read_n(&mut s, 7), b"+PONG\r\n");
    s.write_all(b"PING\r\n*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n")
        .unwrap();
    assert_eq!(read_n(&mut s, 15), b"+PONG\r\n$2\r\nhi\r\n");
    // QUIT's reply comes before the close.
    s.write_all(b"QUIT\r\n").unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert_eq!(rest, b"+OK\r\n");
}

#[test]
fn past_the_bound_a_connection_that_is_not_plain_is_closed_unanswered() {
    let limits = Limits {
        max_connections: 1,
        ..Limits::default()
    };
    let door = start_over(
        Buffered,
        tollgate_resp::Handler::for_limiter(limiter()),
        limits,
    );
    let mut first = connect(door.addr);
    first.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_n(&mut first, 7), b"+PONG\r\n");
    let mut second = connect(door.addr);
    let mut got = Vec::new();
    let _ = second.read_to_end(&mut got);
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    // The first is still served.
    first.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_n(&mut first, 7), b"+PONG\r\n");
}
