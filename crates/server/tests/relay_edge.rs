//! Adversarial tests of the proxy relay over raw sockets, against raw upstreams that send
//! exactly the bytes each test wants: interim responses, bodiless statuses, conflicting
//! framing, chunk extensions and trailers, large and abandoned bodies, smuggling attempts,
//! hop-by-hop headers, pooled connections left out of step, and timeouts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::raw::*;
use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;

// ---------------------------------------------------------------------------------------------
// 1. Interim responses.

#[tokio::test]
async fn interim_responses_before_the_final_one_keep_the_stream_framed() {
    let up = upstream(|mut c| async move {
        while let Some(head) = c.head().await {
            match target(&head) {
                "/hints" => {
                    // 103 and an unsolicited 100, in one write with the final answer.
                    c.send(
                        b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n\
                          HTTP/1.1 100 Continue\r\n\r\n\
                          HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfinal",
                    )
                    .await;
                }
                "/split" => {
                    c.send(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n")
                        .await;
                    c.send(b"HTTP/1.1 100 Continue\r\n\r\n").await;
                    c.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                        .await;
                    c.send(b"5\r\nsplit\r\n0\r\n\r\n").await;
                }
                _ => {
                    c.send(ok("next")).await;
                }
            }
        }
    })
    .await;
    let (s, addr) = proxy(&up, "2s").await;
    let mut c = Client::connect(addr).await;
    for (path, body) in [("/hints", "final"), ("/split", "split"), ("/n", "next")] {
        let r = c.get(path).await;
        assert_eq!((r.status, r.body().as_str()), (200, body), "{r:?}");
        assert!(r.header("x-ratelimit-limit").is_some(), "{r:?}");
        assert!(
            r.interim.iter().all(|s| [100, 103].contains(s)),
            "only the upstream's 1xx: {r:?}"
        );
    }
    // Pipelined: the interim answers do not shift the next request's answer.
    c.send("GET /hints HTTP/1.1\r\nHost: a\r\n\r\nGET /n HTTP/1.1\r\nHost: a\r\n\r\n")
        .await;
    assert_eq!(c.response().await.body(), "final");
    assert_eq!(c.response().await.body(), "next");
    drop(c);
    s.stop().await;
}

// 2, 3. Responses without a body whatever their headers say.

#[tokio::test]
async fn a_head_answer_with_a_length_is_not_waited_on() {
    let up = upstream(|c| {
        serve(c, |_, head, _| {
            if head.starts_with("HEAD /chunked") {
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec()
            } else if head.starts_with("HEAD ") {
                b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nContent-Type: text/plain\r\n\r\n"
                    .to_vec()
            } else {
                ok("after")
            }
        })
    })
    .await;
    let (s, addr) = proxy(&up, "2s").await;
    let mut c = Client::connect(addr).await;
    for path in ["/len", "/chunked"] {
        c.send(format!("HEAD {path} HTTP/1.1\r\nHost: a\r\n\r\n"))
            .await;
        let r = c.try_response(true).await.unwrap();
        assert_eq!(r.status, 200, "{r:?}");
        if path == "/len" {
            assert_eq!(r.header("content-length"), Some("1000"), "{r:?}");
        }
        let next = c.get("/after").await;
        assert_eq!((next.status, next.body().as_str()), (200, "after"));
    }
    drop(c);
    s.stop().await;
}

#[tokio::test]
async fn no_content_and_not_modified_have_no_body() {
    let up = upstream(|c| {
        serve(c, |_, head, _| match target(head) {
            "/204" => b"HTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n".to_vec(),
            "/304" => b"HTTP/1.1 304 Not Modified\r\nContent-Length: 1234\r\nETag: \"v1\"\r\n\r\n"
                .to_vec(),
            _ => ok("after"),
        })
    })
    .await;
    let (s, addr) = proxy(&up, "2s").await;
    let mut c = Client::connect(addr).await;
    let r = c.get("/204").await;
    assert_eq!(r.status, 204, "{r:?}");
    assert!(
        r.header("transfer-encoding").is_none() && r.header("content-length").is_none(),
        "a 204 carries no framing headers: {r:?}"
    );
    let r = c.get("/304").await;
    assert_eq!(r.status, 304, "{r:?}");
    assert_eq!(r.header("etag"), Some("\"v1\""), "{r:?}");
    assert!(r.header("transfer-encoding").is_none(), "{r:?}");
    assert_eq!(c.get("/x").await.body(), "after");
    // The same, pipelined.
    c.send(
        "GET /204 HTTP/1.1\r\nHost: a\r\n\r\nGET /304 HTTP/1.1\r\nHost: a\r\n\r\nGET /x HTTP/1.1\r\nHost: a\r\n\r\n",
    )
    .await;
    assert_eq!(c.response().await.status, 204);
    assert_eq!(c.response().await.status, 304);
    assert_eq!(c.response().await.body(), "after");
    drop(c);
    s.stop().await;
}

// 4. Conflicting framing in a response.

/// Answers `/both` with Content-Length and chunked together (the chunked body is the real
/// one), everything else with which connection it came on.
async fn both_framings_upstream() -> Up {
    upstream(|c| {
        serve(c, |n, head, _| match target(head) {
            "/both" => b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
                .to_vec(),
            _ => ok(&format!("conn{n}")),
        })
    })
    .await
}

#[tokio::test]
async fn a_response_with_length_and_chunked_is_read_as_chunked() {
    let up = both_framings_upstream().await;
    let (s, addr) = proxy(&up, "2s").await;
    let mut c = Client::connect(addr).await;
    c.send("GET /both HTTP/1.1\r\nHost: a\r\n\r\n").await;
    let r = c.try_response(false).await.unwrap();
    assert!(
        r.status == 502 || (r.status == 200 && r.body() == "hello"),
        "chunked wins, or the answer is refused: {r:?}"
    );
    if r.header("connection") != Some("close") {
        // The next answer is this request's own, not a leftover of the last one.
        let next = c.get("/next").await;
        assert!(next.body().starts_with("conn"), "{next:?}");
    }
    drop(c);
    s.stop().await;
}

#[tokio::test]
async fn a_response_with_length_and_chunked_loses_its_length_on_the_way() {
    let up = both_framings_upstream().await;
    let (s, addr) = proxy(&up, "2s").await;
    let mut c = Client::connect(addr).await;
    c.send("GET /both HTTP/1.1\r\nHost: a\r\n\r\n").await;
    let r = c.try_response(false).await.unwrap();
    if r.status == 200 {
        assert!(
            r.header("content-length").is_none(),
            "a client that believes the length reads 3 bytes and then junk: {r:?}"
        );
    }
    drop(c);
    s.stop().await;
}

// 5. Chunk extensions and trailers, both ways: the chunking is written again by the relay
// (extensions dropped), response trailers are checked and passed on, request trailers are
// checked and dropped (an upstream that merged them into the headers would act on fields the
// rate limiter never saw).

const CHUNKED_WITH_TRAILERS: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n\
4;name=\"quoted;value\"\r\nwiki\r\n5 ; ext\r\npedia\r\n0;last\r\nX-Checksum: abc\r\nX-Other: 2\r\n\r\n";

#[tokio::test]
async fn chunked_responses_keep_their_trailers_and_lose_their_extensions() {
    let up = upstream(|mut c| async move {
        while let Some(head) = c.head().await {
            match target(&head) {
                "/whole" => {
                    c.send(CHUNKED_WITH_TRAILERS).await;
                }
                "/bytewise" => {
                    // One byte a write: every boundary of the chunk scanner gets crossed.
                    for b in CHUNKED_WITH_TRAILERS {
                        c.send([*b]).await;
                        tokio::task::yield_now().await;
                    }
                }
                _ => {
                    c.send(ok("next")).await;
                }
            }
        }
    })
    .await;
    let (s, addr) = proxy(&up, "2s").await;
    let mut c = Client::connect(addr).await;
    for path in ["/whole", "/bytewise"] {
        let r = c.get(path).await;
        assert_eq!((r.status, r.body().as_str()), (200, "wikipedia"), "{r:?}");
        assert!(r.trailers.contains("x-checksum: abc"), "{r:?}");
        assert!(r.trailers.contains("x-other: 2"), "{r:?}");
        assert!(r.header("x-ratelimit-limit").is_some(), "{r:?}");
        assert_eq!(c.get("/n").await.body(), "next");
    }
    drop(c);
    s.stop().await;
}

#[tokio::test]
async fn chunked_requests_are_chunked_again_without_extensions_or_trailers() {
    let raw: &[u8] = b"3;x=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: t\r\n\r\n";
    let up = upstream(|mut c| async move {
        while let Some(head) = c.head().await {
            let Some((data, trailers, raw)) = c.body(&head).await else {
                return;
            };
            let text = format!("{}|{}|{}", lossy(&data), trailers.trim(), lossy(&raw));
            c.send(ok(&text)).await;
        }
    })
    .await;
    let (s, addr) = proxy(&up, "2s").await;
    let mut c = Client::connect(addr).await;
    let mut req = b"POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    req.extend_from_slice(raw);
    req.extend_from_slice(b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n");
    c.send(&req).await;
    let r = c.response().await;
    assert_eq!(r.status, 200, "{r:?}");
    let body = r.body();
    let (data, rest) = body.split_once('|').unwrap_or_default();
    let (trailers, raw_up) = rest.split_once('|').unwrap_or_default();
    assert_eq!((data, trailers), ("abcde", ""), "{body}");
    assert!(
        raw_up.ends_with("\r\n0\r\n\r\n") && !raw_up.contains(';') && !raw_up.contains("X-"),
        "written again: {raw_up:?}"
    );
    let next = c.response().await;
    assert_eq!((next.status, next.body().as_str()), (200, "||"), "{next:?}");
    drop(c);
    s.stop().await;
}

// 6. Large bodies, and an upstream that refuses one without reading it.

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

fn checksum(b: &[u8]) -> u64 {
    b.iter().enumerate().fold(0u64, |a, (i, x)| {
        a.wrapping_mul(31).wrapping_add(*x as u64 ^ i as u64)
    })
}

#[tokio::test]
async fn multi_megabyte_request_bodies_arrive_whole() {
    let up = upstream(|c| {
        serve(c, |_, _, body| {
            ok(&format!("{} {}", body.len(), checksum(body)))
        })
    })
    .await;
    let (s, addr) = proxy(&up, "5s").await;
    let mut c = Client::connect(addr).await;
    let body = pattern(4 * 1024 * 1024 + 7);
    let want = format!("{} {}", body.len(), checksum(&body));

    // By length, written while the answer is read.
    let mut w = c.w.take().unwrap();
    let sent = body.clone();
    let writer = tokio::spawn(async move {
        w.write_all(
            format!(
                "POST /len HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n",
                sent.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        w.write_all(&sent).await.unwrap();
        w
    });
    let r = c.response().await;
    assert_eq!((r.status, r.body()), (200, want.clone()));
    c.w = Some(writer.await.unwrap());

    // Chunked, in 64 KiB chunks with an odd last one.
    let mut w = c.w.take().unwrap();
    let sent = body.clone();
    let writer = tokio::spawn(async move {
        w.write_all(b"POST /chunked HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
            .await
            .unwrap();
        for chunk in sent.chunks(64 * 1024) {
            w.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                .await
                .unwrap();
            w.write_all(chunk).await.unwrap();
            w.write_all(b"\r\n").await.unwrap();
        }
        w.write_all(b"0\r\n\r\n").await.unwrap();
        w
    });
    let r = c.response().await;
    assert_eq!((r.status, r.body()), (200, want));
    c.w = Some(writer.await.unwrap());
    drop(c);
    s.stop().await;
}

#[tokio::test]
async fn an_early_413_reaches_the_client_and_the_connection_closes() {
    let up = upstream(|mut c| async move {
        let Some(head) = c.head().await else { return };
        if target(&head) == "/upload" {
            // Refused at once; the body is never read (and the socket stays open).
            c.send(b"HTTP/1.1 413 Content Too Large\r\nContent-Length: 8\r\n\r\ntoo big!")
                .await;
            c.hold().await;
        } else {
            c.send(ok("after")).await;
        }
    })
    .await;
    let (s, addr) = proxy(&up, "5s").await;
    let mut c = Client::connect(addr).await;
    let mut w = c.w.take().unwrap();
    let writer = tokio::spawn(async move {
        let body = pattern(8 * 1024 * 1024);
        let head = format!(
            "POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        // The proxy stops reading: these writes may fail.
        if w.write_all(head.as_bytes()).await.is_ok() {
            let _ = w.write_all(&body).await;
        }
    });
    let r = c.response().await;
    assert_eq!((r.status, r.body().as_str()), (413, "too big!"), "{r:?}");
    assert_eq!(
        r.header("connection"),
        Some("close"),
        "the answer says the connection ends: {r:?}"
    );
    // The rest of the body is still on its way: the connection cannot carry another request.
    let rest = c.rest().await;
    assert!(rest.is_empty(), "nothing after the 413: {rest:?}");
    writer.abort();
    // That upstream connection is not reused either.
    let mut fresh = Client::connect(addr).await;
    let r = fresh.get("/after").await;
    assert_eq!((r.status, r.body().as_str()), (200, "after"), "{r:?}");
    drop(fresh);
    s.stop().await;
}

// 7. Pipelining right behind a body.

#[tokio::test]
async fn a_request_pipelined_behind_a_body_is_read_from_the_right_byte() {
    let up = echo_upstream().await;
    let (s, addr) = proxy(&up, "2s").await;
    let mut c = Client::connect(addr).await;
    // The next request arrives in the same packet as the body's end.
    c.send("POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nhello")
        .await;
    c.send("worldGET /b HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(c.response().await.body(), "/a:helloworld");
    assert_eq!(c.response().await.body(), "/b:");
    // A chunked body cut before its last CRLF, the rest arriving with the next request.
    c.send("POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n")
        .await;
    c.send("\r\nPOST /d HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nyoGET /e HTTP/1.1\r\nHost: a\r\n\r\n")
        .await;
    assert_eq!(c.response().await.body(), "/c:hi");
    assert_eq!(c.response().await.body(), "/d:yo");
    assert_eq!(c.response().await.body(), "/e:");
    drop(c);
    s.stop().await;
}

// 8. An upstream that dies mid-body.

#[tokio::test]
async fn an_upstream_closing_mid_body_closes_the_client_connection() {
    let up = upstream(|mut c| async move {
        while let Some(head) = c.head().await {
            match target(&head) {
                "/cut" => {
                    c.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part")
                        .await;
                    return;
                }
                "/cut-chunked" => {
                    c.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n10\r\nabc")
                        .await;
                    return;
                }
                _ => {
                    c.send(ok("fresh")).await;
                }
            }
        }
    })
    .await;
    let (s, addr) = proxy(&up, "2s").await;
    for path in ["/cut", "/cut-chunked"] {
        let mut c = Client::connect(addr).await;
        // With a request pipelined behind: it must not be answered on this connection.
        c.send(format!(
            "GET {path} HTTP/1.1\r\nHost: a\r\n\r\nGET /p HTTP/1.1\r\nHost: a\r\n\r\n"
        ))
        .await;
        let r = c.try_response(false).await;
        assert!(r.is_err(), "a truncated body must not look whole: {r:?}");
        // The pipelined request was never answered here.
        let rest = c.rest().await;
        assert!(!rest.contains("HTTP/1.1"), "{path}: {rest:?}");
        let mut fresh = Client::connect(addr).await;
        let r = fresh.get("/after").await;
        assert_eq!((r.status, r.body().as_str()), (200, "fresh"), "{r:?}");
    }
    s.stop().await;
}

// 9. Connection: close from either side.

/// The upstream's first connection answers once with `answer`, which ends that connection's
/// use, and then lingers without reading; the next request through the same client connection
/// must go out on a second upstream connection (and the client connection must go on).
async fn the_first_upstream_connection_is_not_reused_after(answer: &'static [u8]) {
    let up = upstream(move |mut c| async move {
        if c.n == 0 {
            if c.head().await.is_some() {
                c.send(answer).await;
            }
            c.hold().await;
        } else {
            serve(c, |n, _, _| ok(&format!("conn{n}"))).await;
        }
    })
    .await;
    let (s, addr) = proxy(&up, "1s").await;
    let mut c = Client::connect(addr).await;
    let r = c.get("/1").await;
    assert_eq!((r.status, r.body().as_str()), (200, "ok"), "{r:?}");
    let r = c.get("/2").await;
    assert_eq!((r.status, r.body().as_str()), (200, "conn1"), "{r:?}");
    drop(c);
    s.stop().await;
}

#[tokio::test]
async fn an_upstream_connection_close_is_honoured_even_if_the_socket_stays_open() {
    // Said close, but lingers: the close is for its hop, the client connection goes on.
    the_first_upstream_connection_is_not_reused_after(
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
    )
    .await;
}

#[tokio::test]
async fn a_client_connection_close_ends_the_connection_after_its_answer() {
    let up = echo_upstream().await;
    let (s, addr) = proxy(&up, "2s").await;
    let mut c = Client::connect(addr).await;
    c.send(
        "GET /a HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\nGET /b HTTP/1.1\r\nHost: a\r\n\r\n",
    )
    .await;
    let r = c.response().await;
    assert_eq!((r.status, r.body().as_str()), (200, "/a:"), "{r:?}");
    assert_eq!(r.header("connection"), Some("close"), "{r:?}");
    let rest = c.rest().await;
    assert!(rest.is_empty(), "nothing answered after close: {rest:?}");
    assert!(
        up.heads().iter().all(|(_, h)| target(h) != "/b"),
        "{:?}",
        up.heads()
    );
    s.stop().await;
}

// 10. Request smuggling.

const POST: &str = "POST /s HTTP/1.1\r\nHost: a\r\n";
const SMUGGLED: &str = "GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n";

/// Sends `req` on a new connection: the statuses answered until the proxy closes the
/// connection, and whether it did (within 10 s).
async fn attempt(addr: SocketAddr, req: &str) -> (Vec<u16>, bool, String) {
    let mut c = Client::connect(addr).await;
    c.send(req).await;
    let (text, closed) = c.rest_within(T).await;
    let statuses = text
        .match_indices("HTTP/1.1 ")
        .filter_map(|(i, _)| text.get(i + 9..i + 12)?.parse().ok())
        .collect();
    (statuses, closed, text)
}

#[tokio::test]
async fn ambiguous_request_framing_gets_400_and_nothing_reaches_the_upstream() {
    let up = echo_upstream().await;
    let (s, addr) = proxy(&up, "2s").await;
    let cases = [
        (
            "two lengths",
            format!("{POST}Content-Length: 3\r\nContent-Length: 41\r\n\r\nabc{SMUGGLED}"),
        ),
        (
            "a length list",
            format!("{POST}Content-Length: 3, 41\r\n\r\nabc{SMUGGLED}"),
        ),
        (
            "a signed length",
            format!("{POST}Content-Length: +3\r\n\r\nabc{SMUGGLED}"),
        ),
        (
            "chunked, identity",
            format!("{POST}Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n{SMUGGLED}"),
        ),
        (
            "identity",
            format!("{POST}Transfer-Encoding: identity\r\nContent-Length: 3\r\n\r\nabc{SMUGGLED}"),
        ),
        (
            "an unknown coding",
            format!("{POST}Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n{SMUGGLED}"),
        ),
        (
            "space before the colon",
            format!("{POST}Content-Length : 3\r\n\r\nabc{SMUGGLED}"),
        ),
        (
            "space before the colon, chunked",
            format!(
                "{POST}Transfer-Encoding : chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n{SMUGGLED}"
            ),
        ),
        (
            "a folded Transfer-Encoding",
            format!(
                "{POST}Transfer-Encoding:\r\n chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n{SMUGGLED}"
            ),
        ),
    ];
    for (name, req) in cases {
        let (statuses, closed, text) = attempt(addr, &req).await;
        assert_eq!((statuses, closed), (vec![400], true), "{name}: {text}");
    }
    let heads = up.heads();
    assert!(heads.is_empty(), "nothing reaches the upstream: {heads:?}");
    s.stop().await;
}

#[tokio::test]
async fn length_and_chunked_together_are_refused_or_read_as_chunked_and_closed() {
    let up = echo_upstream().await;
    let (s, addr) = proxy(&up, "2s").await;
    for (name, req) in [
        (
            "length then chunked",
            format!(
                "{POST}Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{SMUGGLED}"
            ),
        ),
        (
            "chunked then length",
            format!(
                "{POST}Transfer-Encoding: chunked\r\nContent-Length: 40\r\n\r\n0\r\n\r\n{SMUGGLED}"
            ),
        ),
    ] {
        // RFC 9112 §6.1: reject, or process by Transfer-Encoding alone; either way close.
        let (statuses, closed, text) = attempt(addr, &req).await;
        assert!(
            (statuses == [400] || statuses == [200]) && closed,
            "{name}: {text}"
        );
        for (_, head) in up.heads() {
            assert_eq!(target(&head), "/s", "{name}: {head}");
            assert!(
                header_values(&head, "content-length").is_empty()
                    && header_values(&head, "transfer-encoding") == ["chunked"],
                "{name}: one framing upstream: {head}"
            );
        }
        up.seen.send_modify(Vec::clear);
    }
    s.stop().await;
}

#[tokio::test]
async fn chunked_applied_twice_gets_400() {
    let up = echo_upstream().await;
    let (s, addr) = proxy(&up, "2s").await;
    let req = format!(
        "{POST}Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{SMUGGLED}"
    );
    let (statuses, closed, text) = attempt(addr, &req).await;
    assert_eq!((statuses, closed), (vec![400], true), "{text}");
    assert!(up.heads().is_empty(), "{:?}", up.heads());
    s.stop().await;
}

// 11. Headers the hop owns.

#[tokio::test]
async fn hop_by_hop_headers_stay_on_their_hop_and_forwarded_for_grows() {
    let up = upstream(|c| {
        serve(c, |_, _, _| {
            b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Resp-Hop\r\nX-Resp-Hop: 1\r\nKeep-Alive: timeout=5\r\nX-Resp-End: 1\r\nContent-Length: 2\r\n\r\nok"
                .to_vec()
        })
    })
    .await;
    let (s, addr) = proxy(&up, "2s").await;
    let mut c = Client::connect(addr).await;
    c.send(
        "GET /h HTTP/1.1\r\nHost: api.example\r\nConnection: keep-alive, X-Secret\r\nConnection: x-other\r\n\
         X-Secret: 1\r\nX-Other: 2\r\nKeep-Alive: 5\r\nProxy-Connection: keep-alive\r\nTE: trailers\r\n\
         Upgrade-Insecure-Requests: 1\r\nX-Forwarded-For: 192.0.2.1\r\nX-Forwarded-For: 198.51.100.2\r\nX-Keep: 3\r\n\r\n",
    )
    .await;
    let r = c.response().await;
    assert_eq!((r.status, r.body().as_str()), (200, "ok"), "{r:?}");
    assert!(r.header("x-resp-hop").is_none(), "{r:?}");
    assert!(r.header("keep-alive").is_none(), "{r:?}");
    assert_eq!(r.header("x-resp-end"), Some("1"), "{r:?}");
    let heads = up.heads();
    let head = &heads[0].1;
    for gone in [
        "connection",
        "x-secret",
        "x-other",
        "keep-alive",
        "proxy-connection",
        "te",
    ] {
        assert!(header_values(head, gone).is_empty(), "{gone}: {head}");
    }
    assert_eq!(header_values(head, "x-keep"), ["3"], "{head}");
    assert_eq!(header_values(head, "host"), ["api.example"], "{head}");
    assert_eq!(
        header_values(head, "upgrade-insecure-requests"),
        ["1"],
        "{head}"
    );
    assert_eq!(
        header_values(head, "x-forwarded-for"),
        ["192.0.2.1, 198.51.100.2, 127.0.0.1"],
        "{head}"
    );
    drop(c);
    // The hyper path (HTTP/1.0) joins the hops the same way.
    let mut c = Client::connect(addr).await;
    c.send(
        "GET /h HTTP/1.0\r\nHost: api.example\r\nX-Forwarded-For: 192.0.2.1\r\nX-Forwarded-For: 198.51.100.2\r\n\r\n",
    )
    .await;
    let r = c.response().await;
    assert_eq!(r.status, 200, "{r:?}");
    let heads = up.heads();
    let head = &heads[heads.len() - 1].1;
    assert_eq!(
        header_values(head, "x-forwarded-for"),
        ["192.0.2.1, 198.51.100.2, 127.0.0.1"],
        "{head}"
    );
    s.stop().await;
}

// 12. Upstream bytes past the end of an answer.

#[tokio::test]
async fn bytes_past_an_answer_keep_that_connection_out_of_the_pool() {
    let wrote_stale = Arc::new(Notify::new());
    let notify = Arc::clone(&wrote_stale);
    let stale = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nWRONG";
    let up = upstream(move |mut c| {
        let notify = Arc::clone(&notify);
        async move {
            while let Some(head) = c.head().await {
                let first = ok("first");
                match target(&head) {
                    "/same-write" => {
                        c.send([first.as_slice(), stale.as_bytes()].concat()).await;
                    }
                    "/later" => {
                        c.send(&first).await;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        c.send(stale).await;
                        notify.notify_one();
                    }
                    "/head-body" => {
                        // A HEAD answered with a body anyway.
                        c.send(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nWRONG")
                            .await;
                    }
                    "/no-content-body" => {
                        c.send(b"HTTP/1.1 204 No Content\r\n\r\nWRONG").await;
                    }
                    _ => {
                        c.send(ok(&format!("own{}", c.n))).await;
                    }
                }
            }
        }
    })
    .await;
    let (s, addr) = proxy(&up, "1s").await;
    let mut c = Client::connect(addr).await;

    assert_eq!(c.get("/same-write").await.body(), "first");
    let r = c.get("/next").await;
    assert!(r.body().starts_with("own"), "{r:?}");

    assert_eq!(c.get("/later").await.body(), "first");
    tokio::time::timeout(T, wrote_stale.notified())
        .await
        .unwrap();
    let r = c.get("/next").await;
    assert!(r.body().starts_with("own"), "{r:?}");

    c.send("HEAD /head-body HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(c.try_response(true).await.unwrap().status, 200);
    let r = c.get("/next").await;
    assert!(r.body().starts_with("own"), "{r:?}");

    assert_eq!(c.get("/no-content-body").await.status, 204);
    let r = c.get("/next").await;
    assert!(r.body().starts_with("own"), "{r:?}");
    drop(c);
    s.stop().await;
}

// 13. Timeouts.

#[tokio::test]
async fn an_upstream_slower_than_the_timeout_gets_504_and_the_connection_goes_on() {
    let up = upstream(|mut c| async move {
        while let Some(head) = c.head().await {
            if target(&head) == "/never" {
                c.hold().await;
                return;
            }
            c.send(ok("after")).await;
        }
    })
    .await;
    let (s, addr) = proxy(&up, "500ms").await;
    let mut c = Client::connect(addr).await;
    let r = c.get("/never").await;
    assert_eq!(r.status, 504, "{r:?}");
    assert_eq!(
        r.header("content-type"),
        Some("application/problem+json"),
        "{r:?}"
    );
    assert!(r.body().contains("\"status\":504"), "{r:?}");
    // A body-less request: the client connection can carry the next one.
    let r = c.get("/after").await;
    assert_eq!((r.status, r.body().as_str()), (200, "after"), "{r:?}");
    drop(c);
    s.stop().await;
}

#[tokio::test]
async fn an_upstream_stalling_mid_body_is_cut_off() {
    let up = upstream(|mut c| async move {
        if c.head().await.is_some() {
            c.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart")
                .await;
        }
        c.hold().await;
    })
    .await;
    let (_s, addr) = proxy(&up, "500ms").await;
    // The relay, and the hyper path (which takes HTTP/1.0).
    for request in [
        "GET /stall HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET /stall HTTP/1.0\r\nHost: a\r\n\r\n",
    ] {
        let mut c = Client::connect(addr).await;
        c.send(request).await;
        // The proxy gives up on the upstream (as nginx does after proxy_read_timeout) and
        // closes.
        let r = c.try_response(false).await;
        assert!(r.is_err(), "{request:?}: {r:?}");
    }
}

// 14. Clients that leave mid-exchange.

#[tokio::test]
async fn a_client_leaving_mid_upload_or_mid_download_leaves_the_pool_clean() {
    let up = upstream(|mut c| async move {
        while let Some(head) = c.head().await {
            match target(&head) {
                "/big" => {
                    let body = pattern(8 * 1024 * 1024);
                    let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
                    if !c.send(head).await || !c.send(&body).await {
                        return;
                    }
                }
                _ => {
                    // An upload the client abandons ends here: the proxy closed.
                    if c.body(&head).await.is_none() {
                        return;
                    }
                    c.send(ok(&format!("{}:{}", target(&head), c.n))).await;
                }
            }
        }
    })
    .await;
    let (s, addr) = proxy(&up, "2s").await;
    // Warm the pool with one connection.
    let mut c = Client::connect(addr).await;
    assert!(c.get("/warm").await.body().starts_with("/warm:"));

    // Mid-upload: a head and part of a megabyte, then gone.
    let mut gone = Client::connect(addr).await;
    gone.send("POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000\r\n\r\n")
        .await;
    gone.send(pattern(10_000)).await;
    up.wait_heads(2).await;
    drop(gone);
    for i in 0..3 {
        let r = c.get(&format!("/after-upload-{i}")).await;
        assert_eq!(r.status, 200, "{r:?}");
        assert!(r.body().starts_with("/after-upload"), "{r:?}");
    }

    // Mid-download: the head and a little of 8 MiB, then gone.
    let mut gone = Client::connect(addr).await;
    gone.send("GET /big HTTP/1.1\r\nHost: a\r\n\r\n").await;
    gone.wire.until(b"\r\n\r\n").await.unwrap();
    drop(gone);
    for i in 0..3 {
        let r = c.get(&format!("/after-download-{i}")).await;
        assert_eq!(r.status, 200, "{r:?}");
        assert!(r.body().starts_with("/after-download"), "{r:?}");
    }
    drop(c);
    s.stop().await;
}

// 15. The rest.

#[tokio::test]
async fn a_reused_connection_closed_on_receipt_is_retried_with_the_whole_request() {
    // The first request on each connection is answered (keep-alive); a second one on the
    // same connection is read and then the connection is closed unanswered (an upstream
    // whose keep-alive timeout fires just as the request arrives).
    let up = upstream(|mut c| async move {
        if c.head().await.is_none() {
            return;
        }
        c.send(ok(&format!("conn{}", c.n))).await;
        let _ = c.head().await;
    })
    .await;
    let (s, addr) = proxy(&up, "1s").await;
    let mut c = Client::connect(addr).await;
    assert_eq!(c.get("/1").await.body(), "conn0");
    // A GET may be sent again: the proxy retries it on a fresh connection.
    let r = c.get("/2").await;
    assert_eq!((r.status, r.body().as_str()), (200, "conn1"), "{r:?}");
    let heads = up.heads();
    assert_eq!(heads.len(), 3, "{heads:?}");
    assert_eq!(
        target(&heads[2].1),
        "/2",
        "the retry is the whole request: {heads:?}"
    );
    drop(c);
    s.stop().await;
}

#[tokio::test]
async fn an_http10_answer_without_keep_alive_is_not_pooled() {
    // An HTTP/1.0 exchange is over once answered.
    the_first_upstream_connection_is_not_reused_after(
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
    )
    .await;
}

#[tokio::test]
async fn an_answer_with_many_headers_is_relayed() {
    let up = upstream(|c| {
        serve(c, |_, _, _| {
            let mut r = String::from("HTTP/1.1 200 OK\r\n");
            for i in 0..80 {
                r.push_str(&format!("Set-Cookie: c{i}=v\r\n"));
            }
            r.push_str("Content-Length: 2\r\n\r\nok");
            r.into_bytes()
        })
    })
    .await;
    let (s, addr) = proxy(&up, "2s").await;
    let mut c = Client::connect(addr).await;
    let r = c.get("/many").await;
    assert_eq!((r.status, r.body().as_str()), (200, "ok"), "{r:?}");
    assert_eq!(header_values(&r.head, "set-cookie").len(), 80, "{r:?}");
    drop(c);
    s.stop().await;
}

#[tokio::test]
async fn a_transfer_coding_other_than_chunked_is_not_silently_dropped() {
    let up = upstream(|mut c| async move {
        if c.head().await.is_some() {
            c.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n\x1f\x8b\x08\x00gz")
                .await;
        }
    })
    .await;
    let (s, addr) = proxy(&up, "2s").await;
    let mut c = Client::connect(addr).await;
    c.send("GET /gz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await;
    let r = c.response().await;
    // Refused (nginx: "upstream sent unknown Transfer-Encoding"), or relayed with its coding.
    assert!(
        r.status == 502
            || header_values(&r.head, "transfer-encoding")
                .join(",")
                .contains("gzip"),
        "{r:?}"
    );
    drop(c);
    s.stop().await;
}

#[tokio::test]
async fn a_malformed_chunked_request_body_closes_the_connection_and_not_the_pool() {
    let up = echo_upstream().await;
    let (s, addr) = proxy(&up, "2s").await;
    let mut c = Client::connect(addr).await;
    assert_eq!(c.get("/warm").await.body(), "/warm:");
    for bad in [
        "zz\r\nab\r\n0\r\n\r\n",
        "2\r\nabc\r\n0\r\n\r\n",
        "ffffffffffffffffff\r\n",
    ] {
        let mut b = Client::connect(addr).await;
        b.send(format!(
            "POST /bad HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n{bad}GET /p HTTP/1.1\r\nHost: a\r\n\r\n"
        ))
        .await;
        let text = b.rest().await;
        assert!(
            !text.contains("HTTP/1.1 2"),
            "{bad:?}: not answered as a success: {text}"
        );
        let r = c.get("/next").await;
        assert_eq!((r.status, r.body().as_str()), (200, "/next:"), "{r:?}");
    }
    drop(c);
    s.stop().await;
}

#[tokio::test]
async fn a_bare_lf_in_chunked_trailers_cannot_smuggle_a_request() {
    // An upstream that takes a bare LF as a line end (RFC 9112 §2.2 allows it; Go's net/http
    // does): it answers at every empty line, and keeps every byte it got.
    let raw = Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = Arc::clone(&raw);
    let up = upstream(move |mut c| {
        let kept = Arc::clone(&kept);
        async move {
            if c.head().await.is_none() {
                return;
            }
            let mut got = std::mem::take(&mut c.wire.buf);
            loop {
                if got.ends_with(b"\r\n\r\n") || got.ends_with(b"0\r\n\n") {
                    kept.lock().unwrap().extend_from_slice(&got);
                    got.clear();
                    if !c.send(ok("a")).await {
                        return;
                    }
                }
                if !c.wire.fill().await {
                    return;
                }
                got.append(&mut c.wire.buf);
            }
        }
    })
    .await;
    let (s, addr) = proxy(&up, "1s").await;
    let smuggled = "GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n";
    for trailers in ["\n", "X-T: 1\n\n"] {
        let mut c = Client::connect(addr).await;
        c.send(format!(
            "POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n{trailers}{smuggled}"
        ))
        .await;
        // The upstream answers once it has read the body's end: by the time the client has
        // the answer, whatever was sent along with that body is in `raw`.
        let text = format!("{:?}", c.try_response(false).await);
        let got = lossy(&raw.lock().unwrap());
        // Refused, or ended where the upstream ends it, with /smuggled then relayed (and
        // rate limited) as a request of its own, with the proxy's own head.
        assert!(
            !got.contains(smuggled),
            "{trailers:?}: the upstream got a request the proxy never parsed: {got:?}; client: {text:?}"
        );
    }
    s.stop().await;
}

// 16. Request bodies that come too slowly: the client's doing (408), not the upstream's (504).

/// An upstream that reads a request head (and, for `/read`, its body) and never answers.
async fn silent_upstream() -> Up {
    upstream(|mut c| async move {
        let Some(head) = c.head().await else { return };
        if target(&head) == "/read" {
            let _ = c.body(&head).await;
        }
        c.hold().await;
    })
    .await
}

/// The proxy in front of `up` with `[proxy] timeout` of `timeout` and a `header_read_timeout`
/// of `stall` (the longest a request body may go without a byte). Its one policy counts only
/// the requests answered 408 (`count_status`).
async fn proxy_with_stall(
    up: &Up,
    timeout: &str,
    stall: Duration,
) -> (common::Running, SocketAddr) {
    let text = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{}\"\ntimeout = \"{timeout}\"\n\n\
         [[policy]]\nname = \"all\"\nalgorithm = \"fixed_window\"\nlimit = 1000\nwindow = \"1h\"\n\
         key = [\"ip\"]\ncount_status = [\"408\"]\n",
        up.addr
    );
    let config = tollgate_server::Config::parse("t.toml", &common::with_ports(&text)).unwrap();
    let limits = tollgate_server::Limits {
        header_read_timeout: stall,
        ..config.limits
    };
    let s = common::start_with_limits(config, limits).await;
    let addr = s.proxy.unwrap();
    (s, addr)
}

/// Waits (bounded) until the client's count under the policy of [`proxy_with_stall`] has
/// `want` left: the true-up lands as the exchange ends, and a peek may come first.
async fn left_settles_at(s: &common::Running, want: u64) {
    let mut seen = None;
    for _ in 0..200 {
        let r = common::post_json(
            &s.url("/v1/check"),
            r#"{"policy":"all","key":"ip:127.0.0.1","cost":0}"#,
        )
        .await;
        seen = r.json()["remaining"].as_u64();
        if seen == Some(want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{seen:?} left, not {want}");
}

#[tokio::test]
async fn a_request_body_slower_than_its_bounds_gets_408_and_the_connection_closes() {
    let up = silent_upstream().await;
    let (s, addr) = proxy_with_stall(&up, "1500ms", Duration::from_millis(500)).await;
    let stalled_length = "POST /hold HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\nabc";
    let stalled_chunked =
        "POST /hold HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab";
    // A body that stops (no byte for header_read_timeout), by length and chunked; then one
    // that keeps coming, a byte at a time, but is not whole within the proxy timeout.
    for case in [stalled_length, stalled_chunked, "trickle"] {
        let mut c = Client::connect(addr).await;
        let writer = if case == "trickle" {
            let mut w = c.w.take().unwrap();
            tokio::spawn(async move {
                let head = "POST /hold HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n";
                if w.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                for _ in 0..1000 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    if w.write_all(b"x").await.is_err() {
                        return;
                    }
                }
            })
        } else {
            c.send(case).await;
            tokio::spawn(async {})
        };
        let r = c.response().await;
        assert_eq!(
            r.status, 408,
            "{case:?}: the client's slowness, not the upstream's: {r:?}"
        );
        assert_eq!(r.header("connection"), Some("close"), "{case:?}: {r:?}");
        assert_eq!(
            r.header("content-type"),
            Some("application/problem+json"),
            "{case:?}: {r:?}"
        );
        assert!(r.body().contains("\"status\":408"), "{case:?}: {r:?}");
        assert!(r.body().contains("request body"), "{case:?}: {r:?}");
        assert!(r.header("x-ratelimit-limit").is_some(), "{case:?}: {r:?}");
        // The rest of the body may still come: nothing more is read as a request.
        let rest = c.rest().await;
        assert!(rest.is_empty(), "{case:?}: nothing after the 408: {rest:?}");
        writer.abort();
    }
    // Each 408 counts as the status the client got.
    left_settles_at(&s, 997).await;
    s.stop().await;
}

#[tokio::test]
async fn an_upstream_that_never_answers_a_whole_request_still_gets_504() {
    let up = silent_upstream().await;
    let (s, addr) = proxy_with_stall(&up, "1500ms", Duration::from_millis(500)).await;
    let at_once = "POST /read HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello";
    // Waiting to be told to continue: its silence is the upstream's doing.
    let expect =
        "POST /hold HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n";
    for case in [at_once, "in pieces", expect, "unread"] {
        let mut c = Client::connect(addr).await;
        let writer = match case {
            // Whole, in pieces closer together than header_read_timeout.
            "in pieces" => {
                let mut w = c.w.take().unwrap();
                tokio::spawn(async move {
                    let head = "POST /read HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n";
                    for piece in [head, "he", "l", "lo"] {
                        if w.write_all(piece.as_bytes()).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    std::future::pending::<()>().await;
                })
            }
            // Larger than the sockets between hold: the upstream never reads it, the body
            // waits on the upstream.
            "unread" => {
                let mut w = c.w.take().unwrap();
                tokio::spawn(async move {
                    let body = pattern(16 * 1024 * 1024);
                    let head = format!(
                        "POST /hold HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n",
                        body.len()
                    );
                    if w.write_all(head.as_bytes()).await.is_ok() {
                        let _ = w.write_all(&body).await;
                    }
                    std::future::pending::<()>().await;
                })
            }
            _ => {
                c.send(case).await;
                tokio::spawn(async {})
            }
        };
        let r = c.response().await;
        assert_eq!(r.status, 504, "{case:?}: {r:?}");
        assert!(r.body().contains("\"status\":504"), "{case:?}: {r:?}");
        assert!(r.header("x-ratelimit-limit").is_some(), "{case:?}: {r:?}");
        writer.abort();
    }
    // A 504 is not a 408: none of them counts.
    left_settles_at(&s, 1000).await;
    s.stop().await;
}
