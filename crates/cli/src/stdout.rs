//! Standard output for the commands that print (`validate`, `replay`, `man`, `completions`):
//! written whole, and a reader that goes away (`tollgate replay ... | head -1`) is not an error.
//!
//! Rust ignores SIGPIPE, so a write to a closed pipe fails with `BrokenPipe` (and `println!`
//! panics on it). That failure is [`Closed`], and `main` ends the command on it quietly with
//! exit status 0: the reader decided it had read enough, which is no failure of the command
//! (as ripgrep does; `set -o pipefail` scripts that cut the output short stay green, and the
//! reader's own status tells of its errors). Killed by SIGPIPE, as C tools are, the shell
//! would see 141 and a pipefail script fail for a `head`; and taking the signal back needs
//! `unsafe` code, which this workspace denies.

use std::fmt;
use std::io::{ErrorKind, Write as _};

/// Standard output was closed by its reader.
#[derive(Debug)]
pub(crate) struct Closed;

impl fmt::Display for Closed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("standard output was closed")
    }
}

impl std::error::Error for Closed {}

/// Writes `bytes` to standard output and flushes them: [`Closed`] when the reader has gone,
/// else the I/O error, for the caller to say what it was writing.
pub(crate) fn write(bytes: impl AsRef<[u8]>) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes.as_ref()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Err(Closed.into()),
        Err(e) => Err(e.into()),
    }
}

/// Whether `error` is, or was caused by, standard output being closed.
pub(crate) fn closed(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| cause.is::<Closed>())
}
