//! What a limiter does when its store cannot decide: one rule for every way in, so the reverse
//! proxy, the decision API, forward-auth, Envoy's service and the tower layer answer a failed
//! store alike.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// How long a client refused because the store failed ([`OnError::Deny`]) is told to wait
/// before it tries again: a guess, since nobody knows when the store will be back, short enough
/// that a store which recovers at once loses little traffic.
pub const UNAVAILABLE_RETRY: Duration = Duration::from_secs(1);

/// What to do with a request when the store fails (unreachable, too slow, or a reply that
/// cannot be read).
///
/// Neither answer claims a quota it does not know: an admitted request carries no rate-limit
/// headers, and a refused one is "service unavailable" (HTTP 503, gRPC `UNAVAILABLE`), never
/// "too many requests", since the client may well be within its quota.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OnError {
    /// Admit the request undecided ("fail open"): nothing is counted and nothing is reported.
    #[default]
    Allow,
    /// Refuse the request as unavailable, retry in [`UNAVAILABLE_RETRY`] ("fail closed").
    Deny,
    /// Decide from this instance's own memory until the shared store answers again. A
    /// deployment of N instances then admits up to N times the quota; a store that cannot fall
    /// back (the memory store never fails) treats it as [`OnError::Allow`].
    Local,
}

impl OnError {
    /// The configuration name: `"allow"`, `"deny"` or `"local"`.
    pub fn as_str(self) -> &'static str {
        match self {
            OnError::Allow => "allow",
            OnError::Deny => "deny",
            OnError::Local => "local",
        }
    }

    /// Whether a request the store could not decide is admitted (every mode but
    /// [`OnError::Deny`]: under `Local`, only a failed fallback gets here).
    pub fn admits(self) -> bool {
        self != OnError::Deny
    }
}

impl fmt::Display for OnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OnError {
    type Err = String;

    /// `"allow"`, `"deny"` or `"local"`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "allow" => Ok(OnError::Allow),
            "deny" => Ok(OnError::Deny),
            "local" => Ok(OnError::Local),
            _ => Err(format!(
                "invalid on_error {:?}: use \"allow\", \"deny\" or \"local\"",
                s.chars().take(40).collect::<String>()
            )),
        }
    }
}
