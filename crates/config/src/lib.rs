//! Tollgate's configuration: the TOML file read into raw serde structs, then validated once
//! into the domain types every crate below runs on (policies, keys, routes, stores, listeners),
//! and [`http_engine`] that turns it into the engine that decides. Every problem is reported
//! with file, line and column, and all of them at once.
//!
//! The server runs it; `tollgate replay` reads the same file and builds the same engine, without
//! depending on the server.

mod build;
mod diagnostics;
mod envoy;
mod forward_auth;
mod limits;
mod lists;
mod log;
mod queue;
mod raw;
mod schema;
mod store;
mod telemetry;
mod tls;
mod watched;

pub use build::{
    http_engine, http_engine_counting, key_hash_secret, memory_store, process_secret,
    restore_process_secret,
};
pub(crate) use diagnostics::Errors;
pub use diagnostics::{ConfigError, Diagnostic, Diagnostics};
pub use limits::Limits;
pub use lists::{MAX_CONFIGURED_ENTRIES, valid_list_name};

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tollgate::{AlgorithmKind, Policy, Quota, Rate};

use tollgate_http::{Charge, JwtVerifier, KeyChain, RouteMatch, StatusSet, TrustedProxies};

pub use envoy::DEFAULT_GRPC_LISTEN;
pub use forward_auth::ForwardAuthConfig;
pub use log::{LogConfig, LogFormat};
pub use queue::{MAX_BACKOFF, QueueSettings};
pub use raw::DEFAULT_CONFIG;
pub use store::{StoreClock, StoreConfig, StoreKind};
pub use telemetry::TelemetryConfig;
pub use tls::{TlsConfig, TlsError};
pub use watched::WatchedFiles;

/// What every door answers when the store fails (`allow`, `deny`, `local`): the core's one
/// failure rule.
pub use tollgate::OnError;

/// A secret from the environment: compared, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// The fewest bytes a key secret may have.
    pub const MIN_LEN: usize = 16;

    /// Wraps `bytes`.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Secret(bytes.into())
    }

    /// The secret's bytes.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// `[proxy]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyConfig {
    /// `listen`.
    pub listen: SocketAddr,
    /// `upstream`, an `http://host:port` base.
    pub upstream: http::Uri,
    /// `trusted_proxies`: CIDRs whose `X-Forwarded-For` is believed.
    pub trusted_proxies: TrustedProxies,
    /// `forwarded_header`: `"x-forwarded-for"` (default) or `"forwarded"` (RFC 7239), the one
    /// header trusted proxies are read from.
    pub forwarded_header: tollgate_http::ForwardedHeader,
    /// `timeout`: how long the upstream may take to answer (default 30s).
    pub timeout: Duration,
    /// `tls_cert`, `tls_key`, `client_ca`: the proxy listener over TLS.
    pub tls: Option<TlsConfig>,
}

/// How `X-RateLimit-Reset` is written: the one definition every way in shares (the config
/// offers `epoch` and `delta`).
pub use tollgate::headers::ResetFormat;

/// `[headers]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadersConfig {
    /// `legacy`: `X-RateLimit-*`.
    pub legacy: bool,
    /// `reset_format`.
    pub reset_format: ResetFormat,
    /// `ietf`: `RateLimit-Policy` and `RateLimit`.
    pub ietf: bool,
}

impl Default for HeadersConfig {
    fn default() -> Self {
        HeadersConfig {
            legacy: true,
            reset_format: ResetFormat::Epoch,
            ietf: true,
        }
    }
}

/// What a policy does with a request it denies: the engine's own type (a `delay` carries its
/// `max_delay`).
pub use tollgate_http::Action;

/// `[jwt]`: how Bearer tokens are verified for `jwt:<claim>` key selectors, with the key
/// already loaded (from the environment variable or the PEM file).
#[derive(Clone, Debug)]
pub struct Jwt {
    /// The setting it came from, e.g. `hs256_secret_env = "TOLLGATE_JWT_SECRET"`.
    pub source: String,
    /// The verifier.
    pub verifier: JwtVerifier,
}

/// `[envoy]`: the descriptors Envoy's rate limit service (`[server] grpc_listen`) answers from.
#[derive(Clone, Debug)]
pub struct Envoy {
    /// `config_dir`: envoyproxy/ratelimit YAML files, one domain each.
    pub config_dir: PathBuf,
    /// The domains read from it (at load time; a reload re-reads them).
    pub domains: Vec<tollgate_envoy::Domain>,
    /// `failure_mode`: `allow` or `unavailable` (`deny`) when the store fails (default:
    /// `[store] on_error`).
    pub failure_mode: OnError,
    /// What the folder's files held when they were read ([`Config::read_from`]).
    read_from: WatchedFiles,
}

