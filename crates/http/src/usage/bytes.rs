//! Runs of JSON bytes read whole: string contents (plain runs and escapes), numbers,
//! whitespace. The scanner's fast path is built from these; each says where the run
//! ends or that it cannot say (a run cut by the chunk's end, or malformed), leaving that to the
//! byte-by-byte path. No `unsafe`: the eight- and sixteen-byte tests are plain integer
//! arithmetic, or loops the compiler turns into vector compares.

use super::{BadReason, Usage};

/// A byte that ends a plain run in a string: `"`, `\`, or a control character. Non-ASCII
/// bytes are plain: the bytes inside strings are not checked to be UTF-8 (see the module
/// `usage`'s documentation).
#[inline(always)]
pub(super) fn special(b: u8) -> bool {
    (b == b'"') | (b == b'\\') | (b < 0x20)
}

/// Whether sixteen bytes hold a special byte: written so that the compiler makes it vector
/// compares (SSE2 on x86-64, NEON on aarch64) without `unsafe`.
#[inline(always)]
pub(super) fn any_special(block: &[u8; 16]) -> bool {
    block.iter().fold(false, |any, &b| any | special(b))
}

/// Bit `k` set: byte `k` of the sixteen is special. Eight bytes at a time, exactly (no carry
/// crosses a byte): for `x` = the word XOR a byte repeated, `((x & 0x7F…) + 0x7F…) | x` has a
/// byte's high bit clear exactly when that byte of `x` is zero; `((w & 0x7F…) + 0x60…) | w`
/// exactly when the byte is below 0x20. The high bits are then gathered into one byte by a
/// multiplication.
#[inline(always)]
pub(super) fn special_mask(block: &[u8; 16]) -> u32 {
    const LOW7: u64 = u64::from_le_bytes([0x7F; 8]);
    const HIGHS: u64 = u64::from_le_bytes([0x80; 8]);
    let word = |bytes: &[u8]| {
        let Ok(bytes) = <[u8; 8]>::try_from(bytes) else {
            return 0;
        };
        let w = u64::from_le_bytes(bytes);
        let quote = w ^ u64::from_le_bytes([b'"'; 8]);
        let backslash = w ^ u64::from_le_bytes([b'\\'; 8]);
        let plain = (((quote & LOW7) + LOW7) | quote)
            & (((backslash & LOW7) + LOW7) | backslash)
            & (((w & LOW7) + u64::from_le_bytes([0x60; 8])) | w);
        let flags = !plain & HIGHS;
        // Byte k's flag (bit 8k + 7) lands on bit 56 + k.
        ((flags >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56) as u32
    };
    let (low, high) = block.split_at(8);
    word(low) | word(high) << 8
}

/// The special bytes of eight (little-endian), the first one exactly: its high bit is the
/// lowest set bit. `(x - 0x01…) & !x` sets a byte's high bit when the byte is 0 (`"` or `\`
/// after the XOR); `(w - 0x20…) & !w` when it is below 0x20. A borrow only runs upwards from
/// a byte that is itself flagged, so bits above the first flag may be wrong, the first is not.
#[inline(always)]
pub(super) fn first_special_in_word(w: u64) -> u64 {
    const ONES: u64 = u64::from_le_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_le_bytes([0x80; 8]);
    let quote = w ^ u64::from_le_bytes([b'"'; 8]);
    let backslash = w ^ u64::from_le_bytes([b'\\'; 8]);
    ((quote.wrapping_sub(ONES) & !quote)
        | (backslash.wrapping_sub(ONES) & !backslash)
        | (w.wrapping_sub(ONES * 0x20) & !w))
        & HIGHS
}

/// The first special byte among the first sixteen of `s` (or all of `s`, if shorter), two
/// words at a time: most strings (keys, ids, short values) end there, and this finds their end
/// for a fraction of what a block's mask costs. `None`: the sixteen bytes are all plain.
#[inline(always)]
pub(super) fn first_special_short(s: &[u8]) -> Option<usize> {
    let Some(block) = s.first_chunk::<16>() else {
        return Some(s.iter().position(|&b| special(b)).unwrap_or(s.len()));
    };
    let (low, high) = block.split_at(8);
    for (base, half) in [(0, low), (8, high)] {
        let word = <[u8; 8]>::try_from(half).map_or(0, u64::from_le_bytes);
        let flags = first_special_in_word(word);
        if flags != 0 {
            return Some(base + (flags.trailing_zeros() / 8) as usize);
        }
    }
    None
}

/// A number read whole: its length and what it is as a cost.
#[derive(Clone, Copy, Debug)]
pub(super) struct Number {
    pub(super) len: usize,
    pub(super) negative: bool,
    pub(super) fraction: bool,
    pub(super) exponent: bool,
    /// The integer part, if it fits in a `u64`.
    pub(super) integer: Option<u64>,
}

impl Number {
    pub(super) fn as_cost(self, max: u64) -> Usage {
        if self.negative {
            Usage::Bad(BadReason::Negative)
        } else if self.fraction {
            Usage::Bad(BadReason::Fraction)
        } else if self.exponent {
            Usage::Bad(BadReason::Exponent)
        } else {
            match self.integer {
                Some(n) if n <= max => Usage::Found(n),
                _ => Usage::Bad(BadReason::TooLarge),
            }
        }
    }
}

/// The number at the start of `s`, when it is valid and a byte follows it in `s` (so it is
/// complete); `None` otherwise, for the byte-by-byte path to read (across chunks) or refuse
/// (at the right offset). Its integer part is only worked out if `want` says so.
#[inline]
pub(super) fn number_at(s: &[u8], want: bool) -> Option<Number> {
    let digits = |mut i: usize| {
        while s.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        i
    };
    let negative = s.first() == Some(&b'-');
    let start = usize::from(negative);
    let mut integer = Some(0);
    let mut i = match s.get(start)? {
        b'0' => start + 1,
        b'1'..=b'9' => {
            let end = digits(start + 1);
            if want {
                integer = s.get(start..end)?.iter().try_fold(0u64, |n, &d| {
                    n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
                });
            }
            end
        }
        _ => return None,
    };
    let fraction = *s.get(i)? == b'.';
    if fraction {
        let end = digits(i + 1);
        if end == i + 1 {
            return None;
        }
        i = end;
    }
    let exponent = matches!(s.get(i)?, b'e' | b'E');
    if exponent {
        i += 1;
        if matches!(s.get(i)?, b'+' | b'-') {
            i += 1;
        }
        let end = digits(i);
        if end == i {
            return None;
        }
        i = end;
    }
    // A byte must follow: a number at the end of the chunk may go on in the next.
    s.get(i)?;
    Some(Number {
        len: i,
        negative,
        fraction,
        exponent,
        integer,
    })
}

/// Skips the whitespace at `bytes[*i..]`; the byte after it, if any.
#[inline(always)]
pub(super) fn next_token(bytes: &[u8], i: &mut usize) -> Option<u8> {
    loop {
        let b = *bytes.get(*i)?;
        if !matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            return Some(b);
        }
        *i += 1;
        if b == b'\n' {
            // Pretty-printed JSON: the indentation after a line break.
            *i += spaces(bytes.get(*i..).unwrap_or_default());
        }
    }
}

