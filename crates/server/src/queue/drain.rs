//! One queue's drainer on one instance: takes up to `queue_concurrency` messages, asks the
//! policy's leaky bucket for each delivery's slot (the same bucket live requests are decided
//! on, shared by every instance through the store, so the drain never exceeds the policy's
//! rate), delivers through the relay, and settles each message: done (the upstream answered
//! 2xx, 3xx or a final 4xx), tried again after an exponential backoff (5xx, 408, 429, a
//! timeout, a connection error), or buried in the dead letters after its last attempt.
//!
//! Messages of a key whose bucket is busy are passed over for later ones of other keys, so one
//! busy key does not hold up the rest; a key's own messages keep their order. With Redis, the
//! drainer touches the messages it holds every third of `queue_claim_after`, takes over those a
//! stopped instance held for longer than that, and on shutdown hands back what it holds.

mod settle;

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hyper::http::uri::Authority;
use tokio::sync::watch;
use tokio::task::{Id, JoinSet};
use tokio::time::Instant;
use tollgate::{Check, Store, Timestamp};
use tollgate_redis::stream_queue::QueuedMessage;

use super::{Queue, decode, now_ms};
use crate::Shared;
use crate::config::{Action, PolicyConfig, QueueSettings};
use crate::generation::Generation;

/// How often an idle drainer looks for messages other instances pushed (a push on this
/// instance wakes it at once).
const POLL: Duration = Duration::from_millis(200);
/// How long the drainer leaves its store alone after a failure.
const STORE_PAUSE: Duration = Duration::from_secs(1);
/// How often the queue's gauges are read.
const STATS_EVERY: Duration = Duration::from_secs(1);

/// What became of one delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Delivered {
    /// The upstream answered with this status.
    Answered(u16),
    /// It did not answer: why.
    Failed(&'static str),
}

/// Sends one stored request (its head without the final empty line, and its body) to the
/// upstream at `authority` with `id` as its idempotency key, within `timeout`. The server hands
/// the relay's HTTP/1.1 client in ([`Shared`]), so the queue does not depend on the proxy that
/// fills it.
pub(crate) trait Deliver: std::fmt::Debug + Send + Sync + 'static {
    /// Delivers once.
    fn deliver<'a>(
        &'a self,
        authority: &'a Authority,
        request: (&'a [u8], &'a [u8]),
        id: &'a str,
        timeout: Duration,
    ) -> Pin<Box<dyn Future<Output = Delivered> + Send + 'a>>;
}

/// A message this instance holds, and when it may be tried next.
struct Held {
    message: QueuedMessage,
    not_before: Instant,
}

/// What a delivery task did.
enum Attempt {
    /// Nothing: the attempt could not be counted (the store failed).
    NotTried,
    /// Attempt number `attempts` was made.
    Tried { attempts: u32, delivered: Delivered },
    /// The stored request cannot be read: it can never be delivered.
    Unreadable { attempts: u32 },
}

/// Where the bucket has a slot for a delivery.
enum Slot {
    /// After this wait (the task holds the slot meanwhile).
    Now(Duration),
    /// Not before this wait: the key's bucket is full.
    Later(Duration),
    /// The store failed (or answered from its failure mode): no delivery is decided on that.
    StoreDown,
}

/// Where the running configuration sends deliveries, and how.
struct Target {
    authority: Authority,
    timeout: Duration,
}

struct Drainer {
    shared: Arc<Shared>,
    queue: Arc<Queue>,
    upstream: Arc<dyn Deliver>,
    settings: QueueSettings,
    waiting: VecDeque<Held>,
    in_flight: JoinSet<(Held, Attempt)>,
    /// The stream entry of each delivery task.
    in_flight_entries: HashMap<Id, String>,
    /// Entries another instance claimed while this one was delivering them.
    lost: HashSet<String>,
    /// Keys whose bucket is full, until when.
    blocked: HashMap<Vec<u8>, Instant>,
    next_read: Instant,
    next_claim: Instant,
    next_keep: Instant,
    next_stats: Instant,
    paused_until: Instant,
}

