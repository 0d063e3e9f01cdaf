//! Filling a table in one pass: what a restore adds, and the layout tests read.

use super::{EMPTY, FAR, Keyed, MIN_CAPACITY, Table, walked};

impl<E: Keyed> Table<E> {
    /// Whether adding keys of `hashes` one at a time would walk far from their homes: over
    /// [`FAR`] homes on average once all are in, estimated by counting them per home of the table
    /// as it is (sized for them by [`reserve`](Self::reserve)) and carrying what a home cannot
    /// hold on to the next, as linear probing does. The table's own entries are left out: for a
    /// table that holds none yet. Keys spread over the homes walk under one home on average;
    /// keys crowded into a few homes (a snapshot of a store that evicted by the hash), thousands.
    pub(in super::super) fn would_crowd(&self, hashes: impl ExactSizeIterator<Item = u64>) -> bool {
        let homes = self.capacity() / E::HOME;
        let n = hashes.len();
        if homes == 0 || n == 0 {
            return false;
        }
        let mut count = vec![0_u32; homes];
        for hash in hashes {
            count[self.home(hash) / E::HOME] += 1;
        }
        let (mut carry, mut walked) = (0_usize, 0_usize);
        for &c in &count {
            carry = (carry + c as usize).saturating_sub(E::HOME);
            walked += carry;
        }
        walked > n * FAR
    }

    /// Adds `entries`, whose hashes are unique and not in the table, in one pass: the table's
    /// entries and these, in the order of their hashes, each placed at its home or, when an
    /// entry before it took that slot, just past it. What a restore adds (see
    /// `Shard::restore_all`).
    ///
    /// Why: adding keys one at a time walks from each key's home to an empty slot. Where keys
    /// crowd a few homes (a store that evicted the keys of the lowest homes first, as it did
    /// before eviction scattered its ties), that walk crosses the whole run for every key: a
    /// restore of a million such keys took 19 s. Keys in the order of their homes are placed
    /// in a single sweep of the slots, linear whatever their homes. The layout is as valid as
    /// one-by-one insertion's: from an entry's home to its slot every slot is taken.
    pub(in super::super) fn extend(&mut self, entries: Vec<E>) {
        if entries.is_empty() {
            return;
        }
        let len = self.len() + entries.len();
        let capacity = if len > self.max_len {
            (len * 5 / 4 + 1).max(MIN_CAPACITY)
        } else {
            self.capacity()
        };
        let old = self.set_entries(capacity);
        let mut all: Vec<E> = old
            .into_vec()
            .into_iter()
            .flat_map(|line| line.0)
            .filter(|e| e.hash() != EMPTY)
            .chain(entries)
            .collect();
        // Stable, and mostly a merge: a table's entries are nearly in the order of their homes
        // (runs of them), as are a snapshot's.
        all.sort_by_key(E::hash);
        let capacity = self.capacity();
        // Slots from the last entry's home to `next` are taken, and none after it; entries
        // past the last slot go on from the first, after the entries of the lowest homes.
        let (mut next, mut wrapped) = (0, 0);
        for entry in all {
            let mut i = self.home(entry.hash()).max(next);
            if i < capacity {
                next = i + 1;
            } else {
                // Terminates: the table is never full, and every slot before `wrapped` is taken.
                while self.slot(wrapped).hash() != EMPTY {
                    wrapped += 1;
                    walked();
                }
                i = wrapped;
            }
            *self.slot_mut(i) = entry;
        }
        *self.len.get_mut() = len;
    }
}

/// What a test reads of tables' layouts, summed over tables: entries, slots, and how far entries
/// sit past their homes, in slots (the longest distance and the sum). A lookup of an entry reads
/// its distance plus one slots; a probe for an absent key, to the end of its run, at least as
/// many: a table whose keys crowd a few homes has long runs, and every probe into them walks.
#[cfg(test)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(in super::super) struct Layout {
    pub(in super::super) entries: usize,
    pub(in super::super) slots: usize,
    pub(in super::super) longest: usize,
    pub(in super::super) total: usize,
}

#[cfg(test)]
impl Layout {
    /// Adds `table`'s.
    pub(in super::super) fn add<E: Keyed>(&mut self, table: &Table<E>) {
        let capacity = table.capacity();
        self.slots += capacity;
        for i in 0..capacity {
            let hash = table.slot(i).hash();
            if hash != EMPTY {
                let distance = (i + capacity - table.home(hash)) % capacity;
                self.entries += 1;
                self.longest = self.longest.max(distance);
                self.total += distance;
            }
        }
    }
}
