//! Who the client is: the peer address, or, when the peer is a trusted proxy, the address the
//! proxies report in `X-Forwarded-For` or `Forwarded` (RFC 7239), walked right to left. The
//! one walk every door uses.
//!
//! Only the hops a trusted proxy appended can be believed: everything to their left was written
//! by the client. So the walk starts at the right, skips trusted proxies, and stops at the first
//! address that is not one: that is the client. A malformed entry stops the walk at the last
//! hop that was trusted, so garbage can never make up an identity.

use std::net::{IpAddr, Ipv6Addr};

use http::HeaderMap;
use http::header::{FORWARDED, HeaderName, HeaderValue};
use smallvec::SmallVec;

use crate::{Refusal, TrustedProxies};

/// Which header trusted proxies report the client in.
///
/// Exactly one is read: if both were, a client could forge the one its proxy does not write,
/// and its right-most entries would then be the client's own choice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (nginx, Traefik, most load balancers).
    #[default]
    XForwardedFor,
    /// `Forwarded: for=client, for="[2001:db8::1]:4711"` (RFC 7239).
    Forwarded,
}

/// How far the walk goes: a longer chain of trusted proxies is not a real deployment.
const MAX_HOPS: usize = 32;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The client's address: the peer (the socket's remote address) unless it is a trusted proxy;
/// then the one forwarding header `which`, walked right to left past trusted hops, to the first
/// address that is not one.
///
/// Every door reads the client this way (the proxy and the tower layer from their peer,
/// forward-auth from the proxy that calls it), so a request keyed by its address counts under
/// one key whichever door it comes through. The right-most element is what the trusted peer
/// itself appended: if it cannot be read the request is refused, naming the header, rather
/// than counted under the proxy's address (every client would then share one count). Further
/// left, an element that cannot be read (written by the client) ends the walk at the last
/// trusted hop, as does a `Forwarded` element that reports no address on purpose (no `for=`,
/// `for=unknown`, an obfuscated `for=_hidden`), even right-most, so garbage never makes up an identity. A
/// trusted peer that sends no forwarding header is the client itself.
pub fn client_address(
    peer: IpAddr,
    headers: &HeaderMap,
    trusted: &TrustedProxies,
    which: ForwardedHeader,
) -> Result<IpAddr, Refusal> {
    let peer = peer.to_canonical();
    if trusted.is_empty() || !trusted.contains(peer) {
        return Ok(peer);
    }
    let name = match which {
        ForwardedHeader::XForwardedFor => &X_FORWARDED_FOR,
        ForwardedHeader::Forwarded => &FORWARDED,
    };
    let mut last_trusted = peer;
    let mut hops = 0;
    // Several header lines form one list, in order: walk the lines from the last one. Values
    // are bytes, read element by element: a byte that is not ASCII spoils only the element it
    // is in, and the walk reaches it only after every hop to its right, so a client cannot
    // make a trusted proxy's report of it unreadable by sending garbage of its own.
    let lines: SmallVec<[&HeaderValue; 4]> = headers.get_all(name).iter().collect();
    for line in lines.into_iter().rev() {
        for entry in line.as_bytes().rsplit(|&b| b == b',') {
            hops += 1;
            if hops > MAX_HOPS {
                return Ok(last_trusted);
            }
            let node = std::str::from_utf8(entry).ok().and_then(|e| match which {
                ForwardedHeader::XForwardedFor => Some(e.trim()),
                ForwardedHeader::Forwarded => forwarded_for(e),
            });
            let Some(ip) = node.and_then(parse_node) else {
                if hops == 1
                    && node.is_some_and(|n| !(which == ForwardedHeader::Forwarded && hidden(n)))
                {
                    return Err(Refusal::bad_field(
                        header_name(which),
                        "must end with the client's address, as the proxy appends it",
                    ));
                }
                return Ok(last_trusted);
            };
            if trusted.contains(ip) {
                last_trusted = ip;
            } else {
                return Ok(ip);
            }
        }
    }
    // Every hop is a trusted proxy: the left-most one is as close to the client as we know.
    Ok(last_trusted)
}

/// How the header is named in refusals.
fn header_name(which: ForwardedHeader) -> &'static str {
    match which {
        ForwardedHeader::XForwardedFor => "X-Forwarded-For",
        ForwardedHeader::Forwarded => "Forwarded",
    }
}

