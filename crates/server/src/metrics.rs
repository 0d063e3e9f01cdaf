//! Prometheus metrics, kept in atomics and written out by hand in the text exposition format,
//! and the live statistics of the admin listener's dashboard (decision counters per policy, the
//! top-keys sketches).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::Duration;

mod abuse;
mod per_policy;
mod queue;
use crate::admin::top::TopKeys;
pub(crate) use crate::sharded::Sharded;
pub(crate) use abuse::render_bans_active;
use per_policy::render_leases;
pub(crate) use per_policy::{render_slots, render_usage_fallbacks};
pub(crate) use queue::QueueCounters;

/// How a policy treated a request, as the `outcome` label says it: the core's one list, the
/// same for every door (Envoy's service included).
pub(crate) use tollgate::Outcome;

/// How many outcomes there are.
const OUTCOMES: usize = Outcome::ALL.len();

/// Upper bounds of the decision latency histogram, in seconds.
const BUCKETS: [f64; 12] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5,
];

/// One policy's decision counters, by [`Outcome`].
pub(crate) type PolicyCounters = Sharded<OUTCOMES>;

/// Per-bucket (not cumulative) counts, the last one for +Inf, then the sum in nanoseconds:
/// one bucket and the sum change per decision; `/metrics` adds them up.
#[derive(Default)]
struct Histogram(Sharded<{ BUCKETS.len() + 2 }>);

const SUM: usize = BUCKETS.len() + 1;

/// Every counter the admin `/metrics` endpoint reports.
#[derive(Default)]
pub(crate) struct Metrics {
    decisions: RwLock<HashMap<String, Arc<PolicyCounters>>>,
    queues: RwLock<HashMap<String, Arc<QueueCounters>>>,
    latency: Histogram,
    store_errors: AtomicU64,
    delayed: AtomicU64,
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
    /// State snapshots (`[store] path`) written and failed, and when the last one was written.
    /// The server keeps a state file: its snapshot series are exported from the start.
    state_kept: std::sync::atomic::AtomicBool,
    snapshots_written: AtomicU64,
    snapshots_failed: AtomicU64,
    last_snapshot_unix: AtomicU64,
    upstream_errors: AtomicU64,
    missing_key: AtomicU64,
    /// The top-keys sketches of every policy (`/v1/top`).
    pub(crate) top: TopKeys,
    /// Bans started and requests decided by lists.
    pub(crate) abuse: abuse::AbuseCounters,
    /// Responses whose cost could not be read, by policy: handed to every configuration's
    /// engine, so the counts outlive reloads as the decisions' do.
    pub(crate) usage: tollgate_http::UsageCounters,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// Counts one decision of `policy`.
    pub(crate) fn decision(&self, policy: &str, outcome: Outcome) {
        self.policy_counters(policy).add(outcome.index(), 1);
    }

    /// The counters of `policy`, created on first use: an engine looks them up once per
    /// configuration instead of once per request.
    pub(crate) fn policy_counters(&self, policy: &str) -> Arc<PolicyCounters> {
        if let Ok(map) = self.decisions.read()
            && let Some(c) = map.get(policy)
        {
            return Arc::clone(c);
        }
        match self.decisions.write() {
            Ok(mut map) => Arc::clone(map.entry(policy.to_owned()).or_default()),
            // A poisoned map: counted nowhere rather than panicking on the request path.
            Err(_) => Arc::default(),
        }
    }

    /// The counters of `queue` policy `name`, created on first use.
    pub(crate) fn queue_counters(&self, name: &str) -> Arc<QueueCounters> {
        match self.queues.write() {
            Ok(mut map) => Arc::clone(map.entry(name.to_owned()).or_default()),
            Err(_) => Arc::default(),
        }
    }

    /// Records how long a decision took (store round trip included).
    pub(crate) fn latency(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let bucket = BUCKETS
            .iter()
            .position(|bound| secs <= *bound)
            .unwrap_or(BUCKETS.len());
        self.latency.0.add(bucket, 1);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.latency.0.add(SUM, nanos);
    }

    /// Counts a failed store call.
    pub(crate) fn store_error(&self) {
        self.store_errors.fetch_add(1, Relaxed);
    }

    /// Counts a request held for its leaky-bucket slot.
    pub(crate) fn delayed(&self) {
        self.delayed.fetch_add(1, Relaxed);
    }

    /// Counts a configuration reload.
    pub(crate) fn reload(&self, ok: bool) {
        if ok {
            self.reloads_ok.fetch_add(1, Relaxed);
        } else {
            self.reloads_failed.fetch_add(1, Relaxed);
        }
    }

    /// Counts a state snapshot, written at `unix` seconds or failed.
    pub(crate) fn snapshot(&self, written: Option<u64>) {
        match written {
            Some(unix) => {
                self.snapshots_written.fetch_add(1, Relaxed);
                self.last_snapshot_unix.store(unix, Relaxed);
            }
            None => {
                self.snapshots_failed.fetch_add(1, Relaxed);
            }
        }
    }

    /// Counts a proxied request whose upstream failed or timed out.
    pub(crate) fn upstream_error(&self) {
        self.upstream_errors.fetch_add(1, Relaxed);
    }

