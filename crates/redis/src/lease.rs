//! Hot-key leases held by this instance: per (policy, key), a batch of quota taken from Redis in
//! one script call and spent here until it runs out or its time is up (`docs/redis.md` states
//! the bound on what N instances can over-admit together, and proves it).
//!
//! A lease's time is kept on the lease clock: this process's monotonic clock when Redis's clock
//! decides (the span Redis granted, counted from before the request was sent, so the lease
//! ends here no later than it does in Redis), or the caller's `now` with `clock = local`.
//! One task renews a lease while the others of the same key wait for it, so an instance holds
//! at most one lease per (policy, key).
//!
//! Per policy, counters say what the leases did ([`LeaseStats`], in `lease/stats.rs`).

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;
use tollgate::{Policy, Verdict};

use crate::deny_cache::CacheKey;

mod stats;
pub(crate) use stats::LeaseCounters;
pub use stats::LeaseStats;

const SHARDS: usize = 16;

/// The leases of this instance, bounded like the deny cache.
pub(crate) struct Leases {
    shards: Vec<Mutex<HashMap<CacheKey, Arc<Slot>>>>,
    per_shard: usize,
    /// Per policy name, kept for the life of the store (a reload keeps a policy's counts).
    counters: Mutex<HashMap<&'static str, Arc<LeaseCounters>>>,
}

/// One (policy, key)'s lease.
pub(crate) struct Slot {
    /// The policy, for returning units to Redis.
    policy: Policy,
    /// Its policy's counters.
    counters: Arc<LeaseCounters>,
    held: Mutex<Held>,
    /// Woken when a renewal ends (granted, denied or failed).
    pub(crate) renewed: Notify,
}

/// What one lease holds.
#[derive(Clone, Copy, Debug, Default)]
struct Held {
    /// Units left to spend.
    units: u32,
    /// Lease clock (µs) until which they may be spent.
    until: u64,
    /// Lease clock when taken.
    taken_at: u64,
    /// The quota's limit, and what Redis had left beyond this lease when it was taken.
    limit: u64,
    remaining: u64,
    /// The quota's reset when taken.
    reset: u64,
    /// Where the units were taken, for their return (see [`Grant`]).
    guard: u64,
    renewing: bool,
}

/// A lease just taken from Redis.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Grant {
    /// Units left after the request that took it, and what that request spent.
    pub(crate) units: u32,
    pub(crate) spent: u32,
    /// Lease clock when the request was sent, and until when the units may be spent.
    pub(crate) taken_at: u64,
    pub(crate) until: u64,
    /// The verdict for taking the whole lease (its `remaining` excludes the lease).
    pub(crate) after_grant: Verdict,
    /// The window end (fixed window, sliding window counter) or the score the units were
    /// logged at (sliding window log) that a return must match; 0 for a token bucket.
    pub(crate) guard: u64,
}

/// Units to give back to Redis: a lease's leftover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Leftover {
    pub(crate) units: u32,
    pub(crate) guard: u64,
}

/// A leftover with what returning it to Redis needs: the (policy, key) it came from. Counted
/// as returned when it is taken out of its lease.
#[derive(Clone, Debug)]
pub(crate) struct Returned {
    pub(crate) key: CacheKey,
    pub(crate) policy: Policy,
    pub(crate) left: Leftover,
}

/// What [`Slot::take`] found.
pub(crate) enum Take {
    /// Spent from the lease.
    Spent(Verdict),
    /// Another task is renewing the lease: wait for it, then try again.
    Wait,
    /// This task renews the lease; the old one's leftover, if any, goes back to Redis.
    Renew(Option<Leftover>),
}

impl Leases {
    pub(crate) fn new(size: usize) -> Self {
        Leases {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: size.div_ceil(SHARDS),
            counters: Mutex::new(HashMap::new()),
        }
    }

    /// `policy`'s counters, made on its first lease slot.
    fn counters(&self, policy: &Policy) -> Arc<LeaseCounters> {
        let mut map = self.counters.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(map.entry(policy.name()).or_default())
    }

    /// Every policy's counters so far, by name.
    pub(crate) fn stats(&self) -> Vec<LeaseStats> {
        let map = self.counters.lock().unwrap_or_else(PoisonError::into_inner);
        let mut list: Vec<LeaseStats> = map.iter().map(|(name, c)| c.read(name)).collect();
        list.sort_by(|a, b| a.policy.cmp(&b.policy));
        list
    }

    /// Requests admitted from leases, every policy.
    pub(crate) fn spends(&self) -> u64 {
        let map = self.counters.lock().unwrap_or_else(PoisonError::into_inner);
        map.values().map(|c| c.spends.load(Relaxed)).sum()
    }

