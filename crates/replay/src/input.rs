//! Log files as streams of lines: plain or gzip (recognised by its magic bytes, whatever the
//! file is called), read line by line with their numbers, counting the bytes read from disk
//! for the progress bar.

use std::cell::Cell;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use flate2::read::MultiGzDecoder;

use crate::format::{Format, JsonFields, LineError, LoggedRequest, Parser};

/// Bytes read per system call: large, since a log is read once from start to end.
const READ_BUFFER: usize = 256 * 1024;

/// The UTF-8 byte order mark.
const UTF8_BOM: &[u8] = b"\xef\xbb\xbf";

/// One log file being read.
pub(crate) struct Source {
    /// The file as given on the command line.
    pub(crate) path: PathBuf,
    reader: Box<dyn BufRead>,
    /// The current line, without its line ending.
    pub(crate) line: Vec<u8>,
    /// The current line's number (1-based).
    pub(crate) line_no: u64,
    format: Format,
    fields: JsonFields,
    parser: Option<Parser>,
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Source")
            .field("path", &self.path)
            .field("line_no", &self.line_no)
            .finish_non_exhaustive()
    }
}

/// Counts the bytes read from the file (compressed, for a gzip file).
struct Counting<R> {
    inner: R,
    read: Rc<Cell<u64>>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.set(self.read.get() + n as u64);
        Ok(n)
    }
}

impl Source {
    /// Opens `path`; bytes read from it are added to `read`.
    pub(crate) fn open(
        path: &Path,
        format: Format,
        fields: &JsonFields,
        read: Rc<Cell<u64>>,
    ) -> io::Result<Source> {
        let file = Counting {
            inner: File::open(path)?,
            read,
        };
        let mut plain = BufReader::with_capacity(READ_BUFFER, file);
        let gzip = plain.fill_buf()?.starts_with(&[0x1f, 0x8b]);
        let reader: Box<dyn BufRead> = if gzip {
            Box::new(BufReader::with_capacity(
                READ_BUFFER,
                MultiGzDecoder::new(plain),
            ))
        } else {
            Box::new(plain)
        };
        Ok(Source {
            path: path.to_path_buf(),
            reader,
            line: Vec::with_capacity(512),
            line_no: 0,
            format,
            fields: fields.clone(),
            parser: None,
        })
    }

    /// Reads the next non-blank line; `false` at the end of the file.
    pub(crate) fn next_line(&mut self) -> io::Result<bool> {
        loop {
            self.line.clear();
            if self.reader.read_until(b'\n', &mut self.line)? == 0 {
                return Ok(false);
            }
            self.line_no += 1;
            while matches!(self.line.last(), Some(b'\n' | b'\r')) {
                self.line.pop();
            }
            // A UTF-8 byte order mark, as some editors and Windows tools write at the start of
            // a file, is not part of the first line: left in, it would hide the `{` that makes
            // the file JSON lines, and break the first field of either format.
            if self.line_no == 1 && self.line.starts_with(UTF8_BOM) {
                self.line.drain(..UTF8_BOM.len());
            }
            if !self.line.trim_ascii().is_empty() {
                return Ok(true);
            }
        }
    }

    /// The request the current line records. The first line decides an `auto` format.
    pub(crate) fn parse(&mut self) -> Result<LoggedRequest<'_>, LineError> {
        if self.parser.is_none() {
            self.format = self.format.resolve(&self.line);
            self.parser = Some(Parser::new(self.format, &self.fields));
        }
        match &mut self.parser {
            Some(parser) => parser.parse(&self.line),
            None => Err(LineError::new("no parser")),
        }
    }

    /// The format this file is read in (`auto` until its first line has been parsed).
    pub(crate) fn format(&self) -> Format {
        self.format
    }
}
