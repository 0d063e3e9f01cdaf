//! Where state lives: the [`Store`] trait, which applies algorithm steps to keys atomically, and
//! the in-process [`MemoryStore`].

use std::future::Future;

use crate::{BanRecord, Decision, Decisions, Policy, StoreError, Timestamp};

pub mod memory;
pub mod snapshot;

pub use memory::{MemoryStore, MemoryStoreBuilder};

/// One request against one policy: the unit a store decides on.
#[derive(Clone, Copy, Debug)]
pub struct Check<'a> {
    /// The policy, which carries the algorithm and its quota.
    pub policy: &'a Policy,
    /// The key counted against (an API key, a user id, an IP prefix...), any bytes, any length.
    pub key: &'a [u8],
    /// What the request costs; 0 peeks without consuming.
    pub cost: u32,
    /// The permit a [concurrency](crate::Quota::Concurrency) check takes: any value but 0,
    /// chosen by the caller (one random value per request), which names it again to
    /// [release](Store::release) it. A concurrency check of cost above 0 with permit 0 is
    /// denied for good: nobody could give that permit back. Every other algorithm ignores it.
    pub permit: u64,
}

impl<'a> Check<'a> {
    /// A check of `key` against `policy` for `cost`, naming no permit.
    pub fn new(policy: &'a Policy, key: &'a [u8], cost: u32) -> Self {
        Check {
            policy,
            key,
            cost,
            permit: 0,
        }
    }

    /// The same check naming permit `id` (see [`permit`](Self::permit)).
    pub fn with_permit(self, id: u64) -> Self {
        Check { permit: id, ..self }
    }
}

/// Persists algorithm state and applies algorithm steps to it, atomically.
///
/// # Contract
///
/// - [`apply`](Self::apply) decides every check of one request as one atomic step: no other
///   request observes or changes the keys in between, so concurrent callers (threads, tasks,
///   processes sharing a Redis) never over-admit.
/// - All-or-nothing: the request is admitted only if every check admits it; then each has
///   consumed its cost. If any denies it, none has consumed anything, and the decisions of the
///   checks that would have admitted it report their quota as it stands.
/// - Decisions equal those of the pure algorithms in [`crate::algorithm`] applied in order.
/// - `now` is the caller's clock. A store with an authoritative clock of its own (Redis `TIME`,
///   so instances with skewed clocks agree) may use that instead; decisions carry durations,
///   never absolute times, so callers need not know which.
/// - Every key's state expires once its quota has fully reset; a store never grows without
///   bound.
/// - A [concurrency](crate::Quota::Concurrency) check holds its permit from its admission
///   until [`release`](Self::release) gives it back, or until `lease_ttl` after it was taken
///   (`now >= expires_at`, and no sooner). A request denied by any policy holds no permit.
/// - A check whose policy has a [`Ban`](crate::Ban) is decided with its key's lockout record in
///   the same atomic step: refused while banned (the quota untouched), and when its own quota
///   denies it (cost above zero), the denial is counted and may start a ban, as the rule's
///   state machine says. [`charge`](Self::charge) and [`refund`](Self::refund) ignore bans.
///
/// The crate's `testing` module (feature `test-util`) holds a conformance suite that checks
/// this contract against any implementation.
pub trait Store: Send + Sync + 'static {
    /// Decides `checks` atomically and all-or-nothing; returns one decision per check, in order.
    fn apply(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
    ) -> impl Future<Output = Result<Decisions, StoreError>> + Send;

    /// Decides one check: [`apply`](Self::apply) for the common single-policy request, which a
    /// store can answer without collecting a list.
    fn apply_one(
        &self,
        now: Timestamp,
        check: Check<'_>,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        async move {
            let decisions = self.apply(now, &[check]).await?;
            decisions.into_first().ok_or_else(|| StoreError::Protocol {
                reason: "the store returned no decision".to_owned(),
            })
        }
    }

    /// Decides one check on the spot, when this store can: what [`apply_one`](Self::apply_one)
    /// would resolve to, with no future around it. `None` (the default) says "not here", and
    /// the caller awaits `apply_one` instead; a store may say it for any check.
    ///
    /// [`Limiter::check`](crate::Limiter::check) asks here first. The memory store answers
    /// every check of a policy without a [`Ban`](crate::Ban). Why a second way in: a decision
    /// that comes out of a future, or out of a branch that may also call the lockouts'
    /// out-of-line path, is built in a temporary and copied, and the copy reads back with one
    /// 16-byte load what was just stored as 8-byte words, which the processor cannot forward
    /// from its store buffer. Here it is built where the caller receives it: 27 ns a check of
    /// one hot key rather than 32 (`benches/check.rs`).
    fn apply_one_immediately(&self, now: Timestamp, check: Check<'_>) -> Option<Decision> {
        let _ = (now, check);
        None
    }

    /// Charges each check's cost whatever the quota says, never refusing: a usage report, or
    /// the true-up of a cost known only once the response is out (tokens an AI API answered
    /// with). Each check is charged on its own, atomically per key, even past the limit; the
    /// decisions say what each key has left afterwards (admitted, as a peek is).
    ///
    /// A concurrency check is not charged (it counts requests in flight, not usage): its
    /// decision is a peek's.
    fn charge(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
    ) -> impl Future<Output = Result<Decisions, StoreError>> + Send;

    /// Gives back the cost of checks that were admitted but abandoned before they were used (a
    /// request held for its leaky-bucket slot whose client went away). A concurrency check's
    /// refund gives its permit back, as [`release`](Self::release) does.
    fn refund(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Gives back each concurrency check's permit ([`Check::permit`]) of its key, at the end of
    /// its request; returns how many of them the keys still held. A permit that expired, was
    /// never taken or was already released counts 0 and changes nothing, so releasing twice is
    /// harmless. Checks of other algorithms are ignored (their cost is not given back: that is
    /// [`refund`](Self::refund)).
    fn release(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
    ) -> impl Future<Output = Result<u32, StoreError>> + Send;

    /// The bans in force at `now` (see [`Ban`](crate::Ban)), every policy's, in no particular
    /// order. The default lists none: a store that keeps bans (every store of this workspace
    /// does, and the conformance suite checks it) overrides this and
    /// [`lift_ban`](Self::lift_ban); a store that wraps another forwards both.
    fn bans(
        &self,
        now: Timestamp,
    ) -> impl Future<Output = Result<Vec<BanRecord>, StoreError>> + Send {
        let _ = now;
        std::future::ready(Ok(Vec::new()))
    }

    /// Lifts the ban of `key` under the policy named `policy`, forgetting its record (the key
    /// starts afresh, its quota as it stands); whether a ban was in force at `now`.
    fn lift_ban(
        &self,
        now: Timestamp,
        policy: &str,
        key: &[u8],
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let _ = (now, policy, key);
        std::future::ready(Ok(false))
    }

    /// Whether every future this store returns is ready on its first poll: an in-process store
    /// that never waits for I/O. A caller may then decide inside a synchronous function, polling
    /// the decision once with a no-op waker, and skip the boxed future an asynchronous store
    /// needs (the HTTP layer does, on every request).
    ///
    /// Returning `true` is a promise: a store that breaks it sees its pending decisions dropped
    /// and treated as store failures. The default, `false`, is always correct.
    fn is_immediate(&self) -> bool {
        false
    }
}
