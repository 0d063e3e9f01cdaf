//! One reading of the fields that say what a request is, for every door: its method, its
//! target and its host. The proxy reads them from the request line and `Host`, forward-auth from
//! `X-Forwarded-*` headers, `/v1/check` from JSON, replay from a log line; each hands the bytes
//! here, under the name it knows the field by, and gets the field as the engine matches it, or
//! the same [`Refusal`] the other doors give.
//!
//! What is refused is what an upstream could read otherwise than the limiter: a target that is
//! not a path of visible ASCII (a fragment, a space, a byte past ASCII), a host with anything but
//! a name or address and an optional port (an empty port, user information, escapes). The client
//! address has its own reading, shared the same way: [`client_address`](crate::client_address).

use http::Method;

use crate::Refusal;

const NOT_METHOD: &str = "is not an HTTP method";
const NOT_TARGET: &str = "must be a path starting with '/', in visible ASCII without a fragment \
     ('#'; percent-encode other bytes), as in the request line";
const NOT_HOST: &str = "must be a host name or address with an optional port, in ASCII";

/// A method as the engine matches it: a token, in upper case (methods are case-sensitive, but
/// a lower-case one must not slip past a policy that names the upper-case method).
pub fn method(raw: &[u8], field: &'static str) -> Result<Method, Refusal> {
    let raw = raw.trim_ascii();
    let refuse = || Refusal::bad_field(field, NOT_METHOD);
    if raw.is_empty() || raw.len() > 32 {
        return Err(refuse());
    }
    let upper: smallvec::SmallVec<[u8; 16]> = raw.iter().map(u8::to_ascii_uppercase).collect();
    Method::from_bytes(&upper).map_err(|_| refuse())
}

/// A request target in origin form (`/path?query`): `/` first, then visible ASCII only, and no
/// fragment, which a client never sends and an upstream would cut off where the limiter would
/// not.
pub fn target<'a>(raw: &'a [u8], field: &'static str) -> Result<&'a str, Refusal> {
    let visible = |b: &u8| (0x21..=0x7e).contains(b) && *b != b'#';
    if raw.first() != Some(&b'/') || !raw.iter().all(visible) {
        return Err(Refusal::bad_field(field, NOT_TARGET));
    }
    std::str::from_utf8(raw).map_err(|_| Refusal::bad_field(field, NOT_TARGET))
}

/// The bytes of a host name: letters, digits, `-`, `.`, `_`.
const HOST_NAME: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric() || c == b'-' || c == b'.' || c == b'_';
        b += 1;
    }
    table
};

/// A host as servers route on it: a name of letters, digits, `-`, `.` and `_`, or an IPv6
/// literal in brackets, then an optional `:port` of one to five digits. Anything else (an
/// empty port, user information, percent-escapes, other punctuation) is read differently by
/// different servers, so a host policy could miss a request its upstream serves.
pub fn authority<'a>(raw: &'a [u8], field: &'static str) -> Result<&'a str, Refusal> {
    let text = std::str::from_utf8(raw).map_err(|_| Refusal::bad_field(field, NOT_HOST))?;
    if valid_authority(text) {
        Ok(text)
    } else {
        Err(Refusal::bad_field(field, NOT_HOST))
    }
}

/// [`authority`]'s check, by hand and without allocating (the proxy runs it on every request).
pub(crate) fn valid_authority(text: &str) -> bool {
    let (host_ok, port) = match text.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((v6, after)) => (
                v6.parse::<std::net::Ipv6Addr>().is_ok(),
                after.strip_prefix(':').or(after.is_empty().then_some("")),
            ),
            None => (false, None),
        },
        None => {
            let (host, port) = text.split_once(':').unwrap_or((text, ""));
            let name = |b: u8| HOST_NAME[usize::from(b)];
            (
                !host.is_empty() && host.bytes().all(name),
                (text.len() == host.len() || !port.is_empty()).then_some(port),
            )
        }
    };
    host_ok && port.is_some_and(|p| p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        for ok in ["/", "/v1/items?x=1", "/a%20b", "/~user/!$&'()*+,;=:@"] {
            assert_eq!(target(ok.as_bytes(), "t"), Ok(ok), "{ok}");
        }
        for bad in [
            "",
            "v1",
            "/a b",
            "/admin/x?y=1#f",
            "/caf\u{e9}",
            "/a\tb",
            "*",
        ] {
            let r = target(bad.as_bytes(), "X-Forwarded-Uri").unwrap_err();
            assert_eq!(r.field(), Some("X-Forwarded-Uri"), "{bad:?}");
        }
    }

    #[test]
    fn hosts() {
        for ok in [
            "api.example.com",
            "api.example.com:8080",
            "[::1]",
            "[::1]:80",
            "a_b-c",
        ] {
            assert_eq!(authority(ok.as_bytes(), "Host"), Ok(ok), "{ok}");
        }
        for bad in [
            "",
            "api.example.com:",
            "user@api.example.com",
            "api.example.com:123456",
            "[::1",
            "[zz]",
            "a%2eb",
            "a b",
            ":80",
            "api.example.com:8x",
        ] {
            assert!(authority(bad.as_bytes(), "Host").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn methods() {
        assert_eq!(method(b" get ", "m"), Ok(Method::GET));
        assert_eq!(
            method(b"PROPFIND", "m")
                .map(|m| m.to_string())
                .ok()
                .as_deref(),
            Some("PROPFIND")
        );
        for bad in [&b""[..], b"GE T", b"G(ET", b"\xff"] {
            assert!(method(bad, "m").is_err(), "{bad:?}");
        }
    }
}
