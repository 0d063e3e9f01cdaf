//! A short sliding log bit-packed into 40 bytes of its record: the oldest entry's time, then
//! every entry as an offset from it, each offset as wide as the log's span needs.
//!
//! Why packed: a log that fits its record costs one cache line a decision; one that spills
//! also writes a heap line per admitted request, and at 100,000 busy keys that line's miss was
//! the whole gap between the log and the counters (`docs/performance.md`, fifth pass). With
//! fixed 32-bit offsets and 8-bit costs the record held five entries. Packed to the span, it
//! holds 12 entries of a one-second log, 9 of a minute's and 8 of an hour's when every cost is
//! 1, and 9, 7 and 6 with costs: the whole log of the small limits an exact log is chosen for
//! (5 logins in 15 minutes, 10 a second).
//!
//! Layout: `head` holds the base time (52 bits, microseconds since the Unix epoch: until the
//! year 2112), the length (5 bits), the offsets' width (6 bits) and whether costs are stored
//! (1 bit: when every entry costs 1, none is). `bits` holds entry `i` at bit `i × (width +
//! cost bits)`: its offset from the base, then its cost (8 bits) when costs are stored.

use smallvec::SmallVec;

/// The most entries a packed log holds (the length field's range).
pub(super) const MAX_LEN: usize = 31;

/// Bits of a time, so the base fits the head with the fields beside it.
const BASE_BITS: u32 = 52;
const BASE_MASK: u64 = (1 << BASE_BITS) - 1;
const LEN_SHIFT: u32 = BASE_BITS;
const WIDTH_SHIFT: u32 = LEN_SHIFT + 5;
const COSTED_SHIFT: u32 = WIDTH_SHIFT + 6;

/// Bits of a stored cost: a merged cost above 255 does not pack.
const COST_BITS: u32 = 8;
const MAX_COST: u32 = (1 << COST_BITS) - 1;

/// Bits for the entries.
const ENTRY_ROOM: u32 = 256;

/// Entries taken out to change and pack again.
type Entries = SmallVec<[(u64, u32); MAX_LEN]>;

/// A packed log; the default is empty.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(in crate::store::memory) struct Packed {
    head: u64,
    bits: [u64; 4],
}

/// The low `n` bits set (`n` below 64).
#[inline(always)]
fn mask(n: u32) -> u64 {
    (1u64 << n) - 1
}

/// The bits an offset needs.
#[inline(always)]
fn width_of(offset: u64) -> u32 {
    u64::BITS - offset.leading_zeros()
}

/// The bits of one entry: its offset, and its cost when costs are stored.
#[inline(always)]
fn entry_width(width: u32, costed: bool) -> u32 {
    width + if costed { COST_BITS } else { 0 }
}

/// An entry's field: the offset in the low `width` bits, the cost above it when stored.
#[inline(always)]
fn encode(offset: u64, cost: u32, width: u32, costed: bool) -> u64 {
    offset | if costed { u64::from(cost) << width } else { 0 }
}

/// An entry's field read back as (offset, cost).
#[inline(always)]
fn decode(field: u64, width: u32, costed: bool) -> (u64, u32) {
    let cost = if costed { (field >> width) as u32 } else { 1 };
    (field & mask(width), cost)
}

impl Packed {
    #[inline(always)]
    fn base(&self) -> u64 {
        self.head & BASE_MASK
    }

    #[inline(always)]
    pub(super) fn len(&self) -> usize {
        ((self.head >> LEN_SHIFT) & 31) as usize
    }

    #[inline(always)]
    fn width(&self) -> u32 {
        ((self.head >> WIDTH_SHIFT) & 63) as u32
    }

    #[inline(always)]
    fn costed(&self) -> bool {
        self.head >> COSTED_SHIFT != 0
    }

    #[inline(always)]
    fn entry_bits(&self) -> u32 {
        entry_width(self.width(), self.costed())
    }

    fn set_head(&mut self, base: u64, len: usize, width: u32, costed: bool) {
        self.head = base
            | (len as u64) << LEN_SHIFT
            | u64::from(width) << WIDTH_SHIFT
            | u64::from(costed) << COSTED_SHIFT;
    }

    fn set_len(&mut self, len: usize) {
        self.head = (self.head & !(31 << LEN_SHIFT)) | (len as u64) << LEN_SHIFT;
    }

