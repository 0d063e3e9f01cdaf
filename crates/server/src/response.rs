//! What the server writes back: rate-limit headers (`X-RateLimit-*`, IETF
//! `RateLimit-Policy`/`RateLimit`, `Retry-After`), problem+json bodies and decision JSON.

use std::borrow::Borrow;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use serde_json::{Value, json};
use tollgate::Decision;

/// The body type of every response the server writes. Its error is boxed: a proxied body can
/// also end in the proxy's own error (an upstream that stalls mid-body).
pub(crate) type Body = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// A body of bytes.
pub(crate) fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

/// The name of the policy that made `d` (whether the core shares names as `Arc<str>` or as
/// `&'static str`).
#[allow(noop_method_call)]
pub(crate) fn policy_name(d: &Decision) -> &str {
    d.policy.borrow()
}

/// Whole seconds, rounded up.
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// An RFC 9457 problem response.
pub(crate) fn problem(status: StatusCode, title: &str, detail: Option<&str>) -> Response<Body> {
    let mut res = Response::new(full(problem_body(status, title, detail)));
    *res.status_mut() = status;
    res.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    res
}

/// A request refused before any policy counted it, as every door refuses it.
pub(crate) fn problem_response(refusal: &tollgate_http::Refusal) -> Response<Body> {
    let mut res = Response::new(full(refusal.body()));
    *res.status_mut() = refusal.status();
    res.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    res
}

/// The JSON of an RFC 9457 problem (the proxy's relay writes it without a `Response`).
pub(crate) fn problem_body(status: StatusCode, title: &str, detail: Option<&str>) -> String {
    let mut body = json!({
        "type": "about:blank",
        "title": title,
        "status": status.as_u16(),
    });
    if let (Some(d), Some(obj)) = (detail, body.as_object_mut()) {
        obj.insert("detail".into(), Value::from(d));
    }
    body.to_string()
}

/// One decision as `/v1/check` answers it in JSON: seconds, rounded up; `delay` in (fractional)
/// seconds, for a policy that `holds` requests (its action is `delay`), else `null`.
pub(crate) fn decision_json(d: &Decision, holds: bool) -> Value {
    let mut v = json!({
        "allowed": d.allowed,
        "policy": policy_name(d),
        "limit": d.limit,
        "remaining": d.remaining,
        "reset": ceil_secs(d.reset),
        "retry_after": d.retry_after.map(|r| ceil_secs(r).max(1)),
        // Only a policy whose action is `delay` (`holds`) holds a request.
        "delay": d.delay.filter(|_| holds).map(|x| x.as_secs_f64()),
    });
    // A lockout says so (its retry_after is when it ends); other decisions are as they were.
    if d.ban.is_ban()
        && let Some(o) = v.as_object_mut()
    {
        o.insert("banned".into(), Value::from(true));
    }
    v
}

/// A JSON response from bytes already written.
pub(crate) fn json_bytes_response(status: StatusCode, body: Bytes) -> Response<Body> {
    let mut res = Response::new(full(body));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res
}

/// A JSON response.
pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    let mut res = Response::new(full(body.to_string()));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res
}

/// A plain-text response.
pub(crate) fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut res = Response::new(full(body));
    *res.status_mut() = status;
    res.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    res
}

/// A request's body, whole: at most `limit` bytes, arriving within `within` (the listener's
/// `header_read_timeout`, as for the head). `Err` is the answer: 413 past the limit, 408 when
/// the body stalls, which closes the connection (a client that starts a body and never ends it
/// would otherwise hold its connection, and with enough of them every connection, for ever),
/// 400 when it could not be read.
pub(crate) async fn read_body<B>(
    req: hyper::Request<B>,
    limit: usize,
    within: Duration,
) -> Result<Bytes, Response<Body>>
where
    B: hyper::body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    // HTTP/2 ends a stream, not the connection, and has no Connection header.
    let http1 = req.version() < hyper::Version::HTTP_2;
    let too_large = || {
        problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Content too large",
            Some(&format!("the body exceeds {} KiB", limit / 1024)),
        )
    };
    // A length announced past the limit is refused before any of the body is read (and before
    // an `Expect: 100-continue` client is told to send it).
    let announced = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let read = http_body_util::Limited::new(req.into_body(), limit).collect();
    match tokio::time::timeout(within, read).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Ok(Err(_)) => Err(problem(
            StatusCode::BAD_REQUEST,
            "Bad Request",
            Some("the body could not be read"),
        )),
        Err(_) => Err(body_too_late(http1)),
    }
}

/// The 408 of a request body that did not arrive within its time: over HTTP/1 the connection
/// then closes (`connection: close`), since the rest of that body may still come. Both the
/// decision API's handler and its HTTP/1.1 quick lane answer it.
pub(crate) fn body_too_late(http1: bool) -> Response<Body> {
    let mut res = problem(
        StatusCode::REQUEST_TIMEOUT,
        "Request Timeout",
        Some("the body did not arrive within header_read_timeout"),
    );
    if http1 {
        res.headers_mut()
            .insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    }
    res
}
