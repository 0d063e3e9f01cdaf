//! Which policies a request falls under and which key it is counted under: route patterns
//! (`*`, `**`, `{param}`), key selectors (`header:`, `jwt:`, `user`, `query:`, `ip`) and CIDRs.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use hyper::HeaderMap;

/// The parts of a request that policies look at.
#[derive(Debug)]
pub struct RequestView<'a> {
    /// `GET`, `POST`...
    pub method: &'a str,
    /// The path, without the query.
    pub path: &'a str,
    /// The query string, without `?`.
    pub query: Option<&'a str>,
    /// The `Host` (a port is ignored when matching).
    pub host: Option<&'a str>,
    /// The request headers.
    pub headers: &'a HeaderMap,
    /// The client address, already resolved through trusted proxies.
    pub ip: Option<IpAddr>,
}

/// Where a policy's key comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySelector {
    /// `header:<name>`: a request header, e.g. the API key.
    Header(String),
    /// `jwt:<claim>`: a claim of a verified Bearer JWT.
    Jwt(String),
    /// `user`: an identity the application put in the request (library use only; absent in
    /// the server).
    User,
    /// `query:<name>`: a query parameter.
    Query(String),
    /// `ip`: the client address (IPv6 grouped by /64).
    Ip,
}

impl FromStr for KeySelector {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let hint =
            "write one of \"header:<name>\", \"jwt:<claim>\", \"user\", \"query:<name>\", \"ip\"";
        let (kind, arg) = match s.split_once(':') {
            Some((k, a)) => (k, Some(a)),
            None => (s, None),
        };
        let need_arg = |arg: Option<&str>| -> Result<String, String> {
            match arg {
                Some(a) if !a.is_empty() && a.bytes().all(|b| b.is_ascii_graphic()) => {
                    Ok(a.to_owned())
                }
                _ => Err(format!("{s:?} needs a name after the colon; {hint}")),
            }
        };
        match (kind, arg) {
            ("header", a) => {
                let name = need_arg(a)?.to_ascii_lowercase();
                hyper::header::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| format!("{s:?}: not a valid header name"))?;
                Ok(KeySelector::Header(name))
            }
            ("jwt", a) => Ok(KeySelector::Jwt(need_arg(a)?)),
            ("query", a) => Ok(KeySelector::Query(need_arg(a)?)),
            ("user", None) => Ok(KeySelector::User),
            ("ip", None) => Ok(KeySelector::Ip),
            _ => Err(format!("unknown key selector {s:?}; {hint}")),
        }
    }
}

impl fmt::Display for KeySelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySelector::Header(n) => write!(f, "header:{n}"),
            KeySelector::Jwt(c) => write!(f, "jwt:{c}"),
            KeySelector::User => f.write_str("user"),
            KeySelector::Query(n) => write!(f, "query:{n}"),
            KeySelector::Ip => f.write_str("ip"),
        }
    }
}

impl KeySelector {
    /// The key this selector finds in `req`, prefixed with the selector so an API key never
    /// collides with an IP.
    pub fn extract(&self, req: &RequestView<'_>) -> Option<Vec<u8>> {
        let value: Vec<u8> = match self {
            KeySelector::Header(name) => {
                let v = req.headers.get(name.as_str())?.as_bytes();
                if v.is_empty() {
                    return None;
                }
                v.to_vec()
            }
            // Verifying tokens needs the configured key and a JWT library (tollgate-http);
            // unverifiable tokens are treated as absent, never trusted.
            KeySelector::Jwt(_) | KeySelector::User => return None,
            KeySelector::Query(name) => {
                let q = req.query?;
                let v = q.split('&').find_map(|pair| {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    (k == name).then_some(v)
                })?;
                if v.is_empty() {
                    return None;
                }
                v.as_bytes().to_vec()
            }
            KeySelector::Ip => ip_key(req.ip?).into_bytes(),
        };
        let mut key = self.to_string().into_bytes();
        key.push(0);
        key.extend_from_slice(&value);
        Some(key)
    }
}

