//! The raw serde structs of the TOML file (exactly SPEC §8's field names) and their validation
//! into the domain types of [`super`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tollgate::{AlgorithmKind, Lease, Policy, Quota, parse_duration};
use toml::Spanned;

use tollgate_http::JwtVerifier;

use super::{
    Action, Config, Envoy, Errors, HeadersConfig, Jwt, OnError, PolicyConfig, ProxyConfig,
    ResetFormat, Secret, StoreClock, StoreConfig, StoreKind, make_policy, parse_algorithm,
    parse_rate,
};
use tollgate_http::{Cidr, ForwardedHeader, KeyChain, KeySelector, RouteMatch, parse_method};

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
    jwt: Option<S<RawJwt>>,
    envoy: Option<S<RawEnvoy>>,
    forward_auth: Option<super::forward_auth::RawForwardAuth>,
    log: Option<super::log::RawLog>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEnvoy {
    config_dir: Option<S<String>>,
    failure_mode: Option<S<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    listen: Option<S<String>>,
    grpc_listen: Option<S<String>>,
    ipv6_prefix: Option<S<i64>>,
    header_read_timeout: Option<S<String>>,
    max_header_bytes: Option<S<i64>>,
    max_connections: Option<S<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    listen: Option<S<String>>,
    token: Option<S<String>>,
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

pub(super) fn default_store() -> StoreConfig {
    StoreConfig {
        kind: StoreKind::Memory,
        url: None,
        cluster: false,
        nodes: Vec::new(),
        timeout: Duration::from_millis(50),
        on_error: OnError::Allow,
        clock: StoreClock::Redis,
        max_keys: None,
        key_secret: None,
    }
}

fn addr(v: &S<String>, ctx: &str, field: &str, errs: &mut Errors<'_>) -> Option<SocketAddr> {
    match v.get_ref().parse::<SocketAddr>() {
        Ok(a) => Some(a),
        Err(_) => {
            errs.at(
                v.span().start,
                format!(
                    "{ctx} field \"{field}\": {:?} is not an address; write IP:PORT, e.g. {field} = \"127.0.0.1:8080\" (or \"[::1]:8080\")",
                    v.get_ref()
                ),
            );
            None
        }
    }
}

fn duration(v: &S<String>, field: &str, ctx: &str, errs: &mut Errors<'_>) -> Option<Duration> {
    match parse_duration(v.get_ref()) {
        Ok(d) => Some(d),
        Err(e) => {
            errs.at(
                v.span().start,
                format!(
                    "{ctx}field \"{field}\": {}; write e.g. {field} = \"50ms\"",
                    e.reason()
                ),
            );
            None
        }
    }
}

fn one_of<T: Copy>(
    v: &S<String>,
    field: &str,
    ctx: &str,
    choices: &[(&str, T)],
    errs: &mut Errors<'_>,
) -> Option<T> {
    match choices.iter().find(|(n, _)| *n == v.get_ref()) {
        Some((_, t)) => Some(*t),
        None => {
            let names: Vec<String> = choices.iter().map(|(n, _)| format!("\"{n}\"")).collect();
            errs.at(
                v.span().start,
                format!(
                    "{ctx}field \"{field}\": {:?} is not one of {}; write e.g. {field} = {}",
                    v.get_ref(),
                    names.join(", "),
                    names.first().map_or("", String::as_str)
                ),
            );
            None
        }
    }
}

/// A positive integer that fits `u32`.
fn count(v: &S<i64>, field: &str, ctx: &str, min: i64, errs: &mut Errors<'_>) -> Option<u32> {
    let n = *v.get_ref();
    if n < min || n > i64::from(u32::MAX) {
        errs.at(
            v.span().start,
            format!(
                "{ctx}field \"{field}\" must be between {min} and {}, not {n}",
                u32::MAX
            ),
        );
        return None;
    }
    u32::try_from(n).ok()
}

pub(super) fn validate(raw: RawConfig, errs: &mut Errors<'_>) -> Option<Config> {
    let mut ok = true;

    let server = raw.server.unwrap_or(RawServer {
        listen: None,
        grpc_listen: None,
        ipv6_prefix: None,
        header_read_timeout: None,
        max_header_bytes: None,
        max_connections: None,
    });
    let limits = validate_limits(&server, raw.proxy.as_ref().map(|p| p.get_ref()), errs);
    let ipv6_prefix = match &server.ipv6_prefix {
        Some(v) if (0..=128).contains(v.get_ref()) => u8::try_from(*v.get_ref()).ok(),
        Some(v) => {
            errs.at(v.span().start, format!("[server] field \"ipv6_prefix\" must be 0 to 128, not {}; write e.g. ipv6_prefix = 64", v.get_ref()));
            None
        }
        None => Some(64),
    };
    let listen = match &server.listen {
        Some(v) => addr(v, "[server]", "listen", errs),
        None => Some(SocketAddr::from(([127, 0, 0, 1], 8080))),
    };
    let grpc_listen = server
        .grpc_listen
        .as_ref()
        .map(|v| addr(v, "[server]", "grpc_listen", errs));
    let admin = raw.admin.unwrap_or(RawAdmin {
        listen: None,
        token: None,
    });
    let admin_listen = match &admin.listen {
        Some(v) => addr(v, "[admin]", "listen", errs),
        None => Some(SocketAddr::from(([127, 0, 0, 1], 9090))),
    };
    let admin_token = match admin.token {
        Some(t) if t.get_ref().is_empty() => {
            errs.at(
                t.span().start,
                "[admin] field \"token\" is empty; remove it to disable the check, or write a secret".to_owned(),
            );
            ok = false;
            None
        }
        Some(t) => Some(t.into_inner()),
        None => None,
    };

    let store = validate_store(raw.store, errs);
    let proxy = raw.proxy.map(|p| validate_proxy(p, errs));
    let headers = match raw.headers {
        None => Some(HeadersConfig::default()),
        Some(h) => {
            let reset_format = match &h.reset_format {
                Some(v) => one_of(
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
    };

    let mut policies = Vec::with_capacity(raw.policy.len());
    for p in raw.policy {
        let at = p.span().start;
        if let Some(pc) = validate_policy(at, p.into_inner(), errs) {
            if pc.action == Action::Queue && proxy.is_none() {
                errs.at(at, format!("policy \"{}\": action \"queue\" needs [proxy]: the proxy stores the requests and delivers them to its upstream", pc.name()));
                ok = false;
            }
            if let Some(prev) = policies
                .iter()
                .find(|q: &&PolicyConfig| q.name() == pc.name())
            {
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
        } else {
            ok = false;
        }
    }

    let jwt = match raw.jwt {
        None => Some(None),
        Some(j) => validate_jwt(j, errs).map(Some),
    };
    if let (Some(None), Some((at, name))) = (
        &jwt,
        policies
            .iter()
            .find_map(|p: &PolicyConfig| p.jwt_key_at.map(|a| (a, p.name().to_owned()))),
    ) {
        errs.at(at, format!("policy \"{name}\": a \"jwt:<claim>\" key needs a verification key; add [jwt] with hs256_secret_env, rs256_public_key_file or es256_public_key_file"));
        ok = false;
    }

    let envoy = match raw.envoy {
        None => {
            if let Some(g) = &server.grpc_listen {
                errs.at(g.span().start, "[server] grpc_listen serves Envoy's rate limit service, which needs its descriptors: add [envoy] config_dir = \"ratelimit\" (a folder of envoyproxy/ratelimit YAML files)".to_owned());
                ok = false;
            }
            Some(None)
        }
        Some(e) => {
            let at = e.span().start;
            if server.grpc_listen.is_none() {
                errs.at(
                    at,
                    "[envoy] needs [server] grpc_listen, e.g. grpc_listen = \"127.0.0.1:8081\""
                        .to_owned(),
                );
                ok = false;
            }
            validate_envoy(at, e.into_inner(), store.as_ref(), errs).map(Some)
        }
    };
    let grpc_listen = match grpc_listen {
        None => Some(None),
        Some(None) => None,
        Some(Some(a)) => Some(Some(a)),
    };
    let proxy = match proxy {
        None => Some(None),
        Some(None) => None,
        Some(Some(p)) => Some(Some(p)),
    };
    let forward_auth = super::forward_auth::validate(raw.forward_auth, errs);
    let log = super::log::validate(raw.log, errs);
    if !ok {
        return None;
    }
    Some(Config {
        source: None,
        listen: listen?,
        grpc_listen: grpc_listen?,
        ipv6_prefix: ipv6_prefix?,
        limits: limits?,
        admin_listen: admin_listen?,
        admin_token,
        store: store?,
        proxy: proxy?,
        headers: headers?,
        policies: Arc::from(policies),
        jwt: jwt?,
        envoy: envoy?,
        envoy_dir: None,
        forward_auth: forward_auth?,
        log: log?,
    })
}

/// The listener bounds: `[server] header_read_timeout`, `max_header_bytes`, `max_connections`,
/// and `[proxy] idle_timeout`; each unset one keeps its default.
fn validate_limits(
    server: &RawServer,
    proxy: Option<&RawProxy>,
    errs: &mut Errors<'_>,
) -> Option<crate::Limits> {
    let mut out = crate::Limits::default();
    let mut ok = true;
    let mut positive = |v: &S<String>, ctx: &str, field: &str, example: &str| match duration(
        v, field, ctx, errs,
    ) {
        Some(d) if d.is_zero() => {
            errs.at(
                v.span().start,
                format!(
                    "{ctx}field \"{field}\" must be positive; write e.g. {field} = \"{example}\""
                ),
            );
            None
        }
        d => d,
    };
    if let Some(v) = &server.header_read_timeout {
        match positive(v, "[server] ", "header_read_timeout", "10s") {
            Some(d) => out.header_read_timeout = d,
            None => ok = false,
        }
    }
    if let Some(v) = proxy.and_then(|p| p.idle_timeout.as_ref()) {
        match positive(v, "[proxy] ", "idle_timeout", "75s") {
            Some(d) => out.idle_timeout = d,
            None => ok = false,
        }
    }
    let mut bounded = |v: &S<i64>, field: &str, min: i64, max: i64, example: &str| {
        let n = *v.get_ref();
        if (min..=max).contains(&n) {
            usize::try_from(n).ok()
        } else {
            errs.at(
                v.span().start,
                format!("[server] field \"{field}\" must be {min} to {max}, not {n}; write e.g. {field} = {example}"),
            );
            None
        }
    };
    if let Some(v) = &server.max_header_bytes {
        match bounded(v, "max_header_bytes", 1024, 1 << 20, "65536") {
            Some(n) => out.max_header_bytes = n,
            None => ok = false,
        }
    }
    if let Some(v) = &server.max_connections {
        match bounded(v, "max_connections", 1, 1_000_000, "10000") {
            Some(n) => out.max_connections = n,
            None => ok = false,
        }
    }
    ok.then_some(out)
}

fn validate_store(raw: Option<RawStore>, errs: &mut Errors<'_>) -> Option<StoreConfig> {
    let mut out = default_store();
    let Some(s) = raw else {
        return Some(out);
    };
    let ctx = "[store] ";
    let mut ok = true;
    if let Some(v) = &s.kind {
        match one_of(v, "kind", ctx, &[("memory", true), ("redis", false)], errs) {
            Some(true) => out.kind = StoreKind::Memory,
            Some(false) => out.kind = StoreKind::Redis,
            None => ok = false,
        }
    }
    if let Some(v) = &s.url {
        let u = v.get_ref();
        if !(u.starts_with("redis://") || u.starts_with("rediss://")) {
            errs.at(
                v.span().start,
                format!("[store] field \"url\": {u:?} is not a Redis URL; write e.g. url = \"redis://127.0.0.1:6379\" (rediss:// for TLS)"),
            );
            ok = false;
        }
        out.url = Some(u.clone());
    }
    out.cluster = s.cluster.map(|c| c.into_inner()).unwrap_or(false);
    for n in s.nodes.unwrap_or_default() {
        let u = n.get_ref();
        if !(u.starts_with("redis://") || u.starts_with("rediss://")) {
            errs.at(
                n.span().start,
                format!("[store] field \"nodes\": {u:?} is not a Redis URL; write e.g. nodes = [\"redis://10.0.0.1:7000\"]"),
            );
            ok = false;
        }
        out.nodes.push(u.clone());
    }
    if let Some(v) = &s.timeout {
        match duration(v, "timeout", ctx, errs) {
            Some(d) if d.is_zero() => {
                errs.at(
                    v.span().start,
                    "[store] field \"timeout\" must be positive; write e.g. timeout = \"50ms\""
                        .to_owned(),
                );
                ok = false;
            }
            Some(d) => out.timeout = d,
            None => ok = false,
        }
    }
    if let Some(v) = &s.on_error {
        match one_of(
            v,
            "on_error",
            ctx,
            &[
                ("allow", OnError::Allow),
                ("deny", OnError::Deny),
                ("local", OnError::Local),
            ],
            errs,
        ) {
            Some(o) => out.on_error = o,
            None => ok = false,
        }
    }
    if let Some(v) = &s.clock {
        match one_of(
            v,
            "clock",
            ctx,
            &[("redis", StoreClock::Redis), ("local", StoreClock::Local)],
            errs,
        ) {
            Some(c) => out.clock = c,
            None => ok = false,
        }
    }
    if let Some(v) = &s.max_keys {
        match count(v, "max_keys", ctx, 1, errs) {
            Some(n) => out.max_keys = usize::try_from(n).ok(),
            None => ok = false,
        }
    }
    if let Some(v) = &s.key_secret_env {
        let name = v.get_ref();
        match std::env::var(name) {
            Ok(secret) if secret.len() >= Secret::MIN_LEN => {
                out.key_secret = Some(Secret::new(secret.into_bytes()));
            }
            Ok(secret) if !secret.is_empty() => {
                errs.at(
                    v.span().start,
                    format!(
                        "[store] field \"key_secret_env\": the environment variable {name:?} holds {} bytes; use at least {}, e.g. export {name}=$(openssl rand -hex 32)",
                        secret.len(),
                        Secret::MIN_LEN
                    ),
                );
                ok = false;
            }
            _ => {
                errs.at(
                    v.span().start,
                    format!(
                        "[store] field \"key_secret_env\": the environment variable {name:?} is not set (or empty); export it before starting tollgate, e.g. export {name}=$(openssl rand -hex 32)"
                    ),
                );
                ok = false;
            }
        }
    }
    if ok && out.kind == StoreKind::Redis && (out.url.is_some() || !out.nodes.is_empty()) {
        if let Err(e) = out.redis_config().validate() {
            let at = s
                .url
                .as_ref()
                .map(|v| v.span().start)
                .or_else(|| s.kind.as_ref().map(|k| k.span().start))
                .unwrap_or(0);
            errs.at(
                at,
                format!("[store]: {e}; write e.g. url = \"redis://127.0.0.1:6379\""),
            );
            ok = false;
        }
    }
    if out.kind == StoreKind::Redis && out.url.is_none() && out.nodes.is_empty() {
        let at = s.kind.as_ref().map_or(0, |k| k.span().start);
        errs.at(at, "[store] kind = \"redis\" needs a server: write url = \"redis://127.0.0.1:6379\" (or nodes = [...] for a cluster)".to_owned());
        ok = false;
    }
    ok.then_some(out)
}

fn validate_proxy(p: S<RawProxy>, errs: &mut Errors<'_>) -> Option<ProxyConfig> {
    let at = p.span().start;
    let p = p.into_inner();
    let mut ok = true;
    let listen = match &p.listen {
        Some(v) => addr(v, "[proxy]", "listen", errs),
        None => {
            errs.at(
                at,
                "[proxy] field \"listen\" is required; write e.g. listen = \"127.0.0.1:8000\""
                    .to_owned(),
            );
            None
        }
    };
    let upstream = match &p.upstream {
        Some(v) => match v.get_ref().parse::<hyper::Uri>() {
            Ok(u)
                if u.scheme_str() == Some("http")
                    && u.authority().is_some()
                    && u.path_and_query().is_none_or(|pq| pq.as_str() == "/") =>
            {
                Some(u)
            }
            _ => {
                errs.at(
                    v.span().start,
                    format!(
                        "[proxy] field \"upstream\": {:?} is not an http://HOST:PORT base (no path; https upstreams are not supported); write e.g. upstream = \"http://127.0.0.1:3000\"",
                        v.get_ref()
                    ),
                );
                None
            }
        },
        None => {
            errs.at(at, "[proxy] field \"upstream\" is required; write e.g. upstream = \"http://127.0.0.1:3000\"".to_owned());
            None
        }
    };
    let mut trusted = Vec::new();
    for t in p.trusted_proxies.unwrap_or_default() {
        match t.get_ref().parse::<Cidr>() {
            Ok(c) => trusted.push(c),
            Err(e) => {
                errs.at(
                    t.span().start,
                    format!("[proxy] field \"trusted_proxies\": {:?}: {}; write e.g. trusted_proxies = [\"10.0.0.0/8\"]", e.input(), e.reason()),
                );
                ok = false;
            }
        }
    }
    let timeout = match &p.timeout {
        Some(v) => duration(v, "timeout", "[proxy] ", errs),
        None => Some(Duration::from_secs(30)),
    };
    let forwarded_header = match &p.forwarded_header {
        Some(v) => one_of(
            v,
            "forwarded_header",
            "[proxy] ",
            &[
                ("x-forwarded-for", ForwardedHeader::XForwardedFor),
                ("forwarded", ForwardedHeader::Forwarded),
            ],
            errs,
        ),
        None => Some(ForwardedHeader::XForwardedFor),
    };
    if !ok {
        return None;
    }
    Some(ProxyConfig {
        listen: listen?,
        upstream: upstream?,
        trusted_proxies: tollgate_http::TrustedProxies::new(trusted),
        forwarded_header: forwarded_header?,
        timeout: timeout?,
    })
}

fn validate_policy(at: usize, p: RawPolicy, errs: &mut Errors<'_>) -> Option<PolicyConfig> {
    let Some(name) = p.name.as_ref() else {
        errs.at(
            at,
            "[[policy]]: field \"name\" is required; write e.g. name = \"api\"".to_owned(),
        );
        return None;
    };
    let n = name.get_ref().clone();
    let ctx = format!("policy \"{n}\": ");
    let mut ok = true;

    let kind = match &p.algorithm {
        Some(v) => match parse_algorithm(v.get_ref()) {
            Ok(k) => Some(k),
            Err(reason) => {
                errs.at(v.span().start, format!("{ctx}field \"algorithm\": {reason}; write e.g. algorithm = \"sliding_window_counter\""));
                None
            }
        },
        None => Some(AlgorithmKind::SlidingWindowCounter),
    };
    let kind = kind?;
    let kname = kind.as_str();

    // Fields that do not belong to the algorithm are errors, so a typo in the algorithm does not
    // silently drop a limit.
    let foreign: &[(&str, Option<usize>)] = &[
        ("limit", p.limit.as_ref().map(|v| v.span().start)),
        ("window", p.window.as_ref().map(|v| v.span().start)),
        ("capacity", p.capacity.as_ref().map(|v| v.span().start)),
        ("refill", p.refill.as_ref().map(|v| v.span().start)),
        ("rate", p.rate.as_ref().map(|v| v.span().start)),
        ("queue", p.queue.as_ref().map(|v| v.span().start)),
        ("max_delay", p.max_delay.as_ref().map(|v| v.span().start)),
    ];
    let own: &[&str] = match kind {
        AlgorithmKind::TokenBucket => &["capacity", "refill"],
        AlgorithmKind::LeakyBucket => &["rate", "queue", "max_delay"],
        _ => &["limit", "window"],
    };
    for (field, pos) in foreign {
        if let Some(pos) = pos
            && !own.contains(field)
        {
            errs.at(
                *pos,
                format!(
                    "{ctx}field \"{field}\" does not apply to algorithm \"{kname}\", which takes {}; remove it or change the algorithm",
                    own.join(", ")
                ),
            );
            ok = false;
        }
    }
    let required = |errs: &mut Errors<'_>, field: &str, example: &str| {
        errs.at(
            at,
            format!("{ctx}field \"{field}\" is required for algorithm \"{kname}\"; write e.g. {field} = {example}"),
        );
    };

    let quota = match kind {
        AlgorithmKind::FixedWindow
        | AlgorithmKind::SlidingWindowLog
        | AlgorithmKind::SlidingWindowCounter => {
            let limit = match &p.limit {
                Some(v) => count(v, "limit", &ctx, 1, errs),
                None => {
                    required(errs, "limit", "100");
                    None
                }
            };
            let window = match &p.window {
                Some(v) => duration(v, "window", &ctx, errs),
                None => {
                    required(errs, "window", "\"1m\"");
                    None
                }
            };
            match (limit, window) {
                (Some(l), Some(w)) => {
                    let q = match kind {
                        AlgorithmKind::FixedWindow => Quota::fixed_window(l, w),
                        AlgorithmKind::SlidingWindowLog => Quota::sliding_window_log(l, w),
                        _ => Quota::sliding_window_counter(l, w),
                    };
                    q.map_err(|e| {
                        let pos = p.window.as_ref().map_or(at, |v| v.span().start);
                        errs.at(pos, format!("{ctx}{}", e.reason()));
                    })
                    .ok()
                }
                _ => None,
            }
        }
        AlgorithmKind::TokenBucket => {
            let capacity = match &p.capacity {
                Some(v) => count(v, "capacity", &ctx, 1, errs),
                None => {
                    required(errs, "capacity", "20");
                    None
                }
            };
            let refill = match &p.refill {
                Some(v) => parse_rate(v.get_ref())
                    .map_err(|reason| {
                        errs.at(
                            v.span().start,
                            format!("{ctx}field \"refill\": {reason}; write e.g. refill = \"1/s\""),
                        );
                    })
                    .ok(),
                None => {
                    required(errs, "refill", "\"1/s\"");
                    None
                }
            };
            match (capacity, refill) {
                (Some(c), Some(r)) => Quota::token_bucket(c, r)
                    .map_err(|e| errs.at(at, format!("{ctx}{}", e.reason())))
                    .ok(),
                _ => None,
            }
        }
        AlgorithmKind::LeakyBucket => {
            let rate = match &p.rate {
                Some(v) => parse_rate(v.get_ref())
                    .map_err(|reason| {
                        errs.at(
                            v.span().start,
                            format!("{ctx}field \"rate\": {reason}; write e.g. rate = \"5/s\""),
                        );
                    })
                    .ok(),
                None => {
                    required(errs, "rate", "\"5/s\"");
                    None
                }
            };
            let queue = match &p.queue {
                Some(v) => count(v, "queue", &ctx, 0, errs),
                None => Some(0),
            };
            let max_delay = match &p.max_delay {
                Some(v) => duration(v, "max_delay", &ctx, errs).map(Some),
                None => Some(None),
            };
            match (rate, queue, max_delay) {
                (Some(r), Some(q), Some(md)) => match Quota::leaky_bucket(r, q) {
                    Ok(Quota::LeakyBucket(lb)) => Some(Quota::LeakyBucket(match md {
                        Some(d) => lb.with_max_delay(d),
                        None => lb,
                    })),
                    Ok(other) => Some(other),
                    Err(e) => {
                        errs.at(at, format!("{ctx}{}", e.reason()));
                        None
                    }
                },
                _ => None,
            }
        }
    };

    let policy = quota.and_then(|q| {
        make_policy(&n, q)
            .map_err(|reason| {
                errs.at(
                    name.span().start,
                    format!("policy {n:?}: field \"name\": {reason}"),
                )
            })
            .ok()
    });

    let (policy, lease_ok) = validate_lease(&p, policy, &ctx, errs);
    ok &= lease_ok;

    let cost = match &p.cost {
        Some(v) => count(v, "cost", &ctx, 1, errs),
        None => Some(1),
    };
    if let (Some(c), Some(pol)) = (cost, &policy) {
        let max = pol.quota().max_cost();
        if c > max {
            let pos = p.cost.as_ref().map_or(at, |v| v.span().start);
            errs.at(
                pos,
                format!("{ctx}field \"cost\" = {c} exceeds what the quota can ever admit ({max}); every request would be refused. Lower the cost or raise the quota"),
            );
            ok = false;
        }
    }

    let mut keys = Vec::new();
    let mut jwt_key_at = None;
    match &p.key {
        Some(list) => {
            if list.get_ref().is_empty() {
                errs.at(list.span().start, format!("{ctx}field \"key\" is empty; write e.g. key = [\"header:x-api-key\", \"ip\"]"));
                ok = false;
            }
            for k in list.get_ref() {
                match k.get_ref().parse::<KeySelector>() {
                    Ok(sel) => {
                        if matches!(sel, KeySelector::Jwt(_)) {
                            jwt_key_at = Some(k.span().start);
                        }
                        keys.push(sel);
                    }
                    Err(e) => {
                        errs.at(
                            k.span().start,
                            format!("{ctx}field \"key\": {:?}: {}", e.input(), e.reason()),
                        );
                        ok = false;
                    }
                }
            }
        }
        None => keys.push(KeySelector::Ip),
    }

    let route = match p.route {
        None => Some(RouteMatch::any()),
        Some(m) => {
            let m = m.into_inner();
            let mut route = Some(RouteMatch::any());
            if let Some(path) = &m.path {
                route = match route.map(|r| r.path(path.get_ref())) {
                    Some(Ok(r)) => Some(r),
                    Some(Err(e)) => {
                        errs.at(
                            path.span().start,
                            format!(
                                "{ctx}match.path {:?}: {}; write e.g. path = \"/v1/**\"",
                                path.get_ref(),
                                e.reason()
                            ),
                        );
                        None
                    }
                    None => None,
                };
            }
            let mut methods = Vec::new();
            for method in m.methods.unwrap_or_default() {
                match parse_method(method.get_ref()) {
                    Ok(_) => methods.push(method.into_inner()),
                    Err(e) => {
                        errs.at(
                            method.span().start,
                            format!("{ctx}match.methods: {:?}: {}; write e.g. methods = [\"GET\", \"POST\"]", e.input(), e.reason()),
                        );
                        route = None;
                    }
                }
            }
            if !methods.is_empty() {
                route = route.and_then(|r| r.methods(&methods).ok());
            }
            if let Some(host) = m.host {
                route = match route.map(|r| r.host(host.get_ref())) {
                    Some(Ok(r)) => Some(r),
                    Some(Err(e)) => {
                        errs.at(
                            host.span().start,
                            format!(
                                "{ctx}match.host {:?}: {}; write e.g. host = \"api.example.com\"",
                                host.get_ref(),
                                e.reason()
                            ),
                        );
                        None
                    }
                    None => None,
                };
            }
            if route.is_none() {
                ok = false;
            }
            route
        }
    };

    let action = match &p.action {
        Some(v) => one_of(
            v,
            "action",
            &ctx,
            &[
                ("reject", Action::Reject),
                (
                    "delay",
                    Action::Delay {
                        max_delay: p
                            .max_delay
                            .as_ref()
                            .and_then(|v| parse_duration(v.get_ref()).ok())
                            .unwrap_or(tollgate_http::DEFAULT_MAX_DELAY),
                    },
                ),
                ("shadow", Action::Shadow),
                ("queue", Action::Queue),
            ],
            errs,
        ),
        None => Some(Action::Reject),
    };
    if matches!(action, Some(Action::Delay { .. })) && kind != AlgorithmKind::LeakyBucket {
        let pos = p.action.as_ref().map_or(at, |v| v.span().start);
        errs.at(pos, format!("{ctx}action \"delay\" needs algorithm \"leaky_bucket\" (it holds a request until its slot); use action = \"reject\" with \"{kname}\""));
        ok = false;
    }
    if action == Some(Action::Queue) && kind != AlgorithmKind::LeakyBucket {
        let pos = p.action.as_ref().map_or(at, |v| v.span().start);
        errs.at(pos, format!("{ctx}action \"queue\" needs algorithm \"leaky_bucket\" (its rate is the rate queued requests are delivered at); use action = \"reject\" with \"{kname}\""));
        ok = false;
    }
    let queue_fields = super::queue::RawQueueFields {
        max_body: p.queue_max_body.as_ref(),
        max_depth: p.queue_max_depth.as_ref(),
        attempts: p.queue_attempts.as_ref(),
        backoff: p.queue_backoff.as_ref(),
        claim_after: p.queue_claim_after.as_ref(),
        concurrency: p.queue_concurrency.as_ref(),
    };
    let queue = super::queue::validate(&queue_fields, action == Some(Action::Queue), &ctx, errs);
    if !ok {
        return None;
    }
    Some(PolicyConfig {
        policy: policy?,
        keys: KeyChain::new(keys),
        route: route?,
        jwt_key_at,
        cost: cost?,
        action: action?,
        require_key: p.require_key.unwrap_or(false),
        queue: queue?,
    })
}

/// `lease` and `lease_ttl`: hot-key leases for the Redis store, refused where unsound for the
/// algorithm. Returns the policy with its lease, and whether the fields were valid.
fn validate_lease(
    p: &RawPolicy,
    policy: Option<Policy>,
    ctx: &str,
    errs: &mut Errors<'_>,
) -> (Option<Policy>, bool) {
    let Some(size) = &p.lease else {
        if let Some(ttl) = &p.lease_ttl {
            errs.at(
                ttl.span().start,
                format!("{ctx}field \"lease_ttl\" needs \"lease\" (how many units a lease takes); write e.g. lease = 100"),
            );
            return (policy, false);
        }
        return (policy, true);
    };
    let Some(units) = count(size, "lease", ctx, 1, errs) else {
        return (policy, false);
    };
    let ttl = match &p.lease_ttl {
        Some(v) => match duration(v, "lease_ttl", ctx, errs) {
            Some(d) => Some(d),
            None => return (policy, false),
        },
        None => None,
    };
    let Some(policy) = policy else {
        return (None, true);
    };
    let ttl = ttl.unwrap_or_else(|| Lease::default_ttl(policy.quota()));
    match Lease::new(units, ttl).and_then(|lease| policy.with_lease(lease)) {
        Ok(leased) => (Some(leased), true),
        Err(e) => {
            errs.at(
                size.span().start,
                format!("{ctx}field \"lease\": {}", e.reason()),
            );
            (None, false)
        }
    }
}

fn validate_jwt(j: S<RawJwt>, errs: &mut Errors<'_>) -> Option<Jwt> {
    let at = j.span().start;
    let j = j.into_inner();
    let mut set: Vec<(S<String>, &str)> = Vec::new();
    if let Some(v) = j.hs256_secret_env {
        set.push((v, "hs256_secret_env"));
    }
    if let Some(v) = j.rs256_public_key_file {
        set.push((v, "rs256_public_key_file"));
    }
    if let Some(v) = j.es256_public_key_file {
        set.push((v, "es256_public_key_file"));
    }
    if set.len() != 1 {
        errs.at(at, "[jwt] needs exactly one of hs256_secret_env, rs256_public_key_file, es256_public_key_file".to_owned());
        return None;
    }
    let (v, field) = set.pop()?;
    let pos = v.span().start;
    let value = v.into_inner();
    let built = match field {
        "hs256_secret_env" => match std::env::var(&value) {
            Ok(secret) if !secret.is_empty() => {
                JwtVerifier::hs256(secret.as_bytes()).map_err(|e| e.reason().to_owned())
            }
            _ => Err(format!(
                "the environment variable {value:?} is not set (or empty); export it before starting tollgate, e.g. export {value}=..."
            )),
        },
        _ => {
            let path = errs.relative(&value);
            match std::fs::read(&path) {
                Ok(pem) => if field == "rs256_public_key_file" {
                    JwtVerifier::rs256_pem(&pem)
                } else {
                    JwtVerifier::es256_pem(&pem)
                }
                .map_err(|e| format!("{}: {}", path.display(), e.reason())),
                Err(e) => Err(format!(
                    "cannot read {}: {e}; write the path of a PEM public key (relative to the configuration file)",
                    path.display()
                )),
            }
        }
    };
    match built {
        Ok(verifier) => Some(Jwt {
            source: format!("{field} = {value:?}"),
            verifier,
        }),
        Err(reason) => {
            errs.at(pos, format!("[jwt] field \"{field}\": {reason}"));
            None
        }
    }
}

fn validate_envoy(
    at: usize,
    e: RawEnvoy,
    store: Option<&StoreConfig>,
    errs: &mut Errors<'_>,
) -> Option<Envoy> {
    let Some(dir) = e.config_dir else {
        errs.at(at, "[envoy] field \"config_dir\" is required; write e.g. config_dir = \"ratelimit\" (a folder of envoyproxy/ratelimit YAML files, relative to this file)".to_owned());
        return None;
    };
    let path = errs.relative(dir.get_ref());
    let domains = match tollgate_envoy::load_envoy_config_dir(&path) {
        Ok(d) => d,
        Err(err) => {
            errs.at(
                dir.span().start,
                format!("[envoy] field \"config_dir\": {err}"),
            );
            return None;
        }
    };
    let failure_mode = match &e.failure_mode {
        Some(v) => match v.get_ref().parse::<tollgate_envoy::FailureMode>() {
            Ok(m) => m,
            Err(reason) => {
                errs.at(
                    v.span().start,
                    format!("[envoy] field \"failure_mode\": {reason}"),
                );
                return None;
            }
        },
        None => match store.map(|s| s.on_error) {
            Some(OnError::Deny) => tollgate_envoy::FailureMode::Unavailable,
            _ => tollgate_envoy::FailureMode::Allow,
        },
    };
    // Compile once now, so descriptor errors surface in `validate`.
    if let Err(err) = tollgate_envoy::RlsService::new(
        tollgate::Limiter::builder().build().ok()?,
        &tollgate_envoy::Config::new().domains(domains.clone()),
    ) {
        errs.at(
            dir.span().start,
            format!("[envoy] field \"config_dir\": {err}"),
        );
        return None;
    }
    Some(Envoy {
        config_dir: path,
        domains,
        failure_mode,
    })
}
