//! One configuration generation, ready to decide: the HTTP policy engine of `tollgate-http`
//! (routes, key selectors, JWT, trusted proxies, headers, refusals, the failure rule, per-key
//! overrides) over the server's store, plus what every door's decisions are counted in (the
//! metrics and the top-keys sketches). Rebuilt on every reload over the same store, so unchanged
//! policies keep their counters.

use std::sync::Arc;

// The clock decisions are timed by: the time-stamp counter (a few nanoseconds a read), where
// `std::time::Instant` asks the OS (about 25 ns a read on a virtual machine, two a check).
use quanta::Instant;

use hyper::header::HeaderName;
use tollgate::{Outcome, SystemClock};
use tollgate_http::{Prepared, RequestInfo};

use crate::admin::top::PolicyTop;
use crate::config::{Action, Config, PolicyConfig};
use crate::metrics::{Metrics, PolicyCounters};
use crate::store::AnyStore;
use crate::telemetry::{Telemetry, Trace};

/// What to do with a request, as the HTTP engine says.
pub(crate) type Disposition = tollgate_http::Disposition<AnyStore, SystemClock>;

/// A request held for its slot (leaky bucket `delay`).
pub(crate) type Hold = tollgate_http::Hold<AnyStore, SystemClock>;

/// The true-up of a request whose policies charge by its response.
pub(crate) type Settle = tollgate_http::Settle<AnyStore, SystemClock>;

/// What the HTTP engine decided for one request.
pub(crate) type Evaluation = tollgate_http::Evaluation<AnyStore, SystemClock>;

/// The HTTP engine over the server's store.
pub(crate) type HttpEngine = tollgate_http::Engine<AnyStore, SystemClock>;

/// One configuration generation.
#[derive(Debug)]
pub(crate) struct Generation {
    config: Arc<Config>,
    http: HttpEngine,
    metrics: Arc<Metrics>,
    /// Where each decision's span goes, when traces are exported.
    telemetry: Arc<Telemetry>,
    /// Each policy's statistics, in policy order, resolved once here rather than by a locked
    /// map lookup per decision.
    stats: Vec<PolicyStats>,
    /// Each list's counter of the requests it decided, by name.
    lists: Vec<(String, Arc<crate::metrics::Sharded<1>>)>,
    /// The Redis-protocol door's password (`resp_password_env`), shared rather than copied
    /// for each connection and each command a client sends before giving it.
    resp_password: Option<Arc<[u8]>>,
}

/// What one policy's decisions are counted in.
#[derive(Debug)]
struct PolicyStats {
    shadow: bool,
    counters: Arc<PolicyCounters>,
    top: Arc<PolicyTop>,
}

impl Generation {
    /// An engine for `config` over `store` (the same store across reloads).
    pub(crate) fn new(
        config: Arc<Config>,
        store: AnyStore,
        metrics: Arc<Metrics>,
        telemetry: Arc<Telemetry>,
    ) -> Result<Generation, tollgate_http::ConfigError> {
        // The decision clock's calibration, done here rather than in the first request's time.
        let _ = Instant::now();
        let stats = config
            .policies
            .iter()
            .map(|pc| PolicyStats {
                shadow: pc.action == Action::Shadow,
                counters: metrics.policy_counters(pc.name()),
                top: metrics.top.policy(pc.name()),
            })
            .collect();
        let lists = config
            .lists
            .iter()
            .map(|l| {
                let counter = metrics.abuse.list_counter(&l.name, l.action.as_str());
                (l.name.clone(), counter)
            })
            .collect();
        Ok(Generation {
            stats,
            lists,
            resp_password: config.resp_password.as_ref().map(|p| Arc::from(p.expose())),
            http: tollgate_config::http_engine_counting(
                &config,
                store,
                SystemClock::new(),
                metrics.usage.clone(),
            )?,
            config,
            metrics,
            telemetry,
        })
    }