/// An IPv4 address, or the /64 an IPv6 address belongs to.
fn ip_key(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let bits = u128::from(v6) & !((1u128 << 64) - 1);
                format!("{}/64", std::net::Ipv6Addr::from(bits))
            }
        },
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    Literal(String),
    /// `*` or `{param}`: exactly one segment.
    One,
    /// `**`: any number of segments, including none.
    Any,
}

/// `match = { path, methods, host }`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteMatch {
    pattern: String,
    segments: Vec<Segment>,
    methods: Vec<String>,
    host: Option<String>,
}

impl RouteMatch {
    /// Matches every request.
    pub fn any() -> Self {
        RouteMatch {
            pattern: "/**".to_owned(),
            segments: vec![Segment::Any],
            methods: Vec::new(),
            host: None,
        }
    }

    pub(crate) fn set_path(&mut self, pattern: &str) -> Result<(), String> {
        if !pattern.starts_with('/') {
            return Err(format!(
                "{pattern:?} must start with '/'; write e.g. path = \"/v1/**\""
            ));
        }
        let mut segments = Vec::new();
        for seg in pattern.split('/').skip(1) {
            segments.push(match seg {
                "**" => Segment::Any,
                "*" => Segment::One,
                s if s.starts_with('{') && s.ends_with('}') && s.len() > 2 => Segment::One,
                s if s.contains(['*', '{', '}']) => {
                    return Err(format!(
                        "segment {s:?} of {pattern:?}: '*', '**' and '{{param}}' must be whole segments, e.g. \"/v1/*/items\""
                    ));
                }
                s => Segment::Literal(s.to_owned()),
            });
        }
        self.pattern = pattern.to_owned();
        self.segments = segments;
        Ok(())
    }

    pub(crate) fn add_method(&mut self, method: &str) -> Result<(), String> {
        if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(format!(
                "{method:?} is not an HTTP method; write e.g. methods = [\"GET\", \"POST\"]"
            ));
        }
        self.methods.push(method.to_ascii_uppercase());
        Ok(())
    }

    pub(crate) fn set_host(&mut self, host: &str) -> Result<(), String> {
        if host.is_empty() || host.contains(['/', ' ']) {
            return Err(format!(
                "{host:?} is not a host name; write e.g. host = \"api.example.com\""
            ));
        }
        self.host = Some(host.to_ascii_lowercase());
        Ok(())
    }

    /// The path pattern.
    pub fn path(&self) -> &str {
        &self.pattern
    }

    /// The methods (empty: any).
    pub fn methods(&self) -> &[String] {
        &self.methods
    }

    /// The host (`None`: any).
    pub fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }

    /// Whether `req` falls under this route.
    pub fn matches(&self, req: &RequestView<'_>) -> bool {
        if !self.methods.is_empty() && !self.methods.iter().any(|m| m == req.method) {
            return false;
        }
        if let Some(want) = &self.host {
            let Some(host) = req.host else {
                return false;
            };
            let host = strip_port(host);
            let ok = match want.strip_prefix("*.") {
                Some(suffix) => host
                    .len()
                    .checked_sub(suffix.len() + 1)
                    .and_then(|i| host.get(i..))
                    .is_some_and(|tail| {
                        tail.starts_with('.') && tail[1..].eq_ignore_ascii_case(suffix)
                    }),
                None => host.eq_ignore_ascii_case(want),
            };
            if !ok {
                return false;
            }
        }
        let Some(rest) = req.path.strip_prefix('/') else {
            return false;
        };
        let parts: Vec<&str> = rest.split('/').collect();
        match_segments(&self.segments, &parts)
    }
}

fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.split(']').next().map_or(host, |h| &h[1..]);
    }
    match host.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

fn match_segments(pattern: &[Segment], parts: &[&str]) -> bool {
    match pattern.split_first() {
        None => parts.is_empty(),
        Some((Segment::Any, rest)) => {
            (0..=parts.len()).any(|i| match_segments(rest, parts.get(i..).unwrap_or(&[])))
        }
        Some((seg, rest)) => match parts.split_first() {
            None => false,
            Some((part, more)) => {
                let ok = match seg {
                    Segment::Literal(l) => l == part,
                    _ => !part.is_empty(),
                };
                ok && match_segments(rest, more)
            }
        },
    }
}

