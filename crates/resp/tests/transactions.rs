//! `MULTI`/`EXEC` over raw sockets: queued commands spend nothing until `EXEC`, which runs
//! them in order; `DISCARD` and an aborted transaction spend nothing at all; the queue is
//! bounded; `WATCH` is refused; `INFO` answers what clients read on connect. (The replies'
//! bytes against a real redis-server are in `redis_parity.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;

use common::{connect, exchange, frame, read_n, reply_len, start};
use tollgate_resp::Limits;

/// Reads `n` complete replies, as text.
fn replies(s: &mut std::net::TcpStream, n: usize) -> String {
    let mut buf = Vec::new();
    let mut at = 0;
    for _ in 0..n {
        loop {
            if let Some(len) = reply_len(&buf[at..]) {
                at += len;
                break;
            }
            let more = read_n(s, 1);
            assert!(!more.is_empty(), "{:?}", String::from_utf8_lossy(&buf));
            buf.extend(more);
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// `CL.THROTTLE k 2 1 3600`: a bucket of 3 refilled once an hour, each call spending one.
fn throttle(key: &str) -> Vec<u8> {
    frame(&[b"CL.THROTTLE", key.as_bytes(), b"2", b"1", b"3600"])
}

/// The key's remaining count, peeked (quantity 0) on a connection of its own.
fn remaining(door: std::net::SocketAddr, key: &str) -> i64 {
    let mut s = connect(door);
    s.write_all(&frame(&[
        b"CL.THROTTLE",
        key.as_bytes(),
        b"2",
        b"1",
        b"3600",
        b"0",
    ]))
    .unwrap();
    let reply = replies(&mut s, 1);
    let lines: Vec<&str> = reply.split("\r\n").collect();
    lines[3].trim_start_matches(':').parse().unwrap()
}

#[test]
fn queued_commands_spend_nothing_until_exec_runs_them_in_order() {
    let door = start(Limits::default());
    let mut s = connect(door.addr);
    exchange(&mut s, &frame(&[b"MULTI"]), b"+OK\r\n");
    for _ in 0..2 {
        exchange(&mut s, &throttle("tx"), b"+QUEUED\r\n");
    }
    exchange(
        &mut s,
        &frame(&[b"TOLLGATE.CHECK", b"tiny", b"tx"]),
        b"+QUEUED\r\n",
    );
    exchange(&mut s, &frame(&[b"PING"]), b"+QUEUED\r\n");
    // Queued, not run: the key is untouched.
    assert_eq!(remaining(door.addr, "tx"), 3);
    s.write_all(&frame(&[b"EXEC"])).unwrap();
    let reply = replies(&mut s, 1);
    let want = "*4\r\n*5\r\n:0\r\n:3\r\n:2\r\n:-1\r\n:3600\r\n*5\r\n:0\r\n:3\r\n:1\r\n:-1\r\n:7200\r\n*5\r\n:1\r\n:2\r\n:1\r\n:";
    assert!(reply.starts_with(want), "{reply}");
    assert!(reply.ends_with("\r\n:-1\r\n+PONG\r\n"), "{reply}");
    assert_eq!(remaining(door.addr, "tx"), 1);
    // The transaction is over: commands run at once again.
    exchange(
        &mut s,
        &throttle("tx"),
        b"*5\r\n:0\r\n:3\r\n:0\r\n:-1\r\n:10800\r\n",
    );
}

#[test]
fn discard_and_an_aborted_exec_spend_nothing() {
    let door = start(Limits::default());
    let mut s = connect(door.addr);
    let mut request = frame(&[b"MULTI"]);
    request.extend(throttle("gone"));
    request.extend(frame(&[b"DISCARD"]));
    exchange(&mut s, &request, b"+OK\r\n+QUEUED\r\n+OK\r\n");
    // An unknown command and a wrong arity mark it: EXEC runs nothing.
    let mut request = frame(&[b"MULTI"]);
    request.extend(throttle("gone"));
    request.extend(frame(&[b"NOSUCH"]));
    request.extend(frame(&[b"TOLLGATE.CHECK", b"tiny"]));
    request.extend(throttle("gone"));
    request.extend(frame(&[b"EXEC"]));
    exchange(
        &mut s,
        &request,
        b"+OK\r\n+QUEUED\r\n-ERR unknown command 'NOSUCH', with args beginning with: \r\n\
          -ERR wrong number of arguments for 'tollgate.check' command\r\n+QUEUED\r\n\
          -EXECABORT Transaction discarded because of previous errors.\r\n",
    );
    assert_eq!(remaining(door.addr, "gone"), 3);
    exchange(&mut s, &frame(&[b"EXEC"]), b"-ERR EXEC without MULTI\r\n");
    exchange(
        &mut s,
        &frame(&[b"DISCARD"]),
        b"-ERR DISCARD without MULTI\r\n",
    );
}

#[test]
fn exec_answers_an_array_in_resp3_too() {
    let door = start(Limits::default());
    let mut s = connect(door.addr);
    s.write_all(&frame(&[b"HELLO", b"3"])).unwrap();
    replies(&mut s, 1);
    let mut request = frame(&[b"MULTI"]);
    request.extend(frame(&[b"TOLLGATE.CHECK", b"api", b"r3"]));
    request.extend(frame(&[b"CLIENT", b"GETNAME"]));
    request.extend(frame(&[b"EXEC"]));
    s.write_all(&request).unwrap();
    let reply = replies(&mut s, 4);
    assert!(
        reply.starts_with(
            "+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n%5\r\n$7\r\nallowed\r\n:1\r\n$5\r\nlimit\r\n:100\r\n"
        ) && reply.ends_with("$11\r\nretry_after\r\n:-1\r\n_\r\n"),
        "{reply}"
    );
}

#[test]
fn a_transaction_longer_than_the_pipelining_depth_is_discarded() {
    let door = start(Limits {
        max_pipeline: 3,
        ..Limits::default()
    });
    let mut s = connect(door.addr);
    let mut request = frame(&[b"MULTI"]);
    for _ in 0..5 {
        request.extend(throttle("long"));
    }
    request.extend(frame(&[b"EXEC"]));
    exchange(
        &mut s,
        &request,
        b"+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n-ERR transaction discarded: MULTI queues at \
          most 3 commands and 1048576 bytes of arguments; EXEC will answer EXECABORT\r\n\
          +QUEUED\r\n-EXECABORT Transaction discarded because of previous errors.\r\n",
    );
    // None of it ran, not even the commands after the bound.
    assert_eq!(remaining(door.addr, "long"), 3);

    // And the bytes: two ECHOs of 600 bytes fit under 1,300, a third does not.
    let door = start(Limits {
        max_transaction_bytes: 1_300,
        ..Limits::default()
    });
    let mut s = connect(door.addr);
    let big = vec![b'x'; 600];
    let mut request = frame(&[b"MULTI"]);
    for _ in 0..3 {
        request.extend(frame(&[b"ECHO", &big]));
    }
    request.extend(frame(&[b"EXEC"]));
    s.write_all(&request).unwrap();
    let reply = replies(&mut s, 5);
    assert!(
        reply.starts_with("+OK\r\n+QUEUED\r\n+QUEUED\r\n-ERR transaction discarded")
            && reply.ends_with(
                "EXECABORT\r\n-EXECABORT Transaction discarded because of previous errors.\r\n"
            ),
        "{reply}"
    );
}

#[test]
fn watch_is_refused_and_unwatch_has_nothing_to_forget() {
    let door = start(Limits::default());
    let mut s = connect(door.addr);
    s.write_all(&frame(&[b"WATCH", b"k"])).unwrap();
    let reply = replies(&mut s, 1);
    assert!(reply.starts_with("-ERR WATCH is not supported"), "{reply}");
    exchange(&mut s, &frame(&[b"UNWATCH"]), b"+OK\r\n");
    let mut request = frame(&[b"MULTI"]);
    request.extend(frame(&[b"WATCH", b"k"]));
    request.extend(frame(&[b"UNWATCH"]));
    request.extend(frame(&[b"EXEC"]));
    exchange(
        &mut s,
        &request,
        b"+OK\r\n-ERR WATCH inside MULTI is not allowed\r\n+QUEUED\r\n*1\r\n+OK\r\n",
    );
}

#[test]
fn info_answers_what_clients_read_on_connect() {
    let door = start(Limits::default());
    let mut s = connect(door.addr);
    let version = env!("CARGO_PKG_VERSION");
    let server = format!(
        "# Server\r\nredis_version:7.2.0\r\ntollgate_version:{version}\r\nredis_mode:standalone\r\n"
    );
    let persistence = "# Persistence\r\nloading:0\r\nasync_loading:0\r\n";
    let replication = "# Replication\r\nrole:master\r\nconnected_slaves:0\r\n";
    let all = format!("{server}\r\n{persistence}\r\n{replication}");
    for (request, text) in [
        (frame(&[b"INFO"]), all.clone()),
        (frame(&[b"INFO", b"everything"]), all.clone()),
        (frame(&[b"info", b"Persistence"]), persistence.to_owned()),
        (
            frame(&[b"INFO", b"replication", b"server"]),
            format!("{server}\r\n{replication}"),
        ),
        (frame(&[b"INFO", b"keyspace"]), String::new()),
    ] {
        let want = format!("${}\r\n{text}\r\n", text.len());
        exchange(&mut s, &request, want.as_bytes());
    }
    // RESP3: a verbatim string, as Redis answers it.
    s.write_all(&frame(&[b"HELLO", b"3"])).unwrap();
    replies(&mut s, 1);
    let want = format!("={}\r\ntxt:{persistence}\r\n", persistence.len() + 4);
    exchange(&mut s, &frame(&[b"INFO", b"persistence"]), want.as_bytes());
}
