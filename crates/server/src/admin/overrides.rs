//! `PUT|GET|DELETE /v1/overrides/{policy}/{key}` on the admin listener: per-key quotas in
//! place of a policy's own, with an optional expiry and a reason; `GET /v1/overrides` (and
//! `/v1/overrides/{policy}`) lists them.
//!
//! `{key}` is the key as the store sees it and `/v1/top` lists it (`ip:203.0.113.9`,
//! `header:x-api-key:<hash>`, `user:42`, or a `/v1/check` key as given), percent-encoded where
//! needed; it may contain `/`. The body is
//! `{"limit": 1000, "window": "1h", "expires": "2030-01-01T00:00:00Z", "reason": "..."}`, with
//! the policy's algorithm's own fields (`capacity`/`refill`, `rate`/`queue`); fields left out
//! keep the policy's values. `expires` is an RFC 3339 time or a duration from now (`"2h"`).

pub(crate) mod registry;

use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Map, Value, json};
use tollgate::parse_duration;
use tollgate_http::OverrideError;

use crate::Shared;
use crate::admin::fields::{BadField, bad_field, decode, expiry, form_urlencoded_value, rfc3339};
use crate::admin::top::{unix_now, unix_secs};
use crate::response::{Body, full, json_response, problem};
use registry::{ChangeError, Record};

/// The longest reason accepted, in bytes.
const MAX_REASON: usize = 500;

fn unknown_policy(name: &str) -> Response<Body> {
    problem(
        StatusCode::NOT_FOUND,
        "Unknown policy",
        Some(&format!(
            "no policy named {:?} in the running configuration",
            name.chars().take(128).collect::<String>()
        )),
    )
}

/// `/v1/overrides...`: `rest` is what follows `/v1/overrides`.
pub(crate) async fn handle(shared: &Shared, rest: &str, req: Request<Incoming>) -> Response<Body> {
    let mut parts = rest.strip_prefix('/').unwrap_or(rest).splitn(2, '/');
    let policy = parts.next().filter(|p| !p.is_empty());
    let key = parts.next();
    let policy = match policy.map(|p| decode("policy", p)).transpose() {
        Ok(p) => p,
        Err(bad) => return bad.response(),
    };
    let key = match key.map(|k| decode("key", k)).transpose() {
        Ok(k) => k,
        Err(bad) => return bad.response(),
    };
    let method = req.method().clone();
    match (&method, policy, key) {
        (&Method::GET | &Method::HEAD, policy, key) => list(shared, policy, key),
        (&Method::PUT, Some(policy), Some(key)) => put(shared, policy, key, req).await,
        (&Method::DELETE, Some(policy), Some(key)) => {
            let reason = req.uri().query().and_then(|q| {
                form_urlencoded_value(q, "reason")
                    .map(|r| r.chars().take(MAX_REASON).collect::<String>())
            });
            delete(shared, policy, key, reason).await
        }
        _ => problem(
            StatusCode::METHOD_NOT_ALLOWED,
            "Method Not Allowed",
            Some(
                "GET /v1/overrides[/{policy}[/{key}]], PUT or DELETE /v1/overrides/{policy}/{key}",
            ),
        ),
    }
}

fn list(shared: &Shared, policy: Option<String>, key: Option<String>) -> Response<Body> {
    let engine = shared.engine();
    if let Some(p) = &policy
        && engine.policy(p).is_none()
    {
        return unknown_policy(p);
    }
    let now = unix_secs();
    let items: Vec<Value> = shared
        .overrides
        .list(now)
        .into_iter()
        .filter(|(r, _)| policy.as_ref().is_none_or(|p| *p == r.policy))
        .filter(|(r, _)| key.as_ref().is_none_or(|k| *k == r.key))
        .map(|(r, inactive)| record_json(&engine, &r, inactive))
        .collect();
    if key.is_some() {
        return match items.into_iter().next() {
            Some(item) => json_response(StatusCode::OK, &item),
            None => problem(
                StatusCode::NOT_FOUND,
                "No such override",
                Some("this key has no override under this policy"),
            ),
        };
    }
    json_response(
        StatusCode::OK,
        &json!({ "shared": super::keeping(shared, shared.overrides.shared()), "overrides": items }),
    )
}

