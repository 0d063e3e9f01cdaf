//! When Redis fails: the circuit that spares a failed Redis every call's timeout, and the
//! in-process store that decides meanwhile under `on_error = "local"`.

use std::sync::atomic::Ordering;

use tollgate::{Check, Decision, Decisions, OnError, StoreError, Timestamp};

use super::{PROBE_INTERVAL, RedisStore};

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

    /// What a call Redis could not answer gets under `on_error`: the in-process store's
    /// decisions with `local`; otherwise the error itself, so that the caller's one failure
    /// rule decides (`tollgate::OnError`): a store that made up an "allowed" or "denied" here
    /// would report a quota nobody counted.
    pub(super) async fn fallback(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
        error: StoreError,
    ) -> Result<Decisions, StoreError> {
        self.inner.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
        match self.inner.config.on_error {
            OnError::Local => Ok(self.inner.memory.apply_now(now, checks)),
            OnError::Allow | OnError::Deny => Err(error),
        }
    }

    /// Counts a failed call; opens the circuit when Redis is unreachable or slow.
    pub(super) fn failed(&self, e: &StoreError) {
        self.inner.stats.errors.fetch_add(1, Ordering::Relaxed);
        if e.is_retryable() {
            self.open_circuit();
        }
    }

    pub(super) async fn fallback_one(
        &self,
        now: Timestamp,
        check: &Check<'_>,
        error: StoreError,
    ) -> Result<Decision, StoreError> {
        let decisions = self
            .fallback(now, std::slice::from_ref(check), error)
            .await?;
        decisions.into_first().ok_or_else(|| StoreError::Protocol {
            reason: "the fallback store returned no decision".to_owned(),
        })
    }
}

/// The error of a call the open circuit kept from Redis.
pub(super) fn circuit_open() -> StoreError {
    StoreError::Unavailable {
        reason: "Redis failed recently; calls skip it until the next probe".to_owned(),
    }
}

fn probe_micros() -> u64 {
    u64::try_from(PROBE_INTERVAL.as_micros()).unwrap_or(u64::MAX)
}
