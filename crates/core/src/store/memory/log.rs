//! The memory store's sliding logs: one 64-byte record per key (a cache line: the key's hash, a
//! mutex and the log), in an open-addressing table of records.
//!
//! A record holds a short log itself, bit-packed (`packed`): offsets from the oldest entry as wide
//! as the log's span needs, with 8-bit costs only when some cost is not 1. That is 12 entries of
//! a one-second log, 9 of a minute's, 8 of an hour's (9, 7 and 6 with costs), and never fewer
//! than [`INLINE`]. A longer log or a merged cost over 255 spills to a ring buffer on the heap,
//! and comes back inline once the log is short again. The spilled record
//! keeps the total, the newest entry itself and the ring's bounds, so deciding a request reads
//! the heap's oldest entry only, and writes a heap slot only when the newest entry moves there
//! (once per microsecond that saw a request).
//!
//! Why: the map of deques before this cost four cache lines a decision (the map's control byte,
//! its slot, the deque's front and back) and 217 bytes for a key with one entry; a short log is
//! now the one line of its record, 80 to 120 bytes. An index of hashes pointing into a slab of
//! records was tried first: two lines, and the mutex's locked instruction waiting on the
//! second one's miss made it no faster than the map (`docs/performance.md`).

use std::sync::{Mutex, MutexGuard, PoisonError};

use super::table::{Keyed, Table};
use crate::algorithm::{LogEntries, SlidingWindowLog};
use crate::{Timestamp, Verdict};
use packed::Packed;
use ring::HeapEntries;

/// Entries a record holds without the heap whatever their span (four entries of 60 bits: 52 of
/// offset, 8 of cost), with costs up to 255 and times before the year 2112.
pub(super) const INLINE: usize = 4;

/// A spilled log comes back inline once `older` holds fewer entries than this (the log, with
/// its newest, at most [`INLINE`]), far below where it spilled, so a log that hovers at the
/// boundary does not move back and forth on every request.
const UNSPILL_AT: usize = INLINE;

/// The fewest slots a ring buffer has.
const RING_MIN: usize = 16;

/// What a tracked log costs besides spilled entries: its record, in a table at most four-fifths
/// full (the least it costs: a table just grown by half is about 53% full).
pub(super) const LOG_KEY_BYTES: usize = std::mem::size_of::<Record>() * 5 / 4;

/// What one spilled entry costs.
const HEAP_ENTRY_BYTES: usize = std::mem::size_of::<(u64, u32)>();

/// One key's log.
#[derive(Debug)]
pub(super) enum CompactLog {
    /// A short log, bit-packed into the record (`packed`).
    Inline(Packed),
    /// A longer log: the entries before the newest in `older`, on the heap, oldest first; the
    /// newest at `newest` costing `newest_cost` (0: the log is empty, and so is `older`).
    ///
    /// Why the newest entry stays in the record: requests at one key's same microsecond merge
    /// into it, so a busy key's decisions touch the record's cache line only. With the newest
    /// entry in the deque, two threads on one hot key passed the deque's newest line back and
    /// forth under the lock on every decision, besides the record's.
    Spilled {
        total: u32,
        newest_cost: u32,
        oldest: u64,
        newest: u64,
        older: HeapEntries,
    },
}

impl Default for CompactLog {
    fn default() -> Self {
        CompactLog::Inline(Packed::default())
    }
}

impl CompactLog {
    /// Bytes the log holds, its record included.
    pub(super) fn bytes(&self) -> usize {
        match self {
            CompactLog::Inline(_) => LOG_KEY_BYTES,
            CompactLog::Spilled { older, .. } => {
                LOG_KEY_BYTES + older.capacity() * HEAP_ENTRY_BYTES
            }
        }
    }

    /// Whether the entries are on the heap.
    #[cfg(test)]
    pub(super) fn is_spilled(&self) -> bool {
        matches!(self, CompactLog::Spilled { .. })
    }

