//! Concurrency: at most `limit` requests in flight per key. A request takes a *permit* when it
//! is admitted and gives it back when it ends ([`Store::release`](crate::Store::release)); a
//! permit that is never given back (a crashed instance, a door that cannot see the end) is taken
//! back when its `lease_ttl` passes.
//!
//! Unlike the rate algorithms, a decision here depends on *which* permit the request holds: the
//! caller names it ([`Check::permit`](crate::Check::permit)), so a request that asks again with
//! the permit it already holds renews it instead of taking a second one. The decision itself
//! ([`Concurrency::decide`]) reads only an [`Occupancy`], a summary of the key's permits as seen
//! by that permit, which both the memory store (from a [`ConcurrencyState`]) and the Redis store
//! (from what its script reports) compute: one piece of arithmetic decides for both.
//!
//! A charge ([`Store::charge`](crate::Store::charge)) takes nothing (a concurrency limit counts
//! requests in flight, not usage) and answers as a peek; a refund gives the permit back, as a
//! release does. [`Limiter::check`](crate::Limiter::check) names no permit, so it cannot take
//! one (denied for good): callers that hold permits call the store with
//! [`Check::with_permit`](crate::Check::with_permit).

use std::time::Duration;

use super::never;
use crate::clock::duration_micros;
use crate::quota::MAX_PERIOD;
use crate::{QuotaError, Timestamp, Verdict};

/// At most `limit` permits held per key at once, each taken back `lease_ttl` after it was last
/// taken or renewed if nobody gives it back first.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Concurrency {
    limit: u32,
    lease_ttl: u64,
}

/// The permits a key holds: `(expires_at, id)`, in microseconds since the epoch, earliest expiry
/// first (ties by id). At most `limit` of them are live at once, and the vector never holds
/// room for more than `limit`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConcurrencyState {
    /// `(expires_at, id)` of each permit held, sorted.
    pub permits: Vec<(u64, u64)>,
}

/// What a decision needs to know of a key's live permits at one instant, as seen by the permit
/// the request names: how many *other* permits are live and when the earliest of them expires,
/// and whether the request's own permit is already held (a renewal).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Occupancy {
    /// Live permits other than the request's own.
    pub others: u64,
    /// When the earliest of those expires (µs since the epoch); 0 when there are none.
    pub others_earliest: u64,
    /// When the request's own permit expires (µs since the epoch); 0 when the key does not
    /// hold it.
    pub own: u64,
}

impl Concurrency {
    /// The longest `retry_after` a denial reports: one second. A permit usually comes back as
    /// soon as some request ends, which nobody can know in advance, so a denial says "soon"
    /// rather than the time until the earliest permit would be taken back by its TTL (minutes,
    /// typically), and says less only when that is sooner.
    pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(1);

    /// At most `limit` (at least 1) permits per key, each taken back `lease_ttl` (above zero,
    /// at most 400 days) after it was taken if it is not given back.
    pub fn new(limit: u32, lease_ttl: Duration) -> Result<Self, QuotaError> {
        let input = format!("concurrency limit={limit} lease_ttl={lease_ttl:?}");
        if limit == 0 {
            return Err(QuotaError::new(&input, "limit must be at least 1"));
        }
        let micros = duration_micros(lease_ttl);
        if micros == 0 || lease_ttl > MAX_PERIOD {
            return Err(QuotaError::new(
                &input,
                "lease_ttl must be above zero and at most 400 days",
            ));
        }
        Ok(Concurrency {
            limit,
            lease_ttl: micros,
        })
    }

