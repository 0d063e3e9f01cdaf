//! Concurrency slots held by an instance that dies: two `tollgate serve` processes share a
//! concurrency limit on a real `redis-server`; one takes every slot and is killed with
//! SIGKILL. Its slots come back when their `lease_ttl` has passed, and no sooner: the other
//! instance is refused until then, and admitted after.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod queue_support;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use queue_support::{Instance, Redis, eventually};

const TTL: Duration = Duration::from_secs(4);

/// An upstream that takes requests and never answers: whoever reaches it holds its slot.
fn silent_upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    port
}

/// Sends a request for `key` and says whether it was admitted: a 429 comes at once, an
/// admitted request waits on the silent upstream (no answer within half a second). The
/// connection is returned so that an admitted request keeps its slot.
fn try_export(proxy: SocketAddr, key: &str) -> (bool, TcpStream) {
    let mut s = TcpStream::connect(proxy).unwrap();
    let head = format!("GET /v1/export/1 HTTP/1.1\r\nhost: t\r\nx-api-key: {key}\r\n\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut buf = [0u8; 32];
    match s.read(&mut buf) {
        Ok(n) if n > 0 => {
            let head = String::from_utf8_lossy(&buf[..n]).into_owned();
            assert!(head.starts_with("HTTP/1.1 429"), "{head}");
            (false, s)
        }
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => (true, s),
        other => panic!("unexpected read: {other:?}"),
    }
}

#[test]
fn a_killed_instances_slots_return_after_their_ttl_and_no_sooner() {
    let redis = Redis::start(&[]);
    let upstream = silent_upstream();
    let config = format!(
        "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{}\"\nkey_secret_env = \"TG_TEST_KEY_SECRET\"\n\
         [proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:{upstream}\"\ntimeout = \"60s\"\n\
         [[policy]]\nname = \"exports\"\nalgorithm = \"concurrency\"\nlimit = 2\nlease_ttl = \"{}s\"\n\
         key = [\"header:x-api-key\"]\nmatch = {{ path = \"/v1/export/**\" }}\n",
        redis.port(),
        TTL.as_secs()
    );
    let mut a = Instance::start(&config);
    let b = Instance::start(&config);

    let taken_from = Instant::now();
    let held: Vec<TcpStream> = (0..2)
        .map(|_| {
            let (admitted, s) = try_export(a.proxy, "k1");
            assert!(admitted);
            s
        })
        .collect();
    assert_eq!(
        a.metric("tollgate_in_flight{policy=\"exports\"}"),
        2.0,
        "both slots held by the first instance"
    );
    a.kill();
    drop(held);

    // Until the TTL has passed since the slots were taken, the second instance is refused.
    let mut admitted_at = None;
    let mut kept = Vec::new();
    eventually("the slots came back", TTL * 4, || {
        let (admitted, s) = try_export(b.proxy, "k1");
        if admitted {
            admitted_at = Some(Instant::now());
            kept.push(s);
        }
        admitted
    });
    let after = admitted_at.unwrap().duration_since(taken_from);
    assert!(
        after >= TTL,
        "a dead instance's slot came back after {after:?}, before its lease_ttl of {TTL:?}"
    );
    // Another key was never affected.
    let (admitted, _s) = try_export(b.proxy, "k2");
    assert!(admitted);
}
