//! The incremental JSON scanner behind `json:PATH`: a state machine over bytes that validates a
//! document as strictly as `serde_json` does and captures the scalar at one path of object
//! keys, fed in chunks split anywhere, in a fixed-size state (no tree, no copy of a key or a
//! number, whatever the body).
//!
//! How the path is followed without a stack of keys: containers on the path always form a
//! prefix of the open containers (`path_depth` of them; one bit per level says whether a
//! container is an array). Only a key of the innermost container on the path is compared, byte
//! by byte as it is decoded, with the path's key at that depth; a key that matches makes the
//! value after it either the next container on the path or, at the last key, the target.
//! Everything else is skipped, string contents eight bytes at a time.

use super::{BadReason, JsonPath, MAX_DEPTH, Usage};

/// What the next byte can be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// A value: at the top level, after `:`, after `,` in an array.
    Value,
    /// After `[`: a value or `]`.
    ArrayFirst,
    /// After `{`: a key or `}`.
    ObjectFirst,
    /// After `,` in an object: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After a value in a container: `,` or the container's end.
    After,
    /// After the top-level value: whitespace only.
    End,
    /// Inside a string (a key or a value).
    Str,
    /// After `\` in a string.
    Escape,
    /// Inside `\uXXXX` (`hex_left` digits to go).
    Hex,
    /// After a leading surrogate's `\uXXXX`: the `\` of its trailing one.
    SurrogateBackslash,
    /// After a leading surrogate's `\uXXXX\`: the `u`.
    SurrogateU,
    /// Inside a UTF-8 sequence in a string (`utf8_left` bytes to go).
    Utf8,
    /// Inside a number (`num` says where).
    Number,
    /// Inside `true`, `false` or `null` (`literal` is what remains).
    Literal,
    /// The document is not JSON (`failure` says why); nothing more is read.
    Failed,
}

/// Where in a number's grammar: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    ExpMark,
    ExpSign,
    Exp,
}

/// What the value about to start is to the path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Skip,
    /// The document, or the value of a key on the path that is not the last: if it is an
    /// object, the path goes on inside it.
    Prefix,
    /// The value of the path's last key.
    Target,
}

/// Why a byte is refused.
#[derive(Clone, Copy, Debug)]
enum Error {
    Syntax,
    TooDeep,
}

/// How a document ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum JsonEnd {
    /// Nothing but whitespace.
    Empty,
    /// Not JSON.
    Invalid(BadReason),
    /// A complete document, with what was at the path (`None`: nothing, or `null`).
    Valid(Option<Usage>),
}

/// How many bytes at the start of `s` a string can hold without a second look: anything but
/// `"`, `\\`, control characters and non-ASCII bytes (which need UTF-8 validation).
///
/// Sixteen bytes at a time: the test of a block is written so that the compiler makes it
/// vector compares (SSE2 on x86-64, NEON on aarch64), without `unsafe`; the block that holds a
/// special byte is then searched eight bytes at a time ([`special_in_word`]).
#[inline]
fn plain_len(s: &[u8]) -> usize {
    let mut n = 0;
    while let Some(block) = s.get(n..).and_then(<[u8]>::first_chunk::<16>) {
        if block.iter().fold(false, |any, &b| any | special(b)) {
            let (low, high) = block.split_at(8);
            let word = |half: &[u8]| {
                <[u8; 8]>::try_from(half)
                    .map_or(0, |bytes| special_in_word(u64::from_le_bytes(bytes)))
            };
            let low = word(low);
            return n + if low != 0 {
                (low.trailing_zeros() / 8) as usize
            } else {
                8 + (word(high).trailing_zeros() / 8) as usize
            };
        }
        n += 16;
    }
    while let Some(&b) = s.get(n) {
        if special(b) {
            break;
        }
        n += 1;
    }
    n
}

#[inline]
fn special(b: u8) -> bool {
    (b == b'"') | (b == b'\\') | !(0x20..0x80).contains(&b)
}

