//! Key selectors: parsing, the keys they read from a request, and the credential digests.

use super::*;

#[test]
fn selectors_parse_and_print() {
    for text in ["header:x-api-key", "query:k", "user", "jwt:sub", "ip"] {
        let s: KeySelector = text.parse().unwrap();
        assert_eq!(s.to_string(), text);
    }
    let s: KeySelector = "header:X-Api-Key".parse().unwrap();
    assert_eq!(s.to_string(), "header:x-api-key");
}

#[test]
fn bad_selectors_say_why() {
    for (input, needle) in [
        ("header:", "header name after the colon"),
        ("header:bad name", "valid HTTP header name"),
        ("jwt", "claim name after the colon"),
        ("ip:v6", "takes no argument"),
        ("cookie:session", "unknown key selector"),
        ("", "unknown key selector"),
    ] {
        let text = input
            .parse::<KeySelector>()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(text.contains(needle), "{input:?}: {text}");
    }
}

#[test]
fn hashes_are_fixed_length_hex_and_keyed() {
    let mut a = KeyBuf::new();
    CredentialHasher::new(b"").append(b"secret-api-key", &mut a);
    assert_eq!(a.len(), 32);
    assert!(a.iter().all(u8::is_ascii_hexdigit));
    let mut b = KeyBuf::new();
    CredentialHasher::new(b"pepper").append(b"secret-api-key", &mut b);
    assert_ne!(a, b);
}

#[test]
fn ipv6_is_grouped_by_prefix() {
    let mut a = KeyBuf::new();
    write_ip("2001:db8:1:2:aaaa::1".parse().unwrap(), 64, &mut a);
    assert_eq!(&a[..], b"ip:2001:db8:1:2::/64");
    let mut b = KeyBuf::new();
    write_ip("::ffff:192.0.2.1".parse().unwrap(), 64, &mut b);
    assert_eq!(&b[..], b"ip:192.0.2.1");
}
