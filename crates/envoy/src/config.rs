//! The configuration model: domains holding descriptor trees, built with a serde-free builder
//! ([`Config`], [`Domain`], [`Descriptor`], [`RateLimit`]) or loaded from envoyproxy/ratelimit's
//! YAML files ([`load_envoy_config_dir`](crate::load_envoy_config_dir)). [`crate::tree`]
//! compiles it into the matching tree the service walks.

mod unit;

use tollgate::{AlgorithmKind, Quota, Rate};

pub use unit::Unit;

/// A configuration error, naming where it is (file, domain, descriptor path) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{location}: {reason}")]
pub struct ConfigError {
    location: String,
    reason: String,
}

impl ConfigError {
    pub(crate) fn new(location: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            location: location.into(),
            reason: reason.into(),
        }
    }

    /// Where the error is: a file name, then the domain and descriptor path when known.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// What is wrong.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum LimitKind {
    PerUnit {
        requests_per_unit: u32,
        unit: Unit,
        algorithm: AlgorithmKind,
        burst: Option<u32>,
    },
    Quota(Quota),
    Unlimited,
}

/// What a limit enforces once checked.
pub(crate) enum Enforced {
    /// Never counted, always OK.
    Unlimited,
    /// `requests_per_unit: 0`: every request with hits is over the limit (envoyproxy/ratelimit's
    /// blocklist), never counted.
    Blocked(Unit),
    /// Counted with this quota.
    Quota(Quota),
}

/// The limit at a descriptor node: envoyproxy/ratelimit's `requests_per_unit` per `unit`
/// (counted with a fixed window by default, as envoyproxy/ratelimit does, or any Tollgate
/// algorithm), a Tollgate [`Quota`], or unlimited.
#[derive(Clone, Debug, PartialEq)]
pub struct RateLimit {
    pub(crate) kind: LimitKind,
    pub(crate) name: Option<String>,
    pub(crate) replaces: Vec<String>,
}

impl RateLimit {
    /// `requests_per_unit` requests per `unit`, fixed window. `0` denies every request (the
    /// blocklist of envoyproxy/ratelimit's README).
    pub fn per(requests_per_unit: u32, unit: Unit) -> Self {
        RateLimit {
            kind: LimitKind::PerUnit {
                requests_per_unit,
                unit,
                algorithm: AlgorithmKind::FixedWindow,
                burst: None,
            },
            name: None,
            replaces: Vec::new(),
        }
    }

    /// A Tollgate quota (any algorithm, any window).
    pub fn quota(quota: Quota) -> Self {
        RateLimit {
            kind: LimitKind::Quota(quota),
            name: None,
            replaces: Vec::new(),
        }
    }

    /// No limit: matching descriptors are always OK and never counted.
    pub fn unlimited() -> Self {
        RateLimit {
            kind: LimitKind::Unlimited,
            name: None,
            replaces: Vec::new(),
        }
    }

    /// Counts a [`per`](Self::per) limit with `algorithm` instead of the fixed window:
    /// windows are the unit; a token bucket holds `requests_per_unit` (or the
    /// [`burst`](Self::burst)) and refills at `requests_per_unit` per unit; a leaky bucket
    /// drains at that rate and queues up to `burst` (default `requests_per_unit`).
    pub fn algorithm(mut self, algorithm: AlgorithmKind) -> Self {
        if let LimitKind::PerUnit { algorithm: a, .. } = &mut self.kind {
            *a = algorithm;
        }
        self
    }

    /// Token bucket capacity or leaky bucket queue for a [`per`](Self::per) limit.
    pub fn burst(mut self, burst: u32) -> Self {
        if let LimitKind::PerUnit { burst: b, .. } = &mut self.kind {
            *b = Some(burst);
        }
        self
    }

    /// The limit's name: reported in `DescriptorStatus.current_limit.name`, and what another
    /// limit's [`replaces`](Self::replaces) names.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// When this limit applies to a request, the limits named `name` that also apply to it are
    /// dropped: neither checked nor counted (envoyproxy/ratelimit's `replaces`).
    pub fn replaces(mut self, name: impl Into<String>) -> Self {
        self.replaces.push(name.into());
        self
    }

    /// Whether this is [`unlimited`](Self::unlimited).
    pub fn is_unlimited(&self) -> bool {
        matches!(self.kind, LimitKind::Unlimited)
    }

