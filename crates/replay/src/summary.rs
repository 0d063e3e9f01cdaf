//! The figures of a replay, as `summary.json` holds them and the report and the table show
//! them: per configuration (the one given, and each sweep candidate), per policy, per key.

mod lines;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tollgate::Timestamp;
use tollgate_config::Config;

use crate::engine::Run;
use crate::input::Source;
use crate::options::Options;
use crate::stats::{PolicyStats, RunStats};
use crate::sweep::Candidate;

pub(crate) use lines::Counts;
pub use lines::{BadCosts, BadLine, BadLines, LateLine, LineRef, OutOfOrder};

/// How many of the most limited keys each policy lists.
pub const TOP_KEYS: usize = 10;

/// Everything a replay found.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// The configuration file, when it came from one.
    pub config: Option<String>,
    /// The logs, in command-line order.
    pub logs: Vec<LogSummary>,
    /// Non-blank lines read.
    pub lines: u64,
    /// Lines that are not requests, all counted, the first few listed.
    pub bad_lines: BadLines,
    /// Requests whose cost is not a whole number, all counted, the first few listed.
    pub bad_costs: BadCosts,
    /// Lines earlier than a line replayed before them.
    pub out_of_order: OutOfOrder,
    /// The first request's time (RFC 3339).
    pub first_time: Option<String>,
    /// The last request's time.
    pub last_time: Option<String>,
    /// Seconds from the first request to the last.
    pub duration_secs: f64,
    /// The most keys one store held at once (between purges of idle keys).
    pub keys_held_max: usize,
    /// What the configuration as given decided.
    pub result: RunSummary,
    /// The sweep, when one was asked for.
    pub sweep: Option<SweepSummary>,
}

/// One log file.
#[derive(Clone, Debug, Serialize)]
pub struct LogSummary {
    /// As given.
    pub path: String,
    /// As read (`auto` only for a file with no lines).
    pub format: String,
    /// Its last line's number.
    pub lines: u64,
}

/// What one configuration decided.
#[derive(Clone, Debug, Serialize)]
pub struct RunSummary {
    /// Requests replayed.
    pub requests: u64,
    /// Requests no policy applied to.
    pub unmatched: u64,
    /// Requests that would have been answered 429.
    pub denied: u64,
    /// `denied / requests`.
    pub denied_share: f64,
    /// Requests that would have been answered 401 (`require_key` and no key).
    pub unauthorized: u64,
    /// Requests refused before any policy counted them, whatever the status (the sum of
    /// [`refused_by_status`](Self::refused_by_status)).
    pub refused: u64,
    /// The same by the status they would have been answered with: 400 (a target with a
    /// fragment or a byte past ASCII, a host with an empty port, a key field sent twice), 403
    /// (a deny list), 414 (a path of more segments than the server normalises). Keyed by
    /// status, as `--decisions` reports each request's.
    pub refused_by_status: BTreeMap<u16, u64>,
    /// Requests a `delay` policy would have held.
    pub delayed: u64,
    /// Per policy, in the configuration's order.
    pub policies: Vec<PolicySummary>,
}

/// One policy's figures.
#[derive(Clone, Debug, Serialize)]
pub struct PolicySummary {
    /// Its name.
    pub name: String,
    /// `sliding_window_counter limit=100 window=1m`.
    pub quota: String,
    /// `reject`, `delay` or `shadow`.
    pub action: String,
    /// The quota's `q`.
    pub limit: u32,
    /// The quota's `w`, in seconds: peak demand is measured over windows this long.
    pub window_secs: f64,
    /// Requests it decided.
    pub requests: u64,
    /// Of those, admitted by it.
    pub admitted: u64,
    /// Of those, denied by it (for a shadow policy: would have been).
    pub denied: u64,
    /// `denied / requests`.
    pub denied_share: f64,
    /// Responses charged its `cost` because their line's cost was missing or bad (`charge =
    /// "response"`): what the server counts in `tollgate_usage_fallbacks_total`.
    pub usage_fallbacks: u64,
    /// Distinct keys.
    pub keys: u64,
    /// Keys denied at least once.
    pub keys_affected: u64,
    /// Per-key peak demand (cost per window): quantiles over the keys.
    pub peak: Quantiles,
    /// How many keys peaked in each range (powers of two).
    pub peak_histogram: Vec<Bin>,
    /// The keys denied most, store keys as the store holds them (credentials hashed).
    pub top_keys: Vec<KeySummary>,
    /// Admitted and denied over time.
    pub timeline: TimelineSummary,
}

