//! What a replay counts while it runs: per configuration, per policy, per key. Memory grows
//! with the number of keys (and a fixed-size timeline), never with the length of the log.

mod keys;
mod timeline;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tollgate::Timestamp;
use tollgate_config::Config;

pub(crate) use keys::{KeyStats, PEAK_SLICES};
pub(crate) use timeline::Timeline;

/// Everything one configuration decided.
#[derive(Debug)]
pub(crate) struct RunStats {
    /// Requests replayed.
    pub(crate) requests: u64,
    /// Requests at least one policy applied to.
    pub(crate) matched: u64,
    /// Requests answered 429.
    pub(crate) denied: u64,
    /// Requests answered 401 (no key for a policy with `require_key`).
    pub(crate) unauthorized: u64,
    /// Requests a `delay` policy would have held before passing them on.
    pub(crate) delayed: u64,
    /// Requests refused before any policy counts them, by status: 400 (a target with a
    /// fragment or a byte past ASCII, a host with an empty port, a key field sent twice), 403
    /// (a deny list), 414 (a path too deep to normalise). Kept by status because each says
    /// something different about the log, and one label for all would misname some.
    pub(crate) refused: BTreeMap<u16, u64>,
    /// Requests the store did not decide (never, with the memory store).
    pub(crate) undecided: u64,
    /// Per policy, in the configuration's order.
    pub(crate) policies: Vec<PolicyStats>,
}

impl RunStats {
    pub(crate) fn new(config: &Config) -> Self {
        RunStats {
            requests: 0,
            matched: 0,
            denied: 0,
            unauthorized: 0,
            delayed: 0,
            refused: BTreeMap::new(),
            undecided: 0,
            policies: config
                .policies
                .iter()
                .map(|p| PolicyStats::new(p.policy.name(), p.policy.quota().window()))
                .collect(),
        }
    }
}

/// One policy's counts.
#[derive(Debug)]
pub(crate) struct PolicyStats {
    /// The policy's name.
    pub(crate) name: &'static str,
    /// Requests it decided.
    pub(crate) requests: u64,
    /// Of those, the ones it denied.
    pub(crate) denied: u64,
    /// Responses charged its `cost` because their cost was missing or bad (`charge =
    /// "response"`), as the engine counts them: filled in when the replay ends.
    pub(crate) usage_fallbacks: u64,
    /// The window peak demand is measured over: the quota's `w` (its window, or the time a
    /// bucket takes to refill or drain).
    pub(crate) peak_window: Duration,
    slice_micros: u64,
    pub(crate) keys: HashMap<Box<[u8]>, KeyStats, foldhash::fast::RandomState>,
    pub(crate) timeline: Timeline,
}

impl PolicyStats {
    fn new(name: &'static str, peak_window: Duration) -> Self {
        let window = u64::try_from(peak_window.as_micros()).unwrap_or(u64::MAX);
        PolicyStats {
            name,
            requests: 0,
            denied: 0,
            usage_fallbacks: 0,
            peak_window,
            slice_micros: (window / PEAK_SLICES as u64).max(1),
            keys: HashMap::default(),
            timeline: Timeline::default(),
        }
    }

    /// One decision of this policy: `key` asked for `cost` at `now`.
    pub(crate) fn record(&mut self, key: &[u8], now: Timestamp, cost: u32, allowed: bool) {
        self.requests += 1;
        self.denied += u64::from(!allowed);
        self.timeline.add(now, allowed);
        let slice = now.as_micros() / self.slice_micros;
        match self.keys.get_mut(key) {
            Some(k) => k.add(slice, cost, allowed),
            None => {
                let mut k = KeyStats::default();
                k.add(slice, cost, allowed);
                self.keys.insert(key.into(), k);
            }
        }
    }
}
