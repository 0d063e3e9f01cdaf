//! What the server writes back: rate-limit headers (SPEC §5: `X-RateLimit-*`, IETF
//! `RateLimit-Policy`/`RateLimit`, `Retry-After`), problem+json bodies and decision JSON.

use std::borrow::Borrow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::header::{CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};
use hyper::{HeaderMap, Response, StatusCode};
use serde_json::{Value, json};
use tollgate::{Decision, Decisions};

use crate::config::{Config, HeadersConfig, ResetFormat};

/// The body type of every response the server writes.
pub(crate) type Body = BoxBody<Bytes, hyper::Error>;

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

/// A structured-field string: printable ASCII only, `"` and `\` escaped.
fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

/// The seconds a denied request is told to wait: rounded up, never 0.
pub(crate) fn retry_after_secs(d: &Decisions) -> Option<u64> {
    d.retry_after().map(|r| ceil_secs(r).max(1))
}

/// Adds the rate-limit headers of `decisions` to `headers`.
pub(crate) fn rate_limit_headers(
    headers: &mut HeaderMap,
    decisions: &Decisions,
    config: &Config,
    hc: &HeadersConfig,
) {
    let Some(top) = decisions.most_restrictive() else {
        return;
    };
    let denied = !decisions.allowed();
    let retry = retry_after_secs(decisions);
    // For a denied request, `t` is when this request can be admitted, and Retry-After equals
    // it; for an admitted one, when the quota is fully available again.
    let t = match (denied, retry) {
        (true, Some(r)) => r,
        _ => ceil_secs(top.reset),
    };
    let mut put = |name: &'static str, value: String| {
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(HeaderName::from_static(name), v);
        }
    };
    if hc.legacy {
        put("x-ratelimit-limit", top.limit.to_string());
        put("x-ratelimit-remaining", top.remaining.to_string());
        let reset = match hc.reset_format {
            ResetFormat::Delta => t,
            ResetFormat::Epoch => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                now + t
            }
        };
        put("x-ratelimit-reset", reset.to_string());
    }
    if hc.ietf {
        let policies: Vec<String> = decisions
            .as_slice()
            .iter()
            .map(|d| {
                let w = config
                    .policy(policy_name(d))
                    .map_or(0, |p| ceil_secs(p.policy.quota().window()).max(1));
                format!("{};q={};w={}", sf_string(policy_name(d)), d.limit, w)
            })
            .collect();
        put("ratelimit-policy", policies.join(", "));
        put(
            "ratelimit",
            format!(
                "{};r={};t={}",
                sf_string(policy_name(top)),
                top.remaining,
                t
            ),
        );
    }
    if denied && let Some(r) = retry {
        headers.insert(RETRY_AFTER, HeaderValue::from(r));
    }
}

/// An RFC 9457 problem response.
pub(crate) fn problem(status: StatusCode, title: &str, detail: Option<&str>) -> Response<Body> {
    let mut body = json!({
        "type": "about:blank",
        "title": title,
        "status": status.as_u16(),
    });
    if let (Some(d), Some(obj)) = (detail, body.as_object_mut()) {
        obj.insert("detail".into(), Value::from(d));
    }
    problem_response(status, &body)
}

fn problem_response(status: StatusCode, body: &Value) -> Response<Body> {
    let mut res = Response::new(full(body.to_string()));
    *res.status_mut() = status;
    res.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    res
}

/// One decision as SPEC §8's JSON: seconds, rounded up; `delay` in (fractional) seconds.
pub(crate) fn decision_json(d: &Decision) -> Value {
    json!({
        "allowed": d.allowed,
        "policy": policy_name(d),
        "limit": d.limit,
        "remaining": d.remaining,
        "reset": ceil_secs(d.reset),
        "retry_after": d.retry_after.map(|r| ceil_secs(r).max(1)),
        "delay": d.delay.map(|x| x.as_secs_f64()),
    })
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