/// Quantiles of per-key peaks.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Quantiles {
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Largest.
    pub max: u64,
}

/// Keys whose peak is in `[from, to)`.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Bin {
    /// Lower bound, inclusive.
    pub from: u64,
    /// Upper bound, exclusive.
    pub to: u64,
    /// How many keys.
    pub keys: u64,
}

/// One key.
#[derive(Clone, Debug, Serialize)]
pub struct KeySummary {
    /// The store key (`ip:203.0.113.9`, `header:x-api-key:<keyed hash>`).
    pub key: String,
    /// Requests.
    pub requests: u64,
    /// Denied.
    pub denied: u64,
    /// `denied / requests`.
    pub denied_share: f64,
    /// Its peak demand per window.
    pub peak: u64,
}

/// Requests per bucket of time.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TimelineSummary {
    /// The first bucket's start, seconds since the epoch.
    pub start_unix: f64,
    /// Bucket width in seconds.
    pub bucket_secs: f64,
    /// Admitted per bucket.
    pub admitted: Vec<u64>,
    /// Denied per bucket.
    pub denied: Vec<u64>,
}

/// A sweep's candidates.
#[derive(Clone, Debug, Serialize)]
pub struct SweepSummary {
    /// The policy swept.
    pub policy: String,
    /// One per candidate, in order.
    pub candidates: Vec<CandidateSummary>,
}

/// One candidate.
#[derive(Clone, Debug, Serialize)]
pub struct CandidateSummary {
    /// `limit=50 window=1m`.
    pub label: String,
    /// Its algorithm.
    pub algorithm: String,
    /// Its `q`.
    pub limit: u32,
    /// Its `w` in seconds.
    pub window_secs: f64,
    /// What it decided (every policy; the swept one by name in [`SweepSummary::policy`]).
    pub result: RunSummary,
}

impl CandidateSummary {
    /// The swept policy's figures.
    pub fn policy(&self, name: &str) -> Option<&PolicySummary> {
        self.result.policies.iter().find(|p| p.name == name)
    }
}

fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// RFC 3339, to the millisecond.
pub(crate) fn rfc3339(t: Timestamp) -> Option<String> {
    let nanos = i128::from(t.as_micros()) * 1_000;
    let t = OffsetDateTime::from_unix_timestamp_nanos(nanos - nanos % 1_000_000).ok()?;
    t.format(&Rfc3339).ok()
}

impl Summary {
    pub(crate) fn build(
        options: &Options,
        sources: &[Source],
        counts: Counts,
        runs: Vec<Run>,
        swept: Option<String>,
        candidates: Vec<Candidate>,
    ) -> Summary {
        // Each run with its own configuration: the one given, then the candidates'.
        let configs: Vec<Config> = std::iter::once(options.config.clone())
            .chain(candidates.iter().map(|c| c.config.clone()))
            .collect();
        let mut runs = runs
            .into_iter()
            .zip(&configs)
            .map(|(r, c)| run_summary(c, r.into_stats()));
        let result = runs
            .next()
            .unwrap_or_else(|| run_summary(&options.config, RunStats::new(&options.config)));
        let sweep = swept.map(|policy| SweepSummary {
            policy,
            candidates: candidates
                .into_iter()
                .zip(runs)
                .map(|(c, result)| CandidateSummary {
                    label: c.label,
                    algorithm: c.algorithm.to_string(),
                    limit: c.limit,
                    window_secs: secs(c.window),
                    result,
                })
                .collect(),
        });
        let duration = match (counts.first, counts.last) {
            (Some(a), Some(b)) => b.saturating_duration_since(a),
            _ => Duration::ZERO,
        };
        let (lines, keys_held_max) = (counts.lines, counts.keys_held_max);
        let (first_time, last_time) = (
            counts.first.and_then(rfc3339),
            counts.last.and_then(rfc3339),
        );
        let (bad_lines, bad_costs, out_of_order) = counts.into_listed();
        Summary {
            config: options
                .config
                .source
                .as_ref()
                .map(|p| p.display().to_string()),
            logs: sources.iter().map(log_summary).collect(),
            lines,
            bad_lines,
            bad_costs,
            out_of_order,
            first_time,
            last_time,
            duration_secs: secs(duration),
            keys_held_max,
            result,
            sweep,
        }
    }
}

