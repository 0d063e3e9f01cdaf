//! The admin listener: `/metrics` (Prometheus text), `/healthz`, `/readyz` (store reachable),
//! `/v1/policies`, the live operations (`/v1/top`, `/v1/overrides`, `/v1/stats`), the dashboard
//! at `/`, and the queues' dead letters under `/v1/queues` (`admin/queue.rs`), behind an optional
//! bearer token.

mod bans;
mod dashboard;
pub(crate) mod fields;
pub(crate) mod lists;
pub(crate) mod overrides;
mod queue;
pub(crate) mod top;

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use tollgate::Quota;

use crate::Shared;
use crate::config::PolicyConfig;
use crate::generation::Generation;
use crate::response::{Body, json_response, problem, text};

pub(crate) async fn handle(
    shared: Arc<Shared>,
    _peer: SocketAddr,
    req: Request<Incoming>,
) -> Response<Body> {
    let read = req.method() == Method::GET || req.method() == Method::HEAD;
    // The page and its script hold no data: served without the token, which the page asks
    // for and sends with each of its own requests (a browser cannot add it to a navigation).
    if read && let Some(asset) = dashboard::asset(req.uri().path()) {
        return asset;
    }
    let engine = shared.engine();
    // Liveness and readiness carry no data: open to probes (Kubernetes' cannot send a secret
    // header without writing it into the manifest).
    match (read, req.uri().path()) {
        (true, "/healthz") => return text(StatusCode::OK, "ok\n"),
        (true, "/readyz") => return readiness(&shared, &engine).await,
        _ => {}
    }
    if let Some(refused) = authorize(&engine, &req, read) {
        return refused;
    }
    let path = req.uri().path().to_owned();
    if path == "/v1/queues" || path.starts_with("/v1/queues/") {
        return queue::handle(&shared, req.method(), &path, req.uri().query()).await;
    }
    if let Some(rest) = path.strip_prefix("/v1/overrides")
        && (rest.is_empty() || rest.starts_with('/'))
    {
        return overrides::handle(&shared, rest, req).await;
    }
    if let Some(rest) = path.strip_prefix("/v1/bans")
        && (rest.is_empty() || rest.starts_with('/'))
    {
        return bans::handle(&shared, rest, req).await;
    }
    if let Some(rest) = path.strip_prefix("/v1/lists")
        && (rest.is_empty() || rest.starts_with('/'))
    {
        return lists::handle(&shared, rest, req).await;
    }
    if !read {
        let mut res = problem(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed", None);
        res.headers_mut()
            .insert(hyper::header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return res;
    }
    match path.as_str() {
        "/metrics" => {
            let mut body = shared.metrics.render(
                engine.store().keys_tracked(),
                engine.store().redis_stats(),
                &engine.store().lease_stats(),
            );
            crate::metrics::render_usage_fallbacks(&mut body, engine.http().usage_fallbacks());
            crate::metrics::render_slots(&mut body, engine.http().slot_counts());
            crate::metrics::render_bans_active(&mut body, &engine.store().ban_counts().await);
            crate::metrics::render_certificates(&mut body, &shared.certificates);
            let mut res = text(StatusCode::OK, body);
            res.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            res
        }
        "/v1/policies" => policies_response(&shared, &engine),
        "/v1/top" => top_response(&shared, &engine, req.uri().query().unwrap_or("")),
        "/v1/stats" => stats(&shared, &engine).await,
        _ => problem(
            StatusCode::NOT_FOUND,
            "Not Found",
            Some(
                "admin serves /metrics, /healthz, /readyz, /v1/policies, /v1/top, /v1/overrides, \
                 /v1/bans, /v1/lists, /v1/stats, /v1/queues and the dashboard at /",
            ),
        ),
    }
}

/// The credentials of an `Authorization: Bearer <token>` value. The scheme is matched without
/// regard to case and may be followed by several spaces, as RFC 9110 §11.4 has it.
fn bearer(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim_start_matches(' '))
}

/// The admin token check: `Some(refusal)` when the request may not go on. With a token, every
/// request that reaches here must carry it (the probes and the dashboard's assets are answered
/// before); without one, writes are refused unless the admin listener is loopback-only.
fn authorize(engine: &Generation, req: &Request<Incoming>, read: bool) -> Option<Response<Body>> {
    if let Some(token) = &engine.config().admin_token {
        let given = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(bearer);
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes())) {
            let mut res = problem(
                StatusCode::UNAUTHORIZED,
                "Unauthorized",
                Some("the admin endpoints need Authorization: Bearer <[admin] token>"),
            );
            res.headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return Some(res);
        }
    } else if !read && !own_host(req, engine.config().admin_listen) {
        // Without a token, a write is taken only from a client that named this listener (or
        // localhost): a web page that got a browser to resolve its own name to this address
        // (DNS rebinding) names its own host, and is refused.
        return Some(problem(
            StatusCode::FORBIDDEN,
            "Writes need the admin token or this listener's own host",
            Some(
                "without [admin] token, writes are accepted only with Host: localhost or the \
                 listener's own address; set [admin] token to change overrides or queues \
                 from elsewhere",
            ),
        ));
    } else if !read && !engine.config().admin_listen.ip().is_loopback() {
        return Some(problem(
            StatusCode::FORBIDDEN,
            "Writes need the admin token",
            Some(
                "the admin listener is not loopback-only: set [admin] token to change overrides or queues \
                 through it",
            ),
        ));
    }
    None
}

