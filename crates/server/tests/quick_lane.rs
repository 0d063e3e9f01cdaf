//! The decision listener's quick lane for `POST /v1/check`, through raw sockets: its answers are
//! hyper's byte for byte (but the date), pipelined checks are answered in order, anything it
//! does not take (chunked bodies, other routes, smuggling attempts, oversized heads) is handed
//! to hyper with every byte not yet answered, and its bounds are hyper's (header read timeout,
//! idle keep-alive, answers a client does not read, shutdown).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CONFIG: &str = r#"
[server]
listen = "127.0.0.1:0"
header_read_timeout = "1s"

[admin]
listen = "127.0.0.1:0"

[[policy]]
name = "api"
algorithm = "fixed_window"
limit = 3
window = "1h"
key = ["header:x-api-key", "ip"]
"#;

async fn server() -> common::Running {
    common::start(tollgate_server::Config::parse("test.toml", CONFIG).expect("valid config")).await
}

/// One answer read off `s`: its head (status line and fields) and body.
async fn answer(s: &mut TcpStream, pending: &mut Vec<u8>) -> Option<(String, Vec<u8>)> {
    loop {
        if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&pending[..end]).into_owned();
            let len = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            while pending.len() < end + 4 + len {
                if !fill(s, pending).await {
                    return None;
                }
            }
            let body = pending[end + 4..end + 4 + len].to_vec();
            pending.drain(..end + 4 + len);
            return Some((head, body));
        }
        if !fill(s, pending).await {
            return None;
        }
    }
}

async fn fill(s: &mut TcpStream, pending: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 4096];
    match tokio::time::timeout(Duration::from_secs(5), s.read(&mut chunk)).await {
        Ok(Ok(n)) if n > 0 => {
            pending.extend_from_slice(&chunk[..n]);
            true
        }
        _ => false,
    }
}

/// A check with its body sent by length (the quick lane's) or chunked (hyper's).
fn request(body: &str, chunked: bool) -> String {
    if chunked {
        format!(
            "POST /v1/check HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n\
             transfer-encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
            body.len()
        )
    } else {
        format!(
            "POST /v1/check HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n\
             content-length: {}\r\n\r\n{body}",
            body.len()
        )
    }
}

/// The answer without its `date` field.
fn dateless(head: &str) -> String {
    head.lines()
        .filter(|l| !l.to_ascii_lowercase().starts_with("date:"))
        .collect::<Vec<_>>()
        .join("\n")
}

async fn exchange(addr: SocketAddr, bytes: &str) -> (String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes.as_bytes()).await.unwrap();
    let mut pending = Vec::new();
    answer(&mut s, &mut pending)
        .await
        .unwrap_or_else(|| panic!("no answer to {bytes:?}"))
}

