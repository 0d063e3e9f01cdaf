//! The connection commands, answered as redis-server 7 answers them (its error texts
//! included; `tests/redis_parity.rs` compares them byte for byte): `PING`, `ECHO` (which
//! `redis-cli --pipe` uses to find the end of its replies), `QUIT`, `HELLO` (the protocol
//! switch), `AUTH` (the door's password if it has one, as Redis's `requirepass`; without one,
//! as a Redis whose default user has none), `SELECT 0`, `CLIENT SETNAME|GETNAME|SETINFO|ID`,
//! `COMMAND` (the door's own commands), `CONFIG GET` (what `redis-benchmark` asks on connect),
//! `INFO` (ioredis's ready check), `UNWATCH`, and the error for anything else. Like Redis, it
//! closes a connection whose command is `POST` or `Host:`: an HTTP request.

mod auth;

use auth::{NOAUTH_HELLO, WRONGPASS, logs_in};
pub(super) use auth::{may_run_unauthenticated, precheck};

use super::{Password, Session, wrong_arity};
use crate::codec::{Protocol, ReplyBuf, strict_i64};

/// A command of the door as `COMMAND` describes it: name, arity (negative: at least), flags,
/// first key, last key, key step.
type Info = (&'static str, i64, &'static [&'static str], i64, i64, i64);

const COMMANDS: [Info; 17] = [
    (
        "auth",
        -2,
        &["noscript", "loading", "stale", "fast", "no_auth"],
        0,
        0,
        0,
    ),
    ("cl.throttle", -5, &["write"], 1, 1, 1),
    ("client", -2, &[], 0, 0, 0),
    ("command", -1, &["loading", "stale"], 0, 0, 0),
    ("config", -2, &[], 0, 0, 0),
    (
        "discard",
        1,
        &["noscript", "loading", "stale", "fast", "allow_busy"],
        0,
        0,
        0,
    ),
    ("echo", 2, &["fast"], 0, 0, 0),
    (
        "exec",
        1,
        &["noscript", "loading", "stale", "skip_slowlog"],
        0,
        0,
        0,
    ),
    (
        "hello",
        -1,
        &["noscript", "loading", "stale", "fast", "no_auth"],
        0,
        0,
        0,
    ),
    ("info", -1, &["loading", "stale"], 0, 0, 0),
    (
        "multi",
        1,
        &["noscript", "loading", "stale", "fast", "allow_busy"],
        0,
        0,
        0,
    ),
    ("ping", -1, &["fast"], 0, 0, 0),
    (
        "quit",
        -1,
        &["noscript", "loading", "stale", "fast", "no_auth"],
        0,
        0,
        0,
    ),
    ("select", 2, &["loading", "stale", "fast"], 0, 0, 0),
    ("tollgate.check", -3, &["write"], 2, 2, 1),
    (
        "unwatch",
        1,
        &["noscript", "loading", "stale", "fast", "allow_busy"],
        0,
        0,
        0,
    ),
    (
        "watch",
        -2,
        &["noscript", "loading", "stale", "fast", "allow_busy"],
        1,
        -1,
        1,
    ),
];

/// The settings `CONFIG GET` knows: what `redis-benchmark` asks for (the door persists
/// nothing).
const CONFIG: [(&str, &str); 2] = [("save", ""), ("appendonly", "no")];

/// Runs a connection command (or answers that the command is unknown).
pub(super) fn execute(
    session: &mut Session,
    args: &[&[u8]],
    password: &Password,
    out: &mut ReplyBuf,
) {
    let name = args[0];
    let is = |command: &str| name.eq_ignore_ascii_case(command.as_bytes());
    if is("PING") {
        match args {
            [_] => out.raw(b"+PONG\r\n"),
            [_, message] => out.bulk(message),
            _ => wrong_arity(out, "ping"),
        }
    } else if is("ECHO") {
        match args {
            [_, message] => out.bulk(message),
            _ => wrong_arity(out, "echo"),
        }
    } else if is("QUIT") {
        out.raw(b"+OK\r\n");
        session.close = true;
    } else if is("HELLO") {
        hello(session, args, password, out);
    } else if is("AUTH") {
        auth::auth(session, args, password, out);
    } else if is("SELECT") {
        match args {
            [_, index] => match strict_i64(index).map(i32::try_from) {
                Some(Ok(0)) => out.raw(b"+OK\r\n"),
                Some(Ok(_)) => out.error(b"ERR DB index is out of range"),
                Some(Err(_)) => out.error(
                    b"ERR value is out of range, value must between -2147483648 and 2147483647",
                ),
                None => out.error(b"ERR value is not an integer or out of range"),
            },
            _ => wrong_arity(out, "select"),
        }
    } else if is("CLIENT") {
        client(session, args, out);
    } else if is("COMMAND") {
        command(args, out);
    } else if is("CONFIG") {
        config(args, out);
    } else if is("INFO") {
        info(args, out);
    } else if is("UNWATCH") {
        // Nothing is ever watched (WATCH is refused), so there is nothing to forget.
        match args.len() {
            1 => out.raw(b"+OK\r\n"),
            _ => wrong_arity(out, "unwatch"),
        }
    } else if is("POST") || is("HOST:") {
        // An HTTP request, maybe sent by a browser on a web page's behalf to smuggle commands
        // in its body: closed at once, unanswered, as Redis does.
        session.abort = true;
    } else {
        out.error(&unknown_command(args));
    }
}

/// `HELLO [protover [AUTH username password] [SETNAME clientname]]`, checked in Redis's order.
fn hello(session: &mut Session, args: &[&[u8]], password: &Password, out: &mut ReplyBuf) {
    let mut protocol = None;
    if let Some(version) = args.get(1) {
        match strict_i64(version) {
            None => return out.error(b"ERR Protocol version is not an integer or out of range"),
            Some(2) => protocol = Some(Protocol::Resp2),
            Some(3) => protocol = Some(Protocol::Resp3),
            Some(_) => return out.error(b"NOPROTO unsupported protocol version"),
        }
    }
    let mut user = None;
    let mut name = None;
    let mut j = 2;
    while j < args.len() {
        let more = args.len() - 1 - j;
        let option = args[j];
        if option.eq_ignore_ascii_case(b"AUTH") && more >= 2 {
            user = Some((args[j + 1], args[j + 2]));
            j += 3;
        } else if option.eq_ignore_ascii_case(b"SETNAME") && more >= 1 {
            name = Some(args[j + 1]);
            j += 2;
        } else {
            let mut e = b"ERR Syntax error in HELLO option '".to_vec();
            e.extend_from_slice(c_string(option));
            e.push(b'\'');
            return out.error(&e);
        }
    }
    if let Some((user, given)) = user {
        if !logs_in(user, given, password.current().as_deref()) {
            return out.error(WRONGPASS);
        }
        session.authenticated = true;
    }
    if !session.authenticated {
        return out.error(NOAUTH_HELLO);
    }
    if let Some(name) = name
        && !set_name(session, name, out)
    {
        return;
    }
    if let Some(protocol) = protocol {
        out.set_protocol(protocol);
    }
    out.map(7);
    out.bulk(b"server");
    out.bulk(b"tollgate");
    out.bulk(b"version");
    out.bulk(env!("CARGO_PKG_VERSION").as_bytes());
    out.bulk(b"proto");
    out.integer(out.protocol().version());
    out.bulk(b"id");
    out.integer(i64::try_from(session.id).unwrap_or(i64::MAX));
    out.bulk(b"mode");
    out.bulk(b"standalone");
    out.bulk(b"role");
    out.bulk(b"master");
    out.bulk(b"modules");
    out.array(0);
}

/// Sets (or, empty, clears) the connection's name; false once it has answered an error.
fn set_name(session: &mut Session, name: &[u8], out: &mut ReplyBuf) -> bool {
    if name.iter().any(|&b| !(b'!'..=b'~').contains(&b)) {
        out.error(b"ERR Client names cannot contain spaces, newlines or special characters.");
        return false;
    }
    session.name = (!name.is_empty()).then(|| name.to_vec());
    true
}

/// `CLIENT SETNAME | GETNAME | SETINFO | ID`.
fn client(session: &mut Session, args: &[&[u8]], out: &mut ReplyBuf) {
    let Some(sub) = args.get(1) else {
        return wrong_arity(out, "client");
    };
    let is = |s: &str| sub.eq_ignore_ascii_case(s.as_bytes());
    if is("SETNAME") {
        match args {
            [_, _, name] => {
                if set_name(session, name, out) {
                    out.raw(b"+OK\r\n");
                }
            }
            _ => wrong_arity(out, "client|setname"),
        }
    } else if is("GETNAME") {
        match (args.len(), &session.name) {
            (2, Some(name)) => out.bulk(name),
            (2, None) => out.null(),
            _ => wrong_arity(out, "client|getname"),
        }
    } else if is("ID") {
        match args.len() {
            2 => out.integer(i64::try_from(session.id).unwrap_or(i64::MAX)),
            _ => wrong_arity(out, "client|id"),
        }
    } else if is("SETINFO") {
        // Redis 7.2's: client libraries send their name and version on connect.
        match args {
            [_, _, attr, _]
                if attr.eq_ignore_ascii_case(b"LIB-NAME")
                    || attr.eq_ignore_ascii_case(b"LIB-VER") =>
            {
                out.raw(b"+OK\r\n")
            }
            [_, _, attr, _] => {
                let mut e = b"ERR Unrecognized option '".to_vec();
                e.extend_from_slice(c_string(attr));
                e.push(b'\'');
                out.error(&e);
            }
            _ => wrong_arity(out, "client|setinfo"),
        }
    } else {
        unknown_subcommand(out, sub, "CLIENT");
    }
}

/// `COMMAND`, `COMMAND COUNT | LIST | INFO name... | DOCS [name...]`.
fn command(args: &[&[u8]], out: &mut ReplyBuf) {
    let Some(sub) = args.get(1) else {
        out.array(COMMANDS.len());
        for info in &COMMANDS {
            command_info(out, info);
        }
        return;
    };
    let is = |s: &str| sub.eq_ignore_ascii_case(s.as_bytes());
    if is("COUNT") {
        match args.len() {
            2 => out.integer(COMMANDS.len() as i64),
            _ => wrong_arity(out, "command|count"),
        }
    } else if is("LIST") {
        out.array(COMMANDS.len());
        for (name, ..) in &COMMANDS {
            out.bulk(name.as_bytes());
        }
    } else if is("INFO") {
        let names = &args[2..];
        if names.is_empty() {
            return command(&args[..1], out);
        }
        out.array(names.len());
        for name in names {
            match COMMANDS
                .iter()
                .find(|info| name.eq_ignore_ascii_case(info.0.as_bytes()))
            {
                Some(info) => command_info(out, info),
                None => out.null(),
            }
        }
    } else if is("DOCS") {
        // No documentation to give: clients (redis-cli's hints) fall back to their own.
        out.map(0);
    } else {
        unknown_subcommand(out, sub, "COMMAND");
    }
}

/// One command's entry in `COMMAND`'s reply, in Redis 7's ten fields.
fn command_info(out: &mut ReplyBuf, &(name, arity, flags, first, last, step): &Info) {
    out.array(10);
    out.bulk(name.as_bytes());
    out.integer(arity);
    out.set(flags.len());
    for flag in flags {
        out.simple(flag.as_bytes());
    }
    out.integer(first);
    out.integer(last);
    out.integer(step);
    out.set(0); // ACL categories
    out.set(0); // tips
    out.array(0); // key specifications
    out.array(0); // subcommands
}

/// `CONFIG GET parameter...`: `save` and `appendonly` (or `*`), as a map.
fn config(args: &[&[u8]], out: &mut ReplyBuf) {
    let Some(sub) = args.get(1) else {
        return wrong_arity(out, "config");
    };
    if !sub.eq_ignore_ascii_case(b"GET") {
        return unknown_subcommand(out, sub, "CONFIG");
    }
    if args.len() < 3 {
        return wrong_arity(out, "config|get");
    }
    // Each setting once, named as first asked for (Redis echoes a name without wildcards as
    // it was written).
    let mut found: Vec<(&[u8], &str)> = Vec::new();
    for &(key, value) in &CONFIG {
        let asked = args[2..]
            .iter()
            .find(|p| **p == b"*" || p.eq_ignore_ascii_case(key.as_bytes()));
        match asked {
            Some(&p) if p != b"*" => found.push((p, value)),
            Some(_) => found.push((key.as_bytes(), value)),
            None => {}
        }
    }
    out.map(found.len());
    for (key, value) in found {
        out.bulk(key);
        out.bulk(value.as_bytes());
    }
}

/// The `redis_version` `INFO` reports: not Tollgate's version (that is `tollgate_version`) but
/// the Redis whose answers the door gives, for clients that look at it.
pub(crate) const REDIS_VERSION: &str = "7.2.0";

/// `INFO [section ...]`: the sections a client reads on connect (ioredis's ready check reads
/// `loading`), in Redis's format: `# Name` then `field:value` lines, CRLF, a blank line between
/// sections. No section (or `default`, `all`, `everything`) gives all three; an unknown one
/// none, as Redis 7.
fn info(args: &[&[u8]], out: &mut ReplyBuf) {
    const SECTIONS: [&str; 3] = ["server", "persistence", "replication"];
    let everything = args.len() == 1
        || args[1..].iter().any(|a| {
            [&b"default"[..], b"all", b"everything"]
                .iter()
                .any(|all| a.eq_ignore_ascii_case(all))
        });
    let mut text = String::new();
    for section in SECTIONS {
        if !everything
            && !args[1..]
                .iter()
                .any(|a| a.eq_ignore_ascii_case(section.as_bytes()))
        {
            continue;
        }
        if !text.is_empty() {
            text.push_str("\r\n");
        }
        match section {
            "server" => {
                text.push_str("# Server\r\n");
                text.push_str(&format!("redis_version:{REDIS_VERSION}\r\n"));
                text.push_str(concat!(
                    "tollgate_version:",
                    env!("CARGO_PKG_VERSION"),
                    "\r\n"
                ));
                text.push_str("redis_mode:standalone\r\n");
            }
            "persistence" => text.push_str("# Persistence\r\nloading:0\r\nasync_loading:0\r\n"),
            _ => text.push_str("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n"),
        }
    }
    out.verbatim(*b"txt", text.as_bytes());
}

/// Redis's text for an unknown subcommand of `parent` (uppercase).
fn unknown_subcommand(out: &mut ReplyBuf, sub: &[u8], parent: &str) {
    let sub = c_string(sub);
    let mut e = b"ERR unknown subcommand '".to_vec();
    e.extend_from_slice(&sub[..sub.len().min(128)]);
    e.extend_from_slice(format!("'. Try {parent} HELP.").as_bytes());
    out.error(&e);
}

/// Redis's text for an unknown command: its name and the start of its arguments, each as C
/// reads it (up to a NUL), 128 bytes of each at most.
fn unknown_command(args: &[&[u8]]) -> Vec<u8> {
    let name = c_string(args[0]);
    let mut e = b"ERR unknown command '".to_vec();
    e.extend_from_slice(&name[..name.len().min(128)]);
    e.extend_from_slice(b"', with args beginning with: ");
    let mut shown = Vec::new();
    for arg in &args[1..] {
        if shown.len() >= 128 {
            break;
        }
        let arg = c_string(arg);
        let room = 128 - shown.len();
        shown.push(b'\'');
        shown.extend_from_slice(&arg[..arg.len().min(room)]);
        shown.extend_from_slice(b"' ");
    }
    e.extend_from_slice(&shown);
    e
}

/// `bytes` up to its first NUL, as C's `%s` prints it.
fn c_string(bytes: &[u8]) -> &[u8] {
    &bytes[..memchr::memchr(0, bytes).unwrap_or(bytes.len())]
}
