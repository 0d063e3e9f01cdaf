//! The replay itself: the logs' lines merged by time, each request decided by every
//! configuration (the one given and each sweep candidate) on one manual clock set to the
//! line's time.
//!
//! Out of order: within one file, a line earlier than one already replayed is decided at the
//! replay's current time (the clock never goes back, as a live server's never does) and
//! counted in [`OutOfOrder`]. Across files there is no such problem: the files are merged, so
//! several servers' logs replay as the traffic one shared store would have seen.

use std::cell::Cell;
use std::io;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use http::{Extensions, HeaderMap, HeaderName, HeaderValue};
use tollgate::{ManualClock, Timestamp};
use tollgate_config::Config;
use tollgate_http::{RequestInfo, UserId};

use crate::engine::{Logged, Run};
use crate::format::{Cost, LineError, LoggedRequest};
use crate::input::Source;
pub use crate::options::Options;
use crate::summary::{Counts, LineRef, Summary};
use crate::sweep::{self, Candidate};

/// How often (in log time) keys whose quota has fully reset are dropped from the stores. The
/// server does it every ten seconds; a purge visits every key and never changes a decision, so
/// a replay, which runs through a day in seconds, does it once a minute of log.
const PURGE_EVERY: Duration = Duration::from_secs(60);

/// How many bad, badly costed or out-of-order lines are listed by number (all are counted).
const LISTED: usize = 20;

/// How often (in lines) progress is reported.
const PROGRESS_EVERY: u64 = 1 << 16;

/// How far a replay has come.
#[derive(Clone, Copy, Debug, Default)]
pub struct Progress {
    /// Bytes read from the files (compressed bytes, for gzip files).
    pub bytes_read: u64,
    /// Their total size.
    pub bytes_total: u64,
    /// Lines read.
    pub lines: u64,
}

/// Why a replay could not run. A bad line is not one: it is counted and reported.
///
/// Each message is whole, the cause included, and the cause is not also handed out as the
/// error's [`source`](std::error::Error::source): a caller that prints the chain (`anyhow`'s
/// `{:#}`, as `tollgate replay` does) would otherwise print the cause twice. (So the fields are
/// named `error`, not `source`, which `thiserror` would take for one.)
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A log file could not be opened or read.
    #[error("{path}: cannot read the log: {error}")]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        error: io::Error,
    },
    /// The configuration could not be built into an engine.
    #[error("cannot build the policy engine{candidate}: {error}")]
    Engine {
        /// ` for candidate limit=50`, or nothing.
        candidate: String,
        /// Why.
        error: tollgate_http::ConfigError,
    },
    /// The sweep does not fit the configuration.
    #[error("{0}")]
    Sweep(String),
    /// The decisions file could not be written.
    #[error("{path}: cannot write the decisions: {error}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        error: io::Error,
    },
    /// The replay's thread stopped unexpectedly.
    #[error("the replay stopped unexpectedly")]
    Stopped,
}

