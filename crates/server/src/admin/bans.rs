//! `/v1/bans`: the lockouts in force, and lifting one.
//!
//! - `GET /v1/bans`: every ban in the store (with Redis, every instance's), each with its
//!   policy, the key as `/v1/top` shows it, when it began and ends, and the denials counted.
//! - `DELETE /v1/bans/{policy}/{key}` (percent-encoded key; `?reason=` or a JSON body's
//!   `reason`, logged): lifts it at once, on every instance sharing the store; 404 when the key
//!   is not banned.

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use tollgate::{BanRecord, Clock, Store, SystemClock};

use crate::Shared;
use crate::admin::fields::{bad_field, decode, form_urlencoded_value, rfc3339_millis};
use crate::response::{Body, full, json_response, problem};

/// `/v1/bans...`: `rest` is what follows `/v1/bans`.
pub(crate) async fn handle(shared: &Shared, rest: &str, req: Request<Incoming>) -> Response<Body> {
    let rest = rest.strip_prefix('/').unwrap_or(rest);
    let method = req.method().clone();
    if rest.is_empty() {
        return match method {
            Method::GET | Method::HEAD => list(shared).await,
            _ => usage(),
        };
    }
    let Some((policy, key)) = rest.split_once('/') else {
        return usage();
    };
    let policy = match decode("policy", policy) {
        Ok(p) => p,
        Err(bad) => return bad.response(),
    };
    let key = match decode("key", key) {
        Ok(k) => k,
        Err(bad) => return bad.response(),
    };
    match method {
        Method::DELETE => lift(shared, &policy, &key, req).await,
        _ => usage(),
    }
}

fn usage() -> Response<Body> {
    problem(
        StatusCode::METHOD_NOT_ALLOWED,
        "Method Not Allowed",
        Some("GET /v1/bans, DELETE /v1/bans/{policy}/{key}"),
    )
}

/// One ban as the API shows it.
pub(crate) fn ban_json(b: &BanRecord) -> Value {
    json!({
        "policy": b.policy,
        "key": crate::admin::key_text(&b.key),
        "since": rfc3339_millis(b.since.as_micros()),
        "until": rfc3339_millis(b.until.as_micros()),
        "denials": b.denials,
    })
}

async fn list(shared: &Shared) -> Response<Body> {
    let now = SystemClock::new().now();
    match shared.store.bans(now).await {
        Ok(mut bans) => {
            bans.sort_by(|a, b| (&a.policy, a.until).cmp(&(&b.policy, b.until)));
            let items: Vec<Value> = bans.iter().map(ban_json).collect();
            json_response(StatusCode::OK, &json!({ "bans": items }))
        }
        Err(error) => {
            tracing::warn!(%error, "the bans could not be read from the store");
            problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "Store unavailable",
                Some("the bans could not be read; retry shortly"),
            )
        }
    }
}

async fn lift(shared: &Shared, policy: &str, key: &str, req: Request<Incoming>) -> Response<Body> {
    let from_query = req
        .uri()
        .query()
        .and_then(|q| form_urlencoded_value(q, "reason"));
    let within = shared.engine().config().limits.header_read_timeout;
    let example = "{\"reason\": \"...\"}";
    let from_body = match super::fields::json_object(req, within, example).await {
        Ok(None) => None,
        Ok(Some(o)) => match o.get("reason") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.trim().chars().take(500).collect::<String>()),
            Some(_) => return bad_field("reason", "must be a string"),
        },
        Err(res) => return res,
    };
    let reason = from_body.or(from_query);
    let now = SystemClock::new().now();
    match shared.store.lift_ban(now, policy, key.as_bytes()).await {
        Ok(true) => {
            tracing::info!(
                policy = %policy,
                key = %key,
                reason = %reason.as_deref().unwrap_or("(none given)"),
                "ban lifted"
            );
            let mut res = Response::new(full(""));
            *res.status_mut() = StatusCode::NO_CONTENT;
            res
        }
        Ok(false) => problem(
            StatusCode::NOT_FOUND,
            "No such ban",
            Some("this key is not banned under this policy"),
        ),
        Err(error) => {
            tracing::warn!(%error, "a ban could not be lifted");
            problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "Store unavailable",
                Some("the ban could not be lifted; nothing changed; retry shortly"),
            )
        }
    }
}
