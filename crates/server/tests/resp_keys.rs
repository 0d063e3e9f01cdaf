//! Keys that are not UTF-8, which only the Redis-protocol door can send, are counted under
//! their digest (`#` and 32 hex digits), as long keys are: `/v1/top` shows them under a name of
//! their own, and an override put on that name reaches them (they were shown as a hex dump
//! that named no key, and could share a row's name with a text key).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;

use common::*;
use hyper::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `TOLLGATE.CHECK api <key>` over a fresh connection: the reply's integers.
async fn check(resp: SocketAddr, key: &[u8]) -> Vec<i64> {
    let mut frame = b"*3\r\n$14\r\nTOLLGATE.CHECK\r\n$3\r\napi\r\n".to_vec();
    frame.extend_from_slice(format!("${}\r\n", key.len()).as_bytes());
    frame.extend_from_slice(key);
    frame.extend_from_slice(b"\r\n");
    let mut c = tokio::net::TcpStream::connect(resp).await.unwrap();
    c.write_all(&frame).await.unwrap();
    let mut reply = Vec::new();
    let mut buf = [0u8; 256];
    // Five integers: `*5` and five `:n` lines.
    while reply.iter().filter(|&&b| b == b'\n').count() < 6 {
        let n = c.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&reply));
        reply.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&reply)
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .map(|n| n.parse().unwrap())
        .collect()
}

#[tokio::test]
async fn keys_that_are_not_utf8_are_counted_and_shown_under_their_digest() {
    let text = with_ports(
        "[[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\nkey = [\"ip\"]\n",
    )
    .replace("[server]\n", "[server]\nresp_listen = \"127.0.0.1:0\"\n");
    let s = start(tollgate_server::Config::parse("t.toml", &text).unwrap()).await;
    let resp = s.resp.unwrap();
    let binary = b"bin\xff\x00\"<x>\n";
    for _ in 0..2 {
        check(resp, binary).await;
    }
    check(resp, b"sha256:62696eff00223c783e0a").await;
    let top = get(&s.admin_url("/v1/top?policy=api"), &[]).await.json();
    let keys: Vec<(String, u64)> = top["requests"]["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["key"].as_str().unwrap().to_owned(),
                k["count"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(keys.len(), 2, "{top}");
    let (digest, count) = &keys[0];
    assert_eq!(*count, 2);
    assert!(
        digest.len() == 33
            && digest.starts_with('#')
            && digest[1..].bytes().all(|b| b.is_ascii_hexdigit()),
        "{digest}"
    );
    assert_eq!(keys[1], ("sha256:62696eff00223c783e0a".to_owned(), 1));
    // An override on the name shown reaches the binary key, and only it.
    let url = s.admin_url(&format!("/v1/overrides/api/%23{}", &digest[1..]));
    let put = send("PUT", &url, &[], r#"{"limit": 1000, "reason": "a test"}"#).await;
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
    assert_eq!(check(resp, binary).await[1], 1000);
    assert_eq!(check(resp, b"sha256:62696eff00223c783e0a").await[1], 5);
    s.stop().await;
}
