//! The raw serde structs of the TOML file (the field names users write) and their validation
//! into the domain types of [`super`], one child module per table.
//!
//! Validation reports every problem it finds (each with its position, through [`Errors`]) and
//! keeps going, so a user fixes a file in one pass: each step returns `None` (or `false`) for a
//! part it refused, and [`validate`] builds a [`Config`] only when no part was refused.

mod ban;
mod calendar;
mod envoy;
mod fields;
mod jwt;
mod listeners;
mod policy;
mod proxy;
mod state;
mod store;

use std::sync::Arc;

use serde::Deserialize;
use toml::Spanned;

use super::{Action, Config, Errors, HeadersConfig, PolicyConfig, ResetFormat};

pub(super) use store::default_store;

/// The built-in configuration of `tollgate serve` with no arguments.
pub const DEFAULT_CONFIG: &str = r#"# Tollgate's built-in default: a read-heavy API.
[server]
listen = "127.0.0.1:8080"

[admin]
listen = "127.0.0.1:9090"

[store]
kind = "memory"

[headers]
legacy = true
reset_format = "epoch"
ietf = true

[[policy]]
name = "default"
algorithm = "sliding_window_counter"
limit = 100
window = "1m"
key = ["header:x-api-key", "ip"]
match = { path = "/**" }
"#;

