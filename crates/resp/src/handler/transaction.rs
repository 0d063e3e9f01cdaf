//! `MULTI`, `EXEC`, `DISCARD` and `WATCH`, as Redis answers them (`tests/redis_parity.rs`
//! compares them byte for byte): after `MULTI`, commands are checked (known, with a fitting
//! number of arguments) and answered `+QUEUED`; `EXEC` runs them in order and answers the
//! array of their replies. A command refused while queueing marks the transaction, and `EXEC`
//! then discards it (`-EXECABORT`), as Redis does.
//!
//! Two differences, both documented: `WATCH` is refused (Tollgate's counts have no versions a
//! client could watch, and they change under every other client's decisions), and the queue is
//! bounded ([`Limits::max_pipeline`](crate::Limits) commands,
//! [`Limits::max_transaction_bytes`](crate::Limits) of arguments): past either, the queue is
//! dropped at once and the transaction marked, so that `EXEC` runs none of it.

use super::connection::precheck;
use super::{Session, wrong_arity};
use crate::codec::ReplyBuf;

/// A command queued after `MULTI`: its arguments, the name first.
pub(super) type Queued = Vec<Vec<u8>>;

/// An open transaction.
#[derive(Debug, Default)]
pub(super) struct Transaction {
    queued: Vec<Queued>,
    /// The bytes of the queued commands' arguments.
    bytes: usize,
    /// A command was refused while queueing (or the queue overflowed): `EXEC` discards it all.
    dirty: bool,
}

/// What the handler does with a command after the transaction has seen it.
pub(super) enum Step {
    /// Run it now.
    Run,
    /// Answered (queued, refused, or a transaction command done).
    Done,
    /// `EXEC`: run these in order and answer the array of their replies.
    Exec(Vec<Queued>),
}

/// Looks at `args` (not empty) as a transaction does: the transaction commands themselves,
/// and, between `MULTI` and `EXEC`, every other command, which is queued.
pub(super) fn step(session: &mut Session, args: &[&[u8]], out: &mut ReplyBuf) -> Step {
    let name = args[0];
    let is = |command: &str| name.eq_ignore_ascii_case(command.as_bytes());
    if is("MULTI") {
        if args.len() != 1 {
            refused(session);
            wrong_arity(out, "multi");
        } else if session.multi.is_some() {
            out.error(b"ERR MULTI calls can not be nested");
        } else {
            session.multi = Some(Transaction::default());
            out.raw(b"+OK\r\n");
        }
        Step::Done
    } else if is("EXEC") {
        let transaction = session.multi.take();
        if args.len() != 1 {
            // Redis discards the transaction, saying why.
            out.error(
                b"EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command",
            );
            return Step::Done;
        }
        match transaction {
            None => {
                out.error(b"ERR EXEC without MULTI");
                Step::Done
            }
            Some(t) if t.dirty => {
                out.error(b"EXECABORT Transaction discarded because of previous errors.");
                Step::Done
            }
            Some(t) => Step::Exec(t.queued),
        }
    } else if is("DISCARD") {
        if args.len() != 1 {
            refused(session);
            wrong_arity(out, "discard");
        } else if session.multi.take().is_some() {
            out.raw(b"+OK\r\n");
        } else {
            out.error(b"ERR DISCARD without MULTI");
        }
        Step::Done
    } else if is("WATCH") {
        if args.len() < 2 {
            refused(session);
            wrong_arity(out, "watch");
        } else if session.multi.is_some() {
            out.error(b"ERR WATCH inside MULTI is not allowed");
        } else {
            out.error(
                b"ERR WATCH is not supported: rate limit counts change with every client's \
                  decisions, so a watched key could never be trusted; EXEC runs the queued \
                  commands as they are",
            );
        }
        Step::Done
    } else if session.multi.is_none() || is("QUIT") || is("POST") || is("HOST:") {
        // QUIT runs at once inside a transaction too, as in Redis; so does closing on an
        // HTTP request.
        Step::Run
    } else {
        queue(session, args, out);
        Step::Done
    }
}

/// Queues `args` in the open transaction, or refuses it and marks the transaction.
fn queue(session: &mut Session, args: &[&[u8]], out: &mut ReplyBuf) {
    if precheck(args, out).is_none() {
        refused(session);
        return;
    }
    let (max_commands, max_bytes) = (session.max_queued, session.max_queued_bytes);
    let Some(transaction) = session.multi.as_mut() else {
        return;
    };
    if transaction.dirty {
        // EXEC will discard it: nothing is kept, but the client is answered as Redis answers.
        out.raw(b"+QUEUED\r\n");
        return;
    }
    let bytes: usize = args.iter().map(|a| a.len()).sum();
    let total = transaction.bytes.saturating_add(bytes);
    if transaction.queued.len() >= max_commands || total > max_bytes {
        *transaction = Transaction {
            dirty: true,
            ..Transaction::default()
        };
        out.error(
            format!(
                "ERR transaction discarded: MULTI queues at most {max_commands} commands and \
                 {max_bytes} bytes of arguments; EXEC will answer EXECABORT"
            )
            .as_bytes(),
        );
        return;
    }
    transaction.bytes = total;
    transaction
        .queued
        .push(args.iter().map(|a| a.to_vec()).collect());
    out.raw(b"+QUEUED\r\n");
}

/// Marks the open transaction, if any, as refused: `EXEC` will discard it.
pub(super) fn refused(session: &mut Session) {
    if let Some(t) = session.multi.as_mut() {
        t.dirty = true;
        t.queued = Vec::new();
        t.bytes = 0;
    }
}
