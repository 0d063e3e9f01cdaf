//! The Redis store's configuration: where Redis is, how long to wait for it, what to decide when
//! it fails, whose clock counts, and how keys are named.

use std::fmt;
use std::time::Duration;

/// The `key_secret` used when none is configured. Fixed and public so every instance of a
/// deployment names keys alike without setup; set your own to make hashed keys unguessable.
pub const DEFAULT_KEY_SECRET: &[u8] = b"tollgate-redis-key-secret-v1";

/// The default prefix of every key the store writes.
pub const DEFAULT_KEY_PREFIX: &str = "tg";

/// The default bound on one call to Redis.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// What to do when Redis fails: the core's one failure rule. The store itself acts only on
/// [`OnError::Local`] (deciding from memory); under `Allow` and `Deny` it returns the error and
/// the caller answers as the rule says.
pub use tollgate::OnError;

/// Whose clock decides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ClockSource {
    /// Redis `TIME`, read inside the script: instances with skewed clocks make one consistent
    /// decision stream.
    #[default]
    Redis,
    /// The `now` the caller passes (tests, the conformance suite, replaying traffic).
    Local,
}

/// Where Redis is and how to use it. Build with [`RedisConfig::standalone`] or
/// [`RedisConfig::cluster`], adjust the public fields, and hand it to
/// [`RedisStore::new`](crate::RedisStore::new), which validates it.
#[derive(Clone)]
pub struct RedisConfig {
    /// `redis://[user:pass@]host[:port][/db]` or `rediss://…` (TLS, feature `tls`). For a
    /// Cluster, the seed nodes (one is enough; the client discovers the rest).
    pub nodes: Vec<String>,
    /// Whether `nodes` are Redis Cluster nodes.
    pub cluster: bool,
    /// The bound on one call to Redis (default 50 ms); past it, `on_error` decides.
    pub timeout: Duration,
    /// What happens when Redis fails (default: [`OnError::Local`]).
    pub on_error: OnError,
    /// Whose clock decides (default: [`ClockSource::Redis`]).
    pub clock: ClockSource,
    /// Keys the hash that replaces client keys in Redis key names (default
    /// [`DEFAULT_KEY_SECRET`]). Every instance sharing a Redis must use the same secret.
    pub key_secret: Vec<u8>,
    /// The prefix of every key (default `tg`).
    pub key_prefix: String,
    /// How many denials the deny cache remembers (0 turns it off; default 65,536). While a
    /// (policy, key) is denied, further single checks of it with at least the denied cost are
    /// answered from memory until the denial's `retry_after` ends, without calling Redis. Such
    /// answers are exact in `allowed` and `retry_after`; `remaining` is reported as it was when
    /// denied and `reset` shortened by the time elapsed. A refund through this store clears the
    /// entry; a refund by another instance does not (the denial then lasts until its
    /// `retry_after`, never less).
    pub deny_cache_size: usize,
    /// How many (policy, key) hot-key leases this instance holds at most (default 65,536; 0
    /// turns leases off). Only policies with a [`Lease`](tollgate::Lease) take them; when the
    /// table is full, a key without a lease is decided in Redis as without one.
    pub lease_table_size: usize,
    /// For `rediss://` (feature `tls`): the CA certificate (PEM) that signed the server's
    /// certificate, when it is not in the system's trust store.
    pub tls_root_cert_pem: Option<Vec<u8>>,
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The secret and any password in a URL stay out of logs.
        f.debug_struct("RedisConfig")
            .field(
                "nodes",
                &self.nodes.iter().map(|n| redact(n)).collect::<Vec<_>>(),
            )
            .field("cluster", &self.cluster)
            .field("timeout", &self.timeout)
            .field("on_error", &self.on_error)
            .field("clock", &self.clock)
            .field("key_secret", &"<redacted>")
            .field("key_prefix", &self.key_prefix)
            .field("deny_cache_size", &self.deny_cache_size)
            .field("lease_table_size", &self.lease_table_size)
            .field("tls_root_cert_pem", &self.tls_root_cert_pem.is_some())
            .finish()
    }
}

impl RedisConfig {
    /// One Redis server at `url`, with every other setting at its default.
    pub fn standalone(url: &str) -> Self {
        RedisConfig {
            nodes: vec![url.to_owned()],
            cluster: false,
            timeout: DEFAULT_TIMEOUT,
            on_error: OnError::Local,
            clock: ClockSource::default(),
            key_secret: DEFAULT_KEY_SECRET.to_vec(),
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
            deny_cache_size: 65_536,
            lease_table_size: 65_536,
            tls_root_cert_pem: None,
        }
    }