    fn shard(&self, key: &CacheKey) -> MutexGuard<'_, HashMap<CacheKey, Arc<Slot>>> {
        // The key's hash tag is uniformly distributed: its low bits pick the shard.
        self.shards[(key.1 as usize) % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The slot of `key` (of `policy`), made if needed. `None` when the table is full of live
    /// leases: that request then goes to Redis without one. Expired slots that make room hand
    /// back their leftover through `evicted`.
    pub(crate) fn slot(
        &self,
        key: CacheKey,
        policy: &Policy,
        now: u64,
        evicted: &mut Vec<Returned>,
    ) -> Option<Arc<Slot>> {
        let mut shard = self.shard(&key);
        if let Some(slot) = shard.get(&key) {
            return Some(slot.clone());
        }
        if self.per_shard == 0 {
            return None;
        }
        if shard.len() >= self.per_shard {
            shard.retain(|key, slot| {
                // In use elsewhere (a task holds it) or still live: keep.
                if Arc::strong_count(slot) > 1 {
                    return true;
                }
                let held = slot.lock();
                if held.renewing || (held.units > 0 && held.until > now) {
                    return true;
                }
                if held.units > 0 {
                    slot.counters
                        .returned
                        .fetch_add(u64::from(held.units), Relaxed);
                    evicted.push(Returned {
                        key: *key,
                        policy: slot.policy.clone(),
                        left: Leftover {
                            units: held.units,
                            guard: held.guard,
                        },
                    });
                }
                false
            });
            if shard.len() >= self.per_shard {
                return None;
            }
        }
        let slot = Arc::new(Slot::new(policy.clone(), self.counters(policy)));
        shard.insert(key, slot.clone());
        Some(slot)
    }

    /// Takes every lease's units out, for their return (shutting down).
    pub(crate) fn drain(&self) -> Vec<Returned> {
        let mut out = Vec::new();
        for shard in &self.shards {
            let shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            for (key, slot) in shard.iter() {
                let mut held = slot.lock();
                if held.units > 0 {
                    slot.counters
                        .returned
                        .fetch_add(u64::from(held.units), Relaxed);
                    out.push(Returned {
                        key: *key,
                        policy: slot.policy.clone(),
                        left: Leftover {
                            units: held.units,
                            guard: held.guard,
                        },
                    });
                    held.units = 0;
                }
            }
        }
        out
    }
}

impl Slot {
    pub(crate) fn new(policy: Policy, counters: Arc<LeaseCounters>) -> Self {
        Slot {
            policy,
            counters,
            held: Mutex::new(Held::default()),
            renewed: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Spends `cost` at lease-clock time `now` if the lease has it; otherwise says who renews.
    pub(crate) fn take(&self, now: u64, cost: u32) -> Take {
        let mut held = self.lock();
        if now < held.until && now >= held.taken_at && held.units >= cost {
            held.units -= cost;
            // Two relaxed adds to one line, the policy's counters: with the slot's lock, the
            // only shared writes of a spend.
            self.counters.spent.fetch_add(u64::from(cost), Relaxed);
            self.counters.spends.fetch_add(1, Relaxed);
            return Take::Spent(held.verdict(now));
        }
        if held.renewing {
            return Take::Wait;
        }
        held.renewing = true;
        let leftover = (held.units > 0).then_some(Leftover {
            units: held.units,
            guard: held.guard,
        });
        self.counters
            .returned
            .fetch_add(u64::from(held.units), Relaxed);
        held.units = 0;
        Take::Renew(leftover)
    }

    /// Installs a lease just granted, ending the renewal.
    pub(crate) fn install(&self, grant: &Grant) {
        let c = &self.counters;
        c.grants.fetch_add(1, Relaxed);
        c.taken
            .fetch_add(u64::from(grant.units) + u64::from(grant.spent), Relaxed);
        c.spent.fetch_add(u64::from(grant.spent), Relaxed);
        {
            let mut held = self.lock();
            *held = Held {
                units: grant.units,
                until: grant.until,
                taken_at: grant.taken_at,
                limit: grant.after_grant.limit,
                remaining: grant.after_grant.remaining,
                reset: grant.after_grant.reset_micros,
                guard: grant.guard,
                renewing: false,
            };
        }
        self.renewed.notify_waiters();
    }

    /// Ends a renewal that got no lease (denied, or Redis failed).
    pub(crate) fn release(&self) {
        self.lock().renewing = false;
        self.renewed.notify_waiters();
    }
}

impl Held {
    /// The verdict of a spend: what this lease and Redis (as of the grant) have left.
    fn verdict(&self, now: u64) -> Verdict {
        Verdict {
            allowed: true,
            limit: self.limit,
            remaining: self.remaining + u64::from(self.units),
            reset_micros: self.reset.saturating_sub(now - self.taken_at),
            retry_after_micros: None,
            delay_micros: 0,
        }
    }
}

/// Ends a renewal when the renewing task stops early (its request was dropped): the waiting
/// tasks must not wait for a renewal nobody finishes.
pub(crate) struct Renewal<'a> {
    slot: &'a Slot,
    done: bool,
}

impl<'a> Renewal<'a> {
    pub(crate) fn new(slot: &'a Slot) -> Self {
        Renewal { slot, done: false }
    }

