//! The admin listener: `/metrics` (Prometheus text), `/healthz`, `/readyz` (store reachable),
//! `/v1/policies`, and the queues' dead letters under `/v1/queues` (`admin/queue.rs`), behind an
//! optional bearer token.

mod queue;

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use tollgate::Quota;

use crate::Shared;
use crate::config::PolicyConfig;
use crate::response::{Body, json_response, problem, text};

pub(crate) async fn handle(
    shared: Arc<Shared>,
    _peer: SocketAddr,
    req: Request<Incoming>,
) -> Response<Body> {
    let engine = shared.engine();
    if let Some(token) = &engine.config().admin_token {
        let given = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes())) {
            let mut res = problem(
                StatusCode::UNAUTHORIZED,
                "Unauthorized",
                Some("the admin endpoints need Authorization: Bearer <[admin] token>"),
            );
            res.headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return res;
        }
    }
    let path = req.uri().path();
    if path == "/v1/queues" || path.starts_with("/v1/queues/") {
        return queue::handle(&shared, req.method(), path, req.uri().query()).await;
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return problem(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed", None);
    }
    match req.uri().path() {
        "/metrics" => {
            let mut res = text(
                StatusCode::OK,
                shared
                    .metrics
                    .render(engine.store().keys_tracked(), engine.store().redis_stats()),
            );
            res.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            res
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" => match engine.store().ready().await {
            Ok(()) => text(StatusCode::OK, "ready\n"),
            Err(e) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("store unreachable: {e}\n"),
            ),
        },
        "/v1/policies" => {
            let list: Vec<Value> = engine.config().policies.iter().map(policy_json).collect();
            json_response(StatusCode::OK, &json!({ "policies": list }))
        }
        _ => problem(
            StatusCode::NOT_FOUND,
            "Not found",
            Some("admin serves /metrics, /healthz, /readyz, /v1/policies and /v1/queues"),
        ),
    }
}

fn policy_json(p: &PolicyConfig) -> Value {
    let q = p.policy.quota();
    let mut v = json!({
        "name": p.name(),
        "algorithm": q.kind().as_str(),
        "quota": q.to_string(),
        "limit": q.limit(),
        "window_seconds": q.window().as_secs_f64(),
        "key": p.keys.selectors().iter().map(ToString::to_string).collect::<Vec<_>>(),
        "match": {
            "path": p.route.path_pattern().map_or_else(|| "/**".to_owned(), ToString::to_string),
            "methods": p.route.method_list().iter().map(|m| m.as_str()).collect::<Vec<_>>(),
            "host": p.route.host_pattern().map(ToString::to_string),
        },
        "cost": p.cost,
        "action": p.action.as_str(),
        "require_key": p.require_key,
    });
    if let (Some(o), Quota::LeakyBucket(lb)) = (v.as_object_mut(), q) {
        o.insert(
            "max_delay_seconds".into(),
            json!(lb.max_delay().map(|d| d.as_secs_f64())),
        );
    }
    if let (Some(o), Some(s)) = (v.as_object_mut(), &p.queue) {
        o.insert(
            "queue".into(),
            json!({
                "max_body": s.max_body,
                "max_depth": s.max_depth,
                "attempts": s.attempts,
                "backoff_seconds": s.backoff.as_secs_f64(),
                "claim_after_seconds": s.claim_after.as_secs_f64(),
                "concurrency": s.concurrency,
            }),
        );
    }
    v
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