    /// Steps the log and keeps its memory near its length; returns the verdict and the change
    /// in bytes.
    #[inline]
    pub(super) fn step(
        &mut self,
        alg: &SlidingWindowLog,
        now: Timestamp,
        cost: u32,
        commit: bool,
    ) -> (Verdict, isize) {
        let before = self.bytes();
        let verdict = alg.evaluate_log(self, now, cost);
        if commit && verdict.allowed && cost > 0 {
            alg.commit_log(self, now, cost);
        }
        if let CompactLog::Spilled { .. } = self {
            self.tidy();
        }
        (verdict, self.bytes() as isize - before as isize)
    }

    /// Logs `cost` at `now` whatever the quota says (see [`Algorithm::charge`]); returns what
    /// the log has left afterwards, as a peek reports it, and the change in bytes.
    ///
    /// [`Algorithm::charge`]: crate::algorithm::Algorithm::charge
    pub(super) fn charge(
        &mut self,
        alg: &SlidingWindowLog,
        now: Timestamp,
        cost: u32,
    ) -> (Verdict, isize) {
        let before = self.bytes();
        alg.commit_log(self, now, cost);
        if let CompactLog::Spilled { .. } = self {
            self.tidy();
        }
        let verdict = alg.evaluate_log(self, now, 0);
        (verdict, self.bytes() as isize - before as isize)
    }

    /// Brings a short spilled log back inline, or gives back most of a deque that shrank.
    pub(super) fn tidy(&mut self) {
        let CompactLog::Spilled { older, .. } = self else {
            return;
        };
        // The newest entry is in the record: `older` holds one entry fewer than the log.
        if older.len() < UNSPILL_AT {
            if let Some(inline) = self.inlined() {
                *self = inline;
            }
        } else if older.capacity() > RING_MIN && older.len() * 4 < older.capacity() {
            older.resize(older.len() * 2);
        }
    }

    /// The log inline, if its entries fit.
    fn inlined(&self) -> Option<CompactLog> {
        let mut inline = CompactLog::default();
        for (t, cost) in self.entries() {
            if !inline.push_inline(t, cost) {
                return None;
            }
        }
        Some(inline)
    }

    /// Logs `cost` at `t` inline; false (and nothing changed) when it does not fit.
    fn push_inline(&mut self, t: u64, cost: u32) -> bool {
        match self {
            CompactLog::Inline(packed) => packed.push(t, cost),
            CompactLog::Spilled { .. } => false,
        }
    }

    /// Moves the entries but the newest to the heap.
    fn spill(&mut self) {
        let mut older = HeapEntries::new(self.entries());
        let (newest, newest_cost) = older.pop_back().unwrap_or((0, 0));
        *self = CompactLog::Spilled {
            total: self.total32(),
            newest_cost,
            oldest: older.front().map_or(newest, |(t, _)| t),
            newest,
            older,
        };
    }

    fn total32(&self) -> u32 {
        match self {
            CompactLog::Inline(packed) => u32::try_from(packed.total()).unwrap_or(u32::MAX),
            CompactLog::Spilled { total, .. } => *total,
        }
    }
}

impl LogEntries for CompactLog {
    #[inline]
    fn total(&self) -> u64 {
        match self {
            CompactLog::Inline(packed) => packed.total(),
            CompactLog::Spilled { total, .. } => u64::from(*total),
        }
    }

    #[inline]
    fn oldest(&self) -> Option<u64> {
        match self {
            CompactLog::Inline(packed) => packed.oldest(),
            CompactLog::Spilled {
                oldest,
                newest_cost,
                ..
            } => (*newest_cost > 0).then_some(*oldest),
        }
    }

    #[inline]
    fn newest_time(&self) -> Option<u64> {
        match self {
            CompactLog::Inline(packed) => packed.newest_time(),
            CompactLog::Spilled {
                newest,
                newest_cost,
                ..
            } => (*newest_cost > 0).then_some(*newest),
        }
    }