/// Drains `queue` until `stop`, then hands back what it holds, giving deliveries in flight
/// `drain` to finish.
pub(crate) async fn drain(
    shared: Arc<Shared>,
    queue: Arc<Queue>,
    mut stop: watch::Receiver<bool>,
    drain: Duration,
) {
    let now = Instant::now();
    let mut d = Drainer {
        upstream: Arc::clone(&shared.upstream),
        shared,
        queue,
        settings: QueueSettings::default(),
        waiting: VecDeque::new(),
        in_flight: JoinSet::new(),
        in_flight_entries: HashMap::new(),
        lost: HashSet::new(),
        blocked: HashMap::new(),
        next_read: now,
        next_claim: now,
        next_keep: now,
        next_stats: now,
        paused_until: now,
    };
    loop {
        let engine = d.shared.engine();
        let policy = engine
            .policy(&d.queue.name)
            .filter(|p| p.action == Action::Queue);
        let target = engine.config().proxy.as_ref().and_then(|p| {
            Some(Target {
                authority: p.upstream.authority()?.clone(),
                timeout: p.timeout,
            })
        });
        d.housekeeping().await;
        // A reload that removed the policy (or the proxy) pauses the drain; what is held is
        // still touched, and the drain goes on if it comes back.
        if let (Some(pc), Some(target)) = (policy, &target) {
            d.settings = pc.queue.unwrap_or_default();
            d.refill().await;
            d.schedule(&engine, pc, target).await;
        }
        let wake = d.next_wake(policy.is_some() && target.is_some());
        drop(engine);
        tokio::select! {
            biased;
            () = crate::serve::stopped(&mut stop) => break,
            Some(done) = d.in_flight.join_next_with_id(), if !d.in_flight.is_empty() => {
                d.settle(done).await;
            }
            () = d.queue.wake.notified() => d.next_read = Instant::now(),
            () = tokio::time::sleep_until(wake) => {}
        }
    }
    d.shut_down(drain).await;
}

impl Drainer {
    /// Touches the messages held (Redis) and refreshes the gauges, each when due.
    async fn housekeeping(&mut self) {
        let now = Instant::now();
        if self.queue.backend.durable() && now >= self.next_keep {
            self.next_keep = now + self.settings.claim_after / 3;
            let entries = self.entries();
            let refs: Vec<&str> = entries.iter().map(String::as_str).collect();
            match self.queue.backend.keep(&refs).await {
                Ok(lost) => self.drop_lost(lost),
                Err(e) => {
                    tracing::warn!(policy = %self.queue.name, error = %e, "queue: cannot touch the messages held")
                }
            }
        }
        if now >= self.next_stats {
            self.next_stats = now + STATS_EVERY;
            if let Ok(s) = self.queue.backend.stats().await {
                self.queue.counters.set_size(s.depth, s.dead, s.oldest_ms);
            }
        }
    }

    /// Every entry held: waiting, and in flight.
    fn entries(&self) -> Vec<String> {
        self.waiting
            .iter()
            .map(|h| h.message.entry.clone())
            .chain(self.in_flight_entries.values().cloned())
            .collect()
    }

    /// Forgets entries another instance took over: it delivers them now.
    fn drop_lost(&mut self, lost: Vec<String>) {
        if lost.is_empty() {
            return;
        }
        tracing::warn!(policy = %self.queue.name, count = lost.len(), "queue: messages taken over by another instance");
        let lost: HashSet<String> = lost.into_iter().collect();
        self.waiting.retain(|h| !lost.contains(&h.message.entry));
        for entry in self.in_flight_entries.values() {
            if lost.contains(entry) {
                self.lost.insert(entry.clone());
            }
        }
    }

    /// Takes messages while there is room: a stopped instance's first (Redis), then new ones.
    async fn refill(&mut self) {
        let now = Instant::now();
        let held = self.waiting.len() + self.in_flight.len();
        if held >= self.settings.concurrency || now < self.next_read {
            return;
        }
        let room = self.settings.concurrency - held;
        let backend = &self.queue.backend;
        let mut got = Vec::new();
        if backend.durable() && now >= self.next_claim {
            self.next_claim = now + self.settings.claim_after / 2;
            match backend.claim(room, self.settings.claim_after).await {
                Ok(claimed) => {
                    if !claimed.is_empty() {
                        let n = u64::try_from(claimed.len()).unwrap_or(u64::MAX);
                        self.queue.counters.claimed(n);
                        tracing::info!(policy = %self.queue.name, count = claimed.len(), "queue: took over messages of a stopped instance");
                    }
                    got = claimed;
                }
                Err(e) => {
                    tracing::warn!(policy = %self.queue.name, error = %e, "queue: cannot claim messages")
                }
            }
        }
        let mut failed = false;
        if got.len() < room {
            match backend.read(room - got.len()).await {
                Ok(new) => got.extend(new),
                Err(e) => {
                    failed = true;
                    tracing::warn!(policy = %self.queue.name, error = %e, "queue: cannot read messages");
                }
            }
        }
        // A full batch may have left more behind: read again at once.
        self.next_read = match (failed, got.len() == room) {
            (true, _) => now + STORE_PAUSE,
            (false, true) => now,
            (false, false) => now + POLL,
        };
        // A claim can hand back an entry this instance holds already (one it was too slow to
        // touch): it is delivered once.
        let held: HashSet<String> = self.entries().into_iter().collect();
        self.waiting.extend(
            got.into_iter()
                .filter(|m| !held.contains(&m.entry))
                .map(|message| Held {
                    message,
                    not_before: now,
                }),
        );
    }

