//! What the proxy fuzz's limiter must have counted: the policies of the proxy under test, which
//! of them a request (as the upstream read it, or as its client meant it) goes to and under
//! which key, and the counts the limiter holds, read back from `/v1/check` at cost 0.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use hyper::Method;
use tollgate_http::{NormalizedPath, RouteMatch};

use super::fuzz_case::key_round;

/// One policy of the proxy under test, and how the test routes a request to it.
pub struct Policy {
    pub name: &'static str,
    pub limit: u64,
    pub path: Option<&'static str>,
    pub methods: &'static [&'static str],
    pub host: Option<&'static str>,
    pub key: &'static str,
}

/// Which policies count a request depends on its method, path and host; all of them key on the
/// client address, `pub-keyed` on an `x-api-key` first (sent twice, refused).
pub const POLICIES: [Policy; 6] = [
    Policy {
        name: "every",
        limit: 1_000_000_000,
        path: None,
        methods: &[],
        host: None,
        key: "\"ip\"",
    },
    Policy {
        name: "api-read",
        limit: 1_000_000_000,
        path: Some("/api/**"),
        methods: &["GET", "HEAD"],
        host: None,
        key: "\"ip\"",
    },
    Policy {
        name: "api-write",
        limit: 1_000_000_000,
        path: Some("/api/**"),
        methods: &["POST", "PUT", "DELETE"],
        host: None,
        key: "\"ip\"",
    },
    Policy {
        name: "b-host",
        limit: 1_000_000_000,
        path: None,
        methods: &[],
        host: Some("b.test"),
        key: "\"ip\"",
    },
    Policy {
        name: "tight",
        limit: 1,
        path: Some("/tight/**"),
        methods: &[],
        host: None,
        key: "\"ip\"",
    },
    Policy {
        name: "pub-keyed",
        limit: 1_000_000_000,
        path: Some("/pub/**"),
        methods: &[],
        host: None,
        key: "\"header:x-api-key\", \"ip\"",
    },
];

impl Policy {
    /// Its `[[policy]]` table. A sliding log: the count is exact, with no window boundary a
    /// case could straddle.
    pub fn toml(&self) -> String {
        let mut matcher = Vec::new();
        if let Some(p) = self.path {
            matcher.push(format!("path = \"{p}\""));
        }
        if !self.methods.is_empty() {
            matcher.push(format!("methods = {:?}", self.methods));
        }
        if let Some(h) = self.host {
            matcher.push(format!("host = \"{h}\""));
        }
        format!(
            "[[policy]]\nname = \"{}\"\nalgorithm = \"sliding_window_log\"\nlimit = {}\nwindow = \"1h\"\nkey = [{}]\nmatch = {{ {} }}\n\n",
            self.name,
            self.limit,
            self.key,
            matcher.join(", ")
        )
    }

    pub fn route(&self) -> RouteMatch {
        let mut r = RouteMatch::any().methods(self.methods).unwrap();
        if let Some(p) = self.path {
            r = r.path(p).unwrap();
        }
        if let Some(h) = self.host {
            r = r.host(h).unwrap();
        }
        r
    }
}

/// A policy and a store key: one counter.
pub type Pair = (&'static str, String);

/// A request as the limiter is to count it: method, origin-form target, host, the key its
/// client address gives, and its `x-api-key` values.
pub struct Counted<'a> {
    pub method: &'a str,
    pub target: &'a str,
    pub host: Option<&'a str>,
    pub ip_key: String,
    pub api_keys: usize,
}

