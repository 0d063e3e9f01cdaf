//! Tests of request heads: the end of a head found in linear time, the checks, and the head
//! written for the upstream.

use super::*;

fn parse<'h, 'b>(h: &'h mut [httparse::Header<'b>], raw: &'b [u8]) -> httparse::Request<'h, 'b> {
    let mut req = httparse::Request::new(h);
    match req.parse(raw) {
        Ok(httparse::Status::Complete(_)) => req,
        other => panic!("not a complete head: {other:?}"),
    }
}

fn checked(raw: &[u8]) -> Result<(Framing, Host<'_>, String, bool), StatusCode> {
    let mut h = [httparse::EMPTY_HEADER; 16];
    let req = parse(&mut h, raw);
    check(&req)
        .map(|head| {
            (
                head.framing,
                head.host,
                head.target.into_owned(),
                head.close,
            )
        })
        .map_err(|r| r.status())
}

#[test]
fn the_end_of_a_head_is_found_once_however_it_arrives() {
    let head = b"GET / HTTP/1.1\r\nHost: a\r\n\r\nNEXT";
    for step in 1..=head.len() {
        let mut scan = HeadScan::default();
        let mut found = None;
        let mut upto = 0;
        while found.is_none() && upto < head.len() {
            upto = (upto + step).min(head.len());
            found = scan.end(&head[..upto]);
        }
        assert_eq!(found, Some(head.len() - 4), "step {step}");
    }
    let mut scan = HeadScan::default();
    assert_eq!(scan.end(b"GET / HTTP/1.1\nHost: a\n\nrest"), Some(24));
    let mut scan = HeadScan::default();
    assert_eq!(scan.end(b"GET / HTTP/1.1\r\nHost: a\r\n"), None);
    assert_eq!(scan.end(b"GET / HTTP/1.1\r\nHost: a\r\n\r"), None);
    assert_eq!(scan.end(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"), Some(27));
}

#[test]
fn a_head_sent_a_byte_at_a_time_is_scanned_in_linear_time() {
    // 64 KiB of one header line, a byte at a time: every byte is looked at a bounded number of
    // times (the old scan looked at the whole buffer again on every read).
    let mut head = b"GET / HTTP/1.1\r\nX: ".to_vec();
    head.extend(std::iter::repeat_n(b'a', 64 * 1024));
    let mut scan = HeadScan::default();
    let mut probes = 0usize;
    for upto in 1..=head.len() {
        let before = scan.from;
        assert_eq!(scan.end(&head[..upto]), None);
        probes += upto - before;
    }
    assert!(
        probes <= 2 * head.len(),
        "{probes} probes for {} bytes",
        head.len()
    );
}

#[test]
fn framing_is_read_strictly() {
    let ok = |raw: &[u8]| checked(raw).map(|(f, ..)| f);
    assert_eq!(ok(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"), Ok(Framing::None));
    assert_eq!(
        ok(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"),
        Ok(Framing::Length(0))
    );
    assert_eq!(
        ok(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n"),
        Ok(Framing::Length(3))
    );
    assert_eq!(
        ok(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n"),
        Ok(Framing::Chunked)
    );
    for bad in [
        &b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"[..],
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\n",
        b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
    ] {
        assert_eq!(ok(bad), Err(StatusCode::BAD_REQUEST), "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn targets_and_hosts_are_what_the_upstream_reads() {
    // Absolute-form: the target's authority is the host, whatever Host says.
    let (_, host, target, _) =
        checked(b"GET http://other.example/x?q=1 HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
            .unwrap_or_else(|s| panic!("{s}"));
    assert_eq!(
        (host, target.as_str()),
        (Host::Target("other.example"), "/x?q=1")
    );
    let (_, host, target, _) = checked(b"GET HTTPS://b.example:8443?x HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap_or_else(|s| panic!("{s}"));
    assert_eq!(
        (host, target.as_str()),
        (Host::Target("b.example:8443"), "/?x")
    );
    // HTTP/1.0 may omit Host: the upstream's own is sent. It closes unless it asks not to.
    let (_, host, _, close) = checked(b"GET / HTTP/1.0\r\n\r\n").unwrap_or_else(|s| panic!("{s}"));
    assert_eq!((host, close), (Host::Upstream, true));
    let (.., close) = checked(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        .unwrap_or_else(|s| panic!("{s}"));
    assert!(!close);
    for (bad, status) in [
        (&b"GET / HTTP/1.1\r\n\r\n"[..], StatusCode::BAD_REQUEST),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            StatusCode::BAD_REQUEST,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n",
            StatusCode::BAD_REQUEST,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: user@a\r\n\r\n",
            StatusCode::BAD_REQUEST,
        ),
        (
            b"GET http://user@a/ HTTP/1.1\r\nHost: a\r\n\r\n",
            StatusCode::BAD_REQUEST,
        ),
        (
            b"GET ftp://a/ HTTP/1.1\r\nHost: a\r\n\r\n",
            StatusCode::BAD_REQUEST,
        ),
        (
            b"GET /admin#x HTTP/1.1\r\nHost: a\r\n\r\n",
            StatusCode::BAD_REQUEST,
        ),
        (
            b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
            StatusCode::BAD_REQUEST,
        ),
        (
            b"CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n",
            StatusCode::NOT_IMPLEMENTED,
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nExpect: x\r\n\r\n",
            StatusCode::EXPECTATION_FAILED,
        ),
    ] {
        assert_eq!(
            checked(bad).map(|_| ()),
            Err(status),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn hosts_are_names_addresses_and_ports_only() {
    for good in [
        "a",
        "api.example.com",
        "a-b_c.d:8080",
        "127.0.0.1",
        "[::1]",
        "[2001:db8::1]:443",
        "x.",
    ] {
        assert!(
            normalize::authority(good.as_bytes(), "Host").is_ok(),
            "{good}"
        );
    }
    for bad in [
        "", ":80", "a:", "a:b", "a:123456", "user@a", "a b", "a,b", "a%41", "[::1", "[zz]",
        "[::1]x", "a:80:80", "\u{e9}",
    ] {
        assert!(
            normalize::authority(bad.as_bytes(), "Host").is_err(),
            "{bad}"
        );
    }
}

#[test]
fn the_upstream_head_is_written_by_the_relay() {
    let raw = b"POST /a?b=1 HTTP/1.1\r\nHost: api.example.com\r\nConnection: keep-alive, x-secret, content-length, transfer-encoding, host, x-api-key\r\nX-Secret: 1\r\nKeep-Alive: 5\r\nContent-Length: 39\r\nX-Forwarded-For: 192.0.2.1\r\nx-forwarded-for: 192.0.2.2\r\nX-Api-Key: k\r\nUpgrade: h2c\r\n\r\n";
    let mut h = [httparse::EMPTY_HEADER; 16];
    let req = parse(&mut h, raw);
    let head = check(&req).unwrap_or_else(|r| panic!("{r:?}"));
    let mut out = Vec::new();
    let authority: Authority = "127.0.0.1:9".parse().unwrap_or_else(|_| unreachable!());
    write_upstream_head(
        &mut out,
        &head,
        req.headers,
        &authority,
        b"10.0.0.7",
        (|n: &str| n.eq_ignore_ascii_case("x-api-key"), false),
    );
    // A Connection header naming the framing, the host or a key the limiter read takes none
    // of them away: the upstream reads the request that was decided on.
    assert_eq!(
        String::from_utf8_lossy(&out),
        "POST /a?b=1 HTTP/1.1\r\nhost: api.example.com\r\nX-Api-Key: k\r\ncontent-length: 39\r\nx-forwarded-for: 192.0.2.1, 192.0.2.2, 10.0.0.7\r\n\r\n"
    );
    let mut h = [httparse::EMPTY_HEADER; 4];
    let req = parse(&mut h, b"GET / HTTP/1.0\r\n\r\n");
    let head = check(&req).unwrap_or_else(|r| panic!("{r:?}"));
    write_upstream_head(
        &mut out,
        &head,
        req.headers,
        &authority,
        b"::1",
        (|_: &str| false, false),
    );
    assert_eq!(
        String::from_utf8_lossy(&out),
        "GET / HTTP/1.1\r\nhost: 127.0.0.1:9\r\nx-forwarded-for: ::1\r\n\r\n"
    );
}

/// A request whose cost is read from its response body asks for it uncompressed, whatever
/// the client accepts (in any case, any number of times): a compressed body would hide the
/// usage, and the client would pay only the fallback cost.
#[test]
fn a_body_read_for_its_cost_is_asked_for_uncompressed() {
    let raw = b"GET /v1/chat HTTP/1.1\r\nHost: api\r\nAccept-Encoding: gzip\r\naccept-encoding: br\r\nACCEPT-ENCODING: zstd\r\nAccept: */*\r\n\r\n";
    let mut h = [httparse::EMPTY_HEADER; 8];
    let req = parse(&mut h, raw);
    let head = check(&req).unwrap_or_else(|r| panic!("{r:?}"));
    let authority: Authority = "127.0.0.1:9".parse().unwrap_or_else(|_| unreachable!());
    let mut out = Vec::new();
    write_upstream_head(
        &mut out,
        &head,
        req.headers,
        &authority,
        b"::1",
        (|_: &str| false, true),
    );
    assert_eq!(
        String::from_utf8_lossy(&out),
        "GET /v1/chat HTTP/1.1\r\nhost: api\r\nAccept: */*\r\naccept-encoding: identity\r\nx-forwarded-for: ::1\r\n\r\n"
    );
    // Without a policy reading the body, the client's choice goes through.
    write_upstream_head(
        &mut out,
        &head,
        req.headers,
        &authority,
        b"::1",
        (|_: &str| false, false),
    );
    assert!(
        String::from_utf8_lossy(&out).contains("Accept-Encoding: gzip\r\naccept-encoding: br\r\n")
    );
}
