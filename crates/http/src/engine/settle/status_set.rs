//! The response statuses a policy counts (`count_status`): [`StatusSet`], parsed from the
//! configuration's list of codes and classes. Kept apart from the true-up, which only asks it
//! whether a status counts.

use std::fmt;

use smallvec::SmallVec;

use crate::ConfigError;

/// The response statuses a policy counts (`count_status = ["401", "403", "5xx"]`): exact codes
/// and classes. The others cost nothing: admission's charge is given back.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StatusSet {
    codes: SmallVec<[u16; 4]>,
    /// Classes by their first digit (`5xx`: index 5).
    classes: [bool; 10],
}

impl StatusSet {
    /// Parses `["401", "403", "5xx"]`: three-digit codes from 200 to 599, or classes `2xx` to
    /// `5xx`. At least one. A 1xx is refused: an interim response never ends a request, so a
    /// policy counting one would count nothing.
    pub fn parse<I, T>(items: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = T>,
        T: AsRef<str>,
    {
        let mut set = StatusSet {
            codes: SmallVec::new(),
            classes: [false; 10],
        };
        for item in items {
            let text = item.as_ref().trim();
            let bytes = text.as_bytes();
            match bytes {
                [b'1', b'0'..=b'9' | b'x' | b'X', b'0'..=b'9' | b'x' | b'X'] => {
                    return Err(ConfigError::new(
                        text,
                        "a 1xx response is interim and never ends a request, so it would never count; list final statuses (200 to 599, or \"2xx\" to \"5xx\")",
                    ));
                }
                [d @ b'2'..=b'5', b'x' | b'X', b'x' | b'X'] => {
                    set.classes[usize::from(d - b'0')] = true;
                }
                [b'2'..=b'5', b'0'..=b'9', b'0'..=b'9'] => {
                    let code = text
                        .parse::<u16>()
                        .map_err(|_| ConfigError::new(text, "not a status"))?;
                    if !set.codes.contains(&code) {
                        set.codes.push(code);
                    }
                }
                _ => {
                    return Err(ConfigError::new(
                        text,
                        "a status is a code from 200 to 599 (\"401\") or a class (\"5xx\")",
                    ));
                }
            }
        }
        if set.codes.is_empty() && !set.classes.contains(&true) {
            return Err(ConfigError::new(
                "[]",
                "list at least one status or class, like [\"401\", \"5xx\"]",
            ));
        }
        Ok(set)
    }

    /// Whether `status` counts.
    pub fn contains(&self, status: u16) -> bool {
        self.codes.contains(&status)
            || self
                .classes
                .get(usize::from(status / 100))
                .copied()
                .unwrap_or(false)
    }
}

impl fmt::Display for StatusSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut item = |f: &mut fmt::Formatter<'_>, text: &dyn fmt::Display| {
            let sep = if first { "" } else { ", " };
            first = false;
            write!(f, "{sep}{text}")
        };
        for code in &self.codes {
            item(f, code)?;
        }
        for (class, on) in self.classes.iter().enumerate() {
            if *on {
                item(f, &format_args!("{class}xx"))?;
            }
        }
        Ok(())
    }
}