/// `/readyz`: whether the store answers, and the server is not shutting down (while it drains,
/// a load balancer that reads this sends new traffic elsewhere). With `on_error = "local"` an
/// instance whose store is away still decides every request, from its own memory: it stays
/// ready (that is what `local` is chosen for), and says why.
async fn readiness(shared: &Shared, engine: &Generation) -> Response<Body> {
    if shared.draining.load(std::sync::atomic::Ordering::Relaxed) {
        return text(StatusCode::SERVICE_UNAVAILABLE, "draining\n");
    }
    match engine.store().ready().await {
        Ok(()) => text(StatusCode::OK, "ready\n"),
        Err(e) if engine.config().store.on_error == tollgate::OnError::Local => text(
            StatusCode::OK,
            format!("ready: deciding locally (on_error = \"local\"); store unreachable: {e}\n"),
        ),
        Err(e) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("store unreachable: {e}\n"),
        ),
    }
}

/// Whether the request names this listener: `localhost`, a loopback address, or the address
/// it is bound to, with or without its port. Both the `Host` header and the target's authority
/// (HTTP/2's `:authority`, which carries the host there; an absolute-form target's) must, when
/// present.
fn own_host(req: &Request<Incoming>, listen: std::net::SocketAddr) -> bool {
    let header = req.headers().get(hyper::header::HOST).map(|h| h.as_bytes());
    let target = req.uri().authority().map(|a| a.as_str().as_bytes());
    if header.is_none() && target.is_none() {
        // HTTP/1.0 without Host: no browser sends such a request. An HTTP/2 request always
        // names its authority, a browser's included.
        return req.version() < hyper::Version::HTTP_2;
    }
    header
        .into_iter()
        .chain(target)
        .all(|host| names_listener(host, listen))
}

/// Whether `host` (a `Host` value or an authority) is `localhost`, a loopback address or the
/// listener's address, with the listener's port or none.
fn names_listener(host: &[u8], listen: std::net::SocketAddr) -> bool {
    let Ok(host) = tollgate_http::normalize::authority(host, "Host") else {
        return false;
    };
    let (name, port) = match host.strip_prefix('[') {
        Some(rest) => rest.split_once(']').unwrap_or((rest, "")),
        None => host.split_once(':').map_or((host, ""), |(n, p)| (n, p)),
    };
    let port = port.trim_start_matches(':');
    // A listener configured on port 0 took whatever port it was given: only the name counts.
    if !port.is_empty() && listen.port() != 0 && port.parse::<u16>().ok() != Some(listen.port()) {
        return false;
    }
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback() || ip == listen.ip())
}

