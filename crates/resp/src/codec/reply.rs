//! Replies, written into one buffer per batch of pipelined requests, in the protocol the
//! connection chose with `HELLO`: RESP2 by default, RESP3 after `HELLO 3`.

/// The protocol version of a connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// RESP2, what every connection starts with.
    #[default]
    Resp2,
    /// RESP3, after `HELLO 3`: maps, sets, booleans and a null of their own.
    Resp3,
}

impl Protocol {
    /// The version number `HELLO` reports: 2 or 3.
    pub fn version(self) -> i64 {
        match self {
            Protocol::Resp2 => 2,
            Protocol::Resp3 => 3,
        }
    }
}

/// Replies being written, in one protocol.
///
/// ```
/// use tollgate_resp::codec::{Protocol, ReplyBuf};
///
/// let mut out = ReplyBuf::new(Protocol::Resp2);
/// out.map(1);
/// out.bulk(b"limit");
/// out.integer(10);
/// assert_eq!(out.as_bytes(), b"*2\r\n$5\r\nlimit\r\n:10\r\n");
///
/// let mut out = ReplyBuf::new(Protocol::Resp3);
/// out.map(1);
/// out.bulk(b"limit");
/// out.integer(10);
/// assert_eq!(out.as_bytes(), b"%1\r\n$5\r\nlimit\r\n:10\r\n");
/// ```
#[derive(Clone, Debug, Default)]
pub struct ReplyBuf {
    bytes: Vec<u8>,
    protocol: Protocol,
}

impl ReplyBuf {
    /// An empty buffer writing `protocol`.
    pub fn new(protocol: Protocol) -> Self {
        ReplyBuf {
            bytes: Vec::with_capacity(1024),
            protocol,
        }
    }

    /// The protocol replies are written in.
    #[inline]
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// Writes the following replies in `protocol` (after `HELLO`).
    pub fn set_protocol(&mut self, protocol: Protocol) {
        self.protocol = protocol;
    }

    /// The bytes written so far.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// How many bytes are written.
    #[inline]
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether nothing is written.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Forgets what was written (once it is sent), keeping the allocation.
    #[inline]
    pub fn clear(&mut self) {
        self.bytes.clear();
    }

    /// Forgets what was written and gives the memory back (an idle connection's).
    pub fn release(&mut self) {
        self.bytes = Vec::new();
    }

    /// A simple string: `+OK`. CR and LF, which would end it early, become spaces.
    pub fn simple(&mut self, text: &[u8]) {
        self.bytes.push(b'+');
        self.line(text);
    }

    /// An error: `text` starts with its code (`ERR unknown command ...`, `NOPROTO ...`). CR and
    /// LF become spaces, as Redis does for every error it sends.
    pub fn error(&mut self, text: &[u8]) {
        self.bytes.push(b'-');
        self.line(text);
    }

    /// `text` and CRLF, with CR and LF in it made spaces.
    fn line(&mut self, text: &[u8]) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(text);
        for b in &mut self.bytes[start..] {
            if matches!(*b, b'\r' | b'\n') {
                *b = b' ';
            }
        }
        self.bytes.extend_from_slice(b"\r\n");
    }

    /// An integer.
    #[inline]
    pub fn integer(&mut self, n: i64) {
        self.header(b':', n);
    }

    /// A bulk string (binary-safe).
    pub fn bulk(&mut self, data: &[u8]) {
        self.header(b'$', data.len() as i64);
        self.bytes.extend_from_slice(data);
        self.bytes.extend_from_slice(b"\r\n");
    }

    /// A verbatim string of `format` (three bytes, such as `txt`): `=` in RESP3, a bulk string
    /// of `data` alone in RESP2, as Redis answers `INFO`.
    pub fn verbatim(&mut self, format: [u8; 3], data: &[u8]) {
        match self.protocol {
            Protocol::Resp2 => self.bulk(data),
            Protocol::Resp3 => {
                self.header(b'=', data.len() as i64 + 4);
                self.bytes.extend_from_slice(&format);
                self.bytes.push(b':');
                self.bytes.extend_from_slice(data);
                self.bytes.extend_from_slice(b"\r\n");
            }
        }
    }

    /// The null reply: `$-1` in RESP2, `_` in RESP3.
    pub fn null(&mut self) {
        match self.protocol {
            Protocol::Resp2 => self.bytes.extend_from_slice(b"$-1\r\n"),
            Protocol::Resp3 => self.bytes.extend_from_slice(b"_\r\n"),
        }
    }

    /// The header of an array of `len` replies, which follow.
    #[inline]
    pub fn array(&mut self, len: usize) {
        self.header(b'*', len as i64);
    }

    /// The header of a map of `len` pairs, which follow as key, value, key, value: `%` in
    /// RESP3, an array of `2 × len` in RESP2 (as Redis answers `HELLO 2`).
    pub fn map(&mut self, len: usize) {
        match self.protocol {
            Protocol::Resp2 => self.header(b'*', 2 * len as i64),
            Protocol::Resp3 => self.header(b'%', len as i64),
        }
    }

    /// The header of a set of `len` replies: `~` in RESP3, an array in RESP2.
    pub fn set(&mut self, len: usize) {
        match self.protocol {
            Protocol::Resp2 => self.header(b'*', len as i64),
            Protocol::Resp3 => self.header(b'~', len as i64),
        }
    }

    /// A boolean: `#t`/`#f` in RESP3, the integer 1 or 0 in RESP2.
    pub fn boolean(&mut self, value: bool) {
        match (self.protocol, value) {
            (Protocol::Resp2, v) => self.integer(i64::from(v)),
            (Protocol::Resp3, true) => self.bytes.extend_from_slice(b"#t\r\n"),
            (Protocol::Resp3, false) => self.bytes.extend_from_slice(b"#f\r\n"),
        }
    }

    /// Raw bytes already in the protocol (a constant reply).
    #[inline]
    pub(crate) fn raw(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
    }

    #[inline]
    fn header(&mut self, kind: u8, n: i64) {
        self.bytes.push(kind);
        self.bytes
            .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        self.bytes.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_protocols() {
        for (protocol, expected) in [
            (
                Protocol::Resp2,
                &b"+OK\r\n-ERR a  b\r\n:-7\r\n$2\r\nhi\r\n$-1\r\n*2\r\n+~\r\n*2\r\n:1\r\n:0\r\n"[..],
            ),
            (
                Protocol::Resp3,
                b"+OK\r\n-ERR a  b\r\n:-7\r\n$2\r\nhi\r\n_\r\n%1\r\n+~\r\n~2\r\n#t\r\n#f\r\n",
            ),
        ] {
            let mut out = ReplyBuf::new(protocol);
            out.simple(b"OK");
            out.error(b"ERR a\r\nb");
            out.integer(-7);
            out.bulk(b"hi");
            out.null();
            out.map(1);
            out.simple(b"~");
            out.set(2);
            out.boolean(true);
            out.boolean(false);
            assert_eq!(out.as_bytes(), expected);
        }
    }
}