    /// What the limit enforces, or why it cannot.
    pub(crate) fn enforced(&self) -> Result<Enforced, String> {
        let (requests_per_unit, unit, algorithm, burst) = match &self.kind {
            LimitKind::Unlimited => return Ok(Enforced::Unlimited),
            LimitKind::Quota(q) if q.kind() == AlgorithmKind::Concurrency => {
                return Err(NO_RELEASE.to_owned());
            }
            LimitKind::Quota(q) => return Ok(Enforced::Quota(q.clone())),
            &LimitKind::PerUnit {
                requests_per_unit,
                unit,
                algorithm,
                burst,
            } => (requests_per_unit, unit, algorithm, burst),
        };
        if requests_per_unit == 0 {
            return Ok(Enforced::Blocked(unit));
        }
        let window = unit.duration();
        let rate = || Rate::new(requests_per_unit, window);
        let quota = match algorithm {
            AlgorithmKind::FixedWindow => Quota::fixed_window(requests_per_unit, window),
            AlgorithmKind::SlidingWindowLog => Quota::sliding_window_log(requests_per_unit, window),
            AlgorithmKind::SlidingWindowCounter => {
                Quota::sliding_window_counter(requests_per_unit, window)
            }
            AlgorithmKind::TokenBucket => {
                rate().and_then(|r| Quota::token_bucket(burst.unwrap_or(requests_per_unit), r))
            }
            AlgorithmKind::LeakyBucket => {
                rate().and_then(|r| Quota::leaky_bucket(r, burst.unwrap_or(requests_per_unit)))
            }
            AlgorithmKind::Concurrency => return Err(NO_RELEASE.to_owned()),
        };
        quota.map(Enforced::Quota).map_err(|e| e.to_string())
    }
}

/// Why a concurrency limit cannot be enforced over Envoy's protocol.
pub(crate) const NO_RELEASE: &str = "a concurrency limit cannot be enforced through Envoy's rate limit \
     service: its protocol has no message for a request's end, so a slot would never be given \
     back before its lease_ttl; limit requests in flight with Envoy's own circuit breakers \
     (max_requests) or put Tollgate's proxy in front";

/// A node of a descriptor tree: matches a request descriptor entry by `key` and, when given,
/// `value`; holds a [`RateLimit`] and/or nested descriptors.
#[derive(Clone, Debug, PartialEq)]
pub struct Descriptor {
    pub(crate) key: String,
    pub(crate) value: Option<String>,
    pub(crate) rate_limit: Option<RateLimit>,
    pub(crate) shadow_mode: bool,
    pub(crate) quota_mode: bool,
    pub(crate) share_threshold: bool,
    pub(crate) descriptors: Vec<Descriptor>,
}

impl Descriptor {
    /// A node for entries with this key, any value (each distinct value counted on its own).
    pub fn new(key: impl Into<String>) -> Self {
        Descriptor {
            key: key.into(),
            value: None,
            rate_limit: None,
            shadow_mode: false,
            quota_mode: false,
            share_threshold: false,
            descriptors: Vec::new(),
        }
    }

    /// Matches only this value (an exact match wins over a wildcard, which wins over a
    /// key-only node). Each `*` matches any run of characters, empty included (`foo*`,
    /// `/api/*/action`, `svc*ep*rpc`). An empty value is no value, as in envoyproxy/ratelimit.
    pub fn value(mut self, value: impl Into<String>) -> Self {
        let value = value.into();
        self.value = (!value.is_empty()).then_some(value);
        self
    }

    /// The limit applied when a request descriptor's last entry stops at this node.
    pub fn rate_limit(mut self, limit: RateLimit) -> Self {
        self.rate_limit = Some(limit);
        self
    }

    /// Shadow mode: counted and reported, but never makes a request over the limit.
    pub fn shadow_mode(mut self, on: bool) -> Self {
        self.shadow_mode = on;
        self
    }

    /// Quota mode (envoyproxy/ratelimit's `quota_mode`): when this limit is over, its status
    /// says `OVER_LIMIT` but the request is over the limit only if every quota-mode limit that
    /// applies to it is over (or a limit not in quota mode is).
    pub fn quota_mode(mut self, on: bool) -> Self {
        self.quota_mode = on;
        self
    }

