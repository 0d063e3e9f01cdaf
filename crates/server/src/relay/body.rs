//! Message bodies on their way through the relay: where each one ends (RFC 9112 §6), and chunked
//! bodies decoded and written again in canonical form.
//!
//! Nothing of a chunked body's framing is passed on as it came: chunk sizes are written anew
//! for the data actually relayed, extensions are dropped, and trailer lines are parsed as
//! fields and either written again or dropped. So whatever a sender puts into a chunk-size line
//! or a trailer (`ACE /x HTTP/1.1`, a bare LF, a second request), the next hop reads exactly
//! the framing the relay wrote, and no byte of it can start a message the relay never saw.

use std::fmt::Write as _;

/// How a message body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Framing {
    /// No body (a request without one, a HEAD answer, 1xx, 204, 304).
    None,
    /// `Content-Length`. A request that said `Content-Length: 0` keeps saying it upstream.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the upstream closes (responses only).
    Close,
}

/// How a body is written to the next hop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Encoding {
    /// As its bytes are: framed by a `Content-Length` the relay wrote, or by closing (an
    /// HTTP/1.0 client).
    Identity,
    /// Chunked, written by the relay.
    Chunked,
}

/// What happens to a chunked body's trailer fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Trailers {
    /// Checked, then dropped: request trailers (an upstream that merged a trailer into the
    /// headers would read fields the rate limiter never saw).
    Drop,
    /// Checked and written again: response trailers, to a chunked client connection.
    Forward,
}

/// A body the relay cannot frame: the exchange ends with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Malformed;

/// Longest chunk-size line (extensions included) accepted.
const MAX_CHUNK_LINE: usize = 4096;
/// Largest trailer section accepted.
const MAX_TRAILERS: usize = 64 * 1024;

/// Moves one body from a buffer of received bytes to an output buffer, encoded for the next
/// hop, as its bytes arrive.
#[derive(Debug)]
pub(super) struct BodyCopy {
    framing: Framing,
    encoding: Encoding,
    trailers: Trailers,
    /// Bytes of a `Length` body still to come.
    remaining: u64,
    chunked: ChunkedDecoder,
    done: bool,
}

impl BodyCopy {
    pub(super) fn new(framing: Framing, encoding: Encoding, trailers: Trailers) -> Self {
        BodyCopy {
            framing,
            encoding,
            trailers,
            remaining: match framing {
                Framing::Length(n) => n,
                _ => 0,
            },
            chunked: ChunkedDecoder::default(),
            done: matches!(framing, Framing::None | Framing::Length(0)),
        }
    }

    /// Whether the whole body went through.
    pub(super) fn done(&self) -> bool {
        self.done
    }

