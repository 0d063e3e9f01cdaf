//! [`Wildcard`]: a descriptor value with `*` anywhere (`foo*`, `bar*b`, `foo*bar*baz`), split
//! once at load time so matching a request value allocates nothing. Each `*` matches any run
//! of characters, the empty one included, as envoyproxy/ratelimit matches them.

/// A value pattern with at least one `*`.
#[derive(Debug)]
pub(crate) struct Wildcard {
    pattern: Box<str>,
    /// The literal runs between the stars: at least two (the first and the last may be empty).
    parts: Box<[Box<str>]>,
}

impl Wildcard {
    /// The pattern of `value`, or `None` when it has no `*`.
    pub(crate) fn new(value: &str) -> Option<Wildcard> {
        if !value.contains('*') {
            return None;
        }
        Some(Wildcard {
            pattern: value.into(),
            parts: value.split('*').map(Box::from).collect(),
        })
    }

    /// The pattern as written.
    pub(crate) fn pattern(&self) -> &str {
        &self.pattern
    }

    /// Whether `value` matches: it starts with the first literal run, ends with the last, and
    /// holds the ones between in order, none overlapping (leftmost match of each run is enough
    /// for `*`-only patterns).
    pub(crate) fn matches(&self, value: &str) -> bool {
        let Some((first, rest)) = self.parts.split_first() else {
            return false;
        };
        let Some((last, middle)) = rest.split_last() else {
            return false;
        };
        let Some(inner) = value
            .strip_prefix(&**first)
            .and_then(|v| v.strip_suffix(&**last))
        else {
            return false;
        };
        let mut inner = inner;
        for part in middle {
            match inner.find(&**part) {
                Some(at) => inner = &inner[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::Wildcard;

    fn matches(pattern: &str, value: &str) -> bool {
        Wildcard::new(pattern).unwrap().matches(value)
    }

    #[test]
    fn stars_match_any_run_in_order() {
        assert!(matches("foo*", "foo"));
        assert!(matches("foo*", "foo1"));
        assert!(!matches("foo*", "fo"));
        assert!(matches("bar*b", "barb"));
        assert!(matches("bar*b", "bar123b"));
        assert!(!matches("bar*b", "bara"));
        assert!(!matches("bar*b", "xbarb"));
        assert!(matches("foo*bar*baz", "foobarbaz"));
        assert!(matches("foo*bar*baz", "foo1bar2baz"));
        assert!(!matches("foo*bar*baz", "foo123baz"));
        assert!(!matches("foo*bar*baz", "bar456baz"));
        // Prefix and suffix never overlap.
        assert!(!matches("ab*ba", "aba"));
        assert!(matches("ab*ba", "abba"));
        assert!(matches("*", ""));
        assert!(matches("a**b", "ab"));
        assert!(matches("*x*", "yxy"));
        assert!(!matches("*x*", "yy"));
        assert!(Wildcard::new("plain").is_none());
    }
}
