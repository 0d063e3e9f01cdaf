//! A shard's part of a snapshot: its tables' live entries out (under the shared lock, so
//! decisions go on), and entries back in at restore (under the exclusive lock, before the store
//! serves).
//!
//! Every counter and bucket state goes out as its [`Slot`], every sliding log as its entries.
//! Concurrency permits do not: they belong to requests in flight, which ended with the process
//! that held them.

use super::super::log::{self, CompactLog};
use super::super::packing::{Packed, SPILLED, Slot};
use super::super::quota_codec;
use super::policy_table::{PolicyTable, lock};
use super::{Limits, Shard, add_bytes};
use crate::algorithm::{Algorithm, LogEntries, SlidingWindowLog};
use crate::store::snapshot::Put;
use crate::{Quota, Timestamp};

/// A chunk grows to about this many bytes before another starts: a shard's table is one chunk
/// (a million keys over 32 shards: 750 KB each), so a restore knows how many keys each of its
/// tables receives before it adds them (see `restore_chunk`).
const CHUNK: usize = 32 << 20;

/// What a restored entry holds.
pub(in crate::store::memory) enum Restored<'a> {
    /// A counter or bucket state.
    Packed(Slot),
    /// A sliding log's `(time, cost)` entries, oldest first, as little-endian bytes.
    Log(&'a [u8]),
}

/// The header every chunk of one table starts with: its fingerprint and quota, then a count.
fn chunk_header(table: &PolicyTable) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.put_u64(table.fingerprint);
    quota_codec::encode(&table.quota, &mut out);
    out
}

/// Entries of one table, chunked: each chunk its header, a count, then the entries.
struct Chunker<'o> {
    out: &'o mut Vec<Vec<u8>>,
    header: Vec<u8>,
    current: Vec<u8>,
    count: u32,
    entries: u64,
}

impl<'o> Chunker<'o> {
    fn new(out: &'o mut Vec<Vec<u8>>, header: Vec<u8>) -> Self {
        Chunker {
            out,
            header,
            current: Vec::new(),
            count: 0,
            entries: 0,
        }
    }

    fn entry(&mut self) -> &mut Vec<u8> {
        if self.current.len() >= CHUNK {
            self.finish_chunk();
        }
        self.count += 1;
        self.entries += 1;
        &mut self.current
    }

    fn finish_chunk(&mut self) {
        if self.count == 0 {
            return;
        }
        let mut chunk = Vec::with_capacity(self.header.len() + 4 + self.current.len());
        chunk.extend_from_slice(&self.header);
        chunk.put_u32(self.count);
        chunk.append(&mut self.current);
        self.out.push(chunk);
        self.count = 0;
    }

    fn finish(mut self) -> u64 {
        self.finish_chunk();
        self.entries
    }
}

impl Shard {
    /// Appends chunks of every entry that has not expired by `now` to `out`; how many entries.
    pub(in crate::store::memory) fn export(&self, now: u64, out: &mut Vec<Vec<u8>>) -> u64 {
        let mut entries = 0;
        for table in &self.tables {
            let mut chunks = Chunker::new(out, chunk_header(table));
            by_algorithm!(&table.quota, alg => export_packed(table, alg, now, &mut chunks),
                alg => {
                    table.logs.for_each(|hash, entry| {
                        let log = log::lock(entry);
                        if alg.expires_at_log(&*log).as_micros() <= now {
                            return;
                        }
                        let buf = chunks.entry();
                        buf.put_u64(hash);
                        let at = buf.len();
                        buf.put_u32(0);
                        let mut n = 0u32;
                        for (t, cost) in log.entries() {
                            buf.put_u64(t);
                            buf.put_u32(cost);
                            n += 1;
                        }
                        buf[at..at + 4].copy_from_slice(&n.to_le_bytes());
                    });
                },
                _permits => {});
            entries += chunks.finish();
        }
        entries
    }