/// `GET /v1/policies`: every policy with its quota, key chain and route, and its overrides.
fn policies_response(shared: &Shared, engine: &Generation) -> Response<Body> {
    let now = top::unix_secs();
    let overrides = shared.overrides.list(now);
    let list: Vec<Value> = engine
        .config()
        .policies
        .iter()
        .map(|p| {
            let mut v = policy_json(p);
            let mine: Vec<Value> = overrides
                .iter()
                .filter(|(r, _)| r.policy == p.name())
                .map(|(r, inactive)| overrides::record_json(engine, r, inactive.clone()))
                .collect();
            if let Some(o) = v.as_object_mut() {
                o.insert("overrides".into(), Value::from(mine));
            }
            v
        })
        .collect();
    json_response(StatusCode::OK, &json!({ "policies": list }))
}

/// `GET /v1/top?policy=NAME&n=20`: without `policy`, every policy.
fn top_response(shared: &Shared, engine: &Generation, query: &str) -> Response<Body> {
    let mut policy = None;
    let mut n = 20;
    let mut seen = (false, false);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_encoding::percent_decode_str(value).decode_utf8_lossy();
        // Given twice, one of the two would be ignored: say so rather than pick.
        let again = match name {
            "policy" => std::mem::replace(&mut seen.0, true),
            "n" => std::mem::replace(&mut seen.1, true),
            _ => false,
        };
        if again {
            return fields::bad_field(name, "is given twice; give it once");
        }
        match name {
            "policy" => policy = Some(value.into_owned()),
            "n" => match value.parse::<usize>() {
                Ok(v) if (1..=top::CAPACITY).contains(&v) => n = v,
                _ => return fields::bad_field("n", "must be a whole number from 1 to 128"),
            },
            other => {
                return fields::bad_field(other, "unknown parameter; use policy and n");
            }
        }
    }
    let names: Vec<&str> = match &policy {
        Some(p) => match engine.policy(p) {
            Some(pc) => vec![pc.name()],
            None => {
                return problem(
                    StatusCode::NOT_FOUND,
                    "Unknown policy",
                    Some(&format!(
                        "no policy named {:?}",
                        p.chars().take(128).collect::<String>()
                    )),
                );
            }
        },
        None => engine.config().policies.iter().map(|p| p.name()).collect(),
    };
    let scope = match engine.store() {
        crate::store::AnyStore::Memory(_) => {
            "this instance: with the memory store, its decisions are all there are"
        }
        crate::store::AnyStore::Redis(_) => {
            "this instance only: instances sharing the Redis store each count their own \
             decisions; ask each one"
        }
    };
    let mut views: Vec<Value> = names
        .iter()
        .map(|name| top_json(name, &shared.metrics.top.policy(name).read(n)))
        .collect();
    let mut body = match (&policy, views.len()) {
        (Some(_), 1) => views.pop().unwrap_or_default(),
        _ => json!({ "policies": views }),
    };
    if let Some(o) = body.as_object_mut() {
        o.insert("scope".into(), Value::from(scope));
        o.insert(
            "sketch".into(),
            json!({
                "algorithm": "space-saving",
                "counters_per_sketch": top::CAPACITY,
                "period_seconds": top::PERIOD_SECS,
                "error": "a key's true count is within [count - error, count]; a key not \
                          listed had at most error_bound",
            }),
        );
    }
    json_response(StatusCode::OK, &body)
}

fn top_json(policy: &str, view: &top::TopView) -> Value {
    let since = top::TopKeys::since_secs(view);
    let counted = |c: &top::Counted| {
        json!({
            "total": c.total,
            "error_bound": c.error_bound,
            "keys": c.keys.iter().map(|k| json!({
                "key": key_text(&k.key),
                "count": k.count,
                "error": k.error,
            })).collect::<Vec<_>>(),
        })
    };
    json!({
        "policy": policy,
        "since": fields::rfc3339(since),
        "window_seconds": top::unix_secs().saturating_sub(since),
        "denied": counted(&view.denied),
        "requests": counted(&view.requests),
    })
}

