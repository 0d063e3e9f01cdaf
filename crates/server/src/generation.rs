//! One configuration generation, ready to decide: the HTTP policy engine of `tollgate-http`
//! (routes, key selectors, JWT, trusted proxies, headers, 429/401, per-key overrides) over the
//! server's store, plus the metrics and the top-keys sketches. Rebuilt on every reload over the
//! same store, so unchanged policies keep their counters.

use std::sync::Arc;
use std::time::Instant;

use hyper::HeaderMap;
use hyper::header::HeaderName;
use tollgate::key_digest::{KeyDigest, MAX_RAW_KEY};
use tollgate::store::Check;
use tollgate::{Decision, Decisions, Error, ErrorKind, Quota, SystemClock};
use tollgate_http::{NormalizedPath, RateLimitHeaders, RequestInfo};

use crate::admin::top::PolicyTop;
use crate::config::{Action, Config, PolicyConfig};
use crate::metrics::{Metrics, Outcome, PolicyCounters};
use crate::response::policy_name;
use crate::store::AnyStore;

/// What to do with a request, as the HTTP engine says.
pub(crate) type Disposition = tollgate_http::Disposition<AnyStore, SystemClock>;

/// A request held for its slot (leaky bucket `delay`).
pub(crate) type Hold = tollgate_http::Hold<AnyStore, SystemClock>;

/// The HTTP engine over the server's store.
pub(crate) type HttpEngine = tollgate_http::Engine<AnyStore, SystemClock>;

/// What the engine decided for one request.
#[derive(Debug)]
pub struct Evaluation {
    /// One decision per matching policy (shadow ones included), in policy order.
    pub decisions: Decisions,
    /// The rate-limit headers for the response.
    pub headers: HeaderMap,
    /// Pass, hold, or answer (429/401/503) instead.
    pub verdict: Disposition,
    /// The store failed and the request was let through undecided.
    pub fail_open: bool,
}

/// The digest a key longer than [`MAX_RAW_KEY`] is counted under: the core's one long-key rule,
/// under a public secret (the stores hash every key again under their own secret), so every
/// instance sharing a Redis counts a long key under the same name.
fn long_key_digest() -> &'static KeyDigest {
    static DIGEST: std::sync::LazyLock<KeyDigest> =
        std::sync::LazyLock::new(|| KeyDigest::new(b""));
    &DIGEST
}

/// One configuration generation.
#[derive(Debug)]
pub struct Generation {
    config: Arc<Config>,
    http: HttpEngine,
    metrics: Arc<Metrics>,
    /// Each policy's statistics, in policy order, resolved once here rather than by a locked
    /// map lookup per decision.
    stats: Vec<PolicyStats>,
}

/// What one policy's decisions are counted in.
#[derive(Debug)]
struct PolicyStats {
    shadow: bool,
    counters: Arc<PolicyCounters>,
    top: Arc<PolicyTop>,
}

/// The answer to a check of one key by policy name.
#[derive(Debug)]
// Made and taken apart once per `/v1/check` by name: boxing the large variant would add an
// allocation to every such check to save a move.
#[allow(clippy::large_enum_variant)]
pub enum KeyCheck {
    /// Decided: the decision (one) and its rate-limit headers, under the key's override when it
    /// has one.
    Decided(Decisions, RateLimitHeaders),
    /// The cost exceeds what `quota` (the policy's, or the key's override) can ever admit.
    NeverAdmissible(Quota),
}

impl Generation {
    /// An engine for `config` over `store` (the same store across reloads).
    pub fn new(
        config: Arc<Config>,
        store: AnyStore,
        metrics: Arc<Metrics>,
    ) -> Result<Generation, tollgate_http::ConfigError> {
        let stats = config
            .policies
            .iter()
            .map(|pc| PolicyStats {
                shadow: pc.action == Action::Shadow,
                counters: metrics.policy_counters(pc.name()),
                top: metrics.top.policy(pc.name()),
            })
            .collect();
        Ok(Generation {
            stats,
            http: tollgate_config::http_engine(&config, store, SystemClock::new())?,
            config,
            metrics,
        })
    }

    /// The SPEC §5 headers for decisions made by policy name (`/v1/check`): the same renderer
    /// as every proxied request, so both ways in report the same values.
    pub fn headers_for(&self, decisions: &Decisions) -> tollgate_http::RateLimitHeaders {
        self.http.headers_for(decisions)
    }

    /// The name of request header `name` (any case) if a decision may read it from the header
    /// map, as the HTTP engine lists them: the proxy's relay copies only these into the map it
    /// hands the engine, instead of every header of every request, and under the engine's own
    /// `HeaderName`, which costs a reference count where parsing the name would allocate.
    pub(crate) fn header_read(&self, name: &str) -> Option<&HeaderName> {
        self.http
            .headers_read()
            .iter()
            .find(|h| h.as_str().eq_ignore_ascii_case(name))
    }

    /// The HTTP engine (the proxy's queue path charges and refunds through it; overrides are
    /// installed into it).
    pub(crate) fn http(&self) -> &HttpEngine {
        &self.http
    }

