//! Concurrency limits through the [`Limiter`]: a [`Slot`] taken for one piece of work and given
//! back when it ends.
//!
//! A concurrency policy counts requests in flight, not requests over time: a check alone
//! cannot say when its request ends, so such a policy is not checked with
//! [`Limiter::check`] but held with [`Limiter::take_slot`]. Each slot names a permit of its
//! own (the store keeps the permits a key holds), so giving it back frees exactly that slot; a
//! slot nobody gives back is taken back when the policy's `lease_ttl` ends.

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::pin::pin;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Waker};

use super::Limiter;
use crate::store::{Check, Store};
use crate::{Clock, Decision, Error, ErrorKind, Policy, Quota, StoreError};

/// A fresh permit id: never 0 (a check's "no permit"), never repeated within the process.
///
/// The ids come from a per-process random seed run through a bijective mixer: distinct within a
/// process, and colliding across the instances that share a store with odds of one in 2⁶⁴ per
/// pair.
pub fn next_permit() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(1);
    let seed = *SEED.get_or_init(|| {
        // The standard library seeds each `RandomState` from the operating system.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    });
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let id = mix(seed.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
        if id != 0 {
            return id;
        }
    }
}

/// SplitMix64's finalizer: a bijection on `u64`, so distinct inputs give distinct ids.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One slot of a concurrency policy, held by one piece of work. Give it back with
/// [`release`](Self::release) when the work ends; dropped, it is given back too (at once on the
/// memory store, by a task on a tokio runtime otherwise; with neither, it is taken back when
/// the policy's `lease_ttl` ends).
#[must_use = "a slot is held until it is released, dropped, or its lease_ttl ends"]
#[derive(Debug)]
pub struct Slot<S: Store, C: Clock> {
    limiter: Limiter<S, C>,
    policy: &'static str,
    key: Box<[u8]>,
    permit: u64,
    decision: Decision,
    held: bool,
}

impl<S: Store, C: Clock> Slot<S, C> {
    /// The decision that admitted the work: its `remaining` is the slots still free for the
    /// key, its `reset` when this slot's lease ends if it is never given back.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// The key the slot is held for.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// Gives the slot back; whether the key still held it (false when its `lease_ttl` had
    /// already ended).
    pub async fn release(mut self) -> Result<bool, Error> {
        self.held = false;
        let Some(policy) = self.limiter.policy(self.policy) else {
            return Ok(false);
        };
        let check = Check::new(policy, &self.key, 1).with_permit(self.permit);
        let now = self.limiter.clock().now();
        Ok(self.limiter.store().release(now, &[check]).await? > 0)
    }
}

impl<S: Store, C: Clock> Drop for Slot<S, C> {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        let Some(policy) = self.limiter.policy(self.policy) else {
            return;
        };
        let now = self.limiter.clock().now();
        let check = Check::new(policy, &self.key, 1).with_permit(self.permit);
        if self.limiter.store().is_immediate() {
            // Ready on its first poll: given back before the drop returns.
            let checks = [check];
            let release = pin!(self.limiter.store().release(now, &checks));
            let _ = release.poll(&mut Context::from_waker(Waker::noop()));
            return;
        }
        // A remote store: the release runs as its own task. Outside a runtime there is nothing
        // to run it on, and the lease's end frees the slot.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let limiter = self.limiter.clone();
        let (name, key, permit) = (self.policy, std::mem::take(&mut self.key), self.permit);
        runtime.spawn(async move {
            if let Some(policy) = limiter.policy(name) {
                let check = Check::new(policy, &key, 1).with_permit(permit);
                // A failed release only means the slot waits for its lease to end.
                let _ = limiter.store().release(now, &[check]).await;
            }
        });
    }
}

impl<S: Store, C: Clock> Limiter<S, C> {
    /// Takes a slot of the concurrency policy named `policy` for `key`, for one piece of work:
    /// at most the policy's `limit` slots of a key are held at once. Fails with
    /// [`ErrorKind::Refused`] when they all are (its decision's `retry_after` is a second, or the
    /// end of the earliest lease when that is sooner: a slot may come back any moment), and with [`ErrorKind::WrongKind`] for a policy that is not a
    /// concurrency limit.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{ErrorKind, Limiter, Policy, Quota};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::new("uploads", Quota::concurrency(2, Duration::from_secs(300))?)?)
    ///     .build()?;
    /// let first = limiter.take_slot("uploads", "tenant-7").await?;
    /// let second = limiter.take_slot("uploads", "tenant-7").await?;
    /// let third = limiter.take_slot("uploads", "tenant-7").await;
    /// assert!(matches!(third.map_err(|e| e.into_kind()), Err(ErrorKind::Refused(_))));
    /// assert!(first.release().await?);
    /// // A slot is free again; dropping `second` gives its own back too.
    /// let again = limiter.take_slot("uploads", "tenant-7").await?;
    /// drop((second, again));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn take_slot(
        &self,
        policy: &str,
        key: impl AsRef<[u8]>,
    ) -> Result<Slot<S, C>, Error> {
        let policy = self.concurrency_policy(policy)?;
        let key = key.as_ref();
        let permit = next_permit();
        let now = self.clock().now();
        let decisions = self
            .store()
            .apply(now, &[Check::new(policy, key, 1).with_permit(permit)])
            .await?;
        let decision = decisions.into_first().ok_or_else(|| {
            Error::from(StoreError::Protocol {
                reason: "the store returned no decision".to_owned(),
            })
        })?;
        if !decision.allowed {
            return Err(ErrorKind::Refused(Box::new(decision)).into());
        }
        Ok(Slot {
            limiter: self.clone(),
            policy: policy.name(),
            key: key.into(),
            permit,
            decision,
            held: true,
        })
    }

    /// The concurrency policy named `name`.
    fn concurrency_policy(&self, name: &str) -> Result<&Policy, Error> {
        let policy = self
            .policy(name)
            .ok_or_else(|| super::unknown_policy(name))?;
        match policy.quota() {
            Quota::Concurrency(_) => Ok(policy),
            _ => Err(ErrorKind::WrongKind {
                policy: policy.name().to_owned(),
                reason: "is not a concurrency limit: check it with Limiter::check",
            }
            .into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permits_are_never_zero_and_never_repeat() {
        let ids: std::collections::HashSet<u64> = (0..100_000).map(|_| next_permit()).collect();
        assert_eq!(ids.len(), 100_000);
        assert!(!ids.contains(&0));
    }
}
