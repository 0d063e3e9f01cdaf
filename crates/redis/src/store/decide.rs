//! The [`Store`] trait on Redis: a check, several at once (all-or-nothing), a charge, a refund,
//! a release and the lockouts, each one script call (or the deny cache, or a lease) under the
//! failure rule.

use std::sync::atomic::Ordering;

use tollgate::{Check, Decision, Decisions, OnError, Quota, Store, StoreError, Timestamp};

use super::RedisStore;
use crate::verdict::Decided;

impl RedisStore {
    /// One check without a lease: the deny cache, then its algorithm's script.
    pub(super) async fn apply_one_plain(
        &self,
        now: Timestamp,
        check: &Check<'_>,
    ) -> Result<Decision, StoreError> {
        let checks = std::slice::from_ref(check);
        let prepared = self.prepare(checks)?;
        let cache = prepared[0].cache;
        // A concurrency denial ends whenever anyone releases a permit: never cached. Nor is a
        // denial of a policy that bans: each one must be counted, and a lifted ban must end at
        // once on every instance.
        let cacheable =
            !matches!(check.policy.quota(), Quota::Concurrency(_)) && check.policy.ban().is_none();
        let cached = cacheable
            .then(|| self.inner.deny.get(&cache, check.cost, self.cache_now(now)))
            .flatten();
        if let Some(v) = cached {
            self.inner
                .stats
                .deny_cache_hits
                .fetch_add(1, Ordering::Relaxed);
            return Ok(v.into_decision(check.policy.shared_name()));
        }
        if !self.may_call_redis() {
            return self
                .fallback_one(now, check, super::failure::circuit_open())
                .await;
        }
        match self.within_timeout(self.run(now, checks, &prepared)).await {
            Ok(verdicts) => {
                self.inner.probe_at.store(0, Ordering::Relaxed);
                self.index_bans(&prepared, &verdicts).await;
                let (v, ban) = verdicts
                    .into_iter()
                    .next()
                    .ok_or_else(|| crate::verdict::protocol("no verdict"))?;
                if !v.allowed && cacheable {
                    self.inner
                        .deny
                        .insert(cache, check.cost, self.cache_now(now), v);
                }
                Ok(crate::verdict::bans::decision(check, v, ban))
            }
            Err(e) => {
                self.failed(&e);
                self.fallback_one(now, check, e).await
            }
        }
    }

    /// Several checks: one all-or-nothing script call (leases are for single checks).
    pub(super) async fn apply_many(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
    ) -> Result<Decisions, StoreError> {
        let prepared = self.prepare(checks)?;
        if !self.may_call_redis() {
            return self
                .fallback(now, checks, super::failure::circuit_open())
                .await;
        }
        match self.within_timeout(self.run(now, checks, &prepared)).await {
            Ok(verdicts) => {
                self.inner.probe_at.store(0, Ordering::Relaxed);
                self.index_bans(&prepared, &verdicts).await;
                Ok(decisions(checks, verdicts))
            }
            Err(e) => {
                self.failed(&e);
                self.fallback(now, checks, e).await
            }
        }
    }

    /// Gives every unspent unit of this instance's leases back to Redis: call it when the
    /// instance shuts down, so its leases do not hold quota back from the others until they
    /// end. `now` is the caller's clock (used with `clock = local`). Best effort: the first
    /// failure is returned after trying the rest.
    pub async fn return_leases(&self, now: Timestamp) -> Result<(), StoreError> {
        let returns = self.inner.leases.drain();
        self.return_units(now, &returns).await
    }
}

impl Store for RedisStore {
    async fn apply(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<Decisions, StoreError> {
        let decision = match checks {
            [] => return Ok(Decisions::new()),
            [check] => match check.policy.lease() {
                Some(lease) if check.cost > 0 => {
                    self.apply_leased(now, check, lease.ttl_micros(), lease.size())
                        .await?
                }
                _ => self.apply_one_plain(now, check).await?,
            },
            _ => return self.apply_many(now, checks).await,
        };
        let mut out = Decisions::new();
        out.push(decision);
        Ok(out)
    }

    async fn apply_one(&self, now: Timestamp, check: Check<'_>) -> Result<Decision, StoreError> {
        match check.policy.lease() {
            Some(lease) if check.cost > 0 => {
                self.apply_leased(now, &check, lease.ttl_micros(), lease.size())
                    .await
            }
            _ => self.apply_one_plain(now, &check).await,
        }
    }

    async fn charge(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<Decisions, StoreError> {
        if checks.is_empty() {
            return Ok(Decisions::new());
        }
        let prepared = self.prepare(checks)?;
        // A denial cached before a charge stays true: the charge only lengthens it, and once
        // the cached one ends Redis (which knows the charge) decides again.
        let result = if self.may_call_redis() {
            self.within_timeout(self.charge_in_redis(now, checks, &prepared))
                .await
        } else {
            Err(super::failure::circuit_open())
        };
        match result {
            Ok(verdicts) => {
                self.inner.probe_at.store(0, Ordering::Relaxed);
                Ok(checks
                    .iter()
                    .zip(verdicts)
                    .map(|(c, v)| v.into_decision(c.policy.shared_name()))
                    .collect())
            }
            Err(e) => {
                self.failed(&e);
                match self.inner.config.on_error {
                    // This instance's own count carries the charge meanwhile.
                    OnError::Local => Ok(self.inner.memory.charge_now(now, checks)),
                    OnError::Allow | OnError::Deny => Err(e),
                }
            }
        }
    }

    async fn refund(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<(), StoreError> {
        if checks.is_empty() {
            return Ok(());
        }
        let prepared = self.prepare(checks)?;
        for p in &prepared {
            self.inner.deny.remove(&p.cache);
        }
        if self.inner.config.on_error == OnError::Local {
            // Whatever the fallback store admitted meanwhile is given back there too.
            self.inner.memory.refund_now(now, checks);
        }
        let result = self
            .within_timeout(self.refund_in_redis(now, checks, &prepared))
            .await;
        if let Err(e) = &result {
            self.inner.stats.errors.fetch_add(1, Ordering::Relaxed);
            if e.is_retryable() {
                self.open_circuit();
            }
        }
        result
    }

    async fn release(&self, now: Timestamp, checks: &[Check<'_>]) -> Result<u32, StoreError> {
        self.release_permits(now, checks).await
    }

    async fn bans(&self, now: Timestamp) -> Result<Vec<tollgate::BanRecord>, StoreError> {
        self.bans_in_redis(now).await
    }

    async fn lift_ban(&self, now: Timestamp, policy: &str, key: &[u8]) -> Result<bool, StoreError> {
        // What the fallback store counted meanwhile is forgotten too.
        let local = self.inner.memory.lift_ban_now(now, policy, key);
        Ok(self.lift_in_redis(now, policy, key).await? || local)
    }
}

pub(super) fn decisions(checks: &[Check<'_>], verdicts: Vec<Decided>) -> Decisions {
    checks
        .iter()
        .zip(verdicts)
        .map(|(c, (v, ban))| crate::verdict::bans::decision(c, v, ban))
        .collect()
}
