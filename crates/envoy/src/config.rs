//! The configuration model: domains holding descriptor trees, built with a serde-free builder
//! ([`Config`], [`Domain`], [`Descriptor`], [`RateLimit`]) or loaded from envoyproxy/ratelimit's
//! YAML files ([`load_envoy_config_dir`](crate::load_envoy_config_dir)), and compiled into the
//! matching tree the service walks.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use tollgate::headers;
use tollgate::{AlgorithmKind, MAX_POLICY_NAME, Policy, Quota, Rate};

use crate::proto::envoy::service_ratelimit_v3::rate_limit_response::RateLimit as ProtoRateLimit;
use crate::proto::envoy::service_ratelimit_v3::rate_limit_response::rate_limit::Unit as ProtoUnit;

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

/// The time unit of an envoyproxy/ratelimit limit (`unit:` in its YAML).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// One second.
    Second,
    /// One minute.
    Minute,
    /// One hour.
    Hour,
    /// One day (86,400 s).
    Day,
    /// One week (7 days).
    Week,
    /// One month, counted as 30 days.
    Month,
    /// One year, counted as 365 days.
    Year,
}

impl Unit {
    /// The unit's length.
    pub fn duration(self) -> Duration {
        Duration::from_secs(match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        })
    }

    /// The unit in `RateLimitResponse.RateLimit.Unit` (`WEEK` is 7, after `YEAR`).
    pub(crate) fn proto(self) -> ProtoUnit {
        match self {
            Unit::Second => ProtoUnit::Second,
            Unit::Minute => ProtoUnit::Minute,
            Unit::Hour => ProtoUnit::Hour,
            Unit::Day => ProtoUnit::Day,
            Unit::Week => ProtoUnit::Week,
            Unit::Month => ProtoUnit::Month,
            Unit::Year => ProtoUnit::Year,
        }
    }

    /// The unit numbered `n` in `envoy.type.v3.RateLimitUnit` (a descriptor's `limit`
    /// override): `SECOND` 1 to `DAY` 4, `MONTH` 5, `YEAR` 6, `WEEK` 7; `None` for `UNKNOWN`
    /// and numbers a newer Envoy may add.
    pub(crate) fn from_rate_limit_unit(n: i32) -> Option<Unit> {
        match n {
            1 => Some(Unit::Second),
            2 => Some(Unit::Minute),
            3 => Some(Unit::Hour),
            4 => Some(Unit::Day),
            5 => Some(Unit::Month),
            6 => Some(Unit::Year),
            7 => Some(Unit::Week),
            _ => None,
        }
    }

    /// The unit whose length is `d` exactly, if any.
    fn of_duration(d: Duration) -> Option<Unit> {
        [
            Unit::Second,
            Unit::Minute,
            Unit::Hour,
            Unit::Day,
            Unit::Week,
            Unit::Month,
            Unit::Year,
        ]
        .into_iter()
        .find(|u| u.duration() == d)
    }
}

impl FromStr for Unit {
    type Err = String;

    /// `second`, `minute`, `hour`, `day`, `week`, `month`, `year`, any case (as
    /// envoyproxy/ratelimit reads them).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "second" => Ok(Unit::Second),
            "minute" => Ok(Unit::Minute),
            "hour" => Ok(Unit::Hour),
            "day" => Ok(Unit::Day),
            "week" => Ok(Unit::Week),
            "month" => Ok(Unit::Month),
            "year" => Ok(Unit::Year),
            _ => Err(format!(
                "invalid rate limit unit {:?}: use second, minute, hour, day, week, month or year",
                s.chars().take(40).collect::<String>()
            )),
        }
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
enum LimitKind {
    PerUnit {
        requests_per_unit: u32,
        unit: Unit,
        algorithm: AlgorithmKind,
        burst: Option<u32>,
    },
    Quota(Quota),
    Unlimited,
}

/// The limit at a descriptor node: envoyproxy/ratelimit's `requests_per_unit` per `unit`
/// (counted with a fixed window by default, as envoyproxy/ratelimit does, or any Tollgate
/// algorithm), a Tollgate [`Quota`], or unlimited.
#[derive(Clone, Debug, PartialEq)]
pub struct RateLimit {
    kind: LimitKind,
    name: Option<String>,
}

