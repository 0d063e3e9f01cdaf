//! Errors of the core. A denial is not among them: it is a [`Decision`](crate::Decision) with
//! `allowed == false`. These are for input that can never work and for stores that fail.

use std::fmt;
use std::time::Duration;

use crate::Decision;

/// An invalid quota, rate, duration or policy, naming the input and what was wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaError {
    input: String,
    reason: String,
}

impl QuotaError {
    pub(crate) fn new(input: &str, reason: &str) -> Self {
        // Inputs can come from anywhere; never echo an unbounded one into logs.
        let mut shown: String = input.chars().take(80).collect();
        if shown.len() < input.len() {
            shown.push('…');
        }
        QuotaError {
            input: shown,
            reason: reason.to_owned(),
        }
    }

    /// The text that was rejected (cut to 80 characters).
    pub fn input(&self) -> &str {
        &self.input
    }

    /// Why it was rejected, and what to write instead.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for QuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {:?}: {}", self.input, self.reason)
    }
}

impl std::error::Error for QuotaError {}

/// A store could not make a decision.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store cannot be reached (connection refused or lost). Retrying later makes sense.
    #[error("store unavailable: {reason}")]
    Unavailable {
        /// What failed.
        reason: String,
    },
    /// The store did not answer in time. Retrying later makes sense.
    #[error("store did not answer within {after:?}")]
    Timeout {
        /// The timeout that elapsed.
        after: Duration,
    },
    /// The store answered something this client does not understand (a script error, an
    /// unexpected reply type). Retrying will not help until the cause is fixed.
    #[error("unexpected store reply: {reason}")]
    Protocol {
        /// What was wrong with the reply.
        reason: String,
    },
}

impl StoreError {
    /// Whether the same call may succeed later.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable { .. } | StoreError::Timeout { .. }
        )
    }
}

/// An error of the [`Limiter`](crate::Limiter): what went wrong is its [`kind`](Error::kind).
///
/// One pointer wide, as `std::io::Error` is, so that `Result<Decision, Error>` is a decision with
/// a spare value for "error" and nothing more. With the kinds inline (40 bytes), a caller that
/// moved the result copied the error's bytes out of the decision's before testing which it
/// was; those wide loads over the decision's just-written fields stalled on store forwarding,
/// about 8% of a memory-store check of a hot key (`perf annotate`, `benches/check.rs`). Errors
/// are rare; the allocation is on their path only.
#[derive(thiserror::Error)]
#[error(transparent)]
pub struct Error(Box<ErrorKind>);

/// What went wrong, for [`Error::kind`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// No policy of that name was registered.
    #[error("unknown policy {0:?}")]
    UnknownPolicy(String),
    /// Two policies were registered under one name.
    #[error("policy {0:?} is defined twice")]
    DuplicatePolicy(String),
    /// The cost exceeds what the quota can ever admit: no amount of waiting helps.
    #[error("cost {cost} exceeds the quota of policy {policy:?} (at most {max} per request)")]
    CostExceedsQuota {
        /// The policy.
        policy: String,
        /// The requested cost.
        cost: u32,
        /// The largest cost the policy admits.
        max: u32,
    },
    /// The call does not fit the policy's kind: a check of a concurrency limit (which is held
    /// with [`Limiter::take_slot`](crate::Limiter::take_slot)), or a slot of a policy that is
    /// not one.
    #[error("policy {policy:?} {reason}")]
    WrongKind {
        /// The policy.
        policy: String,
        /// What it is, and the call that fits it.
        reason: &'static str,
    },
    /// [`Limiter::acquire`](crate::Limiter::acquire) could not get a slot within its bound.
    #[error("refused by policy {:?}; retry after {:?}", .0.policy, .0.retry_after)]
    Refused(Box<Decision>),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Error {
    /// What went wrong.
    pub fn kind(&self) -> &ErrorKind {
        &self.0
    }

    /// What went wrong, by value (to take a refused [`Decision`] or a [`StoreError`] out).
    pub fn into_kind(self) -> ErrorKind {
        *self.0
    }

    /// Whether the same call may succeed later.
    pub fn is_retryable(&self) -> bool {
        match self.kind() {
            ErrorKind::Refused(d) => d.retry_after.is_some(),
            ErrorKind::Store(e) => e.is_retryable(),
            _ => false,
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl From<ErrorKind> for Error {
    #[cold]
    fn from(kind: ErrorKind) -> Self {
        Error(Box::new(kind))
    }
}

impl From<StoreError> for Error {
    #[cold]
    fn from(error: StoreError) -> Self {
        ErrorKind::Store(error).into()
    }
}