/// One override as the API shows it: its fields, the quota it makes under the running
/// configuration, and whether it applies.
pub(crate) fn record_json(
    engine: &crate::generation::Generation,
    r: &Record,
    inactive: Option<String>,
) -> Value {
    let quota = r
        .fields()
        .ok()
        .and_then(|f| {
            engine
                .http()
                .compile_override(&r.policy, &f, r.expires_at())
                .ok()
        })
        .map(|o| o.policy().quota().clone());
    let mut v = json!({
        "policy": r.policy,
        "key": r.key,
        "quota": quota.as_ref().map(ToString::to_string),
        "effective_limit": quota.as_ref().map(tollgate::Quota::limit),
        "effective_window_seconds": quota.as_ref().map(|q| q.window().as_secs_f64()),
        "expires": r.expires.map_or(Value::Null, rfc3339),
        "reason": r.reason,
        "updated": rfc3339(r.updated),
        "active": inactive.is_none(),
    });
    if let Some(o) = v.as_object_mut() {
        for (name, value) in [
            ("limit", r.limit.map(Value::from)),
            ("window", r.window.clone().map(Value::from)),
            ("calendar", r.calendar.clone().map(Value::from)),
            ("capacity", r.capacity.map(Value::from)),
            ("refill", r.refill.clone().map(Value::from)),
            ("rate", r.rate.clone().map(Value::from)),
            ("queue", r.queue.map(Value::from)),
            ("inactive_reason", inactive.map(Value::from)),
        ] {
            if let Some(value) = value {
                o.insert(name.into(), value);
            }
        }
    }
    v
}

async fn put(
    shared: &Shared,
    policy: String,
    key: String,
    req: Request<Incoming>,
) -> Response<Body> {
    let within = shared.engine().config().limits.header_read_timeout;
    let example = "{\"limit\": 1000, \"window\": \"1h\", \"reason\": \"...\"}";
    let obj = match super::fields::json_object(req, within, example).await {
        Ok(Some(obj)) => obj,
        Ok(None) => return bad_field("body", &format!("expected a JSON object like {example}")),
        Err(res) => return res,
    };
    let exact = unix_now();
    let now = exact.as_secs();
    let record = match parse_record(policy, key, &obj, exact) {
        Ok(r) => r,
        Err(bad) => return bad.response(),
    };
    let engine = shared.engine();
    // Checked against the running configuration before it is stored.
    let fields = match record.fields() {
        Ok(f) => f,
        Err(e) => return override_error(&record.policy, e),
    };
    let quota = match engine
        .http()
        .compile_override(&record.policy, &fields, record.expires_at())
    {
        Ok(o) => o.policy().quota().clone(),
        Err(e) => return override_error(&record.policy, e),
    };
    let existed = shared
        .overrides
        .list(now)
        .iter()
        .any(|(r, _)| r.policy == record.policy && r.key == record.key);
    if let Err(e) = shared
        .overrides
        .put(record.clone(), || shared.engine())
        .await
    {
        return change_failed(&e);
    }
    tracing::info!(
        policy = %record.policy,
        key = ?record.key,
        quota = %quota,
        expires = %record
            .expires
            .and_then(|t| i64::try_from(t).ok())
            .and_then(crate::admin::fields::rfc3339_text)
            .unwrap_or_else(|| "never".to_owned()),
        reason = ?record.reason,
        "override set"
    );
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    json_response(status, &record_json(&shared.engine(), &record, None))
}