impl RateLimit {
    /// `requests_per_unit` requests per `unit`, fixed window.
    pub fn per(requests_per_unit: u32, unit: Unit) -> Self {
        RateLimit {
            kind: LimitKind::PerUnit {
                requests_per_unit,
                unit,
                algorithm: AlgorithmKind::FixedWindow,
                burst: None,
            },
            name: None,
        }
    }

    /// A Tollgate quota (any algorithm, any window).
    pub fn quota(quota: Quota) -> Self {
        RateLimit {
            kind: LimitKind::Quota(quota),
            name: None,
        }
    }

    /// No limit: matching descriptors are always OK and never counted.
    pub fn unlimited() -> Self {
        RateLimit {
            kind: LimitKind::Unlimited,
            name: None,
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

    /// A name reported in `DescriptorStatus.current_limit.name`.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Whether this is [`unlimited`](Self::unlimited).
    pub fn is_unlimited(&self) -> bool {
        matches!(self.kind, LimitKind::Unlimited)
    }

    /// The Tollgate quota, or `None` for unlimited.
    fn to_quota(&self) -> Result<Option<Quota>, String> {
        let quota = match &self.kind {
            LimitKind::Unlimited => return Ok(None),
            LimitKind::Quota(q) => q.clone(),
            &LimitKind::PerUnit {
                requests_per_unit,
                unit,
                algorithm,
                burst,
            } => {
                if requests_per_unit == 0 {
                    return Err(
                        "requests_per_unit must be at least 1 (use `unlimited: true` for no limit)"
                            .to_owned(),
                    );
                }
                let window = unit.duration();
                let rate = || Rate::new(requests_per_unit, window);
                let q = match algorithm {
                    AlgorithmKind::FixedWindow => Quota::fixed_window(requests_per_unit, window),
                    AlgorithmKind::SlidingWindowLog => {
                        Quota::sliding_window_log(requests_per_unit, window)
                    }
                    AlgorithmKind::SlidingWindowCounter => {
                        Quota::sliding_window_counter(requests_per_unit, window)
                    }
                    AlgorithmKind::TokenBucket => rate()
                        .and_then(|r| Quota::token_bucket(burst.unwrap_or(requests_per_unit), r)),
                    AlgorithmKind::LeakyBucket => rate()
                        .and_then(|r| Quota::leaky_bucket(r, burst.unwrap_or(requests_per_unit))),
                };
                q.map_err(|e| e.to_string())?
            }
        };
        Ok(Some(quota))
    }

    /// What `current_limit` reports: requests per unit.
    fn proto(&self, quota: &Quota, policy_name: &str) -> ProtoRateLimit {
        let name = self.name.clone().unwrap_or_else(|| policy_name.to_owned());
        let (requests_per_unit, unit) = match &self.kind {
            LimitKind::PerUnit {
                requests_per_unit,
                unit,
                ..
            } => (*requests_per_unit, unit.proto()),
            _ => match Unit::of_duration(quota.window()) {
                Some(unit) => (quota.limit(), unit.proto()),
                // A window that is no unit: report it per second, rounded down.
                None => {
                    let secs = quota.window().as_secs_f64().max(1e-6);
                    let per_sec = (f64::from(quota.limit()) / secs).floor();
                    // Saturating conversion: `as` clamps floats into the integer range.
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    let per_sec = per_sec as u32;
                    (per_sec, ProtoUnit::Second)
                }
            },
        };
        ProtoRateLimit {
            name,
            requests_per_unit,
            unit: unit as i32,
        }
    }
}

/// A node of a descriptor tree: matches a request descriptor entry by `key` and, when given,
/// `value`; holds a [`RateLimit`] and/or nested descriptors.
#[derive(Clone, Debug, PartialEq)]
pub struct Descriptor {
    key: String,
    value: Option<String>,
    rate_limit: Option<RateLimit>,
    shadow_mode: bool,
    descriptors: Vec<Descriptor>,
}

impl Descriptor {
    /// A node for entries with this key, any value (each distinct value counted on its own).
    pub fn new(key: impl Into<String>) -> Self {
        Descriptor {
            key: key.into(),
            value: None,
            rate_limit: None,
            shadow_mode: false,
            descriptors: Vec::new(),
        }
    }

    /// Matches only this value (an exact match wins over a key-only node). A value ending in
    /// `*` matches every value that starts with what precedes the `*`.
    pub fn value(mut self, value: impl Into<String>) -> Self {
        self.value = Some(value.into());
        self
    }

    /// The limit applied when a request descriptor's last entry stops at this node.
    pub fn rate_limit(mut self, limit: RateLimit) -> Self {
        self.rate_limit = Some(limit);
        self
    }

    /// Shadow mode: count the requests but always report OK.
    pub fn shadow_mode(mut self, shadow: bool) -> Self {
        self.shadow_mode = shadow;
        self
    }

    /// Adds a nested descriptor, matched against the request descriptor's next entry.
    pub fn descriptor(mut self, child: Descriptor) -> Self {
        self.descriptors.push(child);
        self
    }

    /// Adds nested descriptors.
    pub fn descriptors(mut self, children: impl IntoIterator<Item = Descriptor>) -> Self {
        self.descriptors.extend(children);
        self
    }
}

/// A domain: a named descriptor tree. Requests name their domain.
#[derive(Clone, Debug, PartialEq)]
pub struct Domain {
    name: String,
    descriptors: Vec<Descriptor>,
    source: Option<String>,
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

/// What to answer when the store fails.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailureMode {
    /// Answer OK (fail open): traffic flows while the store is down. The default.
    #[default]
    Allow,
    /// Answer gRPC `UNAVAILABLE`, so Envoy's `failure_mode_deny` decides.
    Unavailable,
}

impl FromStr for FailureMode {
    type Err = String;

    /// `allow` (also `open`) or `unavailable` (also `deny`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "allow" | "open" => Ok(FailureMode::Allow),
            "unavailable" | "deny" => Ok(FailureMode::Unavailable),
            _ => Err(format!(
                "invalid failure_mode {:?}: use \"allow\" or \"unavailable\"",
                s.chars().take(40).collect::<String>()
            )),
        }
    }
}

