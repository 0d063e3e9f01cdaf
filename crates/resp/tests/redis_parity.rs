//! The door answers like redis-server: the same bytes sent to a real `redis-server` (started
//! on a free loopback port) and to the door get the same reply bytes, for the connection
//! commands, the errors of unknown commands and wrong arities, inline quoting, transactions
//! (`MULTI`/`EXEC`/`DISCARD`), and every protocol error both detect. Needs `redis-server`
//! (`scripts/test.sh` installs it).
//!
//! Left out on purpose: what the door answers differently by design (`HELLO`'s server fields,
//! `COMMAND`, `INFO`, `WATCH`, `CLIENT SETINFO` of Redis 7.2, `SELECT` of a database other
//! than 0, and the stricter CRLF checks, which `codec`'s unit tests cover).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{reply_len, start};
use tollgate_resp::Limits;
use tollgate_testkit::redis::RedisProcess;

const SENTINEL: &[u8] = b"ECHO __end__\r\n";
const SENTINEL_REPLY: &[u8] = b"$7\r\n__end__\r\n";

/// Sends `request` on a new connection (then the sentinel, if asked) and reads the replies
/// until the sentinel's or the end of the connection.
fn transcript(addr: SocketAddr, request: &[u8], sentinel: bool) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    s.write_all(request).unwrap();
    if sentinel {
        s.write_all(SENTINEL).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if sentinel && out.ends_with(SENTINEL_REPLY) {
            return out;
        }
        assert!(
            Instant::now() < deadline,
            "no end to {:?}",
            String::from_utf8_lossy(&out)
        );
        match s.read(&mut buf) {
            Ok(0) => {
                out.extend(b"<closed>");
                return out;
            }
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                out.extend(b"<closed>");
                return out;
            }
            Err(_) => {}
        }
    }
}

#[test]
fn the_door_answers_as_redis_server() {
    let redis = RedisProcess::start(&[]);
    let door = start(Limits::default());
    let big = |n: usize, b: u8| vec![b; n];
    let mut cases: Vec<(Vec<u8>, bool, bool)> = Vec::new();
    // (request, append the sentinel, skip the first reply: a HELLO whose fields differ)
    let mut plain = |r: &[u8]| cases.push((r.to_vec(), true, false));
    for r in [
        &b"PING\r\n"[..],
        b"ping hello\r\n",
        b"PING a b\r\n",
        b"pInG\r\n",
        b"*1\r\n$4\r\nping\r\n*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n",
        b"ECHO\r\nECHO a b\r\n",
        b"*2\r\n$4\r\nECHO\r\n$3\r\na\x00b\r\n",
        b"FOO\r\n",
        b"foo a b c\r\n",
        b"*3\r\n$3\r\nFOO\r\n$3\r\na\r\n\r\n$1\r\nb\r\n",
        b"*3\r\n$4\r\nF\x00OO\r\n$3\r\na\x00c\r\n$1\r\nb\r\n",
        b"HELLO 1\r\nHELLO 4\r\nHELLO 0\r\nHELLO -1\r\n",
        b"HELLO abc\r\nHELLO 03\r\nHELLO 3 FOO\r\nHELLO 3 AUTH default\r\nHELLO 2 AUTH\r\n",
        b"HELLO 3 AUTH bob x\r\nHELLO 3 SETNAME \"a b\"\r\nHELLO 3 AUTH default x SETNAME\r\n",
        b"AUTH\r\nAUTH x\r\nAUTH default x\r\nAUTH bob x\r\nAUTH a b c\r\n",
        b"SELECT 0\r\nSELECT x\r\nSELECT 99999999999\r\nSELECT\r\nSELECT 0 1\r\n",
        b"CLIENT SETNAME foo\r\nCLIENT GETNAME\r\nclient getname\r\n",
        b"CLIENT SETNAME \"\"\r\nCLIENT GETNAME\r\nCLIENT SETNAME \"a b\"\r\n",
        b"CLIENT SETNAME \"a\\x01\"\r\nCLIENT SETNAME\r\nCLIENT GETNAME x\r\nCLIENT\r\n",
        b"CLIENT FOO\r\nclient foo bar\r\nCLIENT ID x\r\n",
        b"CONFIG GET save\r\nCONFIG GET appendonly\r\nCONFIG GET nosuch\r\n",
        b"CONFIG GET SAVE\r\nCONFIG GET appendonly APPENDONLY\r\nCONFIG\r\nCONFIG GET\r\n",
        b"CONFIG FOO\r\n",
        b"COMMAND FOO\r\nCOMMAND COUNT x\r\n",
        b"ECHO \"a\\x41\\n\"\r\nECHO 'it\\'s'\r\nECHO a\"b c\" d\r\nECHO \"\\x4\"\r\n",
        b"   \r\n \t PING\r\n\r\n\r\nPING\n*-1\r\n*0\r\nPING\r\n",
        b"ECHO a\x0bb\r\n",
    ] {
        plain(r);
    }
    let long_name = [&b"X"[..], &big(300, b'n'), b" a\r\n"].concat();
    plain(&long_name);
    let long_args = [&b"FOO "[..], &big(200, b'x'), b" y\r\n"].concat();
    plain(&long_args);
    let many_args = [&b"FOO"[..], &b" abcdefghij".repeat(30), b"\r\n"].concat();
    plain(&many_args);
    // Protocol errors: the reply, then the connection closes.
    for r in [
        &b"*x\r\n"[..],
        b"*1\r\n$x\r\n",
        b"*1\r\n$-1\r\n",
        b"*1\r\n:1\r\n",
        b"*+1\r\n",
        b"*01\r\n",
        b"*1\r\n$04\r\n",
        b"*1\r\n$600000000\r\n",
        b"*3000000000\r\n",
        b"ECHO \"unbalanced\r\n",
        b"ECHO \"a\"b\r\n",
        b"ECHO a\"b c\"d\r\n",
        b"PING\r\n*1\r\n$3\r\nfoo\r\n*1\r\n:1\r\n",
        b"QUIT\r\nPING\r\n",
        b"QUIT now\r\n",
        b"POST / HTTP/1.1\r\nHost: localhost\r\n\r\nPING\r\n",
        b"PING\r\nhost: localhost\r\nPING\r\n",
    ] {
        cases.push((r.to_vec(), true, false));
    }
    for r in [
        big(70_000, b'a'),
        [&b"*"[..], &big(70_000, b'1')].concat(),
        [&b"*1\r\n$"[..], &big(70_000, b'1')].concat(),
    ] {
        cases.push((r, false, false));
    }
    // RESP3 after HELLO 3.
    for r in [
        &b"HELLO 3\r\nPING\r\nCLIENT GETNAME\r\nCONFIG GET appendonly\r\nECHO x\r\nFOO\r\n"[..],
        b"HELLO 3 SETNAME n1\r\nCLIENT GETNAME\r\n",
        b"HELLO 2 SETNAME n2 SETNAME n3\r\nCLIENT GETNAME\r\n",
        b"HELLO 3 AUTH default anything\r\nSELECT 0\r\nHELLO 5\r\n",
        b"HELLO\r\nPING x\r\n",
    ] {
        cases.push((r.to_vec(), true, true));
    }

    assert_same_transcripts(redis.addr(), door.addr, &cases);
}

