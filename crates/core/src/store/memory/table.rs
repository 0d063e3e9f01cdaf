//! The memory store's table: open addressing with linear probing over 16-byte entries, each a
//! key's 64-bit keyed hash and its state packed in one atomic word.
//!
//! Why not `std`'s map: its tables double, so at some sizes (a million keys is one) they are
//! less than half full and a 16-byte entry costs 35 bytes. This one grows by half and is at most
//! four-fifths full, so an entry costs 20 to 30 bytes at any size. And the state is an
//! `AtomicU64`, so a known key is updated by compare-and-swap while the shard is only
//! read-locked: two threads on different keys never wait for each other.

use std::sync::atomic::AtomicU64;

/// An empty slot. Key hashes are never 0 (see [`identity`]).
const EMPTY: u64 = 0;

/// The smallest table that is allocated.
const MIN_CAPACITY: usize = 16;

/// A hash as the table stores it: never [`EMPTY`].
#[inline]
pub(super) fn identity(hash: u64) -> u64 {
    if hash == EMPTY { 1 } else { hash }
}

#[derive(Debug, Default)]
struct Entry {
    hash: u64,
    state: AtomicU64,
}

/// Keys (as hashes) to packed states.
#[derive(Debug, Default)]
pub(super) struct Table {
    entries: Box<[Entry]>,
    len: usize,
}

impl Table {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The slot where `hash` would sit in an uncrowded table: the hash scaled to the capacity
    /// (multiply-high), so any capacity works and the high bits decide.
    #[inline]
    fn home(&self, hash: u64) -> usize {
        ((u128::from(hash) * self.entries.len() as u128) >> 64) as usize
    }

    #[inline]
    fn next(&self, i: usize) -> usize {
        if i + 1 == self.entries.len() {
            0
        } else {
            i + 1
        }
    }

    #[inline]
    fn position(&self, hash: u64) -> Option<usize> {
        if self.entries.is_empty() {
            return None;
        }
        let mut i = self.home(hash);
        // Terminates: the table is never full (at most four-fifths).
        loop {
            let entry = &self.entries[i];
            if entry.hash == hash {
                return Some(i);
            }
            if entry.hash == EMPTY {
                return None;
            }
            i = self.next(i);
        }
    }

    /// The state of `hash`, to update in place by compare-and-swap.
    #[inline]
    pub(super) fn get(&self, hash: u64) -> Option<&AtomicU64> {
        self.position(hash).map(|i| &self.entries[i].state)
    }

    /// The state of `hash`, for a caller that holds the table exclusively.
    pub(super) fn get_mut(&mut self, hash: u64) -> Option<&mut u64> {
        let i = self.position(hash)?;
        Some(self.entries[i].state.get_mut())
    }

    /// Adds `hash` (not present) with `state`, growing by half when four-fifths full.
    pub(super) fn insert(&mut self, hash: u64, state: u64) {
        if (self.len + 1) * 5 > self.entries.len() * 4 {
            self.resize((self.entries.len() * 3 / 2).max(MIN_CAPACITY));
        }
        self.place(hash, state);
        self.len += 1;
    }

    fn place(&mut self, hash: u64, state: u64) {
        let mut i = self.home(hash);
        while self.entries[i].hash != EMPTY {
            i = self.next(i);
        }
        self.entries[i] = Entry {
            hash,
            state: AtomicU64::new(state),
        };
    }

    fn resize(&mut self, capacity: usize) {
        let old = std::mem::replace(
            &mut self.entries,
            (0..capacity).map(|_| Entry::default()).collect(),
        );
        for mut entry in old.into_vec() {
            if entry.hash != EMPTY {
                self.place(entry.hash, *entry.state.get_mut());
            }
        }
    }

    /// Removes `hash`; whether it was there. Backward-shift deletion: later entries of the
    /// probe run move up into the hole, so lookups never need tombstones.
    pub(super) fn remove(&mut self, hash: u64) -> bool {
        let Some(mut hole) = self.position(hash) else {
            return false;
        };
        let mut i = self.next(hole);
        while self.entries[i].hash != EMPTY {
            let home = self.home(self.entries[i].hash);
            // The entry at `i` may fill the hole unless its home lies cyclically in (hole, i].
            let stays = if hole < i {
                hole < home && home <= i
            } else {
                hole < home || home <= i
            };
            if !stays {
                self.entries.swap(hole, i);
                hole = i;
            }
            i = self.next(i);
        }
        self.entries[hole] = Entry::default();
        self.len -= 1;
        true
    }

    /// Every `(hash, state)`.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.entries
            .iter()
            .filter(|e| e.hash != EMPTY)
            .map(|e| (e.hash, e.state.load(std::sync::atomic::Ordering::Relaxed)))
    }

    /// Keeps the entries for which `keep(hash, state)` holds, and gives memory back when fewer
    /// than a fifth of the slots remain used.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(u64, u64) -> bool) {
        let survivors: Vec<(u64, u64)> = self.iter().filter(|&(h, s)| keep(h, s)).collect();
        if survivors.len() == self.len {
            return;
        }
        let capacity = if survivors.is_empty() {
            0
        } else if survivors.len() * 5 < self.entries.len() {
            (survivors.len() * 2).max(MIN_CAPACITY)
        } else {
            self.entries.len()
        };
        self.entries = (0..capacity).map(|_| Entry::default()).collect();
        self.len = survivors.len();
        for (hash, state) in survivors {
            self.place(hash, state);
        }
    }

    /// Bytes allocated.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> usize {
        std::mem::size_of_val(&*self.entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A table against `HashMap` through random inserts, updates and removes, with hashes
    /// crowded into few homes so that probe runs wrap and backward shifts happen.
    #[test]
    fn agrees_with_a_map() {
        let mut table = Table::default();
        let mut model: HashMap<u64, u64> = HashMap::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for step in 0..200_000u64 {
            // Few distinct keys, the top bits (which pick the home) drawn from a small set.
            let r = next();
            let hash = identity(((r % 7) << 61) | ((r >> 40) % 3_000));
            match next() % 4 {
                0 | 1 => {
                    if let Some(state) = table.get_mut(hash) {
                        *state = step;
                    } else {
                        table.insert(hash, step);
                    }
                    model.insert(hash, step);
                }
                2 => assert_eq!(table.remove(hash), model.remove(&hash).is_some()),
                _ => {
                    let got = table
                        .get(hash)
                        .map(|s| s.load(std::sync::atomic::Ordering::Relaxed));
                    assert_eq!(got, model.get(&hash).copied());
                }
            }
            assert_eq!(table.len(), model.len());
            if step % 50_000 == 0 {
                table.retain(|h, _| h % 2 == 0);
                model.retain(|h, _| h % 2 == 0);
            }
        }
        let mut all: Vec<_> = table.iter().collect();
        all.sort_unstable();
        let mut expected: Vec<_> = model.into_iter().collect();
        expected.sort_unstable();
        assert_eq!(all, expected);
    }

    #[test]
    fn entries_are_sixteen_bytes_and_the_table_stays_dense() {
        assert_eq!(std::mem::size_of::<Entry>(), 16);
        let mut table = Table::default();
        for i in 1..=1_000_000u64 {
            table.insert(identity(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)), i);
            if i % 1000 == 0 && i > 1000 {
                let per_key = table.bytes() as f64 / i as f64;
                assert!(
                    (16.0..=30.1).contains(&per_key),
                    "{i} keys: {per_key} B/key"
                );
            }
        }
    }
}
