//! The `queue` action's metrics: per `queue` policy, what was stored and refused, how
//! deliveries went, and the queue's size as its store reports it.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::{Metrics, escape_label};

/// One `queue` policy's counters and gauges. The gauges are the queue's own (with Redis, the
/// whole deployment's queue, as every instance sees it), refreshed by the drainer every second.
#[derive(Debug, Default)]
pub(crate) struct QueueCounters {
    enqueued: AtomicU64,
    full: AtomicU64,
    too_large: AtomicU64,
    delivered: AtomicU64,
    refused: AtomicU64,
    retries: AtomicU64,
    dead: AtomicU64,
    claimed: AtomicU64,
    depth: AtomicU64,
    dead_depth: AtomicU64,
    /// When the oldest message was queued (ms since the epoch); 0: none.
    oldest_ms: AtomicU64,
}

impl QueueCounters {
    /// A request stored.
    pub(crate) fn enqueued(&self) {
        self.enqueued.fetch_add(1, Relaxed);
    }

    /// A request refused with 429: the queue was full.
    pub(crate) fn full(&self) {
        self.full.fetch_add(1, Relaxed);
    }

    /// A request refused with 413: its body was too large.
    pub(crate) fn too_large(&self) {
        self.too_large.fetch_add(1, Relaxed);
    }

    /// A delivery the upstream answered for good: 2xx and 3xx, or (`refused`) a 4xx.
    pub(crate) fn delivered(&self, refused: bool) {
        if refused {
            self.refused.fetch_add(1, Relaxed);
        } else {
            self.delivered.fetch_add(1, Relaxed);
        }
    }

    /// A delivery that failed and will be tried again.
    pub(crate) fn retry(&self) {
        self.retries.fetch_add(1, Relaxed);
    }

    /// A message moved to the dead letters.
    pub(crate) fn dead(&self) {
        self.dead.fetch_add(1, Relaxed);
    }

    /// Messages taken over from an instance that stopped holding them (Redis).
    pub(crate) fn claimed(&self, n: u64) {
        self.claimed.fetch_add(n, Relaxed);
    }

    /// The queue's size as last read from its store.
    pub(crate) fn set_size(&self, depth: u64, dead: u64, oldest_ms: Option<u64>) {
        self.depth.store(depth, Relaxed);
        self.dead_depth.store(dead, Relaxed);
        self.oldest_ms.store(oldest_ms.unwrap_or(0), Relaxed);
    }

    /// Deliveries answered for good, those answered 4xx, retries, and dead letters, so far.
    pub(crate) fn deliveries(&self) -> (u64, u64, u64, u64) {
        (
            self.delivered.load(Relaxed),
            self.refused.load(Relaxed),
            self.retries.load(Relaxed),
            self.dead.load(Relaxed),
        )
    }
}

impl Metrics {
    /// The `tollgate_queue_*` families, one series per `queue` policy.
    pub(super) fn render_queues(&self, out: &mut String) {
        let Ok(map) = self.queues.read() else { return };
        if map.is_empty() {
            return;
        }
        let mut queues: Vec<(&String, &Arc<QueueCounters>)> = map.iter().collect();
        queues.sort_by(|a, b| a.0.cmp(b.0));
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        for (name, kind, help, series) in FAMILIES {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (policy, q) in &queues {
                for (label, value) in series(q, now_ms) {
                    let sep = if label.is_empty() { "" } else { "," };
                    let _ = writeln!(
                        out,
                        "{name}{{policy=\"{}\"{sep}{label}}} {value}",
                        escape_label(policy)
                    );
                }
            }
        }
    }
}

/// The values of one family for a queue's counters (at `now`, ms since the epoch): label
/// pairs (empty for none) and values.
type Series = fn(&QueueCounters, u64) -> Vec<(&'static str, f64)>;

/// Every `tollgate_queue_*` family: name, type, help, series.
const FAMILIES: [(&str, &str, &str, Series); 9] = [
    (
        "tollgate_queue_enqueued_total",
        "counter",
        "Requests stored by the queue action.",
        |q, _| vec![("", q.enqueued.load(Relaxed) as f64)],
    ),
    (
        "tollgate_queue_refused_total",
        "counter",
        "Requests the queue refused: full (429) or too large (413).",
        |q, _| {
            vec![
                ("reason=\"full\"", q.full.load(Relaxed) as f64),
                ("reason=\"too_large\"", q.too_large.load(Relaxed) as f64),
            ]
        },
    ),
    (
        "tollgate_queue_deliveries_total",
        "counter",
        "Deliveries the upstream answered for good: delivered (2xx, 3xx) or refused (a final 4xx).",
        |q, _| {
            vec![
                ("result=\"delivered\"", q.delivered.load(Relaxed) as f64),
                ("result=\"refused\"", q.refused.load(Relaxed) as f64),
            ]
        },
    ),
    (
        "tollgate_queue_retries_total",
        "counter",
        "Deliveries that failed (5xx, 408, 429, timeout, connection) and are tried again.",
        |q, _| vec![("", q.retries.load(Relaxed) as f64)],
    ),
    (
        "tollgate_queue_dead_letters_total",
        "counter",
        "Messages moved to the dead letters after their last attempt.",
        |q, _| vec![("", q.dead.load(Relaxed) as f64)],
    ),
    (
        "tollgate_queue_claimed_total",
        "counter",
        "Messages taken over from an instance that stopped (no heartbeat for queue_claim_after).",
        |q, _| vec![("", q.claimed.load(Relaxed) as f64)],
    ),
    (
        "tollgate_queue_depth",
        "gauge",
        "Messages waiting or being delivered (with Redis, the whole deployment's queue).",
        |q, _| vec![("", q.depth.load(Relaxed) as f64)],
    ),
    (
        "tollgate_queue_dead_letter_depth",
        "gauge",
        "Dead letters waiting to be re-driven or discarded.",
        |q, _| vec![("", q.dead_depth.load(Relaxed) as f64)],
    ),
    (
        "tollgate_queue_oldest_age_seconds",
        "gauge",
        "Age of the oldest message in the queue (0 when it is empty).",
        |q, now| {
            let oldest = q.oldest_ms.load(Relaxed);
            let age = if oldest == 0 {
                0
            } else {
                now.saturating_sub(oldest)
            };
            vec![("", age as f64 / 1000.0)]
        },
    ),
];