    /// Counts a request refused with 401 for lack of a key (`require_key`).
    pub(crate) fn missing_key(&self) {
        self.missing_key.fetch_add(1, Relaxed);
    }

    /// The decision counters of every policy seen so far, by name, in the order of
    /// [`Outcome::ALL`].
    pub(crate) fn decision_counts(&self) -> Vec<(String, [u64; OUTCOMES])> {
        let Ok(map) = self.decisions.read() else {
            return Vec::new();
        };
        let mut list: Vec<(String, [u64; OUTCOMES])> = map
            .iter()
            .map(|(name, c)| (name.clone(), std::array::from_fn(|i| c.get(i))))
            .collect();
        list.sort();
        list
    }

    /// The server keeps a state file (`[store] path`): its snapshot series are exported from
    /// the start, at 0, so an alert on them has a series before the first snapshot.
    pub(crate) fn keeps_state(&self) {
        self.state_kept.store(true, Relaxed);
    }

    /// The state snapshots' counts (a server with `[store] path`).
    fn render_snapshots(&self, out: &mut String) {
        let written = self.snapshots_written.load(Relaxed);
        let failed = self.snapshots_failed.load(Relaxed);
        if written + failed == 0 && !self.state_kept.load(Relaxed) {
            return;
        }
        out.push_str(
            "# HELP tollgate_state_snapshots_total State file snapshots ([store] path) by result.\n",
        );
        out.push_str("# TYPE tollgate_state_snapshots_total counter\n");
        let _ = writeln!(
            out,
            "tollgate_state_snapshots_total{{result=\"written\"}} {written}"
        );
        let _ = writeln!(
            out,
            "tollgate_state_snapshots_total{{result=\"failed\"}} {failed}"
        );
        out.push_str(
            "# HELP tollgate_state_last_snapshot_timestamp_seconds When the last state snapshot was written (Unix seconds; 0: none yet).\n",
        );
        out.push_str("# TYPE tollgate_state_last_snapshot_timestamp_seconds gauge\n");
        let _ = writeln!(
            out,
            "tollgate_state_last_snapshot_timestamp_seconds {}",
            self.last_snapshot_unix.load(Relaxed)
        );
    }

    /// Successful and failed reloads so far.
    pub(crate) fn reloads(&self) -> (u64, u64) {
        (
            self.reloads_ok.load(Relaxed),
            self.reloads_failed.load(Relaxed),
        )
    }

    /// The Prometheus text exposition; `keys_tracked`, the Redis store's counters and its
    /// leases' are read from the store by the caller.
    pub(crate) fn render(
        &self,
        keys_tracked: Option<usize>,
        redis: Option<tollgate_redis::RedisStoreStats>,
        leases: &[tollgate_redis::LeaseStats],
    ) -> String {
        let mut out = String::with_capacity(4096);
        self.render_decisions(&mut out);
        self.render_latency(&mut out);
        counter(
            &mut out,
            "tollgate_store_errors_total",
            "Store calls that failed or timed out.",
            self.store_errors.load(Relaxed) + redis.map_or(0, |r| r.errors),
        );
        if let Some(r) = redis {
            counter(
                &mut out,
                "tollgate_store_fallbacks_total",
                "Requests decided by on_error instead of Redis.",
                r.fallbacks,
            );
            counter(
                &mut out,
                "tollgate_store_calls_total",
                "Script calls sent to Redis.",
                r.script_calls,
            );
            counter(
                &mut out,
                "tollgate_deny_cache_hits_total",
                "Denials answered from the deny cache without calling Redis.",
                r.deny_cache_hits,
            );
        }
        counter(
            &mut out,
            "tollgate_requests_delayed_total",
            "Requests held for their leaky-bucket slot.",
            self.delayed.load(Relaxed),
        );
        counter(
            &mut out,
            "tollgate_upstream_errors_total",
            "Proxied requests answered 502 or 504.",
            self.upstream_errors.load(Relaxed),
        );
        counter(
            &mut out,
            "tollgate_missing_key_total",
            "Requests refused with 401 because a require_key policy found no key.",
            self.missing_key.load(Relaxed),
        );
        out.push_str("# HELP tollgate_config_reloads_total Configuration reloads by result.\n");
        out.push_str("# TYPE tollgate_config_reloads_total counter\n");
        let (ok, failed) = self.reloads();
        let _ = writeln!(out, "tollgate_config_reloads_total{{result=\"ok\"}} {ok}");
        let _ = writeln!(
            out,
            "tollgate_config_reloads_total{{result=\"failed\"}} {failed}"
        );
        self.render_snapshots(&mut out);
        render_leases(&mut out, leases);
        self.abuse.render(&mut out);
        self.render_queues(&mut out);
        if let Some(keys) = keys_tracked {
            out.push_str("# HELP tollgate_keys_tracked Keys the memory store holds state for.\n");
            out.push_str("# TYPE tollgate_keys_tracked gauge\n");
            let _ = writeln!(out, "tollgate_keys_tracked {keys}");
        }
        out
    }

