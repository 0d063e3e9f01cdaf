//! The server's own policy engine, run on a manual clock over a memory store that remembers
//! which key each request was checked against (the store key, credentials hashed, exactly as
//! the store holds it), so the figures can name the keys that would be limited.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Mutex, MutexGuard, PoisonError};

use http::StatusCode;
use tollgate::store::Check;
use tollgate::{Decision, Decisions, ManualClock, MemoryStore, Store, StoreError, Timestamp};
use tollgate_config::Config;
use tollgate_http::{Disposition, RequestInfo};

use crate::format::Cost;
use crate::stats::RunStats;

/// One check the engine asked the store for.
#[derive(Clone, Debug)]
struct Recorded {
    policy: &'static str,
    key: Range<usize>,
    cost: u32,
}

/// The checks of the request being decided; reused, so a known key costs no allocation.
#[derive(Debug, Default)]
struct Seen {
    keys: Vec<u8>,
    checks: Vec<Recorded>,
}

impl Seen {
    /// The key and cost `policy` was checked with.
    fn find(&self, policy: &str) -> Option<(&[u8], u32)> {
        // Policy names are interned: the same name is the same pointer, which is cheaper to
        // compare than the text (the text still decides when the pointers differ).
        let r = self
            .checks
            .iter()
            .find(|r| std::ptr::eq(r.policy, policy))
            .or_else(|| self.checks.iter().find(|r| r.policy == policy))?;
        Some((self.keys.get(r.key.clone())?, r.cost))
    }
}

/// The memory store, decisions untouched, plus a note of every check it is asked to decide.
#[derive(Debug)]
pub(crate) struct RecordingStore {
    inner: MemoryStore,
    // Only the replay thread touches it: the lock is never contended.
    seen: Mutex<Seen>,
}

impl RecordingStore {
    fn seen(&self) -> MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, checks: &[Check<'_>]) {
        let mut seen = self.seen();
        for c in checks {
            let start = seen.keys.len();
            seen.keys.extend_from_slice(c.key);
            let end = seen.keys.len();
            seen.checks.push(Recorded {
                policy: c.policy.name(),
                key: start..end,
                cost: c.cost,
            });
        }
    }
}

