//! The policy engine of one configuration generation: which policies a request falls under,
//! which key each counts, the all-or-nothing check against the store, shadow policies and the
//! `on_error` fallback. Rebuilt on every reload over the same store, so unchanged policies keep
//! their counters.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::store::Check;
use tollgate::{Decision, Decisions, Error, Limiter, MemoryStore, Policy, SystemClock};

use crate::config::{Action, Config, OnError, PolicyConfig};
use crate::matcher::RequestView;
use crate::metrics::{Metrics, Outcome};
use crate::store::AnyStore;

/// What the engine decided for one request.
#[derive(Debug, Default)]
pub struct Evaluation {
    /// Decisions of the enforcing (reject/delay) policies.
    pub enforced: Decisions,
    /// Decisions of shadow policies: reported, never enforced.
    pub shadow: Decisions,
    /// A `require_key` policy found no key: the request is refused with 401.
    pub missing_key: Option<String>,
    /// The store failed and `on_error = "allow"` admitted the request undecided.
    pub fail_open: bool,
}

impl Evaluation {
    /// Whether the request may go on.
    pub fn allowed(&self) -> bool {
        self.missing_key.is_none() && self.enforced.allowed()
    }

    /// How long to hold the request first (leaky bucket with `delay`).
    pub fn delay(&self) -> Option<Duration> {
        if self.allowed() {
            self.enforced.delay()
        } else {
            None
        }
    }
}

/// One configuration generation, ready to decide.
#[derive(Debug)]
pub struct Engine {
    config: Arc<Config>,
    limiter: Limiter<AnyStore, SystemClock>,
    local: Option<Limiter<MemoryStore, SystemClock>>,
    metrics: Arc<Metrics>,
}

impl Engine {
    /// An engine for `config` over `store` (the same store across reloads).
    pub fn new(
        config: Arc<Config>,
        store: AnyStore,
        local: Option<MemoryStore>,
        metrics: Arc<Metrics>,
    ) -> Result<Engine, Error> {
        let policies: Vec<Policy> = config.policies.iter().map(|p| p.policy.clone()).collect();
        let limiter = Limiter::builder()
            .store(store)
            .policies(policies.iter().cloned())
            .build()?;
        let local = match (config.store.on_error, local) {
            (OnError::Local, Some(m)) => {
                Some(Limiter::builder().store(m).policies(policies).build()?)
            }
            _ => None,
        };
        Ok(Engine {
            config,
            limiter,
            local,
            metrics,
        })
    }

    /// The configuration this engine runs.
    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// The store.
    pub fn store(&self) -> &AnyStore {
        self.limiter.store()
    }

    /// The policy named `name`.
    pub fn policy(&self, name: &str) -> Option<&PolicyConfig> {
        self.config.policy(name)
    }

    /// Checks `key` against one named policy for `cost` (`/v1/check` by policy).
    pub async fn check_one(
        &self,
        pc: &PolicyConfig,
        key: &[u8],
        cost: u32,
    ) -> Result<Evaluation, Error> {
        let mut eval = Evaluation::default();
        let max = pc.policy.quota().max_cost();
        if cost > max {
            // Never admissible: denied with no Retry-After, which would lie.
            let d = never(&pc.policy);
            self.metrics.decision(pc.name(), Outcome::Denied);
            if pc.action == Action::Shadow {
                eval.shadow.push(d);
            } else {
                eval.enforced.push(d);
            }
            return Ok(eval);
        }
        let checks = [Check::new(&pc.policy, key, cost)];
        let shadow = pc.action == Action::Shadow;
        let decided = self.decide(&checks, shadow).await?;
        if shadow {
            eval.shadow = decided.0;
        } else {
            eval.enforced = decided.0;
        }
        eval.fail_open = decided.1;
        Ok(eval)
    }