    /// The `bits`-wide field at bit `at` (fields never cross the end of `bits`).
    #[inline(always)]
    fn field(&self, at: u32, bits: u32) -> u64 {
        if bits == 0 {
            return 0;
        }
        let word = (at / 64) as usize;
        let low = self.bits.get(word).copied().unwrap_or(0);
        let high = self.bits.get(word + 1).copied().unwrap_or(0);
        let both = u128::from(high) << 64 | u128::from(low);
        (both >> (at % 64)) as u64 & mask(bits)
    }

    /// Writes `value` (at most `bits` wide) into the empty field at bit `at`.
    #[inline(always)]
    fn put_field(&mut self, at: u32, bits: u32, value: u64) {
        if bits == 0 {
            return;
        }
        let word = (at / 64) as usize;
        let shifted = u128::from(value) << (at % 64);
        if let Some(w) = self.bits.get_mut(word) {
            *w |= shifted as u64;
        }
        if let Some(w) = self.bits.get_mut(word + 1) {
            *w |= (shifted >> 64) as u64;
        }
    }

    /// Entry `i` (below the length) as (offset from the base, cost).
    #[inline(always)]
    fn entry(&self, i: usize) -> (u64, u32) {
        let bits = self.entry_bits();
        decode(
            self.field(i as u32 * bits, bits),
            self.width(),
            self.costed(),
        )
    }

    /// The entries as (time, cost), oldest first.
    pub(super) fn iter(&self) -> Iter<'_> {
        Iter {
            packed: self,
            next: 0,
            len: self.len(),
            base: self.base(),
            width: self.width(),
            bits: self.entry_bits(),
            costed: self.costed(),
        }
    }

    /// The sum of the costs.
    #[inline]
    pub(super) fn total(&self) -> u64 {
        let len = self.len();
        if !self.costed() {
            return len as u64;
        }
        self.iter().map(|(_, cost)| u64::from(cost)).sum()
    }

    #[inline]
    pub(super) fn oldest(&self) -> Option<u64> {
        (self.len() > 0).then(|| self.base())
    }

    #[inline]
    pub(super) fn newest_time(&self) -> Option<u64> {
        let last = self.len().checked_sub(1)?;
        Some(self.base() + self.entry(last).0)
    }

    /// Logs `cost` at `t` (merged into the newest entry at the same time); false, and nothing
    /// changed, when the log would not fit.
    #[inline]
    pub(super) fn push(&mut self, t: u64, cost: u32) -> bool {
        if self.newest_time() == Some(t) {
            return self.rebuild(|entries| {
                if let Some(last) = entries.last_mut() {
                    last.1 = last.1.saturating_add(cost);
                }
            });
        }
        self.append(t, cost)
    }

    /// Adds an entry after the newest, even at its time (a rebuilt log keeps the entries it
    /// had); false, and nothing changed, when it does not fit.
    #[inline]
    fn append(&mut self, t: u64, cost: u32) -> bool {
        if cost > MAX_COST {
            return false;
        }
        let len = self.len();
        if len == 0 {
            if t > BASE_MASK {
                return false;
            }
            *self = Packed::default();
            self.set_head(t, 0, 0, cost != 1);
        }
        let Some(offset) = t.checked_sub(self.base()) else {
            return false;
        };
        let width = self.width().max(width_of(offset));
        let costed = self.costed() || cost != 1;
        let bits = entry_width(width, costed);
        if width > BASE_BITS || len == MAX_LEN || (len as u32 + 1) * bits > ENTRY_ROOM {
            return false;
        }
        if width != self.width() || costed != self.costed() {
            self.repack(width, costed);
        }
        self.put_field(len as u32 * bits, bits, encode(offset, cost, width, costed));
        self.set_len(len + 1);
        true
    }

    /// Drops the oldest entry; false, and nothing changed, when the rest do not pack from the
    /// next entry's time (only if entries were logged out of order).
    pub(super) fn pop_oldest(&mut self) -> bool {
        if self.len() <= 1 {
            *self = Packed::default();
            return true;
        }
        self.rebuild(|entries| {
            if !entries.is_empty() {
                entries.remove(0);
            }
        })
    }

    /// Takes up to `cost` out of the newest entries; returns what it could not take.
    pub(super) fn take_newest(&mut self, cost: u32) -> u32 {
        let mut left = cost;
        // Fewer or cheaper entries always pack again, so this rebuild does not fail; if it
        // did, nothing would be taken, and the caller told so.
        let taken = self.rebuild(|entries| {
            while left > 0 {
                let Some(last) = entries.last_mut() else {
                    break;
                };
                let take = left.min(last.1);
                last.1 -= take;
                left -= take;
                if last.1 == 0 {
                    entries.pop();
                }
            }
        });
        if taken { left } else { cost }
    }

    /// Packs the entries again, `change`d, as narrow as they allow; false, and nothing changed,
    /// when they do not fit.
    fn rebuild(&mut self, change: impl FnOnce(&mut Entries)) -> bool {
        let mut entries: Entries = self.iter().collect();
        change(&mut entries);
        let mut packed = Packed::default();
        for &(t, cost) in &entries {
            if !packed.append(t, cost) {
                return false;
            }
        }
        *self = packed;
        true
    }

    /// Rewrites the entries `width` bits wide, with or without costs (both at least what the
    /// entries need, and the result known to fit).
    fn repack(&mut self, width: u32, costed: bool) {
        let len = self.len();
        let entries: Entries = (0..len).map(|i| self.entry(i)).collect();
        let base = self.base();
        self.bits = [0; 4];
        self.set_head(base, len, width, costed);
        let bits = self.entry_bits();
        for (i, (offset, cost)) in entries.into_iter().enumerate() {
            self.put_field(i as u32 * bits, bits, encode(offset, cost, width, costed));
        }
    }
}