    /// Takes the body's bytes from the start of `input` (none past its end) and appends them to
    /// `out`, encoded; returns how many bytes of `input` it took.
    pub(super) fn copy(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, Malformed> {
        self.copy_tapped(input, out, &mut |_| {})
    }

    /// [`copy`](Self::copy), handing each piece of the body's payload (framing removed) to
    /// `tap` as it passes: what reads a response's cost on its way to the client.
    pub(super) fn copy_tapped(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        tap: &mut impl FnMut(&[u8]),
    ) -> Result<usize, Malformed> {
        if self.done {
            return Ok(0);
        }
        match self.framing {
            Framing::None => Ok(0),
            Framing::Length(_) => {
                let n = usize::try_from(self.remaining).map_or(input.len(), |r| r.min(input.len()));
                tap(&input[..n]);
                self.data(&input[..n], out);
                self.remaining -= n as u64;
                self.done = self.remaining == 0;
                Ok(n)
            }
            Framing::Close => {
                tap(input);
                self.data(input, out);
                Ok(input.len())
            }
            Framing::Chunked => {
                let mut used = 0;
                while used < input.len() && !self.done {
                    let (n, piece) = self.chunked.next(&input[used..])?;
                    used += n;
                    match piece {
                        Piece::Data(range) => {
                            let start = used - n + range.start;
                            let data = &input[start..start + range.len()];
                            tap(data);
                            self.data(data, out);
                        }
                        Piece::LastChunk => {
                            if self.encoding == Encoding::Chunked {
                                out.extend_from_slice(b"0\r\n");
                            }
                        }
                        Piece::Trailer => {
                            if self.encoding == Encoding::Chunked
                                && self.trailers == Trailers::Forward
                            {
                                self.chunked.write_trailer(out);
                            }
                        }
                        Piece::End => {
                            if self.encoding == Encoding::Chunked {
                                out.extend_from_slice(b"\r\n");
                            }
                            self.done = true;
                        }
                        Piece::More => {}
                    }
                }
                Ok(used)
            }
        }
    }

    /// The sender closed: the end of a close-delimited body. `false` when the body was framed
    /// otherwise and is cut short.
    pub(super) fn close(&mut self, out: &mut Vec<u8>) -> bool {
        if self.framing != Framing::Close {
            return self.done;
        }
        if self.encoding == Encoding::Chunked {
            out.extend_from_slice(b"0\r\n\r\n");
        }
        self.done = true;
        true
    }

    fn data(&self, data: &[u8], out: &mut Vec<u8>) {
        if data.is_empty() {
            return;
        }
        match self.encoding {
            Encoding::Identity => out.extend_from_slice(data),
            Encoding::Chunked => {
                let mut size = String::new();
                let _ = write!(size, "{:x}\r\n", data.len());
                out.extend_from_slice(size.as_bytes());
                out.extend_from_slice(data);
                out.extend_from_slice(b"\r\n");
            }
        }
    }
}

/// What the decoder found next.
#[derive(Debug, PartialEq, Eq)]
enum Piece {
    /// Chunk data, at this range of the bytes the decoder was given.
    Data(std::ops::Range<usize>),
    /// The last chunk's size line (`0`).
    LastChunk,
    /// A complete, valid trailer field, held by the decoder (see `write_trailer`).
    Trailer,
    /// The empty line that ends the body.
    End,
    /// Framing consumed, nothing to pass on yet.
    More,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    /// In the chunk size's hex digits.
    #[default]
    Size,
    /// In the extensions after the size, checked by `ExtensionState` and dropped.
    Extension,
    /// A line's CR seen: its LF must follow.
    SizeLf,
    Data,
    DataCr,
    DataLf,
    /// At the start of a trailer line, or of the final empty line.
    TrailerStart,
    /// In a trailer line, which is collected whole before it is checked.
    Trailer,
    TrailerLf,
    FinalLf,
    Done,
}

/// Where in `chunk-ext = *( BWS ";" BWS name [ BWS "=" BWS value ] )` a size line is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum ExtensionState {
    /// Whitespace after the size or a value: a `;` must come.
    #[default]
    Space,
    /// After `;`, before the name.
    BeforeName,
    Name,
    /// Whitespace after a name: `=` or `;` must come.
    AfterName,
    /// After `=`, before the value.
    BeforeValue,
    Token,
    Quoted,
    QuotedEscape,
    /// Just after a quoted value's closing quote.
    QuotedEnd,
}

impl ExtensionState {
    /// Whether the size line may end here.
    fn may_end(self) -> bool {
        matches!(
            self,
            ExtensionState::Name | ExtensionState::Token | ExtensionState::QuotedEnd
        )
    }
}

/// RFC 9112 §7.1, strictly: hex sizes, extensions of the RFC's grammar, lines ending in CRLF
/// (never a bare LF: a recipient that accepted one would see a body end elsewhere), trailer
/// lines that are valid fields.
#[derive(Debug, Default)]
struct ChunkedDecoder {
    state: State,
    extension: ExtensionState,
    size: u64,
    /// Length of the current size line, or of the trailer section so far.
    line: usize,
    digits: usize,
    /// The trailer line being collected.
    trailer: Vec<u8>,
    trailer_total: usize,
}