    /// Evaluates `req` against every configured policy whose `match` fits it.
    pub async fn evaluate(&self, req: &RequestView<'_>) -> Result<Evaluation, Error> {
        let mut eval = Evaluation::default();
        let mut keys: Vec<(&PolicyConfig, Vec<u8>)> = Vec::new();
        for pc in self.config.policies.iter() {
            if !pc.route.matches(req) {
                continue;
            }
            let key = pc.keys.iter().find_map(|k| k.extract(req));
            match key {
                Some(k) => keys.push((pc, k)),
                None if pc.require_key => {
                    self.metrics.missing_key();
                    eval.missing_key = Some(pc.name().to_owned());
                    return Ok(eval);
                }
                None => keys.push((pc, b"anonymous".to_vec())),
            }
        }
        let enforced: Vec<Check<'_>> = keys
            .iter()
            .filter(|(pc, _)| pc.action != Action::Shadow)
            .map(|(pc, k)| Check::new(&pc.policy, k, pc.cost))
            .collect();
        let shadow: Vec<Check<'_>> = keys
            .iter()
            .filter(|(pc, _)| pc.action == Action::Shadow)
            .map(|(pc, k)| Check::new(&pc.policy, k, pc.cost))
            .collect();
        if !enforced.is_empty() {
            let (d, fail_open) = self.decide(&enforced, false).await?;
            eval.enforced = d;
            eval.fail_open |= fail_open;
        }
        if !shadow.is_empty() {
            let (d, fail_open) = self.decide(&shadow, true).await?;
            eval.shadow = d;
            eval.fail_open |= fail_open;
        }
        if let Some(delay) = eval.delay()
            && !delay.is_zero()
        {
            self.metrics.delayed();
        }
        Ok(eval)
    }

    /// Runs checks through the store, with the `on_error` policy and metrics.
    async fn decide(&self, checks: &[Check<'_>], shadow: bool) -> Result<(Decisions, bool), Error> {
        let started = Instant::now();
        let result = self.limiter.check_all(checks).await;
        self.metrics.latency(started.elapsed());
        let (decisions, fail_open) = match result {
            Ok(d) => (d, false),
            Err(Error::Store(e)) => {
                self.metrics.store_error();
                tracing::warn!(error = %e, on_error = ?self.config.store.on_error, "store failed");
                match (&self.local, self.config.store.on_error) {
                    (Some(local), _) => (local.check_all(checks).await?, false),
                    (None, OnError::Deny) => {
                        let d: Decisions = checks.iter().map(|c| unavailable(c.policy)).collect();
                        (d, false)
                    }
                    _ => {
                        for c in checks {
                            self.metrics.decision(c.policy.name(), Outcome::FailOpen);
                        }
                        return Ok((Decisions::new(), true));
                    }
                }
            }
            Err(e) => return Err(e),
        };
        for d in &decisions {
            let outcome = match (d.allowed, shadow) {
                (true, _) => Outcome::Allowed,
                (false, true) => Outcome::Shadow,
                (false, false) => Outcome::Denied,
            };
            if !d.allowed {
                tracing::debug!(policy = %d.policy, shadow, retry_after = ?d.retry_after, "denied");
            }
            self.metrics.decision(&d.policy, outcome);
        }
        Ok((decisions, fail_open))
    }
}

/// The decision for a cost the policy can never admit.
fn never(policy: &Policy) -> Decision {
    Decision {
        policy: policy.shared_name().clone(),
        allowed: false,
        limit: u64::from(policy.quota().limit()),
        remaining: 0,
        reset: policy.quota().window(),
        retry_after: None,
        delay: None,
    }
}

/// The decision `on_error = "deny"` gives while the store is down: retry in a second.
fn unavailable(policy: &Policy) -> Decision {
    Decision {
        policy: policy.shared_name().clone(),
        allowed: false,
        limit: u64::from(policy.quota().limit()),
        remaining: 0,
        reset: Duration::from_secs(1),
        retry_after: Some(Duration::from_secs(1)),
        delay: None,
    }
}