    pub(crate) fn install(mut self, grant: &Grant) {
        self.slot.install(grant);
        self.done = true;
    }
}

impl Drop for Renewal<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.slot.release();
        }
    }
}

/// The lease-clock time until which a lease granted for `span` µs (Redis's clock: from its
/// `now` to the lease's end) may be spent, counted from `sent` (the lease clock when the
/// request left): Redis read its clock after that, so the lease ends here first. With Redis's
/// clock, a margin of 1/2000 of the span covers clocks that run apart by up to 500 ppm (the most
/// NTP slews a clock).
pub(crate) fn until(sent: u64, span: u64, redis_clock: bool) -> u64 {
    let margin = if redis_clock { span.div_ceil(2000) } else { 0 };
    sent.saturating_add(span - margin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn policy() -> Policy {
        let q = tollgate::Quota::fixed_window(100, Duration::from_secs(1));
        Policy::new("lease-test", q.unwrap_or_else(|e| panic!("{e}")))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn grant(units: u32, taken_at: u64, until: u64) -> Grant {
        Grant {
            units,
            spent: 1,
            taken_at,
            until,
            after_grant: Verdict {
                allowed: true,
                limit: 100,
                remaining: 50,
                reset_micros: 1_000,
                retry_after_micros: None,
                delay_micros: 0,
            },
            guard: 7,
        }
    }

    #[test]
    fn spends_until_empty_or_expired_then_one_task_renews() {
        let slot = Slot::new(policy(), Arc::default());
        assert!(matches!(slot.take(0, 1), Take::Renew(None)));
        assert!(
            matches!(slot.take(0, 1), Take::Wait),
            "one renewer at a time"
        );
        slot.install(&grant(3, 100, 200));
        let Take::Spent(v) = slot.take(150, 2) else {
            panic!("the lease has 3")
        };
        assert_eq!((v.remaining, v.reset_micros), (51, 950));
        assert!(matches!(
            slot.take(150, 2),
            Take::Renew(Some(Leftover { units: 1, guard: 7 }))
        ));
        slot.install(&grant(5, 100, 200));
        assert!(matches!(slot.take(200, 1), Take::Renew(Some(_))), "expired");
    }

    #[test]
    fn a_dropped_renewal_frees_the_waiters() {
        let slot = Slot::new(policy(), Arc::default());
        assert!(matches!(slot.take(0, 1), Take::Renew(None)));
        drop(Renewal::new(&slot));
        assert!(matches!(slot.take(0, 1), Take::Renew(None)));
    }

    #[test]
    fn leases_end_before_redis_ends_them() {
        assert_eq!(until(1_000, 1_000_000, true), 1_000 + 1_000_000 - 500);
        assert_eq!(until(1_000, 1_000_000, false), 1_001_000);
    }

    #[test]
    fn the_table_stays_bounded() {
        let leases = Leases::new(16);
        let mut evicted = Vec::new();
        let held: Vec<_> = (0..16u128)
            .filter_map(|i| leases.slot((1, i * 16), &policy(), 0, &mut evicted))
            .collect();
        assert_eq!(held.len(), 1, "one shard holds one slot");
        assert!(
            leases.slot((1, 32), &policy(), 0, &mut evicted).is_none(),
            "full of slots in use"
        );
        drop(held);
        assert!(
            leases.slot((1, 32), &policy(), 0, &mut evicted).is_some(),
            "idle slots make room"
        );
    }

    #[test]
    fn counters_account_for_every_unit_taken() {
        let leases = Leases::new(16);
        let mut evicted = Vec::new();
        let slot = leases.slot((1, 0), &policy(), 0, &mut evicted);
        let slot = slot.unwrap_or_else(|| panic!("room for one slot"));
        assert!(matches!(slot.take(0, 1), Take::Renew(None)));
        // Took 4 units for a request of 1: 3 held.
        slot.install(&grant(3, 100, 200));
        assert!(matches!(slot.take(150, 1), Take::Spent(_)));
        // A cost of 5 does not fit: the 2 left go back, another lease of 4 comes.
        assert!(matches!(slot.take(150, 5), Take::Renew(Some(_))));
        slot.install(&grant(3, 100, 200));
        let stats = |leases: &Leases| leases.stats().pop().unwrap_or_default();
        let s = stats(&leases);
        assert_eq!(
            (
                s.grants,
                s.units_taken,
                s.units_spent,
                s.units_returned,
                s.units_held()
            ),
            (2, 8, 3, 2, 3)
        );
        assert_eq!(leases.spends(), 1, "one request spent without Redis");
        assert_eq!(leases.drain().len(), 1);
        let s = stats(&leases);
        assert_eq!(s.policy, "lease-test");
        assert_eq!((s.units_returned, s.units_held()), (5, 0));
        assert_eq!(s.units_taken, s.units_spent + s.units_returned);
    }
}
