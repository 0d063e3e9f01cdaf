//! One write for the script calls that tasks make at about the same time (standalone Redis).
//!
//! Why: on a multi-thread tokio runtime, a task that hands a command to the `redis` crate's
//! multiplexed connection wakes the connection's driver into the worker's LIFO slot, so the
//! driver runs right after that one task and writes its one command: one `writev` per decision
//! for the client and one read per decision for Redis. With 50 callers on one worker that was
//! a fifth of the client's CPU (`bench_redis`: one `writev` per decision; a current-thread
//! runtime, which has no LIFO slot, wrote about 40 commands per `writev`).
//!
//! Here callers queue their command and one flusher task hands every queued command to the
//! connection as one pipeline (one request to the connection's driver, one write). Before it
//! takes the queue, the flusher yields once, so the callers that are ready to run queue theirs
//! first. Each command still gets its own reply, error and timeout: a pipeline that is not a
//! transaction answers each command separately (a server error, such as `NOSCRIPT`, is that
//! command's reply), and the batch fails as a whole only when the connection does.
//!
//! The calls' timeout is kept here too, with one timer per batch instead of one per call: each
//! call brings its deadline (the store's `timeout` after the call began), and a batch that has
//! not been answered by the earliest deadline among its calls fails them all with a timeout
//! (the calls of one batch were queued within one turn of the flusher, microseconds apart). A
//! timer per call was about a tenth of the client's instructions per decision (callgrind).
//!
//! One pipeline rather than one request per command: each request costs the client a clone of
//! the connection handle, a boxed future, a channel message and a oneshot on the driver's side
//! (`perf` on `bench_redis`: about a fifth of the client's CPU per decision); a batch pays them
//! once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisResult, Value};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

/// The queue in front of one connection; dropping it stops its flusher.
pub(crate) struct Coalescer {
    shared: Arc<Shared>,
}

struct Shared {
    manager: ConnectionManager,
    jobs: Mutex<Vec<Job>>,
    /// A permit when jobs were queued into an empty queue, or the coalescer was dropped.
    wake: Notify,
    /// Whether a flusher task is alive (it dies with the runtime that spawned it; the next
    /// call then starts one on its own runtime).
    flusher: AtomicBool,
    closed: AtomicBool,
    /// Batches handed to the connection (calls / batches: how many shared a write, at most).
    batches: AtomicU64,
}

struct Job {
    cmd: Cmd,
    deadline: Instant,
    reply: oneshot::Sender<RedisResult<Value>>,
}

impl Coalescer {
    pub(crate) fn new(manager: ConnectionManager) -> Self {
        Coalescer {
            shared: Arc::new(Shared {
                manager,
                jobs: Mutex::new(Vec::new()),
                wake: Notify::new(),
                flusher: AtomicBool::new(false),
                closed: AtomicBool::new(false),
                batches: AtomicU64::new(0),
            }),
        }
    }

    /// Sends `cmd` with the other commands queued now; its reply, or a timeout error (see
    /// [`is_timeout`](RedisError::is_timeout)) when none came by `deadline`.
    pub(crate) async fn call(&self, cmd: Cmd, deadline: Instant) -> RedisResult<Value> {
        let (reply, answer) = oneshot::channel();
        let first = {
            let mut jobs = lock(&self.shared.jobs);
            jobs.push(Job {
                cmd,
                deadline,
                reply,
            });
            jobs.len() == 1
        };
        if !self.shared.flusher.load(Ordering::Acquire)
            && !self.shared.flusher.swap(true, Ordering::AcqRel)
        {
            tokio::spawn(flush(self.shared.clone()));
        }
        if first {
            self.shared.wake.notify_one();
        }
        answer.await.unwrap_or_else(|_| Err(dropped()))
    }

    /// Batches handed to the connection so far.
    pub(crate) fn batches(&self) -> u64 {
        self.shared.batches.load(Ordering::Relaxed)
    }
}

impl Drop for Coalescer {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.wake.notify_one();
    }
}

/// The flusher: takes the queue whenever it fills and drives its commands to their replies,
/// until the coalescer is dropped and nothing is in flight.
async fn flush(shared: Arc<Shared>) {
    let alive = Alive(&shared);
    let mut in_flight = FuturesUnordered::new();
    // The queue's spare buffer: swapped in when the queue is taken, so it keeps its capacity.
    let mut spare = Vec::new();
    loop {
        tokio::select! {
            biased;
            Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
            () = shared.wake.notified() => {
                if shared.closed.load(Ordering::Acquire) {
                    break;
                }
                // Behind the tasks that are ready to run: they queue their calls first.
                tokio::task::yield_now().await;
                let mut jobs = std::mem::replace(&mut *lock(&shared.jobs), spare);
                if !jobs.is_empty() {
                    shared.batches.fetch_add(1, Ordering::Relaxed);
                    in_flight.push(send(shared.manager.clone(), &mut jobs));
                }
                spare = jobs;
            }
        }
    }
    while in_flight.next().await.is_some() {}
    drop(alive);
}

/// Sends `jobs` (drained) as one pipeline and hands each its reply, or a timeout at the
/// earliest of their deadlines.
fn send(mut conn: ConnectionManager, jobs: &mut Vec<Job>) -> impl Future<Output = ()> + use<> {
    let mut pipeline = Pipeline::with_capacity(jobs.len());
    let mut replies = Vec::with_capacity(jobs.len());
    let mut deadline = None;
    for Job {
        cmd,
        deadline: due,
        reply,
    } in jobs.drain(..)
    {
        pipeline.add_command(cmd);
        replies.push(reply);
        deadline = Some(deadline.map_or(due, |d: Instant| d.min(due)));
    }
    async move {
        let count = replies.len();
        let request = conn.req_packed_commands(&pipeline, 0, count);
        let answers = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, request)
                .await
                .unwrap_or_else(|_| Err(timed_out())),
            None => request.await,
        };
        // The callers may have stopped waiting (their timeout): nothing to do then.
        match answers {
            Ok(values) if values.len() == count => {
                for (value, reply) in values.into_iter().zip(replies) {
                    // As `Cmd::query_async` reads it: a server error is an `Err`.
                    let _ = reply.send(value.extract_error());
                }
            }
            other => {
                let error = other.err().unwrap_or_else(|| {
                    RedisError::from((ErrorKind::Parse, "a pipeline's replies were miscounted"))
                });
                for reply in replies {
                    let _ = reply.send(Err(error.clone()));
                }
            }
        }
    }
}

/// Marks the flusher gone when its task ends or is dropped with its runtime, and fails the
/// calls still queued, so no caller waits for a flusher that no longer exists.
struct Alive<'a>(&'a Shared);

impl Drop for Alive<'_> {
    fn drop(&mut self) {
        self.0.flusher.store(false, Ordering::Release);
        lock(&self.0.jobs).clear();
    }
}

fn lock(jobs: &Mutex<Vec<Job>>) -> MutexGuard<'_, Vec<Job>> {
    jobs.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The error of calls whose batch was not answered by their deadline.
fn timed_out() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no reply from Redis within the timeout",
    ))
}

fn dropped() -> RedisError {
    RedisError::from((
        ErrorKind::Io,
        "the connection's flusher stopped (its runtime shut down)",
    ))
}