async fn delete(
    shared: &Shared,
    policy: String,
    key: String,
    reason: Option<String>,
) -> Response<Body> {
    if shared.engine().policy(&policy).is_none()
        && !shared
            .overrides
            .list(unix_secs())
            .iter()
            .any(|(r, _)| r.policy == policy)
    {
        return unknown_policy(&policy);
    }
    match shared
        .overrides
        .delete(&policy, &key, || shared.engine())
        .await
    {
        Ok(true) => {
            tracing::info!(
                policy = %policy,
                key = ?key,
                reason = ?reason.as_deref().unwrap_or("(none given)"),
                "override removed"
            );
            let mut res = Response::new(full(""));
            *res.status_mut() = StatusCode::NO_CONTENT;
            res
        }
        Ok(false) => problem(
            StatusCode::NOT_FOUND,
            "No such override",
            Some("this key has no override under this policy"),
        ),
        Err(e) => change_failed(&e),
    }
}

fn override_error(policy: &str, e: OverrideError) -> Response<Body> {
    match e {
        OverrideError::UnknownPolicy => unknown_policy(policy),
        OverrideError::Field { field, reason } => bad_field(field, &reason),
    }
}

fn change_failed(e: &ChangeError) -> Response<Body> {
    match e {
        ChangeError::Full => problem(
            StatusCode::CONFLICT,
            "Too many overrides",
            Some(&e.to_string()),
        ),
        ChangeError::Store(error) => {
            tracing::warn!(%error, "an override could not be stored");
            problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "Store unavailable",
                Some("the override could not be stored; nothing changed; retry shortly"),
            )
        }
    }
}

/// The body's fields, each checked for its type; unknown fields are refused by name.
fn parse_record(
    policy: String,
    key: String,
    obj: &Map<String, Value>,
    exact: Duration,
) -> Result<Record, BadField> {
    let now = exact.as_secs();
    let mut record = Record {
        policy,
        key,
        limit: None,
        window: None,
        calendar: None,
        capacity: None,
        refill: None,
        rate: None,
        queue: None,
        expires: None,
        reason: String::new(),
        updated: now,
    };
    for (name, value) in obj {
        if value.is_null() {
            continue;
        }
        match name.as_str() {
            "limit" => record.limit = Some(count(name, value, 1)?),
            "capacity" => record.capacity = Some(count(name, value, 1)?),
            "queue" => record.queue = Some(count(name, value, 0)?),
            "window" => {
                let text = string(name, value)?;
                parse_duration(&text).map_err(|e| BadField::new(name, e.reason()))?;
                record.window = Some(text);
            }
            "calendar" => {
                let text = string(name, value)?;
                text.parse::<tollgate::CalendarUnit>()
                    .map_err(|e| BadField::new(name, e.reason()))?;
                record.calendar = Some(text);
            }
            "refill" | "rate" => {
                let text = string(name, value)?;
                text.parse::<tollgate::Rate>()
                    .map_err(|e| BadField::new(name, e.reason()))?;
                if name == "refill" {
                    record.refill = Some(text);
                } else {
                    record.rate = Some(text);
                }
            }
            "expires" => {
                record.expires = Some(expiry(&string(name, value)?, exact)?);
            }
            "reason" => {
                let text = string(name, value)?;
                let text = text.trim();
                if text.len() > MAX_REASON || text.chars().any(char::is_control) {
                    return Err(BadField::new(
                        name,
                        "must be at most 500 bytes, without control characters",
                    ));
                }
                record.reason = text.to_owned();
            }
            other => {
                return Err(BadField::new(
                    other,
                    "unknown field; use limit and window (or capacity and refill, rate and queue), \
                     expires and reason",
                ));
            }
        }
    }
    if record.reason.is_empty() {
        return Err(BadField::new(
            "reason",
            "say why (it is logged with the change), like \"incident 42: customer needs more\"",
        ));
    }
    Ok(record)
}

fn count(name: &str, value: &Value, min: u64) -> Result<u32, BadField> {
    value
        .as_u64()
        .filter(|&n| n >= min)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| {
            BadField::new(
                name,
                format!("must be a whole number from {min} to 4294967295"),
            )
        })
}

fn string(name: &str, value: &Value) -> Result<String, BadField> {
    value
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| BadField::new(name, "must be a string"))
}

#[cfg(test)]
#[path = "overrides_tests.rs"]
mod tests;
