//! The decision API on `[server] listen`: `POST /v1/check` (by policy and key, or by request
//! attributes), and `/v1/forward-auth` for Traefik and Caddy with `/v1/forward-auth/nginx` for
//! nginx `auth_request`.

mod by_policy;
mod forward_auth;
mod lease;
pub(crate) mod unique;
mod unseen_status;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{HOST, HeaderName, HeaderValue};
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use serde_json::{Value, json};

use tollgate::Decisions;
use tollgate_http::{Refusal, RequestInfo, normalize};

use crate::Shared;
use crate::generation::{Disposition, Generation};
use crate::response::{
    Body, decision_json, full, json_response, problem, problem_response, read_body, text,
};
use crate::telemetry::{Door, Trace};

/// The largest `/v1/check` body accepted.
const MAX_BODY: usize = 64 * 1024;

pub(crate) async fn handle(
    shared: Arc<Shared>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Response<Body> {
    let engine = shared.engine();
    match (req.method(), req.uri().path()) {
        (&Method::POST, "/v1/check") => check(&engine, req).await,
        (&Method::POST, "/v1/release") => lease::release(&engine, req).await,
        (_, "/v1/release") => only_post("use POST /v1/release with {\"lease\": \"...\"}"),
        (_, "/v1/check") => only_post("use POST /v1/check with a JSON body"),
        (_, "/v1/forward-auth") => {
            forward_auth::handle(&engine, peer, req, forward_auth::Flavor::Standard).await
        }
        (_, "/v1/forward-auth/nginx") => {
            forward_auth::handle(&engine, peer, req, forward_auth::Flavor::Nginx).await
        }
        (&Method::GET | &Method::HEAD, "/healthz") => text(StatusCode::OK, "ok\n"),
        _ => problem(
            StatusCode::NOT_FOUND,
            "Not Found",
            Some(
                "the decision API serves POST /v1/check, POST /v1/release, /v1/forward-auth and /v1/forward-auth/nginx",
            ),
        ),
    }
}

/// 405 for an endpoint that takes POST only, saying so in `Allow` (RFC 9110 §15.5.6).
fn only_post(detail: &str) -> Response<Body> {
    let mut res = problem(
        StatusCode::METHOD_NOT_ALLOWED,
        "Method Not Allowed",
        Some(detail),
    );
    res.headers_mut().insert(
        hyper::header::ALLOW,
        hyper::header::HeaderValue::from_static("POST"),
    );
    res
}

fn bad_request(detail: &str) -> Response<Body> {
    problem(StatusCode::BAD_REQUEST, "Bad Request", Some(detail))
}

/// Reads a JSON body of at most [`MAX_BODY`] bytes; `Err` is the 4xx to answer.
async fn json_body(engine: &Generation, req: Request<Incoming>) -> Result<Value, Response<Body>> {
    let within = engine.config().limits.header_read_timeout;
    let body = read_body(req, MAX_BODY, within).await?;
    if let Some(reason) = unique::repeated_member(&body) {
        return Err(bad_request(&reason));
    }
    serde_json::from_slice(&body).map_err(|e| bad_request(&format!("malformed JSON: {e}")))
}

async fn check(engine: &Generation, req: Request<Incoming>) -> Response<Body> {
    // The caller's trace context, kept (a reference count each) only when decisions are traced.
    let context = engine.traced().then(|| {
        let h = req.headers();
        (h.get("traceparent").cloned(), h.get("tracestate").cloned())
    });
    let (parent, state) = context.unwrap_or_default();
    let within = engine.config().limits.header_read_timeout;
    let body = match read_body(req, MAX_BODY, within).await {
        Ok(body) => body,
        Err(refusal) => return refusal,
    };
    let trace = Trace {
        door: Door::Check,
        parent: parent.as_ref().map(HeaderValue::as_bytes),
        state: state.as_ref().map(HeaderValue::as_bytes),
    };
    check_body(engine, &body, trace).await.into_response()
}

use by_policy::Checked;

/// The decision API's quick lane (`serve::quick`): checks read without hyper.
pub(crate) struct QuickCheck(pub(crate) Arc<Shared>);

impl crate::serve::quick::Quick for QuickCheck {
    async fn check<'a>(&'a self, head: &'a [u8], body: &'a [u8], out: &'a mut Vec<u8>) -> bool {
        let engine = self.0.engine();
        // The trace context is read from the head again, only when decisions are traced.
        let (parent, state) = if engine.traced() {
            crate::serve::quick::trace_context(head)
        } else {
            (None, None)
        };
        let trace = Trace {
            door: Door::Check,
            parent,
            state,
        };
        check_body(&engine, body, trace).await.write_http1(out)
    }
}