/// Replays the logs; `progress` hears how far it has come now and then. The work runs on a
/// thread of its own, outside any async runtime (see `Run::evaluate`).
pub fn replay(
    options: &Options,
    progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<Summary, ReplayError> {
    std::thread::scope(|s| {
        s.spawn(|| replay_here(options, progress))
            .join()
            .unwrap_or(Err(ReplayError::Stopped))
    })
}

fn replay_here(
    options: &Options,
    progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<Summary, ReplayError> {
    let (swept, candidates) = match &options.sweep {
        Some(s) => {
            let (name, c) = sweep::candidates(&options.config, s).map_err(ReplayError::Sweep)?;
            (Some(name), c)
        }
        None => (None, Vec::new()),
    };
    let clock = ManualClock::new(Timestamp::EPOCH);
    let mut runs = vec![build(&options.config, &clock, None)?];
    for c in &candidates {
        runs.push(build(&c.config, &clock, Some(c))?);
    }
    let read = Rc::new(Cell::new(0u64));
    let mut sources = Vec::with_capacity(options.logs.len());
    let mut total = 0;
    for path in &options.logs {
        let open = |error| ReplayError::Open {
            path: path.clone(),
            error,
        };
        total += std::fs::metadata(path).map_err(open)?.len();
        sources.push(
            Source::open(path, options.format, &options.fields, Rc::clone(&read)).map_err(open)?,
        );
    }
    let mut replayer = Replayer::new(options, clock, runs);
    if let Some(path) = &options.decisions {
        let file = std::fs::File::create(path).map_err(|error| ReplayError::Write {
            path: path.clone(),
            error,
        })?;
        replayer.trace = Some(io::BufWriter::new(file));
        replayer.runs[0].traced = Some(Vec::new());
    }
    let mut report = |lines| {
        progress(&Progress {
            bytes_read: read.get(),
            bytes_total: total,
            lines,
        })
    };
    if let [source] = sources.as_mut_slice() {
        replay_one(&mut replayer, source, 0, &mut report);
    } else {
        replay_merged(&mut replayer, &mut sources, &mut report);
    }
    report(replayer.counts.lines);
    if let (Some(path), Some(mut trace)) = (&options.decisions, replayer.trace.take()) {
        let failed = replayer
            .trace_error
            .take()
            .map_or_else(|| io::Write::flush(&mut trace), Err);
        failed.map_err(|error| ReplayError::Write {
            path: path.clone(),
            error,
        })?;
    }
    Ok(Summary::build(
        options,
        &sources,
        replayer.counts,
        replayer.runs,
        swept,
        candidates,
    ))
}

fn build(
    config: &Config,
    clock: &ManualClock,
    candidate: Option<&Candidate>,
) -> Result<Run, ReplayError> {
    Run::new(config, clock.clone()).map_err(|error| ReplayError::Engine {
        candidate: candidate.map_or_else(String::new, |c| format!(" for candidate {}", c.label)),
        error,
    })
}

/// One file, in its own order.
fn replay_one(r: &mut Replayer, source: &mut Source, file: usize, report: &mut dyn FnMut(u64)) {
    loop {
        match source.next_line() {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => return r.unreadable(file, source, &e),
        }
        let line_no = source.line_no;
        match source.parse() {
            Ok(request) => r.process(&request, file, line_no),
            Err(e) => r.bad(file, line_no, e),
        }
        if r.counts.lines.is_multiple_of(PROGRESS_EVERY) {
            report(r.counts.lines);
        }
    }
}

/// Several files, merged: the line with the earliest time among the files' current lines goes
/// next (ties in command-line order).
fn replay_merged(r: &mut Replayer, sources: &mut [Source], report: &mut dyn FnMut(u64)) {
    let mut heads: Vec<Option<Timestamp>> = Vec::with_capacity(sources.len());
    for (file, source) in sources.iter_mut().enumerate() {
        heads.push(advance(r, source, file));
    }
    while let Some(file) = earliest(&heads) {
        let source = &mut sources[file];
        let line_no = source.line_no;
        match source.parse() {
            Ok(request) => r.process(&request, file, line_no),
            Err(e) => r.bad(file, line_no, e),
        }
        heads[file] = advance(r, source, file);
        if r.counts.lines.is_multiple_of(PROGRESS_EVERY) {
            report(r.counts.lines);
        }
    }
}

fn earliest(heads: &[Option<Timestamp>]) -> Option<usize> {
    heads
        .iter()
        .enumerate()
        .filter_map(|(i, t)| t.map(|t| (t, i)))
        .min()
        .map(|(_, i)| i)
}

/// Moves `source` to its next good line, reporting bad ones; that line's time, or `None` at
/// the end of the file.
fn advance(r: &mut Replayer, source: &mut Source, file: usize) -> Option<Timestamp> {
    loop {
        match source.next_line() {
            Ok(true) => {}
            Ok(false) => return None,
            Err(e) => {
                r.unreadable(file, source, &e);
                return None;
            }
        }
        let line_no = source.line_no;
        match source.parse() {
            Ok(request) => return Some(request.time),
            Err(e) => r.bad(file, line_no, e),
        }
    }
}

/// Turns logged requests into engine requests and hands them to every run.
struct Replayer {
    runs: Vec<Run>,
    clock: ManualClock,
    counts: Counts,
    next_purge: Timestamp,
    api_key_header: HeaderName,
    host: Option<String>,
    // Reused for every request: a line allocates only for what it brings (its API key).
    headers: HeaderMap,
    extensions: Extensions,
    trace: Option<io::BufWriter<std::fs::File>>,
    trace_error: Option<io::Error>,
}

/// One line of `--decisions`.
#[derive(serde::Serialize)]
struct TraceLine<'a> {
    file: usize,
    line: u64,
    time: Option<String>,
    status: u16,
    decisions: &'a [crate::engine::Traced],
}

impl Replayer {
    fn new(options: &Options, clock: ManualClock, runs: Vec<Run>) -> Self {
        Replayer {
            runs,
            clock,
            counts: Counts::default(),
            next_purge: Timestamp::EPOCH,
            api_key_header: options.api_key_header.clone(),
            host: options.host.clone(),
            headers: HeaderMap::new(),
            extensions: Extensions::new(),
            trace: None,
            trace_error: None,
        }
    }

    fn bad(&mut self, file: usize, line: u64, error: LineError) {
        self.counts.lines += 1;
        self.counts.bad += 1;
        if self.counts.bad_listed.len() < LISTED {
            self.counts
                .bad_listed
                .push((LineRef { file, line }, error.to_string()));
        }
    }

    fn unreadable(&mut self, file: usize, source: &Source, error: &io::Error) {
        let reason = format!("cannot read on from here: {error}");
        self.bad(file, source.line_no + 1, LineError(reason.into()));
    }

    fn process(&mut self, request: &LoggedRequest<'_>, file: usize, line: u64) {
        self.headers.clear();
        if let Some(key) = &request.api_key {
            let Ok(value) = HeaderValue::from_bytes(key) else {
                let reason = "the API key is not a valid header value";
                return self.bad(file, line, LineError::new(reason));
            };
            self.headers.insert(self.api_key_header.clone(), value);
        }
        self.counts.lines += 1;
        // Still a request: replayed with a bad cost, as the server hears a response with one.
        if request.cost == Some(Cost::Bad) {
            self.counts.bad_costs += 1;
            if self.counts.bad_costs_listed.len() < LISTED {
                self.counts.bad_costs_listed.push(LineRef { file, line });
            }
        }
        let now = self.tick(request.time, file, line);
        self.extensions.clear();
        if let Some(user) = &request.user {
            self.extensions.insert(UserId::new(user.as_ref()));
        }
        let host = request.host.as_deref().or(self.host.as_deref());
        let info = RequestInfo::new(&request.method, &request.target, &self.headers)
            .with_host(host)
            .with_client_ip(request.ip)
            .with_extensions(Some(&self.extensions));
        let mut status = 200;
        for (i, run) in self.runs.iter_mut().enumerate() {
            let logged = Logged {
                status: request.status,
                cost: request.cost,
                took: request.took,
            };
            let s = run.evaluate(&info, now, logged);
            if i == 0 {
                status = s;
            }
        }
        if let (Some(out), Some(decisions)) = (&mut self.trace, &self.runs[0].traced) {
            let line = TraceLine {
                file,
                line,
                time: crate::summary::rfc3339(now),
                status,
                decisions,
            };
            let written = serde_json::to_writer(&mut *out, &line)
                .map_err(io::Error::from)
                .and_then(|()| io::Write::write_all(out, b"\n"));
            if let Err(e) = written {
                self.trace_error.get_or_insert(e);
            }
        }
    }

    /// Sets the clock to `time`, or keeps it where it is for a line out of order.
    fn tick(&mut self, time: Timestamp, file: usize, line: u64) -> Timestamp {
        let c = &mut self.counts;
        let now = match c.last {
            Some(last) if time < last => {
                let lag = last.saturating_duration_since(time);
                c.late += 1;
                c.late_max = c.late_max.max(lag);
                if c.late_listed.len() < LISTED {
                    c.late_listed.push((LineRef { file, line }, lag));
                }
                return last;
            }
            Some(last) if time == last => return last,
            _ => time,
        };
        c.first.get_or_insert(now);
        c.last = Some(now);
        self.clock.set(now);
        if now >= self.next_purge {
            for run in &self.runs {
                c.keys_held_max = c.keys_held_max.max(run.keys_held());
                run.purge(now);
            }
            self.next_purge = now.saturating_add(PURGE_EVERY);
        }
        now
    }
}
