//! Which requests a policy applies to: path patterns (`*` one segment, `**` any number,
//! `{param}` one named segment), methods and host.
//!
//! Paths are matched after normalisation, so that a request cannot dodge a policy with a
//! spelling its upstream treats as the same path: percent-escapes are decoded (except `%2F`,
//! which stays part of its segment, as most servers route it), empty segments (`//`) and `.` are
//! dropped, and `..` removes the segment before it (never going above the root). So
//! `/v1/%2e%2e/admin` is matched as `/admin` and `//v1//x` as `/v1/x`.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use http::Method;
use smallvec::SmallVec;

use crate::ConfigError;
use crate::request::hex;

/// A request path split into normalised segments.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NormalizedPath<'a> {
    segments: SmallVec<[Cow<'a, [u8]>; 8]>,
}

/// Paths of more segments than this, as sent (empty, `.` and `..` ones included), are refused
/// rather than matched: no real route is that deep, and normalising a path only in part would
/// let `/a` × 300 followed by `/..` × 300 and `/admin` dodge a policy on `/admin`. The bound
/// keeps the work and memory of one hostile request small.
pub const MAX_PATH_SEGMENTS: usize = 1024;

/// A path with more than [`MAX_PATH_SEGMENTS`] segments: it cannot be normalised within the
/// bound, so it is refused (414) rather than matched half-normalised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathTooDeep;

impl fmt::Display for PathTooDeep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the path has more than {MAX_PATH_SEGMENTS} segments")
    }
}

impl std::error::Error for PathTooDeep {}

impl<'a> NormalizedPath<'a> {
    /// Normalises `path` (as sent, percent-encoded), whole: every `..` is resolved however deep
    /// the path. Fails on a path of more than [`MAX_PATH_SEGMENTS`] segments.
    pub fn new(path: &'a str) -> Result<Self, PathTooDeep> {
        let mut segments: SmallVec<[Cow<'a, [u8]>; 8]> = SmallVec::new();
        for (i, raw) in path.as_bytes().split(|&b| b == b'/').enumerate() {
            if i > MAX_PATH_SEGMENTS {
                return Err(PathTooDeep);
            }
            let segment = decode_segment(raw);
            match segment.as_ref() {
                b"" | b"." => {}
                b".." => {
                    segments.pop();
                }
                _ => segments.push(segment),
            }
        }
        Ok(NormalizedPath { segments })
    }

    /// The segments.
    pub fn segments(&self) -> impl Iterator<Item = &[u8]> {
        self.segments.iter().map(|s| s.as_ref())
    }
}

/// Decodes a segment's escapes, except an escaped `/`, which stays `%2F` inside the segment.
fn decode_segment(raw: &[u8]) -> Cow<'_, [u8]> {
    if !raw.contains(&b'%') {
        return Cow::Borrowed(raw);
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%'
            && let (Some(h), Some(l)) = (raw.get(i + 1).and_then(hex), raw.get(i + 2).and_then(hex))
        {
            let byte = h << 4 | l;
            if byte == b'/' {
                out.extend_from_slice(b"%2F");
            } else {
                out.push(byte);
            }
            i += 3;
            continue;
        }
        out.push(raw[i]);
        i += 1;
    }
    Cow::Owned(out)
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Segment {
    Literal(Box<[u8]>),
    /// `*` or `{name}`: exactly one segment.
    One,
    /// `**`: any number of segments, none included.
    Any,
}

/// A path pattern such as `/v1/export/*`, `/v1/**` or `/users/{id}/orders`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PathPattern {
    text: String,
    segments: Vec<Segment>,
}

impl FromStr for PathPattern {
    type Err = ConfigError;

    fn from_str(input: &str) -> Result<Self, ConfigError> {
        let text = input.trim();
        if !text.starts_with('/') {
            return Err(ConfigError::new(
                input,
                "a path pattern must start with '/'",
            ));
        }
        // Requests are matched by their path alone: a pattern with a query or a fragment would
        // never match any.
        if text.contains(['?', '#']) {
            return Err(ConfigError::new(
                input,
                "a path pattern matches the path alone, without '?' or '#' (a query or fragment \
                 never matches); key by a query parameter with key = [\"query:NAME\"]",
            ));
        }
        let mut segments = Vec::new();
        for raw in text.split('/').filter(|s| !s.is_empty()) {
            let segment = match raw {
                "*" => Segment::One,
                "**" => Segment::Any,
                "." | ".." => {
                    return Err(ConfigError::new(
                        input,
                        "'.' and '..' cannot appear in a pattern",
                    ));
                }
                _ if raw.starts_with('{') && raw.ends_with('}') => {
                    let name = &raw[1..raw.len() - 1];
                    if name.is_empty()
                        || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                    {
                        return Err(ConfigError::new(
                            input,
                            "a parameter is a name of letters, digits and '_' in braces, like \"{id}\"",
                        ));
                    }
                    Segment::One
                }
                _ if raw.contains(['*', '{', '}']) => {
                    return Err(ConfigError::new(
                        input,
                        "'*', '**' and '{param}' must be a whole segment, like \"/v1/*/items\"",
                    ));
                }
                _ => Segment::Literal(decode_segment(raw.as_bytes()).into_owned().into()),
            };
            segments.push(segment);
        }
        Ok(PathPattern {
            text: text.to_owned(),
            segments,
        })
    }
}

