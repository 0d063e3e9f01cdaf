//! The memory store's table: open addressing with linear probing over entries that start with a
//! key's 64-bit keyed hash: 16-byte entries with a state packed in one atomic word, or a
//! sliding log's 64-byte record (`log`).
//!
//! Why not `std`'s map: its tables double, so at some sizes (a million keys is one) they are
//! less than half full and a 16-byte entry costs 35 bytes. This one grows by half and is at most
//! four-fifths full, so an entry costs 20 to 30 bytes at any size. And both words of an entry
//! are atomic, so while the shard is only read-locked a known key is updated by
//! compare-and-swap and a new key [claims](Table::claim) an empty slot the same way: two threads
//! on different keys never wait for each other, and a key that comes back after a sweep dropped
//! it costs no exclusive lock. Slots empty only under the exclusive lock (removal, sweeps,
//! resizing), so under the shared lock a probe that reached an empty slot stays valid.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::packing::VACANT;

/// An empty slot. Key hashes are never 0 (see [`identity`]).
const EMPTY: u64 = 0;

/// The smallest table that is allocated.
const MIN_CAPACITY: usize = 16;

/// A hash as the table stores it: never [`EMPTY`].
#[inline]
pub(super) fn identity(hash: u64) -> u64 {
    if hash == EMPTY { 1 } else { hash }
}

/// What a table holds: a key's hash and its state. `Default` is an empty slot.
pub(super) trait Keyed: Default {
    /// The key's hash, or [`EMPTY`].
    fn hash(&self) -> u64;
}

/// A packed state's slot. An empty one holds [`VACANT`] as its state, so that a thread that
/// finds a key another has just claimed, before its first state is written, reads the state of
/// a new key.
#[derive(Debug)]
pub(super) struct Entry {
    hash: AtomicU64,
    state: AtomicU64,
}

impl Default for Entry {
    fn default() -> Self {
        Entry {
            hash: AtomicU64::new(EMPTY),
            state: AtomicU64::new(VACANT),
        }
    }
}

impl Keyed for Entry {
    #[inline]
    fn hash(&self) -> u64 {
        self.hash.load(Ordering::Relaxed)
    }
}

/// Keys (as hashes) to states: packed states by default.
#[derive(Debug)]
pub(super) struct Table<E = Entry> {
    entries: Box<[E]>,
    /// Entries held. Atomic because [`Table::claim`] adds one under the shared lock.
    len: AtomicUsize,
    /// The most entries before the table grows: four-fifths of its slots.
    max_len: usize,
}

impl<E> Default for Table<E> {
    fn default() -> Self {
        Table {
            entries: Box::default(),
            len: AtomicUsize::new(0),
            max_len: 0,
        }
    }
}

/// Where a probe for a hash ended.
pub(super) enum Probe {
    /// The hash's slot.
    Found(usize),
    /// The empty slot that ends its probe run: where it would go.
    Vacant(usize),
}

impl<E: Keyed> Table<E> {
    pub(super) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
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

    /// Where `hash` is, or the empty slot where its probe ends; `None` for a table with no slots.
    #[inline]
    fn probe(&self, hash: u64) -> Option<Probe> {
        if self.entries.is_empty() {
            return None;
        }
        let mut i = self.home(hash);
        // Terminates: the table is never full (at most four-fifths).
        loop {
            let found = self.entries[i].hash();
            if found == hash {
                return Some(Probe::Found(i));
            }
            if found == EMPTY {
                return Some(Probe::Vacant(i));
            }
            i = self.next(i);
        }
    }

    #[inline]
    fn position(&self, hash: u64) -> Option<usize> {
        match self.probe(hash)? {
            Probe::Found(i) => Some(i),
            Probe::Vacant(_) => None,
        }
    }

    /// The entry of `hash`.
    #[inline]
    pub(super) fn entry(&self, hash: u64) -> Option<&E> {
        self.position(hash).map(|i| &self.entries[i])
    }

    /// The entry of `hash`, for a caller that holds the table exclusively.
    pub(super) fn entry_mut(&mut self, hash: u64) -> Option<&mut E> {
        let i = self.position(hash)?;
        Some(&mut self.entries[i])
    }

    /// Adds `entry` (its hash not present), growing by half when four-fifths full.
    pub(super) fn insert_entry(&mut self, entry: E) {
        if self.len() + 1 > self.max_len {
            self.resize((self.entries.len() * 3 / 2).max(MIN_CAPACITY));
        }
        self.place(entry);
        *self.len.get_mut() += 1;
    }

    /// Makes `capacity` empty slots the table's storage.
    fn set_entries(&mut self, capacity: usize) -> Box<[E]> {
        self.max_len = capacity * 4 / 5;
        std::mem::replace(
            &mut self.entries,
            (0..capacity).map(|_| E::default()).collect(),
        )
    }

    /// Makes room for `additional` more entries at once, so that many keys added in the order
    /// of their hashes (a restored snapshot) land at their homes instead of piling up behind
    /// one another in a table too small for them.
    pub(super) fn reserve(&mut self, additional: usize) {
        let needed = self.len() + additional;
        if needed > self.max_len {
            self.resize((needed * 5 / 4 + 1).max(MIN_CAPACITY));
        }
    }

    fn place(&mut self, entry: E) {
        let mut i = self.home(entry.hash());
        while self.entries[i].hash() != EMPTY {
            i = self.next(i);
        }
        self.entries[i] = entry;
    }

    fn resize(&mut self, capacity: usize) {
        let old = self.set_entries(capacity);
        for entry in old.into_vec() {
            if entry.hash() != EMPTY {
                self.place(entry);
            }
        }
    }

