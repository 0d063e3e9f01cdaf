//! A durable work queue on Redis Streams, for Tollgate's `queue` action: messages are pushed by
//! any instance and drained by all of them together, each message delivered by one instance at a
//! time, none lost when an instance stops.
//!
//! One stream per queue, and every key of a queue under one hash tag, so each step below is one
//! atomic script even in a Redis Cluster:
//!
//! - `<prefix>:queue:<name>:{<tag>}:stream`: the messages waiting or being delivered. Delivered
//!   and dead ones are deleted from it, so its length is the queue's depth.
//! - `...:dead`: the dead letters, messages that ran out of attempts.
//! - `...:s:<id>`: one status hash per message (state, attempts, last status, last error).
//!
//! `<name>` is the queue's name with anything but letters, digits, `_`, `-` and `.` replaced
//! (for people reading Redis); `<tag>` is a hash of the whole name, which makes keys unique.
//!
//! Delivery is at least once. Instances read with one consumer group (`XREADGROUP`): a message
//! goes to one consumer and stays pending until it is acknowledged. While an instance works on
//! a message it touches it ([`StreamQueue::keep`]); one that has not been touched for the claim
//! timeout belongs to a stopped instance, and the others take it over
//! ([`StreamQueue::claim`]). A message can then be delivered twice (the stopped instance may
//! have delivered it before it stopped), which is what the message id, sent as an idempotency
//! key, is for.

mod conn;
mod reply;

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tollgate::StoreError;

use crate::RedisConfig;
use crate::keys::hex;
use conn::{Connection, QueueScript};
pub use reply::{DeadLetter, MessageState, MessageStatus, QueueStats, QueuedMessage};

/// The consumer group every instance reads with.
const GROUP: &str = "tollgate";

struct Scripts {
    push: QueueScript,
    read: QueueScript,
    claim: QueueScript,
    keep: QueueScript,
    attempt: QueueScript,
    finish: QueueScript,
    bury: QueueScript,
    redrive: QueueScript,
    discard: QueueScript,
    stats: QueueScript,
}

struct Shared {
    connection: Connection,
    scripts: Scripts,
    prefix: String,
    consumer: String,
    timeout: Duration,
}

/// The connection every queue of one Redis deployment shares; [`StreamQueues::queue`] names
/// one queue.
#[derive(Clone)]
pub struct StreamQueues {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for StreamQueues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamQueues")
            .field("prefix", &self.shared.prefix)
            .field("consumer", &self.shared.consumer)
            .finish_non_exhaustive()
    }
}

impl StreamQueues {
    /// Connects to the Redis `config` names (its nodes, Cluster or not, TLS, key prefix) as
    /// consumer `consumer`, which must be unique to this instance (two instances under one
    /// name would take each other's messages for their own). Every call is bounded by
    /// `timeout`. Redis being down is no error here; calls fail until it is back.
    pub async fn connect(
        config: &RedisConfig,
        consumer: &str,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        config.validate().map_err(|e| StoreError::Protocol {
            reason: e.to_string(),
        })?;
        let connection = conn::connect(config, timeout).await?;
        Ok(StreamQueues {
            shared: Arc::new(Shared {
                connection,
                scripts: Scripts {
                    push: QueueScript::new(include_str!("stream_queue/push.lua")),
                    read: QueueScript::new(include_str!("stream_queue/read.lua")),
                    claim: QueueScript::new(include_str!("stream_queue/claim.lua")),
                    keep: QueueScript::new(include_str!("stream_queue/keep.lua")),
                    attempt: QueueScript::new(include_str!("stream_queue/attempt.lua")),
                    finish: QueueScript::new(include_str!("stream_queue/finish.lua")),
                    bury: QueueScript::new(include_str!("stream_queue/bury.lua")),
                    redrive: QueueScript::new(include_str!("stream_queue/redrive.lua")),
                    discard: QueueScript::new(include_str!("stream_queue/discard.lua")),
                    stats: QueueScript::new(include_str!("stream_queue/stats.lua")),
                },
                prefix: config.key_prefix.clone(),
                consumer: consumer.to_owned(),
                timeout,
            }),
        })
    }

    /// The queue named `name`.
    pub fn queue(&self, name: &str) -> StreamQueue {
        let readable: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let tag = hex(&Sha256::digest(name.as_bytes())[..8]);
        let base = format!("{}:queue:{readable}:{{{tag}}}", self.shared.prefix);
        StreamQueue {
            shared: Arc::clone(&self.shared),
            stream: format!("{base}:stream"),
            dead: format!("{base}:dead"),
            status: format!("{base}:s:"),
        }
    }
}

/// What [`StreamQueue::push`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pushed {
    /// Queued, as this stream entry.
    Queued(String),
    /// The queue holds its most messages already; nothing was added.
    Full,
}

