//! What the door answers: [`Handler`] runs one parsed request against a connection's
//! [`Session`] and writes its reply. The rate-limiting commands are here; the connection
//! commands clients send on connect (`HELLO`, `CLIENT`, `COMMAND`...) are in [`connection`],
//! and `MULTI`/`EXEC` in [`transaction`].

mod connection;
mod transaction;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use smallvec::SmallVec;
use tollgate::{Clock, Limiter, MemoryStore, Store, SystemClock};

use crate::codec::{ReplyBuf, Request};
use crate::decide::{Decide, LimiterDecide};
use crate::throttle::{QuotaSlots, Throttle};

/// Everything the door needs to answer: [`Decide`] for `TOLLGATE.CHECK`, [`Throttle`] for
/// `CL.THROTTLE`, and the password clients must give first, if any.
#[derive(Debug)]
pub struct Handler<D, S = MemoryStore, C = SystemClock> {
    decide: D,
    throttle: Throttle<S, C>,
    /// The id the next connection gets (`HELLO`'s `id`, `CLIENT ID`).
    next_id: AtomicU64,
    password: Password,
}

/// Where the door's password comes from: none, or a source read at each new connection and at
/// each `AUTH`, so that a new password (a reloaded configuration) applies to new connections
/// while those already in stay in, as with Redis's `CONFIG SET requirepass`.
#[derive(Clone, Default)]
pub(crate) struct Password(Option<Arc<PasswordSource>>);

/// What [`Handler::with_password_from`] reads the password from.
type PasswordSource = dyn Fn() -> Option<Arc<[u8]>> + Send + Sync;

impl Password {
    /// The password now; `None` when none is asked for.
    pub(crate) fn current(&self) -> Option<Arc<[u8]>> {
        self.0.as_ref().and_then(|source| source())
    }
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Password(<redacted>)"
        } else {
            "Password(None)"
        })
    }
}

impl<D: Decide, S: Store, C: Clock> Handler<D, S, C> {
    /// `TOLLGATE.CHECK` decided by `decide`, `CL.THROTTLE` by `throttle`.
    pub fn new(decide: D, throttle: Throttle<S, C>) -> Self {
        Handler {
            decide,
            throttle,
            next_id: AtomicU64::new(1),
            password: Password::default(),
        }
    }

    /// Asks every client for `password` before any other command, as Redis's `requirepass`
    /// does for its `default` user: `AUTH password` (or `AUTH default password`, or `HELLO 3
    /// AUTH default password`). Until then, commands are answered `-NOAUTH Authentication
    /// required.`; a wrong password `-WRONGPASS ...`.
    pub fn with_password(self, password: impl Into<Arc<[u8]>>) -> Self {
        let password: Arc<[u8]> = password.into();
        self.with_password_from(move || Some(Arc::clone(&password)))
    }

    /// [`with_password`](Self::with_password), the password read from `source` at each new
    /// connection and at each `AUTH`: a new password applies to new connections (and to
    /// `AUTH`), while connections already in stay in; `None` asks for none.
    pub fn with_password_from(
        self,
        source: impl Fn() -> Option<Arc<[u8]>> + Send + Sync + 'static,
    ) -> Self {
        Handler {
            password: Password(Some(Arc::new(source))),
            ..self
        }
    }

    /// The decider of `TOLLGATE.CHECK`.
    pub fn decide(&self) -> &D {
        &self.decide
    }

    /// `CL.THROTTLE`.
    pub fn throttle(&self) -> &Throttle<S, C> {
        &self.throttle
    }

    /// The state of a new connection, whose transactions queue at most `max_queued` commands
    /// and `max_queued_bytes` bytes of arguments.
    pub(crate) fn session(&self, max_queued: usize, max_queued_bytes: usize) -> Session {
        Session {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            name: None,
            slots: QuotaSlots::default(),
            authenticated: self.password.current().is_none(),
            multi: None,
            exec: Vec::new().into_iter(),
            max_queued,
            max_queued_bytes,
            close: false,
            abort: false,
        }
    }

    /// Runs `request` (not empty) and writes its reply to `out`.
    pub(crate) async fn execute(
        &self,
        session: &mut Session,
        request: &Request<'_>,
        out: &mut ReplyBuf,
    ) {
        let args: SmallVec<[&[u8]; 8]> = request.iter().collect();
        let Some(&name) = args.first() else {
            return;
        };
        if !session.authenticated
            && !connection::may_run_unauthenticated(session, &args, &self.password, out)
        {
            return;
        }
        // The two rate-limiting commands first: they are nearly all of the traffic, and
        // outside a transaction they need no more than a look at the session.
        if session.multi.is_none()
            && (name.eq_ignore_ascii_case(b"CL.THROTTLE")
                || name.eq_ignore_ascii_case(b"TOLLGATE.CHECK"))
        {
            return self.run(session, &args, out).await;
        }
        match transaction::step(session, &args, out) {
            transaction::Step::Run => self.run(session, &args, out).await,
            transaction::Step::Done => {}
            transaction::Step::Exec(queued) => {
                // The array is RESP2's and RESP3's alike; its elements are the queued commands'
                // replies, each run by `exec_next` in turn.
                out.array(queued.len());
                session.exec = queued.into_iter();
            }
        }
    }