    fn pop_oldest(&mut self) {
        match self {
            CompactLog::Inline(packed) => {
                if !packed.pop_oldest() {
                    // Entries logged out of order that do not pack from the next one's time.
                    self.spill();
                    self.pop_oldest();
                }
            }
            CompactLog::Spilled {
                total,
                newest_cost,
                oldest,
                newest,
                older,
            } => {
                // Saturating: a log spilled from inline entries summing past `u32::MAX` holds
                // more than its total says (see `push`).
                if let Some((_, cost)) = older.pop_front() {
                    *total = total.saturating_sub(cost);
                    *oldest = older.front().map_or(*newest, |(t, _)| t);
                } else {
                    *total = total.saturating_sub(*newest_cost);
                    *newest_cost = 0;
                }
            }
        }
    }

    #[inline]
    fn push(&mut self, t: u64, cost: u32) {
        if self.push_inline(t, cost) {
            return;
        }
        if let CompactLog::Inline(_) = self {
            self.spill();
        }
        if let CompactLog::Spilled {
            total,
            newest_cost,
            oldest,
            newest,
            older,
        } = self
        {
            // The total counts to `u32::MAX` (more than any limit): units past it are not
            // logged, so the entries always sum to the total and giving them back never takes
            // it below zero. Such a log refuses everything until its entries leave the window.
            let cost = cost.min(u32::MAX - *total);
            if cost == 0 {
                return;
            }
            if *newest_cost == 0 {
                (*oldest, *newest, *newest_cost) = (t, t, cost);
            } else if *newest == t {
                *newest_cost = newest_cost.saturating_add(cost);
            } else {
                older.push_back((*newest, *newest_cost));
                (*newest, *newest_cost) = (t, cost);
            }
            *total = total.saturating_add(cost);
        }
    }

    fn take_newest(&mut self, cost: u32) {
        let mut left = cost;
        match self {
            CompactLog::Inline(packed) => {
                packed.take_newest(left);
            }
            CompactLog::Spilled {
                total,
                newest_cost,
                newest,
                older,
                ..
            } => {
                while left > 0 && *newest_cost > 0 {
                    let take = left.min(*newest_cost);
                    *newest_cost -= take;
                    *total = total.saturating_sub(take);
                    left -= take;
                    if *newest_cost == 0
                        && let Some((t, c)) = older.pop_back()
                    {
                        (*newest, *newest_cost) = (t, c);
                    }
                }
            }
        }
    }

    fn entries(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        match self {
            CompactLog::Inline(packed) => Entries::Packed(packed.iter()),
            CompactLog::Spilled {
                newest_cost,
                newest,
                older,
                ..
            } => Entries::Spilled {
                older,
                newest: (*newest_cost > 0).then_some((*newest, *newest_cost)),
                next: 0,
            },
        }
    }
}

/// A log's entries, oldest first.
enum Entries<'a> {
    Packed(packed::Iter<'a>),
    Spilled {
        older: &'a HeapEntries,
        /// The newest entry, in the record (`None` for an empty log).
        newest: Option<(u64, u32)>,
        next: usize,
    },
}

impl Iterator for Entries<'_> {
    type Item = (u64, u32);

    #[inline]
    fn next(&mut self) -> Option<(u64, u32)> {
        match self {
            Entries::Packed(iter) => iter.next(),
            Entries::Spilled {
                older,
                newest,
                next,
            } => {
                let entry = match older.get(*next) {
                    Some(entry) => entry,
                    None => newest.take()?,
                };
                *next += 1;
                Some(entry)
            }
        }
    }
}

/// A key's hash and its log, on a cache line of its own: a decision reads the line the probe
/// for the key already brought in, and two keys' logs never share a line.
#[derive(Debug, Default)]
#[repr(align(64))]
pub(super) struct Record {
    hash: u64,
    log: Mutex<CompactLog>,
}

