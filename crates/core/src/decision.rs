//! What a check answers: a [`Verdict`] from one algorithm step, a [`Decision`] once it carries
//! its policy's name, and [`Decisions`] for a request checked against several policies.

use std::time::Duration;

use smallvec::SmallVec;

use crate::{BanStatus, Timestamp};

/// The outcome of one algorithm step, in microseconds: what a store computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Whether the request is admitted.
    pub allowed: bool,
    /// The quota: the most a key can spend at once.
    pub limit: u64,
    /// What the key can still spend now, after this request if it was admitted.
    pub remaining: u64,
    /// Microseconds until the quota is fully available again.
    pub reset_micros: u64,
    /// When denied, microseconds until this same request would be admitted; `None` when it
    /// never can be (its cost exceeds the quota).
    pub retry_after_micros: Option<u64>,
    /// Leaky bucket: microseconds to hold the request before it departs (0 otherwise).
    pub delay_micros: u64,
}

impl Verdict {
    /// The verdict a charge answers with: taken (a charge is never refused), with what the key
    /// has left as a peek reports it, and no retry time.
    #[inline]
    pub fn charged(peek: Verdict) -> Verdict {
        Verdict {
            allowed: true,
            retry_after_micros: None,
            delay_micros: 0,
            ..peek
        }
    }

    /// A denial that no wait fixes, reporting `limit`: a placeholder for a check refused
    /// before its quota was asked (a ban), whose decision is made elsewhere.
    #[inline]
    pub fn denied_for_good(limit: u64) -> Verdict {
        Verdict {
            allowed: false,
            limit,
            remaining: 0,
            reset_micros: 0,
            retry_after_micros: None,
            delay_micros: 0,
        }
    }

    /// The decision for the policy named `policy`.
    #[inline(always)]
    pub fn into_decision(self, policy: &'static str) -> Decision {
        Decision {
            policy,
            allowed: self.allowed,
            limit: self.limit,
            remaining: self.remaining,
            reset: Duration::from_micros(self.reset_micros),
            retry_after: if self.allowed {
                None
            } else {
                self.retry_after_micros.map(Duration::from_micros)
            },
            delay: (self.allowed && self.delay_micros > 0)
                .then(|| Duration::from_micros(self.delay_micros)),
            ban: BanStatus::None,
        }
    }
}

/// How one policy treated one request, as every door counts it in its metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Admitted.
    Allowed,
    /// Refused (over the limit).
    Denied,
    /// A shadow policy would have refused it; it went on.
    Shadow,
    /// The store failed and the request went on undecided ([`OnError::Allow`](crate::OnError)).
    FailOpen,
    /// The store failed and the request was refused as unavailable
    /// ([`OnError::Deny`](crate::OnError)).
    FailClosed,
}

impl Outcome {
    /// Every outcome, in the order of their [`index`](Self::index).
    pub const ALL: [Outcome; 5] = [
        Outcome::Allowed,
        Outcome::Denied,
        Outcome::Shadow,
        Outcome::FailOpen,
        Outcome::FailClosed,
    ];

    /// The metrics label: `allowed`, `denied`, `shadow`, `fail_open` or `fail_closed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Denied => "denied",
            Outcome::Shadow => "shadow",
            Outcome::FailOpen => "fail_open",
            Outcome::FailClosed => "fail_closed",
        }
    }

    /// Its place in [`Outcome::ALL`], for counters kept in an array.
    pub fn index(self) -> usize {
        self as usize
    }

    /// What a decision of a policy counts as: a refusal by a shadow policy is [`Shadow`].
    ///
    /// [`Shadow`]: Outcome::Shadow
    pub fn of(decision: &Decision, shadow: bool) -> Outcome {
        match (decision.allowed, shadow) {
            (true, _) => Outcome::Allowed,
            (false, true) => Outcome::Shadow,
            (false, false) => Outcome::Denied,
        }
    }
}

/// A policy's answer for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The name of the policy that decided.
    pub policy: &'static str,
    /// Whether this policy admits the request.
    pub allowed: bool,
    /// The quota (requests per window, bucket capacity).
    pub limit: u64,
    /// What the key can still spend now (never negative).
    pub remaining: u64,
    /// Time until the quota is fully available again.
    pub reset: Duration,
    /// When denied: time until this same request could be admitted. `None` when admitted, and
    /// also when denied for good (a cost above the quota), so it never lies.
    pub retry_after: Option<Duration>,
    /// Leaky bucket: how long to hold the request before passing it on.
    pub delay: Option<Duration>,
    /// Whether the denial was a lockout (see [`Ban`](crate::Ban)): `retry_after` is then when
    /// it ends.
    pub ban: BanStatus,
}