/// A node a proxy writes on purpose instead of an address: `unknown`, or an obfuscated
/// identifier (`_hidden`, RFC 7239 section 6.3).
fn hidden(node: &str) -> bool {
    let node = node.trim().trim_matches('"');
    node.eq_ignore_ascii_case("unknown") || node.starts_with('_')
}

/// The `for=` parameter of one `Forwarded` element (`for=1.2.3.4;proto=https`).
fn forwarded_for(element: &str) -> Option<&str> {
    element.split(';').find_map(|pair| {
        let (name, value) = pair.trim().split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("for")
            .then(|| value.trim())
    })
}

/// An address as proxies write it: `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`, `[2001:db8::1]:80`,
/// optionally in double quotes. `unknown` and obfuscated identifiers (`_hidden`) are not
/// addresses.
fn parse_node(node: &str) -> Option<IpAddr> {
    let node = node.trim();
    let node = node
        .strip_prefix('"')
        .and_then(|n| n.strip_suffix('"'))
        .unwrap_or(node);
    if let Some(rest) = node.strip_prefix('[') {
        let (v6, _port) = rest.split_once(']')?;
        return v6
            .parse::<Ipv6Addr>()
            .ok()
            .map(|ip| IpAddr::V6(ip).to_canonical());
    }
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    // IPv4 with a port: exactly one colon.
    let (host, port) = node.rsplit_once(':')?;
    if port.bytes().all(|b| b.is_ascii_digit()) && !host.contains(':') {
        return host.parse::<IpAddr>().ok();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn ip(s: &str) -> IpAddr {
        s.parse()
            .unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED))
    }

    fn headers(name: &str, values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(v),
            ) {
                h.append(n, v);
            }
        }
        h
    }

    #[test]
    fn untrusted_peer_is_the_client() -> Result<(), crate::ConfigError> {
        let trusted = TrustedProxies::parse(["10.0.0.0/8"])?;
        let h = headers("x-forwarded-for", &["6.6.6.6"]);
        let got = client_address(
            ip("203.0.113.9"),
            &h,
            &trusted,
            ForwardedHeader::XForwardedFor,
        )
        .unwrap();
        assert_eq!(got, ip("203.0.113.9"));
        Ok(())
    }

    #[test]
    fn walks_right_to_left_past_trusted_hops() -> Result<(), crate::ConfigError> {
        let trusted = TrustedProxies::parse(["10.0.0.0/8"])?;
        let h = headers("x-forwarded-for", &["6.6.6.6, 198.51.100.1", "10.0.0.2"]);
        let got =
            client_address(ip("10.0.0.1"), &h, &trusted, ForwardedHeader::XForwardedFor).unwrap();
        assert_eq!(got, ip("198.51.100.1"));
        // A client's unreadable bytes spoil only its own element, left of the real hops.
        let mut h = HeaderMap::new();
        h.append(
            "x-forwarded-for",
            HeaderValue::from_bytes(b"\xe9, 198.51.100.77").unwrap(),
        );
        let got =
            client_address(ip("10.0.0.1"), &h, &trusted, ForwardedHeader::XForwardedFor).unwrap();
        assert_eq!(got, ip("198.51.100.77"));
        h.append("x-forwarded-for", HeaderValue::from_static("10.0.0.4"));
        let got =
            client_address(ip("10.0.0.1"), &h, &trusted, ForwardedHeader::XForwardedFor).unwrap();
        assert_eq!(got, ip("198.51.100.77"));
        let h = headers("x-forwarded-for", &["garbage, 10.0.0.3"]);
        let got =
            client_address(ip("10.0.0.1"), &h, &trusted, ForwardedHeader::XForwardedFor).unwrap();
        assert_eq!(got, ip("10.0.0.3"));
        Ok(())
    }

    #[test]
    fn forwarded_elements() -> Result<(), crate::ConfigError> {
        let trusted = TrustedProxies::parse(["10.0.0.0/8"])?;
        let h = headers(
            "forwarded",
            &["for=6.6.6.6, for=\"[2001:db8::7]:4711\";proto=https, for=10.1.1.1:80"],
        );
        let got = client_address(ip("10.0.0.1"), &h, &trusted, ForwardedHeader::Forwarded).unwrap();
        assert_eq!(got, ip("2001:db8::7"));
        let h = headers("forwarded", &["for=unknown"]);
        let got = client_address(ip("10.0.0.1"), &h, &trusted, ForwardedHeader::Forwarded).unwrap();
        assert_eq!(got, ip("10.0.0.1"));
        Ok(())
    }
}
