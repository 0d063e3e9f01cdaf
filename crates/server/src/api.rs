//! The decision API on `[server] listen`: `POST /v1/check` (by policy and key, or by request
//! attributes), and `/v1/forward-auth` for Traefik and Caddy with `/v1/forward-auth/nginx` for
//! nginx `auth_request`.

mod forward_auth;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{HOST, HeaderName, HeaderValue};
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use serde_json::{Value, json};

use tollgate::Decision;
use tollgate_http::RequestInfo;

use crate::Shared;
use crate::config::Action;
use crate::generation::{Disposition, Generation, KeyCheck};
use crate::response::{Body, decision_json, full, json_response, problem, text};

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
        (_, "/v1/check") => problem(
            StatusCode::METHOD_NOT_ALLOWED,
            "Method not allowed",
            Some("use POST /v1/check with a JSON body"),
        ),
        (_, "/v1/forward-auth") => {
            forward_auth::handle(&engine, peer, req, forward_auth::Flavor::Standard).await
        }
        (_, "/v1/forward-auth/nginx") => {
            forward_auth::handle(&engine, peer, req, forward_auth::Flavor::Nginx).await
        }
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
        _ => problem(
            StatusCode::NOT_FOUND,
            "Not found",
            Some(
                "the decision API serves POST /v1/check, /v1/forward-auth and /v1/forward-auth/nginx",
            ),
        ),
    }
}

fn bad_request(detail: &str) -> Response<Body> {
    problem(StatusCode::BAD_REQUEST, "Bad request", Some(detail))
}

async fn check(engine: &Generation, req: Request<Incoming>) -> Response<Body> {
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return bad_request("the body could not be read or exceeds 64 KiB"),
    };
    let value: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return bad_request(&format!("malformed JSON: {e}")),
    };
    let Some(obj) = value.as_object() else {
        return bad_request(
            "expected a JSON object: {\"policy\", \"key\", \"cost\"} or {\"method\", \"path\", \"headers\", \"ip\"}",
        );
    };
    if obj.contains_key("policy") {
        check_by_policy(engine, obj).await
    } else {
        check_by_attributes(engine, obj).await
    }
}

async fn check_by_policy(
    engine: &Generation,
    obj: &serde_json::Map<String, Value>,
) -> Response<Body> {
    let Some(name) = obj.get("policy").and_then(Value::as_str) else {
        return bad_request("\"policy\" must be a string");
    };
    let Some(key) = obj.get("key").and_then(Value::as_str) else {
        return bad_request("\"key\" is required and must be a string");
    };
    let cost = match obj.get("cost") {
        None | Some(Value::Null) => 1,
        Some(v) => match v.as_u64().and_then(|c| u32::try_from(c).ok()) {
            Some(c) => c,
            None => return bad_request("\"cost\" must be a whole number from 0 to 4294967295"),
        },
    };
    let Some(pc) = engine.policy(name) else {
        let known: Vec<&str> = engine.config().policies.iter().map(|p| p.name()).collect();
        return problem(
            StatusCode::NOT_FOUND,
            "Unknown policy",
            Some(&format!(
                "no policy named {:?}; configured: {}",
                name.chars().take(128).collect::<String>(),
                known.join(", ")
            )),
        );
    };
    let (decisions, headers) = match engine.check_one(pc, key.as_bytes(), cost).await {
        Ok(KeyCheck::Decided(d, headers)) => (d, headers),
        Ok(KeyCheck::NeverAdmissible(q)) => {
            // Never admissible: denied, and no retry_after, which would lie.
            let body = json!({"allowed": false, "policy": pc.name(), "limit": q.limit(),
                "remaining": 0, "reset": q.window().as_secs(), "retry_after": null,
                "delay": null, "action": pc.action.as_str(),
                "detail": format!("cost {cost} exceeds what the quota can ever admit ({})", q.max_cost())});
            let status = if pc.action == Action::Shadow {
                StatusCode::OK
            } else {
                StatusCode::TOO_MANY_REQUESTS
            };
            return json_response(status, &body);
        }
        Err(e) => return store_failed(&e),
    };
    let Some(d) = decisions.as_slice().first() else {
        return store_failed(&tollgate::ErrorKind::UnknownPolicy(name.to_owned()).into());
    };
    let mut body = decision_json(d);
    if let Some(obj) = body.as_object_mut() {
        obj.insert("action".into(), Value::from(pc.action.as_str()));
    }
    let shadow = pc.action == Action::Shadow;
    let status = if d.allowed || shadow {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    let mut res = json_response(status, &body);
    if !shadow {
        headers.apply(res.headers_mut());
    }
    res
}

fn store_failed(e: &tollgate::Error) -> Response<Body> {
    tracing::warn!(error = %e, "decision failed");
    let mut res = problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "Rate limiter unavailable",
        Some("the store could not decide; retry shortly"),
    );
    res.headers_mut()
        .insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("1"));
    res
}

/// A request described attribute by attribute to `/v1/check`.
struct Attributes<'a> {
    method: Method,
    target: &'a str,
    host: Option<&'a str>,
    headers: HeaderMap,
    ip: Option<IpAddr>,
}