    /// Whether an `EXEC` has queued commands still to run ([`Handler::exec_next`]).
    pub(crate) fn exec_pending(session: &Session) -> bool {
        session.exec.len() > 0
    }

    /// Runs the next command of the `EXEC` under way, writing its reply after those before it.
    ///
    /// One at a time, so that the connection writes the replies as they grow, as it writes a
    /// pipeline's, instead of holding them all: a transaction of a thousand `COMMAND` calls is
    /// 17 KB sent and 1.4 MB answered, and connections that sent such transactions and never
    /// read held it all in memory.
    pub(crate) async fn exec_next(&self, session: &mut Session, out: &mut ReplyBuf) {
        if let Some(command) = session.exec.next() {
            let args: SmallVec<[&[u8]; 8]> = command.iter().map(Vec::as_slice).collect();
            self.run(session, &args, out).await;
        }
    }

    /// Runs one command (not a transaction command) and writes its reply.
    async fn run(&self, session: &mut Session, args: &[&[u8]], out: &mut ReplyBuf) {
        let name = args[0];
        if name.eq_ignore_ascii_case(b"CL.THROTTLE") {
            self.cl_throttle(session, args, out).await;
        } else if name.eq_ignore_ascii_case(b"TOLLGATE.CHECK") {
            self.tollgate_check(args, out).await;
        } else {
            connection::execute(session, args, &self.password, out);
        }
    }

    async fn cl_throttle(&self, session: &mut Session, args: &[&[u8]], out: &mut ReplyBuf) {
        // A store that cannot decide is answered by the decider's failure rule, the one
        // `TOLLGATE.CHECK` follows.
        let on_store_error =
            |e: tollgate::Error| self.decide.store_failed(e).map_err(|e| format!("ERR {e}"));
        match self
            .throttle
            .throttle_with(&mut session.slots, &args[1..], on_store_error)
            .await
        {
            Ok(reply) => {
                out.array(5);
                for n in reply.to_array() {
                    out.integer(n);
                }
            }
            Err(e) => out.error(e.message().as_bytes()),
        }
    }

    async fn tollgate_check(&self, args: &[&[u8]], out: &mut ReplyBuf) {
        let (policy, key, cost) = match args {
            [_, policy, key] => (*policy, *key, Some(1)),
            [_, policy, key, cost] => (
                *policy,
                *key,
                crate::codec::strict_i64(cost).and_then(|c| u32::try_from(c).ok()),
            ),
            _ => return wrong_arity(out, "tollgate.check"),
        };
        let Some(cost) = cost else {
            return out.error(b"ERR cost must be an integer from 0 to 4294967295");
        };
        match self.decide.check(policy, key, cost).await {
            Ok(reply) => {
                let values = reply.to_array();
                match out.protocol() {
                    crate::Protocol::Resp2 => {
                        out.array(5);
                        for n in values {
                            out.integer(n);
                        }
                    }
                    crate::Protocol::Resp3 => {
                        out.map(5);
                        for (field, n) in CHECK_FIELDS.iter().zip(values) {
                            out.bulk(field.as_bytes());
                            out.integer(n);
                        }
                    }
                }
            }
            Err(e) => out.error(format!("ERR {e}").as_bytes()),
        }
    }
}

/// The names of `TOLLGATE.CHECK`'s answer in RESP3, in the order of the RESP2 array.
pub const CHECK_FIELDS: [&str; 5] = ["allowed", "limit", "remaining", "reset", "retry_after"];

impl<S: Store, C: Clock> Handler<LimiterDecide<S, C>, S, C> {
    /// Both commands over one limiter: `TOLLGATE.CHECK` against its policies, `CL.THROTTLE`
    /// in its store.
    pub fn for_limiter(limiter: Limiter<S, C>) -> Self {
        Handler::new(LimiterDecide::new(limiter.clone()), Throttle::new(limiter))
    }
}

/// One connection's state.
#[derive(Debug)]
pub(crate) struct Session {
    id: u64,
    /// `CLIENT SETNAME`'s.
    name: Option<Vec<u8>>,
    /// The `CL.THROTTLE` quotas this connection used last.
    slots: QuotaSlots,
    /// Whether it may run commands: no password was asked for when it connected, or it gave
    /// the password.
    authenticated: bool,
    /// The transaction `MULTI` opened, until `EXEC` or `DISCARD`.
    multi: Option<transaction::Transaction>,
    /// The commands of an `EXEC` not run yet.
    exec: std::vec::IntoIter<transaction::Queued>,
    /// The most commands a transaction queues.
    max_queued: usize,
    /// The most bytes of arguments a transaction queues.
    max_queued_bytes: usize,
    /// Set by `QUIT`: close once the replies are written.
    pub(crate) close: bool,
    /// Set by an HTTP request line: close at once, dropping the batch's replies.
    pub(crate) abort: bool,
}

impl Session {
    /// Whether the connection may run commands (no password asked, or it was given).
    pub(crate) fn authenticated(&self) -> bool {
        self.authenticated
    }
}

/// Redis's reply to a command called with the wrong number of arguments; `name` is the
/// command's lowercase name (`client|setname` for a subcommand).
fn wrong_arity(out: &mut ReplyBuf, name: &str) {
    out.error(format!("ERR wrong number of arguments for '{name}' command").as_bytes());
}
