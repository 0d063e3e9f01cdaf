//! The memory store on disk: [`MemoryStore::write_snapshot`] streams every live key's state,
//! shard by shard, and [`MemoryStore::restore_snapshot`] builds a store from it.
//!
//! Writing takes each shard's shared lock just long enough to copy its live entries (decisions on
//! known keys go on under the same lock meanwhile; a new key of that shard waits for the copy),
//! then writes them without any lock: the extra memory is one shard's entries, about 24 bytes a
//! key, never the whole store.
//!
//! The stream is [frames](crate::store::snapshot): a header (the format version, the key of the
//! store's hash and how it hashes eight-byte keys, without which the keys' states could not be
//! found again, and the time written), chunks of one
//! table's entries each (its policy's fingerprint and quota, then the entries), a frame of each
//! shard's lockout records (bans and denial streaks still running), and an end frame with the
//! count of entries and records, so a cut stream is told apart from a whole one.

use std::io::{Read, Write};

use super::bans::RestoredBan;
use super::packing::Slot;
use super::quota_codec;
use super::shard::Restored;
use super::{MemoryStore, MemoryStoreBuilder, Words};
use crate::store::snapshot::{Cursor, Put, SnapshotError, corrupt, read_frame, write_frame};
use crate::{Quota, Timestamp};

/// The format this build writes. It reads this one and the one before (1, whose stores hashed
/// eight-byte keys with SipHash, as the header of 2 says with its last byte).
pub const STORE_FORMAT: u16 = 2;

/// The header's byte for how eight-byte keys are hashed.
const WORDS_SIP: u8 = 0;
const WORDS_MIXED: u8 = 1;

const HEADER: u8 = 1;
const CHUNK: u8 = 2;
const END: u8 = 3;
const BANS: u8 = 4;

/// What a snapshot holds, as [`MemoryStore::write_snapshot`] wrote it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotCounts {
    /// Keys written (their states had not expired).
    pub keys: u64,
    /// Lockout records written (bans in force and denial streaks still running).
    pub bans: u64,
}

/// What a restore found. Every key of the snapshot is counted once, in one of `restored`,
/// `evicted`, `expired` or `unreadable`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestoreCounts {
    /// Keys restored: the keys the new store holds, all of them from the snapshot.
    pub restored: u64,
    /// Keys read but not kept for want of room: the store was built with a smaller
    /// [`max_keys`](MemoryStoreBuilder::max_keys) than the snapshot's keys need, and evicted
    /// as it does at any time (the least at stake first) to stay within it.
    pub evicted: u64,
    /// Keys whose state had expired by the time of the restore (nothing to restore).
    pub expired: u64,
    /// Keys of a quota this build cannot make (a time zone it does not know).
    pub unreadable: u64,
    /// Lockout records restored (bans in force and denial streaks still running).
    pub bans: u64,
}

impl MemoryStore {
    /// Writes every key whose state has not expired by `now` to `out` (the frames above); how
    /// many keys and lockout records. Concurrency permits are not written: their requests end
    /// with the process.
    pub fn write_snapshot(
        &self,
        now: Timestamp,
        out: &mut impl Write,
    ) -> Result<SnapshotCounts, SnapshotError> {
        let mut header = Vec::with_capacity(32);
        header.put_u16(STORE_FORMAT);
        header.put_u64(self.inner.hash_key.0);
        header.put_u64(self.inner.hash_key.1);
        header.put_u64(now.as_micros());
        header.put_u8(match self.inner.words {
            Words::Sip => WORDS_SIP,
            Words::Mixed => WORDS_MIXED,
        });
        write_frame(out, HEADER, &header)?;
        let (mut total, mut bans) = (0, 0);
        let mut chunks = Vec::new();
        let mut records = Vec::new();
        for shard in self.inner.shards.iter() {
            // Copied under the shared lock, written after it is released.
            let n = {
                let shard = shard.read();
                total += shard.export(now.as_micros(), &mut chunks);
                records.clear();
                shard.bans.export(now.as_micros(), &mut records)
            };
            for chunk in chunks.drain(..) {
                write_frame(out, CHUNK, &chunk)?;
            }
            if n > 0 {
                let mut frame = Vec::with_capacity(8 + records.len());
                frame.put_u64(n);
                frame.extend_from_slice(&records);
                write_frame(out, BANS, &frame)?;
                bans += n;
            }
        }
        let mut end = Vec::with_capacity(16);
        end.put_u64(total);
        end.put_u64(bans);
        write_frame(out, END, &end)?;
        Ok(SnapshotCounts { keys: total, bans })
    }