/// How many spaces `s` starts with, eight at a time: the first byte that is not a space holds
/// the lowest set bit of the word XOR spaces.
#[inline]
pub(super) fn spaces(s: &[u8]) -> usize {
    let mut n = 0;
    while let Some(word) = s.get(n..).and_then(<[u8]>::first_chunk::<8>) {
        let x = u64::from_le_bytes(*word) ^ u64::from_le_bytes([b' '; 8]);
        if x != 0 {
            return n + (x.trailing_zeros() / 8) as usize;
        }
        n += 8;
    }
    let tail = s.get(n..).unwrap_or_default();
    n + tail.iter().take_while(|&&b| b == b' ').count()
}

/// The four hex digits after `\u` at the start of `s`.
#[inline]
pub(super) fn hex4(s: &[u8]) -> Option<u16> {
    let digits = s.get(2..6)?;
    let mut unit = 0u16;
    for &b in digits {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => return None,
        };
        unit = (unit << 4) | u16::from(digit);
    }
    Some(unit)
}

/// The length of the valid, complete `\uXXXX` escape (or surrogate pair of them) at the start
/// of `s`, if it is one: `\u00e9`, `\ud83d\ude00`.
#[inline(never)]
pub(super) fn unicode_escape_len(s: &[u8]) -> Option<usize> {
    match hex4(s)? {
        0xDC00..=0xDFFF => None,
        0xD800..=0xDBFF => {
            let low = s.get(6..)?;
            if low.first() != Some(&b'\\') || low.get(1) != Some(&b'u') {
                return None;
            }
            matches!(hex4(low)?, 0xDC00..=0xDFFF).then_some(12)
        }
        _ => Some(6),
    }
}