    /// Removes `hash`; its entry, if it was there. Backward-shift deletion: later entries of
    /// the probe run move up into the hole, so lookups never need tombstones.
    pub(super) fn take(&mut self, hash: u64) -> Option<E> {
        let mut hole = self.position(hash)?;
        let removed = std::mem::take(&mut self.entries[hole]);
        let mut i = self.next(hole);
        while self.entries[i].hash() != EMPTY {
            let home = self.home(self.entries[i].hash());
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
        self.entries[hole] = E::default();
        *self.len.get_mut() -= 1;
        Some(removed)
    }

    /// Every entry, for a caller that holds the table shared.
    pub(super) fn entries(&self) -> impl Iterator<Item = &E> + '_ {
        self.entries.iter().filter(|e| e.hash() != EMPTY)
    }

    /// Every entry, for a caller that holds the table exclusively.
    pub(super) fn entries_mut(&mut self) -> impl Iterator<Item = &mut E> + '_ {
        self.entries.iter_mut().filter(|e| e.hash() != EMPTY)
    }

    /// Keeps the entries for which `keep` holds, and gives memory back when fewer than a fifth
    /// of the slots remain used.
    pub(super) fn retain_entries(&mut self, mut keep: impl FnMut(&mut E) -> bool) {
        let mut dropped = 0;
        for entry in self.entries.iter_mut() {
            if entry.hash() != EMPTY && !keep(entry) {
                *entry = E::default();
                dropped += 1;
            }
        }
        if dropped == 0 {
            return;
        }
        // The holes broke probe runs: place the survivors again.
        let old_capacity = self.entries.len();
        let survivors: Vec<E> = std::mem::take(&mut self.entries)
            .into_vec()
            .into_iter()
            .filter(|e| e.hash() != EMPTY)
            .collect();
        let capacity = if survivors.is_empty() {
            0
        } else if survivors.len() * 5 < old_capacity {
            (survivors.len() * 2).max(MIN_CAPACITY)
        } else {
            old_capacity
        };
        self.set_entries(capacity);
        *self.len.get_mut() = survivors.len();
        for entry in survivors {
            self.place(entry);
        }
    }
}

/// What [`Table::claim`] came to.
pub(super) enum Claim<'t> {
    /// The slot is the key's now, its state [`VACANT`]: the table counts one more entry.
    New(&'t AtomicU64),
    /// Another thread claimed the key first: its state.
    Existing(&'t AtomicU64),
    /// The table is at its most entries: it must grow, under the exclusive lock.
    Full,
}

impl Table<Entry> {
    /// The state of `hash`, to update in place by compare-and-swap.
    #[inline]
    pub(super) fn get(&self, hash: u64) -> Option<&AtomicU64> {
        self.entry(hash).map(|e| &e.state)
    }

    /// The state of `hash`, or the empty slot where its probe ended (for [`Table::claim`]).
    #[inline]
    pub(super) fn find(&self, hash: u64) -> Result<&AtomicU64, Option<usize>> {
        match self.probe(hash) {
            Some(Probe::Found(i)) => Ok(&self.entries[i].state),
            Some(Probe::Vacant(i)) => Err(Some(i)),
            None => Err(None),
        }
    }

    /// Adds `hash` under the shared lock, from `vacant`, the empty slot where a probe for it
    /// ended: reserves one of the entries the table may hold, then takes the first slot from
    /// there that is still empty by compare-and-swap on its hash. Every slot before `vacant`
    /// in the probe run held another key, and still does (slots empty only under the exclusive
    /// lock), so the key cannot be further back; a thread that claims it first is found on the
    /// way. Relaxed is enough: the state is [`VACANT`] since the exclusive lock emptied the slot
    /// (the lock published that), and it changes only by compare-and-swap from there.
    pub(super) fn claim(&self, hash: u64, vacant: usize) -> Claim<'_> {
        if self.len.fetch_add(1, Ordering::Relaxed) >= self.max_len {
            self.len.fetch_sub(1, Ordering::Relaxed);
            return Claim::Full;
        }
        // Terminates: with the reservation, at most `max_len` slots are taken, fewer than all.
        let mut i = vacant;
        loop {
            let entry = &self.entries[i];
            let seen =
                match entry
                    .hash
                    .compare_exchange(EMPTY, hash, Ordering::Relaxed, Ordering::Relaxed)
                {
                    Ok(_) => return Claim::New(&entry.state),
                    Err(seen) => seen,
                };
            if seen == hash {
                self.len.fetch_sub(1, Ordering::Relaxed);
                return Claim::Existing(&entry.state);
            }
            i = self.next(i);
        }
    }

    /// The state of `hash`, for a caller that holds the table exclusively.
    pub(super) fn get_mut(&mut self, hash: u64) -> Option<&mut u64> {
        self.entry_mut(hash).map(|e| e.state.get_mut())
    }

    /// Adds `hash` (not present) with `state`, growing by half when four-fifths full.
    pub(super) fn insert(&mut self, hash: u64, state: u64) {
        self.insert_entry(Entry {
            hash: AtomicU64::new(hash),
            state: AtomicU64::new(state),
        });
    }

    /// Removes `hash`; whether it was there.
    pub(super) fn remove(&mut self, hash: u64) -> bool {
        self.take(hash).is_some()
    }

    /// Every `(hash, state)`.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.entries
            .iter()
            .map(|e| (e.hash(), e.state.load(Ordering::Relaxed)))
            .filter(|&(hash, _)| hash != EMPTY)
    }

    /// Keeps the entries for which `keep(hash, state)` holds (see [`Table::retain_entries`]).
    pub(super) fn retain(&mut self, mut keep: impl FnMut(u64, u64) -> bool) {
        self.retain_entries(|e| keep(*e.hash.get_mut(), *e.state.get_mut()));
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
                    let got = table.get(hash).map(|s| s.load(Ordering::Relaxed));
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