/// Answers `POST /v1/check` with `body`, however it arrived.
async fn check_body(engine: &Generation, body: &[u8], trace: Trace<'_>) -> Checked {
    // The common call, by policy and key, is read field by field without building a tree;
    // anything else (by attributes, or a body the quick reading cannot take) the general way.
    if let Some(asked) = by_policy::Asked::read(body) {
        return by_policy::check(engine, asked, trace).await;
    }
    if let Some(reason) = unique::repeated_member(body) {
        return Checked::Other(bad_request(&reason));
    }
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return Checked::Other(bad_request(&format!("malformed JSON: {e}"))),
    };
    let Some(obj) = value.as_object() else {
        return Checked::Other(bad_request(
            "expected a JSON object: {\"policy\", \"key\", \"cost\"} or {\"method\", \"path\", \"headers\", \"ip\"}",
        ));
    };
    if obj.contains_key("policy") {
        by_policy::check(engine, by_policy::Asked::from_map(obj), trace).await
    } else {
        Checked::Other(check_by_attributes(engine, obj, trace).await)
    }
}

/// A request described attribute by attribute to `/v1/check`.
struct Attributes<'a> {
    method: Method,
    target: &'a str,
    host: Option<&'a str>,
    headers: HeaderMap,
    ip: Option<IpAddr>,
}

/// Reads the attributes through the readings every door shares (`tollgate_http::normalize`),
/// refusing what the limiter could not read the way an upstream would: a target or host outside
/// visible ASCII, a fragment, an empty port, or one header given twice (in any case).
fn attributes(obj: &serde_json::Map<String, Value>) -> Result<Attributes<'_>, Refusal> {
    // What only a check by policy and key can do: refused, not ignored, so that a usage report
    // or a cost is never silently taken for a plain check.
    match obj.get("mode") {
        None | Some(Value::Null) => {}
        Some(Value::String(m)) if m == "check" || m == "acquire" => {}
        Some(_) => {
            return Err(Refusal::bad_field(
                "\"mode\"",
                "of a described request is \"check\" (its concurrency slots are acquired, \
                 answered with a lease); to report usage, send {\"policy\", \"key\", \"cost\", \
                 \"mode\": \"report\"}",
            ));
        }
    }
    if obj.contains_key("cost") {
        return Err(Refusal::bad_field(
            "\"cost\"",
            "applies to a check by policy and key; a described request costs what each \
             matching policy's cost says",
        ));
    }
    let method = match obj.get("method") {
        None | Some(Value::Null) => Method::GET,
        Some(Value::String(m)) => normalize::method(m.as_bytes(), "\"method\"")?,
        Some(_) => return Err(Refusal::bad_field("\"method\"", "must be a string")),
    };
    let Some(target) = obj.get("path").and_then(Value::as_str) else {
        return Err(Refusal::bad_field(
            "\"path\"",
            "is required: send {\"policy\", \"key\", \"cost\"} or request attributes with at \
             least \"path\"",
        ));
    };
    let target = normalize::target(target.as_bytes(), "\"path\"")?;
    let host = match obj.get("host") {
        None | Some(Value::Null) => None,
        Some(Value::String(h)) => Some(normalize::authority(h.as_bytes(), "\"host\"")?),
        Some(_) => return Err(Refusal::bad_field("\"host\"", "must be a string")),
    };
    let mut headers = HeaderMap::new();
    match obj.get("headers") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (k, v) in map {
                let Some(v) = v.as_str() else {
                    return Err(Refusal::bad_field("\"headers\"", "values must be strings"));
                };
                let (Ok(name), Ok(value)) = (
                    HeaderName::from_bytes(k.as_bytes()),
                    HeaderValue::from_str(v),
                ) else {
                    return Err(Refusal::bad_field(
                        "\"headers\"",
                        "holds an invalid header name or value",
                    ));
                };
                if headers.contains_key(&name) {
                    return Err(Refusal::bad_field(
                        "\"headers\"",
                        format!(
                            "names {name} more than once: a request with two values of one \
                             header is refused, since the limiter and the upstream could read \
                             different ones"
                        ),
                    ));
                }
                headers.append(name, value);
            }
        }
        Some(_) => {
            return Err(Refusal::bad_field(
                "\"headers\"",
                "must be an object of strings",
            ));
        }
    }
    if host.is_none()
        && let Some(h) = headers.get(HOST)
    {
        normalize::authority(h.as_bytes(), "\"headers\" Host")?;
    }
    let ip = match obj.get("ip") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(
            s.parse::<IpAddr>()
                .map_err(|_| Refusal::bad_field("\"ip\"", "is not an IP address"))?,
        ),
        Some(_) => return Err(Refusal::bad_field("\"ip\"", "must be a string")),
    };
    Ok(Attributes {
        method,
        target,
        host,
        headers,
        ip,
    })
}