/// The length of the valid, complete escape at the start of `s`, if it starts with one.
#[inline(always)]
pub(super) fn escape_len(s: &[u8]) -> Option<usize> {
    /// The bytes that may follow `\` in a two-byte escape: `"`, `\`, `/`, `b`, `f`, `n`, `r`,
    /// `t`. A table, not a `match` (a jump table mispredicts on text that mixes `\n` and
    /// `\"`) nor a 128-bit mask (several instructions to shift).
    static SHORT: [bool; 256] = {
        let mut table = [false; 256];
        let mut k = 0;
        let escapes = b"\"\\/bfnrt";
        while k < escapes.len() {
            table[escapes[k] as usize] = true;
            k += 1;
        }
        table
    };
    if *s.first()? != b'\\' {
        return None;
    }
    let escaped = *s.get(1)?;
    if SHORT[usize::from(escaped)] {
        Some(2)
    } else if escaped == b'u' {
        unicode_escape_len(s)
    } else {
        None
    }
}

/// Skips from `i` the string contents that need no state: plain runs and complete valid
/// escapes. Returns where the byte-by-byte path must take over: the closing quote, something
/// wrong (a control character, a bad escape), an escape cut by the chunk's end, or the end.
#[inline(always)]
pub(super) fn skip_string(bytes: &[u8], i: usize) -> usize {
    let rest = bytes.get(i..).unwrap_or_default();
    match first_special_short(rest) {
        // A short string: most keys and many values.
        Some(at) if rest.get(at) == Some(&b'"') => i + at,
        Some(at) => skip_string_long(bytes, i + at),
        None => skip_string_long(bytes, i + 16),
    }
}

/// [`skip_string`] sixteen bytes at a time: a block without special bytes costs one vector
/// test; in a block with some, each is looked at from the block's mask, so text dense with
/// escapes (`\n`, `\"`) costs a few instructions per escape, not a new search.
#[inline]
fn skip_string_long(bytes: &[u8], mut i: usize) -> usize {
    while let Some(block) = bytes.get(i..).and_then(<[u8]>::first_chunk::<16>) {
        if !any_special(block) {
            i += 16;
            continue;
        }
        let mut mask = special_mask(block);
        let mut next = i + 16;
        while mask != 0 {
            let at = i + mask.trailing_zeros() as usize;
            let Some(len) = bytes.get(at..).and_then(escape_len) else {
                return at;
            };
            let end = at + len;
            if end > i + 16 {
                // The escape goes on into the next block.
                next = end;
                break;
            }
            // The escaped byte (`"` or `\` is special too) is taken.
            mask &= u32::MAX << (end - i);
        }
        i = next;
    }
    loop {
        let rest = bytes.get(i..).unwrap_or_default();
        let at = i + rest.iter().position(|&b| special(b)).unwrap_or(rest.len());
        match bytes.get(at..).and_then(escape_len) {
            Some(len) => i = at + len,
            None => return at,
        }
    }
}

#[cfg(test)]
mod tests {
    //! Each fast reading against the obvious byte-at-a-time one, on bytes dense with what
    //! matters (quotes, backslashes, control and non-ASCII bytes, escapes, UTF-8).

    use proptest::prelude::*;

    use super::*;

    fn interesting() -> impl Strategy<Value = Vec<u8>> {
        let byte = prop_oneof![
            6 => prop::sample::select(&b"abcdefgh xyz0123456789"[..]),
            2 => prop::sample::select(&b"\"\\/bfnrtu"[..]),
            1 => prop::sample::select(&[0x00, 0x08, 0x1F, 0x20, 0x7F, 0x80, 0xBF, 0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0xED, 0xA0, 0xF0, 0x9F, 0x98, 0x80, 0xFF][..]),
            1 => any::<u8>(),
        ];
        let piece = prop_oneof![
            3 => prop::collection::vec(byte, 1..4),
            1 => prop::sample::select(vec![
                &b"\\n"[..], b"\\\"", b"\\\\", b"\\u00e9", b"\\ud83d\\ude00", b"\\ud83d", b"\\udc00",
                "é".as_bytes(), "€".as_bytes(), "😀".as_bytes(), b"        ",
            ]).prop_map(<[u8]>::to_vec),
        ];
        prop::collection::vec(piece, 0..40).prop_map(|pieces| pieces.concat())
    }

