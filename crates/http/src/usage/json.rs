//! The incremental JSON scanner behind `json:PATH`: a state machine over bytes that validates a
//! document's syntax as strictly as `serde_json` does (but for the UTF-8 of string contents,
//! not checked: see the module `usage`) and captures the scalar at one path of object
//! keys, fed in chunks split anywhere, in a fixed-size state (no tree, no copy of a key or a
//! number, whatever the body).
//!
//! How the path is followed without a stack of keys: containers on the path always form a
//! prefix of the open containers (`path_depth` of them; one bit per level says whether a
//! container is an array). Only a key of the innermost container on the path is compared, byte
//! by byte as it is decoded, with the path's key at that depth; a key that matches makes the
//! value after it either the next container on the path or, at the last key, the target.
//!
//! Two paths read the same grammar. Between tokens, [`JsonScanner::tokens`] takes whole tokens
//! at a time with the hot state in locals: strings skipped sixteen bytes at a time, numbers and
//! literals read whole ([`super::bytes`]). A token it cannot finish (cut by the chunk's end, a
//! key on the path with escapes, anything malformed) goes byte by byte through `step`
//! (`json/step.rs`), which knows where every byte stands, so an error names the offending
//! byte. The answer never depends on which path read what: the tests feed every document whole,
//! byte by byte, and split everywhere.

mod step;

use super::bytes::{next_token, number_at, skip_string};
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