impl Store for RecordingStore {
    async fn apply(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<Decisions, StoreError> {
        self.record(checks);
        Ok(self.inner.apply_now(now, checks))
    }

    async fn apply_one(&self, now: Timestamp, check: Check<'_>) -> Result<Decision, StoreError> {
        self.record(std::slice::from_ref(&check));
        Ok(self.inner.apply_one_now(now, &check))
    }

    async fn charge(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<Decisions, StoreError> {
        Ok(self.inner.charge_now(now, checks))
    }

    async fn refund(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<(), StoreError> {
        self.inner.refund_now(now, checks);
        Ok(())
    }

    async fn release(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<u32, StoreError> {
        Ok(self.inner.release_now(now, checks))
    }

    async fn bans(&self, now: Timestamp) -> Result<Vec<tollgate::BanRecord>, StoreError> {
        Ok(self.inner.bans_now(now))
    }

    async fn lift_ban(&self, now: Timestamp, policy: &str, key: &[u8]) -> Result<bool, StoreError> {
        Ok(self.inner.lift_ban_now(now, policy, key))
    }

    fn is_immediate(&self) -> bool {
        true
    }
}

/// What a log line says of the response, for the policies that charge by it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Logged {
    /// The status the server answered with.
    pub(crate) status: Option<u16>,
    /// What the request cost.
    pub(crate) cost: Option<Cost>,
    /// How long it took.
    pub(crate) took: Option<std::time::Duration>,
}

/// One policy's decision on the request last evaluated, for `--decisions`.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct Traced {
    pub(crate) policy: &'static str,
    pub(crate) allowed: bool,
    pub(crate) remaining: u64,
    pub(crate) key: String,
}

type Settle = tollgate_http::Settle<RecordingStore, ManualClock>;

/// One configuration replayed: its engine and what it decided.
#[derive(Debug)]
pub(crate) struct Run {
    engine: tollgate_http::Engine<RecordingStore, ManualClock>,
    pub(crate) stats: RunStats,
    /// When tracing: the last request's decisions.
    pub(crate) traced: Option<Vec<Traced>>,
    /// Requests holding concurrency slots, by when they end (and arrival order).
    in_flight: BTreeMap<(Timestamp, u64), Box<Settle>>,
    arrivals: u64,
}

impl Run {
    /// The engine `config` describes, built as the server builds it, on `clock` over the memory
    /// store `[store]` describes (whatever its kind: a replay never talks to Redis).
    pub(crate) fn new(
        config: &Config,
        clock: ManualClock,
    ) -> Result<Run, tollgate_http::ConfigError> {
        let store = RecordingStore {
            inner: tollgate_config::memory_store(&config.store),
            seen: Mutex::default(),
        };
        Ok(Run {
            engine: tollgate_config::http_engine(config, store, clock)?,
            stats: RunStats::new(config),
            traced: None,
            in_flight: BTreeMap::new(),
            arrivals: 0,
        })
    }

    fn store(&self) -> &RecordingStore {
        self.engine.limiter().store()
    }

    /// Decides one request at `now` (the clock already reads it) and counts the evaluation.
    ///
    /// Must run outside any tokio runtime: a request the `delay` action holds is dropped
    /// unwaited, and only outside a runtime does that leave its slot consumed, as a held and
    /// then served request would.
    /// Returns the status the server would answer with (200 when it passes the request on).
    pub(crate) fn evaluate(
        &mut self,
        info: &RequestInfo<'_>,
        now: Timestamp,
        logged: Logged,
    ) -> u16 {
        if let Some(t) = &mut self.traced {
            t.clear();
        }
        {
            let mut seen = self.store().seen();
            seen.keys.clear();
            seen.checks.clear();
        }
        self.stats.requests += 1;
        self.end_requests(now);
        let prepared = self.engine.prepare(info);
        if prepared.is_empty() {
            return 200;
        }
        self.stats.matched += 1;
        let mut evaluation = match self.engine.decide_now(prepared) {
            Ok(evaluation) => evaluation,
            // A concurrency limit with `delay` would hold it in line for a slot: whether one
            // frees up within max_delay depends on requests still to come, so it is counted
            // as delayed and takes no slot.
            Err(_) => {
                self.stats.delayed += 1;
                return 200;
            }
        };
        // What the logged response says it cost: policies that charge by the response
        // (`charge = "response"` from the log's cost, `count_status` from its status) are
        // trued up as the server would have (the memory store answers at once). A line without
        // a status is a request the server never answered: admission's charge stands. A cost
        // that is not a whole number is reported as none: the response is then charged the
        // policy's `cost` and counted as a fallback, as the server charges and counts a bad
        // one (Settle takes only a whole cost, so the engine's reason is "missing", not "bad";
        // the charge and the count are the same). Concurrency slots are held until the request
        // ends, by its logged duration.
        if let Some(mut settle) = evaluation.take_settle() {
            if let Some(status) = logged.status.and_then(|s| StatusCode::from_u16(s).ok()) {
                settle.response(status, &http::HeaderMap::new());
                if let Some(Cost::Whole(cost)) = logged.cost {
                    settle.reported(cost);
                }
            }
            match logged.took.filter(|t| !t.is_zero()) {
                Some(took) if settle.holds_slots() => {
                    self.arrivals += 1;
                    let end = now.saturating_add(took);
                    self.in_flight.insert((end, self.arrivals), settle);
                }
                _ => settle.finish(),
            }
        }
        let status = match evaluation.disposition() {
            Disposition::Respond(a) => a.status().as_u16(),
            _ => 200,
        };
        match evaluation.disposition() {
            Disposition::Respond(a) if a.status() == StatusCode::TOO_MANY_REQUESTS => {
                self.stats.denied += 1;
            }
            Disposition::Respond(a) if a.status() == StatusCode::UNAUTHORIZED => {
                self.stats.unauthorized += 1;
            }
            Disposition::Respond(a) if a.status().is_client_error() => {
                *self.stats.refused.entry(a.status().as_u16()).or_default() += 1;
            }
            Disposition::Respond(_) => self.stats.undecided += 1,
            Disposition::Hold(_) => self.stats.delayed += 1,
            Disposition::Pass => {}
        }
        // The engine's field alone, so the statistics can be borrowed beside it.
        let seen = self.engine.limiter().store().seen();
        for d in evaluation.decisions() {
            let Some((key, cost)) = seen.find(d.policy) else {
                continue;
            };
            let policies = &mut self.stats.policies;
            let at = policies
                .iter()
                .position(|p| std::ptr::eq(p.name, d.policy))
                .or_else(|| policies.iter().position(|p| p.name == d.policy));
            if let Some(p) = at.and_then(|i| policies.get_mut(i)) {
                p.record(key, now, cost, d.allowed);
            }
            if let Some(t) = &mut self.traced {
                t.push(Traced {
                    policy: d.policy,
                    allowed: d.allowed,
                    remaining: d.remaining,
                    key: String::from_utf8_lossy(key).into_owned(),
                });
            }
        }
        status
    }

    /// Ends the requests that were over by `now`, giving back their slots.
    fn end_requests(&mut self, now: Timestamp) {
        while let Some(entry) = self.in_flight.first_entry() {
            if entry.key().0 > now {
                break;
            }
            entry.remove().finish();
        }
    }

    /// What it decided, with each policy's responses charged its `cost` because their cost was
    /// missing or bad (the server's `tollgate_usage_fallbacks_total`). The requests still
    /// holding concurrency slots end first: their true-ups are the last fallbacks.
    pub(crate) fn into_stats(mut self) -> RunStats {
        for (_, settle) in std::mem::take(&mut self.in_flight) {
            settle.finish();
        }
        let mut stats = self.stats;
        for (name, fallbacks) in self.engine.usage_fallbacks() {
            if let Some(p) = stats.policies.iter_mut().find(|p| p.name == name) {
                p.usage_fallbacks = fallbacks;
            }
        }
        stats
    }

    /// Forgets keys whose quota has fully reset, as the server does every ten seconds.
    pub(crate) fn purge(&self, now: Timestamp) {
        self.store().inner.purge_expired(now);
    }

    /// The keys the store holds now.
    pub(crate) fn keys_held(&self) -> usize {
        self.store().inner.len()
    }
}
