//! [`Leaf`]: a limit of the tree compiled for answering requests: the Tollgate policy it counts
//! with, what `current_limit` reports, the rate limit header items rendered once, and the
//! envoyproxy/ratelimit modes (shadow, quota, shared wildcard counters, `replaces`).

use std::collections::HashSet;
use std::time::Duration;

use tollgate::headers;
use tollgate::{MAX_POLICY_NAME, Policy, Quota, Timestamp};

use crate::config::{ConfigError, Enforced, LimitKind, RateLimit, Unit};
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::RateLimit as ProtoRateLimit;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;

/// What a leaf enforces.
#[derive(Debug)]
pub(crate) enum LeafLimit {
    /// Always OK, never counted.
    Unlimited,
    /// `requests_per_unit: 0`: over the limit whenever the descriptor adds hits; never counted.
    Blocked,
    /// Counted with this policy.
    Policy(Policy),
}

/// The modes a descriptor node gives its limit.
#[derive(Debug, Default)]
pub(crate) struct LeafOptions {
    pub(crate) shadow: bool,
    pub(crate) quota_mode: bool,
    /// Per entry of the path to the leaf: the wildcard pattern that stands for the entry's
    /// value in the store key (`share_threshold`), or `None` to count each value apart.
    pub(crate) shared: Box<[Option<Box<str>>]>,
}

/// A matched limit.
#[derive(Debug)]
pub(crate) struct Leaf {
    pub(crate) limit: LeafLimit,
    pub(crate) options: LeafOptions,
    /// `rate_limit.name`, empty without one: what `replaces` names.
    pub(crate) name: Box<str>,
    /// The names of the limits this one drops from a request it applies to.
    pub(crate) replaces: Box<[String]>,
    /// What a status reports; `None` when unlimited.
    pub(crate) current_limit: Option<ProtoRateLimit>,
    /// Requests per unit counted in fixed windows aligned on the epoch (envoyproxy/ratelimit's
    /// counting): the window, so a status reports the time to its end as the peer does, even
    /// for a counter never touched.
    pub(crate) window: Option<Duration>,
    /// The policy name (empty when unlimited): what metrics count the limit's decisions under.
    pub(crate) policy_name: Box<str>,
    /// The policy name quoted as a structured-field string.
    pub(crate) quoted_name: String,
    /// `"name";q=..;w=..`.
    pub(crate) policy_item: String,
}

impl Leaf {
    /// Compiles `limit` found at the descriptor `path` (`domain.key_value.key`); `names` holds
    /// the policy names already taken, `here` locates errors.
    pub(crate) fn compile(
        limit: &RateLimit,
        options: LeafOptions,
        path: &str,
        names: &mut HashSet<String>,
        here: &str,
    ) -> Result<Leaf, ConfigError> {
        let reported_name = limit.name.clone().unwrap_or_default();
        let mut leaf = Leaf {
            limit: LeafLimit::Unlimited,
            options,
            name: reported_name.as_str().into(),
            replaces: limit.replaces.clone().into_boxed_slice(),
            current_limit: None,
            window: None,
            policy_name: "".into(),
            quoted_name: String::new(),
            policy_item: String::new(),
        };
        let enforced = limit
            .enforced()
            .map_err(|reason| ConfigError::new(here, reason))?;
        let name = match enforced {
            Enforced::Unlimited => return Ok(leaf),
            _ => policy_name(path, names),
        };
        leaf.quoted_name = sf_string(&name);
        leaf.policy_name = name.as_str().into();
        match enforced {
            Enforced::Unlimited => {}
            Enforced::Blocked(unit) => {
                leaf.limit = LeafLimit::Blocked;
                leaf.window = Some(unit.duration());
                leaf.current_limit = Some(proto_limit(reported_name, 0, unit.proto()));
                // `"name";q=0;w=<unit>`: rendered here, as no quota can hold a zero limit.
                leaf.policy_item.push_str(&leaf.quoted_name);
                leaf.policy_item.push_str(";q=0;w=");
                headers::write_u64(&mut leaf.policy_item, unit.duration().as_secs());
            }
            Enforced::Quota(quota) => {
                let policy = Policy::new(&name, quota.clone())
                    .map_err(|e| ConfigError::new(here, e.to_string()))?;
                leaf.window = fixed_unit_window(limit, &quota);
                let (requests_per_unit, unit) = per_unit(limit, &quota);
                leaf.current_limit = Some(proto_limit(reported_name, requests_per_unit, unit));
                // Rendered once here with the shared renderer, so a request only formats its
                // numbers.
                headers::write_policy_item(&mut leaf.policy_item, &leaf.quoted_name, &quota);
                leaf.limit = LeafLimit::Policy(policy);
            }
        }
        Ok(leaf)
    }

    /// The policy a counted leaf checks against.
    pub(crate) fn policy(&self) -> Option<&Policy> {
        match &self.limit {
            LeafLimit::Policy(p) => Some(p),
            _ => None,
        }
    }
}

fn proto_limit(name: String, requests_per_unit: u32, unit: ProtoUnit) -> ProtoRateLimit {
    ProtoRateLimit {
        name,
        requests_per_unit,
        unit: unit as i32,
    }
}

/// The window of a requests-per-unit limit counted in fixed windows.
fn fixed_unit_window(limit: &RateLimit, quota: &Quota) -> Option<Duration> {
    match (&limit.kind, quota.kind()) {
        (LimitKind::PerUnit { .. }, tollgate::AlgorithmKind::FixedWindow) => Some(quota.window()),
        _ => None,
    }
}

/// What `current_limit` reports: requests per unit; a Tollgate quota whose window is no unit
/// is reported per second, rounded down.
fn per_unit(limit: &RateLimit, quota: &Quota) -> (u32, ProtoUnit) {
    if let LimitKind::PerUnit {
        requests_per_unit,
        unit,
        ..
    } = &limit.kind
    {
        return (*requests_per_unit, unit.proto());
    }
    match Unit::of_duration(quota.window()) {
        Some(unit) => (quota.limit(), unit.proto()),
        None => {
            let secs = quota.window().as_secs_f64().max(1e-6);
            let per_sec = (f64::from(quota.limit()) / secs).floor();
            // Saturating conversion: `as` clamps floats into the integer range.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let per_sec = per_sec as u32;
            (per_sec, ProtoUnit::Second)
        }
    }
}

/// Time from `now` to the end of its fixed window of length `window`, windows aligned on the
/// Unix epoch (as envoyproxy/ratelimit's and Tollgate's fixed windows are): a full window at
/// its very start, never zero.
pub(crate) fn until_window_end(now: Timestamp, window: Duration) -> Duration {
    let window = u64::try_from(window.as_micros()).unwrap_or(u64::MAX);
    if window == 0 {
        return Duration::ZERO;
    }
    Duration::from_micros(window - now.as_micros() % window)
}

/// A policy name from a descriptor path (`domain.key_value.key`): control characters become
/// `_`, and a name longer than a policy name may be, or one already taken, is cut and given a
/// hash of the full path.
pub(crate) fn policy_name(path: &str, names: &mut HashSet<String>) -> String {
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
    use super::*;

    #[test]
    fn long_names_are_cut_and_hashed() {
        let mut names = HashSet::new();
        let long = "x".repeat(300);
        let n = policy_name(&long, &mut names);
        assert!(n.len() <= MAX_POLICY_NAME);
        let again = policy_name(&long, &mut names);
        assert_eq!(n.len(), again.len());
        assert_ne!(n, again);
        assert_eq!(sf_string("a\"b\\é"), "\"a\\\"b\\\\_\"");
    }
}
