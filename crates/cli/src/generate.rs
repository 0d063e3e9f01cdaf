//! `tollgate completions SHELL` and `tollgate man`: shell completion scripts (clap_complete)
//! and man pages (clap_mangen) generated from the command line's own definition, so they never
//! disagree with it. The Debian package ships both (`scripts/deb.sh` generates them).

use std::io::Write;
use std::path::Path;

use anyhow::Context as _;
use clap::CommandFactory;
use clap_complete::Shell;

use crate::Cli;

/// Writes the completion script for `shell` to standard output.
pub(crate) fn completions(shell: Shell) -> anyhow::Result<()> {
    // Made in memory first: clap_complete panics when its writer fails (a closed pipe).
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "tollgate", &mut script);
    let mut out = std::io::stdout().lock();
    out.write_all(&script)
        .and_then(|()| out.flush())
        .context("cannot write the completion script")
}

/// Writes the man page of `tollgate` to standard output, or, with `dir`, the pages of
/// `tollgate` and of each subcommand (`tollgate-serve.1`, ...) into that folder.
pub(crate) fn man(dir: Option<&Path>) -> anyhow::Result<()> {
    match dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            clap_mangen::generate_to(Cli::command(), dir)
                .with_context(|| format!("cannot write the man pages to {}", dir.display()))
        }
        None => {
            let mut out = std::io::stdout().lock();
            clap_mangen::Man::new(Cli::command())
                .render(&mut out)
                .and_then(|()| out.flush())
                .context("cannot write the man page")
        }
    }
}
