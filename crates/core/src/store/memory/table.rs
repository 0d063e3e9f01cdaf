//! The memory store's table: open addressing with linear probing over entries that start with a
//! key's 64-bit keyed hash: 16-byte entries with a state packed in one atomic word, or a
//! sliding log's 64-byte record (`log`). A key's home is a [`Line`] of four slots, one cache
//! line of packed entries, and nearly every key sits in its home line: a lookup reads one line
//! and compares its four hashes together.
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

/// Slots in a [`Line`].
const SLOTS: usize = 4;

/// Homes a key may sit past its own on average before [`Table::would_crowd`] says a table is
/// crowded: keys spread over the homes of a table four-fifths full sit under one past.
const FAR: usize = 16;

/// Four slots, aligned to a cache line: four packed entries are one line, the home of every key
/// that hashes to it; a log's 64-byte records are a line each, and each its own home
/// ([`Keyed::HOME`]).
///
/// Why lines: a lookup among many keys compares the four hashes of its home line together and
/// branches once, on whether one matched. Nearly every key is in its home line, so that branch
/// is predicted right and the processor keeps the work it began past it (the next check's
/// hash). A slot-by-slot probe branched on each hash as it came from memory and mispredicted
/// whenever a key sat a slot or two past its home, which at 53-80% full is about half the keys:
/// 100,000 `u64` keys scattered, denied, went from 33.5 to 30.7 ns a check (`benches/check.rs`,
/// profiling mode, best of five). The same key checked again on a thread is still looked up
/// slot by slot ([`Table::find`]): the predictor knows its slot, and reading the state need not
/// wait for the comparison.
#[derive(Debug, Default)]
#[repr(C, align(64))]
struct Line<E>([E; SLOTS]);