/// One `[[policy]]`, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyConfig {
    /// The named quota the limiter enforces.
    pub policy: Policy,
    /// `key`: selectors tried in order; the first present wins.
    pub keys: KeyChain,
    /// `match`: which requests the policy applies to.
    pub route: RouteMatch,
    /// `cost` per request (default 1).
    pub cost: u32,
    /// `action` (default reject).
    pub action: Action,
    /// `require_key`: a request with no key is refused with 401 rather than counted as
    /// `anonymous`.
    pub require_key: bool,
    /// The `queue_*` fields, for a `queue` policy.
    pub queue: Option<QueueSettings>,
    /// `charge` (with `cost_from`): when a request is charged.
    pub charge: Charge,
    /// `count_status`: the statuses that count; the others are given back.
    pub count_status: Option<StatusSet>,
    /// Where a `jwt:` selector was written, for the error when `[jwt]` is missing.
    jwt_key_at: Option<usize>,
}

impl PolicyConfig {
    /// The policy's name.
    pub fn name(&self) -> &str {
        self.policy.name()
    }

    /// The policy as the HTTP engine runs it.
    pub fn to_http(&self) -> tollgate_http::HttpPolicy {
        let http = tollgate_http::HttpPolicy::new(self.policy.clone())
            .keys(self.keys.clone())
            .route(self.route.clone())
            .cost(self.cost)
            .action(self.action)
            .require_key(self.require_key);
        let http = http.charge(self.charge.clone());
        match &self.count_status {
            Some(set) => http.count_status(set.clone()),
            None => http,
        }
    }
}

/// `GET,POST api.example.com/v1/**`: a route as `validate` prints it.
pub fn route_text(route: &RouteMatch) -> String {
    let mut out = String::new();
    let methods: Vec<&str> = route.method_list().iter().map(|m| m.as_str()).collect();
    if !methods.is_empty() {
        out.push_str(&methods.join(","));
        out.push(' ');
    }
    if let Some(h) = route.host_pattern() {
        out.push_str(&h.to_string());
    }
    match route.path_pattern() {
        Some(p) => out.push_str(&p.to_string()),
        None => out.push_str("/**"),
    }
    out
}

impl fmt::Display for PolicyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} key=[{}] match={} cost={} action={}",
            self.policy.name(),
            self.policy.quota(),
            self.keys,
            route_text(&self.route),
            self.cost,
            self.action.as_str()
        )?;
        if let (Action::Delay { max_delay }, tollgate::Quota::Concurrency(_)) =
            (self.action, self.policy.quota())
        {
            // A leaky bucket's bound is in its quota's text; a concurrency limit's wait is not.
            write!(f, " max_delay={}", tollgate::format_duration(max_delay))?;
        }
        if self.require_key {
            f.write_str(" require_key=true")?;
        }
        if let Some(q) = &self.queue {
            write!(
                f,
                " queue_max_body={} queue_max_depth={} queue_attempts={} queue_backoff={:?} queue_claim_after={:?} queue_concurrency={}",
                q.max_body, q.max_depth, q.attempts, q.backoff, q.claim_after, q.concurrency
            )?;
        }
        if let Some(lease) = self.policy.lease() {
            write!(f, " {lease}")?;
        }
        if let Some(ban) = self.policy.ban() {
            write!(f, " {ban}")?;
        }
        if let Charge::Response(from) = &self.charge {
            write!(f, " charge=response cost_from={from}")?;
        }
        if let Some(set) = &self.count_status {
            write!(f, " count_status=[{set}]")?;
        }
        Ok(())
    }
}

/// A validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where it was read from (`None` for the built-in default); reloads re-read it.
    pub source: Option<PathBuf>,
    /// What its file held when it was read ([`Config::read_from`]).
    read_from: WatchedFiles,
    /// `[server] listen`: the decision API.
    pub listen: SocketAddr,
    /// `[server] grpc_listen`: Envoy's rate limit service (gRPC), answering from `[envoy]`.
    pub grpc_listen: Option<SocketAddr>,
    /// `[server] resp_listen`: the Redis-protocol door (`CL.THROTTLE`, `TOLLGATE.CHECK`).
    pub resp_listen: Option<SocketAddr>,
    /// `[server] resp_password_env`: the password the door asks its clients for (`AUTH`, as
    /// Redis's `requirepass`), read from that environment variable.
    pub resp_password: Option<Secret>,
    /// `[server] ipv6_prefix`: leading bits of an IPv6 address that form one client (64).
    pub ipv6_prefix: u8,
    /// What every listener bounds: `[server] header_read_timeout`, `max_header_bytes`,
    /// `max_connections` (per listener), and `[proxy] idle_timeout`.
    pub limits: Limits,
    /// `[admin] listen`.
    pub admin_listen: SocketAddr,
    /// `[admin] token`: a bearer token the admin endpoints require.
    pub admin_token: Option<String>,
    /// `[server] tls_cert`, `tls_key`, `client_ca`: the decision API and Envoy's rate limit
    /// service over TLS.
    pub tls: Option<TlsConfig>,
    /// `[admin] tls_cert`, `tls_key`, `client_ca`: the admin listener over TLS.
    pub admin_tls: Option<TlsConfig>,
    /// `[store]`.
    pub store: StoreConfig,
    /// `[proxy]`.
    pub proxy: Option<ProxyConfig>,
    /// `[headers]`.
    pub headers: HeadersConfig,
    /// `[[policy]]`, in file order.
    pub policies: Arc<[PolicyConfig]>,
    /// `[jwt]`.
    pub jwt: Option<Jwt>,
    /// `[envoy]`.
    pub envoy: Option<Envoy>,
    /// `tollgate serve --envoy-config DIR`: the envoyproxy/ratelimit folder that stands for
    /// `[envoy] config_dir`, kept so a reload reads it again.
    pub envoy_dir: Option<PathBuf>,
    /// `[forward_auth]`.
    pub forward_auth: ForwardAuthConfig,
    /// `[telemetry]`.
    pub telemetry: TelemetryConfig,
    /// `[log]`.
    pub log: LogConfig,
    /// `[[list]]`: allow and deny lists, in file order.
    pub lists: Vec<tollgate_http::ListSpec>,
}

