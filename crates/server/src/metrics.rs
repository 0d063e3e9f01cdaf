//! Prometheus metrics, kept in atomics and written out by hand in the text exposition format.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// How a policy treated a request, as the `outcome` label says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted.
    Allowed,
    /// Refused.
    Denied,
    /// A shadow policy would have refused it.
    Shadow,
    /// The store failed and `on_error = "allow"` let it through.
    FailOpen,
}

const OUTCOMES: [&str; 4] = ["allowed", "denied", "shadow", "fail_open"];

/// Upper bounds of the decision latency histogram, in seconds.
const BUCKETS: [f64; 12] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5,
];

#[derive(Default)]
struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

/// Every counter the admin `/metrics` endpoint reports.
#[derive(Default)]
pub struct Metrics {
    decisions: RwLock<HashMap<String, [AtomicU64; 4]>>,
    latency: Histogram,
    store_errors: AtomicU64,
    delayed: AtomicU64,
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
    upstream_errors: AtomicU64,
    missing_key: AtomicU64,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// Counts one decision of `policy`.
    pub fn decision(&self, policy: &str, outcome: Outcome) {
        let i = outcome as usize;
        if let Ok(map) = self.decisions.read()
            && let Some(c) = map.get(policy)
        {
            c[i].fetch_add(1, Relaxed);
            return;
        }
        if let Ok(mut map) = self.decisions.write() {
            map.entry(policy.to_owned()).or_default()[i].fetch_add(1, Relaxed);
        }
    }

    /// Records how long a decision took (store round trip included).
    pub fn latency(&self, d: Duration) {
        let secs = d.as_secs_f64();
        for (b, bound) in self.latency.buckets.iter().zip(BUCKETS) {
            if secs <= bound {
                b.fetch_add(1, Relaxed);
            }
        }
        self.latency.count.fetch_add(1, Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.latency.sum_nanos.fetch_add(nanos, Relaxed);
    }

    /// Counts a failed store call.
    pub fn store_error(&self) {
        self.store_errors.fetch_add(1, Relaxed);
    }

    /// Counts a request held for its leaky-bucket slot.
    pub fn delayed(&self) {
        self.delayed.fetch_add(1, Relaxed);
    }

    /// Counts a configuration reload.
    pub fn reload(&self, ok: bool) {
        if ok {
            self.reloads_ok.fetch_add(1, Relaxed);
        } else {
            self.reloads_failed.fetch_add(1, Relaxed);
        }
    }

    /// Counts a proxied request whose upstream failed or timed out.
    pub fn upstream_error(&self) {
        self.upstream_errors.fetch_add(1, Relaxed);
    }

    /// Counts a request refused with 401 for lack of a key (`require_key`).
    pub fn missing_key(&self) {
        self.missing_key.fetch_add(1, Relaxed);
    }

    /// Successful and failed reloads so far.
    pub fn reloads(&self) -> (u64, u64) {
        (
            self.reloads_ok.load(Relaxed),
            self.reloads_failed.load(Relaxed),
        )
    }

    /// The Prometheus text exposition; `keys_tracked` is read from the store by the caller.
    pub fn render(
        &self,
        keys_tracked: Option<usize>,
        redis: Option<tollgate_redis::RedisStoreStats>,
    ) -> String {
        let mut out = String::with_capacity(4096);
        out.push_str("# HELP tollgate_decisions_total Decisions by policy and outcome.\n");
        out.push_str("# TYPE tollgate_decisions_total counter\n");
        if let Ok(map) = self.decisions.read() {
            let mut names: Vec<&String> = map.keys().collect();
            names.sort();
            for name in names {
                if let Some(c) = map.get(name) {
                    for (i, outcome) in OUTCOMES.iter().enumerate() {
                        let _ = writeln!(
                            out,
                            "tollgate_decisions_total{{policy=\"{}\",outcome=\"{outcome}\"}} {}",
                            escape_label(name),
                            c[i].load(Relaxed)
                        );
                    }
                }
            }
        }
        out.push_str(
            "# HELP tollgate_decision_duration_seconds Time to decide a request, store included.\n",
        );
        out.push_str("# TYPE tollgate_decision_duration_seconds histogram\n");
        for (b, bound) in self.latency.buckets.iter().zip(BUCKETS) {
            let _ = writeln!(
                out,
                "tollgate_decision_duration_seconds_bucket{{le=\"{bound}\"}} {}",
                b.load(Relaxed)
            );
        }
        let count = self.latency.count.load(Relaxed);
        let _ = writeln!(
            out,
            "tollgate_decision_duration_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let sum = self.latency.sum_nanos.load(Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "tollgate_decision_duration_seconds_sum {sum}");
        let _ = writeln!(out, "tollgate_decision_duration_seconds_count {count}");
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
        if let Some(keys) = keys_tracked {
            out.push_str("# HELP tollgate_keys_tracked Keys the memory store holds state for.\n");
            out.push_str("# TYPE tollgate_keys_tracked gauge\n");
            let _ = writeln!(out, "tollgate_keys_tracked {keys}");
        }
        out
    }
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} counter");
    let _ = writeln!(out, "{name} {value}");
}

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