impl fmt::Display for RouteMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.methods.is_empty() {
            write!(f, "{} ", self.methods.join(","))?;
        }
        if let Some(h) = &self.host {
            f.write_str(h)?;
        }
        f.write_str(&self.pattern)
    }
}

/// An address range, `10.0.0.0/8` or a single address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (ip, prefix) = match s.split_once('/') {
            Some((ip, p)) => (ip, Some(p)),
            None => (s, None),
        };
        let net: IpAddr = ip
            .parse()
            .map_err(|_| format!("{s:?} is not an address or CIDR"))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}"))?,
            None => max,
        };
        Ok(Cidr { net, prefix })
    }
}

impl Cidr {
    /// The range holding exactly `ip`.
    pub fn from_ip(ip: IpAddr) -> Cidr {
        let prefix = if ip.is_ipv4() { 32 } else { 128 };
        Cidr { net: ip, prefix }
    }

    /// Whether `ip` is inside the range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// The client address: `peer`, or, when the peer is a trusted proxy, the first address of
/// `X-Forwarded-For` walked right to left that is not trusted.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[Cidr]) -> IpAddr {
    if !trusted.iter().any(|c| c.contains(peer)) {
        return peer;
    }
    let mut client = peer;
    let hops = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .collect::<Vec<_>>();
    for hop in hops.iter().rev() {
        let Ok(ip) = hop.trim().parse::<IpAddr>() else {
            break;
        };
        client = ip;
        if !trusted.iter().any(|c| c.contains(ip)) {
            break;
        }
    }
    client
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view<'a>(method: &'a str, path: &'a str, headers: &'a HeaderMap) -> RequestView<'a> {
        RequestView {
            method,
            path,
            query: None,
            host: Some("api.example.com:443"),
            headers,
            ip: None,
        }
    }

    #[test]
    fn path_patterns() -> Result<(), String> {
        let h = HeaderMap::new();
        let mut r = RouteMatch::any();
        r.set_path("/v1/**")?;
        assert!(r.matches(&view("GET", "/v1/a/b", &h)));
        assert!(r.matches(&view("GET", "/v1", &h)));
        assert!(!r.matches(&view("GET", "/v2/a", &h)));
        r.set_path("/v1/export/*")?;
        assert!(r.matches(&view("GET", "/v1/export/7", &h)));
        assert!(!r.matches(&view("GET", "/v1/export/7/x", &h)));
        r.set_path("/users/{id}/items")?;
        assert!(r.matches(&view("GET", "/users/42/items", &h)));
        r.add_method("post")?;
        assert!(!r.matches(&view("GET", "/users/42/items", &h)));
        r.set_host("*.example.com")?;
        assert!(r.matches(&view("POST", "/users/42/items", &h)));
        assert!(r.set_path("v1").is_err());
        assert!(r.set_path("/v1/a*").is_err());
        Ok(())
    }

    #[test]
    fn selectors_and_cidrs() -> Result<(), String> {
        assert_eq!(
            "header:X-Api-Key".parse::<KeySelector>()?,
            KeySelector::Header("x-api-key".into())
        );
        assert!("header:".parse::<KeySelector>().is_err());
        assert!("cookie:x".parse::<KeySelector>().is_err());
        let c: Cidr = "10.0.0.0/8".parse()?;
        assert!(c.contains("10.1.2.3".parse().map_err(|_| "ip")?));
        assert!(!c.contains("11.1.2.3".parse().map_err(|_| "ip")?));
        let mut h = HeaderMap::new();
        h.insert(
            "x-forwarded-for",
            "203.0.113.9, 10.0.0.2".parse().map_err(|_| "hv")?,
        );
        let peer: IpAddr = "10.0.0.1".parse().map_err(|_| "ip")?;
        assert_eq!(client_ip(peer, &h, &[c]).to_string(), "203.0.113.9");
        assert_eq!(client_ip(peer, &h, &[]).to_string(), "10.0.0.1");
        Ok(())
    }
}
