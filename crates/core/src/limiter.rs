//! The [`Limiter`]: named policies over a [`Store`], read against a [`Clock`]. What applications
//! call.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::store::{Check, MemoryStore, Store};
use crate::{Clock, Decision, Decisions, Error, ErrorKind, Policy, SystemClock, Timestamp};

mod check;
mod policies;
mod slot;

use check::{CheckFuture, Target};
use policies::Policies;
pub use slot::{Slot, next_permit};

/// Checks requests against named policies.
///
/// Cheap to clone; clones share the store, the clock and the policies.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Limiter, ManualClock, MemoryStore, Policy, Quota, Timestamp};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
/// let clock = ManualClock::new(Timestamp::from_secs(1_700_000_000));
/// let limiter = Limiter::builder()
///     .store(MemoryStore::default())
///     .clock(clock.clone())
///     .policy(Policy::new("api", Quota::sliding_window_counter(2, Duration::from_secs(60))?)?)
///     .build()?;
///
/// assert!(limiter.check("api", "customer-42", 1).await?.allowed);
/// assert!(limiter.check("api", "customer-42", 1).await?.allowed);
/// let denied = limiter.check("api", "customer-42", 1).await?;
/// assert!(!denied.allowed);
/// assert_eq!(denied.remaining, 0);
/// assert!(denied.retry_after.is_some());
/// // Another key has its own quota.
/// assert!(limiter.check("api", "customer-7", 1).await?.allowed);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Limiter<S = MemoryStore, C = SystemClock> {
    inner: Arc<Inner<S, C>>,
}

impl<S, C> Clone for Limiter<S, C> {
    fn clone(&self) -> Self {
        Limiter {
            inner: Arc::clone(&self.inner),
        }
    }
}

#[derive(Debug)]
struct Inner<S, C> {
    store: S,
    clock: C,
    policies: Policies,
}

/// Builds a [`Limiter`]; the store defaults to a [`MemoryStore`], the clock to the
/// [`SystemClock`].
#[derive(Debug)]
pub struct LimiterBuilder<S, C> {
    store: S,
    clock: C,
    policies: Vec<Policy>,
}

impl Limiter {
    /// A builder with the in-memory store and the system clock.
    pub fn builder() -> LimiterBuilder<MemoryStore, SystemClock> {
        LimiterBuilder {
            store: MemoryStore::default(),
            clock: SystemClock::new(),
            policies: Vec::new(),
        }
    }
}

impl<S, C> LimiterBuilder<S, C> {
    /// Keeps state in `store`.
    pub fn store<S2: Store>(self, store: S2) -> LimiterBuilder<S2, C> {
        LimiterBuilder {
            store,
            clock: self.clock,
            policies: self.policies,
        }
    }

    /// Reads time from `clock`.
    pub fn clock<C2: Clock>(self, clock: C2) -> LimiterBuilder<S, C2> {
        LimiterBuilder {
            store: self.store,
            clock,
            policies: self.policies,
        }
    }

    /// Adds a policy.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policies.push(policy);
        self
    }

    /// Adds policies.
    pub fn policies(mut self, policies: impl IntoIterator<Item = Policy>) -> Self {
        self.policies.extend(policies);
        self
    }

    /// The limiter; errors when two policies share a name.
    pub fn build(self) -> Result<Limiter<S, C>, Error>
    where
        S: Store,
        C: Clock,
    {
        let mut seen = std::collections::HashSet::with_capacity(self.policies.len());
        for policy in &self.policies {
            if !seen.insert(policy.name()) {
                return Err(ErrorKind::DuplicatePolicy(policy.name().to_owned()).into());
            }
        }
        let policies = Policies::new(self.policies);
        Ok(Limiter {
            inner: Arc::new(Inner {
                store: self.store,
                clock: self.clock,
                policies,
            }),
        })
    }
}

