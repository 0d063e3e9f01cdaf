//! Who may run commands: the door's password, as Redis's `requirepass` (`AUTH`, and the
//! checks a command passes before a connection has given it); `HELLO ... AUTH` is in
//! [`hello`](super::hello), through [`logs_in`].

use super::super::{Password, Session, wrong_arity};
use super::{COMMANDS, Info, unknown_command, unknown_subcommand};
use crate::codec::ReplyBuf;

/// The subcommands the door knows and their arity (negative: at least), which Redis checks,
/// with the command's own, before it asks for authentication.
const SUBCOMMANDS: [(&str, &str, i64); 9] = [
    ("client", "setname", 3),
    ("client", "getname", 2),
    ("client", "id", 2),
    ("client", "setinfo", 4),
    ("command", "count", 2),
    ("command", "list", -2),
    ("command", "info", -2),
    ("command", "docs", -2),
    ("config", "get", -3),
];

const NOAUTH: &[u8] = b"NOAUTH Authentication required.";

/// Whether a connection that has not given the password may run `args`, checked as Redis
/// checks it: an unknown command or subcommand, or a wrong number of arguments, is answered as
/// such (written here); then only `AUTH`, `HELLO` and `QUIT` run, and anything else is
/// answered `-NOAUTH`. An HTTP request runs (to be closed), and so does everything once no
/// password is asked for any more (a reload took it away).
pub(in crate::handler) fn may_run_unauthenticated(
    session: &mut Session,
    args: &[&[u8]],
    password: &Password,
    out: &mut ReplyBuf,
) -> bool {
    let name = args[0];
    if password.current().is_none() {
        session.authenticated = true;
        return true;
    }
    if name.eq_ignore_ascii_case(b"POST") || name.eq_ignore_ascii_case(b"HOST:") {
        return true;
    }
    let Some(&(command, _, flags, ..)) = precheck(args, out) else {
        return false;
    };
    if flags.contains(&"no_auth") {
        return true;
    }
    reject(out, command, NOAUTH);
    false
}

/// What Redis checks of every command before it runs or queues it: that the command (and its
/// subcommand, for those the door has) exists, and that the number of arguments fits its
/// arity. The command's entry, or `None` once the error is written.
pub(in crate::handler) fn precheck(args: &[&[u8]], out: &mut ReplyBuf) -> Option<&'static Info> {
    let name = args[0];
    let Some(info) = COMMANDS
        .iter()
        .find(|info| name.eq_ignore_ascii_case(info.0.as_bytes()))
    else {
        out.error(&unknown_command(args));
        return None;
    };
    let &(command, arity, ..) = info;
    if !arity_fits(arity, args.len()) {
        let text = format!("ERR wrong number of arguments for '{command}' command");
        reject(out, command, text.as_bytes());
        return None;
    }
    if let Some(&sub) = args.get(1)
        && SUBCOMMANDS.iter().any(|(parent, ..)| *parent == command)
    {
        let Some((_, sub_name, sub_arity)) = SUBCOMMANDS
            .iter()
            .find(|(parent, s, _)| *parent == command && sub.eq_ignore_ascii_case(s.as_bytes()))
        else {
            unknown_subcommand(out, sub, &command.to_ascii_uppercase());
            return None;
        };
        if !arity_fits(*sub_arity, args.len()) {
            wrong_arity(out, &format!("{command}|{sub_name}"));
            return None;
        }
    }
    Some(info)
}

/// Answers `error` (its code first) to a command refused before it ran: as it is, but for
/// `EXEC`, which Redis answers `-EXECABORT Transaction discarded because of: ` and the error
/// without its `ERR`.
fn reject(out: &mut ReplyBuf, command: &str, error: &[u8]) {
    if command == "exec" {
        let reason = error.strip_prefix(b"ERR ").unwrap_or(error);
        let mut e = b"EXECABORT Transaction discarded because of: ".to_vec();
        e.extend_from_slice(reason);
        out.error(&e);
    } else {
        out.error(error);
    }
}

/// Whether `n` arguments (the command's name included) fit `arity`: exactly that many, or,
/// negative, at least its opposite.
fn arity_fits(arity: i64, n: usize) -> bool {
    let n = i64::try_from(n).unwrap_or(i64::MAX);
    if arity >= 0 { n == arity } else { n >= -arity }
}

pub(super) const WRONGPASS: &[u8] =
    b"WRONGPASS invalid username-password pair or user is disabled.";

pub(super) const NOAUTH_HELLO: &[u8] =
    b"NOAUTH HELLO must be called with the client already authenticated, \
    otherwise the HELLO AUTH <user> <pass> option can be used to authenticate the client and \
    select the RESP protocol version at the same time";

/// `AUTH [username] password`. With a password, the `default` user's, as Redis's
/// `requirepass`: the right one lets the connection in (a wrong one later does not let it
/// out). Without one, like a Redis whose `default` user has none: `default` gets in with any
/// password and any other user does not.
pub(super) fn auth(session: &mut Session, args: &[&[u8]], password: &Password, out: &mut ReplyBuf) {
    let (user, given) = match args {
        [_] => return wrong_arity(out, "auth"),
        [_, given] => (None, *given),
        [_, user, given] => (Some(*user), *given),
        _ => return out.error(b"ERR syntax error"),
    };
    let expected = password.current();
    if user.is_none() && expected.is_none() {
        return out.error(
            b"ERR AUTH <password> called without any password configured for the default user. \
              Are you sure your configuration is correct?",
        );
    }
    if logs_in(user.unwrap_or(b"default"), given, expected.as_deref()) {
        session.authenticated = true;
        out.raw(b"+OK\r\n");
    } else {
        out.error(WRONGPASS);
    }
}

/// Whether `user` with `given` logs in: the `default` user, with the `expected` password if
/// there is one (compared in time that does not depend on where they differ), with any without.
pub(super) fn logs_in(user: &[u8], given: &[u8], expected: Option<&[u8]>) -> bool {
    if user != b"default" {
        return false;
    }
    match expected {
        None => true,
        Some(expected) => {
            given.len() == expected.len()
                && given
                    .iter()
                    .zip(expected.iter())
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                    == 0
        }
    }
}
