//! A policy: a named quota. Requests name the policy they are checked against; stores keep one
//! state per (policy, key).

use std::collections::HashSet;
use std::fmt;
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::{Ban, Lease, Quota, QuotaError};

/// The longest policy name accepted, in bytes.
pub const MAX_POLICY_NAME: usize = 128;

/// A named quota.
///
/// Its [`fingerprint`](Self::fingerprint) covers the name *and* the quota, so when a reload
/// changes a policy's algorithm or numbers, the store starts it from fresh state instead of
/// reading old state with new meaning, while an unchanged policy keeps its counters. A
/// concurrency limit is the exception: its state, the slots its requests hold (each with its
/// own expiry), means the same under any `limit` and `lease_ttl`, and forgetting it would let
/// a reload admit a whole new limit beside the requests still running, so its fingerprint
/// covers the name and the algorithm only.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    name: &'static str,
    quota: Quota,
    fingerprint: u64,
    /// The quota's [`max_cost`](Quota::max_cost), kept at hand for every check.
    max_cost: u32,
    lease: Option<Lease>,
    ban: Option<Ban>,
}

impl Policy {
    /// A policy named `name` (1 to 128 bytes, no control characters).
    pub fn new(name: &str, quota: Quota) -> Result<Self, QuotaError> {
        if name.is_empty() || name.len() > MAX_POLICY_NAME {
            return Err(QuotaError::new(
                name,
                "a policy name must be 1 to 128 bytes long",
            ));
        }
        if name.chars().any(char::is_control) {
            return Err(QuotaError::new(
                name,
                "a policy name must not contain control characters",
            ));
        }
        let fingerprint = match &quota {
            Quota::Concurrency(_) => fnv1a(format!("{name}\u{0}concurrency").as_bytes()),
            _ => fnv1a(format!("{name}\u{0}{quota}").as_bytes()),
        };
        Ok(Policy {
            name: intern(name),
            max_cost: quota.max_cost(),
            quota,
            fingerprint,
            lease: None,
            ban: None,
        })
    }

    /// The same policy with hot-key leases for shared stores (see [`Lease`]). Refused where
    /// a lease is unsound for the quota. The [`fingerprint`](Self::fingerprint) stays the same:
    /// leases take from the same state, so turning them on or off keeps the counters.
    pub fn with_lease(mut self, lease: Lease) -> Result<Self, QuotaError> {
        lease.check(&self.quota)?;
        if self.ban.is_some() {
            return Err(lease_and_ban(&self));
        }
        self.lease = Some(lease);
        Ok(self)
    }

    /// The same policy with a lockout rule (see [`Ban`]): a key it denies `after` times within
    /// `within` is refused for the ban's duration. Like a lease, it leaves the
    /// [`fingerprint`](Self::fingerprint) alone: the quota's state is the same. Refused for a
    /// concurrency limit (its denials end whenever any request does, so they say nothing about
    /// the key) and beside a lease (a leased unit is spent without asking the store, which keeps
    /// the bans).
    pub fn with_ban(mut self, ban: Ban) -> Result<Self, QuotaError> {
        if matches!(self.quota, Quota::Concurrency(_)) {
            return Err(QuotaError::new(
                &format!("{ban} on {}", self.quota),
                "a concurrency limit cannot ban: its denials end whenever a request does",
            ));
        }
        if self.lease.is_some() {
            return Err(lease_and_ban(&self));
        }
        self.ban = Some(ban);
        Ok(self)
    }

    /// The policy's lockout rule, if it has one.
    #[inline]
    pub fn ban(&self) -> Option<&Ban> {
        self.ban.as_ref()
    }

    /// The policy's lease, if it has one.
    pub fn lease(&self) -> Option<&Lease> {
        self.lease.as_ref()
    }

    /// The largest cost one request can have (the quota's [`max_cost`](Quota::max_cost)).
    #[inline]
    pub fn max_cost(&self) -> u32 {
        self.max_cost
    }

    /// The name.
    #[inline]
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The name, as decisions carry it.
    #[inline]
    pub fn shared_name(&self) -> &'static str {
        self.name
    }

    /// The quota.
    #[inline]
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// A stable 64-bit digest of the name and the quota: the same in every process and
    /// version, so stores shared by several instances can use it in key names.
    #[inline]
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.name, self.quota)
    }
}

fn lease_and_ban(policy: &Policy) -> QuotaError {
    QuotaError::new(
        policy.name,
        "a policy cannot have both a lease and a ban: a leased unit is spent without asking the \
         store, which is where bans are kept",
    )
}

/// `name` stored for the whole process, once per distinct text.
///
/// Policy names live this way: every decision carries its policy's name, and a `&'static str`
/// costs nothing to copy, where a shared `Arc<str>` would make every decision touch one
/// reference count that all threads fight over. Integrations use it for other per-policy text
/// that every response repeats (the HTTP layer's `RateLimit-Policy` value). Reloads that keep
/// their texts add nothing; only configuration text belongs here, never per-request data.
pub fn intern(name: &str) -> &'static str {
    static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(&known) = names.get(name) {
        return known;
    }
    let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.insert(leaked);
    leaked
}

/// FNV-1a: tiny, stable across platforms and releases (unlike `std`'s hashers).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn fingerprint_follows_name_and_quota() -> Result<(), QuotaError> {
        let q = Quota::fixed_window(10, Duration::from_secs(1))?;
        let a = Policy::new("api", q.clone())?;
        let b = Policy::new("api", q.clone())?;
        let c = Policy::new("api", Quota::fixed_window(11, Duration::from_secs(1))?)?;
        let d = Policy::new("other", q)?;
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_ne!(a.fingerprint(), c.fingerprint());
        assert_ne!(a.fingerprint(), d.fingerprint());
        // A concurrency limit's slots outlive a change of its numbers.
        let slots = |limit, ttl| -> Result<u64, QuotaError> {
            let quota = Quota::concurrency(limit, Duration::from_secs(ttl))?;
            Ok(Policy::new("api", quota)?.fingerprint())
        };
        assert_eq!(slots(2, 60)?, slots(5, 300)?);
        assert_ne!(slots(2, 60)?, a.fingerprint());
        // Pinned: key names in shared stores depend on it staying the same across releases.
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c); // the published FNV-1a test vector
        Ok(())
    }

    #[test]
    fn bad_names_are_rejected() -> Result<(), QuotaError> {
        let q = Quota::fixed_window(10, Duration::from_secs(1))?;
        assert!(Policy::new("", q.clone()).is_err());
        assert!(Policy::new(&"x".repeat(129), q.clone()).is_err());
        assert!(Policy::new("a\nb", q).is_err());
        Ok(())
    }
}