    /// The configuration this engine runs.
    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// The store.
    pub fn store(&self) -> &AnyStore {
        self.http.limiter().store()
    }

    /// The policy named `name`.
    pub fn policy(&self, name: &str) -> Option<&PolicyConfig> {
        self.config.policy(name)
    }

    /// Evaluates a request against every policy whose `match` fits it.
    pub async fn evaluate(&self, info: &RequestInfo<'_>) -> Evaluation {
        let (decisions, rate_limit, verdict, fail_open) = self.evaluate_parts(info).await;
        let mut headers = HeaderMap::new();
        rate_limit.apply(&mut headers);
        Evaluation {
            decisions,
            headers,
            verdict,
            fail_open,
        }
    }

    /// [`Generation::evaluate`] with the rate-limit headers as the HTTP engine gives them, to be
    /// moved straight into a response (the proxy's path: no map of their own).
    pub(crate) async fn evaluate_parts(
        &self,
        info: &RequestInfo<'_>,
    ) -> (Decisions, RateLimitHeaders, Disposition, bool) {
        let prepared = self.http.prepare(info);
        let matched = !prepared.is_empty();
        let started = Instant::now();
        let outcome = self.http.decide_prepared(&prepared).await;
        if matched {
            self.metrics.latency(started.elapsed());
        }
        let (decisions, headers, verdict) = outcome.into_parts();
        let fail_open = matched && decisions.is_empty() && matches!(verdict, Disposition::Pass);
        if fail_open {
            self.metrics.store_error();
            let path = NormalizedPath::new(info.path).unwrap_or_default();
            for pc in self.config.policies.iter() {
                if pc.route.matches(info.method, &path, info.host) {
                    self.metrics.decision(pc.name(), Outcome::FailOpen);
                }
            }
        }
        match &verdict {
            Disposition::Respond(a) if a.status() == hyper::StatusCode::UNAUTHORIZED => {
                self.metrics.missing_key();
            }
            Disposition::Respond(a) if a.status() == hyper::StatusCode::SERVICE_UNAVAILABLE => {
                self.metrics.store_error();
            }
            Disposition::Hold(_) => self.metrics.delayed(),
            _ => {}
        }
        self.count(&decisions, prepared.keys());
        (decisions, headers, verdict, fail_open)
    }

    /// Checks `key` against one named policy for `cost` (`/v1/check` by policy), under the
    /// key's override when it has one.
    pub async fn check_one(
        &self,
        pc: &PolicyConfig,
        key: &[u8],
        cost: u32,
    ) -> Result<KeyCheck, Error> {
        let index = self
            .config
            .policies
            .iter()
            .position(|p| p.name() == pc.name())
            .ok_or_else(|| Error::from(ErrorKind::UnknownPolicy(pc.name().to_owned())))?;
        let hashed;
        let key = if key.len() > MAX_RAW_KEY {
            hashed = long_key_digest().digest(key);
            &hashed[..]
        } else {
            key
        };
        let over = self.http.key_override(pc.name(), key);
        let policy = over.as_ref().map_or(&pc.policy, |o| o.policy());
        if cost > policy.quota().max_cost() {
            self.count_one(index, key, Outcome::Denied);
            return Ok(KeyCheck::NeverAdmissible(policy.quota().clone()));
        }
        let started = Instant::now();
        let d = self
            .http
            .limiter()
            .check_all(&[Check::new(policy, key, cost)])
            .await;
        self.metrics.latency(started.elapsed());
        match d {
            Ok(d) => {
                self.count(&d, std::iter::once((index, key)));
                let headers = self.http.headers_for_overridden(&d, &[over]);
                Ok(KeyCheck::Decided(d, headers))
            }
            Err(e) => {
                self.metrics.store_error();
                Err(e)
            }
        }
    }

    /// Whether a decision of this policy is enforced (not shadow).
    pub fn enforced(&self, d: &Decision) -> bool {
        self.policy(policy_name(d))
            .is_none_or(|p| p.action != Action::Shadow)
    }

    /// Counts each decision with the policy and key it was made for (`keys`: the policy's
    /// index and the key, in the decisions' order).
    fn count<'k>(&self, decisions: &Decisions, keys: impl Iterator<Item = (usize, &'k [u8])>) {
        for (d, (index, key)) in decisions.as_slice().iter().zip(keys) {
            let outcome = match self.stats.get(index) {
                Some(stats) => outcome(d.allowed, stats.shadow),
                None => outcome(d.allowed, !self.enforced(d)),
            };
            self.count_one(index, key, outcome);
        }
    }

    fn count_one(&self, index: usize, key: &[u8], outcome: Outcome) {
        match self.stats.get(index) {
            Some(stats) => {
                stats.counters.add(outcome as usize, 1);
                stats.top.record(key, outcome != Outcome::Allowed);
            }
            None => {
                if let Some(pc) = self.config.policies.get(index) {
                    self.metrics.decision(pc.name(), outcome);
                }
            }
        }
    }
}

fn outcome(allowed: bool, shadow: bool) -> Outcome {
    match (allowed, shadow) {
        (true, _) => Outcome::Allowed,
        (false, true) => Outcome::Shadow,
        (false, false) => Outcome::Denied,
    }
}
