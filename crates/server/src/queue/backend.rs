//! Where a queue lives: one type over the Redis Streams queue and the in-memory one, so the
//! drainer, the proxy and the admin endpoints are written once.

use std::sync::Arc;
use std::time::Duration;

use tollgate::StoreError;
use tollgate_redis::stream_queue::{
    DeadLetter, MessageStatus, NewMessage, Pushed, QueueStats, QueuedMessage, Redriven, StreamQueue,
};

use super::memory::MemoryQueue;

/// A queue's storage.
#[derive(Clone, Debug)]
pub(crate) enum Backend {
    /// In this process: gone on restart.
    Memory(Arc<MemoryQueue>),
    /// Redis Streams, shared by every instance.
    Redis(StreamQueue),
}

/// How a delivery that failed for good is recorded.
pub(crate) struct Burial<'a> {
    pub(crate) message: &'a QueuedMessage,
    pub(crate) attempts: u32,
    pub(crate) status: Option<u16>,
    pub(crate) error: &'a str,
    /// In memory, the most dead letters kept.
    pub(crate) max_dead: u64,
}

impl Backend {
    /// Whether the queue outlives this process (and other instances share it).
    pub(crate) fn durable(&self) -> bool {
        matches!(self, Backend::Redis(_))
    }

    pub(crate) async fn push(
        &self,
        m: NewMessage<'_>,
        max_depth: u64,
    ) -> Result<Pushed, StoreError> {
        match self {
            Backend::Memory(q) => Ok(q.push(m, max_depth)),
            Backend::Redis(q) => q.push(m, max_depth).await,
        }
    }

    pub(crate) async fn read(&self, count: usize) -> Result<Vec<QueuedMessage>, StoreError> {
        match self {
            Backend::Memory(q) => Ok(q.read(count)),
            Backend::Redis(q) => q.read(count).await,
        }
    }

    /// Messages a stopped instance took (Redis); none in memory, where no other instance is.
    pub(crate) async fn claim(
        &self,
        count: usize,
        idle: Duration,
    ) -> Result<Vec<QueuedMessage>, StoreError> {
        match self {
            Backend::Memory(_) => Ok(Vec::new()),
            Backend::Redis(q) => q.claim(count, idle).await,
        }
    }

    /// Touches the entries this instance holds; those it no longer owns.
    pub(crate) async fn keep(&self, entries: &[&str]) -> Result<Vec<String>, StoreError> {
        match self {
            Backend::Memory(q) => Ok(q.keep(entries)),
            Backend::Redis(q) => q.keep(entries).await,
        }
    }

    /// Hands held entries back at once (shutdown). In memory they would only be lost anyway.
    pub(crate) async fn release(&self, entries: &[&str], idle: Duration) -> Result<(), StoreError> {
        match self {
            Backend::Memory(_) => Ok(()),
            Backend::Redis(q) => q.release(entries, idle).await,
        }
    }

    pub(crate) async fn attempt(&self, id: &str, now_ms: u64) -> Result<u32, StoreError> {
        match self {
            Backend::Memory(q) => Ok(q.attempt(id, now_ms)),
            Backend::Redis(q) => q.attempt(id, now_ms).await,
        }
    }

    pub(crate) async fn note(
        &self,
        id: &str,
        status: Option<u16>,
        error: &str,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        match self {
            Backend::Memory(q) => {
                q.note(id, status, error, now_ms);
                Ok(())
            }
            Backend::Redis(q) => q.note(id, status, error, now_ms).await,
        }
    }

    pub(crate) async fn complete(
        &self,
        m: &QueuedMessage,
        status: u16,
        now_ms: u64,
        keep: Duration,
    ) -> Result<(), StoreError> {
        match self {
            Backend::Memory(q) => {
                q.complete(m, status, now_ms, keep);
                Ok(())
            }
            Backend::Redis(q) => q.complete(m, status, now_ms, keep).await,
        }
    }

    pub(crate) async fn bury(&self, b: Burial<'_>, now_ms: u64) -> Result<(), StoreError> {
        match self {
            Backend::Memory(q) => {
                let dead = DeadLetter {
                    message: b.message.clone(),
                    attempts: b.attempts,
                    status: b.status,
                    error: (!b.error.is_empty()).then(|| b.error.to_owned()),
                    died_ms: now_ms,
                };
                q.bury(dead, b.max_dead);
                Ok(())
            }
            Backend::Redis(q) => {
                q.bury(b.message, b.attempts, b.status, b.error, now_ms)
                    .await
            }
        }
    }

    pub(crate) async fn status(&self, id: &str) -> Result<Option<MessageStatus>, StoreError> {
        match self {
            Backend::Memory(q) => Ok(q.status(id)),
            Backend::Redis(q) => q.status(id).await,
        }
    }

    pub(crate) async fn dead_letters(
        &self,
        after: Option<&str>,
        count: usize,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        match self {
            Backend::Memory(q) => Ok(q.dead_letters(after, count)),
            Backend::Redis(q) => q.dead_letters(after, count).await,
        }
    }

    pub(crate) async fn redrive(
        &self,
        id: &str,
        now_ms: u64,
        max_depth: u64,
    ) -> Result<Redriven, StoreError> {
        match self {
            Backend::Memory(q) => Ok(q.redrive(id, now_ms, max_depth)),
            Backend::Redis(q) => q.redrive(id, now_ms, max_depth).await,
        }
    }

    pub(crate) async fn discard(&self, id: &str) -> Result<bool, StoreError> {
        match self {
            Backend::Memory(q) => Ok(q.discard(id)),
            Backend::Redis(q) => q.discard(id).await,
        }
    }

    pub(crate) async fn stats(&self) -> Result<QueueStats, StoreError> {
        match self {
            Backend::Memory(q) => Ok(q.stats()),
            Backend::Redis(q) => q.stats().await,
        }
    }
}
