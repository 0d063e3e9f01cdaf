//! Configuration errors: every parser and the engine builder say which input was wrong and why,
//! so the server can print them next to the offending line of its config file.

use std::fmt;

/// An invalid key selector, path pattern, method, host, CIDR, JWT key or policy setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    input: String,
    reason: String,
}

impl ConfigError {
    pub(crate) fn new(input: &str, reason: impl Into<String>) -> Self {
        // Config values can be long or hostile; never echo more than a line of them.
        let mut shown: String = input.chars().take(80).collect();
        if shown.len() < input.len() {
            shown.push('…');
        }
        ConfigError {
            input: shown,
            reason: reason.into(),
        }
    }

    /// The rejected text (cut to 80 characters).
    pub fn input(&self) -> &str {
        &self.input
    }

    /// Why it was rejected, and what to write instead.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {:?}: {}", self.input, self.reason)
    }
}

impl std::error::Error for ConfigError {}

impl From<tollgate::headers::UnknownResetFormat> for ConfigError {
    fn from(e: tollgate::headers::UnknownResetFormat) -> Self {
        ConfigError::new(e.input(), e.to_string())
    }
}