/// `MULTI`/`EXEC`/`DISCARD` as Redis answers them, with the commands both have: queued,
/// refused while queueing (which aborts `EXEC`), run in order, nested, without `MULTI`, and
/// the arities (`EXEC`'s own abort among them). `WATCH` outside a transaction is left out: the
/// door refuses it on purpose.
#[test]
fn transactions_answer_as_redis_server() {
    let redis = RedisProcess::start(&[]);
    let door = start(Limits::default());
    let mut cases: Vec<(Vec<u8>, bool, bool)> = Vec::new();
    for r in [
        &b"MULTI\r\nPING\r\nECHO a\r\nCLIENT SETNAME t\r\nCLIENT GETNAME\r\nEXEC\r\n"[..],
        b"MULTI\r\nEXEC\r\nEXEC\r\nDISCARD\r\n",
        b"MULTI\r\nPING\r\nDISCARD\r\nEXEC\r\nPING\r\n",
        b"MULTI\r\nMULTI\r\nPING\r\nEXEC\r\n",
        b"MULTI\r\nWATCH k\r\nUNWATCH\r\nEXEC\r\n",
        b"MULTI\r\nFOO\r\nPING\r\nEXEC\r\nPING\r\n",
        b"MULTI\r\nECHO\r\nPING\r\nEXEC\r\n",
        b"MULTI\r\nCLIENT FOO\r\nEXEC\r\n",
        b"MULTI\r\nCLIENT SETNAME\r\nEXEC\r\n",
        b"MULTI\r\nPING a b\r\nSELECT 0\r\nAUTH x\r\nEXEC\r\n",
        b"MULTI\r\nMULTI x\r\nEXEC\r\n",
        b"MULTI\r\nDISCARD x\r\nEXEC\r\n",
        b"MULTI\r\nWATCH\r\nEXEC\r\n",
        b"MULTI\r\nPING\r\nEXEC x\r\nEXEC\r\n",
        b"MULTI x\r\nEXEC x\r\nDISCARD x\r\nWATCH\r\nUNWATCH x\r\nUNWATCH\r\n",
        b"EXEC\r\nDISCARD\r\n",
        b"*1\r\n$5\r\nmulti\r\n*2\r\n$4\r\necho\r\n$3\r\na\x00b\r\n*1\r\n$4\r\nexec\r\n",
    ] {
        cases.push((r.to_vec(), true, false));
    }
    // QUIT runs at once; an HTTP request closes unanswered.
    for r in [
        &b"MULTI\r\nPING\r\nQUIT\r\nPING\r\n"[..],
        b"MULTI\r\nPOST / HTTP/1.1\r\nEXEC\r\n",
    ] {
        cases.push((r.to_vec(), true, false));
    }
    // RESP3: EXEC's reply is an array there too.
    cases.push((
        b"HELLO 3\r\nMULTI\r\nPING\r\nCLIENT GETNAME\r\nFOO\r\nEXEC\r\nMULTI\r\nPING\r\nEXEC\r\n"
            .to_vec(),
        true,
        true,
    ));
    assert_same_transcripts(redis.addr(), door.addr, &cases);
}

