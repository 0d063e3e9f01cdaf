//! Regression tests over raw sockets: pipelining, requests split anywhere, protocol errors
//! closing only their connection, every bound of [`Limits`], `HELLO 3`, `QUIT`, and the drain.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{connect, exchange, frame, read_n, read_to_eof, reply_len, start};
use tollgate_resp::Limits;

const PONG: &[u8] = b"+PONG\r\n";

#[test]
fn a_pipeline_in_one_write_is_answered_in_order() {
    let door = start(Limits::default());
    let mut s = connect(door.addr);
    let mut request = Vec::new();
    for i in 0..40 {
        match i % 4 {
            0 => request.extend(frame(&[b"PING"])),
            1 => request.extend(frame(&[b"ECHO", format!("m{i}").as_bytes()])),
            2 => request.extend(frame(&[b"CL.THROTTLE", b"pipe", b"10", b"1", b"1"])),
            _ => request.extend(b"TOLLGATE.CHECK api pipe-key\r\n"),
        }
    }
    s.write_all(&request).unwrap();
    let replies = read_replies(&mut s, 40);
    for (i, reply) in replies.iter().enumerate() {
        let reply = String::from_utf8_lossy(reply);
        let n = i / 4 + 1;
        match i % 4 {
            0 => assert_eq!(reply, "+PONG\r\n"),
            1 => assert_eq!(reply, format!("${}\r\nm{i}\r\n", format!("m{i}").len())),
            // A burst of 10 (limit 11) at 1 per second: the n-th call leaves 11 - n.
            2 => assert_eq!(
                reply,
                format!("*5\r\n:0\r\n:11\r\n:{}\r\n:-1\r\n:{n}\r\n", 11 - n)
            ),
            _ => {
                let prefix = format!("*5\r\n:1\r\n:100\r\n:{}\r\n:", 100 - n);
                assert!(
                    reply.starts_with(&prefix) && reply.ends_with("\r\n:-1\r\n"),
                    "{reply}"
                );
            }
        }
    }
}

/// Reads `n` complete replies.
fn read_replies(s: &mut TcpStream, n: usize) -> Vec<Vec<u8>> {
    let mut buf = Vec::new();
    let mut replies = Vec::new();
    while replies.len() < n {
        match reply_len(&buf) {
            Some(len) => replies.push(buf.drain(..len).collect()),
            None => {
                let more = read_n(s, 1);
                assert!(!more.is_empty(), "only {} replies", replies.len());
                buf.extend(more);
            }
        }
    }
    replies
}

#[test]
fn requests_arriving_a_byte_at_a_time_are_parsed() {
    let door = start(Limits::default());
    let mut s = connect(door.addr);
    let mut request = frame(&[b"ECHO", b"split\r\nanywhere"]);
    request.extend(b"PING\r\n*0\r\n\r\nECHO \"a b\"\r\n");
    for b in &request {
        s.write_all(&[*b]).unwrap();
        std::thread::sleep(Duration::from_micros(200));
    }
    let expected = b"$15\r\nsplit\r\nanywhere\r\n+PONG\r\n$3\r\na b\r\n";
    assert_eq!(read_n(&mut s, expected.len()), expected);
}

#[test]
fn a_protocol_error_closes_only_its_connection() {
    let door = start(Limits::default());
    let mut other = connect(door.addr);
    exchange(&mut other, b"PING\r\n", PONG);
    for (bad, error) in [
        (&b"*1\r\n$x\r\n"[..], "invalid bulk length"),
        (b"*1\r\n:1\r\n", "expected '$', got ':'"),
        (b"*y\r\n", "invalid multibulk length"),
        (b"ECHO \"open\r\n", "unbalanced quotes in request"),
        (b"*1\r\n$4\r\nPINGxx", "bulk string not terminated by CRLF"),
    ] {
        let mut s = connect(door.addr);
        let mut request = b"PING\r\n".to_vec();
        request.extend(bad);
        // Whatever follows the bad frame is never run.
        request.extend(b"PING\r\n");
        s.write_all(&request).unwrap();
        let got = read_to_eof(&mut s, Duration::from_secs(5)).expect("closed");
        assert_eq!(
            String::from_utf8_lossy(&got),
            format!("+PONG\r\n-ERR Protocol error: {error}\r\n")
        );
        exchange(&mut other, b"PING\r\n", PONG);
    }
}

