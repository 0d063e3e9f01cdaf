//! The `queue` action: requests over a `queue` policy's rate are stored and delivered to the
//! upstream later, at the policy's rate, by the proxy itself.
//!
//! - `queue/backend.rs`: where a queue lives: Redis Streams (durable, shared by every instance;
//!   `tollgate_redis::stream_queue`) or this process's memory (`queue/memory.rs`: bounded, gone
//!   on restart);
//! - `queue/drain.rs`: one drainer per queue and instance: takes messages, asks the policy's
//!   leaky bucket for each delivery's slot, delivers through the relay
//!   (`relay/delivery.rs`), retries with exponential backoff, buries what runs out of attempts
//!   (`queue/drain/settle.rs`: what a finished delivery comes to);
//! - the proxy's side (`relay/queue.rs`): the `202 Accepted`, `413`, `429` of a full queue, and
//!   `GET /v1/queue/{id}`; the admin's side (`admin/queue.rs`): dead letters listed, re-driven,
//!   discarded.
//!
//! A queued request is stored as the relay wrote it for the upstream (hop-by-hop headers
//! dropped, `Host` and `X-Forwarded-For` as decided), without framing: the delivery writes its
//! own `Content-Length` and the `Idempotency-Key` (the message id).

mod backend;
mod drain;
mod memory;

pub(crate) use memory::Kept;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};
use tokio::sync::{Notify, watch};
use tollgate::StoreError;
use tollgate_redis::stream_queue::{MessageStatus, StreamQueues};

use crate::Shared;
use crate::config::{Action, StoreConfig, StoreKind};
use crate::metrics::QueueCounters;
pub(crate) use backend::Backend;
pub(crate) use drain::{Deliver, Delivered};

/// How long the status of a delivered message stays readable.
pub(crate) const STATUS_KEPT: Duration = Duration::from_secs(86_400);

/// The first byte of every payload: its format.
const PAYLOAD_V1: u8 = 1;

/// One policy's queue.
#[derive(Debug)]
pub(crate) struct Queue {
    pub(crate) name: String,
    pub(crate) backend: Backend,
    pub(crate) counters: Arc<QueueCounters>,
    /// Woken by a push on this instance, so its drainer need not wait for its next poll.
    pub(crate) wake: Notify,
}

/// Every queue this instance has opened, by policy name.
#[derive(Debug)]
pub(crate) struct Queues {
    redis: Option<RedisSource>,
    map: RwLock<HashMap<String, Arc<Queue>>>,
}

/// How to reach the Redis queues, connected on first use.
#[derive(Debug)]
struct RedisSource {
    config: tollgate_redis::RedisConfig,
    timeout: Duration,
    consumer: String,
    connection: tokio::sync::OnceCell<StreamQueues>,
}

impl Queues {
    /// The queues of a server on `store`: in Redis when the store is, in memory otherwise.
    pub(crate) fn new(store: &StoreConfig) -> Queues {
        let redis = (store.kind == StoreKind::Redis).then(|| RedisSource {
            config: store.redis_config(),
            // Queue calls carry whole requests: longer than a decision's 50 ms.
            timeout: store.timeout.max(Duration::from_secs(2)),
            consumer: consumer_name(),
            connection: tokio::sync::OnceCell::new(),
        });
        Queues {
            redis,
            map: RwLock::new(HashMap::new()),
        }
    }