/// A store key as text. Every key the server's doors make is UTF-8: credentials appear as
/// their keyed hash, and a value longer than 256 bytes, beginning with `#` or not UTF-8 as
/// `#` and its digest (`tollgate::key_digest`). A key that is not (from a store shared with
/// other code) is shown with its bad bytes replaced.
pub(crate) fn key_text(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

/// `GET /v1/stats`: what the dashboard polls: decision counters per policy (with the requests
/// in flight and slots taken back of a concurrency limit), store health, and how many overrides
/// there are.
async fn stats(shared: &Shared, engine: &Generation) -> Response<Body> {
    let counts = shared.metrics.decision_counts();
    let slots: Vec<(&str, u64, u64)> = engine.http().slot_counts().collect();
    let policies: Vec<Value> = engine
        .config()
        .policies
        .iter()
        .map(|p| {
            let c = counts
                .iter()
                .find(|(name, _)| name == p.name())
                .map_or([0; 5], |(_, c)| *c);
            let mut v = json!({
                "name": p.name(),
                "action": p.action.as_str(),
                "quota": p.policy.quota().to_string(),
                "allowed": c[0], "denied": c[1], "shadow": c[2], "fail_open": c[3],
                "fail_closed": c[4],
            });
            if let (Some((_, in_flight, expired)), Some(o)) = (
                slots.iter().find(|(n, _, _)| *n == p.name()),
                v.as_object_mut(),
            ) {
                o.insert("in_flight".into(), Value::from(*in_flight));
                o.insert("slots_expired".into(), Value::from(*expired));
            }
            v
        })
        .collect();
    let ready = engine.store().ready().await;
    let mut store = json!({
        "kind": match engine.store() {
            crate::store::AnyStore::Memory(_) => "memory",
            crate::store::AnyStore::Redis(_) => "redis",
        },
        "ready": ready.is_ok(),
        "error": ready.err().map(|e| e.to_string()),
        "keys_tracked": engine.store().keys_tracked(),
    });
    if let (Some(r), Some(o)) = (engine.store().redis_stats(), store.as_object_mut()) {
        o.insert(
            "redis".into(),
            json!({
                "script_calls": r.script_calls, "fallbacks": r.fallbacks,
                "deny_cache_hits": r.deny_cache_hits, "leased": r.leased, "errors": r.errors,
            }),
        );
    }
    let (reloads_ok, reloads_failed) = shared.metrics.reloads();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    json_response(
        StatusCode::OK,
        &json!({
            "time_ms": u64::try_from(now_ms).unwrap_or(u64::MAX),
            "policies": policies,
            "store": store,
            "overrides": { "count": engine.http().override_count(), "shared": keeping(shared, shared.overrides.shared()) },
            "reloads": { "ok": reloads_ok, "failed": reloads_failed },
        }),
    )
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
    if let (Some(o), Some(ban)) = (v.as_object_mut(), p.policy.ban()) {
        o.insert(
            "ban".into(),
            json!({
                "after": ban.after(),
                "within_seconds": ban.within().as_secs_f64(),
                "for_seconds": ban.duration().as_secs_f64(),
            }),
        );
    }
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

/// Where the admin API's live changes (overrides, list entries) are kept, as it tells its
/// callers: `in_redis` when the store shares them between instances, else in this process, and
/// across restarts too when the memory store is kept on disk (`[store] path`, which a reload
/// never changes).
pub(crate) fn keeping(shared: &Shared, in_redis: bool) -> &'static str {
    if in_redis {
        "redis: every instance applies them"
    } else if shared.engine().config().store.path.is_some() {
        "this process: kept across reloads, and across restarts in [store] path"
    } else {
        "this process: kept across reloads, lost on restart"
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