impl<S: Store, C: Clock> Limiter<S, C> {
    /// Checks one request of `cost` by `key` against the policy named `policy`, and consumes
    /// the cost if it is admitted. A denial is `Ok` with `allowed == false`.
    ///
    /// Errors: an unknown policy, a cost the quota can never admit, a failing store.
    ///
    /// With a store that [is immediate](Store::is_immediate) (the memory store) the future
    /// decides on its first poll and is ready then.
    #[inline]
    pub fn check<'a, K: AsRef<[u8]>>(
        &'a self,
        policy: &'a str,
        key: K,
        cost: u32,
    ) -> impl Future<Output = Result<Decision, Error>> {
        if self.inner.store.is_immediate() {
            CheckFuture::immediate(self, Target::Name(policy), key, cost)
        } else {
            CheckFuture::deferred(self, self.check_deferred(policy, key, cost))
        }
    }

    /// [`check`](Self::check) against a policy resolved beforehand (from
    /// [`policy`](Self::policy), once), so the check does no lookup by name: for callers that
    /// check one policy many times. The same decisions as `check` with the policy's name.
    #[inline]
    pub fn check_policy<'a, K: AsRef<[u8]>>(
        &'a self,
        policy: &'a Policy,
        key: K,
        cost: u32,
    ) -> impl Future<Output = Result<Decision, Error>> {
        if self.inner.store.is_immediate() {
            CheckFuture::immediate(self, Target::Policy(policy), key, cost)
        } else {
            CheckFuture::deferred(self, self.check_policy_deferred(policy, key, cost))
        }
    }

    /// [`check_policy`](Self::check_policy) for a store that may wait.
    async fn check_policy_deferred(
        &self,
        policy: &Policy,
        key: impl AsRef<[u8]>,
        cost: u32,
    ) -> Result<Decision, Error> {
        let (check, now) = self.prepare(policy, key.as_ref(), cost)?;
        Ok(self.inner.store.apply_one(now, check).await?)
    }

    /// [`check`](Self::check) for a store that may wait.
    async fn check_deferred(
        &self,
        policy: &str,
        key: impl AsRef<[u8]>,
        cost: u32,
    ) -> Result<Decision, Error> {
        let (check, now) = self.prepare(self.require(policy)?, key.as_ref(), cost)?;
        Ok(self.inner.store.apply_one(now, check).await?)
    }

    /// The check of `key` against `policy`, and the time to decide it at.
    #[inline(always)]
    fn prepare<'a>(
        &self,
        policy: &'a Policy,
        key: &'a [u8],
        cost: u32,
    ) -> Result<(Check<'a>, Timestamp), Error> {
        let max = policy.max_cost();
        if cost > max {
            return Err(cost_exceeds_quota(policy, cost, max));
        }
        Ok((Check::new(policy, key, cost), self.inner.clock.now()))
    }

    /// Reports that `key` used `cost` of policy `policy`, whatever its quota says: a usage
    /// known only after the work was done (the tokens a model generated, a failed login).
    /// Never refused: the key may go past its limit, and its next requests then wait for the
    /// quota to come back as for any use. The decision says what the key has left.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tollgate::{Limiter, Policy, Quota};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::new("tokens", Quota::fixed_window(1_000, Duration::from_secs(60))?)?)
    ///     .build()?;
    /// assert!(limiter.check("tokens", "customer-42", 1).await?.allowed);
    /// let after = limiter.report("tokens", "customer-42", 1_499).await?;
    /// assert_eq!(after.remaining, 0);
    /// assert!(!limiter.check("tokens", "customer-42", 1).await?.allowed);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn report(
        &self,
        policy: &str,
        key: impl AsRef<[u8]>,
        cost: u32,
    ) -> Result<Decision, Error> {
        let policy = self.require(policy)?;
        let check = Check::new(policy, key.as_ref(), cost);
        let now = self.inner.clock.now();
        let decisions = self.inner.store.charge(now, &[check]).await?;
        decisions.into_first().ok_or_else(|| {
            Error::from(crate::StoreError::Protocol {
                reason: "the store returned no decision".to_owned(),
            })
        })
    }

    /// Checks one request against several policies, all-or-nothing: it consumes from every
    /// policy if all admit it and from none otherwise.
    pub async fn check_all(&self, checks: &[Check<'_>]) -> Result<Decisions, Error> {
        self.check_all_at(self.inner.clock.now(), checks).await
    }

    /// [`check_all`](Self::check_all) at `now`, a reading of this limiter's clock the caller
    /// keeps (to say when the quotas come back in absolute time).
    pub async fn check_all_at(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
    ) -> Result<Decisions, Error> {
        for check in checks {
            let max = check.policy.max_cost();
            if check.cost > max {
                return Err(cost_exceeds_quota(check.policy, check.cost, max));
            }
        }
        Ok(self.inner.store.apply(now, checks).await?)
    }

    /// Waits for a slot: for workers that must not exceed a quota, such as calls to a third
    /// party with its own rate limit.
    ///
    /// With a leaky bucket the request is admitted into the queue and this waits for its
    /// departure time; it fails with [`ErrorKind::Refused`] when the queue is full or the wait
    /// would exceed the bucket's `max_delay`. With the other algorithms it fails at once when
    /// denied; see [`acquire_within`](Self::acquire_within) to wait for them too. If the future
    /// is dropped while waiting, the slot is given back.
    pub async fn acquire(
        &self,
        policy: &str,
        key: impl AsRef<[u8]>,
        cost: u32,
    ) -> Result<Decision, Error> {
        self.acquire_within(policy, key, cost, Duration::ZERO).await
    }

    /// Like [`acquire`](Self::acquire), and when denied, sleeps for the `retry_after` and tries
    /// again, for as long as the total wait stays within `max_wait`.
    pub async fn acquire_within(
        &self,
        policy: &str,
        key: impl AsRef<[u8]>,
        cost: u32,
        max_wait: Duration,
    ) -> Result<Decision, Error> {
        let key = key.as_ref();
        let mut waited = Duration::ZERO;
        loop {
            let decision = self.check(policy, key, cost).await?;
            if decision.allowed {
                if let Some(delay) = decision.delay {
                    let mut guard = RefundOnDrop {
                        limiter: self.clone(),
                        policy: policy.to_owned(),
                        key: key.to_vec(),
                        cost,
                        armed: true,
                    };
                    self.inner.clock.sleep(delay).await;
                    guard.armed = false;
                }
                return Ok(decision);
            }
            match decision.retry_after {
                Some(wait) if waited + wait <= max_wait => {
                    self.inner.clock.sleep(wait).await;
                    waited += wait;
                }
                _ => return Err(ErrorKind::Refused(Box::new(decision)).into()),
            }
        }
    }

    /// The policy named `name`.
    #[inline]
    pub fn policy(&self, name: &str) -> Option<&Policy> {
        self.inner.policies.get(name)
    }

    /// The policy named `name`, for a check: a concurrency limit is an error that says how to
    /// hold one ([`take_slot`](Self::take_slot)).
    #[inline]
    pub(crate) fn require(&self, name: &str) -> Result<&Policy, Error> {
        match self.inner.policies.checkable(name) {
            Some(policy) => Ok(policy),
            None => Err(self.not_checkable(name)),
        }
    }

    #[cold]
    #[inline(never)]
    fn not_checkable(&self, name: &str) -> Error {
        match self.inner.policies.get(name) {
            Some(policy) => ErrorKind::WrongKind {
                policy: policy.name().to_owned(),
                reason: "limits requests in flight: hold a slot with Limiter::take_slot and give \
                         it back with Slot::release",
            }
            .into(),
            None => unknown_policy(name),
        }
    }

    /// Every policy, in the order they were added.
    pub fn policies(&self) -> impl Iterator<Item = &Policy> {
        self.inner.policies.list().iter()
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.inner.clock
    }
}