    /// The most permits a key holds at once.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// How long a permit lives if it is not given back.
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_micros(self.lease_ttl)
    }

    /// [`lease_ttl`](Self::lease_ttl) in microseconds.
    pub fn lease_ttl_micros(&self) -> u64 {
        self.lease_ttl
    }

    /// The verdict for a request of `cost` naming permit `permit` at `now`, on a key whose live
    /// permits are `occupancy` (no permit in it expired by `now`).
    ///
    /// - Admitted iff `others + cost <= limit`: a request's own permit, when the key already
    ///   holds it, is the one it takes again, so renewing never needs a free permit. For the
    ///   usual cost of 1 this is "`live + 1 <= limit`" for a new permit.
    /// - A cost of 0 peeks: admitted, nothing taken. A cost above the limit, or a cost above 0
    ///   with permit id 0 (no permit named: it could never be given back), is denied for good,
    ///   with no `retry_after`.
    /// - `remaining`: the permits free after this request (after taking its own when admitted).
    /// - `reset`: the time until a permit is expected free: 0 while one is (after this
    ///   request), else the same wait as `retry_after`. Not the time until the earliest permit
    ///   expires: requests usually end long before their TTL, and a client that waits for
    ///   `reset` (the `t` of the `RateLimit` header) when nothing is left must wait seconds,
    ///   not minutes.
    /// - `retry_after` when denied: the time until the earliest other permit expires, at most
    ///   [`MAX_RETRY_AFTER`](Self::MAX_RETRY_AFTER): a permit usually comes back sooner, when
    ///   some request ends.
    pub fn decide(&self, occupancy: Occupancy, now: Timestamp, cost: u32, permit: u64) -> Verdict {
        let now_us = now.as_micros();
        let limit = u64::from(self.limit);
        let held = occupancy.own > 0;
        let live = occupancy.others + u64::from(held);
        let available = limit.saturating_sub(live);
        let earliest = match (occupancy.others > 0, held) {
            (true, true) => occupancy.others_earliest.min(occupancy.own),
            (true, false) => occupancy.others_earliest,
            (false, true) => occupancy.own,
            (false, false) => now_us,
        };
        // A permit comes back when some request ends, or at the latest when the earliest one
        // expires; the wait a full key advertises is capped like `retry_after`.
        let soon = earliest
            .saturating_sub(now_us)
            .clamp(1, duration_micros(Self::MAX_RETRY_AFTER));
        let reset = if available > 0 { 0 } else { soon };
        if cost > self.limit || (cost > 0 && permit == 0) {
            return never(self.limit, available, reset);
        }
        if cost == 0 {
            return Verdict {
                allowed: true,
                limit,
                remaining: available,
                reset_micros: reset,
                retry_after_micros: None,
                delay_micros: 0,
            };
        }
        if occupancy.others + u64::from(cost) <= limit {
            let remaining = limit - occupancy.others - 1;
            let expires = now_us.saturating_add(self.lease_ttl);
            let first = if occupancy.others > 0 {
                occupancy.others_earliest.min(expires)
            } else {
                expires
            };
            let soon = first
                .saturating_sub(now_us)
                .clamp(1, duration_micros(Self::MAX_RETRY_AFTER));
            return Verdict {
                allowed: true,
                limit,
                remaining,
                reset_micros: if remaining > 0 { 0 } else { soon },
                retry_after_micros: None,
                delay_micros: 0,
            };
        }
        // Denied with cost <= limit: some other permit is live, and it expires after `now`.
        let until = occupancy.others_earliest.saturating_sub(now_us).max(1);
        Verdict {
            allowed: false,
            limit,
            remaining: available,
            reset_micros: reset,
            retry_after_micros: Some(until.min(duration_micros(Self::MAX_RETRY_AFTER))),
            delay_micros: 0,
        }
    }

    /// Decides without taking anything: drops the permits expired by `now` (normalising, which
    /// changes no later decision) and applies [`decide`](Self::decide).
    pub fn evaluate(
        &self,
        state: &mut ConcurrencyState,
        now: Timestamp,
        cost: u32,
        permit: u64,
    ) -> Verdict {
        state.prune(now.as_micros());
        self.decide(state.occupancy(permit), now, cost, permit)
    }

    /// Takes (or renews) `permit` until `now + lease_ttl`. Call it only after
    /// [`evaluate`](Self::evaluate) admitted the same request at the same `now`; a cost of 0 or
    /// a permit id of 0 takes nothing.
    pub fn commit(&self, state: &mut ConcurrencyState, now: Timestamp, cost: u32, permit: u64) {
        if cost == 0 || permit == 0 {
            return;
        }
        let now = now.as_micros();
        state.prune(now);
        state.take(
            permit,
            now.saturating_add(self.lease_ttl),
            self.limit as usize,
        );
    }

    /// Evaluates and, when admitted, commits: one request against one policy.
    pub fn check(
        &self,
        state: &mut ConcurrencyState,
        now: Timestamp,
        cost: u32,
        permit: u64,
    ) -> Verdict {
        let verdict = self.evaluate(state, now, cost, permit);
        if verdict.allowed {
            self.commit(state, now, cost, permit);
        }
        verdict
    }

    /// Gives `permit` back; whether the key still held it at `now` (false for a permit that
    /// expired, was never taken or was already given back: releasing twice changes nothing).
    pub fn release(&self, state: &mut ConcurrencyState, now: Timestamp, permit: u64) -> bool {
        state.prune(now.as_micros());
        state.remove(permit)
    }

    /// The time from which `state` is equivalent to a key never seen: when its latest permit
    /// expires (the epoch when it holds none).
    pub fn expires_at(&self, state: &ConcurrencyState) -> Timestamp {
        Timestamp::from_micros(state.permits.iter().map(|&(e, _)| e).max().unwrap_or(0))
    }
}