impl fmt::Display for PathPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl PathPattern {
    /// Whether the normalised `path` matches.
    pub fn matches(&self, path: &NormalizedPath<'_>) -> bool {
        // The classic wildcard walk: on a mismatch, let the last `**` swallow one more segment
        // and try again. O(pattern × path), no recursion, whatever the input.
        let pat = &self.segments;
        let path = &path.segments;
        let (mut p, mut s) = (0, 0);
        let mut retry: Option<(usize, usize)> = None;
        while s < path.len() {
            if let Some(seg) = pat.get(p) {
                match seg {
                    Segment::Any => {
                        retry = Some((p + 1, s));
                        p += 1;
                        continue;
                    }
                    Segment::One => {
                        p += 1;
                        s += 1;
                        continue;
                    }
                    Segment::Literal(lit) if **lit == *path[s] => {
                        p += 1;
                        s += 1;
                        continue;
                    }
                    Segment::Literal(_) => {}
                }
            }
            match retry {
                Some((after, from)) => {
                    p = after;
                    s = from + 1;
                    retry = Some((after, from + 1));
                }
                None => return false,
            }
        }
        pat[p.min(pat.len())..]
            .iter()
            .all(|seg| *seg == Segment::Any)
    }
}

/// A host to match: `api.example.com`, or `*.example.com` for any subdomain. Case-insensitive;
/// a port in the request's host is ignored.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostPattern {
    text: String,
    suffix: Option<String>,
}

impl FromStr for HostPattern {
    type Err = ConfigError;

    fn from_str(input: &str) -> Result<Self, ConfigError> {
        let text = input.trim().trim_end_matches('.').to_ascii_lowercase();
        let name = text.strip_prefix("*.").unwrap_or(&text);
        let valid = !name.is_empty()
            && name.bytes().all(|b| {
                b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b':' | b'[' | b']')
            });
        if !valid {
            return Err(ConfigError::new(
                input,
                "expected a host name like \"api.example.com\" or \"*.example.com\"",
            ));
        }
        let suffix = text.strip_prefix('*').map(str::to_owned);
        Ok(HostPattern { text, suffix })
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl HostPattern {
    /// Whether `host` (as in the `Host` header, maybe with a port) matches.
    pub fn matches(&self, host: &str) -> bool {
        let host = strip_port(host).trim_end_matches('.');
        match &self.suffix {
            Some(suffix) => {
                host.len() > suffix.len()
                    && host
                        .get(host.len() - suffix.len()..)
                        .is_some_and(|end| end.eq_ignore_ascii_case(suffix))
            }
            None => host.eq_ignore_ascii_case(&self.text),
        }
    }
}

fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host
            .split_once(']')
            .map_or(host, |(h, _)| &host[..=h.len()]);
    }
    match host.rsplit_once(':') {
        Some((h, port)) if !h.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

/// Parses an HTTP method as written in config (`"post"` is `POST`).
pub fn parse_method(input: &str) -> Result<Method, ConfigError> {
    let upper = input.trim().to_ascii_uppercase();
    if upper.is_empty() {
        return Err(ConfigError::new(
            input,
            "empty method; write one like \"GET\" or \"POST\"",
        ));
    }
    Method::from_bytes(upper.as_bytes()).map_err(|_| {
        ConfigError::new(
            input,
            "not an HTTP method; write one like \"GET\" or \"POST\"",
        )
    })
}

/// What a policy applies to. Every part that is set must match; an empty match applies to
/// every request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct RouteMatch {
    path: Option<PathPattern>,
    methods: Vec<Method>,
    host: Option<HostPattern>,
}

impl RouteMatch {
    /// Matches every request.
    pub fn any() -> Self {
        RouteMatch::default()
    }

    /// Whether matching looks at the path (an engine whose routes never do skips normalising it).
    pub(crate) fn reads_path(&self) -> bool {
        self.path.is_some()
    }

    /// Also requires the path to match `pattern`.
    pub fn path(mut self, pattern: &str) -> Result<Self, ConfigError> {
        self.path = Some(pattern.parse()?);
        Ok(self)
    }

