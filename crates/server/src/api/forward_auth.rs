//! `/v1/forward-auth`: the decision for a request that a proxy (Traefik ForwardAuth, Caddy
//! `forward_auth`, nginx `auth_request`) describes in `X-Forwarded-*` headers.
//!
//! The caller is the proxy. What it describes must be complete and unambiguous: a missing,
//! repeated or unreadable identity header is refused with a 400 naming it, never guessed (a
//! guess such as `GET /` from the proxy's own address would count every client as one and
//! match the wrong policies). The client's address comes from `X-Forwarded-For` only when the
//! caller is in `[forward_auth] trusted_proxies`.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use tollgate_http::{ForwardedHeader, Refusal, RequestInfo, TrustedProxies, normalize};

use crate::generation::{Disposition, Generation};
use crate::response::{Body, full, problem_response};
use crate::telemetry::{Door, Trace};

/// How a denial is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flavor {
    /// `/v1/forward-auth`: 429 with `Retry-After`, the rate-limit headers and the
    /// problem+json body, which Traefik and Caddy pass to the client as they are.
    Standard,
    /// `/v1/forward-auth/nginx`: nginx's `auth_request` understands only 2xx, 401 and 403 (any
    /// other status becomes a 500 for the client, and its headers are lost), so a denial is a
    /// 403 with the same headers, and the problem+json body also in [`PROBLEM_HEADER`] for the
    /// recipe to send back with a 429 (nginx discards the body of an auth subrequest). A deny
    /// list's 403 carries its body the same way, and [`STATUS_HEADER`] tells the recipe to
    /// answer it with a 403.
    Nginx,
}

/// The response header that carries the problem+json body of a denial to nginx.
pub(crate) const PROBLEM_HEADER: HeaderName = HeaderName::from_static("tollgate-problem");

/// The status the client is to get, on `/v1/forward-auth/nginx`: 429 (a rate limit or a ban)
/// or 403 (a deny list), which nginx's `auth_request` both sees as a 403.
pub(crate) const STATUS_HEADER: HeaderName = HeaderName::from_static("tollgate-status");

const X_FORWARDED_METHOD: &str = "x-forwarded-method";
const X_FORWARDED_URI: &str = "x-forwarded-uri";
const X_ORIGINAL_URI: &str = "x-original-uri";
const X_FORWARDED_HOST: &str = "x-forwarded-host";
const X_FORWARDED_FOR: &str = "x-forwarded-for";

const MISSING: &str = "is missing: the proxy must send X-Forwarded-Method, X-Forwarded-Uri, \
     X-Forwarded-Host and X-Forwarded-For (see docs/forward-auth.md)";
const REPEATED: &str = "appears more than once: a request with two values of a field that \
     identifies it is refused, since the limiter and the upstream could read different ones";

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
        Err(refusal) => return refused(&refusal),
    };
    let info = RequestInfo::new(&described.method, described.target, headers)
        .with_host(Some(described.host))
        .with_client_ip(Some(described.client));
    let prepared = engine.http().prepare(&info);
    if let Some(name) = super::unseen_status::counted_by_status(engine, &prepared) {
        return super::unseen_status::refuse(name, "forward-auth");
    }
    let trace = Trace::from_headers(Door::ForwardAuth, headers);
    let mut evaluation = engine.decide(prepared, trace).await;
    if let Some(mut settle) = evaluation.take_settle() {
        // The proxy never says when the request ends: its concurrency slots live for their
        // lease_ttl. (Its response's true-up, never learned either, leaves admission's charge.)
        settle.keep_slots();
    }
    let (_, rate_limit, disposition) = evaluation.into_parts();
    match disposition {
        Disposition::Respond(answer) => {
            let mut res = answer.into_response();
            let status = res.status();
            if flavor == Flavor::Nginx
                && (status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::FORBIDDEN)
            {
                *res.status_mut() = StatusCode::FORBIDDEN;
                res.headers_mut()
                    .insert(STATUS_HEADER, HeaderValue::from(status.as_u16()));
                // A policy name outside printable ASCII cannot travel in a header; the recipe
                // then answers with an empty body, and every other header still arrives.
                if let Ok(v) = HeaderValue::from_maybe_shared(res.body().clone()) {
                    res.headers_mut().insert(PROBLEM_HEADER, v);
                }
            }
            res.map(full)
        }
        disposition => {
            if let Disposition::Hold(hold) = disposition {
                hold.wait().await;
            }
            let mut res = Response::new(full(Bytes::new()));
            rate_limit.apply(res.headers_mut());
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
    /// The request `headers` describe, through the readings every door shares
    /// (`tollgate_http::normalize`, `tollgate_http::client_address`).
    fn read(
        headers: &'h HeaderMap,
        peer: IpAddr,
        trusted: &TrustedProxies,
    ) -> Result<Self, Refusal> {
        let method = single(headers, X_FORWARDED_METHOD, "X-Forwarded-Method")?
            .ok_or_else(|| Refusal::bad_field("X-Forwarded-Method", MISSING))?;
        let method = normalize::method(method.as_bytes(), "X-Forwarded-Method")?;
        let target = match (
            single(headers, X_FORWARDED_URI, "X-Forwarded-Uri")?,
            single(headers, X_ORIGINAL_URI, "X-Original-URI")?,
        ) {
            (Some(_), Some(_)) => {
                return Err(Refusal::bad_field(
                    "X-Forwarded-Uri",
                    "and X-Original-URI both name the target: send one",
                ));
            }
            (Some(v), None) => normalize::target(v.as_bytes(), "X-Forwarded-Uri")?,
            (None, Some(v)) => normalize::target(v.as_bytes(), "X-Original-URI")?,
            (None, None) => return Err(Refusal::bad_field("X-Forwarded-Uri", MISSING)),
        };
        let host = single(headers, X_FORWARDED_HOST, "X-Forwarded-Host")?
            .ok_or_else(|| Refusal::bad_field("X-Forwarded-Host", MISSING))?;
        let host = normalize::authority(host.as_bytes(), "X-Forwarded-Host")?;
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
        return Err(Refusal::bad_field(display, REPEATED));
    }
    Ok(first)
}

/// Set once an untrusted caller's `X-Forwarded-For` was ignored, so the warning is logged once.
static UNTRUSTED_WARNED: AtomicBool = AtomicBool::new(false);

/// The client: the caller itself unless it is a trusted proxy; then `X-Forwarded-For` by the
/// walk every door shares. A trusted caller must send it: it is how the proxy says who the
/// client is.
fn client_address(
    peer: IpAddr,
    headers: &HeaderMap,
    trusted: &TrustedProxies,
) -> Result<IpAddr, Refusal> {
    let peer = peer.to_canonical();
    let sent = headers.contains_key(X_FORWARDED_FOR);
    if !trusted.contains(peer) {
        if sent && !UNTRUSTED_WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                caller = %peer,
                "/v1/forward-auth: X-Forwarded-For from a caller outside [forward_auth] \
                 trusted_proxies is ignored, so its clients count as the caller's address; add \
                 the proxy's address to trusted_proxies"
            );
        }
        return Ok(peer);
    }
    if !sent {
        return Err(Refusal::bad_field("X-Forwarded-For", MISSING));
    }
    tollgate_http::client_address(peer, headers, trusted, ForwardedHeader::XForwardedFor)
}

/// A refused description: 400 with the problem naming the field.
fn refused(refusal: &Refusal) -> Response<Body> {
    problem_response(refusal)
}

#[cfg(test)]
mod tests;