impl ConcurrencyState {
    /// Drops the permits taken back by `now`: a permit expiring at `e` is live while `now < e`.
    pub fn prune(&mut self, now: u64) {
        let expired = self.permits.partition_point(|&(e, _)| e <= now);
        if expired > 0 {
            self.permits.drain(..expired);
            self.shrink();
        }
    }

    /// The key's permits as `permit` sees them (call [`prune`](Self::prune) first).
    pub fn occupancy(&self, permit: u64) -> Occupancy {
        let mut occupancy = Occupancy::default();
        for &(expires, id) in &self.permits {
            if id == permit && permit != 0 {
                occupancy.own = expires;
            } else {
                if occupancy.others == 0 {
                    occupancy.others_earliest = expires;
                }
                occupancy.others += 1;
            }
        }
        occupancy
    }

    /// Holds `permit` until `expires` (renewing it if held), keeping the order, with room for
    /// at most `limit` permits: a key never reserves memory for permits it cannot hold.
    pub(crate) fn take(&mut self, permit: u64, expires: u64, limit: usize) {
        if let Some(i) = self.permits.iter().position(|&(_, id)| id == permit) {
            self.permits.remove(i);
        } else if self.permits.len() == self.permits.capacity() {
            let len = self.permits.len();
            let target = (len * 2).clamp(1, limit.max(len + 1));
            self.permits.reserve_exact(target - len);
        }
        let at = self.permits.partition_point(|&p| p < (expires, permit));
        self.permits.insert(at, (expires, permit));
    }

    /// Removes `permit`; whether it was there.
    pub(crate) fn remove(&mut self, permit: u64) -> bool {
        if permit == 0 {
            return false;
        }
        let Some(i) = self.permits.iter().position(|&(_, id)| id == permit) else {
            return false;
        };
        self.permits.remove(i);
        self.shrink();
        true
    }