    /// The queue of policy `name`, if this instance has opened it.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<Queue>> {
        match self.map.read() {
            Ok(m) => m.get(name).cloned(),
            Err(poisoned) => poisoned.into_inner().get(name).cloned(),
        }
    }

    /// Every opened queue, by name.
    pub(crate) fn all(&self) -> Vec<Arc<Queue>> {
        let mut all: Vec<Arc<Queue>> = match self.map.read() {
            Ok(m) => m.values().cloned().collect(),
            Err(poisoned) => poisoned.into_inner().values().cloned().collect(),
        };
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Opens the queue of policy `name` (connecting to Redis the first time); the queue when
    /// it is new, `None` when it was open already.
    async fn open(&self, name: &str, shared: &Shared) -> Result<Option<Arc<Queue>>, StoreError> {
        if self.get(name).is_some() {
            return Ok(None);
        }
        let backend = match &self.redis {
            None => Backend::Memory(Arc::default()),
            Some(r) => {
                let queues = r
                    .connection
                    .get_or_try_init(|| StreamQueues::connect(&r.config, &r.consumer, r.timeout))
                    .await?;
                Backend::Redis(queues.queue(name))
            }
        };
        let queue = Arc::new(Queue {
            name: name.to_owned(),
            backend,
            counters: shared.metrics.queue_counters(name),
            wake: Notify::new(),
        });
        let mut map = match self.map.write() {
            Ok(m) => m,
            Err(poisoned) => poisoned.into_inner(),
        };
        Ok(match map.entry(name.to_owned()) {
            std::collections::hash_map::Entry::Occupied(_) => None,
            std::collections::hash_map::Entry::Vacant(v) => Some(Arc::clone(v.insert(queue))),
        })
    }

    /// The status of message `id`, and the queue it is in.
    pub(crate) async fn find(
        &self,
        id: &str,
    ) -> Result<Option<(Arc<Queue>, MessageStatus)>, StoreError> {
        if !valid_id(id) {
            return Ok(None);
        }
        let mut failure = None;
        for queue in self.all() {
            match queue.backend.status(id).await {
                Ok(Some(status)) => return Ok(Some((queue, status))),
                Ok(None) => {}
                Err(e) => failure = Some(e),
            }
        }
        failure.map_or(Ok(None), Err)
    }
}

/// Opens the queue of every `queue` policy of the running configuration (connecting to Redis
/// the first time). Called before the proxy serves, so its first requests find their queues;
/// what cannot be opened yet (Redis away) is tried again by [`supervise`].
pub(crate) async fn open_configured(shared: &Shared) {
    let engine = shared.engine();
    for p in engine.config().policies.iter() {
        if p.action == Action::Queue
            && let Err(e) = shared.queues.open(p.name(), shared).await
        {
            tracing::warn!(policy = p.name(), error = %e, "queue: cannot open it yet");
        }
    }
}

/// Starts a drainer for every open queue, and opens the queues of `queue` policies a reload
/// adds, until `stop`; then waits for the drainers to hand their messages back.
pub(crate) async fn supervise(
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
    drain: Duration,
) {
    let mut drainers = tokio::task::JoinSet::new();
    let mut draining = std::collections::HashSet::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = crate::serve::stopped(&mut stop) => break,
        }
        open_configured(&shared).await;
        for queue in shared.queues.all() {
            if draining.insert(queue.name.clone()) {
                tracing::info!(policy = %queue.name, durable = queue.backend.durable(), "queue: draining");
                drainers.spawn(drain::drain(
                    Arc::clone(&shared),
                    queue,
                    stop.clone(),
                    drain,
                ));
            }
        }
    }
    while drainers.join_next().await.is_some() {}
}

/// A stored request's status, as `GET /v1/queue/{id}` and the admin endpoints give it (times
/// in seconds since the Unix epoch).
pub(crate) fn status_json(id: &str, policy: &str, s: &MessageStatus) -> serde_json::Value {
    serde_json::json!({
        "id": id,
        "policy": policy,
        "state": s.state.as_str(),
        "attempts": s.attempts,
        "status": s.status,
        "error": s.error,
        "enqueued_at": seconds(s.enqueued_ms),
        "updated_at": seconds(s.updated_ms),
    })
}

