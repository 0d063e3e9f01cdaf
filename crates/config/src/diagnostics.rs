//! What is wrong with a configuration, and where: each problem with its file, line and column,
//! collected while the file is validated so that all of them are reported at once.

use std::fmt;
use std::path::{Path, PathBuf};

/// One problem in a configuration file, with its position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// The file, as given.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column (in characters).
    pub column: usize,
    /// What is wrong and what to write instead.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file, self.line, self.column, self.message
        )
    }
}

/// Every problem found in a configuration file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: cannot read the configuration: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file was read but is not a valid configuration.
    #[error("{0}")]
    Invalid(Diagnostics),
    /// The envoyproxy/ratelimit files of `--envoy-config DIR` are not a valid configuration;
    /// the error names the file and the descriptor.
    #[error("{0}")]
    Envoy(tollgate_envoy::ConfigError),
}

/// Collects diagnostics, turning byte offsets into line and column.
pub(crate) struct Errors<'a> {
    file: &'a str,
    dir: Option<PathBuf>,
    text: &'a str,
    list: Vec<Diagnostic>,
    suppressed: Vec<String>,
    /// Integers past the 64 bits TOML holds, which the shape check replaced by the nearest
    /// that fit so that each field's own check reports its range (see [`Errors::too_large`]).
    too_large: Vec<TooLarge>,
}

/// An integer written past the 64 bits TOML holds, e.g. `limit = 99999999999999999999`.
struct TooLarge {
    /// Where the value is written.
    at: usize,
    /// The value as written (underscores left out).
    written: String,
    /// The diagnostic when no check of the field reports one at `at`.
    message: String,
}

impl<'a> Errors<'a> {
    pub(crate) fn new(file: &'a str, text: &'a str) -> Self {
        Errors {
            file,
            dir: Path::new(file).parent().map(Path::to_path_buf),
            text,
            list: Vec::new(),
            suppressed: Vec::new(),
            too_large: Vec::new(),
        }
    }

    /// `path` relative to the configuration file's folder.
    pub(crate) fn relative(&self, path: &str) -> PathBuf {
        match &self.dir {
            Some(d) if Path::new(path).is_relative() => d.join(path),
            _ => PathBuf::from(path),
        }
    }

    /// Drops later diagnostics starting with `prefix` (a field already reported otherwise).
    pub(crate) fn suppress(&mut self, prefix: String) {
        self.suppressed.push(prefix);
    }

    /// Records that the integer at `at`, `written` in the file, does not fit 64 bits and was
    /// replaced by the nearest one that does: the field's check then refuses it with its range
    /// (and [`Errors::shown`] puts `written` in that message); `message` is reported instead
    /// when no check does.
    pub(crate) fn too_large(&mut self, at: usize, written: String, message: String) {
        self.too_large.push(TooLarge {
            at,
            written,
            message,
        });
    }

    /// An integer field's value at `at` for a message: as written when it was too large for 64
    /// bits (what the field holds is then a stand-in), else `value`.
    pub(crate) fn shown(&self, at: usize, value: impl fmt::Display) -> String {
        match self.too_large.iter().find(|t| t.at == at) {
            Some(t) => t.written.clone(),
            None => value.to_string(),
        }
    }

    pub(crate) fn finish(&mut self) -> Diagnostics {
        // A too-large integer no check refused still refuses the file, naming the field.
        for t in std::mem::take(&mut self.too_large) {
            let (line, column) = self.position(t.at);
            if !self
                .list
                .iter()
                .any(|d| (d.line, d.column) == (line, column))
            {
                self.at(t.at, t.message);
            }
        }
        let suppressed = std::mem::take(&mut self.suppressed);
        let mut list = std::mem::take(&mut self.list);
        list.retain(|d| !suppressed.iter().any(|p| d.message.starts_with(p.as_str())));
        list.sort_by_key(|d| (d.line, d.column));
        Diagnostics(list)
    }

    pub(crate) fn at(&mut self, offset: usize, message: String) {
        let (line, column) = self.position(offset);
        self.list.push(Diagnostic {
            file: self.file.to_owned(),
            line,
            column,
            message,
        });
    }

    /// The 1-based line and column (in characters) of byte `offset`.
    fn position(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let before = self.text.get(..offset).unwrap_or(self.text);
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before.get(line_start..).map_or(0, |s| s.chars().count()) + 1;
        (line, column)
    }
}