/// The special bytes of eight (little-endian): the high bit of the first one is the lowest
/// set bit. `x - 0x01…` sets a byte's high bit when the byte is 0 (`"` or `\\` after the XOR)
/// or at least 0x81 (non-ASCII, flagged anyway); `w - 0x20…` when it is below 0x20 or at
/// least 0xA0. A borrow only runs upwards from a byte that is itself flagged, so the lowest
/// flag is exact.
#[inline]
fn special_in_word(w: u64) -> u64 {
    const ONES: u64 = u64::from_le_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_le_bytes([0x80; 8]);
    let quote = w ^ (ONES * u64::from(b'"'));
    let backslash = w ^ (ONES * u64::from(b'\\'));
    (quote.wrapping_sub(ONES) | backslash.wrapping_sub(ONES) | w.wrapping_sub(ONES * 0x20) | w)
        & HIGHS
}

/// The length of a UTF-8 sequence led by `lead`, and the range its second byte must be in
/// (Unicode's table 3-7: no overlong forms, no surrogates, nothing above U+10FFFF).
#[inline]
fn utf8_lead(lead: u8) -> Option<(u8, u8, u8)> {
    Some(match lead {
        0xC2..=0xDF => (2, 0x80, 0xBF),
        0xE0 => (3, 0xA0, 0xBF),
        0xE1..=0xEC | 0xEE..=0xEF => (3, 0x80, 0xBF),
        0xED => (3, 0x80, 0x9F),
        0xF0 => (4, 0x90, 0xBF),
        0xF1..=0xF3 => (4, 0x80, 0xBF),
        0xF4 => (4, 0x80, 0x8F),
        _ => return None,
    })
}

/// The length of the valid, complete UTF-8 character at the start of `s`, if it is one.
#[inline]
fn utf8_len(s: &[u8]) -> Option<usize> {
    let (len, lo, hi) = utf8_lead(*s.first()?)?;
    let second = *s.get(1)?;
    if !(lo..=hi).contains(&second) {
        return None;
    }
    for k in 2..usize::from(len) {
        if !(0x80..=0xBF).contains(s.get(k)?) {
            return None;
        }
    }
    Some(usize::from(len))
}

