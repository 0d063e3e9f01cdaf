//! The decision API on `[server] listen`: `POST /v1/check` (by policy and key, or by request
//! attributes) and `/v1/forward-auth` for Traefik, Caddy and nginx `auth_request`.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use serde_json::{Value, json};

use crate::Shared;
use crate::engine::{Engine, Evaluation};
use crate::matcher::{RequestView, client_ip};
use crate::response::{
    Body, decision_json, json_response, missing_key, problem, rate_limit_headers, text,
    too_many_requests,
};

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
        (_, "/v1/forward-auth") => forward_auth(&engine, peer, req).await,
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
        _ => problem(
            StatusCode::NOT_FOUND,
            "Not found",
            Some("the decision API serves POST /v1/check and /v1/forward-auth"),
        ),
    }
}

fn bad_request(detail: &str) -> Response<Body> {
    problem(StatusCode::BAD_REQUEST, "Bad request", Some(detail))
}

fn internal(e: &tollgate::Error) -> Response<Body> {
    tracing::error!(error = %e, "decision failed");
    problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "Decision failed",
        Some("the limiter could not decide; see the server log"),
    )
}

async fn check(engine: &Engine, req: Request<Incoming>) -> Response<Body> {
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

async fn check_by_policy(engine: &Engine, obj: &serde_json::Map<String, Value>) -> Response<Body> {
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
    let eval = match engine.check_one(pc, key.as_bytes(), cost).await {
        Ok(e) => e,
        Err(e) => return internal(&e),
    };
    let d = eval
        .enforced
        .as_slice()
        .first()
        .or(eval.shadow.as_slice().first());
    let config = engine.config();
    let mut body = match d {
        Some(d) => decision_json(d),
        // The store failed and on_error = "allow" admitted it undecided.
        None => json!({"allowed": true, "policy": pc.name(), "limit": pc.policy.quota().limit(),
            "remaining": null, "reset": null, "retry_after": null, "delay": null}),
    };
    if let Some(obj) = body.as_object_mut() {
        obj.insert("action".into(), Value::from(pc.action.as_str()));
        if eval.fail_open {
            obj.insert("fail_open".into(), Value::from(true));
        }
    }
    let status = if eval.enforced.allowed() {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    let mut res = json_response(status, &body);
    rate_limit_headers(res.headers_mut(), &eval.enforced, config, &config.headers);
    res
}

async fn check_by_attributes(
    engine: &Engine,
    obj: &serde_json::Map<String, Value>,
) -> Response<Body> {
    let method = match obj.get("method") {
        None | Some(Value::Null) => "GET".to_owned(),
        Some(Value::String(m)) => m.to_ascii_uppercase(),
        Some(_) => return bad_request("\"method\" must be a string"),
    };
    let Some(target) = obj.get("path").and_then(Value::as_str) else {
        return bad_request(
            "send {\"policy\", \"key\", \"cost\"} or request attributes with at least \"path\"",
        );
    };
    let host = match obj.get("host") {
        None | Some(Value::Null) => None,
        Some(Value::String(h)) => Some(h.as_str()),
        Some(_) => return bad_request("\"host\" must be a string"),
    };
    let mut headers = HeaderMap::new();
    match obj.get("headers") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (k, v) in map {
                let Some(v) = v.as_str() else {
                    return bad_request("\"headers\" values must be strings");
                };
                let (Ok(name), Ok(value)) = (
                    HeaderName::from_bytes(k.as_bytes()),
                    HeaderValue::from_str(v),
                ) else {
                    return bad_request("\"headers\" holds an invalid header name or value");
                };
                headers.append(name, value);
            }
        }
        Some(_) => return bad_request("\"headers\" must be an object of strings"),
    }
    let ip = match obj.get("ip") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => match s.parse::<IpAddr>() {
            Ok(ip) => Some(ip),
            Err(_) => return bad_request("\"ip\" is not an IP address"),
        },
        Some(_) => return bad_request("\"ip\" must be a string"),
    };
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    let view = RequestView {
        method: &method,
        path,
        query,
        host,
        headers: &headers,
        ip,
    };
    let eval = match engine.evaluate(&view).await {
        Ok(e) => e,
        Err(e) => return internal(&e),
    };
    if let Some(policy) = &eval.missing_key {
        return missing_key(policy);
    }
    let config = engine.config();
    let top = eval.enforced.most_restrictive();
    let mut body = match top {
        Some(d) => decision_json(d),
        None => json!({"policy": null, "limit": null, "remaining": null, "reset": null,
            "retry_after": null, "delay": null}),
    };
    if let Some(o) = body.as_object_mut() {
        o.insert("allowed".into(), Value::from(eval.allowed()));
        o.insert(
            "retry_after".into(),
            json!(crate::response::retry_after_secs(&eval.enforced).filter(|_| !eval.allowed())),
        );
        o.insert(
            "decisions".into(),
            Value::from(
                eval.enforced
                    .as_slice()
                    .iter()
                    .map(decision_json)
                    .collect::<Vec<_>>(),
            ),
        );
        o.insert(
            "shadow".into(),
            Value::from(
                eval.shadow
                    .as_slice()
                    .iter()
                    .map(decision_json)
                    .collect::<Vec<_>>(),
            ),
        );
        o.insert("fail_open".into(), Value::from(eval.fail_open));
    }
    let status = if eval.allowed() {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    let mut res = json_response(status, &body);
    rate_limit_headers(res.headers_mut(), &eval.enforced, config, &config.headers);
    res
}

async fn forward_auth(engine: &Engine, peer: SocketAddr, req: Request<Incoming>) -> Response<Body> {
    let h = req.headers();
    let get = |name: &str| h.get(name).and_then(|v| v.to_str().ok());
    let method = get("x-forwarded-method")
        .map(str::to_ascii_uppercase)
        .unwrap_or_else(|| req.method().as_str().to_owned());
    let uri = get("x-forwarded-uri")
        .or_else(|| get("x-original-uri"))
        .unwrap_or("/");
    let (path, query) = match uri.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (uri, None),
    };
    let host = get("x-forwarded-host").or_else(|| get("host"));
    // The caller is the proxy itself: its X-Forwarded-For is the client, walked right to left
    // past any further trusted proxies.
    let mut trusted = engine
        .config()
        .proxy
        .as_ref()
        .map(|p| p.trusted_proxies.clone())
        .unwrap_or_default();
    trusted.push(crate::matcher::Cidr::from_ip(peer.ip()));
    let ip = client_ip(peer.ip(), h, &trusted);
    let view = RequestView {
        method: &method,
        path,
        query,
        host,
        headers: h,
        ip: Some(ip),
    };
    let eval: Evaluation = match engine.evaluate(&view).await {
        Ok(e) => e,
        Err(e) => return internal(&e),
    };
    let config = engine.config();
    if let Some(policy) = &eval.missing_key {
        return missing_key(policy);
    }
    if !eval.allowed() {
        return too_many_requests(&eval, config);
    }
    if let Some(d) = eval.delay() {
        tokio::time::sleep(d).await;
    }
    let mut res = Response::new(crate::response::full(Bytes::new()));
    rate_limit_headers(res.headers_mut(), &eval.enforced, config, &config.headers);
    res
}