    /// Adds one restored entry of the table `fingerprint` with `quota`, unless it has expired
    /// by `now`, its algorithm is not the quota's, or the key is there already; whether it was
    /// added.
    fn restore(
        &mut self,
        fingerprint: u64,
        quota: &Quota,
        hash: u64,
        entry: Restored<'_>,
        now: Timestamp,
        limits: Limits,
    ) -> bool {
        let known = self
            .table_index(fingerprint)
            .is_some_and(|i| self.tables[i].contains(hash));
        if known {
            return false;
        }
        match (quota, entry) {
            (Quota::SlidingWindowLog(alg), Restored::Log(bytes)) => {
                let Some(log) = restored_log(alg, bytes, now) else {
                    return false;
                };
                self.make_room(now, limits);
                *self.len_mut() += 1;
                add_bytes(&self.log_bytes, log.bytes() as isize);
                self.table_for(fingerprint, quota).logs.insert(hash, log);
                true
            }
            (Quota::SlidingWindowLog(_) | Quota::Concurrency(_), _) => false,
            (_, Restored::Log(_)) => false,
            (quota, Restored::Packed(slot)) => by_algorithm!(quota, alg => {
                let state = alg.narrow(slot);
                if alg.expires_at(&state) <= now {
                    return false;
                }
                self.make_room(now, limits);
                *self.len_mut() += 1;
                self.table_for(fingerprint, quota).save(alg, hash, &state);
                true
            }, _log => false, _permits => false),
        }
    }