/// What [`StreamQueue::redrive`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Redriven {
    /// Back in the queue.
    Queued,
    /// Not a dead letter of this queue.
    NotDead,
    /// The queue holds its most messages: the dead letter stays where it is.
    Full,
}

/// A message to queue.
#[derive(Clone, Copy, Debug)]
pub struct NewMessage<'a> {
    /// Its id: unique, and the name of its status (`[A-Za-z0-9_-]`, at most 64 bytes).
    pub id: &'a str,
    /// The rate-limit key its deliveries are counted under.
    pub key: &'a [u8],
    /// What to deliver.
    pub payload: &'a [u8],
    /// When it was queued, in milliseconds since the Unix epoch.
    pub enqueued_ms: u64,
}

/// One queue: its stream, its dead letters and its messages' statuses.
#[derive(Clone)]
pub struct StreamQueue {
    shared: Arc<Shared>,
    stream: String,
    dead: String,
    status: String,
}

impl std::fmt::Debug for StreamQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamQueue")
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

/// Whether `id` may name a message: what [`StreamQueue`] puts into a key name.
pub fn valid_message_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl StreamQueue {
    /// The name of the stream (for operators and tests).
    pub fn stream_key(&self) -> &str {
        &self.stream
    }

    fn status_key(&self, id: &str) -> Result<String, StoreError> {
        if !valid_message_id(id) {
            return Err(StoreError::Protocol {
                reason: format!("{id:?} is not a message id"),
            });
        }
        Ok(format!("{}{id}", self.status))
    }

    /// Adds `message` unless the queue already holds `max_depth` messages (waiting or being
    /// delivered), in one atomic step.
    pub async fn push(
        &self,
        message: NewMessage<'_>,
        max_depth: u64,
    ) -> Result<Pushed, StoreError> {
        let status = self.status_key(message.id)?;
        let args = vec![
            max_depth.to_string().into_bytes(),
            message.id.as_bytes().to_vec(),
            message.key.to_vec(),
            message.payload.to_vec(),
            message.enqueued_ms.to_string().into_bytes(),
            GROUP.as_bytes().to_vec(),
        ];
        let reply = self
            .shared
            .eval(&self.shared.scripts.push, &[&self.stream, &status], args)
            .await?;
        Ok(match reply::text(&reply) {
            Some(entry) => Pushed::Queued(entry),
            None => Pushed::Full,
        })
    }

    /// Takes up to `count` messages no instance has taken yet, for this instance.
    pub async fn read(&self, count: usize) -> Result<Vec<QueuedMessage>, StoreError> {
        let args = vec![
            GROUP.into(),
            self.shared.consumer.clone().into_bytes(),
            count.max(1).to_string().into_bytes(),
        ];
        let reply = self
            .shared
            .eval(&self.shared.scripts.read, &[&self.stream], args)
            .await?;
        reply::entries(reply)
    }

    /// Takes over up to `count` messages another instance took and has not touched for
    /// `idle`: that instance stopped.
    pub async fn claim(
        &self,
        count: usize,
        idle: Duration,
    ) -> Result<Vec<QueuedMessage>, StoreError> {
        let args = vec![
            GROUP.into(),
            self.shared.consumer.clone().into_bytes(),
            millis(idle).to_string().into_bytes(),
            count.max(1).to_string().into_bytes(),
        ];
        let reply = self
            .shared
            .eval(&self.shared.scripts.claim, &[&self.stream], args)
            .await?;
        reply::entries(reply)
    }

    /// Touches the messages (stream entries) this instance works on, so that nobody claims
    /// them; returns those it no longer owns (claimed by another instance, or gone), which it
    /// must drop.
    pub async fn keep(&self, entries: &[&str]) -> Result<Vec<String>, StoreError> {
        self.touch(entries, Duration::ZERO).await
    }

    /// Hands the messages (stream entries) this instance took back at once, as if it had
    /// stopped `idle` ago: for a clean shutdown, with `idle` at least the claim timeout.
    pub async fn release(&self, entries: &[&str], idle: Duration) -> Result<(), StoreError> {
        self.touch(entries, idle).await.map(drop)
    }

    async fn touch(&self, entries: &[&str], idle: Duration) -> Result<Vec<String>, StoreError> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let mut args = vec![
            GROUP.into(),
            self.shared.consumer.clone().into_bytes(),
            millis(idle).to_string().into_bytes(),
        ];
        args.extend(entries.iter().map(|e| e.as_bytes().to_vec()));
        let reply = self
            .shared
            .eval(&self.shared.scripts.keep, &[&self.stream], args)
            .await?;
        Ok(reply::texts(&reply))
    }

    /// Counts one delivery attempt of message `id`, before it is made; the attempt's number.
    pub async fn attempt(&self, id: &str, now_ms: u64) -> Result<u32, StoreError> {
        let status = self.status_key(id)?;
        let reply = self
            .shared
            .eval(
                &self.shared.scripts.attempt,
                &[&status],
                vec![now_ms.to_string().into_bytes()],
            )
            .await?;
        reply::int(&reply)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| reply::unexpected("attempt", &reply))
    }

    /// Records how an attempt that will be retried went (the upstream's status, or an error).
    pub async fn note(
        &self,
        id: &str,
        status: Option<u16>,
        error: &str,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let key = self.status_key(id)?;
        let mut cmd = redis::cmd("HSET");
        cmd.arg(&key)
            .arg("status")
            .arg(status.map_or_else(String::new, |s| s.to_string()))
            .arg("error")
            .arg(error)
            .arg("updated")
            .arg(now_ms);
        self.shared.query(&cmd).await.map(drop)
    }

    /// Message `message` was delivered (the upstream answered `status`): acknowledged, removed
    /// from the queue, and its status kept for `keep`.
    pub async fn complete(
        &self,
        message: &QueuedMessage,
        status: u16,
        now_ms: u64,
        keep: Duration,
    ) -> Result<(), StoreError> {
        let key = self.status_key(&message.id)?;
        let args = vec![
            GROUP.into(),
            message.entry.clone().into_bytes(),
            b"delivered".to_vec(),
            status.to_string().into_bytes(),
            Vec::new(),
            now_ms.to_string().into_bytes(),
            millis(keep).max(1).to_string().into_bytes(),
        ];
        self.shared
            .eval(&self.shared.scripts.finish, &[&self.stream, &key], args)
            .await
            .map(drop)
    }

    /// Message `message` ran out of attempts: moved to the dead letters, with the last
    /// upstream status or error.
    pub async fn bury(
        &self,
        message: &QueuedMessage,
        attempts: u32,
        status: Option<u16>,
        error: &str,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let key = self.status_key(&message.id)?;
        let args = vec![
            GROUP.into(),
            message.entry.clone().into_bytes(),
            attempts.to_string().into_bytes(),
            status.map_or_else(Vec::new, |s| s.to_string().into_bytes()),
            error.as_bytes().to_vec(),
            now_ms.to_string().into_bytes(),
        ];
        self.shared
            .eval(
                &self.shared.scripts.bury,
                &[&self.stream, &self.dead, &key],
                args,
            )
            .await
            .map(drop)
    }

    /// The status of message `id`; `None` when this queue does not know it (never queued here,
    /// or finished longer ago than its status is kept).
    pub async fn status(&self, id: &str) -> Result<Option<MessageStatus>, StoreError> {
        if !valid_message_id(id) {
            return Ok(None);
        }
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(format!("{}{id}", self.status));
        let reply = self.shared.query(&cmd).await?;
        Ok(reply::status(&reply))
    }

    /// Up to `count` dead letters, oldest first, after stream entry `after` (exclusive).
    pub async fn dead_letters(
        &self,
        after: Option<&str>,
        count: usize,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let start = after.map_or_else(|| "-".to_owned(), |a| format!("({a}"));
        let mut cmd = redis::cmd("XRANGE");
        cmd.arg(&self.dead)
            .arg(start)
            .arg("+")
            .arg("COUNT")
            .arg(count.max(1));
        let reply = self.shared.query(&cmd).await?;
        reply::dead_letters(reply)
    }

    /// Puts dead letter `id` back in the queue with a fresh count of attempts, unless the
    /// queue holds `max_depth` messages already.
    pub async fn redrive(
        &self,
        id: &str,
        now_ms: u64,
        max_depth: u64,
    ) -> Result<Redriven, StoreError> {
        if !valid_message_id(id) {
            return Ok(Redriven::NotDead);
        }
        let key = self.status_key(id)?;
        let args = vec![
            GROUP.into(),
            now_ms.to_string().into_bytes(),
            max_depth.to_string().into_bytes(),
        ];
        let reply = self
            .shared
            .eval(
                &self.shared.scripts.redrive,
                &[&self.stream, &self.dead, &key],
                args,
            )
            .await?;
        Ok(match (reply::int(&reply), reply::text(&reply)) {
            (Some(0), _) => Redriven::Full,
            (_, Some(_)) => Redriven::Queued,
            _ => Redriven::NotDead,
        })
    }

    /// Deletes dead letter `id` for good; `false` when it is not a dead letter of this queue.
    pub async fn discard(&self, id: &str) -> Result<bool, StoreError> {
        if !valid_message_id(id) {
            return Ok(false);
        }
        let key = self.status_key(id)?;
        let reply = self
            .shared
            .eval(
                &self.shared.scripts.discard,
                &[&self.dead, &key],
                Vec::new(),
            )
            .await?;
        Ok(reply::int(&reply) == Some(1))
    }

    /// The queue's depth, dead letters and oldest message.
    pub async fn stats(&self) -> Result<QueueStats, StoreError> {
        let reply = self
            .shared
            .eval(
                &self.shared.scripts.stats,
                &[&self.stream, &self.dead],
                Vec::new(),
            )
            .await?;
        reply::stats(&reply)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