/// The four hex digits after `\u` at the start of `s`.
#[inline]
fn hex4(s: &[u8]) -> Option<u16> {
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

/// The length of the valid, complete escape at the start of `s` (which starts with `\`), if it
/// is one: `\n`, `\u00e9`, a surrogate pair `\ud83d\ude00`.
#[inline]
fn escape_len(s: &[u8]) -> Option<usize> {
    match s.get(1)? {
        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(2),
        b'u' => match hex4(s)? {
            0xDC00..=0xDFFF => None,
            0xD800..=0xDBFF => {
                let low = s.get(6..)?;
                if low.first() != Some(&b'\\') || low.get(1) != Some(&b'u') {
                    return None;
                }
                matches!(hex4(low)?, 0xDC00..=0xDFFF).then_some(12)
            }
            _ => Some(6),
        },
        _ => None,
    }
}

/// Skips from `i` the string contents that need no state: plain runs, complete valid escapes
/// and complete valid UTF-8 characters. Returns where the byte-by-byte path must take over:
/// the closing quote, something wrong, something cut by the chunk's end, or the end.
#[inline]
fn skip_string(bytes: &[u8], mut i: usize) -> usize {
    loop {
        let rest = bytes.get(i..).unwrap_or_default();
        i += plain_len(rest);
        let rest = bytes.get(i..).unwrap_or_default();
        let skip = match rest.first() {
            Some(b'\\') => escape_len(rest),
            Some(&b) if b >= 0x80 => utf8_len(rest),
            _ => None,
        };
        match skip {
            Some(n) => i += n,
            None => return i,
        }
    }
}

#[derive(Clone, Debug)]
pub(super) struct JsonScanner {
    max: u64,
    /// Bytes fed before the current chunk.
    offset: u64,
    /// Bit `d - 1` set: the open container at depth `d` is an array.
    arrays: u64,
    /// The target number's integer digits so far.
    value: u64,
    /// What was at the path: the last occurrence so far.
    capture: Option<Usage>,
    failure: BadReason,
    literal: &'static [u8],
    /// Bytes of the key being compared that matched so far.
    key_pos: u16,
    hex: u16,
    /// A leading surrogate awaiting its trailing one (0: none).
    high: u16,
    state: State,
    num: Num,
    role: Role,
    depth: u8,
    /// How many of the open containers are on the path (always the outermost ones).
    path_depth: u8,
    hex_left: u8,
    utf8_left: u8,
    utf8_lo: u8,
    utf8_hi: u8,
    in_key: bool,
    /// The string being read is a key compared with the path's key at this depth, and matches
    /// it so far.
    comparing: bool,
    target_num: bool,
    negative: bool,
    fraction: bool,
    exponent: bool,
    overflow: bool,
}

impl JsonScanner {
    pub(super) fn new(max: u64) -> Self {
        JsonScanner {
            max,
            offset: 0,
            arrays: 0,
            value: 0,
            capture: None,
            failure: BadReason::Malformed { offset: 0 },
            literal: b"",
            key_pos: 0,
            hex: 0,
            high: 0,
            state: State::Value,
            num: Num::Zero,
            role: Role::Prefix,
            depth: 0,
            path_depth: 0,
            hex_left: 0,
            utf8_left: 0,
            utf8_lo: 0,
            utf8_hi: 0,
            in_key: false,
            comparing: false,
            target_num: false,
            negative: false,
            fraction: false,
            exponent: false,
            overflow: false,
        }
    }

    /// Starts a new document (the next event of a stream).
    pub(super) fn reset(&mut self) {
        *self = JsonScanner::new(self.max);
    }

    /// Reads the next bytes of the document.
    pub(super) fn feed(&mut self, path: &JsonPath, bytes: &[u8]) {
        if let Err((error, at)) = self.scan(path, bytes) {
            if self.state != State::Failed {
                self.fail(error, self.offset + at as u64);
            }
        }
        self.offset += bytes.len() as u64;
    }

    /// The loop behind [`feed`](JsonScanner::feed): the common runs (string contents,
    /// whitespace, digits, literals) in tight inner loops, one state transition per token;
    /// everything else byte by byte through [`step`](JsonScanner::step). An error gives the
    /// offending byte's index.
    #[inline]
    fn scan(&mut self, path: &JsonPath, bytes: &[u8]) -> Result<(), (Error, usize)> {
        let mut i = 0;
        while let Some(&first) = bytes.get(i) {
            let b = match self.state {
                State::Str if !self.comparing => {
                    i = skip_string(bytes, i);
                    let Some(&b) = bytes.get(i) else { break };
                    if b == b'"' {
                        i += 1;
                        self.end_string(path);
                        continue;
                    }
                    b
                }
                State::Value
                | State::ArrayFirst
                | State::ObjectFirst
                | State::Key
                | State::Colon
                | State::After
                | State::End => {
                    let mut b = first;
                    while matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
                        i += 1;
                        match bytes.get(i) {
                            Some(&next) => b = next,
                            None => return Ok(()),
                        }
                    }
                    i += 1;
                    self.structural(b, path).map_err(|e| (e, i - 1))?;
                    continue;
                }
                State::Number if !self.target_num => {
                    // The digits of a number that is not the target need no arithmetic.
                    let mut b = first;
                    if matches!(self.num, Num::Int | Num::Frac | Num::Exp) {
                        while b.is_ascii_digit() {
                            i += 1;
                            match bytes.get(i) {
                                Some(&next) => b = next,
                                None => return Ok(()),
                            }
                        }
                    }
                    b
                }
                State::Literal => {
                    let rest = bytes.get(i..).unwrap_or_default();
                    if rest.len() >= self.literal.len() && rest.starts_with(self.literal) {
                        i += self.literal.len();
                        self.literal = b"";
                        self.after_value();
                        continue;
                    }
                    first
                }
                State::Failed => return Ok(()),
                _ => first,
            };
            self.step(b, path).map_err(|e| (e, i))?;
            i += 1;
        }
        Ok(())
    }

    /// How the document ended, once every byte has been fed.
    pub(super) fn finish(&self) -> JsonEnd {
        match self.state {
            State::Failed => JsonEnd::Invalid(self.failure),
            State::End => JsonEnd::Valid(self.capture),
            // A number at the top level ends with the document (it cannot be the target).
            State::Number
                if self.depth == 0
                    && matches!(self.num, Num::Zero | Num::Int | Num::Frac | Num::Exp) =>
            {
                JsonEnd::Valid(None)
            }
            // Only ever at the top level before anything but whitespace.
            State::Value if self.depth == 0 => JsonEnd::Empty,
            _ => JsonEnd::Invalid(BadReason::Truncated {
                offset: self.offset,
            }),
        }
    }

    fn fail(&mut self, error: Error, offset: u64) {
        self.state = State::Failed;
        self.failure = match error {
            Error::Syntax => BadReason::Malformed { offset },
            Error::TooDeep => BadReason::TooDeep { offset },
        };
    }

    #[inline(always)]
    fn step(&mut self, b: u8, path: &JsonPath) -> Result<(), Error> {
        match self.state {
            State::Str => self.string_byte(b, path),
            State::Number => {
                if self.number_byte(b)? {
                    Ok(())
                } else {
                    // The byte after a number belongs to what follows it.
                    self.end_number();
                    self.after_value();
                    self.structural(b, path)
                }
            }
            State::Literal => match self.literal.split_first() {
                Some((&expected, rest)) if expected == b => {
                    self.literal = rest;
                    if rest.is_empty() {
                        self.after_value();
                    }
                    Ok(())
                }
                _ => Err(Error::Syntax),
            },
            State::Escape => self.escape(b, path),
            State::Hex => self.hex_digit(b, path),
            State::SurrogateBackslash if b == b'\\' => {
                self.state = State::SurrogateU;
                Ok(())
            }
            State::SurrogateU if b == b'u' => {
                self.start_hex();
                Ok(())
            }
            // serde_json refuses a leading surrogate not followed by a trailing one.
            State::SurrogateBackslash | State::SurrogateU => Err(Error::Syntax),
            State::Utf8 => self.utf8_continuation(b, path),
            State::Failed => Err(Error::Syntax),
            State::Value
            | State::ArrayFirst
            | State::ObjectFirst
            | State::Key
            | State::Colon
            | State::After
            | State::End => self.structural(b, path),
        }
    }

    /// A byte between tokens.
    #[inline(always)]
    fn structural(&mut self, b: u8, path: &JsonPath) -> Result<(), Error> {
        if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            return Ok(());
        }
        match (self.state, b) {
            (State::ArrayFirst, b']') | (State::After, b']') => self.pop(true),
            (State::ObjectFirst, b'}') | (State::After, b'}') => self.pop(false),
            (State::Value | State::ArrayFirst, _) => self.value_start(b),
            (State::ObjectFirst | State::Key, b'"') => {
                self.start_key(path);
                Ok(())
            }
            (State::Colon, b':') => {
                self.state = State::Value;
                Ok(())
            }
            (State::After, b',') => {
                self.state = if self.in_array() {
                    State::Value
                } else {
                    State::Key
                };
                Ok(())
            }
            _ => Err(Error::Syntax),
        }
    }

    #[inline(always)]
    fn in_array(&self) -> bool {
        self.depth > 0 && (self.arrays >> (self.depth - 1)) & 1 == 1
    }

    #[inline(always)]
    fn push(&mut self, array: bool) -> Result<(), Error> {
        if usize::from(self.depth) >= MAX_DEPTH {
            return Err(Error::TooDeep);
        }
        if array {
            self.arrays |= 1 << self.depth;
        } else {
            self.arrays &= !(1 << self.depth);
        }
        self.depth += 1;
        Ok(())
    }

    #[inline(always)]
    fn pop(&mut self, array: bool) -> Result<(), Error> {
        if self.depth == 0 || self.in_array() != array {
            return Err(Error::Syntax);
        }
        self.depth -= 1;
        self.path_depth = self.path_depth.min(self.depth);
        self.after_value();
        Ok(())
    }

    #[inline(always)]
    fn after_value(&mut self) {
        self.state = if self.depth == 0 {
            State::End
        } else {
            State::After
        };
    }

    #[inline(always)]
    fn value_start(&mut self, b: u8) -> Result<(), Error> {
        let role = std::mem::replace(&mut self.role, Role::Skip);
        if role != Role::Skip {
            // A later occurrence of a key on the path replaces everything the earlier one held
            // (duplicate keys: the last wins, as in serde_json).
            self.capture = None;
        }
        let target = role == Role::Target;
        match b {
            b'{' => {
                self.push(false)?;
                if role == Role::Prefix {
                    self.path_depth = self.depth;
                }
                self.state = State::ObjectFirst;
            }
            b'[' => {
                self.push(true)?;
                self.state = State::ArrayFirst;
            }
            b'"' => {
                self.in_key = false;
                self.comparing = false;
                self.state = State::Str;
            }
            b'-' | b'0'..=b'9' => {
                self.state = State::Number;
                self.target_num = target;
                self.value = 0;
                self.negative = b == b'-';
                self.fraction = false;
                self.exponent = false;
                self.overflow = false;
                self.num = match b {
                    b'-' => Num::Minus,
                    b'0' => Num::Zero,
                    _ => {
                        self.value = u64::from(b - b'0');
                        Num::Int
                    }
                };
                return Ok(());
            }
            b't' => self.start_literal(b"rue"),
            b'f' => self.start_literal(b"alse"),
            // `null` at the path is absent: the capture stays `None`.
            b'n' => {
                self.start_literal(b"ull");
                return Ok(());
            }
            _ => return Err(Error::Syntax),
        }
        if target {
            self.capture = Some(Usage::Bad(BadReason::NotANumber));
        }
        Ok(())
    }

    #[inline(always)]
    fn start_literal(&mut self, rest: &'static [u8]) {
        self.literal = rest;
        self.state = State::Literal;
    }

    #[inline(always)]
    fn start_key(&mut self, path: &JsonPath) {
        self.state = State::Str;
        self.in_key = true;
        self.comparing = self.path_depth == self.depth && usize::from(self.depth) <= path.len();
        self.key_pos = 0;
    }

    /// The path's key at the current depth.
    #[inline(always)]
    fn path_key<'p>(&self, path: &'p JsonPath) -> &'p [u8] {
        path.key(usize::from(self.depth).wrapping_sub(1))
            .unwrap_or_default()
    }

    /// The next decoded byte of a key being compared. At the first difference the key is
    /// another key: the rest of it is skipped like any string.
    #[inline(always)]
    fn key_byte(&mut self, b: u8, path: &JsonPath) {
        if self.path_key(path).get(usize::from(self.key_pos)) == Some(&b) {
            self.key_pos += 1;
        } else {
            self.comparing = false;
        }
    }

    #[inline(always)]
    fn end_string(&mut self, path: &JsonPath) {
        if self.in_key {
            let matched = self.comparing && usize::from(self.key_pos) == self.path_key(path).len();
            self.role = match matched {
                false => Role::Skip,
                true if usize::from(self.depth) == path.len() => Role::Target,
                true => Role::Prefix,
            };
            self.state = State::Colon;
        } else {
            self.after_value();
        }
    }

    #[inline(always)]
    fn string_byte(&mut self, b: u8, path: &JsonPath) -> Result<(), Error> {
        match b {
            b'"' => self.end_string(path),
            b'\\' => self.state = State::Escape,
            // serde_json refuses raw control characters in strings.
            0x00..=0x1F => return Err(Error::Syntax),
            0x80..=0xFF => {
                let Some((len, lo, hi)) = utf8_lead(b) else {
                    return Err(Error::Syntax);
                };
                let left = len - 1;
                self.utf8_left = left;
                self.utf8_lo = lo;
                self.utf8_hi = hi;
                self.state = State::Utf8;
                if self.comparing {
                    self.key_byte(b, path);
                }
            }
            _ => {
                if self.comparing {
                    self.key_byte(b, path);
                }
            }
        }
        Ok(())
    }

    fn utf8_continuation(&mut self, b: u8, path: &JsonPath) -> Result<(), Error> {
        if !(self.utf8_lo..=self.utf8_hi).contains(&b) {
            return Err(Error::Syntax);
        }
        if self.comparing {
            self.key_byte(b, path);
        }
        self.utf8_left -= 1;
        self.utf8_lo = 0x80;
        self.utf8_hi = 0xBF;
        if self.utf8_left == 0 {
            self.state = State::Str;
        }
        Ok(())
    }

    fn escape(&mut self, b: u8, path: &JsonPath) -> Result<(), Error> {
        let decoded = match b {
            b'"' | b'\\' | b'/' => b,
            b'b' => 0x08,
            b'f' => 0x0C,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                self.start_hex();
                return Ok(());
            }
            _ => return Err(Error::Syntax),
        };
        if self.comparing {
            self.key_byte(decoded, path);
        }
        self.state = State::Str;
        Ok(())
    }

    fn start_hex(&mut self) {
        self.hex = 0;
        self.hex_left = 4;
        self.state = State::Hex;
    }

    fn hex_digit(&mut self, b: u8, path: &JsonPath) -> Result<(), Error> {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => return Err(Error::Syntax),
        };
        self.hex = (self.hex << 4) | u16::from(digit);
        self.hex_left -= 1;
        if self.hex_left > 0 {
            return Ok(());
        }
        let unit = self.hex;
        let scalar = if self.high != 0 {
            if !(0xDC00..=0xDFFF).contains(&unit) {
                return Err(Error::Syntax);
            }
            let high = u32::from(self.high - 0xD800);
            self.high = 0;
            0x1_0000 + ((high << 10) | u32::from(unit - 0xDC00))
        } else if (0xDC00..=0xDFFF).contains(&unit) {
            // A trailing surrogate alone.
            return Err(Error::Syntax);
        } else if (0xD800..=0xDBFF).contains(&unit) {
            self.high = unit;
            self.state = State::SurrogateBackslash;
            return Ok(());
        } else {
            u32::from(unit)
        };
        if self.comparing {
            if let Some(c) = char::from_u32(scalar) {
                let mut buf = [0; 4];
                for &byte in c.encode_utf8(&mut buf).as_bytes() {
                    self.key_byte(byte, path);
                }
            }
        }
        self.state = State::Str;
        Ok(())
    }

    /// Whether the number goes on with `b` (`false`: it ended before `b`).
    #[inline(always)]
    fn number_byte(&mut self, b: u8) -> Result<bool, Error> {
        self.num = match (self.num, b) {
            (Num::Minus, b'0') => Num::Zero,
            (Num::Minus | Num::Int, b'0'..=b'9') => {
                if self.target_num {
                    match self
                        .value
                        .checked_mul(10)
                        .and_then(|v| v.checked_add(u64::from(b - b'0')))
                    {
                        Some(v) => self.value = v,
                        None => self.overflow = true,
                    }
                }
                Num::Int
            }
            (Num::Zero | Num::Int, b'.') => {
                self.fraction = true;
                Num::Dot
            }
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => {
                self.exponent = true;
                Num::ExpMark
            }
            (Num::Dot | Num::Frac, b'0'..=b'9') => Num::Frac,
            (Num::ExpMark, b'+' | b'-') => Num::ExpSign,
            (Num::ExpMark | Num::ExpSign | Num::Exp, b'0'..=b'9') => Num::Exp,
            (Num::Zero | Num::Int | Num::Frac | Num::Exp, _) => return Ok(false),
            (Num::Minus | Num::Dot | Num::ExpMark | Num::ExpSign, _) => {
                return Err(Error::Syntax);
            }
        };
        Ok(true)
    }

    #[inline(always)]
    fn end_number(&mut self) {
        if self.target_num {
            self.capture = Some(if self.negative {
                Usage::Bad(BadReason::Negative)
            } else if self.fraction {
                Usage::Bad(BadReason::Fraction)
            } else if self.exponent {
                Usage::Bad(BadReason::Exponent)
            } else if self.overflow || self.value > self.max {
                Usage::Bad(BadReason::TooLarge)
            } else {
                Usage::Found(self.value)
            });
        }
    }
}
