//! The chunked and length framings of the body copy, byte by byte and piece by piece.

use super::*;

/// The whole of `input` through a copy, in pieces of `step` bytes; the output and where the
/// body ended.
fn run(
    input: &[u8],
    step: usize,
    encoding: Encoding,
    trailers: Trailers,
) -> Result<(Vec<u8>, usize), Malformed> {
    let mut copy = BodyCopy::new(Framing::Chunked, encoding, trailers);
    let mut out = Vec::new();
    let mut at = 0;
    while at < input.len() && !copy.done() {
        let end = (at + step).min(input.len());
        let mut piece = &input[at..end];
        while !piece.is_empty() && !copy.done() {
            let n = copy.copy(piece, &mut out)?;
            at += n;
            piece = &piece[n..];
            if n == 0 {
                break;
            }
        }
    }
    if !copy.done() {
        return Err(Malformed);
    }
    Ok((out, at))
}

#[test]
fn chunked_bodies_are_written_again_canonically() {
    let body =
        b"5;ext=1;q=\"a b\"\r\nhello\r\n6 ; e\r\n world\r\n0\r\nX-T:  1 \r\n\r\nGET / HTTP/1.1\r\n";
    for step in [1, 2, 3, 7, body.len()] {
        let (out, end) = run(body, step, Encoding::Chunked, Trailers::Forward)
            .unwrap_or_else(|_| panic!("valid at step {step}"));
        assert_eq!(end, body.len() - b"GET / HTTP/1.1\r\n".len());
        let text = String::from_utf8_lossy(&out).into_owned();
        // Re-chunked by what arrived in each piece: decode it back to compare.
        let (decoded, _) = run(&out, out.len(), Encoding::Identity, Trailers::Drop)
            .unwrap_or_else(|_| panic!("our own output decodes: {text}"));
        assert_eq!(decoded, b"hello world", "{text}");
        assert!(text.ends_with("0\r\nX-T: 1\r\n\r\n"), "{text}");
        assert!(!text.contains("ext"), "{text}");
    }
    let (out, _) = run(
        b"3\r\nabc\r\n0\r\nA: b\r\n\r\n",
        64,
        Encoding::Chunked,
        Trailers::Drop,
    )
    .unwrap_or_default();
    assert_eq!(out, b"3\r\nabc\r\n0\r\n\r\n");
    let (out, _) = run(
        b"3\r\nabc\r\n0\r\n\r\n",
        64,
        Encoding::Identity,
        Trailers::Forward,
    )
    .unwrap_or_default();
    assert_eq!(out, b"abc");
}

#[test]
fn malformed_framing_is_refused() {
    for bad in [
        &b"zz\r\n"[..],
        b"\r\n",
        b"3\r\nabcX\r\n",
        b"ffffffffffffffffff\r\n",
        // A size line read as a request by a lenient parser.
        b"ACE /x HTTP/1.1\r\n",
        // Whitespace that no extension follows.
        b"5 \r\nhello\r\n0\r\n\r\n",
        b"5;\r\nhello\r\n0\r\n\r\n",
        b"5;a=\r\nhello\r\n0\r\n\r\n",
        b"5;a=\"x\r\nhello\r\n0\r\n\r\n",
        // Bare LFs, anywhere.
        b"5\nhello\r\n0\r\n\r\n",
        b"5\r\nhello\n0\r\n\r\n",
        b"0\r\nX: 1\n\r\n",
        b"0\r\n\n",
        // A trailer that is not a field.
        b"0\r\nGET /x HTTP/1.1\r\n\r\n",
        b"0\r\n: v\r\n\r\n",
        b"0\r\nbad name: v\r\n\r\n",
    ] {
        assert_eq!(
            run(bad, bad.len(), Encoding::Chunked, Trailers::Forward).map(|_| ()),
            Err(Malformed),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn lengths_and_close_delimited_bodies() {
    let mut copy = BodyCopy::new(Framing::Length(5), Encoding::Identity, Trailers::Drop);
    let mut out = Vec::new();
    assert_eq!(copy.copy(b"hel", &mut out), Ok(3));
    assert_eq!(copy.copy(b"loGET", &mut out), Ok(2));
    assert!(copy.done());
    assert_eq!(out, b"hello");
    let mut copy = BodyCopy::new(Framing::Close, Encoding::Chunked, Trailers::Forward);
    let mut out = Vec::new();
    assert_eq!(copy.copy(b"abc", &mut out), Ok(3));
    assert!(copy.close(&mut out));
    assert_eq!(out, b"3\r\nabc\r\n0\r\n\r\n");
    let mut cut = BodyCopy::new(Framing::Length(9), Encoding::Identity, Trailers::Drop);
    assert!(!cut.close(&mut Vec::new()));
}
