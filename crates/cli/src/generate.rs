//! `tollgate completions SHELL` and `tollgate man`: shell completion scripts (clap_complete)
//! and man pages (clap_mangen) generated from the command line's own definition, so they never
//! disagree with it. The Debian package ships both (`scripts/deb.sh` generates them).

use std::path::Path;

use anyhow::Context as _;
use clap::CommandFactory;
use clap_complete::Shell;
use clap_mangen::roff::{Roff, bold, roman};

use crate::{Cli, stdout};

/// Writes the completion script for `shell` to standard output.
pub(crate) fn completions(shell: Shell) -> anyhow::Result<()> {
    // Made in memory first: clap_complete panics when its writer fails (a closed pipe).
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "tollgate", &mut script);
    stdout::write(&script).context("cannot write the completion script")
}

/// Writes the man page of `tollgate` to standard output, or, with `dir`, the pages of
/// `tollgate` and of each subcommand (`tollgate-serve.1`, ...) into that folder.
pub(crate) fn man(dir: Option<&Path>) -> anyhow::Result<()> {
    let pages = pages().context("cannot render the man pages")?;
    match dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            for (name, text) in &pages {
                let path = dir.join(name);
                std::fs::write(&path, text)
                    .with_context(|| format!("cannot write {}", path.display()))?;
            }
            Ok(())
        }
        None => {
            let (_, page) = pages.first().context("no man page was rendered")?;
            stdout::write(page).context("cannot write the man page")
        }
    }
}

/// Every page, `tollgate.1` first, then one for each subcommand, as (file name, roff).
///
/// Without the `help` subcommand: a page of its own would only repeat `--help`, so none is
/// written, and the SUBCOMMANDS section must then not name a `tollgate-help(1)` either
/// (`tollgate help` still works; `clap_mangen::generate_to` leaves it out the same way).
fn pages() -> std::io::Result<Vec<(String, Vec<u8>)>> {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut pages = Vec::new();
    add_pages(cmd, &mut pages)?;
    Ok(pages)
}

/// Adds `cmd`'s page, then its subcommands' (hidden ones left out, as
/// `clap_mangen::generate_to` walks them).
fn add_pages(cmd: clap::Command, pages: &mut Vec<(String, Vec<u8>)>) -> std::io::Result<()> {
    let subcommands: Vec<clap::Command> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .cloned()
        .collect();
    let name = cmd.get_name().to_owned();
    let man = clap_mangen::Man::new(cmd).source(format!("tollgate {}", env!("CARGO_PKG_VERSION")));
    let mut text = Vec::new();
    man.render(&mut text)?;
    // The server's signals and exit statuses, on the pages a reader of `tollgate serve` opens.
    if matches!(name.as_str(), "tollgate" | "serve") {
        text = with_sections(text, &extra_sections());
    }
    pages.push((man.get_filename(), text));
    for sub in subcommands {
        add_pages(sub, pages)?;
    }
    Ok(())
}

/// `page` with `sections` before its VERSION section (after the subcommands, where
/// man-pages(7) puts EXIT STATUS), or at its end when it has none.
fn with_sections(page: Vec<u8>, sections: &str) -> Vec<u8> {
    const VERSION: &[u8] = b"\n.SH VERSION\n";
    match page.windows(VERSION.len()).position(|w| w == VERSION) {
        Some(at) => {
            let (head, tail) = page.split_at(at + 1);
            [head, sections.as_bytes(), tail].concat()
        }
        None => {
            let mut page = page;
            if !page.ends_with(b"\n") {
                page.push(b'\n');
            }
            page.extend_from_slice(sections.as_bytes());
            page
        }
    }
}

/// SIGNALS and EXIT STATUS, as docs/server.md describes the server: clap_mangen has sections
/// only for what the command line defines, so these are roff written here. (No apostrophes:
/// `to_roff` leaves them to be typeset as closing quotes.)
fn extra_sections() -> String {
    let mut roff = Roff::new();
    roff.control("SH", ["SIGNALS"]);
    let entry = |roff: &mut Roff, term: &str, text: &str| {
        roff.control("TP", []);
        roff.text([bold(term)]);
        roff.text([roman(text)]);
    };
    entry(
        &mut roff,
        "SIGHUP",
        "tollgate serve re-reads its --config file, as it does when the file changes (checked \
         every second). A bad file is refused with a log line and the running configuration \
         stays; counters of unchanged policies are kept. Store, listener and [log] changes need \
         a restart.",
    );
    entry(
        &mut roff,
        "SIGTERM, SIGINT",
        "tollgate serve stops taking connections, lets the requests in flight finish for up to \
         [server] drain_timeout (30 seconds by default) while /readyz on the admin listener \
         answers 503, saves its state when [store] path is set, and exits. A second signal \
         during that drain stops it at once, with status 1, and saves nothing.",
    );
    roff.control("SH", ["EXIT STATUS"]);
    entry(
        &mut roff,
        "0",
        "Success; for serve, a clean stop on SIGTERM or SIGINT. Also when the reader of standard \
         output goes away (tollgate man | head): the command stops quietly.",
    );
    entry(
        &mut roff,
        "1",
        "An error, printed on standard error: serve was given a bad configuration or could not \
         start (e.g. the address of a listener is taken), could not save its state at the stop, or \
         was stopped by a second signal during its drain; \
         validate found errors in the file; replay could not read its configuration or logs or \
         write its report.",
    );
    entry(
        &mut roff,
        "2",
        "The command line is wrong (an unknown subcommand or option, a missing argument).",
    );
    roff.to_roff()
}
