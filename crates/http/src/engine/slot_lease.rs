//! Slots handed to a caller that ends the request itself: `/v1/check` in `"mode": "acquire"`
//! answers a lease token naming the slots it took, and `/v1/release` gives them back with it.
//!
//! A token is self-contained, so any instance sharing the store can release it, and nothing is
//! kept per lease: it carries each slot's policy name, key and permit id, followed by a
//! 128-bit HMAC-SHA256 tag under a key derived from the engine's key secret, all in lowercase
//! hex. A token that does not verify is not one of ours; one that verifies names slots only
//! the store can say are still held (released already, or taken back at their `lease_ttl`).

use std::fmt;
use std::sync::atomic::Ordering;

use sha2::{Digest, Sha256};
use smallvec::SmallVec;
use tollgate::key_digest::KeyDigest;
use tollgate::{Check, Clock, Store};

use super::{Engine, Entry};

const VERSION: u8 = 1;
const TAG: usize = 16;
/// Longer than any token this engine writes (a handful of slots with keys of at most 256
/// bytes): anything longer is refused before it is decoded.
const MAX_TOKEN: usize = 8 * 1024;

/// Why a lease cannot be released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseError {
    /// Not a token this engine (or one sharing its key secret) wrote: malformed or forged.
    NotOurs,
    /// A token of ours whose slots are held no more: released already, or taken back at
    /// their `lease_ttl`, or of a policy no longer configured.
    Unknown,
    /// The store failed; the slots return at their `lease_ttl`.
    Store(String),
}

impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseError::NotOurs => f.write_str("not a lease this service gave out"),
            LeaseError::Unknown => f.write_str(
                "no slot of this lease is held: it was released already, or its lease_ttl passed",
            ),
            LeaseError::Store(reason) => write!(f, "the store failed: {reason}"),
        }
    }
}

impl std::error::Error for LeaseError {}

/// The key a token's tag is computed under: derived from the key secret, so no digest the
/// service shows (a long key's, in `/v1/top`) can ever be a tag.
pub(super) fn tag_key(secret: &[u8]) -> KeyDigest {
    let mut h = Sha256::new();
    h.update(b"tollgate slot lease v1\0");
    h.update(secret);
    KeyDigest::new(&h.finalize())
}

impl<S: Store, C: Clock> Engine<S, C> {
    /// Slots that leave this instance's hands without being given back here (a lease, or
    /// forward-auth's slots left to their TTL): no longer in this instance's in-flight count.
    pub(super) fn hand_off(&self, slots: &[Entry]) {
        for e in slots {
            self.inner.policies[e.index]
                .slots
                .in_flight
                .fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The token for `slots`.
    pub(super) fn lease_token(&self, slots: &[Entry]) -> String {
        let mut raw = vec![VERSION, u8::try_from(slots.len()).unwrap_or(u8::MAX)];
        for e in slots.iter().take(usize::from(u8::MAX)) {
            let name = self.inner.policies[e.index].http.policy.name().as_bytes();
            // Policy names are short (the config bounds them); a key is at most 256 bytes
            // or a digest, as stored.
            raw.push(u8::try_from(name.len()).unwrap_or(u8::MAX));
            raw.extend_from_slice(&name[..name.len().min(usize::from(u8::MAX))]);
            let key = &e.key[..e.key.len().min(usize::from(u16::MAX))];
            raw.extend_from_slice(&u16::try_from(key.len()).unwrap_or(u16::MAX).to_be_bytes());
            raw.extend_from_slice(key);
            raw.extend_from_slice(&e.permit.to_be_bytes());
        }
        let tag = self.inner.lease_tag.digest(&raw);
        raw.extend_from_slice(&tag);
        hex(&raw)
    }

    /// Gives back the slots a lease token names; returns how many were still held.
    /// [`LeaseError::Unknown`] when none was: releasing twice changes nothing.
    pub async fn release_lease(&self, token: &str) -> Result<u32, LeaseError> {
        let slots = self.read_token(token)?;
        if slots.is_empty() {
            return Err(LeaseError::Unknown);
        }
        let checks: SmallVec<[Check<'_>; 2]> = slots.iter().map(|e| self.check(e)).collect();
        let now = self.inner.limiter.clock().now();
        let held = self
            .inner
            .limiter
            .store()
            .release(now, &checks)
            .await
            .map_err(|e| LeaseError::Store(e.to_string()))?;
        for e in &slots {
            self.inner.lines.wake(e.index, &e.key);
        }
        if held == 0 {
            return Err(LeaseError::Unknown);
        }
        Ok(held)
    }

    /// The slots of a token, of policies this engine has; `NotOurs` unless it verifies.
    fn read_token(&self, token: &str) -> Result<SmallVec<[Entry; 1]>, LeaseError> {
        if token.len() > MAX_TOKEN {
            return Err(LeaseError::NotOurs);
        }
        let raw = unhex(token).ok_or(LeaseError::NotOurs)?;
        let (body, tag) = raw.split_last_chunk::<TAG>().ok_or(LeaseError::NotOurs)?;
        // Compared in full whatever differs first, so timing tells nothing of the tag.
        let want = self.inner.lease_tag.digest(body);
        if want.iter().zip(tag).fold(0u8, |acc, (a, b)| acc | (a ^ b)) != 0 {
            return Err(LeaseError::NotOurs);
        }
        let mut r = Reader(body);
        if r.byte()? != VERSION {
            return Err(LeaseError::NotOurs);
        }
        let count = r.byte()?;
        let mut slots = SmallVec::new();
        for _ in 0..count {
            let name_len = usize::from(r.byte()?);
            let name = r.take(name_len)?;
            let key_len = usize::from(u16::from_be_bytes([r.byte()?, r.byte()?]));
            let key = r.take(key_len)?;
            let permit =
                u64::from_be_bytes(r.take(8)?.try_into().map_err(|_| LeaseError::NotOurs)?);
            let index = self
                .inner
                .policies
                .iter()
                .position(|p| p.concurrent && p.http.policy.name().as_bytes() == name);
            // A policy that is gone (a reload dropped it) has no slots to give back.
            if let Some(index) = index {
                slots.push(Entry {
                    index,
                    key: key.into(),
                    cost: 1,
                    over: self.live_override(index, key),
                    permit,
                });
            }
        }
        if !r.0.is_empty() {
            return Err(LeaseError::NotOurs);
        }
        Ok(slots)
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Result<u8, LeaseError> {
        Ok(self.take(1)?[0])
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], LeaseError> {
        if self.0.len() < n {
            return Err(LeaseError::NotOurs);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    bytes
        .chunks_exact(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}