/// How `X-RateLimit-Reset` is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ResetFormat {
    /// Unix epoch seconds (as GitHub does). The default.
    #[default]
    Epoch,
    /// Seconds from now.
    Delta,
}

/// The whole configuration of the rate limit service.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    domains: Vec<Domain>,
    failure_mode: FailureMode,
    x_ratelimit_headers: bool,
    ietf_headers: bool,
    reset_format: ResetFormat,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            domains: Vec::new(),
            failure_mode: FailureMode::Allow,
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
    pub fn failure_mode(mut self, mode: FailureMode) -> Self {
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

    /// Checks the configuration and builds the matching trees.
    pub(crate) fn compile(&self) -> Result<Compiled, ConfigError> {
        let mut domains = HashMap::with_capacity(self.domains.len());
        let mut names = HashSet::new();
        for domain in &self.domains {
            let location = match &domain.source {
                Some(src) => format!("{src}: domain {:?}", domain.name),
                None => format!("domain {:?}", domain.name),
            };
            if domain.name.is_empty() {
                return Err(ConfigError::new(location, "the domain must not be empty"));
            }
            if domains.contains_key(domain.name.as_str()) {
                return Err(ConfigError::new(location, "the domain is defined twice"));
            }
            let mut path = domain.name.clone();
            let tree = compile_tree(&domain.descriptors, &mut path, &location, &mut names)?;
            domains.insert(domain.name.clone(), tree);
        }
        Ok(Compiled {
            domains,
            failure_mode: self.failure_mode,
            x_ratelimit_headers: self.x_ratelimit_headers,
            ietf_headers: self.ietf_headers,
            reset_format: self.reset_format,
        })
    }
}

/// The compiled configuration.
#[derive(Debug)]
pub(crate) struct Compiled {
    pub(crate) domains: HashMap<String, Tree>,
    pub(crate) failure_mode: FailureMode,
    pub(crate) x_ratelimit_headers: bool,
    pub(crate) ietf_headers: bool,
    pub(crate) reset_format: ResetFormat,
}

/// The children of a node, by key.
#[derive(Debug, Default)]
pub(crate) struct Tree {
    by_key: HashMap<String, KeyNodes>,
}

#[derive(Debug, Default)]
struct KeyNodes {
    exact: HashMap<String, Node>,
    prefix: Vec<(String, Node)>,
    any: Option<Box<Node>>,
}

#[derive(Debug)]
struct Node {
    leaf: Option<Leaf>,
    children: Tree,
}

