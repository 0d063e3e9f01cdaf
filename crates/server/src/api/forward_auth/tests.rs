//! Unit tests of how a forward-auth request is read: what is required, what is refused, and who
//! the client is.

use super::*;

fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (name, value) in pairs {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            h.append(n, v);
        }
    }
    h
}

fn loopback() -> TrustedProxies {
    crate::config::ForwardAuthConfig::default().trusted_proxies
}

fn ip(s: &str) -> IpAddr {
    s.parse()
        .unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED))
}

const COMPLETE: &[(&str, &[u8])] = &[
    ("x-forwarded-method", b"post"),
    ("x-forwarded-uri", b"/v1/items?page=2"),
    ("x-forwarded-host", b"api.example.com:8443"),
    ("x-forwarded-for", b"198.51.100.7"),
];

/// The field a refusal names.
fn field<T>(got: Result<T, Refusal>) -> Option<String> {
    got.err().and_then(|r| r.field().map(str::to_owned))
}

fn read_with(
    extra: &[(&str, &[u8])],
    without: &str,
) -> Result<(Method, String, String, IpAddr), Refusal> {
    let mut pairs: Vec<(&str, &[u8])> = COMPLETE
        .iter()
        .copied()
        .filter(|(n, _)| *n != without)
        .collect();
    pairs.extend_from_slice(extra);
    let h = headers(&pairs);
    Described::read(&h, ip("127.0.0.1"), &loopback())
        .map(|d| (d.method, d.target.to_owned(), d.host.to_owned(), d.client))
}

#[test]
fn a_complete_description_is_read_as_sent() {
    let got = read_with(&[], "");
    assert_eq!(
        got,
        Ok((
            Method::POST,
            "/v1/items?page=2".to_owned(),
            "api.example.com:8443".to_owned(),
            ip("198.51.100.7")
        ))
    );
}

#[test]
fn each_missing_header_is_named() {
    for (name, display) in [
        ("x-forwarded-method", "X-Forwarded-Method"),
        ("x-forwarded-uri", "X-Forwarded-Uri"),
        ("x-forwarded-host", "X-Forwarded-Host"),
        ("x-forwarded-for", "X-Forwarded-For"),
    ] {
        let got = read_with(&[], name);
        let refusal = got.err();
        assert_eq!(
            refusal.as_ref().and_then(|r| r.field()),
            Some(display),
            "without {name}"
        );
        let text = refusal.map(|r| r.detail().to_owned()).unwrap_or_default();
        assert!(text.starts_with(&format!("{display} is missing")), "{text}");
    }
}

#[test]
fn x_original_uri_stands_in_for_x_forwarded_uri_but_not_beside_it() {
    let got = read_with(&[("x-original-uri", b"/search?q=1")], "x-forwarded-uri");
    assert_eq!(got.map(|g| g.1), Ok("/search?q=1".to_owned()));
    let got = read_with(&[("x-original-uri", b"/public")], "");
    assert_eq!(field(got), Some("X-Forwarded-Uri".to_owned()));
}

#[test]
fn repeated_identity_headers_are_refused_by_name() {
    for (name, display, value) in [
        (
            "x-forwarded-host",
            "X-Forwarded-Host",
            &b"other.example"[..],
        ),
        ("x-forwarded-uri", "X-Forwarded-Uri", b"/public"),
        ("x-forwarded-method", "X-Forwarded-Method", b"GET"),
    ] {
        let got = read_with(&[(name, value)], "");
        assert_eq!(field(got), Some(display.to_owned()), "{name}");
    }
    // X-Forwarded-For is a list: several lines are one list, in order.
    let got = read_with(&[("x-forwarded-for", b"203.0.113.5")], "");
    assert_eq!(got.map(|g| g.3), Ok(ip("203.0.113.5")));
}

#[test]
fn an_unreadable_target_is_refused_never_read_as_root() {
    for target in [
        &b"/caf\xc3\xa9"[..],
        b"/a\xe9b",
        b"/a b",
        b"/a\tb",
        b"",
        b"v1/items",
        b"http://other.example/v1",
        b"*",
        b"/admin/x?y=1#f",
    ] {
        let got = read_with(&[("x-forwarded-uri", target)], "x-forwarded-uri");
        assert_eq!(field(got), Some("X-Forwarded-Uri".to_owned()), "{target:?}");
    }
    let got = read_with(&[("x-original-uri", b"/\xff")], "x-forwarded-uri");
    assert_eq!(field(got), Some("X-Original-URI".to_owned()));
}