/// Reads the attributes, refusing what the limiter could not read the way an upstream would: a
/// target or host outside printable ASCII, or one header given twice (in any case).
fn attributes(obj: &serde_json::Map<String, Value>) -> Result<Attributes<'_>, String> {
    let method = match obj.get("method") {
        None | Some(Value::Null) => Method::GET,
        Some(Value::String(m)) => Method::from_bytes(m.to_ascii_uppercase().as_bytes())
            .map_err(|_| String::from("\"method\" is not an HTTP method"))?,
        Some(_) => return Err(String::from("\"method\" must be a string")),
    };
    let Some(target) = obj.get("path").and_then(Value::as_str) else {
        return Err(String::from(
            "send {\"policy\", \"key\", \"cost\"} or request attributes with at least \"path\"",
        ));
    };
    let target = forward_auth::origin_form(target.as_bytes()).ok_or_else(|| {
        String::from(
            "\"path\" must be a path starting with '/', in printable ASCII (percent-encode other \
             bytes), as in the request line",
        )
    })?;
    let host = match obj.get("host") {
        None | Some(Value::Null) => None,
        Some(Value::String(h)) => Some(h.as_str()),
        Some(_) => return Err(String::from("\"host\" must be a string")),
    };
    let mut headers = HeaderMap::new();
    match obj.get("headers") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (k, v) in map {
                let Some(v) = v.as_str() else {
                    return Err(String::from("\"headers\" values must be strings"));
                };
                let (Ok(name), Ok(value)) = (
                    HeaderName::from_bytes(k.as_bytes()),
                    HeaderValue::from_str(v),
                ) else {
                    return Err(String::from(
                        "\"headers\" holds an invalid header name or value",
                    ));
                };
                if headers.contains_key(&name) {
                    return Err(format!(
                        "\"headers\" names {name} more than once: a request with two values of \
                         one header is refused, since the limiter and the upstream could read \
                         different ones"
                    ));
                }
                headers.append(name, value);
            }
        }
        Some(_) => return Err(String::from("\"headers\" must be an object of strings")),
    }
    let ip = match obj.get("ip") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(
            s.parse::<IpAddr>()
                .map_err(|_| String::from("\"ip\" is not an IP address"))?,
        ),
        Some(_) => return Err(String::from("\"ip\" must be a string")),
    };
    // "host", or else the Host header: checked alike.
    let named_host = host
        .map(str::as_bytes)
        .or_else(|| headers.get(HOST).map(HeaderValue::as_bytes));
    if named_host.is_some_and(|h| forward_auth::authority(h).is_none()) {
        return Err(String::from(
            "the host must be a host name or address with an optional port, in ASCII",
        ));
    }
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
) -> Response<Body> {
    let Attributes {
        method,
        target,
        host,
        headers,
        ip,
    } = match attributes(obj) {
        Ok(a) => a,
        Err(detail) => return bad_request(&detail),
    };
    let host = host.or_else(|| headers.get(HOST).and_then(|h| h.to_str().ok()));
    let info = RequestInfo::new(&method, target, &headers)
        .with_host(host)
        .with_client_ip(ip);
    let eval = engine.evaluate(&info).await;
    let status = match eval.verdict {
        Disposition::Respond(a) if a.status() != StatusCode::TOO_MANY_REQUESTS => {
            // 401 (no key for a require_key policy) or 503 (store down, on_error = "deny").
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
    let (enforced, shadow): (Vec<&Decision>, Vec<&Decision>) = eval
        .decisions
        .as_slice()
        .iter()
        .partition(|d| engine.enforced(d));
    let allowed = status == StatusCode::OK;
    // As SPEC §5 picks it: a denial first, then the lowest remaining, then the latest reset.
    let top = enforced.iter().copied().min_by(|a, b| {
        a.allowed
            .cmp(&b.allowed)
            .then(a.remaining.cmp(&b.remaining))
            .then(b.reset.cmp(&a.reset))
    });
    let mut body = match top {
        Some(d) => decision_json(d),
        None => json!({"policy": null, "limit": null, "remaining": null, "reset": null,
            "retry_after": null, "delay": null}),
    };
    if let Some(o) = body.as_object_mut() {
        o.insert("allowed".into(), Value::from(allowed));
        let retry = eval
            .headers
            .get(hyper::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        o.insert("retry_after".into(), json!(retry.filter(|_| !allowed)));
        o.insert(
            "decisions".into(),
            Value::from(
                enforced
                    .iter()
                    .map(|d| decision_json(d))
                    .collect::<Vec<_>>(),
            ),
        );
        o.insert(
            "shadow".into(),
            Value::from(shadow.iter().map(|d| decision_json(d)).collect::<Vec<_>>()),
        );
        o.insert("fail_open".into(), Value::from(eval.fail_open));
    }
    let mut res = json_response(status, &body);
    for (name, value) in &eval.headers {
        res.headers_mut().insert(name.clone(), value.clone());
    }
    res
}