#[cfg(test)]
thread_local! {
    /// Slots stepped past while placing entries ([`Table::place`], [`Table::extend`]), for
    /// tests of how far a restore walks.
    pub(super) static WALKED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Counts a slot stepped past while placing an entry (tests only).
#[inline(always)]
fn walked() {
    #[cfg(test)]
    WALKED.with(|w| w.set(w.get() + 1));
}

/// A hash as the table stores it: never [`EMPTY`].
#[inline]
pub(super) fn identity(hash: u64) -> u64 {
    if hash == EMPTY { 1 } else { hash }
}

/// What a table holds: a key's hash and its state. `Default` is an empty slot.
pub(super) trait Keyed: Default {
    /// How many slots share a home: a cache line's worth. A key's probe starts at its home's
    /// first slot.
    const HOME: usize;

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
    /// A [`Line`].
    const HOME: usize = SLOTS;

    #[inline]
    fn hash(&self) -> u64 {
        self.hash.load(Ordering::Relaxed)
    }
}

/// Keys (as hashes) to states: packed states by default.
#[derive(Debug)]
pub(super) struct Table<E = Entry> {
    /// The slots, [`SLOTS`] a line: slot `i` is `lines[i / SLOTS].0[i % SLOTS]`.
    lines: Box<[Line<E>]>,
    /// Entries held. Atomic because [`Table::claim`] adds one under the shared lock.
    len: AtomicUsize,
    /// The most entries before the table grows: four-fifths of its slots.
    max_len: usize,
}

impl<E> Default for Table<E> {
    fn default() -> Self {
        Table {
            lines: Box::default(),
            len: AtomicUsize::new(0),
            max_len: 0,
        }
    }
}

impl<E: Keyed> Table<E> {
    pub(super) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Slots.
    #[inline]
    fn capacity(&self) -> usize {
        self.lines.len() * SLOTS
    }

    #[inline]
    fn slot(&self, i: usize) -> &E {
        &self.lines[i / SLOTS].0[i % SLOTS]
    }

    #[inline]
    fn slot_mut(&mut self, i: usize) -> &mut E {
        &mut self.lines[i / SLOTS].0[i % SLOTS]
    }

    /// The first slot of the home where `hash` would sit in an uncrowded table: the hash scaled
    /// to the homes (multiply-high), so any number of them works and the high bits decide.
    #[inline]
    fn home(&self, hash: u64) -> usize {
        let homes = self.capacity() / E::HOME;
        ((u128::from(hash) * homes as u128) >> 64) as usize * E::HOME
    }

    #[inline]
    fn next(&self, i: usize) -> usize {
        if i + 1 == self.capacity() { 0 } else { i + 1 }
    }

    /// The slot of `hash`: a slot at a time from its home, to the empty slot that ends its
    /// probe run. For the exclusive lock's work and the logs; a packed state's lookup is
    /// [`Table::find`].
    #[inline]
    fn position(&self, hash: u64) -> Option<usize> {
        if self.lines.is_empty() {
            return None;
        }
        let mut i = self.home(hash);
        // Terminates: the table is never full (at most four-fifths).
        loop {
            match self.slot(i).hash() {
                found if found == hash => return Some(i),
                EMPTY => return None,
                _ => i = self.next(i),
            }
        }
    }

    /// The entry of `hash`.
    #[inline]
    pub(super) fn entry(&self, hash: u64) -> Option<&E> {
        self.position(hash).map(|i| self.slot(i))
    }

    /// The entry of `hash`, for a caller that holds the table exclusively.
    pub(super) fn entry_mut(&mut self, hash: u64) -> Option<&mut E> {
        let i = self.position(hash)?;
        Some(self.slot_mut(i))
    }

    /// Adds `entry` (its hash not present), growing by half when four-fifths full.
    pub(super) fn insert_entry(&mut self, entry: E) {
        if self.len() + 1 > self.max_len {
            self.resize((self.capacity() * 3 / 2).max(MIN_CAPACITY));
        }
        self.place(entry);
        *self.len.get_mut() += 1;
    }

    /// Makes `capacity` empty slots (rounded up to whole lines) the table's storage.
    fn set_entries(&mut self, capacity: usize) -> Box<[Line<E>]> {
        let lines = capacity.div_ceil(SLOTS);
        self.max_len = lines * SLOTS * 4 / 5;
        std::mem::replace(
            &mut self.lines,
            (0..lines).map(|_| Line::default()).collect(),
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
        while self.slot(i).hash() != EMPTY {
            i = self.next(i);
            walked();
        }
        *self.slot_mut(i) = entry;
    }

    fn resize(&mut self, capacity: usize) {
        let old = self.set_entries(capacity);
        for entry in old.into_vec().into_iter().flat_map(|line| line.0) {
            if entry.hash() != EMPTY {
                self.place(entry);
            }
        }
    }

    /// Removes `hash`; its entry, if it was there. Backward-shift deletion: later entries of
    /// the probe run move up into the hole, so lookups never need tombstones.
    pub(super) fn take(&mut self, hash: u64) -> Option<E> {
        let mut hole = self.position(hash)?;
        let removed = std::mem::take(self.slot_mut(hole));
        let mut i = self.next(hole);
        while self.slot(i).hash() != EMPTY {
            let home = self.home(self.slot(i).hash());
            // The entry at `i` may fill the hole unless its home lies cyclically in (hole, i].
            let stays = if hole < i {
                hole < home && home <= i
            } else {
                hole < home || home <= i
            };
            if !stays {
                let moved = std::mem::take(self.slot_mut(i));
                *self.slot_mut(hole) = moved;
                hole = i;
            }
            i = self.next(i);
        }
        *self.slot_mut(hole) = E::default();
        *self.len.get_mut() -= 1;
        Some(removed)
    }

    /// Every entry, for a caller that holds the table shared.
    pub(super) fn entries(&self) -> impl Iterator<Item = &E> + '_ {
        self.lines
            .iter()
            .flat_map(|line| &line.0)
            .filter(|e| e.hash() != EMPTY)
    }

    /// Every entry, for a caller that holds the table exclusively.
    pub(super) fn entries_mut(&mut self) -> impl Iterator<Item = &mut E> + '_ {
        self.lines
            .iter_mut()
            .flat_map(|line| &mut line.0)
            .filter(|e| e.hash() != EMPTY)
    }

    /// Keeps the entries for which `keep` holds, and gives memory back when fewer than a fifth
    /// of the slots remain used.
    pub(super) fn retain_entries(&mut self, mut keep: impl FnMut(&mut E) -> bool) {
        let mut dropped = 0;
        for entry in self.lines.iter_mut().flat_map(|line| &mut line.0) {
            if entry.hash() != EMPTY && !keep(entry) {
                *entry = E::default();
                dropped += 1;
            }
        }
        if dropped == 0 {
            return;
        }
        // The holes broke probe runs: place the survivors again.
        let old_capacity = self.capacity();
        let survivors: Vec<E> = std::mem::take(&mut self.lines)
            .into_vec()
            .into_iter()
            .flat_map(|line| line.0)
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
        self.find(hash, false).ok()
    }

    /// The state of `hash`, or the empty slot where its probe ended (for [`Table::claim`]);
    /// `Err(None)` for a table with no slots.
    ///
    /// The home line's four hashes are compared together (see [`Line`]), or one by one when
    /// `again` (the thread's last key again, whose slot the branch predictor knows). A slot of
    /// the line that holds `hash` is its slot wherever it is in the line: hashes are unique in a
    /// table, and the slots between a key's home and its slot are never empty (slots empty only
    /// under the exclusive lock, which shifts later entries back into the hole).
    #[inline(always)]
    pub(super) fn find(&self, hash: u64, again: bool) -> Result<&AtomicU64, Option<usize>> {
        // A home is a line ([`Entry::HOME`]). Below the line count, so only a table with no
        // lines has no line there.
        let home = ((u128::from(hash) * self.lines.len() as u128) >> 64) as usize;
        let Some(Line(line)) = self.lines.get(home) else {
            return Err(None);
        };
        if again {
            for entry in line {
                if entry.hash() == hash {
                    return Ok(&entry.state);
                }
            }
        } else {
            let mut hits = 0_u32;
            for (k, entry) in line.iter().enumerate() {
                hits |= u32::from(entry.hash() == hash) << k;
            }
            if let Some(entry) = line.get(hits.trailing_zeros() as usize) {
                return Ok(&entry.state);
            }
        }
        self.find_beyond(hash, home)
    }

    /// [`find`](Self::find) when `hash` is not in its home line: the home line's first empty
    /// slot, or on through the next lines. Each line is compared whole, as the home line is,
    /// with one branch on whether it holds `hash` and one on whether it has an empty slot
    /// (where the probe ends: the slots before a key are never empty). Slot by slot, the probe
    /// mispredicted about three branches a key past its home line, and about one key in ten
    /// is (cachegrind's branch model over 100,000 keys).
    #[inline(never)]
    fn find_beyond(&self, hash: u64, home: usize) -> Result<&AtomicU64, Option<usize>> {
        let mut line = home;
        // Terminates: the table is never full (at most four-fifths).
        loop {
            let slots = &self.lines[line].0;
            let (mut hits, mut empty) = (0_u32, 0_u32);
            for (k, entry) in slots.iter().enumerate() {
                let found = entry.hash();
                hits |= u32::from(found == hash) << k;
                empty |= u32::from(found == EMPTY) << k;
            }
            if let Some(entry) = slots.get(hits.trailing_zeros() as usize) {
                return Ok(&entry.state);
            }
            if empty != 0 {
                return Err(Some(line * SLOTS + empty.trailing_zeros() as usize));
            }
            line = if line + 1 == self.lines.len() {
                0
            } else {
                line + 1
            };
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
            let entry = self.slot(i);
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

    /// Adds `(hash, state)` pairs whose hashes are unique and not present (see
    /// [`Table::extend`]).
    pub(super) fn extend_words(&mut self, words: impl IntoIterator<Item = (u64, u64)>) {
        self.extend(
            words
                .into_iter()
                .map(|(hash, state)| Entry {
                    hash: AtomicU64::new(hash),
                    state: AtomicU64::new(state),
                })
                .collect(),
        );
    }

    /// Removes `hash`; whether it was there.
    pub(super) fn remove(&mut self, hash: u64) -> bool {
        self.take(hash).is_some()
    }

    /// Every `(hash, state)`.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.entries()
            .map(|e| (e.hash(), e.state.load(Ordering::Relaxed)))
    }

    /// Keeps the entries for which `keep(hash, state)` holds (see [`Table::retain_entries`]).
    pub(super) fn retain(&mut self, mut keep: impl FnMut(u64, u64) -> bool) {
        self.retain_entries(|e| keep(*e.hash.get_mut(), *e.state.get_mut()));
    }

    /// Bytes allocated.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> usize {
        std::mem::size_of_val(&*self.lines)
    }
}

mod bulk;

#[cfg(test)]
pub(super) use bulk::Layout;

#[cfg(test)]
mod tests;
