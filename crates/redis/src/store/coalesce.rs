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
//! connection within a single poll: the driver then finds them all waiting and writes them
//! together. Before it takes the queue, the flusher yields once, so the callers that are ready
//! to run queue theirs first. Each command still gets its own reply, error and timeout.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Cmd, ErrorKind, RedisError, RedisResult, Value};
use tokio::sync::{Notify, oneshot};

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

    /// Sends `cmd` with the other commands queued now; its reply.
    pub(crate) async fn call(&self, cmd: Cmd) -> RedisResult<Value> {
        let (reply, answer) = oneshot::channel();
        let first = {
            let mut jobs = lock(&self.shared.jobs);
            jobs.push(Job { cmd, reply });
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
                let jobs = std::mem::take(&mut *lock(&shared.jobs));
                if !jobs.is_empty() {
                    shared.batches.fetch_add(1, Ordering::Relaxed);
                }
                for Job { cmd, reply } in jobs {
                    let mut conn = shared.manager.clone();
                    in_flight.push(async move {
                        // As `Cmd::query_async` reads it: a server error is an `Err`.
                        let answer = conn
                            .req_packed_command(&cmd)
                            .await
                            .and_then(Value::extract_error);
                        // The caller may have stopped waiting (its timeout): nothing to do.
                        let _ = reply.send(answer);
                    });
                }
            }
        }
    }
    while in_flight.next().await.is_some() {}
    drop(alive);
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

fn dropped() -> RedisError {
    RedisError::from((
        ErrorKind::Io,
        "the connection's flusher stopped (its runtime shut down)",
    ))
}
