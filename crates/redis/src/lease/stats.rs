//! Per policy, what this instance's hot-key leases did: counted once per grant and per return,
//! and per spend with two relaxed increments next to the lease's lock the spend takes anyway.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// One policy's lease counters, in units but for `grants` and `spends`. Every unit taken is
/// spent, returned or still held: `taken = spent + returned + held`.
#[derive(Default)]
pub(crate) struct LeaseCounters {
    pub(super) grants: AtomicU64,
    pub(super) taken: AtomicU64,
    pub(super) spent: AtomicU64,
    pub(super) returned: AtomicU64,
    /// Requests admitted from a lease without calling Redis.
    pub(super) spends: AtomicU64,
}

impl LeaseCounters {
    /// The counters as `policy`'s [`LeaseStats`].
    pub(super) fn read(&self, policy: &str) -> LeaseStats {
        LeaseStats {
            policy: policy.to_owned(),
            // Taken last: a unit is counted taken before it is spent or returned, so reading
            // it last keeps the held units from looking short (`units_held` saturates too).
            units_spent: self.spent.load(Relaxed),
            units_returned: self.returned.load(Relaxed),
            grants: self.grants.load(Relaxed),
            units_taken: self.taken.load(Relaxed),
        }
    }
}

/// One policy's hot-key leases on this instance since the store was built
/// ([`RedisStore::lease_stats`](crate::RedisStore::lease_stats)). Every unit taken is spent,
/// returned or still held; read while requests run, the four counters may be a few units apart
/// from that sum.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseStats {
    /// The policy's name.
    pub policy: String,
    /// Leases taken from Redis (script calls that granted one).
    pub grants: u64,
    /// Units those leases took from Redis.
    pub units_taken: u64,
    /// Units admitted requests spent from leases (the request that takes a lease spends its
    /// cost from it).
    pub units_spent: u64,
    /// Unspent units handed back to Redis: when a lease is renewed (expired, or short of a
    /// request's cost), dropped to make room, or returned at shutdown
    /// ([`RedisStore::return_leases`](crate::RedisStore::return_leases)). Redis ignores the
    /// units of a window that has ended; a return that fails counts in `errors`.
    pub units_returned: u64,
}

impl LeaseStats {
    /// Units this instance's leases hold now: taken, neither spent nor returned.
    pub fn units_held(&self) -> u64 {
        self.units_taken
            .saturating_sub(self.units_spent.saturating_add(self.units_returned))
    }
}