type S<T> = Spanned<T>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    server: Option<RawServer>,
    admin: Option<RawAdmin>,
    store: Option<RawStore>,
    proxy: Option<S<RawProxy>>,
    headers: Option<RawHeaders>,
    #[serde(default)]
    policy: Vec<S<RawPolicy>>,
    #[serde(default)]
    list: Vec<S<super::lists::RawList>>,
    jwt: Option<S<RawJwt>>,
    envoy: Option<S<RawEnvoy>>,
    forward_auth: Option<super::forward_auth::RawForwardAuth>,
    telemetry: Option<super::telemetry::RawTelemetry>,
    log: Option<super::log::RawLog>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEnvoy {
    config_dir: Option<S<String>>,
    failure_mode: Option<S<String>>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    listen: Option<S<String>>,
    grpc_listen: Option<S<String>>,
    resp_listen: Option<S<String>>,
    resp_password_env: Option<S<String>>,
    ipv6_prefix: Option<S<i64>>,
    header_read_timeout: Option<S<String>>,
    max_header_bytes: Option<S<i64>>,
    max_connections: Option<S<i64>>,
    drain_timeout: Option<S<String>>,
    tls_cert: Option<S<String>>,
    tls_key: Option<S<String>>,
    client_ca: Option<S<String>>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    listen: Option<S<String>>,
    token: Option<S<String>>,
    tls_cert: Option<S<String>>,
    tls_key: Option<S<String>>,
    client_ca: Option<S<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    kind: Option<S<String>>,
    url: Option<S<String>>,
    cluster: Option<S<bool>>,
    nodes: Option<Vec<S<String>>>,
    timeout: Option<S<String>>,
    on_error: Option<S<String>>,
    clock: Option<S<String>>,
    max_keys: Option<S<i64>>,
    key_secret_env: Option<S<String>>,
    path: Option<S<String>>,
    snapshot_every: Option<S<String>>,
    tls_ca: Option<S<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProxy {
    listen: Option<S<String>>,
    upstream: Option<S<String>>,
    trusted_proxies: Option<Vec<S<String>>>,
    forwarded_header: Option<S<String>>,
    timeout: Option<S<String>>,
    idle_timeout: Option<S<String>>,
    tls_cert: Option<S<String>>,
    tls_key: Option<S<String>>,
    client_ca: Option<S<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHeaders {
    legacy: Option<bool>,
    reset_format: Option<S<String>>,
    ietf: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPolicy {
    name: Option<S<String>>,
    algorithm: Option<S<String>>,
    limit: Option<S<i64>>,
    window: Option<S<String>>,
    calendar: Option<S<String>>,
    timezone: Option<S<String>>,
    capacity: Option<S<i64>>,
    refill: Option<S<String>>,
    rate: Option<S<String>>,
    queue: Option<S<i64>>,
    cost: Option<S<i64>>,
    key: Option<S<Vec<S<String>>>>,
    #[serde(rename = "match")]
    route: Option<S<RawMatch>>,
    action: Option<S<String>>,
    max_delay: Option<S<String>>,
    require_key: Option<bool>,
    queue_max_body: Option<S<i64>>,
    queue_max_depth: Option<S<i64>>,
    queue_attempts: Option<S<i64>>,
    queue_backoff: Option<S<String>>,
    queue_claim_after: Option<S<String>>,
    queue_concurrency: Option<S<i64>>,
    lease: Option<S<i64>>,
    lease_ttl: Option<S<String>>,
    charge: Option<S<String>>,
    cost_from: Option<S<String>>,
    count_status: Option<S<Vec<S<String>>>>,
    ban: Option<S<ban::RawBan>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMatch {
    path: Option<S<String>>,
    methods: Option<Vec<S<String>>>,
    host: Option<S<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJwt {
    hs256_secret_env: Option<S<String>>,
    rs256_public_key_file: Option<S<String>>,
    es256_public_key_file: Option<S<String>>,
}

/// The whole file: every table validated, every problem reported, and a [`Config`] only when
/// there was none. `envoy_dir_given`: `--envoy-config` supplies the Envoy descriptors.
pub(super) fn validate(
    raw: RawConfig,
    envoy_dir_given: bool,
    errs: &mut Errors<'_>,
) -> Option<Config> {
    let server = raw.server.unwrap_or_default();
    let at = |v: &Option<S<String>>| v.as_ref().map(|v| v.span().start);
    let admin_at = raw.admin.as_ref().and_then(|a| at(&a.listen));
    let proxy_at = raw.proxy.as_ref().and_then(|p| at(&p.get_ref().listen));
    let listeners = listeners::validate(
        &server,
        raw.proxy.as_ref().map(|p| p.get_ref()),
        raw.admin.unwrap_or_default(),
        errs,
    );
    let store = store::validate(raw.store, errs);
    let has_proxy = raw.proxy.is_some();
    let proxy = match raw.proxy {
        None => Some(None),
        Some(p) => proxy::validate(p, errs).map(Some),
    };
    let headers = validate_headers(raw.headers, errs);
    let (policies, policies_ok) = validate_policies(raw.policy, has_proxy, errs);
    let (jwt, jwt_ok) = jwt::validate_section(raw.jwt, &policies, errs);
    let (envoy, envoy_ok) = envoy::validate_section(
        raw.envoy,
        server.grpc_listen.as_ref(),
        envoy_dir_given,
        store.as_ref(),
        errs,
    );
    let forward_auth = super::forward_auth::validate(raw.forward_auth, errs);
    let log = super::log::validate(raw.log, errs);
    let telemetry = super::telemetry::validate(raw.telemetry, errs);
    let lists = super::lists::validate(raw.list, listeners.ipv6_prefix, errs);
    let mut bound = Vec::new();
    for (name, at, addr) in [
        ("[server] listen", at(&server.listen), listeners.listen),
        (
            "[server] grpc_listen",
            at(&server.grpc_listen),
            listeners.grpc_listen.flatten(),
        ),
        (
            "[server] resp_listen",
            at(&server.resp_listen),
            listeners.resp_listen.flatten(),
        ),
        ("[admin] listen", admin_at, listeners.admin_listen),
        (
            "[proxy] listen",
            proxy_at,
            proxy.as_ref().and_then(|p| p.as_ref()).map(|p| p.listen),
        ),
    ] {
        if let Some(addr) = addr {
            bound.push(listeners::Bound { name, at, addr });
        }
    }
    let distinct = listeners::distinct(&bound, errs);
    if !(listeners.ok && policies_ok && jwt_ok && envoy_ok && distinct) {
        return None;
    }
    Some(Config {
        source: None,
        read_from: crate::WatchedFiles::default(),
        listen: listeners.listen?,
        grpc_listen: listeners.grpc_listen?,
        resp_listen: listeners.resp_listen?,
        resp_password: listeners.resp_password,
        ipv6_prefix: listeners.ipv6_prefix?,
        limits: listeners.limits?,
        admin_listen: listeners.admin_listen?,
        admin_token: listeners.admin_token,
        tls: listeners.tls?,
        admin_tls: listeners.admin_tls?,
        store: store?,
        proxy: proxy?,
        headers: headers?,
        policies: Arc::from(policies),
        jwt: jwt?,
        envoy: envoy?,
        envoy_dir: None,
        forward_auth: forward_auth?,
        log: log?,
        telemetry: telemetry?,
        lists: lists?,
    })
}

/// `[headers]`: which rate limit header families a response carries.
fn validate_headers(raw: Option<RawHeaders>, errs: &mut Errors<'_>) -> Option<HeadersConfig> {
    let Some(h) = raw else {
        return Some(HeadersConfig::default());
    };
    let reset_format = match &h.reset_format {
        Some(v) => fields::one_of(
            v,
            "reset_format",
            "[headers] ",
            &[("epoch", ResetFormat::Epoch), ("delta", ResetFormat::Delta)],
            errs,
        ),
        None => Some(ResetFormat::Epoch),
    };
    reset_format.map(|reset_format| HeadersConfig {
        legacy: h.legacy.unwrap_or(true),
        reset_format,
        ietf: h.ietf.unwrap_or(true),
    })
}

/// Every `[[policy]]`, in file order: the valid ones, and whether all were valid (names unique,
/// a queue policy only with a `[proxy]`).
fn validate_policies(
    raw: Vec<S<RawPolicy>>,
    has_proxy: bool,
    errs: &mut Errors<'_>,
) -> (Vec<PolicyConfig>, bool) {
    let mut ok = true;
    let mut policies: Vec<PolicyConfig> = Vec::with_capacity(raw.len());
    for p in raw {
        let at = p.span().start;
        let Some(pc) = policy::validate(at, p.into_inner(), errs) else {
            ok = false;
            continue;
        };
        if pc.action == Action::Queue && !has_proxy {
            errs.at(at, format!("policy \"{}\": action \"queue\" needs [proxy]: the proxy stores the requests and delivers them to its upstream", pc.name()));
            ok = false;
        }
        if let Some(prev) = policies.iter().find(|q| q.name() == pc.name()) {
            errs.at(
                at,
                format!(
                    "policy \"{}\" is defined twice; give each [[policy]] its own name",
                    prev.name()
                ),
            );
            ok = false;
        }
        policies.push(pc);
    }
    (policies, ok)
}