/// A packed log's entries, oldest first, with its layout read once.
pub(super) struct Iter<'a> {
    packed: &'a Packed,
    next: usize,
    len: usize,
    base: u64,
    width: u32,
    bits: u32,
    costed: bool,
}

impl Iterator for Iter<'_> {
    type Item = (u64, u32);

    #[inline]
    fn next(&mut self) -> Option<(u64, u32)> {
        if self.next >= self.len {
            return None;
        }
        let field = self.packed.field(self.next as u32 * self.bits, self.bits);
        self.next += 1;
        let (offset, cost) = decode(field, self.width, self.costed);
        Some((self.base + offset, cost))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One operation on a log: log `cost` after a gap of `gap` µs, drop the oldest, or take
    /// `cost` back from the newest.
    #[derive(Clone, Debug)]
    enum Op {
        Push { gap: u64, cost: u32 },
        PopOldest,
        TakeNewest(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        let gap = prop_oneof![Just(0u64), 0..1_000u64, 0..(1u64 << 24), 0..(1u64 << 40)];
        let cost = prop_oneof![Just(1u32), 0..4u32, 200..300u32];
        prop_oneof![
            6 => (gap, cost).prop_map(|(gap, cost)| Op::Push { gap, cost }),
            1 => Just(Op::PopOldest),
            1 => (0..6u32).prop_map(Op::TakeNewest),
        ]
    }

    proptest! {
        /// Against a plain list: the same entries after every operation, and a push that does
        /// not fit changes nothing.
        #[test]
        fn packs_as_a_list(start in 0u64..(1 << 51), ops in prop::collection::vec(op(), 1..80)) {
            let mut packed = Packed::default();
            let mut list: Vec<(u64, u32)> = Vec::new();
            let mut now = start;
            for op in ops {
                match op {
                    Op::Push { gap, cost } => {
                        now += gap;
                        let before = packed;
                        if packed.push(now, cost) {
                            match list.last_mut() {
                                Some(last) if last.0 == now => last.1 += cost,
                                _ => list.push((now, cost)),
                            }
                        } else {
                            prop_assert_eq!(packed, before, "a refused push changed the log");
                            let merged = list.last().filter(|l| l.0 == now).map(|l| l.1 + cost);
                            // Refused only for a reason: too many, too wide or too costly.
                            prop_assert!(
                                list.len() >= 4 || merged.unwrap_or(cost) > MAX_COST,
                                "refused at {} entries: {:?}", list.len(), list
                            );
                        }
                    }
                    Op::PopOldest => {
                        prop_assert!(packed.pop_oldest());
                        if !list.is_empty() {
                            list.remove(0);
                        }
                    }
                    Op::TakeNewest(cost) => {
                        let mut left = cost;
                        while left > 0 {
                            let Some(last) = list.last_mut() else { break };
                            let take = left.min(last.1);
                            last.1 -= take;
                            left -= take;
                            if last.1 == 0 {
                                list.pop();
                            }
                        }
                        prop_assert_eq!(packed.take_newest(cost), left);
                    }
                }
                prop_assert_eq!(packed.iter().collect::<Vec<_>>(), list.clone());
                prop_assert_eq!(packed.total(), list.iter().map(|e| u64::from(e.1)).sum::<u64>());
                prop_assert_eq!(packed.oldest(), list.first().map(|e| e.0));
                prop_assert_eq!(packed.newest_time(), list.last().map(|e| e.0));
            }
        }
    }
}
