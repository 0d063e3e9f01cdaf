//! The state file's format: a magic line, then frames (`tollgate::store::snapshot`), each with
//! a CRC-32:
//!
//! ```text
//! "TOLLGATE STATE\n" 0x00          16 bytes: what the file is
//! frame 10  header: format version (u32), written at (µs since the epoch)
//! frames 1-3  the memory store (its own header, chunks of entries, end)
//! frame 11  the key secret credentials were hashed under, when no key_secret_env was set
//! frame 12  the overrides, as JSON
//! frame 13  one queued request (queue, message, status); frame 14 one dead letter
//! frame 16  the allow and deny lists' live entries, as JSON
//! frame 15  end: how many overrides, requests and list entries, so a cut file is told apart
//!           from a whole one
//! ```
//!
//! A reader of another format version stops at the header and says which version it found.

use std::io::{Read, Write};

use tollgate::store::memory::{MemoryStoreBuilder, RestoreCounts};
use tollgate::store::snapshot::{Cursor, Put, SnapshotError, corrupt, read_frame, write_frame};
use tollgate::{MemoryStore, Timestamp};
use tollgate_redis::stream_queue::{DeadLetter, MessageState, MessageStatus, QueuedMessage};

use crate::admin::lists::registry::Record as ListRecord;
use crate::admin::overrides::registry::Record;
use crate::queue::Kept;

/// The first 16 bytes of every state file.
pub(crate) const MAGIC: &[u8; 16] = b"TOLLGATE STATE\n\0";

/// The format this build writes and reads.
pub(crate) const FORMAT: u32 = 1;

const HEADER: u8 = 10;
const SECRET: u8 = 11;
const OVERRIDES: u8 = 12;
const MESSAGE: u8 = 13;
const DEAD: u8 = 14;
const END: u8 = 15;
const LISTS: u8 = 16;

/// What a state file holds besides the store.
#[derive(Debug, Default)]
pub(crate) struct Extras {
    /// The process's key secret, when the configuration names none.
    pub(crate) secret: Option<Vec<u8>>,
    pub(crate) overrides: Vec<Record>,
    /// The lists' live entries (`/v1/lists`).
    pub(crate) lists: Vec<ListRecord>,
    /// Queued requests, by policy name.
    pub(crate) queues: Vec<(String, Kept)>,
}

/// What was written.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Written {
    pub(crate) keys: u64,
    pub(crate) bans: u64,
    pub(crate) overrides: u64,
    pub(crate) requests: u64,
    pub(crate) list_entries: u64,
}

/// Writes a whole state file to `out`.
pub(crate) fn write(
    out: &mut impl Write,
    now: Timestamp,
    store: &MemoryStore,
    extras: &Extras,
) -> Result<Written, SnapshotError> {
    out.write_all(MAGIC)?;
    let mut header = Vec::with_capacity(12);
    header.put_u32(FORMAT);
    header.put_u64(now.as_micros());
    write_frame(out, HEADER, &header)?;
    let counts = store.write_snapshot(now, out)?;
    if let Some(secret) = &extras.secret {
        write_frame(out, SECRET, secret)?;
    }
    let json =
        serde_json::to_vec(&extras.overrides).map_err(|e| corrupt(format!("overrides: {e}")))?;
    write_frame(out, OVERRIDES, &json)?;
    let json = serde_json::to_vec(&extras.lists).map_err(|e| corrupt(format!("lists: {e}")))?;
    write_frame(out, LISTS, &json)?;
    let mut requests = 0u64;
    let mut buf = Vec::new();
    for (name, kept) in &extras.queues {
        for (m, status) in &kept.waiting {
            buf.clear();
            buf.put_bytes(name.as_bytes());
            put_message(&mut buf, m);
            buf.put_u32(status.attempts);
            put_outcome(&mut buf, status.status, status.error.as_deref());
            buf.put_u64(status.updated_ms);
            write_frame(out, MESSAGE, &buf)?;
            requests += 1;
        }
        for d in &kept.dead {
            buf.clear();
            buf.put_bytes(name.as_bytes());
            put_message(&mut buf, &d.message);
            buf.put_u32(d.attempts);
            put_outcome(&mut buf, d.status, d.error.as_deref());
            buf.put_u64(d.died_ms);
            write_frame(out, DEAD, &buf)?;
            requests += 1;
        }
    }
    let overrides = extras.overrides.len() as u64;
    let list_entries = extras.lists.len() as u64;
    let mut end = Vec::with_capacity(24);
    end.put_u64(overrides);
    end.put_u64(requests);
    end.put_u64(list_entries);
    write_frame(out, END, &end)?;
    Ok(Written {
        keys: counts.keys,
        bans: counts.bans,
        overrides,
        requests,
        list_entries,
    })
}

