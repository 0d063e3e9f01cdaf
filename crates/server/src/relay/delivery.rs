//! A queued request delivered to the upstream by the relay: the head the relay wrote when the
//! request was queued, then the framing the relay writes now (`content-length`) and the
//! `idempotency-key`, then the body. The response is read to its end by its framing (so the
//! connection can go back to the pool) and only its status is kept.
//!
//! One call is one attempt, counted once by the drainer: the request goes out whole at most
//! once. A pooled connection is checked first to be still open, as the proxy checks one for a
//! request that cannot be sent twice; once the request may have reached the upstream, a
//! failure ends the attempt (the drainer tries again later, in a slot of its own).

use std::io;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use hyper::http::uri::Authority;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tollgate_http::RateLimitHeaders;

use super::body::{BodyCopy, Encoding, Trailers};
use super::conn::READ_CHUNK;
use super::head::Version;
use super::pool::{self, Pool};
use super::response::{ForClient, response_head};
use crate::queue::{Deliver, Delivered};

/// Why an exchange ended without a status.
struct Failure {
    reason: &'static str,
    /// Not one byte of the request went out (the first write failed): the upstream cannot
    /// have read any of it, so a new connection may carry it within the same attempt.
    unsent: bool,
}

/// The relay's HTTP/1.1 client for queued requests: [`deliver`] over its own connection pool.
#[derive(Debug, Default)]
pub(crate) struct Upstream {
    pool: Pool,
}

impl Deliver for Upstream {
    fn deliver<'a>(
        &'a self,
        authority: &'a Authority,
        request: (&'a [u8], &'a [u8]),
        id: &'a str,
        timeout: Duration,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Delivered> + Send + 'a>> {
        Box::pin(deliver(&self.pool, authority, request, id, timeout))
    }
}

/// Delivers `head` (a stored head: request line and header lines, without the final empty
/// line) and `body` to `authority` with `id` as its idempotency key, within `timeout`.
pub(crate) async fn deliver(
    pool: &Pool,
    authority: &Authority,
    (head, body): (&[u8], &[u8]),
    id: &str,
    timeout: Duration,
) -> Delivered {
    let mut request = Vec::with_capacity(head.len() + body.len() + 96);
    request.extend_from_slice(head);
    request.extend_from_slice(b"content-length: ");
    tollgate::headers::write_decimal(&mut request, u64::try_from(body.len()).unwrap_or(u64::MAX));
    request.extend_from_slice(b"\r\nidempotency-key: ");
    request.extend_from_slice(id.as_bytes());
    request.extend_from_slice(b"\r\n\r\n");
    request.extend_from_slice(body);
    let is_head = head.starts_with(b"HEAD ");
    let deadline = Instant::now() + timeout;
    let mut fresh = false;
    loop {
        let pooled = if fresh {
            None
        } else {
            pool.checkout(authority)
        };
        let reused = pooled.is_some();
        let mut conn = match pooled {
            // A pooled connection is checked first to be still open (an upstream may have
            // closed it on its idle timeout), as the proxy checks one for a request that
            // cannot be sent twice: one that is not goes before anything was sent on it, and
            // the next one (or a new one) is tried.
            Some(c) => {
                let mut probe = [0u8; 1];
                match c.try_read(&mut probe) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => c,
                    _ => continue,
                }
            }
            None => match tokio::time::timeout_at(deadline, pool::connect(authority)).await {
                Ok(Ok(c)) => c,
                Ok(Err(_)) => return Delivered::Failed("connection refused or failed"),
                Err(_) => return Delivered::Failed("timed out"),
            },
        };
        match exchange(&mut conn, &request, is_head, deadline).await {
            Ok((status, reusable)) => {
                if reusable {
                    pool.checkin(authority, conn);
                }
                return Delivered::Answered(status);
            }
            // Not a byte went out on a reused connection (closed by the upstream, though the
            // check did not see it yet): once more on a new one.
            Err(f) if reused && f.unsent => fresh = true,
            // Once the request went out, a connection that closes without an answer cannot
            // tell an upstream that closed it idle from one that read the request and then
            // failed: the attempt ends here, so the upstream reads it at most once per attempt.
            Err(f) => return Delivered::Failed(f.reason),
        }
    }
}

/// One request up, its response head and body down; the status and whether the connection
/// may carry another request.
async fn exchange(
    conn: &mut TcpStream,
    request: &[u8],
    is_head: bool,
    deadline: Instant,
) -> Result<(u16, bool), Failure> {
    let fail = |reason, unsent| Failure { reason, unsent };
    let mut written = 0;
    let write = async {
        while written < request.len() {
            match conn.write(&request[written..]).await {
                Ok(n) if n > 0 => written += n,
                _ => return false,
            }
        }
        true
    };
    match tokio::time::timeout_at(deadline, write).await {
        Ok(true) => {}
        Ok(false) => return Err(fail("the connection broke", written == 0)),
        // Past the deadline: no time for another connection.
        Err(_) => return Err(fail("timed out", false)),
    }
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut out = Vec::new();
    let client = ForClient {
        version: Version::Http11,
        is_head,
        close: false,
    };
    let head = loop {
        match response_head(&buf, &mut out, &RateLimitHeaders::default(), client) {
            Err(_) => return Err(fail("the upstream's answer is not HTTP/1.1", false)),
            Ok(Some(head)) => {
                buf.advance(head.len);
                if head.interim {
                    continue;
                }
                break head;
            }
            Ok(None) => {}
        }
        buf.reserve(READ_CHUNK);
        match tokio::time::timeout_at(deadline, conn.read_buf(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return Err(fail("the connection broke", false)),
            Ok(Ok(_)) => {}
            Err(_) => return Err(fail("timed out", false)),
        }
    };
    // The head as the relay wrote it again starts with `HTTP/1.1 NNN`.
    let status = out
        .get(9..12)
        .and_then(|d| std::str::from_utf8(d).ok())
        .and_then(|d| d.parse::<u16>().ok())
        .ok_or_else(|| fail("the upstream's answer is not HTTP/1.1", false))?;
    // The body, read to its end and dropped. Once the status is here the delivery is done;
    // a body that breaks off only costs the connection.
    let mut body = BodyCopy::new(head.framing, Encoding::Identity, Trailers::Drop);
    let mut sink = Vec::new();
    loop {
        let Ok(take) = body.copy(&buf, &mut sink) else {
            return Ok((status, false));
        };
        buf.advance(take);
        sink.clear();
        if body.done() {
            return Ok((status, !head.upstream_close && buf.is_empty()));
        }
        buf.reserve(READ_CHUNK);
        match tokio::time::timeout_at(deadline, conn.read_buf(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return Ok((status, false)),
        }
    }
}
