//! IP networks in CIDR notation (`10.0.0.0/8`, `2001:db8::/32`) for `trusted_proxies`, and the
//! prefix grouping that makes one IPv6 customer (who owns a whole /64) one key.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use crate::ConfigError;

/// An IP network: an address and a prefix length. A bare address is a network of one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// The network of `addr` with `prefix` leading bits; the bits after the prefix are cleared.
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Self, ConfigError> {
        let max = match addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        if prefix > max {
            return Err(ConfigError::new(
                &format!("{addr}/{prefix}"),
                format!("prefix length must be at most {max}"),
            ));
        }
        Ok(Cidr {
            addr: mask(addr, prefix),
            prefix,
        })
    }

    /// The network address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` is inside this network. IPv4-mapped IPv6 addresses (`::ffff:10.0.0.1`, what
    /// a dual-stack socket reports) count as their IPv4 address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                mask(IpAddr::V4(ip), self.prefix) == IpAddr::V4(net)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                mask(IpAddr::V6(ip), self.prefix) == IpAddr::V6(net)
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = ConfigError;

    fn from_str(input: &str) -> Result<Self, ConfigError> {
        let text = input.trim();
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        if let Some((_, zone)) = addr.split_once('%') {
            return Err(ConfigError::new(
                input,
                format!(
                    "a zone id (%{zone}) names an interface of this host, not a network: write \
                     the address without it"
                ),
            ));
        }
        let addr: IpAddr = addr.parse().map_err(|_| {
            ConfigError::new(
                input,
                "expected an IP network like \"10.0.0.0/8\", \"192.168.1.7\" or \"2001:db8::/32\"",
            )
        })?;
        let prefix = match prefix {
            None => match addr {
                IpAddr::V4(_) => 32,
                IpAddr::V6(_) => 128,
            },
            // Digits only, without a leading zero: `/+8` and `/08` are not how anyone writes
            // a prefix, and reading them as `/8` would guess at what was meant.
            Some(p)
                if p.bytes().all(|b| b.is_ascii_digit()) && (p == "0" || !p.starts_with('0')) =>
            {
                p.parse::<u8>().map_err(|_| {
                    ConfigError::new(input, "the prefix length after '/' must be a whole number")
                })?
            }
            Some(_) => {
                return Err(ConfigError::new(
                    input,
                    "the prefix length after '/' must be a whole number, written without a sign \
                     or a leading zero",
                ));
            }
        };
        let net = Cidr::new(addr, prefix).map_err(|e| ConfigError::new(input, e.reason()))?;
        // `10.0.0.1/8` is `10.0.0.0/8` with its host bits set: most likely a typo for one
        // address or for another network, which would widen or miss what was meant unseen.
        if net.addr != addr {
            let one = match addr {
                IpAddr::V4(_) => 32,
                IpAddr::V6(_) => 128,
            };
            return Err(ConfigError::new(
                input,
                format!(
                    "the address has bits set past the prefix: write \"{net}\" for the network, \
                     or \"{addr}/{one}\" for the one address"
                ),
            ));
        }
        Ok(net)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// `ip` with every bit after the first `prefix` cleared.
pub(crate) fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let keep = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(prefix.min(32)))
            };
            IpAddr::V4(Ipv4Addr::from(bits & keep))
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let keep = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(prefix.min(128)))
            };
            IpAddr::V6(Ipv6Addr::from(bits & keep))
        }
    }
}

/// The proxies whose `X-Forwarded-For` / `Forwarded` headers are believed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    nets: Vec<Cidr>,
}

impl TrustedProxies {
    /// No proxy is trusted: the peer address is the client (the safe default).
    pub fn none() -> Self {
        TrustedProxies::default()
    }

    /// Trusts these networks.
    pub fn new(nets: impl IntoIterator<Item = Cidr>) -> Self {
        TrustedProxies {
            nets: nets.into_iter().collect(),
        }
    }

    /// Parses a list such as `["10.0.0.0/8", "::1"]`, failing on the first bad entry.
    pub fn parse<I, T>(items: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = T>,
        T: AsRef<str>,
    {
        let nets = items
            .into_iter()
            .map(|s| s.as_ref().parse())
            .collect::<Result<Vec<Cidr>, _>>()?;
        Ok(TrustedProxies { nets })
    }

    /// Whether `ip` is a trusted proxy.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.nets.iter().any(|n| n.contains(ip))
    }

    /// Whether no proxy is trusted.
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    /// The trusted networks.
    pub fn as_slice(&self) -> &[Cidr] {
        &self.nets
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_contains() -> Result<(), ConfigError> {
        let net: Cidr = "10.0.0.0/8".parse()?;
        assert_eq!(net.to_string(), "10.0.0.0/8");
        // Host bits past the prefix are a typo: refused, saying what to write.
        for (typo, says) in [
            (
                "10.1.2.3/8",
                "write \"10.0.0.0/8\" for the network, or \"10.1.2.3/32\"",
            ),
            ("2001:db8::1/32", "\"2001:db8::/32\""),
        ] {
            let e = typo.parse::<Cidr>().map(|_| ()).err();
            assert!(e.is_some_and(|e| e.reason().contains(says)), "{typo}");
        }
        // `Cidr::new` masks (the network an address is in).
        assert_eq!(
            Cidr::new(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)), 8)?.to_string(),
            "10.0.0.0/8"
        );
        assert!(net.contains("10.200.0.1".parse().map_err(|_| ConfigError::new("", ""))?));
        assert!(!net.contains(IpAddr::V4(Ipv4Addr::new(11, 0, 0, 1))));
        let mapped: IpAddr = "::ffff:10.9.9.9"
            .parse()
            .map_err(|_| ConfigError::new("", ""))?;
        assert!(net.contains(mapped));
        let v6: Cidr = "2001:db8::/32".parse()?;
        assert!(
            v6.contains(
                "2001:db8:ffff::1"
                    .parse()
                    .map_err(|_| ConfigError::new("", ""))?
            )
        );
        assert!(!v6.contains(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))));
        let all: Cidr = "0.0.0.0/0".parse()?;
        assert!(all.contains(IpAddr::V4(Ipv4Addr::new(1, 2, 3, 4))));
        let one: Cidr = "::1".parse()?;
        assert_eq!(one.prefix(), 128);
        Ok(())
    }

    #[test]
    fn bad_networks_say_why() {
        for (input, needle) in [
            ("10.0.0.0/33", "at most 32"),
            ("::/129", "at most 128"),
            ("10.0.0/8", "IP network"),
            ("10.0.0.0/x", "whole number"),
            ("10.0.0.0/+8", "whole number"),
            ("10.0.0.0/08", "leading zero"),
            ("10.0.0.0/", "whole number"),
            ("10.0.0.0/256", "whole number"),
            ("", "IP network"),
        ] {
            let text = input
                .parse::<Cidr>()
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(text.contains(needle), "{input:?}: {text}");
        }
    }
}