/// Reads a whole state file: the store (built by `builder`, without the keys that expired by
/// `now`) and the rest. Any damage is an error, and nothing of the file is used.
pub(crate) fn read(
    input: &mut impl Read,
    builder: MemoryStoreBuilder,
    now: Timestamp,
) -> Result<(MemoryStore, RestoreCounts, Extras), SnapshotError> {
    let mut magic = [0u8; 16];
    input
        .read_exact(&mut magic)
        .map_err(|_| corrupt("shorter than a state file's first line"))?;
    if &magic != MAGIC {
        return Err(corrupt("not a Tollgate state file"));
    }
    let mut frame = Vec::new();
    if read_frame(input, &mut frame)? != Some(HEADER) {
        return Err(corrupt("no header"));
    }
    let version = Cursor::new(&frame).u32()?;
    if version != FORMAT {
        return Err(SnapshotError::Version(version));
    }
    let (store, counts) = MemoryStore::restore_snapshot(builder, now, input)?;
    let mut extras = Extras::default();
    let (mut overrides_seen, mut lists_seen, mut requests) = (false, false, 0u64);
    loop {
        match read_frame(input, &mut frame)? {
            Some(SECRET) => extras.secret = Some(frame.clone()),
            Some(OVERRIDES) => {
                extras.overrides = serde_json::from_slice(&frame)
                    .map_err(|e| corrupt(format!("overrides: {e}")))?;
                overrides_seen = true;
            }
            Some(LISTS) => {
                extras.lists =
                    serde_json::from_slice(&frame).map_err(|e| corrupt(format!("lists: {e}")))?;
                lists_seen = true;
            }
            Some(kind @ (MESSAGE | DEAD)) => {
                let mut c = Cursor::new(&frame);
                let name = text(c.bytes()?)?;
                let message = message(&mut c)?;
                let attempts = c.u32()?;
                let (status, error) = outcome(&mut c)?;
                let at = c.u64()?;
                let kept = queue_of(&mut extras.queues, name);
                if kind == MESSAGE {
                    let status = MessageStatus {
                        state: MessageState::Queued,
                        attempts,
                        status,
                        error,
                        enqueued_ms: message.enqueued_ms,
                        updated_ms: at,
                    };
                    kept.waiting.push((message, status));
                } else {
                    kept.dead.push(DeadLetter {
                        message,
                        attempts,
                        status,
                        error,
                        died_ms: at,
                    });
                }
                requests += 1;
            }
            Some(END) => {
                let mut c = Cursor::new(&frame);
                let (o, r, l) = (c.u64()?, c.u64()?, c.u64()?);
                if !overrides_seen
                    || !lists_seen
                    || o != extras.overrides.len() as u64
                    || r != requests
                    || l != extras.lists.len() as u64
                {
                    return Err(corrupt("the file's end does not match what it holds"));
                }
                return Ok((store, counts, extras));
            }
            Some(kind) => return Err(corrupt(format!("a frame of kind {kind}"))),
            None => return Err(corrupt("the file has no end")),
        }
    }
}

fn queue_of(queues: &mut Vec<(String, Kept)>, name: String) -> &mut Kept {
    let at = match queues.iter().position(|(n, _)| *n == name) {
        Some(at) => at,
        None => {
            queues.push((name, Kept::default()));
            queues.len() - 1
        }
    };
    &mut queues[at].1
}

fn text(bytes: &[u8]) -> Result<String, SnapshotError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| corrupt("text that is not UTF-8"))
}

fn put_message(buf: &mut Vec<u8>, m: &QueuedMessage) {
    buf.put_bytes(m.id.as_bytes());
    buf.put_bytes(&m.key);
    buf.put_bytes(&m.payload);
    buf.put_u64(m.enqueued_ms);
}

fn message(c: &mut Cursor<'_>) -> Result<QueuedMessage, SnapshotError> {
    Ok(QueuedMessage {
        entry: String::new(),
        id: text(c.bytes()?)?,
        key: c.bytes()?.to_vec(),
        payload: c.bytes()?.to_vec(),
        enqueued_ms: c.u64()?,
    })
}

/// The upstream's last status (0: none) and error (empty: none).
fn put_outcome(buf: &mut Vec<u8>, status: Option<u16>, error: Option<&str>) {
    buf.put_u16(status.unwrap_or(0));
    buf.put_bytes(error.unwrap_or("").as_bytes());
}

fn outcome(c: &mut Cursor<'_>) -> Result<(Option<u16>, Option<String>), SnapshotError> {
    let status = c.u16()?;
    let error = text(c.bytes()?)?;
    Ok((
        (status != 0).then_some(status),
        (!error.is_empty()).then_some(error),
    ))
}