impl State {
    fn between_tokens(self) -> bool {
        matches!(
            self,
            State::Value
                | State::ArrayFirst
                | State::ObjectFirst
                | State::Key
                | State::Colon
                | State::After
                | State::End
        )
    }
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
        if let Err((error, at)) = self.scan(path, bytes)
            && self.state != State::Failed
        {
            self.fail(error, self.offset + at as u64);
        }
        self.offset += bytes.len() as u64;
    }

    /// The loop behind [`feed`](JsonScanner::feed). Between tokens, [`tokens`] reads whole
    /// tokens at a time; a token it cannot finish in this chunk (or that needs a closer look:
    /// a key on the path with escapes, anything malformed) is read byte by byte by
    /// [`step`](JsonScanner::step), string contents still skipped in runs. An error gives the
    /// offending byte's index.
    ///
    /// [`tokens`]: JsonScanner::tokens
    fn scan(&mut self, path: &JsonPath, bytes: &[u8]) -> Result<(), (Error, usize)> {
        let mut i = 0;
        loop {
            if self.state.between_tokens() {
                i = self.tokens(path, bytes, i)?;
            } else if self.state == State::Str && !self.comparing {
                i = skip_string(bytes, i);
            }
            let Some(&b) = bytes.get(i) else {
                return Ok(());
            };
            if self.state == State::Failed {
                return Ok(());
            }
            self.step(b, path).map_err(|e| (e, i))?;
            i += 1;
        }
    }

    /// Reads whole tokens from `bytes[i..]` while between tokens, with the hot state in locals.
    /// Returns the end of `bytes`, or the first byte of a token to be read byte by byte (the
    /// state still what it was before that token).
    #[inline]
    fn tokens(
        &mut self,
        path: &JsonPath,
        bytes: &[u8],
        mut i: usize,
    ) -> Result<usize, (Error, usize)> {
        let mut state = self.state;
        let mut depth = self.depth;
        let mut path_depth = self.path_depth;
        let mut arrays = self.arrays;
        let mut role = self.role;
        let keys = path.len();
        let after = |depth: u8| {
            if depth == 0 { State::End } else { State::After }
        };
        let in_array = |arrays: u64, depth: u8| depth > 0 && (arrays >> (depth - 1)) & 1 == 1;
        // One pass of the loop reads a key and its colon, a value, and what follows it, in
        // that order, each part skipped when the state says it was read already: the parts of
        // a member come in a fixed order, which the branch predictor learns (a jump on the
        // state before each token would not be).
        let result = loop {
            if matches!(state, State::ObjectFirst | State::Key | State::Colon) {
                if state != State::Colon {
                    let Some(b) = next_token(bytes, &mut i) else {
                        break Ok(i);
                    };
                    if b == b'}' && state == State::ObjectFirst {
                        depth -= 1;
                        path_depth = path_depth.min(depth);
                        state = after(depth);
                        i += 1;
                        continue;
                    }
                    if b != b'"' {
                        break Err((Error::Syntax, i));
                    }
                    let rest = bytes.get(i + 1..).unwrap_or_default();
                    if path_depth == depth && usize::from(depth) <= keys {
                        // A key of the container on the path. An escape makes a raw key
                        // longer than what it decodes to, so one no longer than the path's key
                        // matches only as it is; a longer one with an escape is compared
                        // decoded, byte by byte.
                        let end = skip_string(rest, 0);
                        if rest.get(end) != Some(&b'"') {
                            break Ok(i);
                        }
                        let raw = rest.get(..end).unwrap_or_default();
                        let key = path.key(usize::from(depth) - 1).unwrap_or_default();
                        let escaped = |raw: &[u8]| raw.contains(&b'\\');
                        let matched = if raw.len() <= key.len() {
                            raw == key && !escaped(raw)
                        } else if escaped(raw) {
                            break Ok(i);
                        } else {
                            false
                        };
                        role = match matched {
                            false => Role::Skip,
                            true if usize::from(depth) == keys => Role::Target,
                            true => Role::Prefix,
                        };
                        i += end + 2;
                    } else {
                        let end = skip_string(rest, 0);
                        if rest.get(end) != Some(&b'"') {
                            break Ok(i);
                        }
                        role = Role::Skip;
                        i += end + 2;
                    }
                    state = State::Colon;
                }
                let Some(b) = next_token(bytes, &mut i) else {
                    break Ok(i);
                };
                if b != b':' {
                    break Err((Error::Syntax, i));
                }
                i += 1;
                state = State::Value;
            }
            if matches!(state, State::Value | State::ArrayFirst) {
                let Some(b) = next_token(bytes, &mut i) else {
                    break Ok(i);
                };
                if b == b']' && state == State::ArrayFirst {
                    depth -= 1;
                    path_depth = path_depth.min(depth);
                    state = after(depth);
                    i += 1;
                    continue;
                }
                let rest = bytes.get(i..).unwrap_or_default();
                let target = role == Role::Target;
                // What the value is as a cost, if it is the target, once it is read whole.
                let cost = match b {
                    b'"' => {
                        let end = skip_string(rest, 1);
                        if rest.get(end) != Some(&b'"') {
                            break Ok(i);
                        }
                        i += end + 1;
                        state = after(depth);
                        Some(Usage::Bad(BadReason::NotANumber))
                    }
                    b'-' | b'0'..=b'9' => {
                        let Some(number) = number_at(rest, target) else {
                            break Ok(i);
                        };
                        i += number.len;
                        state = after(depth);
                        target.then(|| number.as_cost(self.max))
                    }
                    b't' | b'f' | b'n' => {
                        let (whole, len) = match b {
                            b't' => (rest.first_chunk() == Some(b"true"), 4),
                            b'f' => (rest.first_chunk() == Some(b"false"), 5),
                            _ => (rest.first_chunk() == Some(b"null"), 4),
                        };
                        if !whole {
                            break Ok(i);
                        }
                        i += len;
                        state = after(depth);
                        // `null` at the path is absent.
                        (b != b'n').then_some(Usage::Bad(BadReason::NotANumber))
                    }
                    b'{' | b'[' => {
                        if usize::from(depth) >= MAX_DEPTH {
                            break Err((Error::TooDeep, i));
                        }
                        let array = b == b'[';
                        if array {
                            arrays |= 1 << depth;
                            state = State::ArrayFirst;
                        } else {
                            arrays &= !(1 << depth);
                            state = State::ObjectFirst;
                        }
                        depth += 1;
                        if role == Role::Prefix && !array {
                            path_depth = depth;
                        }
                        i += 1;
                        Some(Usage::Bad(BadReason::NotANumber))
                    }
                    _ => break Err((Error::Syntax, i)),
                };
                if role != Role::Skip {
                    // A later occurrence of a key on the path replaces everything the earlier
                    // one held (duplicate keys: the last wins, as in serde_json).
                    self.capture = if target { cost } else { None };
                    role = Role::Skip;
                }
            }
            if state == State::After {
                let Some(b) = next_token(bytes, &mut i) else {
                    break Ok(i);
                };
                let array = in_array(arrays, depth);
                match b {
                    b',' => state = if array { State::Value } else { State::Key },
                    b']' | b'}' if array == (b == b']') => {
                        depth -= 1;
                        path_depth = path_depth.min(depth);
                        state = after(depth);
                    }
                    _ => break Err((Error::Syntax, i)),
                }
                i += 1;
                continue;
            }
            if state == State::End {
                if next_token(bytes, &mut i).is_some() {
                    break Err((Error::Syntax, i));
                }
                break Ok(i);
            }
            if !state.between_tokens() {
                break Ok(i);
            }
        };
        self.state = state;
        self.depth = depth;
        self.path_depth = path_depth;
        self.arrays = arrays;
        self.role = role;
        result
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
}
