//! The keys a shard's recent sweeps dropped, as bits of their hashes: enough to tell whether the
//! new keys that follow are mostly those same keys coming back.
//!
//! Why: a key whose quota fully comes back between two of its requests (a per-second quota over
//! many clients) is equivalent to no key, so a sweep drops it; then it comes back as a new key,
//! which costs a claim of a slot and sets off the next sweep, over and over. With 100,000 `u64`
//! keys in turn on a bucket of 1,000 a second that was every decision: 85 ns against 38-46 for
//! governor, which never drops a key by itself (`benches/check.rs`, mode `renew`). When most
//! new keys since the last sweep were keys it dropped, the shard keeps its expired entries at
//! the next one instead, and doubles; a flood of keys that do not come back is swept as before.

/// Bits per key the set can hold: with every key it holds, a key that was not dropped reads as
/// dropped under 17% of the time (one bit each, at most 1.5 keys per 8 bits).
const BITS_PER_KEY: usize = 8;

/// The set remembers the last `keys / 2` to `keys` drops: a key is recognised if it comes back
/// within at least half the shard's bound on keys of drops.
#[derive(Debug, Default)]
pub(super) struct Ghosts {
    bits: Vec<u64>,
    /// The most keys the shard holds: what the set is sized for.
    keys: usize,
    /// Keys recorded since the set was last cleared.
    recorded: usize,
}

impl Ghosts {
    /// Before a sweep of a shard that holds at most `keys`: forgets every key once half of
    /// `keys` have been recorded, so that the set stays sparse.
    pub(super) fn prepare(&mut self, keys: usize) {
        self.keys = keys;
        if self.recorded >= keys / 2 {
            self.bits.fill(0);
            self.recorded = 0;
        }
    }

    /// The word and bit of `hash`. Bits 16 and up: the low bits chose the shard, and the table
    /// places keys by their high bits, so within a shard those vary and these are independent.
    #[inline]
    fn bit(&self, hash: u64) -> (usize, u64) {
        let i = (hash >> 16) as usize & (self.bits.len() * 64 - 1);
        (i / 64, 1 << (i % 64))
    }

    /// Records a dropped key. The set is allocated at the first, so a store that never drops a
    /// key pays nothing for it; then one to two bytes per key of the bound.
    pub(super) fn record(&mut self, hash: u64) {
        if self.bits.is_empty() {
            if self.keys == 0 {
                return;
            }
            let words = (self.keys * BITS_PER_KEY).div_ceil(64).next_power_of_two();
            self.bits.resize(words, 0);
        }
        let (word, bit) = self.bit(hash);
        if let Some(w) = self.bits.get_mut(word) {
            *w |= bit;
            self.recorded += 1;
        }
    }

    /// Whether `hash` was (probably) dropped.
    #[inline]
    pub(super) fn contains(&self, hash: u64) -> bool {
        if self.bits.is_empty() {
            return false;
        }
        let (word, bit) = self.bit(hash);
        self.bits.get(word).is_some_and(|w| w & bit != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_keys_are_found_and_few_others() {
        let mut ghosts = Ghosts::default();
        assert!(!ghosts.contains(42));
        ghosts.prepare(2_000);
        let hash = |i: u64| i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for i in 0..1_000 {
            ghosts.record(hash(i));
        }
        assert!((0..1_000).all(|i| ghosts.contains(hash(i))));
        let false_positives = (1_000..101_000)
            .filter(|&i| ghosts.contains(hash(i)))
            .count();
        assert!(false_positives < 12_000, "{false_positives} of 100,000");
        // Half the bound recorded: the next sweep starts afresh.
        ghosts.prepare(2_000);
        assert!(!ghosts.contains(hash(1)));
    }

    /// Keys that come back after their quota reset are kept once the shard sees them come back;
    /// keys that never come back are still swept.
    #[test]
    fn returning_keys_stay_and_a_flood_is_swept() -> Result<(), Box<dyn std::error::Error>> {
        use crate::store::Check;
        use crate::{MemoryStore, Policy, Quota, Timestamp};
        use std::time::Duration;

        let policy = Policy::new("p", Quota::token_bucket(10, "1000/s".parse()?)?)?;
        let start = Timestamp::from_secs(1_800_000_000);
        // 10 µs a request: each key's token is back 1 ms after it was taken, 50 ms before the
        // key's next request.
        let at = |i: u64| start.saturating_add(Duration::from_micros(10 * i));
        let store = MemoryStore::builder().shards(1).build();
        for i in 0..20 * 5_000u64 {
            let key = (i % 5_000).to_le_bytes();
            assert!(
                store
                    .apply_now(at(i), &[Check::new(&policy, &key, 1)])
                    .allowed()
            );
        }
        assert_eq!(store.len(), 5_000, "the returning keys are kept");

        let store = MemoryStore::builder().shards(1).build();
        for i in 0..100_000u64 {
            store.apply_now(at(i), &[Check::new(&policy, &i.to_le_bytes(), 1)]);
        }
        assert!(
            store.len() <= 1_000,
            "the flood is swept: {} keys",
            store.len()
        );
        Ok(())
    }
}
