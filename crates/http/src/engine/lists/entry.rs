//! What a list holds: an action, and entries as configured or put live, each read from its
//! text (a network, or a key as `/v1/top` shows it) and refused when no request could match it.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use crate::{Cidr, ConfigError, KeySelector};

/// What a list does to the requests it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ListAction {
    /// Never limited by any policy.
    Allow,
    /// Refused (403) before any policy.
    Deny,
}

impl ListAction {
    /// `"allow"` or `"deny"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ListAction::Allow => "allow",
            ListAction::Deny => "deny",
        }
    }
}

impl FromStr for ListAction {
    type Err = ConfigError;

    fn from_str(input: &str) -> Result<Self, ConfigError> {
        match input.trim() {
            "allow" => Ok(ListAction::Allow),
            "deny" => Ok(ListAction::Deny),
            _ => Err(ConfigError::new(input, "use \"allow\" or \"deny\"")),
        }
    }
}

/// One entry of a list: a network, or a key as the store sees it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ListEntry {
    /// Every client address in the network (a bare address is a network of one).
    Ip(Cidr),
    /// The key, as `/v1/top` shows it; `selector` is the one that reads it from a request.
    Key {
        /// The key.
        key: String,
        /// Where a request's value of it comes from.
        selector: KeySelector,
    },
}

impl ListEntry {
    /// A key as `/v1/top` shows it: `header:<name>:<32 hex digits>`, `query:<name>:<32 hex>`,
    /// `jwt:<claim>:<32 hex>`, `user:<id>` or `ip:<address>` (an IPv6 client's network, as
    /// its key has it).
    pub fn key(text: &str) -> Result<Self, ConfigError> {
        let bad = |reason: &str| ConfigError::new(text, reason);
        let form = "keys take the form /v1/top shows: \"header:<name>:<hash>\", \
                    \"query:<name>:<hash>\", \"jwt:<claim>:<hash>\", \"user:<id>\" or \"ip:<address>\"";
        let Some((kind, rest)) = text.split_once(':') else {
            return Err(bad(form));
        };
        let selector = match kind {
            "header" | "query" | "jwt" => {
                let Some((name, hash)) = rest.rsplit_once(':') else {
                    return Err(bad(form));
                };
                if hash.len() != 32 || !hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
                {
                    return Err(bad(
                        "the value of a credential key is its hash as /v1/top shows it (32 hex \
                         digits), never the credential itself",
                    ));
                }
                let selector = format!("{kind}:{name}").parse::<KeySelector>()?;
                // A header's name is case-insensitive, and a request's key holds it in lower
                // case: another spelling could never equal it.
                if let KeySelector::Header(header) = &selector
                    && header.as_str() != name
                {
                    return Err(bad(&format!(
                        "write it as /v1/top shows it, the header's name in lower case: \
                         \"header:{}:{hash}\"",
                        header.as_str()
                    )));
                }
                selector
            }
            "user" if !rest.is_empty() => {
                user_key(rest).map_err(|reason| bad(&reason))?;
                KeySelector::User
            }
            "ip" if !rest.is_empty() => {
                ip_key(rest).map_err(|reason| bad(&reason))?;
                KeySelector::Ip
            }
            _ => return Err(bad(form)),
        };
        Ok(ListEntry::Key {
            key: text.to_owned(),
            selector,
        })
    }

    /// Refuses an `ip:` key of an IPv6 network whose length is not `ipv6_prefix`, the length
    /// IPv6 clients are keyed by (`[server] ipv6_prefix`): no request's key could equal it.
    pub fn fits_ipv6_prefix(&self, ipv6_prefix: u8) -> Result<(), String> {
        let ListEntry::Key {
            key,
            selector: KeySelector::Ip,
        } = self
        else {
            return Ok(());
        };
        match key.rsplit_once('/') {
            Some((_, bits)) if bits != ipv6_prefix.to_string() => Err(format!(
                "IPv6 clients are keyed by their /{ipv6_prefix} network ([server] ipv6_prefix), \
                 so a /{bits} key can never match; list the network without ip: to match every \
                 address in it"
            )),
            _ => Ok(()),
        }
    }

    /// An address or network (`203.0.113.0/24`, `2001:db8::/32`, `198.51.100.7`) or, failing
    /// that, a key ([`ListEntry::key`]).
    ///
    /// An IPv4-mapped network (`::ffff:192.0.2.7`, `::ffff:192.0.2.0/120`) is its IPv4
    /// network (`192.0.2.7/32`, `192.0.2.0/24`): it matches the same clients, and is then one
    /// entry whichever form it is written in.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        match text.parse::<Cidr>() {
            Ok(cidr) => Ok(ListEntry::Ip(unmapped(cidr))),
            Err(e) if looks_like_address(text) => Err(e),
            Err(_) => ListEntry::key(text),
        }
    }
}

