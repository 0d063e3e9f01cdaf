//! The door's password (Redis's `requirepass`) over raw sockets: the rate-limiting commands
//! wait for it like any other, and a password read from a source applies to new connections
//! when it changes, while connections already in stay in, and lifting it lets everyone in.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::sync::{Arc, Mutex};

use common::*;
use tollgate_resp::{Handler, Limits};

/// Sends `command` and reads its reply of `n` bytes.
fn ask(s: &mut TcpStream, command: &[u8], n: usize) -> String {
    s.write_all(command).unwrap();
    String::from_utf8_lossy(&read_n(s, n)).into_owned()
}

const NOAUTH: &str = "-NOAUTH Authentication required.\r\n";
const WRONGPASS: &str = "-WRONGPASS invalid username-password pair or user is disabled.\r\n";

#[test]
fn the_rate_limiting_commands_wait_for_the_password() {
    let door = start_with(
        Handler::for_limiter(limiter()).with_password(&b"s3cret"[..]),
        Limits::default(),
    );
    let mut s = connect(door.addr);
    assert_eq!(
        ask(&mut s, b"CL.THROTTLE k 1 1 1\r\n", NOAUTH.len()),
        NOAUTH
    );
    assert_eq!(
        ask(&mut s, b"TOLLGATE.CHECK tiny k\r\n", NOAUTH.len()),
        NOAUTH
    );
    // Their arity is checked first, as Redis checks every command's.
    let arity = "-ERR wrong number of arguments for 'tollgate.check' command\r\n";
    assert_eq!(ask(&mut s, b"TOLLGATE.CHECK tiny\r\n", arity.len()), arity);
    assert_eq!(ask(&mut s, b"AUTH s3cret\r\n", 5), "+OK\r\n");
    // Nothing was counted before: both of tiny's two requests are left.
    let admitted = "*5\r\n:1\r\n:2\r\n:1\r\n";
    assert_eq!(
        ask(&mut s, b"TOLLGATE.CHECK tiny k\r\n", admitted.len()),
        admitted
    );
}

#[test]
fn a_new_password_applies_to_new_connections_and_lifting_it_lets_everyone_in() {
    let current: Arc<Mutex<Option<Arc<[u8]>>>> = Arc::new(Mutex::new(Some(Arc::from(&b"one"[..]))));
    let source = Arc::clone(&current);
    let door = start_with(
        Handler::for_limiter(limiter()).with_password_from(move || source.lock().unwrap().clone()),
        Limits::default(),
    );
    let mut old = connect(door.addr);
    assert_eq!(ask(&mut old, b"AUTH one\r\n", 5), "+OK\r\n");
    let mut waiting = connect(door.addr);
    assert_eq!(ask(&mut waiting, b"PING\r\n", NOAUTH.len()), NOAUTH);

    *current.lock().unwrap() = Some(Arc::from(&b"two"[..]));
    // In before the change: still in.
    assert_eq!(ask(&mut old, b"PING\r\n", 7), "+PONG\r\n");
    // Anyone else needs the new one.
    let mut new = connect(door.addr);
    assert_eq!(ask(&mut new, b"AUTH one\r\n", WRONGPASS.len()), WRONGPASS);
    assert_eq!(ask(&mut new, b"AUTH default two\r\n", 5), "+OK\r\n");
    assert_eq!(
        ask(&mut waiting, b"AUTH one\r\n", WRONGPASS.len()),
        WRONGPASS
    );
    assert_eq!(ask(&mut waiting, b"PING\r\n", NOAUTH.len()), NOAUTH);

    // No password any more: the connection still waiting is let in, and new ones are.
    *current.lock().unwrap() = None;
    assert_eq!(ask(&mut waiting, b"PING\r\n", 7), "+PONG\r\n");
    let mut fresh = connect(door.addr);
    assert_eq!(ask(&mut fresh, b"PING\r\n", 7), "+PONG\r\n");
}

/// Before the password, a request is held to what `AUTH` and `HELLO` need, as Redis holds such
/// a client (10 arguments, 16 KiB): past either, a protocol error closes the connection, so a
/// client without the password cannot make the server hold the largest requests. Once in, the
/// connection takes requests up to the door's own bounds.
#[test]
fn before_the_password_requests_are_small() {
    let door = start_with(
        Handler::for_limiter(limiter()).with_password(&b"s3cret"[..]),
        Limits::default(),
    );
    let eleven: Vec<&[u8]> = std::iter::repeat_n(&b"x"[..], 11).collect();
    let big = vec![b'a'; 20 * 1024];
    for request in [frame(&eleven), frame(&[b"ECHO", &big])] {
        let mut s = connect(door.addr);
        s.write_all(&request).unwrap();
        let answer = read_to_eof(&mut s, std::time::Duration::from_secs(10))
            .expect("the connection is closed");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("-ERR Protocol error"), "{answer}");
    }
    // AUTH fits within them; once in, the big request is answered.
    let mut s = connect(door.addr);
    assert_eq!(ask(&mut s, b"AUTH s3cret\r\n", 5), "+OK\r\n");
    let echoed = ask(&mut s, &frame(&[b"ECHO", &big]), big.len() + 10);
    assert!(echoed.starts_with("$20480\r\naaa"), "{}", &echoed[..20]);
}
