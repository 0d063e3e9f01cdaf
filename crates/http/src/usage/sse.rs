//! Server-Sent Events for `json:PATH`: the WHATWG event-stream parser, reduced to what the
//! usage needs (the `data` of each event, streamed into a [`JsonScanner`] as it arrives) and
//! kept to a fixed-size state: no line, field or event is ever buffered.
//!
//! Joining several `data` lines with LF is feeding the scanner an LF before every data line
//! but an event's first; the LF the specification appends to the last line and removes at
//! dispatch is never fed at all.

use super::json::{JsonEnd, JsonScanner};
use super::{JsonPath, Usage};

const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

/// Where in a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Line {
    /// At the very start of the stream: `matched` bytes of a byte-order mark so far.
    Bom { matched: u8 },
    /// At the start of a line.
    Start,
    /// In a field's name: `len` bytes so far, all of them a prefix of `data` if `data`.
    Name { len: u8, data: bool },
    /// Just after `data:`: an optional space.
    DataSpace,
    /// In a `data` field's value.
    Data,
    /// In a line that does not matter (a comment, another field).
    Skip,
}

/// The first line ending in `s` (LF or CR), eight bytes at a time (see
/// `bytes::first_special_in_word`).
#[inline]
fn line_len(s: &[u8]) -> usize {
    const ONES: u64 = u64::from_le_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_le_bytes([0x80; 8]);
    let mut n = 0;
    while let Some(word) = s.get(n..).and_then(<[u8]>::first_chunk::<8>) {
        let w = u64::from_le_bytes(*word);
        let lf = w ^ (ONES * u64::from(b'\n'));
        let cr = w ^ (ONES * u64::from(b'\r'));
        let found = ((lf.wrapping_sub(ONES) & !lf) | (cr.wrapping_sub(ONES) & !cr)) & HIGHS;
        if found != 0 {
            return n + (found.trailing_zeros() / 8) as usize;
        }
        n += 8;
    }
    while let Some(&b) = s.get(n) {
        if b == b'\n' || b == b'\r' {
            break;
        }
        n += 1;
    }
    n
}

#[derive(Clone, Debug)]
pub(super) struct SseScanner {
    /// The current event's data, as JSON.
    json: JsonScanner,
    /// What the last event that carried the path held.
    last: Option<Usage>,
    line: Line,
    /// The previous chunk ended with CR: an LF starting this one belongs to that line ending.
    after_cr: bool,
    /// The current event has had a `data` line.
    has_data: bool,
}

impl SseScanner {
    pub(super) fn new(max: u64) -> Self {
        SseScanner {
            json: JsonScanner::new(max),
            last: None,
            line: Line::Bom { matched: 0 },
            after_cr: false,
            has_data: false,
        }
    }

    /// Reads the next bytes of the stream.
    pub(super) fn feed(&mut self, path: &JsonPath, bytes: &[u8]) {
        let mut i = 0;
        if self.after_cr && !bytes.is_empty() {
            self.after_cr = false;
            if bytes.first() == Some(&b'\n') {
                i = 1;
            }
        }
        while let Some(&b) = bytes.get(i) {
            match self.line {
                Line::Bom { matched } => {
                    if BOM.get(usize::from(matched)) == Some(&b) {
                        i += 1;
                        self.line = if matched == 2 {
                            Line::Start
                        } else {
                            Line::Bom {
                                matched: matched + 1,
                            }
                        };
                    } else if matched == 0 {
                        self.line = Line::Start;
                    } else {
                        // Part of a mark, then something else: a line whose name is not `data`.
                        self.line = Line::Name {
                            len: matched,
                            data: false,
                        };
                    }
                }
                Line::Start => match b {
                    b'\n' | b'\r' => {
                        self.dispatch();
                        i = self.end_line(bytes, i);
                    }
                    b':' => {
                        self.line = Line::Skip;
                        i += 1;
                    }
                    _ => self.line = Line::Name { len: 0, data: true },
                },
                Line::Name { len, data } => match b {
                    b':' => {
                        i += 1;
                        self.line = if data && len == 4 {
                            self.data_line(path);
                            Line::DataSpace
                        } else {
                            Line::Skip
                        };
                    }
                    b'\n' | b'\r' => {
                        // A line that is only a name: the field's value is empty.
                        if data && len == 4 {
                            self.data_line(path);
                        }
                        i = self.end_line(bytes, i);
                    }
                    _ => {
                        self.line = Line::Name {
                            len: len.saturating_add(1),
                            data: data && b"data".get(usize::from(len)) == Some(&b),
                        };
                        i += 1;
                    }
                },
                Line::DataSpace => {
                    if b == b' ' {
                        i += 1;
                    }
                    self.line = Line::Data;
                }
                Line::Data | Line::Skip => {
                    let rest = bytes.get(i..).unwrap_or_default();
                    let len = line_len(rest);
                    if self.line == Line::Data {
                        self.json.feed(path, rest.get(..len).unwrap_or_default());
                    }
                    i += len;
                    if i < bytes.len() {
                        i = self.end_line(bytes, i);
                    }
                }
            }
        }
    }

    /// Consumes the line ending at `bytes[at]` (CR, LF, or CR LF); returns where the next line
    /// starts.
    fn end_line(&mut self, bytes: &[u8], at: usize) -> usize {
        self.line = Line::Start;
        let next = at + 1;
        if bytes.get(at) == Some(&b'\r') {
            match bytes.get(next) {
                Some(b'\n') => return next + 1,
                None => self.after_cr = true,
                Some(_) => {}
            }
        }
        next
    }

    /// A `data` line starts.
    fn data_line(&mut self, path: &JsonPath) {
        if self.has_data {
            self.json.feed(path, b"\n");
        } else {
            self.has_data = true;
            self.json.reset();
        }
    }

    /// A blank line: the event ends.
    fn dispatch(&mut self) {
        if self.has_data {
            self.has_data = false;
            // An event that is not JSON (`[DONE]`), or has nothing at the path, carries
            // nothing.
            if let JsonEnd::Valid(Some(usage)) = self.json.finish() {
                self.last = Some(usage);
            }
        }
    }

    /// What the last complete event that carried the path held. An event not ended by a
    /// blank line is discarded, as the specification says.
    pub(super) fn finish(&self) -> Option<Usage> {
        self.last
    }
}
