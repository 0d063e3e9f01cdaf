//! What a replay is asked to do: the configuration, the logs and how to read them.

use std::path::PathBuf;

use http::HeaderName;
use tollgate_config::Config;

use crate::format::{Format, JsonFields};
use crate::sweep::Sweep;

/// What to replay, and how to read it.
#[derive(Clone, Debug)]
pub struct Options {
    /// The configuration, as `tollgate serve` would run it.
    pub config: Config,
    /// The log files, merged by time.
    pub logs: Vec<PathBuf>,
    /// Their format.
    pub format: Format,
    /// JSON field names.
    pub fields: JsonFields,
    /// The header the logged API key was sent in (default `x-api-key`).
    pub api_key_header: HeaderName,
    /// The host of every request whose line does not say (combined logs never do).
    pub host: Option<String>,
    /// Candidate quotas to try.
    pub sweep: Option<Sweep>,
    /// Write every request's decisions here, one JSON object a line (the configuration as
    /// given, not the candidates): `{"file","line","time","status","decisions":[{"policy",
    /// "allowed","remaining","key"}]}`.
    pub decisions: Option<PathBuf>,
}

impl Options {
    /// Replays `logs` through `config`, reading the format from each file.
    pub fn new(config: Config, logs: Vec<PathBuf>) -> Self {
        Options {
            config,
            logs,
            format: Format::Auto,
            fields: JsonFields::default(),
            api_key_header: HeaderName::from_static("x-api-key"),
            host: None,
            sweep: None,
            decisions: None,
        }
    }
}