    /// A Redis Cluster reached through `seeds`, with every other setting at its default.
    pub fn cluster<S: AsRef<str>>(seeds: &[S]) -> Self {
        RedisConfig {
            nodes: seeds.iter().map(|s| s.as_ref().to_owned()).collect(),
            cluster: true,
            ..RedisConfig::standalone("")
        }
    }

    /// Checks every setting; the error names the offending value and what is wrong with it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.nodes.is_empty() {
            return Err(ConfigError::new("nodes", "no Redis URL given"));
        }
        if !self.cluster && self.nodes.len() > 1 {
            return Err(ConfigError::new(
                &self.nodes.join(","),
                "several URLs given without cluster = true",
            ));
        }
        for node in &self.nodes {
            validate_url(node)?;
        }
        if self.timeout.is_zero() {
            return Err(ConfigError::new("timeout", "must be above zero"));
        }
        if self.key_prefix.is_empty() || self.key_prefix.contains(['{', '}', ' ']) {
            return Err(ConfigError::new(
                &self.key_prefix,
                "key_prefix must be non-empty, without braces or spaces",
            ));
        }
        if self.tls_root_cert_pem.is_some() && !cfg!(feature = "tls") {
            return Err(ConfigError::new(
                "tls_root_cert_pem",
                "needs tollgate-redis built with the `tls` feature",
            ));
        }
        if self.key_secret.is_empty() {
            return Err(ConfigError::new("key_secret", "must not be empty"));
        }
        Ok(())
    }
}

fn validate_url(url: &str) -> Result<(), ConfigError> {
    let shown = redact(url);
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(ConfigError::new(
            &shown,
            "not a URL: expected redis://host:port or rediss://host:port",
        ));
    };
    match scheme {
        "redis" => {}
        "rediss" if cfg!(feature = "tls") => {}
        "rediss" => {
            return Err(ConfigError::new(
                &shown,
                "rediss:// needs tollgate-redis built with the `tls` feature",
            ));
        }
        other => {
            return Err(ConfigError::new(
                &shown,
                &format!("unsupported scheme {other:?}: use redis:// or rediss://"),
            ));
        }
    }
    let host = rest.rsplit('@').next().unwrap_or(rest);
    let host = host.split('/').next().unwrap_or(host);
    if host.is_empty() || host.starts_with(':') {
        return Err(ConfigError::new(&shown, "no host"));
    }
    if let Some((_, port)) = host.rsplit_once(':').filter(|(h, _)| !h.ends_with(']'))
        && port.parse::<u16>().map_or(true, |p| p == 0)
    {
        return Err(ConfigError::new(
            &shown,
            &format!("port {port:?} is not a number from 1 to 65535"),
        ));
    }
    // The client's own parser has the last word; without the client (the configuration
    // alone, as `tollgate replay` reads it) the checks above are all there is.
    #[cfg(feature = "client")]
    redis::Client::open(url).map_err(|e| ConfigError::new(&shown, &e.to_string()))?;
    Ok(())
}

/// A URL with any password replaced, fit for errors and logs.
pub(crate) fn redact(url: &str) -> String {
    match (url.split_once("://"), url.rfind('@')) {
        (Some((scheme, rest)), Some(_)) => {
            let host = rest.rsplit('@').next().unwrap_or("");
            format!("{scheme}://***@{host}")
        }
        _ => url.to_owned(),
    }
}

/// An invalid [`RedisConfig`]: which value, and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid Redis setting {value:?}: {reason}")]
pub struct ConfigError {
    value: String,
    reason: String,
}

impl ConfigError {
    fn new(value: &str, reason: &str) -> Self {
        ConfigError {
            value: value.to_owned(),
            reason: reason.to_owned(),
        }
    }

    /// The rejected value (a URL with its password redacted, or the setting's name).
    pub fn value(&self) -> &str {
        &self.value
    }

    /// What is wrong with it.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_urls_are_named_with_the_problem() {
        for (url, needle) in [
            ("localhost:6379", "not a URL"),
            ("http://localhost:6379", "unsupported scheme"),
            ("redis://", "no host"),
            ("redis://localhost:99999", "port"),
            ("redis://localhost:abc", "port"),
        ] {
            let err = RedisConfig::standalone(url).validate().err();
            let err = err.map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains(needle), "{url}: {err}");
            assert!(err.contains(url), "{url}: {err}");
        }
        assert!(
            RedisConfig::standalone("redis://127.0.0.1:6379/0")
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn passwords_never_show() {
        let c = RedisConfig::standalone("redis://user:hunter2@h:1");
        assert!(!format!("{c:?}").contains("hunter2"));
        let err = RedisConfig::standalone("redis://user:hunter2@h:abc")
            .validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(!err.contains("hunter2") && err.contains("port"), "{err}");
    }
}
