//! Upstream connections: opened with a bounded wait, and pooled per thread between exchanges.
//!
//! A pooled connection is one whose last exchange was framed completely on both sides (the
//! whole request went up, the whole response came down by its framing) with not one byte left
//! unread. Anything else is closed: a response left on a pooled connection would be served to
//! the next client that takes it.

use std::io;
use std::sync::{Mutex, MutexGuard};
use std::task::Context;
use std::time::Duration;

use hyper::http::uri::Authority;
use tokio::net::{TcpSocket, TcpStream};

/// Idle upstream connections kept for reuse, per thread.
const MAX_IDLE: usize = 256;
/// How long connecting to the upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// One thread's idle keep-alive connections to the upstream: plain sockets, checked out for one
/// exchange and given back once it ended cleanly.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    idle: Mutex<Idle>,
}

#[derive(Debug, Default)]
struct Idle {
    /// The upstream the idle connections go to (the upstream may change on reload).
    authority: Option<Authority>,
    conns: Vec<TcpStream>,
}

impl Idle {
    /// Whether the idle connections go to `authority`: compared as the configured text, byte
    /// for byte (an `Authority`'s own comparison folds case, byte by byte, on every request).
    fn same_upstream(&self, authority: &Authority) -> bool {
        self.authority
            .as_ref()
            .is_some_and(|a| a.as_str() == authority.as_str())
    }
}

impl Pool {
    fn idle(&self) -> MutexGuard<'_, Idle> {
        match self.idle.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// An idle connection to `authority`, if there is one that is still quiet.
    pub(super) fn checkout(&self, authority: &Authority) -> Option<TcpStream> {
        let mut idle = self.idle();
        if !idle.same_upstream(authority) {
            idle.conns.clear();
            idle.authority = Some(authority.clone());
            return None;
        }
        // The most recently returned first: its buffers are warm and it is the least likely
        // to have been closed by the upstream's idle timeout. One that turned readable while
        // idle was closed by the upstream, or sent something no request asked for: it goes,
        // and the next is tried.
        while let Some(conn) = idle.conns.pop() {
            if !read_ready(&conn) {
                return Some(conn);
            }
        }
        None
    }

    /// Gives back a connection whose exchange ended cleanly, with nothing unread.
    ///
    /// Its readiness is left as the last read left it: the runtime forgets it only when a read
    /// drained the socket, so a connection read to a full buffer, which may hold more, stays
    /// readable and is dropped at checkout, and any byte that comes while it is idle makes it
    /// readable again.
    pub(super) fn checkin(&self, authority: &Authority, conn: TcpStream) {
        let mut idle = self.idle();
        if !idle.same_upstream(authority) {
            return;
        }
        // The longest idle is the likeliest to be closed by now: reaped as others come back,
        // so closed sockets do not sit in the pool until a burst reaches down to them.
        if idle.conns.first().is_some_and(read_ready) {
            idle.conns.remove(0);
        }
        if idle.conns.len() < MAX_IDLE {
            idle.conns.push(conn);
        }
    }
}

/// A TCP connection to `authority` (TCP_NODELAY, SO_KEEPALIVE), trying each of its addresses,
/// within [`CONNECT_TIMEOUT`].
pub(super) async fn connect(authority: &Authority) -> io::Result<TcpStream> {
    let host = authority.host();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let port = authority.port_u16().unwrap_or(80);
    tokio::time::timeout(CONNECT_TIMEOUT, async {
        let mut last: Option<io::Error> = None;
        for addr in tokio::net::lookup_host((host, port)).await? {
            let socket = if addr.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            let _ = socket.set_nodelay(true);
            let _ = socket.set_keepalive(true);
            match socket.connect(addr).await {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "no address for the upstream")
        }))
    })
    .await
    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "upstream connect timed out"))?
}

/// Whether the runtime has seen `s` turn readable (data, or the peer's close) since its
/// readiness was last cleared: an atomic load, no syscall. An idle upstream socket should never
/// be.
pub(super) fn read_ready(s: &TcpStream) -> bool {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    s.poll_read_ready(&mut cx).is_ready()
}
