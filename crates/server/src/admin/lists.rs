//! `/v1/lists`: the allow and deny lists of the running configuration, with their live entries,
//! and changes to the live entries.
//!
//! - `GET /v1/lists` (and `GET /v1/lists/{name}`): each list's action, configured entries and
//!   live entries (reason, expiry).
//! - `PUT /v1/lists/{name}/entries/{entry}` with `{"reason": "...", "expires": "..."}`: adds
//!   an entry (a network or address, or a key as `/v1/top` shows it; percent-encoded), for
//!   every instance when the store is Redis. `reason` is required; `expires` is an RFC 3339
//!   time or a duration from now (`"2h"`), in the future.
//! - `DELETE /v1/lists/{name}/entries/{entry}` removes one (its reason, optional, from the
//!   body or `?reason=`).
//!
//! Every change is logged with its reason; each list holds at most
//! [`MAX_LIVE_ENTRIES`](registry::MAX_LIVE_ENTRIES) live entries.

pub(crate) mod registry;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Map, Value, json};
use tollgate_http::{ListEntry, ListSpec};

use crate::Shared;
use crate::admin::fields::{bad_field, decode, expiry, form_urlencoded_value, rfc3339};
use crate::admin::top::{unix_now, unix_secs};
use crate::response::{Body, full, json_response, problem};
use registry::{ChangeError, Record};

/// The longest reason accepted, in bytes.
const MAX_REASON: usize = 500;

/// A refusal, boxed: the answer is large and the success path should not carry it.
type Refused = Box<Response<Body>>;

/// `/v1/lists...`: `rest` is what follows `/v1/lists`.
pub(crate) async fn handle(shared: &Shared, rest: &str, req: Request<Incoming>) -> Response<Body> {
    let rest = rest.strip_prefix('/').unwrap_or(rest);
    let (name, tail) = match rest.split_once('/') {
        Some((n, t)) => (n, Some(t)),
        None => (rest, None),
    };
    let name = match (!name.is_empty()).then(|| decode("list", name)).transpose() {
        Ok(n) => n,
        Err(bad) => return bad.response(),
    };
    let entry = match tail {
        None => None,
        Some(t) => match t.strip_prefix("entries/") {
            // The entry may come percent-encoded or with its slash as it is.
            Some(e) => match decode("entry", e) {
                Ok(e) => Some(e),
                Err(bad) => return bad.response(),
            },
            None => return usage(),
        },
    };
    let method = req.method().clone();
    match (&method, name, entry) {
        (&Method::GET | &Method::HEAD, name, None) => list(shared, name.as_deref()),
        (&Method::PUT, Some(name), Some(entry)) => put(shared, name, entry, req).await,
        (&Method::DELETE, Some(name), Some(entry)) => delete(shared, name, entry, req).await,
        _ => usage(),
    }
}

fn usage() -> Response<Body> {
    problem(
        StatusCode::METHOD_NOT_ALLOWED,
        "Method Not Allowed",
        Some("GET /v1/lists[/{name}], PUT or DELETE /v1/lists/{name}/entries/{entry}"),
    )
}

fn unknown_list(name: &str) -> Response<Body> {
    problem(
        StatusCode::NOT_FOUND,
        "Unknown list",
        Some(&format!(
            "no list named {:?} in the running configuration; lists are declared with [[list]]",
            name.chars().take(128).collect::<String>()
        )),
    )
}

fn spec(shared: &Shared, name: &str) -> Option<ListSpec> {
    shared
        .engine()
        .config()
        .lists
        .iter()
        .find(|l| l.name == name)
        .cloned()
}

fn record_json(r: &Record) -> Value {
    json!({
        "entry": r.entry,
        "reason": r.reason,
        "expires": r.expires.map_or(Value::Null, rfc3339),
        "updated": rfc3339(r.updated),
    })
}

fn list(shared: &Shared, name: Option<&str>) -> Response<Body> {
    let engine = shared.engine();
    let live = shared.lists.list(unix_secs());
    let json_of = |spec: &ListSpec| {
        let mine: Vec<Value> = live
            .iter()
            .filter(|r| r.list == spec.name)
            .map(record_json)
            .collect();
        json!({
            "name": spec.name,
            "action": spec.action.as_str(),
            "entries": spec.entries.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "live": mine,
        })
    };
    if let Some(name) = name {
        return match engine.config().lists.iter().find(|l| l.name == name) {
            Some(spec) => json_response(StatusCode::OK, &json_of(spec)),
            None => unknown_list(name),
        };
    }
    let lists: Vec<Value> = engine.config().lists.iter().map(json_of).collect();
    // Live entries of a list the running configuration no longer has: kept, not applied.
    let inactive: Vec<Value> = live
        .iter()
        .filter(|r| !engine.config().lists.iter().any(|l| l.name == r.list))
        .map(|r| {
            let mut v = record_json(r);
            if let Some(o) = v.as_object_mut() {
                o.insert("list".into(), Value::from(r.list.clone()));
            }
            v
        })
        .collect();
    json_response(
        StatusCode::OK,
        &json!({ "shared": super::keeping(shared, shared.lists.shared()), "lists": lists, "inactive": inactive }),
    )
}

/// The body as a JSON object (an empty body is an empty object).
async fn body_object(
    shared: &Shared,
    req: Request<Incoming>,
) -> Result<Map<String, Value>, Refused> {
    let within = shared.engine().config().limits.header_read_timeout;
    let example = "{\"reason\": \"...\", \"expires\": \"2030-01-01T00:00:00Z\"}";
    match super::fields::json_object(req, within, example).await {
        Ok(obj) => Ok(obj.unwrap_or_default()),
        Err(res) => Err(Box::new(res)),
    }
}