#[test]
fn oversized_requests_are_refused_before_they_arrive() {
    let door = start(Limits {
        max_request_bytes: 1024,
        max_args: 8,
        ..Limits::default()
    });
    for (request, error) in [
        (
            b"*1\r\n$2000\r\n".to_vec(),
            "invalid bulk length".to_owned(),
        ),
        (
            [&b"*2\r\n$4\r\nECHO\r\n$1010\r\n"[..], &[b'a'; 1010]].concat(),
            "request larger than 1024 bytes".to_owned(),
        ),
        (vec![b'a'; 1100], "too big inline request".to_owned()),
        (b"*9\r\n".to_vec(), "invalid multibulk length".to_owned()),
        (
            b"a b c d e f g h i\r\n".to_vec(),
            "too many arguments in inline request".to_owned(),
        ),
    ] {
        let mut s = connect(door.addr);
        s.write_all(&request).unwrap();
        let got = read_to_eof(&mut s, Duration::from_secs(5)).expect("closed");
        assert_eq!(
            String::from_utf8_lossy(&got),
            format!("-ERR Protocol error: {error}\r\n")
        );
    }
    // Up to the bound is fine.
    let mut s = connect(door.addr);
    let arg = vec![b'z'; 1000];
    let mut expected = b"$1000\r\n".to_vec();
    expected.extend(&arg);
    expected.extend(b"\r\n");
    exchange(&mut s, &frame(&[b"ECHO", &arg]), &expected);
}

#[test]
fn connections_past_the_bound_are_told_and_closed() {
    let door = start(Limits {
        max_connections: 2,
        ..Limits::default()
    });
    let mut a = connect(door.addr);
    let mut b = connect(door.addr);
    exchange(&mut a, b"PING\r\n", PONG);
    exchange(&mut b, b"PING\r\n", PONG);
    let mut c = connect(door.addr);
    let _ = c.write_all(b"PING\r\n");
    let got = read_to_eof(&mut c, Duration::from_secs(5)).expect("closed");
    assert_eq!(got, b"-ERR max number of clients reached\r\n");
    drop(a);
    // The permit comes back once the server has seen the close.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut d = connect(door.addr);
        d.write_all(b"PING\r\n").unwrap();
        if read_n(&mut d, PONG.len()) == PONG {
            break;
        }
        assert!(Instant::now() < deadline, "no slot came free");
        std::thread::sleep(Duration::from_millis(20));
    }
    exchange(&mut b, b"PING\r\n", PONG);
}

#[test]
fn idle_connections_are_closed() {
    let door = start(Limits {
        idle_timeout: Duration::from_millis(300),
        ..Limits::default()
    });
    let mut idle = connect(door.addr);
    let mut busy = connect(door.addr);
    let started = Instant::now();
    for _ in 0..8 {
        std::thread::sleep(Duration::from_millis(100));
        exchange(&mut busy, b"PING\r\n", PONG);
    }
    let got = read_to_eof(&mut idle, Duration::from_secs(5)).expect("closed");
    assert!(got.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(300));
    exchange(&mut busy, b"PING\r\n", PONG);
}

