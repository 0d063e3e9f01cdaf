//! `/v1/forward-auth`: the decision for a request that a proxy (Traefik ForwardAuth, Caddy
//! `forward_auth`, nginx `auth_request`) describes in `X-Forwarded-*` headers.
//!
//! The caller is the proxy. What it describes must be complete and unambiguous: a missing,
//! repeated or unreadable identity header is refused with a 400 naming it, never guessed (a
//! guess such as `GET /` from the proxy's own address would count every client as one and
//! match the wrong policies). The client's address comes from `X-Forwarded-For` only when the
//! caller is in `[forward_auth] trusted_proxies`.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use tollgate_http::{RequestInfo, TrustedProxies};

use crate::generation::{Disposition, Generation};
use crate::response::{Body, full, problem};

/// How a denial is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flavor {
    /// `/v1/forward-auth`: 429 with `Retry-After`, the rate-limit headers and the
    /// problem+json body, which Traefik and Caddy pass to the client as they are.
    Standard,
    /// `/v1/forward-auth/nginx`: nginx's `auth_request` understands only 2xx, 401 and 403 (any
    /// other status becomes a 500 for the client, and its headers are lost), so a denial is a
    /// 403 with the same headers, and the problem+json body also in [`PROBLEM_HEADER`] for the
    /// recipe to send back with a 429 (nginx discards the body of an auth subrequest).
    Nginx,
}

/// The response header that carries the problem+json body of a denial to nginx.
pub(crate) const PROBLEM_HEADER: HeaderName = HeaderName::from_static("tollgate-problem");

const X_FORWARDED_METHOD: &str = "x-forwarded-method";
const X_FORWARDED_URI: &str = "x-forwarded-uri";
const X_ORIGINAL_URI: &str = "x-original-uri";
const X_FORWARDED_HOST: &str = "x-forwarded-host";
const X_FORWARDED_FOR: &str = "x-forwarded-for";

/// How far the `X-Forwarded-For` walk goes: a longer chain of trusted proxies is not a real
/// deployment.
const MAX_HOPS: usize = 32;

/// Why a forward-auth request (or a request described to `/v1/check`) is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum Refusal {
    #[error(
        "{0} is missing: the proxy must send X-Forwarded-Method, X-Forwarded-Uri, X-Forwarded-Host \
         and X-Forwarded-For (see docs/forward-auth.md)"
    )]
    Missing(&'static str),
    #[error(
        "{0} appears more than once: a request with two values of a field that identifies it is \
         refused, since the limiter and the upstream could read different ones"
    )]
    Repeated(&'static str),
    #[error("send the request target in X-Forwarded-Uri or in X-Original-URI, not both")]
    TwoTargets,
    #[error("{0} {1}")]
    Unreadable(&'static str, &'static str),
}

const NOT_ORIGIN_FORM: &str = "must be a path starting with '/', in printable ASCII (percent-encode \
     other bytes), as in the request line";
const NOT_HOST: &str = "must be a host name or address with an optional port, in ASCII";
const NOT_METHOD: &str = "is not an HTTP method";
const NOT_ADDRESS: &str = "must end with the client's address, as the proxy appends it";

/// Answers a forward-auth request from `peer`.
pub(crate) async fn handle(
    engine: &Generation,
    peer: SocketAddr,
    req: Request<Incoming>,
    flavor: Flavor,
) -> Response<Body> {
    let headers = req.headers();
    let described = match Described::read(
        headers,
        peer.ip(),
        &engine.config().forward_auth.trusted_proxies,
    ) {
        Ok(d) => d,
        Err(refusal) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "Bad request",
                Some(&refusal.to_string()),
            );
        }
    };
    let info = RequestInfo::new(&described.method, described.target, headers)
        .with_host(Some(described.host))
        .with_client_ip(Some(described.client));
    let eval = engine.evaluate(&info).await;
    match eval.verdict {
        Disposition::Respond(answer) => {
            let mut res = answer.into_response();
            if flavor == Flavor::Nginx && res.status() == StatusCode::TOO_MANY_REQUESTS {
                *res.status_mut() = StatusCode::FORBIDDEN;
                // A policy name outside printable ASCII cannot travel in a header; the recipe
                // then answers with an empty body, and every other header still arrives.
                if let Ok(v) = HeaderValue::from_maybe_shared(res.body().clone()) {
                    res.headers_mut().insert(PROBLEM_HEADER, v);
                }
            }
            res.map(full)
        }
        verdict => {
            if let Disposition::Hold(hold) = verdict {
                hold.wait().await;
            }
            let mut res = Response::new(full(Bytes::new()));
            *res.headers_mut() = eval.headers;
            res
        }
    }
}

/// The request a proxy describes.
#[derive(Debug, PartialEq, Eq)]
struct Described<'h> {
    method: Method,
    target: &'h str,
    host: &'h str,
    client: IpAddr,
}