impl ChunkedDecoder {
    /// Decodes from the start of `input`: how many bytes it took, and what they were.
    fn next(&mut self, input: &[u8]) -> Result<(usize, Piece), Malformed> {
        let mut i = 0;
        while i < input.len() {
            let b = input[i];
            match self.state {
                State::Size => match b {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        let digit = u64::from((b as char).to_digit(16).ok_or(Malformed)?);
                        if self.size > (u64::MAX >> 4) {
                            return Err(Malformed);
                        }
                        self.size = (self.size << 4) | digit;
                        self.digits += 1;
                    }
                    b';' if self.digits > 0 => {
                        self.state = State::Extension;
                        self.extension = ExtensionState::BeforeName;
                    }
                    b' ' | b'\t' if self.digits > 0 => {
                        self.state = State::Extension;
                        self.extension = ExtensionState::Space;
                    }
                    b'\r' if self.digits > 0 => self.state = State::SizeLf,
                    _ => return Err(Malformed),
                },
                State::Extension => {
                    self.line += 1;
                    if self.line > MAX_CHUNK_LINE {
                        return Err(Malformed);
                    }
                    if b == b'\r' {
                        if !self.extension.may_end() {
                            return Err(Malformed);
                        }
                        self.state = State::SizeLf;
                    } else {
                        self.extension = extension_step(self.extension, b)?;
                    }
                }
                State::SizeLf => {
                    if b != b'\n' {
                        return Err(Malformed);
                    }
                    let last = self.size == 0;
                    self.line = 0;
                    self.digits = 0;
                    self.state = if last {
                        State::TrailerStart
                    } else {
                        State::Data
                    };
                    if last {
                        return Ok((i + 1, Piece::LastChunk));
                    }
                }
                State::Data => {
                    let n = usize::try_from(self.size)
                        .map_or(input.len() - i, |s| s.min(input.len() - i));
                    self.size -= n as u64;
                    if self.size == 0 {
                        self.state = State::DataCr;
                    }
                    return Ok((i + n, Piece::Data(i..i + n)));
                }
                State::DataCr => {
                    if b != b'\r' {
                        return Err(Malformed);
                    }
                    self.state = State::DataLf;
                }
                State::DataLf => {
                    if b != b'\n' {
                        return Err(Malformed);
                    }
                    self.state = State::Size;
                }
                State::TrailerStart => match b {
                    b'\r' => self.state = State::FinalLf,
                    _ => {
                        self.trailer.clear();
                        self.state = State::Trailer;
                        continue;
                    }
                },
                State::Trailer => {
                    self.trailer_total += 1;
                    if self.trailer_total > MAX_TRAILERS {
                        return Err(Malformed);
                    }
                    match b {
                        b'\r' => self.state = State::TrailerLf,
                        b'\n' => return Err(Malformed),
                        _ => self.trailer.push(b),
                    }
                }
                State::TrailerLf => {
                    if b != b'\n' || field_line(&self.trailer).is_none() {
                        return Err(Malformed);
                    }
                    self.state = State::TrailerStart;
                    return Ok((i + 1, Piece::Trailer));
                }
                State::FinalLf => {
                    if b != b'\n' {
                        return Err(Malformed);
                    }
                    self.state = State::Done;
                    return Ok((i + 1, Piece::End));
                }
                State::Done => return Ok((i, Piece::End)),
            }
            i += 1;
        }
        Ok((i, Piece::More))
    }

    /// Writes the trailer field just decoded as `name: value` CRLF.
    fn write_trailer(&self, out: &mut Vec<u8>) {
        if let Some((name, value)) = field_line(&self.trailer) {
            out.extend_from_slice(name);
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// One byte of a chunk extension (anything but the line's CR).
fn extension_step(state: ExtensionState, b: u8) -> Result<ExtensionState, Malformed> {
    use ExtensionState as E;
    let space = b == b' ' || b == b'\t';
    // qdtext and the escaped characters of a quoted-string (RFC 9110 §5.6.4).
    let text = space || (0x21..=0x7e).contains(&b) || b >= 0x80;
    Ok(match (state, b) {
        (E::Space | E::Name | E::AfterName | E::Token | E::QuotedEnd, b';') => E::BeforeName,
        (E::Space | E::Token | E::QuotedEnd, _) if space => E::Space,
        (E::BeforeName, _) if space => E::BeforeName,
        (E::BeforeName | E::Name, _) if is_tchar(b) => E::Name,
        (E::Name | E::AfterName, _) if space => E::AfterName,
        (E::Name | E::AfterName, b'=') => E::BeforeValue,
        (E::BeforeValue, _) if space => E::BeforeValue,
        (E::BeforeValue, b'"') => E::Quoted,
        (E::BeforeValue | E::Token, _) if is_tchar(b) => E::Token,
        (E::Quoted, b'"') => E::QuotedEnd,
        (E::Quoted, b'\\') => E::QuotedEscape,
        (E::Quoted | E::QuotedEscape, _) if text => E::Quoted,
        _ => return Err(Malformed),
    })
}

/// A token character (RFC 9110 §5.6.2).
pub(super) fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A field line `name: value` (RFC 9110 §5): a token name, a colon, and a value of visible
/// characters, spaces and tabs, trimmed. `None` when it is not one.
fn field_line(line: &[u8]) -> Option<(&[u8], &[u8])> {
    let colon = line.iter().position(|&b| b == b':')?;
    // Optional whitespace is spaces and tabs only (a form feed is not, and hyper refuses it).
    let ows = |b: &u8| *b == b' ' || *b == b'\t';
    let value = &line[colon + 1..];
    let start = value.iter().position(|b| !ows(b)).unwrap_or(value.len());
    let end = value.iter().rposition(|b| !ows(b)).map_or(start, |e| e + 1);
    let (name, value) = (&line[..colon], &value[start..end]);
    let valid_value = value
        .iter()
        .all(|&b| b == b'\t' || b == b' ' || (0x21..=0x7e).contains(&b) || b >= 0x80);
    (!name.is_empty() && name.iter().all(|&b| is_tchar(b)) && valid_value).then_some((name, value))
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod differential;