#[tokio::test]
async fn its_answers_are_hypers_byte_for_byte_but_the_date() {
    let s = server().await;
    // Each body twice, once per lane, each lane with its own key so both count alike.
    let bodies = |key: &str| {
        vec![
            format!(r#"{{"policy":"api","key":"{key}","cost":1}}"#),
            format!(r#"{{"policy":"api","key":"{key}","cost":2}}"#),
            // Over the limit: 429 with Retry-After.
            format!(r#"{{"policy":"api","key":"{key}","cost":1}}"#),
            format!(r#"{{"policy":"api","key":"{key}","cost":0,"mode":"report"}}"#),
            format!(r#"{{"key":"{key}","policy":"api"}}"#),
            format!(r#"{{"policy":"ap\u0069","key":"{key}-esc"}}"#),
            r#"{"policy":"nope","key":"k"}"#.to_owned(),
            r#"{"policy":"api","key":"k","cost":-1}"#.to_owned(),
            r#"{"policy":"api""#.to_owned(),
            r#"[1,2]"#.to_owned(),
            format!(
                r#"{{"method":"GET","path":"/x","ip":"203.0.113.7","headers":{{"x-api-key":"{key}"}}}}"#
            ),
            String::new(),
        ]
    };
    for (quick, slow) in bodies("lane-a").iter().zip(bodies("lane-b").iter()) {
        for attempt in 0.. {
            let (qh, qb) = exchange(s.api, &request(quick, false)).await;
            let (sh, sb) = exchange(s.api, &request(slow, true)).await;
            let (qh, sh) = (dateless(&qh), dateless(&sh));
            let same = qh.replace("lane-a", "lane-b") == sh
                && String::from_utf8_lossy(&qb).replace("lane-a", "lane-b")
                    == String::from_utf8_lossy(&sb);
            if same {
                break;
            }
            // A reset field may have ticked over a second between the two: the pair again,
            // on fresh keys, is fine only for bodies that do not count.
            assert!(
                attempt == 0 && !qh.contains("x-ratelimit"),
                "quick lane:\n{qh}\n{}\nhyper:\n{sh}\n{}",
                String::from_utf8_lossy(&qb),
                String::from_utf8_lossy(&sb)
            );
        }
    }
    s.stop().await;
}

#[tokio::test]
async fn pipelined_checks_are_answered_in_order_then_hyper_takes_the_rest() {
    let s = server().await;
    let mut stream = TcpStream::connect(s.api).await.unwrap();
    let mut all = String::new();
    for _ in 0..4 {
        all.push_str(&request(r#"{"policy":"api","key":"pipelined"}"#, false));
    }
    // Then a request the lane does not take, and a check after it on the same connection.
    all.push_str("GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n");
    all.push_str(&request(r#"{"policy":"api","key":"after"}"#, false));
    stream.write_all(all.as_bytes()).await.unwrap();
    let mut pending = Vec::new();
    let mut statuses = Vec::new();
    for _ in 0..6 {
        let (head, body) = answer(&mut stream, &mut pending).await.unwrap();
        statuses.push(head[9..12].to_owned());
        if statuses.len() == 5 {
            assert_eq!(body, b"ok\n");
        }
    }
    assert_eq!(statuses, ["200", "200", "200", "429", "200", "200"]);
    s.stop().await;
}

#[tokio::test]
async fn what_could_be_read_two_ways_is_left_to_hyper() {
    let s = server().await;
    let body = r#"{"policy":"api","key":"smuggler"}"#;
    let cases = [
        // Two lengths that disagree: 400, never two requests.
        format!(
            "POST /v1/check HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\ncontent-length: 5\r\n\r\n{body}",
            body.len()
        ),
        // A length with a sign, or in hex.
        format!(
            "POST /v1/check HTTP/1.1\r\nhost: t\r\ncontent-length: +{}\r\n\r\n{body}",
            body.len()
        ),
        format!(
            "POST /v1/check HTTP/1.1\r\nhost: t\r\ncontent-length: 0x{:x}\r\n\r\n{body}",
            body.len()
        ),
    ];
    for case in &cases {
        let (head, _) = exchange(s.api, case).await;
        assert!(head.starts_with("HTTP/1.1 400"), "{case:?}\n{head}");
    }
    // Both a length and chunked: hyper reads the chunks (and closes after), as it always did;
    // the bytes inside the chunk are the body, not a second request.
    let smuggle = format!(
        "POST /v1/check HTTP/1.1\r\nhost: t\r\ncontent-length: 4\r\ntransfer-encoding: chunked\r\n\r\n\
         {:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    );
    let mut stream = TcpStream::connect(s.api).await.unwrap();
    stream.write_all(smuggle.as_bytes()).await.unwrap();
    let mut pending = Vec::new();
    let (head, _) = answer(&mut stream, &mut pending).await.unwrap();
    assert!(
        head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.1 400"),
        "{head}"
    );
    assert!(answer(&mut stream, &mut pending).await.is_none());
    // An Expect: 100-continue is hyper's too: it answers 100, then the check.
    let expect = format!(
        "POST /v1/check HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let mut stream = TcpStream::connect(s.api).await.unwrap();
    stream.write_all(expect.as_bytes()).await.unwrap();
    let mut pending = Vec::new();
    while !String::from_utf8_lossy(&pending).contains("100 Continue") {
        assert!(fill(&mut stream, &mut pending).await, "no 100 Continue");
    }
    pending.clear();
    stream.write_all(body.as_bytes()).await.unwrap();
    let (head, _) = answer(&mut stream, &mut pending).await.unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s.stop().await;
}

#[tokio::test]
async fn oversized_heads_and_bodies_get_hypers_refusals() {
    let s = server().await;
    let big = format!(
        "POST /v1/check HTTP/1.1\r\nhost: t\r\nx-filler: {}\r\ncontent-length: 2\r\n\r\n{{}}",
        "a".repeat(70_000)
    );
    let (head, _) = exchange(s.api, &big).await;
    assert!(head.starts_with("HTTP/1.1 431"), "{head}");
    let body = format!(
        r#"{{"policy":"api","key":"k","pad":"{}"}}"#,
        "b".repeat(70_000)
    );
    let (head, body) = exchange(s.api, &request(&body, false)).await;
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert!(String::from_utf8_lossy(&body).contains("64 KiB"));
    s.stop().await;
}

#[tokio::test]
async fn slow_heads_idle_connections_and_shutdown_are_cut_off() {
    let mut s = server().await;
    // Half a head, then nothing: closed after the header read timeout (1 s).
    let mut slow = TcpStream::connect(s.api).await.unwrap();
    slow.write_all(b"POST /v1/check HTTP/1.1\r\nhost: t\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), slow.read(&mut buf))
        .await
        .expect("closed within the timeout")
        .unwrap_or(0);
    assert_eq!(n, 0, "{:?}", String::from_utf8_lossy(&buf[..n]));
    // A keep-alive connection after a check, idle: closed too.
    let mut idle = TcpStream::connect(s.api).await.unwrap();
    idle.write_all(request(r#"{"policy":"api","key":"idle"}"#, false).as_bytes())
        .await
        .unwrap();
    let mut pending = Vec::new();
    assert!(answer(&mut idle, &mut pending).await.is_some());
    assert!(!fill(&mut idle, &mut pending).await, "closed when idle");
    // Stopping closes a connection waiting between checks.
    let mut waiting = TcpStream::connect(s.api).await.unwrap();
    waiting
        .write_all(request(r#"{"policy":"api","key":"w"}"#, false).as_bytes())
        .await
        .unwrap();
    let mut pending = Vec::new();
    assert!(answer(&mut waiting, &mut pending).await.is_some());
    s.trigger_stop();
    let n = tokio::time::timeout(Duration::from_millis(900), waiting.read(&mut buf))
        .await
        .expect("closed at the stop, before the timeout")
        .unwrap_or(0);
    assert_eq!(n, 0);
    let _ = tokio::time::timeout(Duration::from_secs(10), &mut s.task).await;
}

#[tokio::test]
async fn answers_a_client_does_not_read_are_cut_off() {
    let s = server().await;
    let (mut rd, mut wr) = TcpStream::connect(s.api).await.unwrap().into_split();
    // Pipelined checks, never read, until the server stops taking them (its answers fill the
    // socket's buffers, so it stops reading) or closes the connection.
    let batch = request(r#"{"policy":"api","key":"reader"}"#, false).repeat(100);
    let writer = tokio::spawn(async move {
        let mut sent = 0_usize;
        while let Ok(Ok(())) =
            tokio::time::timeout(Duration::from_secs(3), wr.write_all(batch.as_bytes())).await
        {
            sent += 100;
        }
        sent
    });
    let sent = writer.await.unwrap();
    // By now the server's write has waited more than its timeout (1 s): the connection ends
    // after what was buffered, short of an answer to every check sent.
    let mut read = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), rd.read(&mut chunk)).await {
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(n)) => read.extend_from_slice(&chunk[..n]),
            Err(_) => panic!("the server kept a connection whose answers were not read"),
        }
    }
    // (What was buffered may be lost: the server's close resets a connection it did not read
    // to the end.)
    let answers = read.windows(9).filter(|w| w == b"HTTP/1.1 ").count();
    assert!(
        sent > 0,
        "no batch was taken before the server stopped reading"
    );
    assert!(answers < sent, "{answers} answers for {sent} checks");
    s.stop().await;
}