    /// Whether decisions are traced (a door need not look for a trace context otherwise).
    pub(crate) fn traced(&self) -> bool {
        self.telemetry.on()
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

    /// The Redis-protocol door's password, if the configuration asks for one.
    pub(crate) fn resp_password(&self) -> Option<Arc<[u8]>> {
        self.resp_password.clone()
    }

    /// The configuration this engine runs.
    pub(crate) fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// The store.
    pub(crate) fn store(&self) -> &AnyStore {
        self.http.limiter().store()
    }

    /// The policy named `name`.
    pub(crate) fn policy(&self, name: &str) -> Option<&PolicyConfig> {
        self.config.policy(name)
    }

    /// Evaluates a request against every policy whose `match` fits it, and counts what each
    /// policy did.
    pub(crate) async fn evaluate(&self, info: &RequestInfo<'_>, trace: Trace<'_>) -> Evaluation {
        let prepared = self.http.prepare(info);
        self.decide(prepared, trace).await
    }

    /// Checks `key` against the policy named `policy` for `cost` (`/v1/check` by policy), as
    /// every request is decided; `None` for a policy this generation does not have.
    pub(crate) async fn check_key(
        &self,
        policy: &str,
        key: &[u8],
        cost: u32,
        trace: Trace<'_>,
    ) -> Option<Evaluation> {
        let prepared = self.http.prepare_key(policy, key, cost)?;
        Some(self.decide(prepared, trace).await)
    }

    /// Charges `key` `cost` under the policy named `policy` whatever its quota says (`/v1/check`
    /// with `"mode": "report"`); `None` for a policy this generation does not have.
    pub(crate) async fn report_key(
        &self,
        policy: &str,
        key: &[u8],
        cost: u32,
        trace: Trace<'_>,
    ) -> Option<Evaluation> {
        let prepared = self.http.prepare_key(policy, key, cost)?;
        let span = self.telemetry.begin(&trace);
        let started = Instant::now();
        let evaluation = self.http.report_prepared(&prepared).await;
        self.metrics.latency(started.elapsed());
        self.count(&prepared, &evaluation);
        if let Some(span) = span {
            self.finish_span(span, &prepared, &evaluation);
        }
        Some(evaluation)
    }

    /// Decides a prepared request and counts it.
    pub(crate) async fn decide(&self, prepared: Prepared, trace: Trace<'_>) -> Evaluation {
        let span = self.telemetry.begin(&trace);
        let started = (!prepared.is_empty()).then(Instant::now);
        // An immediate store (the memory store) decides with no future to build and poll: the
        // async path's state, moved through the callers' futures, cost copies on every check.
        let evaluation = match self.http.decide_now_ref(&prepared) {
            Some(evaluation) => evaluation,
            None => self.http.decide_prepared(&prepared).await,
        };
        if let Some(started) = started {
            self.metrics.latency(started.elapsed());
        }
        self.count(&prepared, &evaluation);
        if let Some(span) = span {
            self.finish_span(span, &prepared, &evaluation);
        }
        evaluation
    }

    /// Ends a decision's span with each policy's outcome and the answer's status.
    fn finish_span(
        &self,
        mut span: crate::telemetry::DecisionSpan,
        prepared: &Prepared,
        evaluation: &Evaluation,
    ) {
        for (index, key, outcome) in self.outcomes(prepared, evaluation) {
            if let Some(policy) = self.config.policies.get(index) {
                span.record(policy.name(), key, outcome);
            }
        }
        let status = match evaluation.disposition() {
            Disposition::Respond(a) => a.status().as_u16(),
            _ => 0,
        };
        span.end(status);
    }

    /// What each matching policy did with the request: its decision, or the failure rule's
    /// answer when the store failed.
    fn outcomes<'p>(
        &'p self,
        prepared: &'p Prepared,
        evaluation: &'p Evaluation,
    ) -> impl Iterator<Item = (usize, &'p [u8], Outcome)> + 'p {
        let failed = evaluation.store_failed().then(|| {
            if evaluation.allowed() {
                Outcome::FailOpen
            } else {
                Outcome::FailClosed
            }
        });
        let decisions = evaluation.decisions().as_slice();
        prepared
            .keys()
            .enumerate()
            .filter_map(move |(i, (index, key))| {
                let outcome = match failed {
                    Some(o) => o,
                    None => {
                        let shadow = self.stats.get(index).is_some_and(|s| s.shadow);
                        Outcome::of(decisions.get(i)?, shadow)
                    }
                };
                Some((index, key, outcome))
            })
    }

    /// Counts what each policy did with the request, once, for every door: its decision, or
    /// the failure rule's answer when the store failed.
    fn count(&self, prepared: &Prepared, evaluation: &Evaluation) {
        if let Some(hit) = prepared.listed() {
            if let Some((_, counter)) = self.lists.iter().find(|(name, _)| name == hit.list) {
                counter.add(0, 1);
            }
            return;
        }
        match evaluation.disposition() {
            Disposition::Respond(a) if a.status() == hyper::StatusCode::UNAUTHORIZED => {
                self.metrics.missing_key();
            }
            Disposition::Hold(_) => self.metrics.delayed(),
            _ => {}
        }
        if evaluation.store_failed() {
            self.metrics.store_error();
        }
        for (index, key, outcome) in self.outcomes(prepared, evaluation) {
            self.count_one(index, key, outcome);
        }
        let decisions = evaluation.decisions().as_slice();
        for (d, (_, key)) in decisions.iter().zip(prepared.keys()) {
            if d.ban == tollgate::BanStatus::Started {
                self.metrics.abuse.ban_started(d.policy);
                tracing::info!(
                    policy = d.policy,
                    key = %String::from_utf8_lossy(key),
                    for_seconds = d.retry_after.map_or(0, |r| r.as_secs()),
                    "ban started"
                );
            }
        }
    }

    fn count_one(&self, index: usize, key: &[u8], outcome: Outcome) {
        if let Some(stats) = self.stats.get(index) {
            stats.counters.add(outcome.index(), 1);
            stats.top.record(
                key,
                !matches!(outcome, Outcome::Allowed | Outcome::FailOpen),
            );
        }
    }

    /// What the lists say of a request from `ip` at Envoy's door (which knows its client by
    /// `remote_address` alone), counted as every door counts list matches.
    pub(crate) fn envoy_gate(&self, ip: std::net::IpAddr) -> Option<tollgate_envoy::Gate> {
        let hit = self.http.list_for_address(ip)?;
        if let Some((_, counter)) = self.lists.iter().find(|(name, _)| name == hit.list) {
            counter.add(0, 1);
        }
        let list = hit.list.to_owned();
        Some(match hit.action {
            tollgate_http::ListAction::Allow => tollgate_envoy::Gate::Allow { list },
            tollgate_http::ListAction::Deny => tollgate_envoy::Gate::Deny { list },
        })
    }

    /// Whether decisions of the policy named `policy` are enforced (not shadow).
    pub(crate) fn enforced(&self, policy: &str) -> bool {
        self.policy(policy)
            .is_none_or(|p| p.action != Action::Shadow)
    }

    /// Whether the policy named `policy` holds requests it cannot admit yet (`delay`): only
    /// its decisions' `delay` means a wait.
    pub(crate) fn holds(&self, policy: &str) -> bool {
        self.policy(policy)
            .is_some_and(|p| matches!(p.action, Action::Delay { .. }))
    }
}