/// Milliseconds since the epoch as seconds.
pub(crate) fn seconds(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

/// A new message id: 128 bits, as 32 hex digits, unguessable (a hash of a per-process random
/// secret and a counter) so that a status URL cannot be guessed from another.
pub(crate) fn new_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = Sha256::new();
    h.update(tollgate_config::process_secret());
    h.update(COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    h.update(std::process::id().to_le_bytes());
    h.update(now_ms().to_le_bytes());
    h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Whether `id` has the shape [`new_id`] gives.
pub(crate) fn valid_id(id: &str) -> bool {
    id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// This instance's name in the Redis consumer group: unique per process.
fn consumer_name() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "tollgate".to_owned());
    let host: String = host
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(40)
        .collect();
    format!("{host}-{}-{}", std::process::id(), &new_id()[..8])
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A stored request: its head as the relay writes it for the upstream (without framing or
/// the final empty line) and its body.
pub(crate) fn encode(head: &[u8], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + head.len() + body.len());
    out.push(PAYLOAD_V1);
    out.extend_from_slice(&u32::try_from(head.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(head);
    out.extend_from_slice(body);
    out
}

/// The head and body of a stored request; `None` for bytes [`encode`] did not write.
pub(crate) fn decode(payload: &[u8]) -> Option<(&[u8], &[u8])> {
    let (&version, rest) = payload.split_first()?;
    if version != PAYLOAD_V1 {
        return None;
    }
    let (len, rest) = rest.split_first_chunk::<4>()?;
    let len = usize::try_from(u32::from_be_bytes(*len)).ok()?;
    let (head, body) = rest.split_at_checked(len)?;
    stored_head_ok(head).then_some((head, body))
}

/// Whether a stored head is what the relay stores: one request head (request line and header
/// fields, every line ending in CRLF, no final empty line) without framing or an idempotency
/// key of its own, which the delivery writes. Whatever else a damaged store hands back is
/// never sent: the upstream reads only requests the relay framed.
fn stored_head_ok(head: &[u8]) -> bool {
    let lines = head.iter().filter(|b| **b == b'\n').count();
    if lines == 0 || head.windows(2).filter(|w| *w == b"\r\n").count() != lines {
        return false;
    }
    let mut whole = Vec::with_capacity(head.len() + 2);
    whole.extend_from_slice(head);
    whole.extend_from_slice(b"\r\n");
    let mut headers = vec![httparse::EMPTY_HEADER; 512];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(&whole) {
        Ok(httparse::Status::Complete(n)) if n == whole.len() => req.headers.iter().all(|h| {
            !["content-length", "transfer-encoding", "idempotency-key"]
                .iter()
                .any(|name| h.name.eq_ignore_ascii_case(name))
        }),
        _ => false,
    }
}

/// The method and target of a stored request, for listings.
pub(crate) fn request_line(payload: &[u8]) -> Option<(String, String)> {
    let (head, _) = decode(payload)?;
    let line = head.split(|b| *b == b'\r').next()?;
    let mut parts = line.split(|b| *b == b' ');
    let method = String::from_utf8_lossy(parts.next()?).into_owned();
    let target = String::from_utf8_lossy(parts.next()?).into_owned();
    Some((method, target))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip_and_foreign_bytes_are_refused() {
        let p = encode(b"POST /hook HTTP/1.1\r\nhost: a\r\n", b"{}");
        assert_eq!(
            decode(&p),
            Some((&b"POST /hook HTTP/1.1\r\nhost: a\r\n"[..], &b"{}"[..]))
        );
        assert_eq!(request_line(&p), Some(("POST".into(), "/hook".into())));
        assert_eq!(decode(b""), None);
        // Heads the relay would never store are never delivered.
        for head in [
            &b"POST /hook HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\n"[..],
            b"POST /hook HTTP/1.1\r\nhost: a\r\nTransfer-Encoding: chunked\r\n",
            b"POST /hook HTTP/1.1\r\nidempotency-key: x\r\n",
            b"POST /hook HTTP/1.1\nhost: a\n",
            b"POST /hook HTTP/1.1\r\nhost: a\r\n\r\nGET /smuggled HTTP/1.1\r\n",
            b"not a request\r\n",
        ] {
            assert_eq!(
                decode(&encode(head, b"")),
                None,
                "{}",
                String::from_utf8_lossy(head)
            );
        }
        assert_eq!(decode(&[2, 0, 0, 0, 0]), None);
        assert_eq!(decode(&[1, 0, 0, 0, 9, b'x']), None);
    }

    #[test]
    fn ids_are_unique_and_well_formed() {
        let a = new_id();
        let b = new_id();
        assert!(valid_id(&a) && valid_id(&b), "{a} {b}");
        assert_ne!(a, b);
        assert!(!valid_id("../../etc"));
        assert!(!valid_id(&a.to_uppercase()));
    }
}