/// The decisions for one request checked against several policies, all-or-nothing: the request
/// is admitted only if every policy admits it, and then it has consumed from every one; if any
/// policy denies it, it has consumed from none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decisions {
    items: SmallVec<[Decision; 2]>,
    /// The instant they were decided at, when the caller recorded it ([`at`](Self::at)).
    decided_at: Option<Timestamp>,
}

impl Decisions {
    /// An empty set (a request no policy applies to is admitted).
    pub fn new() -> Self {
        Decisions::default()
    }

    /// Adds a decision.
    pub fn push(&mut self, decision: Decision) {
        self.items.push(decision);
    }

    /// Whether the request is admitted: every policy admits it.
    pub fn allowed(&self) -> bool {
        self.items.iter().all(|d| d.allowed)
    }

    /// The decisions, in the order of the checks.
    pub fn as_slice(&self) -> &[Decision] {
        &self.items
    }

    /// How many policies decided.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether no policy decided.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The same decisions, recorded as made at `now` (the time the store was given): a
    /// decision's `reset` counts from there, so an absolute reset time (`X-RateLimit-Reset`)
    /// is `now + reset`, not a later reading of the clock plus `reset`, which would round a
    /// window's whole-second end up to the next second.
    pub fn at(mut self, now: Timestamp) -> Self {
        self.decided_at = Some(now);
        self
    }

    /// When they were decided, if recorded ([`at`](Self::at)).
    pub fn decided_at(&self) -> Option<Timestamp> {
        self.decided_at
    }

    /// The decision that headers report: a denying one first, then the lowest `remaining`, ties
    /// broken by the latest `reset`.
    pub fn most_restrictive(&self) -> Option<&Decision> {
        self.items.iter().min_by(|a, b| {
            a.allowed
                .cmp(&b.allowed)
                .then(a.remaining.cmp(&b.remaining))
                .then(b.reset.cmp(&a.reset))
        })
    }

    /// When denied: how long until every denying policy could admit the request (the latest of
    /// their `retry_after`). `None` when admitted or when some policy can never admit it.
    pub fn retry_after(&self) -> Option<Duration> {
        let mut latest: Option<Duration> = None;
        for d in self.items.iter().filter(|d| !d.allowed) {
            let r = d.retry_after?;
            latest = Some(latest.map_or(r, |l| l.max(r)));
        }
        latest
    }

    /// The longest hold any policy asks for (leaky buckets with `delay`).
    pub fn delay(&self) -> Option<Duration> {
        self.items.iter().filter_map(|d| d.delay).max()
    }

    /// The first decision, for single-policy checks.
    pub fn into_first(self) -> Option<Decision> {
        self.items.into_iter().next()
    }
}

impl IntoIterator for Decisions {
    type Item = Decision;
    type IntoIter = smallvec::IntoIter<[Decision; 2]>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.into_iter()
    }
}

impl<'a> IntoIterator for &'a Decisions {
    type Item = &'a Decision;
    type IntoIter = std::slice::Iter<'a, Decision>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}

impl Extend<Decision> for Decisions {
    fn extend<I: IntoIterator<Item = Decision>>(&mut self, iter: I) {
        self.items.extend(iter);
    }
}

impl FromIterator<Decision> for Decisions {
    fn from_iter<I: IntoIterator<Item = Decision>>(iter: I) -> Self {
        Decisions {
            items: iter.into_iter().collect(),
            decided_at: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(name: &str, allowed: bool, remaining: u64, reset: u64) -> Decision {
        Decision {
            policy: Box::leak(name.to_owned().into_boxed_str()),
            allowed,
            limit: 10,
            remaining,
            reset: Duration::from_secs(reset),
            retry_after: (!allowed).then(|| Duration::from_secs(reset)),
            delay: None,
            ban: BanStatus::None,
        }
    }

    #[test]
    fn most_restrictive_prefers_denials_then_low_remaining_then_late_reset() {
        let ds: Decisions = [
            decision("a", true, 3, 10),
            decision("b", true, 3, 50),
            decision("c", true, 7, 99),
        ]
        .into_iter()
        .collect();
        assert_eq!(ds.most_restrictive().map(|d| d.policy), Some("b"));
        let ds: Decisions = [decision("a", true, 0, 10), decision("d", false, 5, 1)]
            .into_iter()
            .collect();
        assert_eq!(ds.most_restrictive().map(|d| d.policy), Some("d"));
        assert!(!ds.allowed());
    }

    #[test]
    fn retry_after_is_the_latest_denial_and_none_if_any_is_final() {
        let mut ds: Decisions = [decision("a", false, 0, 3), decision("b", false, 0, 9)]
            .into_iter()
            .collect();
        assert_eq!(ds.retry_after(), Some(Duration::from_secs(9)));
        let mut never = decision("c", false, 0, 1);
        never.retry_after = None;
        ds.push(never);
        assert_eq!(ds.retry_after(), None);
    }
}