    /// Adds one chunk's entries of this shard, of the table `fingerprint` with `quota`, as
    /// [`restore`](Self::restore) adds each in turn; how many it added.
    ///
    /// One at a time, each key is probed for and walks from its home to an empty slot: short
    /// walks for keys spread over the homes, but keys crowded into a few (a snapshot of a store
    /// that evicted the lowest hashes first, as eviction did before it scattered its ties) each
    /// walked the whole run: a million took 19 s. So when the keys would crowd the table (see
    /// `Table::would_crowd`), and the shard has room for all of them and holds none of that
    /// table yet, so that no eviction can happen and nothing depends on their order, they are
    /// counted in as `restore` counts each (its sweeps and all) but placed in the order of their
    /// hashes, a batch at a time, in one pass over the slots (`Table::extend`): linear whatever
    /// their homes.
    pub(in crate::store::memory) fn restore_all(
        &mut self,
        fingerprint: u64,
        quota: &Quota,
        mut entries: Vec<(u64, Restored<'_>)>,
        now: Timestamp,
        limits: Limits,
    ) -> usize {
        let fresh = self
            .table_index(fingerprint)
            .is_none_or(|i| self.tables[i].len() == 0);
        let fits = self.len() + entries.len() <= limits.keys;
        self.reserve(fingerprint, quota, entries.len(), limits);
        let crowded = fresh
            && fits
            && self
                .table_for(fingerprint, quota)
                .would_crowd(entries.iter().map(|&(hash, _)| hash));
        if !crowded {
            let mut added = 0;
            for (hash, entry) in entries {
                added += usize::from(self.restore(fingerprint, quota, hash, entry, now, limits));
            }
            return added;
        }
        // Stable: a hash given twice (in no snapshot this store wrote) is restored from the
        // first of its entries that has not expired, as `restore` finds it there for the next.
        entries.sort_by_key(|&(hash, _)| hash);
        match quota {
            Quota::SlidingWindowLog(alg) => {
                let mut added: Vec<(u64, CompactLog)> = Vec::new();
                let mut last = None;
                for (hash, entry) in entries {
                    let Restored::Log(bytes) = entry else {
                        continue;
                    };
                    if last == Some(hash) {
                        continue;
                    }
                    let Some(log) = restored_log(alg, bytes, now) else {
                        continue;
                    };
                    last = Some(hash);
                    if self.room_due(limits) {
                        // A sweep counts the keys in the tables: the ones counted go in first.
                        let batch = std::mem::take(&mut added);
                        self.table_for(fingerprint, quota).logs.extend(batch);
                    }
                    self.make_room(now, limits);
                    *self.len_mut() += 1;
                    add_bytes(&self.log_bytes, log.bytes() as isize);
                    added.push((hash, log));
                }
                let n = added.len();
                self.table_for(fingerprint, quota).logs.extend(added);
                n
            }
            Quota::Concurrency(_) => 0,
            quota => by_algorithm!(quota,
                alg => self.restore_packed(alg, fingerprint, quota, entries, now, limits),
                _log => 0, _permits => 0),
        }
    }

    /// [`restore_all`](Self::restore_all)'s counters and buckets, `entries` in the order of
    /// their hashes.
    fn restore_packed<A: Packed>(
        &mut self,
        alg: &A,
        fingerprint: u64,
        quota: &Quota,
        entries: Vec<(u64, Restored<'_>)>,
        now: Timestamp,
        limits: Limits,
    ) -> usize {
        let mut added = Vec::new();
        let (mut n, mut last) = (0, None);
        for (hash, entry) in entries {
            let Restored::Packed(slot) = entry else {
                continue;
            };
            let state = alg.narrow(slot);
            if last == Some(hash) || alg.expires_at(&state) <= now {
                continue;
            }
            last = Some(hash);
            if self.room_due(limits) {
                // A sweep counts the keys in the tables: the ones counted go in first.
                let batch = std::mem::take(&mut added);
                self.table_for(fingerprint, quota).extend(alg, batch);
            }
            self.make_room(now, limits);
            *self.len_mut() += 1;
            added.push((hash, state));
            n += 1;
        }
        self.table_for(fingerprint, quota).extend(alg, added);
        n
    }

    /// Makes room in the table `fingerprint` (made with `quota` when there is none) for
    /// `additional` more keys, or as many as the shard may hold: a restore into a store smaller
    /// than its snapshot evicts as it adds, and each eviction ranks the whole table, so a table
    /// sized for every key of the snapshot made each round read all its slots for the few keys
    /// it drops (a million keys into `max_keys = 1000`: 25 s).
    fn reserve(&mut self, fingerprint: u64, quota: &Quota, additional: usize, limits: Limits) {
        let table = self.table_for(fingerprint, quota);
        let room = limits.keys.saturating_sub(table.len());
        table.reserve(additional.min(room));
    }

    /// The table of `fingerprint`, made with `quota` when there is none.
    fn table_for(&mut self, fingerprint: u64, quota: &Quota) -> &mut PolicyTable {
        let i = match self
            .tables
            .binary_search_by_key(&fingerprint, |t| t.fingerprint)
        {
            Ok(i) => i,
            Err(i) => {
                self.tables
                    .insert(i, PolicyTable::with_quota(fingerprint, quota.clone()));
                i
            }
        };
        &mut self.tables[i]
    }
}

/// A restored sliding log, from its `(time, cost)` entries; `None` when it holds nothing or has
/// expired by `now`.
fn restored_log(alg: &SlidingWindowLog, mut bytes: &[u8], now: Timestamp) -> Option<CompactLog> {
    let mut log = CompactLog::default();
    while bytes.len() >= 12 {
        let (t, rest) = bytes.split_at(8);
        let (c, rest) = rest.split_at(4);
        bytes = rest;
        let t = u64::from_le_bytes(t.try_into().unwrap_or_default());
        let c = u32::from_le_bytes(c.try_into().unwrap_or_default());
        if c > 0 && log.newest_time().is_none_or(|newest| newest <= t) {
            log.charge(alg, Timestamp::from_micros(t), c);
        }
    }
    (log.total() > 0 && alg.expires_at_log(&log) > now).then_some(log)
}

fn export_packed<A: Packed>(table: &PolicyTable, alg: &A, now: u64, chunks: &mut Chunker<'_>) {
    for (hash, word) in table.packed_words() {
        let state = if word == SPILLED {
            match table.spilled(hash) {
                Some(slot) => alg.narrow(*lock(slot)),
                None => continue,
            }
        } else {
            alg.decode(table.base(), word)
        };
        if alg.expires_at(&state).as_micros() <= now {
            continue;
        }
        let slot = alg.widen(&state);
        let buf = chunks.entry();
        buf.put_u64(hash);
        buf.put_u64(slot.expires_at);
        buf.put_u32(slot.a);
        buf.put_u32(slot.b);
    }
}
