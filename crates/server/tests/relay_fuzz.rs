//! The proxy's invariant, fuzzed: random and mutated byte streams (pipelined requests, every
//! combination of `Connection`, `Transfer-Encoding` and `Content-Length`, bodies that hide a
//! request, absolute-form targets, duplicated fields) go through the real proxy, from several
//! clients at once, to a recording upstream that reads HTTP/1.1 as leniently as a careless
//! server would. Then:
//!
//! - the upstream never reads a request that was only ever a body (a smuggled one);
//! - every request it reads is the one the client sent under that id, as the rate limiter saw
//!   it: same method, target and host (when the stream was not mutated byte by byte);
//! - every answer a client reads is for one of its own requests, in order, once;
//! - for each policy, the upstream read no more of its requests than the limiter counted;
//! - the proxy is still up at the end.
//!
//! The number of cases is bounded for CI (`TOLLGATE_FUZZ_CASES`, default 1000); run more by
//! hand with a larger value.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A request as the recording upstream read it.
#[derive(Clone, Debug)]
struct Seen {
    id: String,
    method: String,
    target: String,
    host: String,
}

/// The shared setup: a runtime, the recording upstream, the proxy, its admin address.
struct Rig {
    rt: tokio::runtime::Runtime,
    proxy: SocketAddr,
    admin: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

fn rig() -> &'static Rig {
    static RIG: OnceLock<Rig> = OnceLock::new();
    RIG.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (proxy, admin) = rt.block_on(async {
            let up = lenient_upstream(Arc::clone(&seen)).await;
            let text = format!(
                "[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{up}\"\ntimeout = \"1s\"\n\n\
                 [[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 100000000\nwindow = \"1h\"\nkey = [\"header:x-api-key\", \"ip\"]\nmatch = {{ path = \"/api/**\" }}\n\n\
                 [[policy]]\nname = \"b-host\"\nalgorithm = \"fixed_window\"\nlimit = 100000000\nwindow = \"1h\"\nkey = [\"ip\"]\nmatch = {{ host = \"b.test\" }}\n\n\
                 [[policy]]\nname = \"tight\"\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\nkey = [\"header:x-api-key\", \"ip\"]\nmatch = {{ path = \"/tight/**\" }}\n"
            );
            let s = common::start_text(&text).await;
            let addrs = (s.proxy.unwrap(), s.admin);
            // Kept running for the whole test binary.
            std::mem::forget(s);
            addrs
        });
        Rig {
            rt,
            proxy,
            admin,
            seen,
        }
    })
}

// ---------------------------------------------------------------------------------------------
// The recording upstream: reads requests the way a lenient server would (bare LF accepted,
// chunk-size lines read up to their first non-hex byte, the first Content-Length believed,
// "chunked" anywhere in Transfer-Encoding), and answers each with its id.

async fn lenient_upstream(seen: Arc<Mutex<Vec<Seen>>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(serve_lenient(s, Arc::clone(&seen)));
        }
    });
    addr
}

