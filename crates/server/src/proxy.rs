//! The reverse proxy on `[proxy] listen`: checks every request, holds `delay` ones, answers 429
//! per SPEC §5, and otherwise streams the request to the upstream over pooled connections,
//! keeping `Host`, appending `X-Forwarded-For`, and adding the rate-limit headers to the answer.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body as _, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HOST, HeaderName, HeaderValue};
use hyper::http::uri::{Authority, PathAndQuery};
use hyper::{HeaderMap, Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpSocket, TcpStream};

use tollgate_http::RequestInfo;

use crate::Shared;
use crate::engine::Verdict;
use crate::response::{Body, full, problem};

/// Idle upstream connections kept for reuse.
const MAX_IDLE: usize = 256;
/// How long connecting to the upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The pool of keep-alive HTTP/1.1 connections to the upstream. A request takes an idle
/// connection (or opens one), and its response body puts the connection back once the client
/// has read it to the end: no task per request, no per-request pool key.
#[derive(Clone, Debug, Default)]
pub(crate) struct UpstreamClient {
    pool: Arc<Mutex<Idle>>,
}

#[derive(Debug, Default)]
struct Idle {
    /// The upstream the idle connections go to (the upstream may change on reload).
    authority: Option<Authority>,
    conns: Vec<SendRequest<Incoming>>,
}

pub(crate) fn client() -> UpstreamClient {
    UpstreamClient::default()
}

impl UpstreamClient {
    fn idle(&self) -> MutexGuard<'_, Idle> {
        match self.pool.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn checkout(&self, authority: &Authority) -> Option<SendRequest<Incoming>> {
        let mut idle = self.idle();
        if idle.authority.as_ref() != Some(authority) {
            idle.conns.clear();
            idle.authority = Some(authority.clone());
            return None;
        }
        // The most recently returned first; one still finishing an earlier exchange (an
        // upstream that answered before reading the whole request body) waits its turn.
        let mut i = idle.conns.len();
        while i > 0 {
            i -= 1;
            if idle.conns[i].is_closed() {
                idle.conns.swap_remove(i);
            } else if idle.conns[i].is_ready() {
                return Some(idle.conns.swap_remove(i));
            }
        }
        None
    }

    fn checkin(&self, authority: &Authority, conn: SendRequest<Incoming>) {
        if conn.is_closed() {
            return;
        }
        let mut idle = self.idle();
        if idle.authority.as_ref() == Some(authority) && idle.conns.len() < MAX_IDLE {
            idle.conns.push(conn);
        }
    }

    /// Sends `req` (origin-form) to `authority`, on an idle connection when there is one. A
    /// request that a reused connection could not even start is retried on another.
    /// `gap`: the longest wait for a piece of the response body.
    async fn send(
        &self,
        authority: &Authority,
        mut req: Request<Incoming>,
        gap: Duration,
    ) -> Result<Response<PooledBody>, BoxError> {
        loop {
            let (mut conn, reused) = match self.checkout(authority) {
                Some(c) => (c, true),
                None => (connect(authority).await?, false),
            };
            if let Err(e) = conn.ready().await {
                if reused {
                    continue;
                }
                return Err(e.into());
            }
            match conn.try_send_request(req).await {
                Ok(res) => {
                    let client = self.clone();
                    let authority = authority.clone();
                    return Ok(res.map(|inner| PooledBody {
                        inner,
                        done: false,
                        conn: Some((conn, client, authority)),
                        gap,
                        idle: None,
                    }));
                }
                Err(mut e) => match e.take_message() {
                    Some(r) if reused => req = r,
                    _ => return Err(e.into_error().into()),
                },
            }
        }
    }
}

/// Opens a connection to `authority` (TCP_NODELAY, SO_KEEPALIVE) and drives it on its own task.
async fn connect(authority: &Authority) -> Result<SendRequest<Incoming>, BoxError> {
    let stream = connect_tcp(authority).await?;
    let (conn, driver) = hyper::client::conn::http1::Builder::new()
        .handshake(TokioIo::new(stream))
        .await?;
    tokio::spawn(async move {
        if let Err(e) = driver.await {
            tracing::debug!(error = %e, "upstream connection ended");
        }
    });
    Ok(conn)
}

/// A TCP connection to `authority` (TCP_NODELAY, SO_KEEPALIVE), trying each of its addresses,
/// within [`CONNECT_TIMEOUT`].
pub(crate) async fn connect_tcp(authority: &Authority) -> std::io::Result<TcpStream> {
    let host = authority.host();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let port = authority.port_u16().unwrap_or(80);
    tokio::time::timeout(CONNECT_TIMEOUT, async {
        let mut last: Option<std::io::Error> = None;
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
            std::io::Error::new(std::io::ErrorKind::NotFound, "no address for the upstream")
        }))
    })
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "upstream connect timed out"))?
}