/// `cidr`, or the IPv4 network it is when it is an IPv4-mapped one (prefix 96 or longer).
fn unmapped(cidr: Cidr) -> Cidr {
    match cidr.addr() {
        IpAddr::V6(v6) if cidr.prefix() >= 96 => v6
            .to_ipv4_mapped()
            .and_then(|v4| Cidr::new(IpAddr::V4(v4), cidr.prefix() - 96).ok())
            .unwrap_or(cidr),
        _ => cidr,
    }
}

/// Checks that `rest`, after `ip:`, is a client's key as requests have it: an IPv4 address, or
/// the IPv6 network an address is in (`2001:db8:1:2::/64`), in the text `/v1/top` shows. Any
/// other text could never equal a request's key, and a deny entry that never matches is worse
/// than a refusal; the reason says what to write.
fn ip_key(rest: &str) -> Result<(), String> {
    let (addr, prefix) = match rest.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (rest, None),
    };
    let Ok(ip) = addr.parse::<IpAddr>() else {
        return Err(
            "after ip: comes a client's address as /v1/top shows it: \"ip:203.0.113.7\", or \
             an IPv6 client's network, \"ip:2001:db8:1:2::/64\""
                .to_owned(),
        );
    };
    match (ip, prefix) {
        (IpAddr::V4(_), Some(_)) => Err(format!(
            "an IPv4 client's key is its address alone; for a network, write the network \
             without ip: (\"{rest}\")"
        )),
        (IpAddr::V4(v4), None) if v4.to_string() == addr => Ok(()),
        (IpAddr::V6(v6), _) if v6.to_ipv4_mapped().is_some() => Err(format!(
            "an IPv4-mapped address is keyed as its IPv4 address: write \"ip:{}\"",
            ip.to_canonical()
        )),
        (IpAddr::V6(_), None) => Err(format!(
            "an IPv6 client's key is its network (as /v1/top shows it, e.g. \"ip:2001:db8:1:2::/64\"); \
             for this address alone, write it without ip: (\"{rest}\")"
        )),
        (_, Some(bits)) => {
            let shown = bits
                .parse::<u8>()
                .ok()
                .and_then(|bits| crate::Cidr::new(ip, bits).ok())
                .map(|net| format!("{}/{}", net.addr(), net.prefix()));
            match shown {
                Some(text) if text == rest => Ok(()),
                Some(text) => Err(format!("write it as /v1/top shows it: \"ip:{text}\"")),
                None => Err(format!("\"{bits}\" is not a prefix length from 0 to 128")),
            }
        }
        (IpAddr::V4(v4), None) => Err(format!("write it as /v1/top shows it: \"ip:{v4}\"")),
    }
}

/// Checks that `rest`, after `user:`, is a user's key as requests have it: the id itself, or
/// `#` and the 32 hex digits of its digest for an id the store keys by its digest (longer than
/// 256 bytes, beginning with `#`, or holding a control character), as `/v1/top` shows it.
fn user_key(rest: &str) -> Result<(), String> {
    // The long-key rule (`KeyDigest::write_key`): what it writes as it is.
    let as_is = rest.len() <= tollgate::key_digest::MAX_RAW_KEY
        && !rest.starts_with('#')
        && !rest.chars().any(char::is_control);
    let digest = rest.strip_prefix('#').is_some_and(|hex| {
        hex.len() == 32 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    });
    if as_is || digest {
        Ok(())
    } else {
        Err(
            "this user id is keyed by its digest (it is longer than 256 bytes, begins with '#' \
             or holds a control character): write the key as /v1/top shows it, \
             \"user:#<32 hex digits>\""
                .to_owned(),
        )
    }
}

/// Whether `text` was meant as an address or network (so its error is the address's).
fn looks_like_address(text: &str) -> bool {
    let head = text.split('/').next().unwrap_or(text);
    // An address with a zone id (`fe80::1%eth0`): its own error says what is wrong.
    let head = head.split('%').next().unwrap_or(head);
    !head.is_empty()
        && head
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b'.' || b == b':')
}

impl fmt::Display for ListEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListEntry::Ip(cidr) => write!(f, "{}/{}", cidr.addr(), cidr.prefix()),
            ListEntry::Key { key, .. } => f.write_str(key),
        }
    }
}