#[cold]
fn cost_exceeds_quota(policy: &Policy, cost: u32, max: u32) -> Error {
    ErrorKind::CostExceedsQuota {
        policy: policy.name().to_owned(),
        cost,
        max,
    }
    .into()
}

#[cold]
fn unknown_policy(name: &str) -> Error {
    ErrorKind::UnknownPolicy(name.chars().take(128).collect()).into()
}

/// Gives a held slot back when [`Limiter::acquire`] is dropped before the slot came.
struct RefundOnDrop<S: Store, C: Clock> {
    limiter: Limiter<S, C>,
    policy: String,
    key: Vec<u8>,
    cost: u32,
    armed: bool,
}

impl<S: Store, C: Clock> Drop for RefundOnDrop<S, C> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // The refund talks to the store, which may be remote: it runs as its own task. Outside
        // a runtime there is nothing to run it on, and the slot simply passes unused.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let limiter = self.limiter.clone();
        let policy = std::mem::take(&mut self.policy);
        let key = std::mem::take(&mut self.key);
        let cost = self.cost;
        runtime.spawn(async move {
            if let Some(p) = limiter.policy(&policy) {
                let now = limiter.clock().now();
                // A failed refund only means the slot passes unused.
                let _ = limiter
                    .store()
                    .refund(now, &[Check::new(p, &key, cost)])
                    .await;
            }
        });
    }
}