/// A matched limit.
#[derive(Debug)]
pub(crate) struct Leaf {
    /// `None` when unlimited.
    pub(crate) policy: Option<Policy>,
    pub(crate) shadow: bool,
    pub(crate) current_limit: Option<ProtoRateLimit>,
    /// The policy name quoted as a structured-field string.
    pub(crate) quoted_name: String,
    /// `"name";q=..;w=..`.
    pub(crate) policy_item: String,
}

impl Tree {
    /// The leaf for a request descriptor's entries, walked the way envoyproxy/ratelimit walks
    /// them: entry by entry down the tree, an exact key+value node before a prefix (`value*`)
    /// node before a key-only node; the limit applies only if the descriptor's last entry stops
    /// at a node that has one.
    pub(crate) fn find<'a, 'e>(
        &'a self,
        entries: impl ExactSizeIterator<Item = (&'e str, &'e str)>,
    ) -> Option<&'a Leaf> {
        let last = entries.len().checked_sub(1)?;
        let mut tree = self;
        for (i, (key, value)) in entries.enumerate() {
            let nodes = tree.by_key.get(key)?;
            let node = nodes
                .exact
                .get(value)
                .or_else(|| {
                    nodes
                        .prefix
                        .iter()
                        .find(|(p, _)| value.starts_with(p.as_str()))
                        .map(|(_, n)| n)
                })
                .or(nodes.any.as_deref())?;
            if i == last {
                return node.leaf.as_ref();
            }
            tree = &node.children;
        }
        None
    }
}

fn compile_tree(
    descriptors: &[Descriptor],
    path: &mut String,
    location: &str,
    names: &mut HashSet<String>,
) -> Result<Tree, ConfigError> {
    let mut tree = Tree::default();
    for d in descriptors {
        let segment = match &d.value {
            Some(v) => format!("{}_{}", d.key, v),
            None => d.key.clone(),
        };
        let here = format!("{location}, descriptor {path}.{segment}");
        if d.key.is_empty() {
            return Err(ConfigError::new(here, "a descriptor key must not be empty"));
        }
        let saved = path.len();
        path.push('.');
        path.push_str(&segment);
        let leaf = match &d.rate_limit {
            None => None,
            Some(limit) => Some(compile_leaf(limit, d.shadow_mode, path, names, &here)?),
        };
        let children = compile_tree(&d.descriptors, path, location, names)?;
        path.truncate(saved);
        let node = Node { leaf, children };
        let nodes = tree.by_key.entry(d.key.clone()).or_default();
        let duplicate = match &d.value {
            None => nodes.any.replace(Box::new(node)).is_some(),
            Some(v) if v.ends_with('*') => {
                let prefix = v.trim_end_matches('*').to_owned();
                let dup = nodes.prefix.iter().any(|(p, _)| *p == prefix);
                nodes.prefix.push((prefix, node));
                dup
            }
            Some(v) => nodes.exact.insert(v.clone(), node).is_some(),
        };
        if duplicate {
            return Err(ConfigError::new(
                here,
                "the same key and value appear twice at this level",
            ));
        }
    }
    Ok(tree)
}

pub(crate) fn compile_leaf(
    limit: &RateLimit,
    shadow: bool,
    path: &str,
    names: &mut HashSet<String>,
    here: &str,
) -> Result<Leaf, ConfigError> {
    let quota = limit
        .to_quota()
        .map_err(|reason| ConfigError::new(here, reason))?;
    let Some(quota) = quota else {
        return Ok(Leaf {
            policy: None,
            shadow,
            current_limit: None,
            quoted_name: String::new(),
            policy_item: String::new(),
        });
    };
    let name = policy_name(path, names);
    let policy = Policy::new(&name, quota).map_err(|e| ConfigError::new(here, e.to_string()))?;
    let current_limit = Some(limit.proto(policy.quota(), &name));
    let quoted_name = sf_string(&name);
    // Rendered once here with the shared renderer, so a request only formats its numbers.
    let mut policy_item = String::with_capacity(quoted_name.len() + 24);
    headers::write_policy_item(&mut policy_item, &quoted_name, policy.quota());
    Ok(Leaf {
        policy: Some(policy),
        shadow,
        current_limit,
        quoted_name,
        policy_item,
    })
}