/// Each case (request, append the sentinel, skip the first reply) sent to both on a new
/// connection; asserts the replies are the same bytes.
fn assert_same_transcripts(redis: SocketAddr, door: SocketAddr, cases: &[(Vec<u8>, bool, bool)]) {
    let mut failures = Vec::new();
    for (request, sentinel, skip_first) in cases {
        let mut want = transcript(redis, request, *sentinel);
        let mut got = transcript(door, request, *sentinel);
        if *skip_first {
            for t in [&mut want, &mut got] {
                let n = reply_len(t).unwrap_or(0);
                t.drain(..n);
            }
            // HELLO's reply is the same shape; only its fields' values differ.
        }
        if want != got {
            failures.push(format!(
                "request {:?}\n  redis: {:?}\n  door:  {:?}",
                String::from_utf8_lossy(&request[..request.len().min(120)]),
                String::from_utf8_lossy(&want[..want.len().min(400)]),
                String::from_utf8_lossy(&got[..got.len().min(400)]),
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} differences:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn with_a_password_the_door_answers_as_redis_server_with_requirepass() {
    let redis = RedisProcess::start(&["--requirepass", "s3cret"]);
    let door = common::start_with(
        tollgate_resp::Handler::for_limiter(common::limiter()).with_password(&b"s3cret"[..]),
        Limits::default(),
    );
    // Each request, then the password, so that the sentinel gets its answer.
    let mut cases: Vec<(Vec<u8>, bool, bool)> = Vec::new();
    for r in [
        // Before the password: what Redis checks first (unknown commands and subcommands,
        // arities), then -NOAUTH.
        &b"PING\r\nPING a b\r\nECHO\r\nECHO x\r\nFOO\r\nfoo a b\r\n"[..],
        b"CLIENT\r\nCLIENT FOO\r\nCLIENT SETNAME\r\nCLIENT ID x\r\nCLIENT GETNAME\r\n",
        b"SELECT 1\r\nSELECT\r\nCOMMAND\r\nCOMMAND COUNT\r\nCOMMAND FOO\r\nCOMMAND INFO\r\n",
        b"CONFIG GET save\r\nCONFIG GET\r\nCONFIG FOO\r\nCONFIG\r\n",
        // AUTH: the wrong password, another user, the arities.
        b"AUTH\r\nAUTH wrong\r\nAUTH default wrong\r\nAUTH bob s3cret\r\nAUTH a b c\r\n",
        b"AUTH default\r\nAUTH S3CRET\r\nAUTH s3cret2\r\nAUTH s3cre\r\nPING\r\n",
        // HELLO: only with the password, which it may carry.
        b"HELLO\r\nHELLO 3\r\nHELLO 5\r\nHELLO x\r\nHELLO 3 FOO\r\nHELLO 3 AUTH default\r\n",
        b"HELLO 3 AUTH default wrong\r\nHELLO 3 AUTH bob s3cret\r\nHELLO 2 SETNAME n\r\n",
        b"HELLO 3 AUTH default s3cret SETNAME \"a b\"\r\nPING\r\nCLIENT GETNAME\r\n",
        // In, then a wrong password does not let the connection out.
        b"AUTH s3cret\r\nPING\r\nAUTH wrong\r\nPING\r\nCLIENT ID x\r\n",
        b"AUTH default s3cret\r\nCLIENT SETNAME n\r\nCLIENT GETNAME\r\nSELECT 0\r\n",
        b"PING\r\nAUTH s3cret\r\nECHO in\r\n",
        // The transaction commands, and INFO, before the password; EXEC's refusal reads as
        // its abort.
        b"EXEC\r\nEXEC x\r\nMULTI\r\nMULTI x\r\nDISCARD\r\nWATCH k\r\nUNWATCH\r\nINFO\r\n",
        b"AUTH s3cret\r\nMULTI\r\nAUTH s3cret\r\nPING\r\nEXEC\r\n",
    ] {
        cases.push(([r, b"AUTH s3cret\r\n"].concat(), true, false));
    }
    // QUIT and an HTTP request need no password: closed either way.
    for r in [
        &b"QUIT\r\n"[..],
        b"PING\r\nQUIT\r\n",
        b"POST / HTTP/1.1\r\nPING\r\n",
    ] {
        cases.push((r.to_vec(), false, false));
    }
    // HELLO with the password: the same shape of reply, then in.
    for r in [
        &b"HELLO 3 AUTH default s3cret\r\nPING\r\nCLIENT GETNAME\r\n"[..],
        b"HELLO 2 AUTH default s3cret SETNAME n\r\nCLIENT GETNAME\r\n",
    ] {
        cases.push((r.to_vec(), true, true));
    }
    assert_same_transcripts(redis.addr(), door.addr, &cases);
}
