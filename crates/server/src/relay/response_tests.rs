//! Tests of response heads as the client gets them.

use super::*;

fn head(raw: &[u8], client: ForClient) -> (Result<Option<ResponseHead>, BadResponse>, String) {
    let mut out = Vec::new();
    let r = response_head(raw, &mut out, &RateLimitHeaders::default(), client);
    (r, String::from_utf8_lossy(&out).into_owned())
}

const V11: ForClient = ForClient {
    version: Version::Http11,
    is_head: false,
    close: false,
};

#[test]
fn the_framing_the_client_reads_is_the_relays() {
    let raw = b"HTTP/1.1 200 OK\r\nConnection: keep-alive, x-hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nContent-Length: 2\r\nX-Up: 1\r\n\r\nok";
    let (r, text) = head(raw, V11);
    let Ok(Some(h)) = r else {
        panic!("a complete head");
    };
    assert_eq!(
        (h.len, h.framing, h.upstream_close, h.client_close),
        (raw.len() - 2, Framing::Length(2), false, false)
    );
    assert_eq!(
        text,
        "HTTP/1.1 200 OK\r\nX-Up: 1\r\ncontent-length: 2\r\n\r\n"
    );
    // No length: read until the upstream closes, chunked for the client.
    let (r, text) = head(
        b"HTTP/1.1 200 \r\nX-Up: 1\r\n\r\n",
        ForClient { close: true, ..V11 },
    );
    assert!(matches!(
        r,
        Ok(Some(ResponseHead {
            framing: Framing::Close,
            encoding: Encoding::Chunked,
            upstream_close: true,
            ..
        }))
    ));
    assert_eq!(
        text,
        "HTTP/1.1 200 OK\r\nX-Up: 1\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    );
    // Both framings: chunked wins, the length goes, the upstream connection is not reused.
    let (r, text) = head(
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        V11,
    );
    assert!(matches!(
        r,
        Ok(Some(ResponseHead {
            framing: Framing::Chunked,
            upstream_close: true,
            ..
        }))
    ));
    assert_eq!(
        text,
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    );
}

#[test]
fn http10_clients_get_no_chunking_and_no_interim_answers() {
    let v10 = ForClient {
        version: Version::Http10,
        close: false,
        ..V11
    };
    let (r, text) = head(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        v10,
    );
    assert!(matches!(
        r,
        Ok(Some(ResponseHead {
            encoding: Encoding::Identity,
            client_close: true,
            ..
        }))
    ));
    assert_eq!(text, "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n");
    let (_, text) = head(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", v10);
    assert_eq!(
        text,
        "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: keep-alive\r\n\r\n"
    );
    let (r, text) = head(b"HTTP/1.1 100 Continue\r\n\r\n", v10);
    assert!(matches!(r, Ok(Some(ResponseHead { interim: true, .. }))));
    assert_eq!(text, "");
}

#[test]
fn bodiless_answers_and_bad_ones() {
    let (r, text) = head(
        b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n",
        ForClient {
            is_head: true,
            ..V11
        },
    );
    assert!(matches!(
        r,
        Ok(Some(ResponseHead {
            framing: Framing::None,
            ..
        }))
    ));
    assert_eq!(text, "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n");
    let (r, _) = head(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", V11);
    assert!(matches!(r, Ok(Some(ResponseHead { interim: true, .. }))));
    assert!(matches!(head(b"HTTP/1.1 200 OK\r\n", V11).0, Ok(None)));
    for bad in [
        &b"garbage\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
    ] {
        assert_eq!(
            head(bad, V11).0,
            Err(BadResponse),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}