impl Config {
    /// Reads and validates the file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::read(path, false)
    }

    /// Reads and validates the file at `path`; `envoy_dir_given` when `--envoy-config` supplies
    /// the Envoy descriptors (then `[server] grpc_listen` needs no `[envoy]` table).
    fn read(path: &Path, envoy_dir_given: bool) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let mut config = Config::parse_as(&path.display().to_string(), &text, envoy_dir_given)?;
        config.source = Some(path.to_path_buf());
        config.read_from.push(path, Some(text.into_bytes()));
        Ok(config)
    }

    /// Validates `text`; `file` names it in diagnostics.
    pub fn parse(file: &str, text: &str) -> Result<Config, ConfigError> {
        Config::parse_as(file, text, false)
    }

    fn parse_as(file: &str, text: &str, envoy_dir_given: bool) -> Result<Config, ConfigError> {
        let mut errs = Errors::new(file, text);
        let Some(doc) = schema::check(text, &mut errs) else {
            return Err(ConfigError::Invalid(errs.finish()));
        };
        let raw: raw::RawConfig =
            match serde::Deserialize::deserialize(toml::de::Deserializer::from(doc)) {
                Ok(raw) => raw,
                Err(e) => {
                    errs.at(
                        e.span().map_or(0, |s| s.start),
                        e.message().trim().to_owned(),
                    );
                    return Err(ConfigError::Invalid(errs.finish()));
                }
            };
        let config = raw::validate(raw, envoy_dir_given, &mut errs);
        let diagnostics = errs.finish();
        match config {
            Some(c) if diagnostics.0.is_empty() => Ok(c),
            _ => Err(ConfigError::Invalid(diagnostics)),
        }
    }

    /// The built-in default of `tollgate serve` with no arguments: the memory store and one
    /// sliding-window-counter policy of 100 requests a minute per API key (`x-api-key`),
    /// falling back to the client IP, on every path.
    pub fn builtin() -> Config {
        // The default text is validated by a unit test; it cannot fail here. Should it ever,
        // fall back to an empty policy set rather than panic.
        Config::parse("<built-in default>", DEFAULT_CONFIG).unwrap_or_else(|_| Config {
            source: None,
            read_from: WatchedFiles::default(),
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            grpc_listen: None,
            resp_listen: None,
            resp_password: None,
            ipv6_prefix: 64,
            limits: Limits::default(),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            admin_token: None,
            tls: None,
            admin_tls: None,
            store: raw::default_store(),
            proxy: None,
            headers: HeadersConfig::default(),
            policies: Arc::from(Vec::new()),
            jwt: None,
            envoy: None,
            envoy_dir: None,
            forward_auth: ForwardAuthConfig::default(),
            telemetry: TelemetryConfig::default(),
            log: LogConfig::default(),
            lists: Vec::new(),
        })
    }

    /// The policy named `name`.
    pub fn policy(&self, name: &str) -> Option<&PolicyConfig> {
        self.policies.iter().find(|p| p.name() == name)
    }
}

/// Parses the pieces of the configuration that are not core types.
pub(crate) fn parse_rate(s: &str) -> Result<Rate, String> {
    s.parse::<Rate>().map_err(|e| e.reason().to_owned())
}

pub(crate) fn parse_algorithm(s: &str) -> Result<AlgorithmKind, String> {
    s.parse::<AlgorithmKind>()
        .map_err(|e| e.reason().to_owned())
}

pub(crate) fn make_policy(name: &str, quota: Quota) -> Result<Policy, String> {
    Policy::new(name, quota).map_err(|e| e.reason().to_owned())
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_calendar;
#[cfg(test)]
mod tests_numbers;
#[cfg(test)]
mod tests_state;