impl<'h> Described<'h> {
    fn read(
        headers: &'h HeaderMap,
        peer: IpAddr,
        trusted: &TrustedProxies,
    ) -> Result<Self, Refusal> {
        let method = single(headers, X_FORWARDED_METHOD, "X-Forwarded-Method")?
            .ok_or(Refusal::Missing("X-Forwarded-Method"))?;
        // Method names are case-sensitive, but a lower-case one must not slip past a policy
        // that names the upper-case method.
        let method = method
            .to_str()
            .ok()
            .and_then(|m| Method::from_bytes(m.trim().to_ascii_uppercase().as_bytes()).ok())
            .ok_or(Refusal::Unreadable("X-Forwarded-Method", NOT_METHOD))?;
        let target = match (
            single(headers, X_FORWARDED_URI, "X-Forwarded-Uri")?,
            single(headers, X_ORIGINAL_URI, "X-Original-URI")?,
        ) {
            (Some(_), Some(_)) => return Err(Refusal::TwoTargets),
            (Some(v), None) => origin_form(v.as_bytes())
                .ok_or(Refusal::Unreadable("X-Forwarded-Uri", NOT_ORIGIN_FORM))?,
            (None, Some(v)) => origin_form(v.as_bytes())
                .ok_or(Refusal::Unreadable("X-Original-URI", NOT_ORIGIN_FORM))?,
            (None, None) => return Err(Refusal::Missing("X-Forwarded-Uri")),
        };
        let host = single(headers, X_FORWARDED_HOST, "X-Forwarded-Host")?
            .ok_or(Refusal::Missing("X-Forwarded-Host"))?;
        let host =
            authority(host.as_bytes()).ok_or(Refusal::Unreadable("X-Forwarded-Host", NOT_HOST))?;
        let client = client_address(peer, headers, trusted)?;
        Ok(Described {
            method,
            target,
            host,
            client,
        })
    }
}

/// The one value of header `name`; a second one is refused.
fn single<'h>(
    headers: &'h HeaderMap,
    name: &str,
    display: &'static str,
) -> Result<Option<&'h HeaderValue>, Refusal> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(Refusal::Repeated(display));
    }
    Ok(first)
}

/// A request target in origin form (`/path?query`), printable ASCII only: a byte the limiter
/// cannot read is refused, never matched as some other path.
pub(crate) fn origin_form(target: &[u8]) -> Option<&str> {
    if target.first() != Some(&b'/') || !target.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return None;
    }
    std::str::from_utf8(target).ok()
}

/// A `Host` value: a name or address and an optional port, nothing else.
pub(crate) fn authority(host: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(host).ok()?;
    let parsed = text.parse::<hyper::http::uri::Authority>().ok()?;
    (!text.is_empty() && !text.contains('@') && parsed.as_str() == text).then_some(text)
}

/// Set once an untrusted caller's `X-Forwarded-For` was ignored, so the warning is logged once.
static UNTRUSTED_WARNED: AtomicBool = AtomicBool::new(false);

/// The client: the caller itself unless it is a trusted proxy; then `X-Forwarded-For` walked
/// right to left, element by element, past trusted hops. An element that cannot be read ends
/// the walk at the last trusted hop, so garbage never gives a client another's key; the last
/// element, which the caller itself appended, must be readable.
fn client_address(
    peer: IpAddr,
    headers: &HeaderMap,
    trusted: &TrustedProxies,
) -> Result<IpAddr, Refusal> {
    let peer = peer.to_canonical();
    let lines = headers.get_all(X_FORWARDED_FOR);
    if !trusted.contains(peer) {
        if lines.iter().next().is_some() && !UNTRUSTED_WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                caller = %peer,
                "/v1/forward-auth: X-Forwarded-For from a caller outside [forward_auth] \
                 trusted_proxies is ignored, so its clients count as the caller's address; add \
                 the proxy's address to trusted_proxies"
            );
        }
        return Ok(peer);
    }
    if lines.iter().next().is_none() {
        return Err(Refusal::Missing("X-Forwarded-For"));
    }
    let mut last_trusted = peer;
    let mut hops = 0;
    for line in lines.iter().rev() {
        for element in line.as_bytes().rsplit(|&b| b == b',') {
            hops += 1;
            let hop = if hops > MAX_HOPS {
                None
            } else {
                parse_hop(element)
            };
            let Some(ip) = hop else {
                return if hops == 1 {
                    Err(Refusal::Unreadable("X-Forwarded-For", NOT_ADDRESS))
                } else {
                    Ok(last_trusted)
                };
            };
            if !trusted.contains(ip) {
                return Ok(ip);
            }
            last_trusted = ip;
        }
    }
    // Every hop is trusted: the left-most one is as close to the client as anyone knows.
    Ok(last_trusted)
}

/// One `X-Forwarded-For` element: `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1` or
/// `[2001:db8::1]:80`.
fn parse_hop(element: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(element.trim_ascii()).ok()?;
    if let Some(rest) = text.strip_prefix('[') {
        let (v6, _port) = rest.split_once(']')?;
        return v6
            .parse::<Ipv6Addr>()
            .ok()
            .map(|ip| IpAddr::V6(ip).to_canonical());
    }
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    let (host, port) = text.rsplit_once(':')?;
    (!port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()))
        .then(|| host.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4))
        .flatten()
}

#[cfg(test)]
mod tests;