#[test]
fn a_client_that_reads_no_replies_is_cut_off() {
    let door = start(Limits {
        max_connections: 1,
        write_timeout: Duration::from_millis(300),
        ..Limits::default()
    });
    let stuck = connect(door.addr);
    let mut writer = stuck.try_clone().unwrap();
    // 60 KB echoed per request, never read: the server's writes fill both socket buffers.
    let flood = std::thread::spawn(move || {
        let request = frame(&[b"ECHO", &vec![b'x'; 60_000]]);
        for _ in 0..2_000 {
            if writer.write_all(&request).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut s = connect(door.addr);
        let _ = s.write_all(b"PING\r\n");
        let got = read_n(&mut s, PONG.len());
        if got == PONG {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the stuck client still holds the only slot"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(stuck);
    flood.join().unwrap();
}

#[test]
fn hello_3_switches_the_replies_to_resp3() {
    let door = start(Limits::default());
    let mut s = connect(door.addr);
    s.write_all(b"HELLO 3 SETNAME probe\r\n").unwrap();
    let mut got = Vec::new();
    while reply_len(&got).is_none() {
        got.extend(read_n(&mut s, 1));
    }
    let hello = String::from_utf8_lossy(&got);
    assert!(
        hello.starts_with("%7\r\n$6\r\nserver\r\n$8\r\ntollgate\r\n"),
        "{hello}"
    );
    assert!(hello.contains("$5\r\nproto\r\n:3\r\n"), "{hello}");
    exchange(&mut s, b"CLIENT GETNAME\r\n", b"$5\r\nprobe\r\n");
    exchange(
        &mut s,
        b"CLIENT SETNAME \"\"\r\nCLIENT GETNAME\r\n",
        b"+OK\r\n_\r\n",
    );
    exchange(
        &mut s,
        b"TOLLGATE.CHECK tiny k 2\r\n",
        b"%5\r\n$7\r\nallowed\r\n:1\r\n$5\r\nlimit\r\n:2\r\n$9\r\nremaining\r\n:0\r\n$5\r\nreset\r\n:",
    );
    // The reset (seconds to the end of the hour) has 1 to 4 digits.
    let mut rest = Vec::new();
    while !rest.ends_with(b":-1\r\n") && rest.len() < 64 {
        rest.extend(read_n(&mut s, 1));
    }
    assert!(
        rest.ends_with(b"\r\n$11\r\nretry_after\r\n:-1\r\n"),
        "{rest:?}"
    );
    exchange(
        &mut s,
        b"CONFIG GET appendonly\r\n",
        b"%1\r\n$10\r\nappendonly\r\n$2\r\nno\r\n",
    );
    // Back to RESP2.
    s.write_all(b"HELLO 2\r\n").unwrap();
    let mut got = Vec::new();
    while reply_len(&got).is_none() {
        got.extend(read_n(&mut s, 1));
    }
    assert!(got.starts_with(b"*14\r\n"));
    exchange(&mut s, b"CLIENT GETNAME\r\n", b"$-1\r\n");
    exchange(
        &mut s,
        b"TOLLGATE.CHECK tiny k\r\n",
        b"*5\r\n:0\r\n:2\r\n:0\r\n:",
    );
}

#[test]
fn quit_answers_then_closes() {
    let door = start(Limits::default());
    let mut s = connect(door.addr);
    s.write_all(b"PING\r\nQUIT\r\nPING\r\n").unwrap();
    let got = read_to_eof(&mut s, Duration::from_secs(5)).expect("closed");
    assert_eq!(got, b"+PONG\r\n+OK\r\n");
}

#[test]
fn a_small_pipeline_bound_still_answers_everything() {
    let door = start(Limits {
        max_pipeline: 2,
        ..Limits::default()
    });
    let mut s = connect(door.addr);
    let request = b"PING\r\n".repeat(9);
    exchange(&mut s, &request, &PONG.repeat(9));
}

#[test]
fn tollgate_check_errors_name_the_problem() {
    let door = start(Limits::default());
    let mut s = connect(door.addr);
    for (request, reply) in [
        (
            &b"TOLLGATE.CHECK nope k\r\n"[..],
            &b"-ERR unknown policy 'nope'\r\n"[..],
        ),
        (
            b"TOLLGATE.CHECK api k -1\r\n",
            b"-ERR cost must be an integer from 0 to 4294967295\r\n",
        ),
        (
            b"TOLLGATE.CHECK api k x\r\n",
            b"-ERR cost must be an integer from 0 to 4294967295\r\n",
        ),
        (
            b"TOLLGATE.CHECK tiny k 3\r\n",
            b"-ERR cost 3 exceeds the quota of policy 'tiny' (at most 2 per request)\r\n",
        ),
        (
            b"TOLLGATE.CHECK api\r\n",
            b"-ERR wrong number of arguments for 'tollgate.check' command\r\n",
        ),
        (
            b"tollgate.check api k 0\r\n",
            b"*5\r\n:1\r\n:100\r\n:100\r\n:",
        ),
    ] {
        exchange(&mut s, request, reply);
        if !reply.ends_with(b"\r\n") {
            let mut rest = Vec::new();
            while !rest.ends_with(b":-1\r\n") {
                let byte = read_n(&mut s, 1);
                assert!(!byte.is_empty() && rest.len() < 64, "{rest:?}");
                rest.extend(byte);
            }
        }
    }
}

#[test]
fn shutdown_answers_what_was_read_then_stops_accepting() {
    let door = start(Limits::default());
    let addr = door.addr;
    let mut s = connect(addr);
    exchange(&mut s, b"PING\r\n", PONG);
    let mut idle = connect(addr);
    exchange(&mut idle, b"PING\r\n", PONG);
    let started = Instant::now();
    door.shutdown();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "idle connections held the drain"
    );
    assert!(read_to_eof(&mut idle, Duration::from_secs(5)).is_some());
    assert!(TcpStream::connect(addr).is_err());
}

#[test]
fn a_quiet_connection_gives_its_buffers_back_and_goes_on() {
    let door = start(Limits::default());
    let mut s = connect(door.addr);
    s.write_all(b"HELLO 3\r\n").unwrap();
    let mut got = Vec::new();
    while reply_len(&got).is_none() {
        got.extend(read_n(&mut s, 1));
    }
    // Past a second of quiet the connection holds no buffer; it reads and answers again, in
    // the protocol it chose.
    std::thread::sleep(Duration::from_millis(1_300));
    exchange(&mut s, b"CLIENT GETNAME\r\nPING\r\n", b"_\r\n+PONG\r\n");
    let big = frame(&[b"ECHO", &[b'q'; 30_000]]);
    std::thread::sleep(Duration::from_millis(1_300));
    s.write_all(&big).unwrap();
    let reply = read_n(&mut s, 30_000 + 10);
    assert!(reply.starts_with(b"$30000\r\nqqq") && reply.ends_with(b"q\r\n"));
}