    /// Also requires one of `methods` (an empty list allows every method).
    pub fn methods<I, T>(mut self, methods: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = T>,
        T: AsRef<str>,
    {
        self.methods = methods
            .into_iter()
            .map(|m| parse_method(m.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(self)
    }

    /// Also requires the host to match `pattern`.
    pub fn host(mut self, pattern: &str) -> Result<Self, ConfigError> {
        self.host = Some(pattern.parse()?);
        Ok(self)
    }

    /// The path pattern, if any.
    pub fn path_pattern(&self) -> Option<&PathPattern> {
        self.path.as_ref()
    }

    /// The methods (empty: any).
    pub fn method_list(&self) -> &[Method] {
        &self.methods
    }

    /// The host pattern, if any.
    pub fn host_pattern(&self) -> Option<&HostPattern> {
        self.host.as_ref()
    }

    /// Whether a request matches.
    pub fn matches(&self, method: &Method, path: &NormalizedPath<'_>, host: Option<&str>) -> bool {
        (self.methods.is_empty() || self.methods.contains(method))
            && self
                .host
                .as_ref()
                .is_none_or(|h| host.is_some_and(|host| h.matches(host)))
            && self.path.as_ref().is_none_or(|p| p.matches(path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, path: &str) -> bool {
        pattern
            .parse::<PathPattern>()
            .unwrap()
            .matches(&NormalizedPath::new(path).unwrap_or_default())
    }

    #[test]
    fn patterns() {
        assert!(m("/v1/**", "/v1"));
        assert!(m("/v1/**", "/v1/a/b/c"));
        assert!(!m("/v1/**", "/v2/a"));
        assert!(m("/v1/export/*", "/v1/export/7"));
        assert!(m("/v1/export/*", "/v1/export/7/"));
        assert!(!m("/v1/export/*", "/v1/export"));
        assert!(!m("/v1/export/*", "/v1/export/7/8"));
        assert!(m("/users/{id}/orders", "/users/42/orders"));
        assert!(m("/**/admin", "/a/b/admin"));
        assert!(m("/**/admin/**", "/admin"));
        assert!(m("/a/**/b/**/c", "/a/x/b/y/z/c"));
        assert!(!m("/a/**/b/**/c", "/a/x/c"));
        assert!(m("/", "/"));
        assert!(!m("/", "/x"));
        assert!(m("/**", "/anything/at/all"));
    }

    /// A query or a fragment in a pattern would never match: refused, saying why.
    #[test]
    fn a_pattern_with_a_query_or_fragment_is_refused() {
        for pattern in ["/v1/x?y=1", "/v1/x#top", "/v1/?"] {
            let e = pattern
                .parse::<PathPattern>()
                .err()
                .map(|e| e.reason().to_owned());
            assert!(
                e.is_some_and(|r| r.contains("without '?' or '#'")),
                "{pattern}"
            );
        }
        // An escaped one is part of a segment's name, and matches it.
        assert!(m("/v1/a%3Fb", "/v1/a%3Fb"));
    }

    #[test]
    fn normalisation_defeats_path_tricks() {
        assert!(m("/admin/**", "/v1/%2e%2e/admin"));
        assert!(m("/admin/**", "/v1/%2E%2E/admin/x"));
        assert!(m("/v1/x", "//v1//x"));
        assert!(m("/v1/x", "/v1/./x"));
        assert!(m("/admin", "/../../admin"));
        assert!(m("/v1/export/*", "/v1/%65xport/7"));
        // An escaped slash stays inside its segment.
        assert!(!m("/v1/export/*", "/v1%2Fexport/7"));
        assert!(m("/*/x", "/a%2Fb/x"));
    }

    #[test]
    fn deep_paths_are_normalised_whole_or_refused() {
        // 257 segments up and 257 back: the `..`s past any old cap still resolve.
        let deep = format!("{}{}/api/x", "/a".repeat(257), "/..".repeat(257));
        assert!(m("/api/**", &deep));
        let at_bound = format!("{}/x", "/a".repeat(MAX_PATH_SEGMENTS - 1));
        assert!(NormalizedPath::new(&at_bound).is_ok());
        let past = format!("{}/x", "/a".repeat(MAX_PATH_SEGMENTS));
        assert_eq!(NormalizedPath::new(&past), Err(PathTooDeep));
        assert_eq!(
            NormalizedPath::new(&"/".repeat(MAX_PATH_SEGMENTS + 1)),
            Err(PathTooDeep)
        );
    }

    #[test]
    fn bad_patterns_say_why() {
        for (input, needle) in [
            ("v1/*", "start with '/'"),
            ("/v1/a*", "whole segment"),
            ("/v1/{}", "parameter"),
            ("/v1/{a-b}", "parameter"),
            ("/v1/../x", "'..'"),
        ] {
            let text = input
                .parse::<PathPattern>()
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(text.contains(needle), "{input:?}: {text}");
        }
    }

    #[test]
    fn hosts_and_methods() {
        let h: HostPattern = "API.example.com".parse().unwrap();
        assert!(h.matches("api.example.com:8443"));
        assert!(!h.matches("evil.com"));
        let w: HostPattern = "*.example.com".parse().unwrap();
        assert!(w.matches("a.b.example.com"));
        assert!(!w.matches("example.com"));
        assert!(!w.matches("notexample.com"));
        assert_eq!(parse_method("post").unwrap(), Method::POST);
        assert!(parse_method("PO ST").is_err());
        let r = RouteMatch::any()
            .path("/v1/export/*")
            .unwrap()
            .methods(["POST"])
            .unwrap();
        assert!(r.matches(
            &Method::POST,
            &NormalizedPath::new("/v1/export/1").unwrap(),
            None
        ));
        assert!(!r.matches(
            &Method::GET,
            &NormalizedPath::new("/v1/export/1").unwrap(),
            None
        ));
    }
}
