//! The relay's chunked decoding held to hyper's: whatever chunked body the relay accepts, hyper's
//! HTTP/1.1 server accepts too and reads the same data from the same bytes. The relay may be
//! stricter (it refuses whitespace hyper lets through); it is never more lenient, so no body it
//! forwards can end, for a careful reader, anywhere else than where it ended for the relay.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::{Request, Response};
use proptest::prelude::*;

use super::{BodyCopy, Encoding, Framing, Trailers};

/// Our decoding of `input`: the data and how many bytes the body took, or `None` if refused or
/// incomplete.
fn ours(input: &[u8]) -> Option<(Vec<u8>, usize)> {
    let mut copy = BodyCopy::new(Framing::Chunked, Encoding::Identity, Trailers::Drop);
    let mut out = Vec::new();
    let used = copy.copy(input, &mut out).ok()?;
    copy.done().then_some((out, used))
}

/// hyper's server reading `body` as a chunked request body, from a connection that ends right
/// after it: the data, or `None` if hyper refused it.
fn hypers(body: &[u8]) -> Option<Vec<u8>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    rt.block_on(async {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let mut bytes =
            b"POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        bytes.extend_from_slice(body);
        tokio::io::AsyncWriteExt::write_all(&mut client, &bytes)
            .await
            .ok()?;
        tokio::io::AsyncWriteExt::shutdown(&mut client).await.ok()?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let tx = std::sync::Mutex::new(Some(tx));
        let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
            let tx = tx.lock().ok().and_then(|mut t| t.take());
            async move {
                let data = req.into_body().collect().await.ok().map(|c| c.to_bytes());
                if let Some(tx) = tx {
                    let _ = tx.send(data);
                }
                Ok::<_, Infallible>(Response::new(http_body_util::Empty::<Bytes>::new()))
            }
        });
        // The client has written everything and closed its side: hyper reads on to the end.
        let conn = hyper::server::conn::http1::Builder::new()
            .half_close(true)
            .serve_connection(hyper_util::rt::TokioIo::new(server), service);
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), conn).await;
        rx.await.ok().flatten().map(|b| b.to_vec())
    })
}

/// Pieces of chunked bodies, valid and not: sizes, extensions and line ends from the corners
/// where readers disagree.
fn piece() -> impl Strategy<Value = Vec<u8>> {
    let line_end = prop_oneof![
        20 => Just(&b"\r\n"[..]),
        1 => Just(&b"\n"[..]),
        1 => Just(&b"\r"[..]),
        1 => Just(&b" \r\n"[..]),
    ];
    let extension = prop_oneof![2 => Just(Vec::new()), 1 => proptest::collection::vec(
        prop_oneof![
            Just(b';'),
            Just(b'='),
            Just(b' '),
            Just(b'\t'),
            Just(b'"'),
            Just(b'\\'),
            Just(b'a'),
            Just(b'/'),
            Just(b'x'),
            Just(0xe9u8),
        ],
        1..6,
    )];
    let data = proptest::collection::vec(any::<u8>(), 0..24);
    prop_oneof![
        // A chunk whose size matches its data (or lies by a little).
        8 => (data, extension, line_end.clone(), prop_oneof![6 => Just(0i64), 1 => -1i64..=1], any::<bool>()).prop_map(
            |(data, ext, end, lie, upper)| {
                let size = (data.len() as i64 + lie).max(0);
                let mut p = if upper {
                    format!("{size:X}").into_bytes()
                } else {
                    format!("{size:x}").into_bytes()
                };
                p.extend_from_slice(&ext);
                p.extend_from_slice(end);
                p.extend_from_slice(&data);
                p.extend_from_slice(b"\r\n");
                p
            }
        ),
        // A trailer-like line, in the middle of chunks (never valid there).
        1 => (proptest::collection::vec(any::<u8>(), 0..12), line_end).prop_map(|(mut l, end)| {
            l.extend_from_slice(end);
            l
        }),
    ]
}

fn chunked_body() -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::collection::vec(piece(), 0..5),
        any::<bool>(),
        prop_oneof![
            3 => Just(Vec::new()),
            1 => proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..3),
        ],
    )
        .prop_map(|(pieces, trailer, flips)| {
            let mut body: Vec<u8> = pieces.concat();
            body.extend_from_slice(b"0\r\n");
            if trailer {
                body.extend_from_slice(b"x-t: 1\r\n");
            }
            body.extend_from_slice(b"\r\n");
            for (at, byte) in flips {
                let i = at.index(body.len());
                body[i] = byte;
            }
            body
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 1000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn whatever_the_relay_accepts_hyper_reads_the_same(body in chunked_body()) {
        if let Some((data, used)) = ours(&body) {
            prop_assert_eq!(hypers(&body[..used]), Some(data));
        }
    }
}

#[test]
fn known_disagreements_are_refusals_on_our_side() {
    // hyper lets whitespace after a size through; the relay refuses it (RFC 9112's grammar has
    // whitespace only before an extension's `;`).
    let body = b"5 \r\nhello\r\n0\r\n\r\n";
    assert_eq!(hypers(body), Some(b"hello".to_vec()));
    assert_eq!(ours(body), None);
    // A form feed is not whitespace in a trailer (found by the property above).
    let body = b"0\r\nx-t:\x0c1\r\n\r\n";
    assert_eq!((ours(body), hypers(body)), (None, None));
    let body = b"5;a=1\r\nhello\r\n0\r\nx-t: 1\r\n\r\n";
    assert_eq!(ours(body), Some((b"hello".to_vec(), body.len())));
    assert_eq!(hypers(body), Some(b"hello".to_vec()));
}