impl Keyed for Record {
    /// A record is a cache line of its own: its home is one slot.
    const HOME: usize = 1;

    #[inline]
    fn hash(&self) -> u64 {
        self.hash
    }
}

/// A poisoned log still holds a valid state: steps do not panic midway.
pub(super) fn lock(log: &Mutex<CompactLog>) -> MutexGuard<'_, CompactLog> {
    log.lock().unwrap_or_else(PoisonError::into_inner)
}

fn get_mut(log: &mut Mutex<CompactLog>) -> &mut CompactLog {
    log.get_mut().unwrap_or_else(PoisonError::into_inner)
}

/// One policy's logs: records in an open-addressing [`Table`] of their own, by key hash. The
/// table changes only under the shard's exclusive lock; under the shared lock, each record
/// has its own mutex.
#[derive(Debug, Default)]
pub(super) struct LogTable {
    records: Table<Record>,
}

impl LogTable {
    /// Adds the records' table to `layout`.
    #[cfg(test)]
    pub(super) fn layout(&self, layout: &mut super::table::Layout) {
        layout.add(&self.records);
    }

    pub(super) fn len(&self) -> usize {
        self.records.len()
    }

    /// The log of `hash`, to lock under the shared lock.
    #[inline]
    pub(super) fn get(&self, hash: u64) -> Option<&Mutex<CompactLog>> {
        self.records.entry(hash).map(|r| &r.log)
    }

    /// The log of `hash`, for a caller that holds the shard exclusively.
    pub(super) fn get_mut(&mut self, hash: u64) -> Option<&mut CompactLog> {
        self.records.entry_mut(hash).map(|r| get_mut(&mut r.log))
    }

    /// Adds `hash` (not present) with `log`.
    pub(super) fn insert(&mut self, hash: u64, log: CompactLog) {
        self.records.insert_entry(Record {
            hash,
            log: Mutex::new(log),
        });
    }

    /// See [`Table::would_crowd`].
    pub(super) fn would_crowd(&self, hashes: impl ExactSizeIterator<Item = u64>) -> bool {
        self.records.would_crowd(hashes)
    }

    /// Adds logs of keys it does not hold, their hashes unique (see [`Table::extend`]).
    pub(super) fn extend(&mut self, logs: Vec<(u64, CompactLog)>) {
        self.records.extend(
            logs.into_iter()
                .map(|(hash, log)| Record {
                    hash,
                    log: Mutex::new(log),
                })
                .collect(),
        );
    }

    /// Removes `hash`; its log, if it was there.
    pub(super) fn remove(&mut self, hash: u64) -> Option<CompactLog> {
        let record = self.records.take(hash)?;
        Some(
            record
                .log
                .into_inner()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// Makes room for `additional` more logs (see [`Table::reserve`]).
    pub(super) fn reserve(&mut self, additional: usize) {
        self.records.reserve(additional);
    }

    /// Calls `f` on every `(hash, log)`, for a caller that holds the shard shared.
    pub(super) fn for_each(&self, mut f: impl FnMut(u64, &Mutex<CompactLog>)) {
        for record in self.records.entries() {
            f(record.hash, &record.log);
        }
    }

    /// Calls `f` on every `(hash, log)`.
    pub(super) fn for_each_mut(&mut self, mut f: impl FnMut(u64, &mut CompactLog)) {
        for record in self.records.entries_mut() {
            f(record.hash, get_mut(&mut record.log));
        }
    }

    /// Keeps the logs for which `keep` holds.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&mut CompactLog) -> bool) {
        self.records.retain_entries(|r| keep(get_mut(&mut r.log)));
    }

    /// Bytes held by the logs.
    pub(super) fn bytes(&mut self) -> usize {
        let mut bytes = 0;
        self.for_each_mut(|_, log| bytes += log.bytes());
        bytes
    }
}

mod packed;
mod ring;
#[cfg(test)]
mod tests;