    /// With a wildcard [`value`](Self::value): every value it matches shares one counter,
    /// instead of one counter per value. Refused without a wildcard.
    pub fn share_threshold(mut self, on: bool) -> Self {
        self.share_threshold = on;
        self
    }

    /// Adds a nested descriptor, matched against the request descriptor's next entry.
    pub fn descriptor(mut self, child: Descriptor) -> Self {
        self.descriptors.push(child);
        self
    }
}

/// A named descriptor tree. Requests name their domain.
#[derive(Clone, Debug, PartialEq)]
pub struct Domain {
    pub(crate) name: String,
    pub(crate) descriptors: Vec<Descriptor>,
    pub(crate) source: Option<String>,
}

impl Domain {
    /// An empty domain.
    pub fn new(name: impl Into<String>) -> Self {
        Domain {
            name: name.into(),
            descriptors: Vec::new(),
            source: None,
        }
    }

    /// Adds a top-level descriptor.
    pub fn descriptor(mut self, descriptor: Descriptor) -> Self {
        self.descriptors.push(descriptor);
        self
    }

    /// Adds top-level descriptors.
    pub fn descriptors(mut self, descriptors: impl IntoIterator<Item = Descriptor>) -> Self {
        self.descriptors.extend(descriptors);
        self
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the domain was read from (for error messages).
    pub(crate) fn with_source(mut self, source: String) -> Self {
        self.source = Some(source);
        self
    }
}

/// What the service answers when the store fails: the core's one failure rule. `Allow` (and
/// `Local`, once the store's own fallback has failed too) answers OK with no limits; `Deny`
/// answers gRPC `UNAVAILABLE`, so Envoy's `failure_mode_deny` decides.
pub use tollgate::OnError;

/// Reads a `failure_mode` as envoyproxy/ratelimit users write it: `allow` (also `open`) or
/// `unavailable` (also `deny`).
pub fn parse_failure_mode(s: &str) -> Result<OnError, String> {
    match s {
        "allow" | "open" => Ok(OnError::Allow),
        "unavailable" | "deny" => Ok(OnError::Deny),
        _ => Err(format!(
            "invalid failure_mode {:?}: use \"allow\" or \"unavailable\"",
            s.chars().take(40).collect::<String>()
        )),
    }
}

/// How `X-RateLimit-Reset` is written: the core's one definition, shared with the tower layer
/// and the server.
pub use tollgate::headers::ResetFormat;

/// The whole configuration of the rate limit service.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub(crate) domains: Vec<Domain>,
    pub(crate) failure_mode: OnError,
    pub(crate) x_ratelimit_headers: bool,
    pub(crate) ietf_headers: bool,
    pub(crate) reset_format: ResetFormat,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            domains: Vec::new(),
            failure_mode: OnError::Allow,
            x_ratelimit_headers: true,
            ietf_headers: true,
            reset_format: ResetFormat::Epoch,
        }
    }
}

impl Config {
    /// No domains, fail open, every header family on, epoch reset.
    pub fn new() -> Self {
        Config::default()
    }

    /// Adds a domain.
    pub fn domain(mut self, domain: Domain) -> Self {
        self.domains.push(domain);
        self
    }

    /// Adds domains.
    pub fn domains(mut self, domains: impl IntoIterator<Item = Domain>) -> Self {
        self.domains.extend(domains);
        self
    }

    /// What to answer when the store fails.
    pub fn failure_mode(mut self, mode: OnError) -> Self {
        self.failure_mode = mode;
        self
    }

    /// Whether answers carry `X-RateLimit-Limit/Remaining/Reset` (default on).
    pub fn x_ratelimit_headers(mut self, on: bool) -> Self {
        self.x_ratelimit_headers = on;
        self
    }

    /// Whether answers carry the IETF `RateLimit-Policy` and `RateLimit` fields (default on).
    pub fn ietf_headers(mut self, on: bool) -> Self {
        self.ietf_headers = on;
        self
    }

    /// How `X-RateLimit-Reset` is written.
    pub fn reset_format(mut self, format: ResetFormat) -> Self {
        self.reset_format = format;
        self
    }

    /// The domains.
    pub fn domain_list(&self) -> &[Domain] {
        &self.domains
    }
}
