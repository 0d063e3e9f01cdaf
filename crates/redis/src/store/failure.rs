//! When Redis fails: the circuit that spares a failed Redis every call's timeout, and the
//! decisions `on_error` makes meanwhile.

use std::sync::atomic::Ordering;

use tollgate::{Check, Decision, Decisions, StoreError, Timestamp, Verdict};

use super::{DENY_RETRY, PROBE_INTERVAL, RedisStore};
use crate::config::OnError;

impl RedisStore {
    /// Whether this call may go to Redis: always while healthy; when the circuit is open, one
    /// call per probe interval.
    pub(super) fn may_call_redis(&self) -> bool {
        let at = self.inner.probe_at.load(Ordering::Relaxed);
        if at == 0 {
            return true;
        }
        let now = self.mono_micros();
        now >= at
            && self
                .inner
                .probe_at
                .compare_exchange(
                    at,
                    now + probe_micros(),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    pub(super) fn open_circuit(&self) {
        let next = self.mono_micros().max(1) + probe_micros();
        let _ = self
            .inner
            .probe_at
            .compare_exchange(0, next, Ordering::AcqRel, Ordering::Relaxed);
    }

    pub(super) async fn fallback(&self, now: Timestamp, checks: &[Check<'_>]) -> Decisions {
        self.inner.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
        match self.inner.config.on_error {
            OnError::Local => self.inner.memory.apply_now(now, checks),
            OnError::Allow => checks
                .iter()
                .map(|c| {
                    let limit = u64::from(c.policy.quota().limit());
                    Verdict {
                        allowed: true,
                        limit,
                        remaining: limit,
                        reset_micros: 0,
                        retry_after_micros: None,
                        delay_micros: 0,
                    }
                    .into_decision(c.policy.shared_name())
                })
                .collect(),
            OnError::Deny => checks
                .iter()
                .map(|c| {
                    let retry = u64::try_from(DENY_RETRY.as_micros()).unwrap_or(u64::MAX);
                    Verdict {
                        allowed: false,
                        limit: u64::from(c.policy.quota().limit()),
                        remaining: 0,
                        reset_micros: retry,
                        retry_after_micros: Some(retry),
                        delay_micros: 0,
                    }
                    .into_decision(c.policy.shared_name())
                })
                .collect(),
        }
    }
    /// Counts a failed call; opens the circuit when Redis is unreachable or slow.
    pub(super) fn failed(&self, e: &StoreError) {
        self.inner.stats.errors.fetch_add(1, Ordering::Relaxed);
        if e.is_retryable() {
            self.open_circuit();
        }
    }

    pub(super) async fn fallback_one(&self, now: Timestamp, check: &Check<'_>) -> Decision {
        let mut d = self.fallback(now, std::slice::from_ref(check)).await;
        d.as_slice().first().copied().unwrap_or_else(|| {
            // The fallback answers every check; an empty answer would be a bug: deny.
            d.push(
                Verdict {
                    allowed: false,
                    limit: 0,
                    remaining: 0,
                    reset_micros: 0,
                    retry_after_micros: None,
                    delay_micros: 0,
                }
                .into_decision(check.policy.shared_name()),
            );
            d.as_slice()[0]
        })
    }
}

fn probe_micros() -> u64 {
    u64::try_from(PROBE_INTERVAL.as_micros()).unwrap_or(u64::MAX)
}