    /// A store as `builder` makes it, holding the keys of the snapshot `input` whose states have
    /// not expired by `now`, as many as its `max_keys` holds (see [`RestoreCounts`]). Reads up
    /// to the snapshot's end frame and no further. An error (a checksum that does not match, a
    /// cut stream, another format version) returns no store at all: a snapshot is restored
    /// whole or not at all.
    pub fn restore_snapshot(
        builder: MemoryStoreBuilder,
        now: Timestamp,
        input: &mut impl Read,
    ) -> Result<(MemoryStore, RestoreCounts), SnapshotError> {
        let mut frame = Vec::new();
        match read_frame(input, &mut frame)? {
            Some(HEADER) => {}
            Some(_) => {
                return Err(corrupt(
                    "the store's snapshot does not start with its header",
                ));
            }
            None => return Err(corrupt("the store's snapshot is empty")),
        }
        let mut c = Cursor::new(&frame);
        let version = c.u16()?;
        if version != 1 && version != STORE_FORMAT {
            return Err(SnapshotError::Version(u32::from(version)));
        }
        let key = (c.u64()?, c.u64()?);
        let words = if version == 1 {
            Words::Sip
        } else {
            let _written = c.u64()?;
            match c.u8()? {
                WORDS_SIP => Words::Sip,
                WORDS_MIXED => Words::Mixed,
                other => {
                    return Err(corrupt(format!(
                        "the store's snapshot hashes eight-byte keys in a way this build does \
                         not know ({other})"
                    )));
                }
            }
        };
        let store = builder.hash_key(key, words).build();
        let mut counts = RestoreCounts::default();
        let (mut seen, mut seen_bans) = (0u64, 0u64);
        loop {
            match read_frame(input, &mut frame)? {
                Some(CHUNK) => seen += store.restore_chunk(&frame, now, &mut counts)?,
                Some(BANS) => seen_bans += store.restore_bans(&frame, now, &mut counts)?,
                Some(END) => {
                    let mut c = Cursor::new(&frame);
                    let (total, bans) = (c.u64()?, c.u64()?);
                    if total != seen || bans != seen_bans {
                        return Err(corrupt(format!(
                            "the snapshot says {total} keys and {bans} lockout records but \
                             holds {seen} and {seen_bans}"
                        )));
                    }
                    // Each key added may have evicted one added before it (a store smaller
                    // than the snapshot): what is left is what was restored. The store is new,
                    // so every key it holds came from the snapshot.
                    let kept = store.len() as u64;
                    counts.evicted = counts.restored.saturating_sub(kept);
                    counts.restored = kept;
                    return Ok((store, counts));
                }
                Some(kind) => return Err(corrupt(format!("a frame of kind {kind} in the store"))),
                None => return Err(corrupt("the store's snapshot has no end")),
            }
        }
    }

    /// Restores one frame of lockout records; how many it held.
    fn restore_bans(
        &self,
        frame: &[u8],
        now: Timestamp,
        counts: &mut RestoreCounts,
    ) -> Result<u64, SnapshotError> {
        let mut c = Cursor::new(frame);
        let n = c.u64()?;
        let cap = self.inner.limits.keys;
        for _ in 0..n {
            if let Some(ban) = RestoredBan::read(&mut c, now.as_micros())? {
                let policy = crate::policy::intern(&ban.policy);
                if self.shard(ban.hash).write().bans.restore(ban, policy, cap) {
                    counts.bans += 1;
                }
            }
        }
        if !c.is_empty() {
            return Err(corrupt(
                "a frame of lockout records longer than its records",
            ));
        }
        Ok(n)
    }

    /// Restores one chunk; how many entries it held.
    ///
    /// Each shard's entries go in together (`Shard::restore_all`), in the order they came.
    fn restore_chunk(
        &self,
        frame: &[u8],
        now: Timestamp,
        counts: &mut RestoreCounts,
    ) -> Result<u64, SnapshotError> {
        let mut c = Cursor::new(frame);
        let fingerprint = c.u64()?;
        let quota = quota_codec::decode(&mut c)?;
        let n = u64::from(c.u32()?);
        let mut entries =
            Vec::with_capacity(usize::try_from(n).unwrap_or(0).min(c.remaining() / 20));
        for _ in 0..n {
            let hash = c.u64()?;
            // A quota this build cannot make is a calendar window's: packed entries.
            let entry = if matches!(quota, Some(Quota::SlidingWindowLog(_))) {
                let count = c.u32()? as usize;
                let len = count
                    .checked_mul(12)
                    .ok_or_else(|| corrupt("a log's length"))?;
                Restored::Log(c.take(len)?)
            } else {
                Restored::Packed(Slot {
                    expires_at: c.u64()?,
                    a: c.u32()?,
                    b: c.u32()?,
                })
            };
            entries.push((hash, entry));
        }
        if !c.is_empty() {
            return Err(corrupt("a chunk longer than its entries"));
        }
        let Some(quota) = &quota else {
            counts.unreadable += n;
            return Ok(n);
        };
        let limits = self.inner.limits;
        let mut per_shard: Vec<Vec<(u64, Restored<'_>)>> =
            (0..self.inner.shards.len()).map(|_| Vec::new()).collect();
        for (hash, entry) in entries {
            per_shard[self.shard_index(hash)].push((hash, entry));
        }
        for (i, entries) in per_shard.into_iter().enumerate() {
            if entries.is_empty() {
                continue;
            }
            let k = entries.len();
            let added =
                self.inner
                    .shards
                    .write(i)
                    .restore_all(fingerprint, quota, entries, now, limits);
            counts.restored += added as u64;
            counts.expired += (k - added) as u64;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests;