    /// Asks the bucket for a slot for every message that may go now, in order, and starts the
    /// deliveries that have one.
    async fn schedule(&mut self, engine: &Generation, pc: &PolicyConfig, target: &Target) {
        let now = Instant::now();
        if now < self.paused_until {
            return;
        }
        self.blocked.retain(|_, until| *until > now);
        let mut i = 0;
        while let Some(held) = self.waiting.get(i) {
            if held.not_before > now || self.blocked.contains_key(&held.message.key) {
                i += 1;
                continue;
            }
            match slot(engine, pc, &held.message.key).await {
                Slot::Now(delay) => {
                    if let Some(held) = self.waiting.remove(i) {
                        self.start(held, delay, target);
                    }
                }
                Slot::Later(wait) => {
                    self.blocked.insert(held.message.key.clone(), now + wait);
                    i += 1;
                }
                Slot::StoreDown => {
                    self.paused_until = now + STORE_PAUSE;
                    return;
                }
            }
        }
    }

    /// A delivery task: waits for its slot, counts the attempt, delivers.
    fn start(&mut self, held: Held, delay: Duration, target: &Target) {
        let backend = self.queue.backend.clone();
        let upstream = Arc::clone(&self.upstream);
        let authority = target.authority.clone();
        let timeout = target.timeout;
        let entry = held.message.entry.clone();
        let handle = self.in_flight.spawn(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let attempts = match backend.attempt(&held.message.id, now_ms()).await {
                Ok(n) => n,
                Err(_) => return (held, Attempt::NotTried),
            };
            let outcome = match decode(&held.message.payload) {
                Some(parts) => Attempt::Tried {
                    attempts,
                    delivered: upstream
                        .deliver(&authority, parts, &held.message.id, timeout)
                        .await,
                },
                None => Attempt::Unreadable { attempts },
            };
            (held, outcome)
        });
        self.in_flight_entries.insert(handle.id(), entry);
    }

    /// When the loop must next look: the first of a message's retry time or its key's slot,
    /// the next read, heartbeat and gauges.
    fn next_wake(&self, draining: bool) -> Instant {
        let mut wake = self.next_stats;
        if self.queue.backend.durable() {
            wake = wake.min(self.next_keep);
        }
        if !draining {
            return wake.min(Instant::now() + STATS_EVERY);
        }
        if self.waiting.len() + self.in_flight.len() < self.settings.concurrency {
            wake = wake.min(self.next_read);
        }
        for held in &self.waiting {
            let at = self
                .blocked
                .get(&held.message.key)
                .map_or(held.not_before, |b| (*b).max(held.not_before))
                .max(self.paused_until);
            wake = wake.min(at);
        }
        wake
    }

    /// Stops: what waits is handed back at once (Redis; in memory it goes with the process),
    /// deliveries in flight get `drain` to finish, and what is still out then is handed back.
    async fn shut_down(mut self, drain: Duration) {
        let handed = self.settings.claim_after + Duration::from_secs(1);
        let waiting: Vec<String> = self.waiting.drain(..).map(|h| h.message.entry).collect();
        let refs: Vec<&str> = waiting.iter().map(String::as_str).collect();
        let _ = self.queue.backend.release(&refs, handed).await;
        let deadline = Instant::now() + drain;
        while !self.in_flight.is_empty() {
            match tokio::time::timeout_at(deadline, self.in_flight.join_next_with_id()).await {
                Ok(Some(done)) => self.settle(done).await,
                _ => break,
            }
        }
        self.in_flight.abort_all();
        let rest = self.entries();
        let refs: Vec<&str> = rest.iter().map(String::as_str).collect();
        let _ = self.queue.backend.release(&refs, handed).await;
    }
}

/// Asks the policy's bucket for a delivery's slot, as a live request of `key` would be.
async fn slot(engine: &Generation, pc: &PolicyConfig, key: &[u8]) -> Slot {
    let store = engine.store();
    // A decision from the store's failure mode (Redis away) says nothing about the shared
    // rate: `on_error = "allow"` would let every held message go at once.
    let before = store.redis_stats().map(|s| s.fallbacks);
    let now = Timestamp::from_system_time(SystemTime::now());
    let decision = store
        .apply_one(now, Check::new(&pc.policy, key, pc.cost))
        .await;
    let fell_back = before.is_some() && store.redis_stats().map(|s| s.fallbacks) != before;
    match decision {
        Ok(_) if fell_back => Slot::StoreDown,
        Err(_) => Slot::StoreDown,
        Ok(d) if d.allowed => Slot::Now(d.delay.unwrap_or_default()),
        Ok(d) => Slot::Later(
            d.retry_after
                .unwrap_or(Duration::from_secs(1))
                .max(Duration::from_millis(1)),
        ),
    }
}