/// `reason`: a string of at most 500 bytes without control characters (`None` when absent).
fn reason(obj: &Map<String, Value>) -> Result<Option<String>, Refused> {
    match obj.get("reason") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => {
            let text = text.trim();
            if text.len() > MAX_REASON || text.chars().any(char::is_control) {
                return Err(Box::new(bad_field(
                    "reason",
                    "must be at most 500 bytes, without control characters",
                )));
            }
            Ok((!text.is_empty()).then(|| text.to_owned()))
        }
        Some(_) => Err(Box::new(bad_field("reason", "must be a string"))),
    }
}

/// The entry as the lists keep it, or the 400 that says why it cannot be one.
fn parse_entry(shared: &Shared, text: &str) -> Result<ListEntry, Refused> {
    let entry = ListEntry::parse(text).map_err(|e| {
        Box::new(bad_field(
            "entry",
            &format!("{:?}: {}", e.input(), e.reason()),
        ))
    })?;
    shared
        .engine()
        .http()
        .list_entry_readable(&entry)
        .map_err(|reason| Box::new(bad_field("entry", &reason)))?;
    Ok(entry)
}

async fn put(
    shared: &Shared,
    name: String,
    entry: String,
    req: Request<Incoming>,
) -> Response<Body> {
    if spec(shared, &name).is_none() {
        return unknown_list(&name);
    }
    let entry = match parse_entry(shared, &entry) {
        Ok(e) => e,
        Err(res) => return *res,
    };
    let obj = match body_object(shared, req).await {
        Ok(o) => o,
        Err(res) => return *res,
    };
    if let Some(other) = obj
        .keys()
        .find(|k| !matches!(k.as_str(), "reason" | "expires"))
    {
        return bad_field(other, "unknown field; use reason and expires");
    }
    let exact = unix_now();
    let now = exact.as_secs();
    let reason = match reason(&obj) {
        Ok(Some(r)) => r,
        Ok(None) => {
            return bad_field(
                "reason",
                "say why (it is logged with the change), like \"credential stuffing from this range\"",
            );
        }
        Err(res) => return *res,
    };
    let expires = match obj.get("expires") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => match expiry(text, exact) {
            Ok(at) => Some(at),
            Err(bad) => return bad.response(),
        },
        Some(_) => return bad_field("expires", "must be a string"),
    };
    let record = Record {
        list: name,
        entry: entry.to_string(),
        reason,
        expires,
        updated: now,
    };
    match shared.lists.put(record.clone(), || shared.engine()).await {
        Ok(existed) => {
            tracing::info!(
                list = %record.list,
                entry = %record.entry,
                expires = ?record.expires.map(rfc3339),
                reason = %record.reason,
                "list entry set"
            );
            let status = if existed {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            };
            let mut v = record_json(&record);
            if let Some(o) = v.as_object_mut() {
                o.insert("list".into(), Value::from(record.list.clone()));
            }
            json_response(status, &v)
        }
        Err(e) => change_failed(&e),
    }
}

async fn delete(
    shared: &Shared,
    name: String,
    entry: String,
    req: Request<Incoming>,
) -> Response<Body> {
    let known = spec(shared, &name).is_some()
        || shared
            .lists
            .list(unix_secs())
            .iter()
            .any(|r| r.list == name);
    if !known {
        return unknown_list(&name);
    }
    // Removed as it was written: its canonical form when it parses, else as given.
    let text = ListEntry::parse(&entry).map_or_else(|_| entry.clone(), |e| e.to_string());
    let from_query = req
        .uri()
        .query()
        .and_then(|q| form_urlencoded_value(q, "reason"));
    let obj = match body_object(shared, req).await {
        Ok(o) => o,
        Err(res) => return *res,
    };
    let reason = match reason(&obj) {
        Ok(r) => r.or(from_query),
        Err(res) => return *res,
    };
    let mut deleted = shared.lists.delete(&name, &text, || shared.engine()).await;
    // An IPv4-mapped entry kept before such entries were kept as their IPv4 form.
    if let (Ok(false), Ok(cidr)) = (&deleted, entry.parse::<tollgate_http::Cidr>())
        && cidr.to_string() != text
    {
        deleted = shared
            .lists
            .delete(&name, &cidr.to_string(), || shared.engine())
            .await;
    }
    match deleted {
        Ok(true) => {
            tracing::info!(
                list = %name,
                entry = %text,
                reason = %reason.as_deref().unwrap_or("(none given)"),
                "list entry removed"
            );
            let mut res = Response::new(full(""));
            *res.status_mut() = StatusCode::NO_CONTENT;
            res
        }
        Ok(false) => problem(
            StatusCode::NOT_FOUND,
            "No such entry",
            Some(
                "this list has no live entry of that name (configured entries change with the configuration)",
            ),
        ),
        Err(e) => change_failed(&e),
    }
}

fn change_failed(e: &ChangeError) -> Response<Body> {
    match e {
        ChangeError::Full(_) => problem(StatusCode::CONFLICT, "List full", Some(&e.to_string())),
        ChangeError::Store(error) => {
            tracing::warn!(%error, "a list entry could not be stored");
            problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "Store unavailable",
                Some("the list entry could not be stored; nothing changed; retry shortly"),
            )
        }
    }
}