#[test]
fn an_unreadable_host_or_method_is_refused() {
    for host in [
        &b"h\xc3\xa9.example"[..],
        b"a b",
        b"user@host",
        b"host/path",
        b"",
        b"api.example.com:",
    ] {
        let got = read_with(&[("x-forwarded-host", host)], "x-forwarded-host");
        assert_eq!(field(got), Some("X-Forwarded-Host".to_owned()), "{host:?}");
    }
    for host in [&b"[2001:db8::1]:443"[..], b"localhost", b"10.0.0.1:80"] {
        assert!(read_with(&[("x-forwarded-host", host)], "x-forwarded-host").is_ok());
    }
    let got = read_with(&[("x-forwarded-method", b"G(T")], "x-forwarded-method");
    assert_eq!(field(got), Some("X-Forwarded-Method".to_owned()));
}

fn client(peer: &str, xff: &[&[u8]], trusted: &TrustedProxies) -> Result<IpAddr, Refusal> {
    let pairs: Vec<(&str, &[u8])> = xff.iter().map(|v| ("x-forwarded-for", *v)).collect();
    client_address(ip(peer), &headers(&pairs), trusted)
}

#[test]
fn only_a_trusted_caller_is_believed() {
    let t = loopback();
    assert_eq!(
        client("127.0.0.1", &[b"198.51.100.7"], &t),
        Ok(ip("198.51.100.7"))
    );
    assert_eq!(client("::1", &[b"2001:db8::7"], &t), Ok(ip("2001:db8::7")));
    // A caller elsewhere is itself the client, whatever it says.
    assert_eq!(
        client("192.0.2.10", &[b"198.51.100.7"], &t),
        Ok(ip("192.0.2.10"))
    );
    assert_eq!(client("192.0.2.10", &[], &t), Ok(ip("192.0.2.10")));
    // An IPv4-mapped caller is the IPv4 address it maps.
    assert_eq!(
        client("::ffff:127.0.0.1", &[b"198.51.100.7"], &t),
        Ok(ip("198.51.100.7"))
    );
    // Trusting nobody: every caller is the client.
    let none = TrustedProxies::none();
    assert_eq!(
        client("127.0.0.1", &[b"198.51.100.7"], &none),
        Ok(ip("127.0.0.1"))
    );
}

#[test]
fn the_walk_goes_right_to_left_element_by_element() -> Result<(), tollgate_http::ConfigError> {
    let t = TrustedProxies::parse(["127.0.0.0/8", "10.0.0.0/8"])?;
    // The client wrote the left part; the trusted proxies appended the rest.
    assert_eq!(
        client("127.0.0.1", &[b"6.6.6.6, 198.51.100.1, 10.0.0.2"], &t),
        Ok(ip("198.51.100.1"))
    );
    assert_eq!(
        client(
            "127.0.0.1",
            &[b"6.6.6.6", b"198.51.100.1:5000", b"10.0.0.2"],
            &t
        ),
        Ok(ip("198.51.100.1"))
    );
    assert_eq!(
        client("127.0.0.1", &[b"[2001:db8::9]:443"], &t),
        Ok(ip("2001:db8::9"))
    );
    // A byte the walk cannot read, left of the real hop, does not hide the real hop...
    assert_eq!(
        client("127.0.0.1", &[b"\xe9, 198.51.100.77"], &t),
        Ok(ip("198.51.100.77"))
    );
    // ...and to the right of trusted hops it ends the walk at the last trusted one.
    assert_eq!(
        client("127.0.0.1", &[b"198.51.100.1, garbage, 10.0.0.2"], &t),
        Ok(ip("10.0.0.2"))
    );
    // The element the caller itself appended must be an address.
    assert_eq!(
        field(client("127.0.0.1", &[b"198.51.100.1, unknown"], &t)),
        Some("X-Forwarded-For".to_owned())
    );
    assert_eq!(
        field(client("127.0.0.1", &[b""], &t)),
        Some("X-Forwarded-For".to_owned())
    );
    // All trusted: the left-most.
    assert_eq!(
        client("127.0.0.1", &[b"10.0.0.9, 10.0.0.2"], &t),
        Ok(ip("10.0.0.9"))
    );
    Ok(())
}

#[test]
fn a_hop_list_past_the_bound_ends_at_the_last_trusted_hop() -> Result<(), tollgate_http::ConfigError>
{
    let t = TrustedProxies::parse(["10.0.0.0/8", "127.0.0.1/32"])?;
    let mut list = String::from("198.51.100.1");
    for _ in 0..40 {
        list.push_str(", 10.0.0.2");
    }
    assert_eq!(
        client("127.0.0.1", &[list.as_bytes()], &t),
        Ok(ip("10.0.0.2"))
    );
    Ok(())
}