    /// A string's contents, byte by byte: where a byte-at-a-time reader must stop.
    fn naive_skip(s: &[u8]) -> usize {
        let mut i = 0;
        while let Some(&b) = s.get(i) {
            let len = if b == b'\\' {
                match s.get(1 + i) {
                    Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Some(2),
                    Some(b'u') => {
                        let unit = |at: usize| {
                            let hex = std::str::from_utf8(s.get(at..at + 4)?).ok()?;
                            if !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
                                return None;
                            }
                            u16::from_str_radix(hex, 16).ok()
                        };
                        match unit(i + 2) {
                            Some(0xD800..=0xDBFF) => (s.get(i + 6..i + 8) == Some(b"\\u")
                                && matches!(unit(i + 8), Some(0xDC00..=0xDFFF)))
                            .then_some(12),
                            Some(0xDC00..=0xDFFF) | None => None,
                            Some(_) => Some(6),
                        }
                    }
                    _ => None,
                }
            } else if b == b'"' || b < 0x20 {
                None
            } else {
                Some(1)
            };
            match len {
                Some(n) => i += n,
                None => return i,
            }
        }
        i
    }

    /// RFC 8259's number grammar, spelled out.
    fn is_json_number(text: &str) -> bool {
        let digits = |t: &str| t.len() - t.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let t = text.strip_prefix('-').unwrap_or(text);
        let int = digits(t);
        if int == 0 || (int > 1 && t.starts_with('0')) {
            return false;
        }
        let mut t = &t[int..];
        if let Some(rest) = t.strip_prefix('.') {
            let n = digits(rest);
            if n == 0 {
                return false;
            }
            t = &rest[n..];
        }
        if let Some(rest) = t.strip_prefix(['e', 'E']) {
            let rest = rest.strip_prefix(['+', '-']).unwrap_or(rest);
            let n = digits(rest);
            if n == 0 {
                return false;
            }
            t = &rest[n..];
        }
        t.is_empty()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

        #[test]
        fn masks_are_exact(block in prop::array::uniform16(prop_oneof![
            any::<u8>(),
            prop::sample::select(&[b'"', b'\\', 0x1F, 0x20, 0x7F, 0x80, 0xFF][..]),
        ])) {
            let naive = block
                .iter()
                .enumerate()
                .fold(0u32, |mask, (k, &b)| mask | u32::from(special(b)) << k);
            prop_assert_eq!(special_mask(&block), naive);
            prop_assert_eq!(any_special(&block), naive != 0);
            let first = block.iter().position(|&b| special(b));
            prop_assert_eq!(first_special_short(&block), first);
        }

        #[test]
        fn runs_end_where_a_byte_at_a_time_reader_stops(s in interesting(), from in 0usize..8) {
            let from = from.min(s.len());
            prop_assert_eq!(skip_string(&s, from), from + naive_skip(&s[from..]));
            let naive_spaces = s.iter().take_while(|&&b| b == b' ').count();
            prop_assert_eq!(spaces(&s), naive_spaces);
        }

        #[test]
        fn numbers_read_whole_follow_the_grammar(
            text in "-?(0|[1-9][0-9]{0,22})(\\.[0-9]{1,3})?([eE][+-]?[0-9]{1,3})?",
            junk in "[-+.eE0-9]{0,3}",
            end in prop::sample::select(&[",", "}", "]", " ", "x", ""][..]),
        ) {
            let whole = format!("{text}{junk}{end}");
            let number = number_at(whole.as_bytes(), true);
            // The longest prefix that is a number.
            let valid_len = (1..=whole.len())
                .rev()
                .find(|&n| {
                    let head = &whole[..n];
                    is_json_number(head)
                });
            match number {
                Some(number) => {
                    prop_assert_eq!(Some(number.len), valid_len);
                    prop_assert!(whole.len() > number.len, "a byte follows");
                    let head = &whole[..number.len];
                    prop_assert_eq!(number.negative, head.starts_with('-'));
                    prop_assert_eq!(number.fraction, head.contains('.'));
                    prop_assert_eq!(number.exponent, head.contains(['e', 'E']));
                    let digits = head.trim_start_matches('-').split(['.', 'e', 'E']).next().unwrap();
                    prop_assert_eq!(number.integer, digits.parse::<u64>().ok());
                }
                // Refused: the byte-by-byte path reads it (a number the chunk may cut, or one
                // that goes on into what cannot follow it).
                None => prop_assert!(
                    valid_len.is_none_or(|n| n == whole.len()
                        || b"-+.eE0123456789".contains(&whole.as_bytes()[n])),
                    "{whole:?}: {valid_len:?}"
                ),
            }
        }
    }
}
