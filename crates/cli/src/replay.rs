//! `tollgate replay`: the arguments, a progress bar on a terminal, the table on stdout and the
//! report folder; the work is `tollgate_replay`'s.

use std::io::IsTerminal as _;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tollgate_replay::sweep::Dimension;
use tollgate_replay::{Format, JsonFields, Options, Progress, Sweep};
use tollgate_server::{Config, ConfigError};

use crate::stdout;

/// `tollgate replay --config FILE LOG...`.
#[derive(Args, Debug)]
pub(crate) struct ReplayArgs {
    /// The configuration to try, as `tollgate serve --config` reads it (its store is replaced
    /// by a memory store: a replay never touches Redis).
    #[arg(short, long)]
    config: PathBuf,
    /// Access logs, plain or gzip; several are merged by time.
    #[arg(required = true, value_name = "LOG")]
    logs: Vec<PathBuf>,
    /// combined (nginx/Apache, optionally with "$http_x_api_key" $msec $request_time), json
    /// (one object a line) or auto (per file, from its first line).
    #[arg(long, default_value = "auto")]
    format: Format,
    /// Write report.html, summary.json and the plots (PNG and SVG) into this folder.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Also write every request's decisions to FILE, one JSON object a line (line, time,
    /// status, and per policy: allowed, remaining, key).
    #[arg(long, value_name = "FILE")]
    decisions: Option<PathBuf>,
    /// Try other quotas for one policy: limit=50,100,200, window=30s,1m or
    /// algorithm=token_bucket,sliding_window_counter; repeat to make a grid.
    #[arg(long, value_name = "FIELD=V1,V2,...")]
    sweep: Vec<Dimension>,
    /// The policy --sweep changes (needed when the configuration has several).
    #[arg(long)]
    policy: Option<String>,
    /// The request header the logged API key was sent in.
    #[arg(long, default_value = "x-api-key", value_name = "NAME")]
    api_key_header: http_name::Name,
    /// The Host of requests whose line does not name one (combined logs never do).
    #[arg(long)]
    host: Option<String>,
    /// JSON: the field with the request's time (RFC 3339, [10/Oct/2000:13:55:36 -0700] or
    /// epoch seconds or milliseconds).
    #[arg(long, default_value = "time", value_name = "FIELD")]
    time_field: String,
    /// JSON: the field with the method.
    #[arg(long, default_value = "method", value_name = "FIELD")]
    method_field: String,
    /// JSON: the field with the path (and query).
    #[arg(long, default_value = "path", value_name = "FIELD")]
    path_field: String,
    /// JSON: the field with the Host.
    #[arg(long, default_value = "host", value_name = "FIELD")]
    host_field: String,
    /// JSON: the field with the client's IP address.
    #[arg(long, default_value = "ip", value_name = "FIELD")]
    ip_field: String,
    /// JSON: the field with the API key.
    #[arg(long, default_value = "api_key", value_name = "FIELD")]
    api_key_field: String,
    /// JSON: the field with the authenticated user (for the `user` key selector).
    #[arg(long, default_value = "user", value_name = "FIELD")]
    user_field: String,
    /// JSON: the field with the status the server answered (`count_status` counts by it).
    #[arg(long, default_value = "status", value_name = "FIELD")]
    status_field: String,
    /// JSON: the field with what the request cost (`charge = "response"` charges it).
    #[arg(long, default_value = "cost", value_name = "FIELD")]
    cost_field: String,
    /// JSON: the field with how long the request took, in seconds (a concurrency limit holds
    /// its slot for it).
    #[arg(long, default_value = "request_time", value_name = "FIELD")]
    duration_field: String,
}

/// A header name as a command-line value.
mod http_name {
    /// A valid HTTP header name.
    #[derive(Clone, Debug)]
    pub(crate) struct Name(pub(crate) String);

    impl std::str::FromStr for Name {
        type Err = String;

        fn from_str(s: &str) -> Result<Self, String> {
            let valid = !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if valid {
                Ok(Name(s.to_ascii_lowercase()))
            } else {
                Err(format!("{s:?} is not an HTTP header name"))
            }
        }
    }
}

/// Runs the replay; `main` prints its error (each cause once) and ends it quietly when the
/// reader of standard output has gone.
pub(crate) fn run(args: ReplayArgs) -> anyhow::Result<()> {
    let config = match Config::load(&args.config) {
        Ok(c) => c,
        Err(ConfigError::Invalid(d)) => anyhow::bail!("invalid configuration:\n{d}"),
        Err(e) => return Err(e.into()),
    };
    let mut options = Options::new(config, args.logs);
    options.format = args.format;
    options.fields = JsonFields {
        time: args.time_field,
        method: args.method_field,
        path: args.path_field,
        host: args.host_field,
        ip: args.ip_field,
        api_key: args.api_key_field,
        user: args.user_field,
        status: args.status_field,
        cost: args.cost_field,
        duration: args.duration_field,
    };
    options.api_key_header = args.api_key_header.0.parse().context("--api-key-header")?;
    options.host = args.host;
    options.decisions = args.decisions;
    if !args.sweep.is_empty() {
        options.sweep = Some(Sweep {
            policy: args.policy,
            dimensions: args.sweep,
        });
    } else if args.policy.is_some() {
        anyhow::bail!("--policy names the policy --sweep changes; add a --sweep");
    }
    let bar = progress_bar();
    let mut on_progress = |p: &Progress| {
        bar.set_length(p.bytes_total);
        bar.set_position(p.bytes_read);
        bar.set_message(format!("{} lines", p.lines));
    };
    let summary = tollgate_replay::replay(&options, &mut on_progress);
    bar.finish_and_clear();
    let summary = summary?;
    let table =
        stdout::write(tollgate_replay::table::render(&summary)).context("cannot write the table");
    // The report --out asked for is written even when the table's reader has gone
    // (`tollgate replay --out DIR ... | head`): what was replayed is not lost for it.
    if let Some(dir) = &args.out {
        tollgate_replay::report::write(&summary, dir)?;
        table?;
        let report = format!("\nreport: {}\n", dir.join("report.html").display());
        return stdout::write(report).context("cannot write the report's path");
    }
    table
}

/// A bar on a terminal; nothing when stderr is piped or redirected.
fn progress_bar() -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(0);
    let style = ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {msg} ({eta})")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}
