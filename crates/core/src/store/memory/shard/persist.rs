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
use crate::algorithm::{Algorithm, LogEntries};
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
    pub(in crate::store::memory) fn restore(
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
            (Quota::SlidingWindowLog(alg), Restored::Log(mut bytes)) => {
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
                if log.total() == 0 || alg.expires_at_log(&log) <= now {
                    return false;
                }
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

    /// Makes room in the table `fingerprint` (made with `quota` when there is none) for
    /// `additional` more keys.
    pub(in crate::store::memory) fn reserve(
        &mut self,
        fingerprint: u64,
        quota: &Quota,
        additional: usize,
    ) {
        self.table_for(fingerprint, quota).reserve(additional);
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
