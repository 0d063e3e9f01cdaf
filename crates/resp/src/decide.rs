//! `TOLLGATE.CHECK policy key [cost]`: a decision under configured policies. The door parses
//! and answers; what decides is a [`Decide`], which the server implements over its engine and
//! [`LimiterDecide`] implements over a plain [`Limiter`].

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tollgate::{Clock, Decision, Error, ErrorKind, Limiter, Store, StoreError};

/// Decides `TOLLGATE.CHECK`: one request of `cost` by `key` under the policy named `policy`.
///
/// Names and keys come as the client sent them (any bytes). The future runs on the
/// connection's task, between reading a batch of pipelined requests and writing its answers;
/// a decision that is ready on its first poll (an in-memory store) costs nothing more.
pub trait Decide: Send + Sync + 'static {
    /// The decision, or why there is none.
    fn check(
        &self,
        policy: &[u8],
        key: &[u8],
        cost: u32,
    ) -> impl Future<Output = Result<CheckReply, CheckError>> + Send;

    /// The failure rule, for `CL.THROTTLE`: what a request gets when the store could not
    /// decide it (`error`). `Ok(())` admits it uncounted (answered `[0, limit, 0, -1, 0]`:
    /// nothing is known of the key); an error refuses it with that error. A decider with a
    /// failure rule (the server's `[store] on_error`) answers as its `TOLLGATE.CHECK` does; by
    /// default the store's error is the answer, as [`LimiterDecide`] answers it.
    fn store_failed(&self, error: Error) -> Result<(), CheckError> {
        Err(error.into())
    }
}

/// A decision as `TOLLGATE.CHECK` answers it.
///
/// On the wire: an array of five integers, `[allowed (1 or 0), limit, remaining, reset,
/// retry_after]`; on a connection that said `HELLO 3`, a map of the same five names
/// (`allowed`, `limit`, `remaining`, `reset`, `retry_after`) to the same integers. `reset` is
/// whole seconds rounded up; `retry_after` is seconds rounded up (at least 1) when denied, and
/// `-1` when admitted or when no wait can help.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckReply {
    /// Whether the request is admitted.
    pub allowed: bool,
    /// The quota.
    pub limit: u64,
    /// What the key can still spend now.
    pub remaining: u64,
    /// Time until the quota is fully available again.
    pub reset: Duration,
    /// When denied, time until the same request could be admitted; `None` when admitted or
    /// when it never can be.
    pub retry_after: Option<Duration>,
}

impl From<Decision> for CheckReply {
    fn from(d: Decision) -> Self {
        CheckReply {
            allowed: d.allowed,
            limit: d.limit,
            remaining: d.remaining,
            reset: d.reset,
            retry_after: if d.allowed { None } else { d.retry_after },
        }
    }
}

impl CheckReply {
    /// The five integers in wire order: allowed, limit, remaining, reset, retry_after.
    pub fn to_array(&self) -> [i64; 5] {
        let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let retry = match (self.allowed, self.retry_after) {
            (false, Some(wait)) => clamp(tollgate::headers::ceil_secs(wait).max(1)),
            _ => -1,
        };
        [
            i64::from(self.allowed),
            clamp(self.limit),
            clamp(self.remaining),
            clamp(tollgate::headers::ceil_secs(self.reset)),
            retry,
        ]
    }
}

/// Why `TOLLGATE.CHECK` has no decision; the reply is `-ERR ` and the [`Display`](fmt::Display)
/// text.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckError {
    /// No policy of that name (shown as sent, cut to 128 bytes).
    UnknownPolicy(String),
    /// The cost exceeds what the policy can ever admit.
    CostExceedsQuota {
        /// The policy.
        policy: String,
        /// The cost asked for.
        cost: u32,
        /// The most one request may cost.
        max: u32,
    },
    /// The store could not decide (Redis unreachable, a timeout); retrying later may work.
    Unavailable(String),
    /// Anything else, in a sentence.
    Other(String),
}

impl CheckError {
    /// What a decider with a failure rule answers when its store could not decide and the
    /// rule refuses (`on_error = "deny"`): `store unavailable: the store could not decide;
    /// retry shortly`, for both commands.
    pub fn store_refused() -> Self {
        CheckError::Unavailable("the store could not decide; retry shortly".to_owned())
    }

    /// The unknown-policy error for a name as the client sent it.
    pub fn unknown_policy(name: &[u8]) -> Self {
        let shown = &name[..name.len().min(128)];
        CheckError::UnknownPolicy(String::from_utf8_lossy(shown).into_owned())
    }
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckError::UnknownPolicy(name) => write!(f, "unknown policy '{name}'"),
            CheckError::CostExceedsQuota { policy, cost, max } => write!(
                f,
                "cost {cost} exceeds the quota of policy '{policy}' (at most {max} per request)"
            ),
            CheckError::Unavailable(reason) => write!(f, "store unavailable: {reason}"),
            CheckError::Other(text) => f.write_str(text),
        }
    }
}

impl std::error::Error for CheckError {}

impl From<Error> for CheckError {
    fn from(e: Error) -> Self {
        match e.into_kind() {
            ErrorKind::UnknownPolicy(name) => CheckError::UnknownPolicy(name),
            ErrorKind::CostExceedsQuota { policy, cost, max } => {
                CheckError::CostExceedsQuota { policy, cost, max }
            }
            // Its reason alone: the reply says `store unavailable:` once.
            ErrorKind::Store(StoreError::Unavailable { reason }) => CheckError::Unavailable(reason),
            ErrorKind::Store(e) => CheckError::Unavailable(e.to_string()),
            other => CheckError::Other(other.to_string()),
        }
    }
}

/// [`Decide`] over a [`Limiter`]: its policies by name. For tests and for library users; the
/// server decides through its engine instead.
#[derive(Clone, Debug)]
pub struct LimiterDecide<S, C> {
    limiter: Limiter<S, C>,
}

impl<S: Store, C: Clock> LimiterDecide<S, C> {
    /// Decides with `limiter`'s policies.
    pub fn new(limiter: Limiter<S, C>) -> Self {
        LimiterDecide { limiter }
    }

    /// The limiter.
    pub fn limiter(&self) -> &Limiter<S, C> {
        &self.limiter
    }
}

impl<S: Store, C: Clock> Decide for LimiterDecide<S, C> {
    async fn check(&self, policy: &[u8], key: &[u8], cost: u32) -> Result<CheckReply, CheckError> {
        let Ok(name) = std::str::from_utf8(policy) else {
            return Err(CheckError::unknown_policy(policy));
        };
        match self.limiter.check(name, key, cost).await {
            Ok(decision) => Ok(decision.into()),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_failure_says_store_unavailable_once() {
        let down: Error = StoreError::Unavailable {
            reason: "connection refused".to_owned(),
        }
        .into();
        assert_eq!(
            CheckError::from(down).to_string(),
            "store unavailable: connection refused"
        );
        let slow: Error = StoreError::Timeout {
            after: Duration::from_millis(50),
        }
        .into();
        assert_eq!(
            CheckError::from(slow).to_string(),
            "store unavailable: store did not answer within 50ms"
        );
    }
}