async fn serve_lenient(mut s: TcpStream, seen: Arc<Mutex<Vec<Seen>>>) {
    let mut buf = Vec::new();
    loop {
        let Some(end) = read_until_blank(&mut s, &mut buf).await else {
            return;
        };
        let head: Vec<u8> = buf.drain(..end).collect();
        let text = String::from_utf8_lossy(&head).into_owned();
        let mut lines = text.split('\n').map(|l| l.trim_end_matches('\r'));
        let line = lines.next().unwrap_or("");
        let mut parts = line.split(' ');
        let method = parts.next().unwrap_or("").to_owned();
        let target = parts.next().unwrap_or("").to_owned();
        let mut headers: Vec<(String, String)> = Vec::new();
        for l in lines {
            if let Some((k, v)) = l.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
            }
        }
        let get = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let id = get("x-req-id")
            .or_else(|| target.rsplit('/').next().map(str::to_owned))
            .unwrap_or_default();
        seen.lock().unwrap().push(Seen {
            id: id.clone(),
            method: method.clone(),
            target: target.clone(),
            host: get("host").unwrap_or_default(),
        });
        let chunked =
            get("transfer-encoding").is_some_and(|t| t.to_ascii_lowercase().contains("chunked"));
        let ok = if chunked {
            lenient_chunked(&mut s, &mut buf).await
        } else {
            let n: usize = get("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            read_n(&mut s, &mut buf, n).await
        };
        if !ok {
            return;
        }
        let body = if method == "HEAD" { "" } else { "ok" };
        let reply = format!(
            "HTTP/1.1 200 OK\r\nx-echo: {}\r\ncontent-length: 2\r\n\r\n{body}",
            hex(&id)
        );
        if s.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<String> {
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

async fn fill(s: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut b = [0u8; 8192];
    match tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await {
        Ok(Ok(n)) if n > 0 => {
            buf.extend_from_slice(&b[..n]);
            true
        }
        _ => false,
    }
}

/// Where the head ends: after an empty line, LF or CRLF.
async fn read_until_blank(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    loop {
        for i in 0..buf.len() {
            if buf[i] == b'\n' {
                if buf.get(i + 1) == Some(&b'\n') {
                    return Some(i + 2);
                }
                if buf.get(i + 1..i + 3) == Some(b"\r\n") {
                    return Some(i + 3);
                }
            }
        }
        if !fill(s, buf).await {
            return None;
        }
    }
}

async fn read_n(s: &mut TcpStream, buf: &mut Vec<u8>, n: usize) -> bool {
    while buf.len() < n {
        if !fill(s, buf).await {
            return false;
        }
    }
    buf.drain(..n);
    true
}

async fn read_line(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    loop {
        if let Some(i) = buf.iter().position(|&b| b == b'\n') {
            return Some(buf.drain(..=i).collect());
        }
        if !fill(s, buf).await {
            return None;
        }
    }
}

async fn lenient_chunked(s: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    loop {
        let Some(line) = read_line(s, buf).await else {
            return false;
        };
        let digits: String = line
            .iter()
            .take_while(|b| b.is_ascii_hexdigit())
            .map(|&b| b as char)
            .collect();
        let Ok(size) = usize::from_str_radix(&digits, 16) else {
            return false;
        };
        if size == 0 {
            // Trailers, up to an empty line.
            loop {
                let Some(l) = read_line(s, buf).await else {
                    return false;
                };
                if l == b"\n" || l == b"\r\n" {
                    return true;
                }
            }
        }
        if !read_n(s, buf, size).await {
            return false;
        }
        if read_line(s, buf).await.is_none() {
            return false;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Requests.

#[derive(Clone, Debug)]
enum Framing {
    None,
    Length,
    LengthShort(usize),
    LengthLong(usize),
    LengthTwice,
    Chunked,
    ChunkedBadSize,
    ChunkedBareLf,
    ChunkedAndLength,
    ChunkedTwice,
    Gzip,
}

#[derive(Clone, Debug)]
struct Spec {
    method: &'static str,
    /// 0 origin /api, 1 origin /pub, 2 absolute to b.test, 3 deep dots to /api, 4 /tight
    target: u8,
    host: u8,
    keys: u8,
    connection: Vec<&'static str>,
    framing: Framing,
    /// The body carries a whole request of its own.
    smuggle: bool,
    http10: bool,
}

/// What the client means: the id, method, origin-form target and host the upstream must read.
#[derive(Clone, Debug)]
struct Intent {
    id: String,
    method: &'static str,
    target: String,
    host: String,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        prop::sample::select(vec!["GET", "POST", "PUT", "HEAD", "DELETE"]),
        0u8..5,
        0u8..4,
        0u8..3,
        prop::collection::vec(
            prop::sample::select(vec![
                "close",
                "keep-alive",
                "content-length",
                "transfer-encoding",
                "host",
                "x-api-key",
                "x-req-id",
                "upgrade",
            ]),
            0..3,
        ),
        prop_oneof![
            4 => Just(Framing::None),
            4 => Just(Framing::Length),
            1 => (1usize..4).prop_map(Framing::LengthShort),
            1 => (1usize..4).prop_map(Framing::LengthLong),
            1 => Just(Framing::LengthTwice),
            4 => Just(Framing::Chunked),
            1 => Just(Framing::ChunkedBadSize),
            1 => Just(Framing::ChunkedBareLf),
            1 => Just(Framing::ChunkedAndLength),
            1 => Just(Framing::ChunkedTwice),
            1 => Just(Framing::Gzip),
        ],
        any::<bool>(),
        prop::bool::weighted(0.1),
    )
        .prop_map(
            |(method, target, host, keys, connection, framing, smuggle, http10)| Spec {
                method,
                target,
                host,
                keys,
                connection,
                framing,
                smuggle,
                http10,
            },
        )
}

/// The bytes of `spec` as request `id` (smuggled requests inside get id `s` + `id`).
fn render(spec: &Spec, id: &str) -> (Vec<u8>, Intent) {
    let target = match spec.target {
        0 => format!("/api/{id}"),
        1 => format!("/pub/{id}"),
        2 => format!("http://b.test/api/{id}"),
        3 => format!("/x/y/../../api/./{id}"),
        _ => format!("/tight/{id}"),
    };
    // The host the upstream must read: the target's authority, the Host header, or (HTTP/1.0
    // without one) the upstream's own, which the intent leaves open.
    let host = match (spec.target, spec.host) {
        (2, _) => "b.test",
        (_, 3) => "",
        _ => "a.test",
    }
    .to_owned();
    let origin = target
        .strip_prefix("http://b.test")
        .unwrap_or(&target)
        .to_owned();
    let version = if spec.http10 { "HTTP/1.0" } else { "HTTP/1.1" };
    let mut head = format!("{} {target} {version}\r\n", spec.method);
    match spec.host {
        0 | 1 => head.push_str("Host: a.test\r\n"),
        2 => head.push_str("Host: a.test\r\nHost: b.test\r\n"),
        _ => {}
    }
    head.push_str(&format!("x-req-id: {id}\r\n"));
    for _ in 0..spec.keys {
        head.push_str(&format!("x-api-key: k-{id}\r\n"));
    }
    if !spec.connection.is_empty() {
        head.push_str(&format!("Connection: {}\r\n", spec.connection.join(", ")));
    }
    let payload = if spec.smuggle {
        format!("GET /api/s{id} HTTP/1.1\r\nHost: a.test\r\nx-req-id: s{id}\r\n\r\n")
    } else {
        format!("body-of-{id}")
    };
    let chunk = |p: &str| format!("{:x}\r\n{p}\r\n0\r\n\r\n", p.len());
    let body = match &spec.framing {
        Framing::None => String::new(),
        Framing::Length => {
            head.push_str(&format!("Content-Length: {}\r\n", payload.len()));
            payload.clone()
        }
        Framing::LengthShort(k) => {
            head.push_str(&format!(
                "Content-Length: {}\r\n",
                payload.len().saturating_sub(*k)
            ));
            payload.clone()
        }
        Framing::LengthLong(k) => {
            head.push_str(&format!("Content-Length: {}\r\n", payload.len() + k));
            payload.clone()
        }
        Framing::LengthTwice => {
            head.push_str(&format!(
                "Content-Length: {}\r\nContent-Length: 0\r\n",
                payload.len()
            ));
            payload.clone()
        }
        Framing::Chunked => {
            head.push_str("Transfer-Encoding: chunked\r\n");
            chunk(&payload)
        }
        Framing::ChunkedBadSize => {
            head.push_str("Transfer-Encoding: chunked\r\n");
            format!("ACE {payload}\r\n0\r\n\r\n")
        }
        Framing::ChunkedBareLf => {
            head.push_str("Transfer-Encoding: chunked\r\n");
            format!("{:x}\n{payload}\r\n0\r\n\n", payload.len())
        }
        Framing::ChunkedAndLength => {
            head.push_str(&format!(
                "Transfer-Encoding: chunked\r\nContent-Length: {}\r\n",
                payload.len()
            ));
            chunk(&payload)
        }
        Framing::ChunkedTwice => {
            head.push_str("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n");
            chunk(&payload)
        }
        Framing::Gzip => {
            head.push_str("Transfer-Encoding: gzip, chunked\r\n");
            chunk(&payload)
        }
    };
    head.push_str("\r\n");
    head.push_str(&body);
    let intent = Intent {
        id: id.to_owned(),
        method: spec.method,
        target: origin,
        host,
    };
    (head.into_bytes(), intent)
}

/// One client's case: its requests, and byte flips over the whole stream.
#[derive(Clone, Debug)]
struct Case {
    specs: Vec<Spec>,
    flips: Vec<(prop::sample::Index, u8)>,
    /// Written in pieces of this size (0: at once).
    piece: usize,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(spec(), 1..4),
        prop_oneof![
            3 => Just(Vec::new()),
            1 => prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ],
        prop_oneof![3 => Just(0usize), 1 => 1usize..7],
    )
        .prop_map(|(specs, flips, piece)| Case {
            specs,
            flips,
            piece,
        })
}

/// Runs one client's case; what it read: the ids of the answers it got, in order.
async fn run_client(addr: SocketAddr, case: &Case, client: usize, round: u64) -> Vec<String> {
    let mut bytes = Vec::new();
    for (i, spec) in case.specs.iter().enumerate() {
        let (b, _) = render(spec, &format!("c{round}x{client}r{i}"));
        bytes.extend_from_slice(&b);
    }
    for (at, byte) in &case.flips {
        let i = at.index(bytes.len());
        bytes[i] = *byte;
    }
    let Ok(mut s) = TcpStream::connect(addr).await else {
        return Vec::new();
    };
    let pieces: Vec<&[u8]> = if case.piece == 0 {
        vec![&bytes[..]]
    } else {
        bytes.chunks(case.piece).collect()
    };
    for p in pieces {
        if s.write_all(p).await.is_err() {
            break;
        }
    }
    let _ = s.shutdown().await;
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got)).await;
    let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
    text.split("\r\n")
        .filter_map(|l| l.strip_prefix("x-echo: "))
        .filter_map(unhex)
        .collect()
}

fn decisions(metrics: &str, policy: &str) -> u64 {
    let needle = format!("tollgate_decisions_total{{policy=\"{policy}\",outcome=\"allowed\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&needle))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

async fn metrics(admin: SocketAddr) -> String {
    let reply = common::get(&format!("http://{admin}/metrics"), &[]).await;
    String::from_utf8_lossy(&reply.body).into_owned()
}

static ROUND: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn cases() -> u32 {
    std::env::var("TOLLGATE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn no_request_reaches_the_upstream_uncounted_and_no_client_reads_anothers_answer(
        clients in prop::collection::vec(case(), 1..4)
    ) {
        let rig = rig();
        let round = ROUND.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let intents: HashMap<String, Intent> = clients
            .iter()
            .enumerate()
            .flat_map(|(c, case)| {
                case.specs.iter().enumerate().map(move |(i, spec)| {
                    let (_, intent) = render(spec, &format!("c{round}x{c}r{i}"));
                    (intent.id.clone(), intent)
                })
            })
            .collect();
        let answers = rig.rt.block_on(async {
            let runs: Vec<_> = clients
                .iter()
                .cloned()
                .enumerate()
                .map(|(c, case)| tokio::spawn(async move { run_client(rig.proxy, &case, c, round).await }))
                .collect();
            let mut answers = Vec::new();
            for run in runs {
                answers.push(run.await.unwrap_or_default());
            }
            answers
        });
        let prefix = format!("c{round}x");
        let seen: Vec<Seen> = rig
            .seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.id.starts_with(&prefix) || s.id.starts_with(&format!("s{prefix}")))
            .cloned()
            .collect();
        for s in &seen {
            // Which client and request sent it (a smuggled one carries `s` and the id of the
            // request whose body hid it).
            let smuggled = s.id.starts_with('s');
            let mut numbers = s.id[usize::from(smuggled)..]
                .strip_prefix(&prefix)
                .unwrap_or_default()
                .split('r')
                .map(|n| n.parse::<usize>().ok());
            let (client, request) = (
                numbers.next().flatten().unwrap_or(usize::MAX),
                numbers.next().flatten().unwrap_or(usize::MAX),
            );
            let Some(case) = clients.get(client) else {
                continue;
            };
            // The client's bytes mean what the generator meant only when no byte was flipped
            // and no earlier request's length lied: otherwise the client itself may have sent
            // other requests (`...r0GET /api/...` is a valid request for method `0GET`, and a
            // shortened length turns a body into a request the limiter does decide on).
            let shifted = case.specs.iter().take(request).any(|spec| {
                matches!(spec.framing, Framing::LengthShort(_) | Framing::LengthLong(_))
            });
            if !case.flips.is_empty() || shifted {
                continue;
            }
            // Never a request that only ever was a body.
            prop_assert!(!smuggled, "smuggled past the limiter: {s:?}");
            // Exactly the request sent under that id.
            if let Some(intent) = intents.get(&s.id) {
                prop_assert_eq!(&s.method, intent.method, "{:?}", s);
                prop_assert_eq!(&s.target, &intent.target, "{:?}", s);
                if !intent.host.is_empty() {
                    prop_assert_eq!(&s.host, &intent.host, "{:?}", s);
                }
            }
        }
        for (c, ids) in answers.iter().enumerate() {
            let own = format!("c{round}x{c}r");
            let mut last: Option<usize> = None;
            for id in ids {
                // Another client's id is a violation; an id a flipped byte garbled is this
                // client's own, unrecognisable, and skipped.
                let other = (0..clients.len())
                    .filter(|&o| o != c)
                    .any(|o| id.contains(&format!("c{round}x{o}r")));
                prop_assert!(!other, "client {c} read an answer for {id}");
                let Some(n) = id.strip_prefix(&own).and_then(|n| n.parse::<usize>().ok()) else {
                    continue;
                };
                prop_assert!(last.is_none_or(|l| n > l), "client {c}: answers out of order: {ids:?}");
                last = Some(n);
            }
        }
    }
}

#[test]
fn the_limiter_counted_at_least_what_the_upstream_read_and_is_still_up() {
    let rig = rig();
    rig.rt.block_on(async {
        // A case of each shape first, so the counts are not trivially zero.
        let case = Case {
            specs: vec![Spec {
                method: "POST",
                target: 0,
                host: 0,
                keys: 1,
                connection: vec!["content-length"],
                framing: Framing::Length,
                smuggle: true,
                http10: false,
            }],
            flips: Vec::new(),
            piece: 0,
        };
        let ids = run_client(rig.proxy, &case, 0, u64::MAX).await;
        assert_eq!(ids.len(), 1, "{ids:?}");
        // What the upstream read first, then what the limiter counted: requests are counted
        // before they go up, so the count can only be ahead.
        let seen = rig.seen.lock().unwrap().clone();
        let m = metrics(rig.admin).await;
        let pattern: tollgate_http::PathPattern = "/api/**".parse().unwrap();
        let api = seen
            .iter()
            .filter(|s| {
                tollgate_http::NormalizedPath::new(s.target.split('?').next().unwrap_or(""))
                    .is_ok_and(|p| pattern.matches(&p))
            })
            .count() as u64;
        let b_host = seen.iter().filter(|s| s.host == "b.test").count() as u64;
        assert!(
            api <= decisions(&m, "api"),
            "api: upstream read {api}, limiter counted {}",
            decisions(&m, "api")
        );
        assert!(
            b_host <= decisions(&m, "b-host"),
            "b-host: {b_host} > {}",
            decisions(&m, "b-host")
        );
    });
}
