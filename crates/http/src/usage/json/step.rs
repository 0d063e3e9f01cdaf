//! The scanner's byte-by-byte path: a token cut by a chunk's end, a key on the path that must
//! be decoded to be compared (escapes, non-ASCII), and everything malformed (so that the error
//! names the offending byte). Same grammar, same answers as the fast path; the tests read every
//! document both ways.

use super::super::bytes::Number;
use super::super::{BadReason, JsonPath, MAX_DEPTH, Usage};
use super::{Error, JsonScanner, Num, Role, State};

impl JsonScanner {
    #[inline(always)]
    pub(super) fn step(&mut self, b: u8, path: &JsonPath) -> Result<(), Error> {
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
            // Anything else, non-ASCII included (not checked to be UTF-8), is the string's.
            _ => {
                if self.comparing {
                    self.key_byte(b, path);
                }
            }
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
        if self.comparing
            && let Some(c) = char::from_u32(scalar)
        {
            let mut buf = [0; 4];
            for &byte in c.encode_utf8(&mut buf).as_bytes() {
                self.key_byte(byte, path);
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
            self.capture = Some(
                Number {
                    len: 0,
                    negative: self.negative,
                    fraction: self.fraction,
                    exponent: self.exponent,
                    integer: (!self.overflow).then_some(self.value),
                }
                .as_cost(self.max),
            );
        }
    }
}