/// An upstream response body that gives its connection back to the pool once read to the end
/// (dropped before that, the connection closes with it).
struct PooledBody {
    inner: Incoming,
    done: bool,
    conn: Option<(SendRequest<Incoming>, UpstreamClient, Authority)>,
    /// No frame for this long ends the body in an error (nginx's `proxy_read_timeout`): an
    /// upstream that stalls mid-body does not hold the client connection for ever.
    gap: Duration,
    /// Armed while a frame is awaited; boxed, as hyper moves bodies around.
    idle: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// An upstream that sent nothing for the proxy `timeout` in the middle of a body.
#[derive(Debug)]
struct StalledUpstream;

impl std::fmt::Display for StalledUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the upstream stalled mid-body")
    }
}

impl std::error::Error for StalledUpstream {}

impl hyper::body::Body for PooledBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(r) => {
                self.idle = None;
                if r.is_none() {
                    self.done = true;
                }
                Poll::Ready(r.map(|f| f.map_err(BoxError::from)))
            }
            Poll::Pending => {
                let gap = self.gap;
                let idle = self
                    .idle
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(gap)));
                match idle.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(StalledUpstream)))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        if (self.done || self.inner.is_end_stream())
            && let Some((conn, client, authority)) = self.conn.take()
        {
            client.checkin(&authority, conn);
        }
    }
}

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 8] = [
    hyper::header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    hyper::header::PROXY_AUTHENTICATE,
    hyper::header::PROXY_AUTHORIZATION,
    hyper::header::TE,
    hyper::header::TRAILER,
    hyper::header::UPGRADE,
];

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the (few) headers; the map is only changed when one is there.
    if !headers.keys().any(|k| HOP_BY_HOP.contains(k)) {
        return;
    }
    let listed: Vec<HeaderName> = headers
        .get_all(hyper::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Every earlier hop, in order, then `ip`, as one header value: the relay writes the same
/// (`X-Forwarded-For` may arrive on several lines).
fn forwarded_for<'a>(
    prev: impl Iterator<Item = &'a HeaderValue>,
    ip: std::net::IpAddr,
) -> Option<HeaderValue> {
    use std::io::Write;
    let mut buf: Vec<u8> = Vec::with_capacity(64);
    for p in prev {
        let p = p.as_bytes().trim_ascii();
        if !p.is_empty() {
            buf.extend_from_slice(p);
            buf.extend_from_slice(b", ");
        }
    }
    write!(buf, "{ip}").ok()?;
    HeaderValue::from_maybe_shared(Bytes::from(buf)).ok()
}

pub(crate) async fn handle(
    shared: Arc<Shared>,
    peer: SocketAddr,
    mut req: Request<Incoming>,
) -> Response<Body> {
    let engine = shared.engine();
    let Some(proxy) = engine.config().proxy.as_ref() else {
        return problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "Proxy disabled",
            Some("the running configuration has no [proxy] section"),
        );
    };
    let (rate_limit, verdict) = {
        let info = RequestInfo::from_request(&req, Some(peer.ip()));
        let (_, rate_limit, verdict, _) = engine.evaluate_parts(&info).await;
        (rate_limit, verdict)
    };
    match verdict {
        Verdict::Respond(a) => return a.into_response().map(full),
        // If the client goes away while held, the hold is dropped and its slot given back.
        Verdict::Hold(hold) => hold.wait().await,
        Verdict::Pass => {}
    }

    let Some(authority) = proxy.upstream.authority() else {
        return problem(StatusCode::BAD_GATEWAY, "Upstream unavailable", None);
    };
    // Origin-form to the upstream: a client's origin-form target is kept as it is.
    if req.uri().scheme().is_some() || req.uri().authority().is_some() {
        let pq = req
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        *req.uri_mut() = Uri::from(pq);
    } else if req.uri().path_and_query().is_none() {
        *req.uri_mut() = Uri::from_static("/");
    }
    // Keep the client's Host; an HTTP/1.0 request without one gets the upstream's.
    if !req.headers().contains_key(HOST)
        && let Ok(v) = HeaderValue::from_str(authority.as_str())
    {
        req.headers_mut().insert(HOST, v);
    }
    *req.version_mut() = Version::HTTP_11;
    let headers = req.headers_mut();
    strip_hop_by_hop(headers);
    let prev = headers
        .get_all(&X_FORWARDED_FOR)
        .iter()
        .filter(|v| v.to_str().is_ok());
    if let Some(v) = forwarded_for(prev, peer.ip()) {
        headers.insert(X_FORWARDED_FOR, v);
    }

    match tokio::time::timeout(
        proxy.timeout,
        shared.client.send(authority, req, proxy.timeout),
    )
    .await
    {
        Err(_) => {
            shared.metrics.upstream_error();
            problem(
                StatusCode::GATEWAY_TIMEOUT,
                "Upstream timed out",
                Some("the upstream did not answer in time"),
            )
        }
        Ok(Err(e)) => {
            shared.metrics.upstream_error();
            tracing::warn!(error = %e, "upstream request failed");
            problem(
                StatusCode::BAD_GATEWAY,
                "Upstream unavailable",
                Some("the upstream could not be reached or failed mid-answer"),
            )
        }
        Ok(Ok(res)) => {
            let mut res = res.map(|b| b.boxed());
            let headers = res.headers_mut();
            strip_hop_by_hop(headers);
            rate_limit.apply(headers);
            res
        }
    }
}
