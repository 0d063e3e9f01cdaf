//! The hot-key path: a single check of a policy with a [`Lease`](tollgate::Lease) is spent from
//! this instance's lease of its key; only taking a new lease (or being denied one) calls Redis.

use std::sync::atomic::Ordering;

use tollgate::{Check, Decision, Quota, StoreError, Timestamp};

use super::RedisStore;
use crate::config::ClockSource;
use crate::deny_cache::CacheKey;
use crate::keys::key_name;
use crate::lease::{self, Grant, Renewal, Returned, Take};
use crate::verdict;

impl RedisStore {
    /// Decides a single leased check (cost > 0): from the lease, or by renewing it.
    pub(super) async fn apply_leased(
        &self,
        now: Timestamp,
        check: &Check<'_>,
        ttl: u64,
        size: u32,
    ) -> Result<Decision, StoreError> {
        let name = check.policy.shared_name();
        let mac = self.inner.hasher.digest(check.key);
        let cache: CacheKey = (check.policy.fingerprint(), u128::from_be_bytes(mac));
        let mut evicted = Vec::new();
        let slot = loop {
            // Read afresh on every pass: a task that waited for a renewal spends now, not
            // when it arrived.
            let clock = self.cache_now(now);
            if let Some(v) = self.inner.deny.get(&cache, check.cost, clock) {
                self.inner
                    .stats
                    .deny_cache_hits
                    .fetch_add(1, Ordering::Relaxed);
                return Ok(v.into_decision(name));
            }
            let Some(slot) = self
                .inner
                .leases
                .slot(cache, check.policy, clock, &mut evicted)
            else {
                // No room for another lease: decide in Redis as without one.
                self.return_leftovers(now, std::mem::take(&mut evicted));
                return self.apply_one_plain(now, check).await;
            };
            // Registered before looking, so a renewal that ends in between still wakes it.
            let renewed = slot.renewed.notified();
            let leftover = match slot.take(clock, check.cost) {
                Take::Spent(v) => return Ok(v.into_decision(name)),
                Take::Wait => {
                    renewed.await;
                    continue;
                }
                Take::Renew(leftover) => leftover,
            };
            drop(renewed);
            evicted.extend(leftover.map(|left| Returned {
                key: cache,
                policy: check.policy.clone(),
                left,
            }));
            break slot;
        };
        // This task renews: whatever happens, the waiting tasks are let go (see `Renewal`).
        let renewal = Renewal::new(&slot);
        self.return_leftovers(now, evicted);
        if !self.may_call_redis() {
            return self
                .fallback_one(now, check, super::failure::circuit_open())
                .await;
        }
        let key = key_name(
            &self.inner.config.key_prefix,
            &mac,
            check.policy.fingerprint(),
        );
        let log = matches!(check.policy.quota(), Quota::SlidingWindowLog(_));
        let sent = self.cache_now(now);
        let want = size.max(check.cost);
        let at = if log { ttl } else { 0 };
        let reply = self
            .bounded(async {
                let mut conn = self.inner.connection.get().await?;
                self.one(&mut conn, now, check, &key, want, at).await
            })
            .await;
        let granted = match reply {
            Ok(g) => g,
            Err(e) => {
                self.inner.stats.errors.fetch_add(1, Ordering::Relaxed);
                if e.is_retryable() {
                    self.open_circuit();
                }
                return self.fallback_one(now, check, e).await;
            }
        };
        self.inner.probe_at.store(0, Ordering::Relaxed);
        if !granted.verdict.allowed {
            // Cached before the waiting tasks wake, so they are answered from it; dated when
            // the request left, as its retry time counts from no earlier.
            self.inner
                .deny
                .insert(cache, check.cost, sent, granted.verdict);
            return Ok(granted.verdict.into_decision(name));
        }
        renewal.install(&self.lease_of(check, &granted, ttl, sent));
        Ok(granted.verdict.into_decision(name))
    }

    /// The lease a granted renewal installs: its units past the check's own cost, until they
    /// stop counting (the window's end) or `ttl` has passed (a log's units are logged at that
    /// instant). `sent`: when the renewal left, on the lease clock.
    fn lease_of(&self, check: &Check<'_>, granted: &verdict::Grant, ttl: u64, sent: u64) -> Grant {
        let log = matches!(check.policy.quota(), Quota::SlidingWindowLog(_));
        let span = match check.policy.quota() {
            Quota::FixedWindow(_) | Quota::SlidingWindowCounter(_) => granted.window_left.min(ttl),
            _ => ttl,
        };
        let mut after_grant = granted.after_grant;
        if log {
            // Logged `ttl` later, the units count that much longer.
            after_grant.reset_micros += ttl;
        }
        Grant {
            units: granted.granted - check.cost,
            spent: check.cost,
            taken_at: sent,
            until: lease::until(sent, span, self.inner.config.clock == ClockSource::Redis),
            after_grant,
            guard: match check.policy.quota() {
                Quota::FixedWindow(_) | Quota::SlidingWindowCounter(_) => {
                    granted.now + granted.window_left
                }
                Quota::SlidingWindowLog(_) => granted.now + ttl,
                _ => 0,
            },
        }
    }

    /// Sends leftover lease units back to Redis in the background (best effort: units that
    /// do not come back only leave the quota under-used until their window or ttl ends).
    fn return_leftovers(&self, now: Timestamp, returns: Vec<Returned>) {
        if returns.is_empty() {
            return;
        }
        let store = self.clone();
        tokio::spawn(async move {
            let _ = store.return_units(now, &returns).await;
        });
    }

    /// Gives leftovers back to Redis (the caller's `now`, for `clock = local`); tries them
    /// all, returns the first failure.
    pub(super) async fn return_units(
        &self,
        now: Timestamp,
        returns: &[Returned],
    ) -> Result<(), StoreError> {
        let mut first_error = None;
        for r in returns {
            let key = key_name(
                &self.inner.config.key_prefix,
                &r.key.1.to_be_bytes(),
                r.key.0,
            );
            let check = Check::new(&r.policy, b"", 0);
            let result = self
                .bounded(async {
                    let mut conn = self.inner.connection.get().await?;
                    self.refund_call(
                        &mut conn,
                        now,
                        &[&check],
                        &[key.as_str()],
                        &[(r.left.units, r.left.guard)],
                    )
                    .await
                })
                .await;
            if let Err(e) = result {
                self.inner.stats.errors.fetch_add(1, Ordering::Relaxed);
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
