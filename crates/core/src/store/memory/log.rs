//! The memory store's sliding logs: one 64-byte record per key (a cache line: the key's hash, a
//! mutex and the log), in an open-addressing table of records.
//!
//! A record holds up to [`INLINE`] entries itself, as 32-bit offsets from a base time with 8-bit
//! costs; a longer log, a merged cost over 255, or entries more than 71 minutes apart spill to a
//! ring buffer on the heap, and come back inline once the log is short again. The spilled record
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
use ring::HeapEntries;

/// Entries a record holds without the heap.
pub(super) const INLINE: usize = 5;

/// A spilled log shorter than this comes back inline (half the inline room, so a log that
/// hovers at the boundary does not move back and forth on every request).
const UNSPILL_AT: usize = INLINE / 2;

/// What a tracked log costs besides spilled entries: its record, in a table at most four-fifths
/// full (the least it costs: a table just grown by half is about 53% full).
pub(super) const LOG_KEY_BYTES: usize = std::mem::size_of::<Record>() * 5 / 4;

/// What one spilled entry costs.
const HEAP_ENTRY_BYTES: usize = std::mem::size_of::<(u64, u32)>();

/// One key's log.
#[derive(Debug)]
pub(super) enum CompactLog {
    /// Entries `0..len`, oldest first, at `base + offsets[i]` microseconds, costing `costs[i]`.
    Inline {
        len: u8,
        costs: [u8; INLINE],
        total: u32,
        offsets: [u32; INLINE],
        base: u64,
    },
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
        CompactLog::Inline {
            len: 0,
            costs: [0; INLINE],
            total: 0,
            offsets: [0; INLINE],
            base: 0,
        }
    }
}

impl CompactLog {
    /// Bytes the log holds, its record included.
    pub(super) fn bytes(&self) -> usize {
        match self {
            CompactLog::Inline { .. } => LOG_KEY_BYTES,
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
        } else if older.capacity() > 2 * INLINE && older.len() * 4 < older.capacity() {
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
        let CompactLog::Inline {
            len,
            costs,
            total,
            offsets,
            base,
        } = self
        else {
            return false;
        };
        let n = usize::from(*len);
        if n > 0 && *base + u64::from(offsets[n - 1]) == t {
            let Ok(merged) = u8::try_from(u64::from(costs[n - 1]) + u64::from(cost)) else {
                return false;
            };
            costs[n - 1] = merged;
            *total = total.saturating_add(cost);
            return true;
        }
        let Ok(cost_byte) = u8::try_from(cost) else {
            return false;
        };
        if n == INLINE {
            return false;
        }
        if n == 0 {
            *base = t;
        } else if t.saturating_sub(*base) > u64::from(u32::MAX) && offsets[0] > 0 {
            // Measure from the oldest entry instead: the entries in a window are closer.
            let shift = offsets[0];
            for offset in &mut offsets[..n] {
                *offset -= shift;
            }
            *base += u64::from(shift);
        }
        let Some(offset) = t.checked_sub(*base).and_then(|d| u32::try_from(d).ok()) else {
            return false;
        };
        offsets[n] = offset;
        costs[n] = cost_byte;
        *len += 1;
        *total = total.saturating_add(cost);
        true
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
            CompactLog::Inline { total, .. } | CompactLog::Spilled { total, .. } => *total,
        }
    }
}

impl LogEntries for CompactLog {
    #[inline]
    fn total(&self) -> u64 {
        u64::from(self.total32())
    }

    #[inline]
    fn oldest(&self) -> Option<u64> {
        match self {
            CompactLog::Inline {
                len, base, offsets, ..
            } => (*len > 0).then(|| *base + u64::from(offsets[0])),
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
            CompactLog::Inline {
                len, base, offsets, ..
            } => {
                let last = usize::from(*len).checked_sub(1)?;
                Some(*base + u64::from(offsets[last]))
            }
            CompactLog::Spilled {
                newest,
                newest_cost,
                ..
            } => (*newest_cost > 0).then_some(*newest),
        }
    }

    fn pop_oldest(&mut self) {
        match self {
            CompactLog::Inline {
                len,
                costs,
                total,
                offsets,
                ..
            } => {
                let n = usize::from(*len);
                if n == 0 {
                    return;
                }
                *total -= u32::from(costs[0]);
                offsets.copy_within(1..n, 0);
                costs.copy_within(1..n, 0);
                *len -= 1;
            }
            CompactLog::Spilled {
                total,
                newest_cost,
                oldest,
                newest,
                older,
            } => {
                if let Some((_, cost)) = older.pop_front() {
                    *total -= cost;
                    *oldest = older.front().map_or(*newest, |(t, _)| t);
                } else {
                    *total -= *newest_cost;
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
        if let CompactLog::Inline { .. } = self {
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
            CompactLog::Inline {
                len, costs, total, ..
            } => {
                while left > 0 && *len > 0 {
                    let c = &mut costs[usize::from(*len) - 1];
                    let take = left.min(u32::from(*c));
                    *c -= take as u8;
                    *total -= take;
                    left -= take;
                    if *c == 0 {
                        *len -= 1;
                    }
                }
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
                    *total -= take;
                    left -= take;
                    if *newest_cost == 0 {
                        if let Some((t, c)) = older.pop_back() {
                            (*newest, *newest_cost) = (t, c);
                        }
                    }
                }
            }
        }
    }

    fn entries(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        Entries { log: self, next: 0 }
    }
}

/// A log's entries, oldest first.
struct Entries<'a> {
    log: &'a CompactLog,
    next: usize,
}

impl Iterator for Entries<'_> {
    type Item = (u64, u32);

    fn next(&mut self) -> Option<(u64, u32)> {
        let i = self.next;
        let entry = match self.log {
            CompactLog::Inline {
                len,
                costs,
                offsets,
                base,
                ..
            } => (i < usize::from(*len))
                .then(|| (*base + u64::from(offsets[i]), u32::from(costs[i]))),
            CompactLog::Spilled {
                newest_cost,
                newest,
                older,
                ..
            } => match older.get(i) {
                Some(entry) => Some(entry),
                None => (i == older.len() && *newest_cost > 0).then_some((*newest, *newest_cost)),
            },
        }?;
        self.next += 1;
        Some(entry)
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

mod ring;
#[cfg(test)]
mod tests;