/// A policy name from a descriptor path (`domain.key_value.key`): control characters become
/// `_`, and a name longer than a policy name may be, or one already taken, is cut and given a
/// hash of the full path.
fn policy_name(path: &str, names: &mut HashSet<String>) -> String {
    let clean: String = path
        .chars()
        .map(|c| if c.is_control() { '_' } else { c })
        .collect();
    let name = if clean.len() <= MAX_POLICY_NAME && !names.contains(&clean) {
        clean
    } else {
        let mut cut = MAX_POLICY_NAME - 20;
        while !clean.is_char_boundary(cut.min(clean.len())) {
            cut -= 1;
        }
        let cut = cut.min(clean.len());
        // Salted with how many names exist, so two paths that clean to one name differ.
        let salt = u64::try_from(names.len()).unwrap_or(u64::MAX);
        format!("{}~{:016x}", &clean[..cut], fnv1a(path.as_bytes()) ^ salt)
    };
    names.insert(name.clone());
    name
}

/// The policy name as a structured-field string (`tollgate::headers::quoted`). Descriptor
/// values may hold any UTF-8, which a structured-field string cannot: such characters become
/// `_` in the header (the policy and its counts keep the real name).
fn sf_string(s: &str) -> String {
    let printable: std::borrow::Cow<'_, str> = if headers::is_printable_ascii(s) {
        s.into()
    } else {
        s.chars()
            .map(|c| if (' '..='~').contains(&c) { c } else { '_' })
            .collect::<String>()
            .into()
    };
    // Printable ASCII by now, so `quoted` always answers.
    headers::quoted(&printable).unwrap_or_else(|| "\"_\"".to_owned())
}

/// FNV-1a, 64 bits: tiny and stable, to tell apart long policy names.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn tree() -> Compiled {
        Config::new()
            .domain(
                Domain::new("d")
                    .descriptor(Descriptor::new("k").rate_limit(RateLimit::per(5, Unit::Second)))
                    .descriptor(
                        Descriptor::new("k")
                            .value("v")
                            .rate_limit(RateLimit::per(1, Unit::Minute)),
                    )
                    .descriptor(
                        Descriptor::new("a")
                            .descriptor(
                                Descriptor::new("b").rate_limit(RateLimit::per(3, Unit::Hour)),
                            )
                            .descriptor(
                                Descriptor::new("p")
                                    .value("pre*")
                                    .rate_limit(RateLimit::per(9, Unit::Day)),
                            ),
                    ),
            )
            .compile()
            .unwrap()
    }

    fn name(c: &Compiled, entries: &[(&str, &str)]) -> Option<&'static str> {
        c.domains["d"]
            .find(entries.iter().copied())
            .and_then(|l| l.policy.as_ref())
            .map(Policy::name)
    }

    #[test]
    fn matching_follows_envoy_ratelimit() {
        let c = tree();
        assert_eq!(name(&c, &[("k", "v")]), Some("d.k_v"));
        assert_eq!(name(&c, &[("k", "other")]), Some("d.k"));
        assert_eq!(name(&c, &[("a", "x")]), None);
        assert_eq!(name(&c, &[("a", "x"), ("b", "y")]), Some("d.a.b"));
        assert_eq!(name(&c, &[("a", "x"), ("p", "prefix")]), Some("d.a.p_pre*"));
        assert_eq!(name(&c, &[("a", "x"), ("p", "nope")]), None);
        assert_eq!(name(&c, &[("a", "x"), ("b", "y"), ("c", "z")]), None);
        assert_eq!(name(&c, &[("zz", "x")]), None);
        assert_eq!(name(&c, &[]), None);
    }

    #[test]
    fn duplicates_and_bad_limits_are_rejected() {
        let dup = Config::new()
            .domain(Domain::new("d"))
            .domain(Domain::new("d"))
            .compile();
        assert!(dup.unwrap_err().reason().contains("twice"));
        let zero = Config::new()
            .domain(
                Domain::new("d")
                    .descriptor(Descriptor::new("k").rate_limit(RateLimit::per(0, Unit::Second))),
            )
            .compile()
            .unwrap_err();
        assert!(zero.to_string().contains("d.k"), "{zero}");
    }

    #[test]
    fn long_names_are_cut_and_hashed() {
        let mut names = HashSet::new();
        let long = "x".repeat(300);
        let n = policy_name(&long, &mut names);
        assert!(n.len() <= MAX_POLICY_NAME);
        let again = policy_name(&long, &mut names);
        assert_eq!(n.len(), again.len());
        assert_eq!(sf_string("a\"b\\é"), "\"a\\\"b\\\\_\"");
    }
}