    /// Gives back most of the room of a key whose permits came back.
    fn shrink(&mut self) {
        if self.permits.is_empty() {
            self.permits = Vec::new();
        } else if self.permits.capacity() > 4 && self.permits.len() * 4 <= self.permits.capacity() {
            self.permits.shrink_to(self.permits.len() * 2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 1_800_000_000_000_000;

    fn at(us: u64) -> Timestamp {
        Timestamp::from_micros(T + us)
    }

    #[test]
    fn admits_the_limit_then_denies_soon() -> Result<(), QuotaError> {
        let alg = Concurrency::new(2, Duration::from_secs(300))?;
        let mut s = ConcurrencyState::default();
        let a = alg.check(&mut s, at(0), 1, 11);
        assert!(a.allowed);
        assert_eq!(
            (a.remaining, a.reset_micros),
            (1, 0),
            "a permit is free now"
        );
        let b = alg.check(&mut s, at(10), 1, 22);
        assert!(b.allowed);
        assert_eq!(
            (b.remaining, b.reset_micros),
            (0, 1_000_000),
            "full: one expected within a second, not at the TTL"
        );
        let c = alg.check(&mut s, at(20), 1, 33);
        assert!(!c.allowed);
        assert_eq!(c.remaining, 0);
        assert_eq!(
            c.retry_after_micros,
            Some(1_000_000),
            "soon, not in 5 minutes"
        );
        assert_eq!(s.permits.len(), 2);
        assert!(s.permits.capacity() <= 2);
        // Near the earliest expiry, retry_after is the time left.
        let d = alg.check(&mut s, at(299_999_500), 1, 33);
        assert_eq!(d.retry_after_micros, Some(500));
        // At it, the permit is taken back, and no sooner.
        assert!(alg.check(&mut s, at(300_000_000), 1, 33).allowed);
        Ok(())
    }

    #[test]
    fn renewing_takes_no_second_permit() -> Result<(), QuotaError> {
        let alg = Concurrency::new(2, Duration::from_secs(10))?;
        let mut s = ConcurrencyState::default();
        assert!(alg.check(&mut s, at(0), 1, 7).allowed);
        assert!(alg.check(&mut s, at(5), 1, 8).allowed);
        // Full, but 7 renews its own: admitted, and its expiry moves.
        let v = alg.check(&mut s, at(100), 1, 7);
        assert!(v.allowed, "{v:?}");
        assert_eq!(v.remaining, 0);
        assert_eq!(
            v.reset_micros, 1_000_000,
            "full: soon, capped like retry_after"
        );
        assert_eq!(s.permits, vec![(T + 10_000_005, 8), (T + 10_000_100, 7)]);
        assert!(alg.release(&mut s, at(200), 7));
        assert!(!alg.release(&mut s, at(200), 7), "twice changes nothing");
        assert_eq!(s.permits.len(), 1);
        Ok(())
    }

    #[test]
    fn peeks_and_impossible_costs() -> Result<(), QuotaError> {
        let alg = Concurrency::new(3, Duration::from_secs(10))?;
        let mut s = ConcurrencyState::default();
        let peek = alg.check(&mut s, at(0), 0, 9);
        assert!(peek.allowed && peek.remaining == 3 && peek.reset_micros == 0);
        assert!(s.permits.is_empty(), "a peek takes nothing");
        let big = alg.check(&mut s, at(0), 4, 9);
        assert!(!big.allowed && big.retry_after_micros.is_none());
        let anonymous = alg.check(&mut s, at(0), 1, 0);
        assert!(!anonymous.allowed && anonymous.retry_after_micros.is_none());
        assert!(s.permits.is_empty());
        // A cost of 2 needs two free permits but holds one.
        assert!(alg.check(&mut s, at(0), 1, 1).allowed);
        assert!(alg.check(&mut s, at(0), 2, 2).allowed);
        assert!(!alg.check(&mut s, at(0), 2, 3).allowed);
        assert_eq!(alg.expires_at(&s), at(10_000_000));
        Ok(())
    }

    #[test]
    fn bad_quotas_are_refused() {
        assert!(Concurrency::new(0, Duration::from_secs(1)).is_err());
        assert!(Concurrency::new(1, Duration::ZERO).is_err());
        assert!(Concurrency::new(1, Duration::from_nanos(999)).is_err());
        assert!(Concurrency::new(1, MAX_PERIOD + Duration::from_secs(1)).is_err());
        assert!(Concurrency::new(1, MAX_PERIOD).is_ok());
    }
}