fn log_summary(s: &Source) -> LogSummary {
    LogSummary {
        path: s.path.display().to_string(),
        format: s.format().to_string(),
        lines: s.line_no,
    }
}

fn run_summary(config: &Config, stats: RunStats) -> RunSummary {
    let policies = stats
        .policies
        .iter()
        .zip(config.policies.iter())
        .map(|(s, pc)| policy_summary(s, pc))
        .collect();
    RunSummary {
        requests: stats.requests,
        unmatched: stats.requests - stats.matched,
        denied: stats.denied,
        denied_share: share(stats.denied, stats.requests),
        unauthorized: stats.unauthorized,
        refused: stats.refused.values().sum(),
        refused_by_status: stats.refused,
        delayed: stats.delayed,
        policies,
    }
}

fn policy_summary(s: &PolicyStats, pc: &tollgate_config::PolicyConfig) -> PolicySummary {
    let mut peaks: Vec<u64> = s.keys.values().map(|k| k.peak).collect();
    peaks.sort_unstable();
    // Nearest rank: the smallest peak at least a share q of the keys are at or below.
    let at = |q: f64| -> u64 {
        let rank = (q * peaks.len() as f64).ceil() as usize;
        peaks.get(rank.saturating_sub(1)).copied().unwrap_or(0)
    };
    let peak = Quantiles {
        p50: at(0.5),
        p90: at(0.9),
        p99: at(0.99),
        max: peaks.last().copied().unwrap_or(0),
    };
    let mut top: Vec<(&[u8], &crate::stats::KeyStats)> = s
        .keys
        .iter()
        .filter(|(_, k)| k.denied > 0)
        .map(|(key, k)| (key.as_ref(), k))
        .collect();
    top.sort_unstable_by(|a, b| {
        (b.1.denied, b.1.requests, a.0).cmp(&(a.1.denied, a.1.requests, b.0))
    });
    let quota = pc.policy.quota();
    PolicySummary {
        name: pc.name().to_owned(),
        quota: quota.to_string(),
        action: pc.action.as_str().to_owned(),
        limit: quota.limit(),
        window_secs: secs(s.peak_window),
        requests: s.requests,
        admitted: s.requests - s.denied,
        denied: s.denied,
        denied_share: share(s.denied, s.requests),
        usage_fallbacks: s.usage_fallbacks,
        keys: s.keys.len() as u64,
        keys_affected: s.keys.values().filter(|k| k.denied > 0).count() as u64,
        peak,
        peak_histogram: histogram(&peaks),
        top_keys: top
            .into_iter()
            .take(TOP_KEYS)
            .map(|(key, k)| KeySummary {
                key: String::from_utf8_lossy(key).into_owned(),
                requests: k.requests,
                denied: k.denied,
                denied_share: share(k.denied, k.requests),
                peak: k.peak,
            })
            .collect(),
        timeline: TimelineSummary {
            start_unix: s.timeline.start.map_or(0.0, |t| t as f64 / 1e6),
            bucket_secs: s.timeline.width as f64 / 1e6,
            admitted: s.timeline.admitted.clone(),
            denied: s.timeline.denied.clone(),
        },
    }
}

/// Keys per power-of-two range of peaks, `sorted` ascending.
fn histogram(sorted: &[u64]) -> Vec<Bin> {
    let mut bins: Vec<Bin> = Vec::new();
    for &p in sorted {
        let from = if p == 0 {
            0
        } else {
            1u64 << (63 - p.leading_zeros())
        };
        match bins.last_mut() {
            Some(b) if b.from == from => b.keys += 1,
            _ => bins.push(Bin {
                from,
                to: if from == 0 { 1 } else { from.saturating_mul(2) },
                keys: 1,
            }),
        }
    }
    bins
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_fall_in_power_of_two_bins() {
        let bins = histogram(&[1, 1, 3, 4, 7, 8, 100]);
        let got: Vec<(u64, u64, u64)> = bins.iter().map(|b| (b.from, b.to, b.keys)).collect();
        assert_eq!(
            got,
            [(1, 2, 2), (2, 4, 1), (4, 8, 2), (8, 16, 1), (64, 128, 1)]
        );
    }

    #[test]
    fn times_print_as_rfc3339() {
        assert_eq!(
            rfc3339(Timestamp::from_micros(971_211_336_250_999)).as_deref(),
            Some("2000-10-10T20:55:36.25Z")
        );
    }
}
