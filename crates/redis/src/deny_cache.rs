//! The deny cache: once a (policy, key) is denied until T, further single checks of
//! it are answered from process memory until T, so a client hammering a limit it has hit costs
//! Redis nothing. Bounded: sharded maps with a fixed total size.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tollgate::Verdict;

const SHARDS: usize = 16;

/// Identifies a (policy, key): the policy fingerprint and the key's hash tag (already a keyed
/// hash, so clients cannot aim collisions at each other).
pub(crate) type CacheKey = (u64, u128);

#[derive(Clone, Copy, Debug)]
struct Entry {
    /// When the denial was decided, in the store's cache clock (µs).
    at: u64,
    /// When the cached denial ends (µs, same clock): `at + retry_after`.
    until: u64,
    /// The smallest cost denied: a larger cost is denied at least as long.
    cost: u32,
    verdict: Verdict,
}

pub(crate) struct DenyCache {
    shards: Vec<Mutex<HashMap<CacheKey, Entry>>>,
    per_shard: usize,
}

impl DenyCache {
    pub(crate) fn new(size: usize) -> Self {
        DenyCache {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: size.div_ceil(SHARDS),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.per_shard > 0
    }

    fn shard(&self, key: &CacheKey) -> MutexGuard<'_, HashMap<CacheKey, Entry>> {
        // The tag is uniformly distributed: its low bits pick the shard.
        let index = (key.1 as usize) % SHARDS;
        self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached denial of `cost` for `key` at `now`, with its times shortened by the time
    /// elapsed since it was decided.
    pub(crate) fn get(&self, key: &CacheKey, cost: u32, now: u64) -> Option<Verdict> {
        if !self.enabled() || cost == 0 {
            return None;
        }
        let mut shard = self.shard(key);
        let entry = *shard.get(key)?;
        if now >= entry.until || now < entry.at {
            shard.remove(key);
            return None;
        }
        if cost < entry.cost {
            return None;
        }
        let elapsed = now - entry.at;
        let mut v = entry.verdict;
        v.reset_micros = v.reset_micros.saturating_sub(elapsed);
        v.retry_after_micros = Some(entry.until - now);
        Some(v)
    }

    /// Remembers a denial decided at `now`.
    pub(crate) fn insert(&self, key: CacheKey, cost: u32, now: u64, verdict: Verdict) {
        let Some(retry) = verdict.retry_after_micros else {
            return;
        };
        if !self.enabled() || verdict.allowed || retry == 0 {
            return;
        }
        let mut shard = self.shard(&key);
        if shard.len() >= self.per_shard && !shard.contains_key(&key) {
            shard.retain(|_, e| e.until > now);
            if shard.len() >= self.per_shard {
                // Still full of live denials: forget them all rather than grow; they are only
                // a shortcut, Redis still decides correctly.
                shard.clear();
            }
        }
        shard.insert(
            key,
            Entry {
                at: now,
                until: now.saturating_add(retry),
                cost,
                verdict,
            },
        );
    }

    /// Forgets `key` (its quota was refunded, so the denial may end early).
    pub(crate) fn remove(&self, key: &CacheKey) {
        if self.enabled() {
            self.shard(key).remove(key);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied(retry: u64) -> Verdict {
        Verdict {
            allowed: false,
            limit: 5,
            remaining: 0,
            reset_micros: retry,
            retry_after_micros: Some(retry),
            delay_micros: 0,
        }
    }

    #[test]
    fn answers_until_the_retry_time_only() {
        let c = DenyCache::new(100);
        c.insert((1, 2), 1, 1_000, denied(500));
        let v = c.get(&(1, 2), 1, 1_200);
        assert_eq!(v.and_then(|v| v.retry_after_micros), Some(300));
        assert!(c.get(&(1, 2), 1, 1_500).is_none(), "expired at T");
        assert!(c.get(&(1, 3), 1, 1_200).is_none(), "other key");
    }

    #[test]
    fn smaller_costs_and_peeks_go_to_redis() {
        let c = DenyCache::new(100);
        c.insert((1, 2), 3, 0, denied(500));
        assert!(c.get(&(1, 2), 2, 10).is_none());
        assert!(c.get(&(1, 2), 0, 10).is_none());
        assert!(c.get(&(1, 2), 4, 10).is_some());
    }

    #[test]
    fn stays_bounded() {
        let c = DenyCache::new(32);
        for i in 0..10_000u128 {
            c.insert((1, i), 1, 0, denied(1_000_000));
        }
        assert!(c.len() <= 32);
    }

    #[test]
    fn disabled_at_size_zero() {
        let c = DenyCache::new(0);
        c.insert((1, 2), 1, 0, denied(500));
        assert!(c.get(&(1, 2), 1, 1).is_none());
    }
}