async fn check_by_attributes(
    engine: &Generation,
    obj: &serde_json::Map<String, Value>,
    trace: Trace<'_>,
) -> Response<Body> {
    let Attributes {
        method,
        target,
        host,
        headers,
        ip,
    } = match attributes(obj) {
        Ok(a) => a,
        Err(refusal) => return problem_response(&refusal),
    };
    let host = host.or_else(|| headers.get(HOST).and_then(|h| h.to_str().ok()));
    let info = RequestInfo::new(&method, target, &headers)
        .with_host(host)
        .with_client_ip(ip);
    let prepared = engine.http().prepare(&info);
    if let Some(name) = unseen_status::counted_by_status(engine, &prepared) {
        return unseen_status::refuse(name, "POST /v1/check by request attributes");
    }
    // The matching policies, by index: named in the answer should the store fail open.
    let matched: smallvec::SmallVec<[usize; 4]> = prepared.keys().map(|(i, _)| i).collect();
    let mut eval = engine.decide(prepared, trace).await;
    let fail_open = eval.store_failed() && eval.allowed();
    // A described request that took concurrency slots gets a lease to give them back with,
    // whatever its mode: nothing else could.
    let lease = eval.take_settle().and_then(|mut s| s.lease());
    let (decisions, rate_limit, disposition) = eval.into_parts();
    let status = match disposition {
        Disposition::Respond(a) if a.status() != StatusCode::TOO_MANY_REQUESTS => {
            // 400/401/414 (refused before any count) or 503 (the store failed closed).
            return a.into_response().map(full);
        }
        Disposition::Respond(_) => StatusCode::TOO_MANY_REQUESTS,
        Disposition::Hold(hold) => {
            // The caller holds the request; keep its slot rather than give it back.
            tokio::spawn(hold.wait());
            StatusCode::OK
        }
        Disposition::Pass => StatusCode::OK,
    };
    let (enforced, shadow): (Decisions, Decisions) = decisions
        .into_iter()
        .partition(|d| engine.enforced(d.policy));
    let allowed = status == StatusCode::OK;
    if fail_open {
        return undecided(engine, &matched, lease);
    }
    // The core's one choice of the decision that headers and bodies report.
    let mut body = match enforced.most_restrictive() {
        Some(d) => decision_json(d, engine.holds(d.policy)),
        None => json!({"policy": null, "limit": null, "remaining": null, "reset": null,
            "retry_after": null, "delay": null}),
    };
    let mut headers = HeaderMap::new();
    rate_limit.apply(&mut headers);
    if let Some(o) = body.as_object_mut() {
        o.insert("allowed".into(), Value::from(allowed));
        let retry = headers
            .get(hyper::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        o.insert("retry_after".into(), json!(retry.filter(|_| !allowed)));
        o.insert(
            "decisions".into(),
            Value::from(
                enforced
                    .as_slice()
                    .iter()
                    .map(|d| decision_json(d, engine.holds(d.policy)))
                    .collect::<Vec<_>>(),
            ),
        );
        o.insert(
            "shadow".into(),
            Value::from(
                shadow
                    .as_slice()
                    .iter()
                    .map(|d| decision_json(d, engine.holds(d.policy)))
                    .collect::<Vec<_>>(),
            ),
        );
        o.insert("fail_open".into(), Value::from(false));
        o.insert("lease".into(), Value::from(lease));
    }
    let mut res = json_response(status, &body);
    *res.headers_mut() = {
        let mut all = std::mem::take(res.headers_mut());
        all.extend(headers);
        all
    };
    res
}

/// The answer to a described request the store could not decide and `on_error = "allow"` let
/// through: every matching policy named, as admitted with nothing known (`limit`, `remaining`
/// and `reset` null), so a caller can tell which policies it went through unchecked. `policy`
/// is the first enforcing one, as a check by name names its own; no rate-limit headers.
fn undecided(engine: &Generation, matched: &[usize], lease: Option<String>) -> Response<Body> {
    let unknown = |name: Option<&str>| {
        json!({"allowed": true, "policy": name, "limit": null, "remaining": null, "reset": null,
            "retry_after": null, "delay": null})
    };
    let (mut enforced, mut shadow) = (Vec::new(), Vec::new());
    for (i, p) in engine.http().policies().enumerate() {
        if matched.contains(&i) {
            let name = p.policy.name();
            let list = if engine.enforced(name) {
                &mut enforced
            } else {
                &mut shadow
            };
            list.push(unknown(Some(name)));
        }
    }
    let mut body = match enforced.first() {
        Some(first) => first.clone(),
        None => unknown(None),
    };
    if let Some(o) = body.as_object_mut() {
        o.insert("decisions".into(), Value::from(enforced));
        o.insert("shadow".into(), Value::from(shadow));
        o.insert("fail_open".into(), Value::from(true));
        o.insert("lease".into(), Value::from(lease));
    }
    json_response(StatusCode::OK, &body)
}