    /// `tollgate_decisions_total`, by policy (sorted) and outcome.
    fn render_decisions(&self, out: &mut String) {
        out.push_str("# HELP tollgate_decisions_total Decisions by policy and outcome.\n");
        out.push_str("# TYPE tollgate_decisions_total counter\n");
        if let Ok(map) = self.decisions.read() {
            let mut names: Vec<&String> = map.keys().collect();
            names.sort();
            for name in names {
                if let Some(c) = map.get(name) {
                    for (i, outcome) in Outcome::ALL.iter().map(|o| o.as_str()).enumerate() {
                        let _ = writeln!(
                            out,
                            "tollgate_decisions_total{{policy=\"{}\",outcome=\"{outcome}\"}} {}",
                            escape_label(name),
                            c.get(i)
                        );
                    }
                }
            }
        }
    }

    /// `tollgate_decision_duration_seconds`, the histogram of decision times.
    fn render_latency(&self, out: &mut String) {
        out.push_str(
            "# HELP tollgate_decision_duration_seconds Time to decide a request, store included.\n",
        );
        out.push_str("# TYPE tollgate_decision_duration_seconds histogram\n");
        let mut count = 0;
        for (i, bound) in BUCKETS.iter().enumerate() {
            count += self.latency.0.get(i);
            let _ = writeln!(
                out,
                "tollgate_decision_duration_seconds_bucket{{le=\"{bound}\"}} {count}"
            );
        }
        count += self.latency.0.get(BUCKETS.len());
        let _ = writeln!(
            out,
            "tollgate_decision_duration_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let sum = self.latency.0.get(SUM) as f64 / 1e9;
        let _ = writeln!(out, "tollgate_decision_duration_seconds_sum {sum}");
        let _ = writeln!(out, "tollgate_decision_duration_seconds_count {count}");
    }
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} counter");
    let _ = writeln!(out, "{name} {value}");
}

pub(crate) fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `tollgate_tls_certificate_expiry_timestamp_seconds`, by TLS listener: when each one's
/// certificate stops being valid, to alert on before its clients start refusing it (e.g.
/// `tollgate_tls_certificate_expiry_timestamp_seconds - time() < 7 * 86400`). Nothing without
/// TLS; a listener whose certificate's dates could not be read is left out.
pub(crate) fn render_certificates(out: &mut String, listeners: &[Arc<crate::tls::Tls>]) {
    if listeners.is_empty() {
        return;
    }
    out.push_str(
        "# HELP tollgate_tls_certificate_expiry_timestamp_seconds When the listener's TLS \
         certificate expires (its notAfter, Unix seconds).\n\
         # TYPE tollgate_tls_certificate_expiry_timestamp_seconds gauge\n",
    );
    for tls in listeners {
        if let Some(end) = tls.not_after() {
            let _ = writeln!(
                out,
                "tollgate_tls_certificate_expiry_timestamp_seconds{{listener=\"{}\"}} {end}",
                tls.listener()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sharded::SHARDS;

    #[test]
    fn counts_from_many_threads_add_up_and_buckets_render_cumulative() {
        let m = Arc::new(Metrics::default());
        let threads: Vec<_> = (0..SHARDS + 3)
            .map(|_| {
                let m = Arc::clone(&m);
                std::thread::spawn(move || {
                    m.latency(Duration::from_micros(30));
                    m.latency(Duration::from_micros(200));
                    m.latency(Duration::from_secs(2));
                    m.decision("api", Outcome::Allowed);
                    m.policy_counters("api").add(Outcome::Denied.index(), 2);
                })
            })
            .collect();
        for t in threads {
            assert!(t.join().is_ok());
        }
        let n = (SHARDS + 3) as u64;
        let text = m.render(None, None, &[]);
        for line in [
            format!("tollgate_decision_duration_seconds_bucket{{le=\"0.00005\"}} {n}"),
            format!("tollgate_decision_duration_seconds_bucket{{le=\"0.0001\"}} {n}"),
            format!(
                "tollgate_decision_duration_seconds_bucket{{le=\"0.00025\"}} {}",
                2 * n
            ),
            format!(
                "tollgate_decision_duration_seconds_bucket{{le=\"0.5\"}} {}",
                2 * n
            ),
            format!(
                "tollgate_decision_duration_seconds_bucket{{le=\"+Inf\"}} {}",
                3 * n
            ),
            format!("tollgate_decision_duration_seconds_count {}", 3 * n),
            format!("tollgate_decisions_total{{policy=\"api\",outcome=\"allowed\"}} {n}"),
            format!(
                "tollgate_decisions_total{{policy=\"api\",outcome=\"denied\"}} {}",
                2 * n
            ),
        ] {
            assert!(text.contains(&line), "missing {line} in\n{text}");
        }
        let sum_line = text
            .lines()
            .find(|l| l.starts_with("tollgate_decision_duration_seconds_sum "))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok());
        let expected = n as f64 * (2.0 + 0.00023);
        assert!(
            sum_line.is_some_and(|s| (s - expected).abs() < 1e-6),
            "{sum_line:?}"
        );
    }
}