/// The counters `request` goes to, one per policy it matches; `None` for a key the test cannot
/// name (an `x-api-key`, stored as a keyed hash). `Err` when it has a key field twice for a
/// policy that reads it: the proxy must have refused it.
///
/// `every` is left out when another policy names the request's counter: the limiter decides
/// every policy of a request at once, all or nothing, so its count says nothing more, and each
/// counter read costs the test time.
pub fn pairs(
    routes: &[RouteMatch],
    request: &Counted<'_>,
) -> Result<Vec<(&'static str, Option<String>)>, String> {
    let Ok(method) = Method::from_bytes(request.method.as_bytes()) else {
        return Ok(Vec::new());
    };
    let path = request.target.split('?').next().unwrap_or("");
    let Ok(path) = NormalizedPath::new(path) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (policy, route) in POLICIES.iter().zip(routes) {
        if !route.matches(&method, &path, request.host) {
            continue;
        }
        let reads_api_key = policy.key.contains("x-api-key");
        let key = match request.api_keys {
            0 => Some(request.ip_key.clone()),
            1 if reads_api_key => None,
            n if n > 1 && reads_api_key => {
                return Err(format!("x-api-key sent {n} times, read by {}", policy.name));
            }
            _ => Some(request.ip_key.clone()),
        };
        out.push((policy.name, key));
    }
    if out
        .iter()
        .any(|(name, key)| *name != "every" && key.is_some())
    {
        out.retain(|(name, _)| *name != "every");
    }
    Ok(out)
}

/// The client address the proxy must have keyed a request on, from the `X-Forwarded-For` the
/// upstream read (the client's list, then the proxy's peer): right to left, past the trusted
/// 127.0.0.0/8, to the first other address; an unreadable element stops the walk at the last
/// trusted hop.
pub fn client_of(forwarded_for: &str) -> IpAddr {
    let trusted = |ip: &IpAddr| matches!(ip, IpAddr::V4(v4) if v4.octets()[0] == 127);
    let mut last_trusted = IpAddr::from([0, 0, 0, 0]);
    for element in forwarded_for.rsplit(',') {
        match element.trim().parse::<IpAddr>().map(|ip| ip.to_canonical()) {
            Ok(ip) if trusted(&ip) => last_trusted = ip,
            Ok(ip) => return ip,
            Err(_) => return last_trusted,
        }
    }
    last_trusted
}

/// The round of a store key a request of the fuzz was meant to have.
pub fn round_of(key: &str) -> Option<u64> {
    let addr = key.strip_prefix("ip:")?.split('/').next()?;
    key_round(addr.parse().ok()?)
}

/// How many requests the limiter counted on each pair, read at cost 0 from `/v1/check` on
/// `api`: the checks pipelined on two connections at once (the server's runtime has two
/// threads).
pub async fn counted_all(api: SocketAddr, pairs: impl Iterator<Item = Pair>) -> HashMap<Pair, u64> {
    let pairs: Vec<Pair> = pairs.collect();
    let half = pairs.len().div_ceil(2);
    let mut set = tokio::task::JoinSet::new();
    for part in pairs.chunks(half.max(1)) {
        set.spawn(counted_on_one_connection(api, part.to_vec()));
    }
    let mut out = HashMap::new();
    while let Some(part) = set.join_next().await {
        out.extend(part.unwrap());
    }
    out
}

async fn counted_on_one_connection(api: SocketAddr, pairs: Vec<Pair>) -> Vec<(Pair, u64)> {
    let mut requests = Vec::new();
    for (policy, key) in &pairs {
        let body = serde_json::json!({ "policy": policy, "key": key, "cost": 0 }).to_string();
        let head = format!(
            "POST /v1/check HTTP/1.1\r\nHost: t\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        requests.extend_from_slice(head.as_bytes());
        requests.extend_from_slice(body.as_bytes());
    }
    let mut c = crate::common::raw::Client::connect(api).await;
    c.send(&requests).await;
    let mut out = Vec::new();
    for pair in pairs {
        let r = c.response().await;
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let (limit, remaining) = (v["limit"].as_u64(), v["remaining"].as_u64());
        let n = limit.unwrap() - remaining.unwrap_or_else(|| panic!("{v}"));
        out.push((pair, n));
    }
    out
}
