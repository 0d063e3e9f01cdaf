//! Runs `tollgate` with a standard output whose reader is gone before it writes, as in
//! `tollgate replay ... | head -1` once `head` has its line: every write fails with EPIPE.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

/// A shell that waits until its standard output is a broken pipe (writing `x` until a write
/// fails, SIGPIPE ignored so that the failure is an error, not its death), then becomes the
/// program: no race with the reader's close, whatever the machine's load.
const WAIT_FOR_EPIPE: &str =
    r#"trap '' PIPE; while printf x 2>/dev/null; do :; done; exec "$0" "$@""#;

/// Starts `bin args` in `dir`, its standard output closed by its reader, standard error piped.
pub fn spawn(bin: &str, dir: &Path, args: &[&str]) -> Child {
    let mut child = Command::new("sh")
        .current_dir(dir)
        .args(["-c", WAIT_FOR_EPIPE, bin])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The only reader of the pipe: gone.
    drop(child.stdout.take());
    child
}

/// Runs `bin args` in `dir` with its standard output closed by its reader, to the end.
pub fn run(bin: &str, dir: &Path, args: &[&str]) -> Output {
    spawn(bin, dir, args).wait_with_output().unwrap()
}

/// What was wrong with a command whose reader went away, if anything: it must end quietly,
/// status 0 and nothing on stderr (no panic, no "Broken pipe").
pub fn not_quiet(args: &[&str], out: &Output) -> Option<String> {
    let stderr = String::from_utf8_lossy(&out.stderr);
    (!out.status.success() || !stderr.is_empty())
        .then(|| format!("{args:?}: {:?}\n{stderr}", out.status))
}

/// Checks that a command whose reader went away ended quietly (see [`not_quiet`]).
pub fn assert_quiet(args: &[&str], out: &Output) {
    if let Some(problem) = not_quiet(args, out) {
        panic!("{problem}");
    }
}
