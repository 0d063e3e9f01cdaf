//! Frames for state written to disk: each one a kind, a length, the payload and a CRC-32 of all
//! three, so a reader can tell a whole frame from a torn or altered one before it uses a byte of
//! it. The memory store's snapshot ([`MemoryStore::write_snapshot`]) is a sequence of them, and
//! so is whatever else a caller keeps beside it (the server's overrides and queued requests).
//!
//! ```text
//! frame := kind (u8) | length (u32, little-endian) | payload (length bytes) | crc32 (u32, LE)
//! ```
//!
//! [`MemoryStore::write_snapshot`]: crate::MemoryStore::write_snapshot

use std::fmt;
use std::io::{self, Read, Write};

/// The largest payload a frame may have: a length above it is corruption, not a reason to
/// allocate.
pub const MAX_FRAME: usize = 64 << 20;

/// Why state could not be read back (or written).
#[derive(Debug)]
pub enum SnapshotError {
    /// Reading or writing failed.
    Io(io::Error),
    /// The bytes are not what was written: a checksum that does not match, a frame cut short,
    /// a value out of range.
    Corrupt(String),
    /// Written by a format version this build does not read.
    Version(u32),
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotError::Io(e) => write!(f, "{e}"),
            SnapshotError::Corrupt(what) => write!(f, "corrupt: {what}"),
            SnapshotError::Version(v) => {
                write!(f, "format version {v}, which this build does not read")
            }
        }
    }
}

impl std::error::Error for SnapshotError {}

impl From<io::Error> for SnapshotError {
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            SnapshotError::Corrupt("the file ends in the middle of a frame".to_owned())
        } else {
            SnapshotError::Io(e)
        }
    }
}

/// `Corrupt(what)`.
pub fn corrupt(what: impl Into<String>) -> SnapshotError {
    SnapshotError::Corrupt(what.into())
}

/// Writes one frame.
pub fn write_frame(out: &mut impl Write, kind: u8, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&l| l as usize <= MAX_FRAME)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&[kind]);
    crc.update(&len.to_le_bytes());
    crc.update(payload);
    out.write_all(&[kind])?;
    out.write_all(&len.to_le_bytes())?;
    out.write_all(payload)?;
    out.write_all(&crc.finalize().to_le_bytes())
}

/// Reads one frame into `payload` (replacing what it held); its kind, or `None` at a clean end
/// of input (no byte of a next frame).
pub fn read_frame(
    input: &mut impl Read,
    payload: &mut Vec<u8>,
) -> Result<Option<u8>, SnapshotError> {
    let mut kind = [0u8; 1];
    if input.read(&mut kind)? == 0 {
        return Ok(None);
    }
    let mut len = [0u8; 4];
    input.read_exact(&mut len)?;
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_FRAME {
        return Err(corrupt(format!("a frame of {n} bytes")));
    }
    payload.clear();
    // Read what is there rather than allocate the length first: a corrupt length meets the
    // end of the file, not a huge allocation.
    input.take(n as u64).read_to_end(payload)?;
    if payload.len() != n {
        return Err(corrupt("the file ends in the middle of a frame"));
    }
    let mut stored = [0u8; 4];
    input.read_exact(&mut stored)?;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&kind);
    crc.update(&len);
    crc.update(payload);
    if crc.finalize() != u32::from_le_bytes(stored) {
        return Err(corrupt("a frame's checksum does not match its bytes"));
    }
    Ok(Some(kind[0]))
}

/// Reads little-endian values off a frame's payload; every read checks the length.
#[derive(Debug)]
pub struct Cursor<'a> {
    bytes: &'a [u8],
}

impl<'a> Cursor<'a> {
    /// Reads `bytes` from the start.
    pub fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes }
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        if self.bytes.len() < n {
            return Err(corrupt("a frame shorter than its contents say"));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    /// A `u8`.
    pub fn u8(&mut self) -> Result<u8, SnapshotError> {
        Ok(self.take(1)?[0])
    }

    /// A little-endian `u16`.
    pub fn u16(&mut self) -> Result<u16, SnapshotError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self) -> Result<u32, SnapshotError> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self) -> Result<u64, SnapshotError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }

    /// A `u32` length, then that many bytes.
    pub fn bytes(&mut self) -> Result<&'a [u8], SnapshotError> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    /// Whether every byte was read.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// How many bytes are left.
    pub fn remaining(&self) -> usize {
        self.bytes.len()
    }
}

/// Appends little-endian values to a payload.
pub trait Put {
    /// Appends a `u8`.
    fn put_u8(&mut self, v: u8);
    /// Appends a little-endian `u16`.
    fn put_u16(&mut self, v: u16);
    /// Appends a little-endian `u32`.
    fn put_u32(&mut self, v: u32);
    /// Appends a little-endian `u64`.
    fn put_u64(&mut self, v: u64);
    /// Appends a `u32` length (saturating) and the bytes.
    fn put_bytes(&mut self, v: &[u8]);
}

impl Put for Vec<u8> {
    fn put_u8(&mut self, v: u8) {
        self.push(v);
    }
    fn put_u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_bytes(&mut self, v: &[u8]) {
        self.put_u32(u32::try_from(v.len()).unwrap_or(u32::MAX));
        self.extend_from_slice(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_refuse_any_change() -> Result<(), SnapshotError> {
        let mut file = Vec::new();
        write_frame(&mut file, 7, b"hello")?;
        write_frame(&mut file, 0, b"")?;
        let mut input = &file[..];
        let mut buf = Vec::new();
        assert_eq!(read_frame(&mut input, &mut buf)?, Some(7));
        assert_eq!(buf, b"hello");
        assert_eq!(read_frame(&mut input, &mut buf)?, Some(0));
        assert_eq!(read_frame(&mut input, &mut buf)?, None);
        // Every single flipped bit, and every cut, is refused.
        for i in 0..file.len() * 8 {
            let mut bad = file.clone();
            bad[i / 8] ^= 1 << (i % 8);
            let mut input = &bad[..];
            let first = read_frame(&mut input, &mut buf);
            let second = read_frame(&mut input, &mut buf);
            assert!(first.is_err() || second.is_err(), "bit {i}");
        }
        for cut in 1..file.len() {
            let mut input = &file[..cut];
            let mut seen = Ok(Some(0));
            while let Ok(Some(_)) = seen {
                seen = read_frame(&mut input, &mut buf);
            }
            // A cut at a frame boundary is a clean end; the caller's end frame tells it apart.
            if cut != 14 {
                assert!(seen.is_err(), "cut at {cut}");
            }
        }
        Ok(())
    }
}
