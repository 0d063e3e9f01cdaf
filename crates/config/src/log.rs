//! `[log]`: how the server logs, `format = "text" | "json"` and `level`. Read once at start:
//! the binary sets up its log subscriber before it serves.

use serde::Deserialize;
use toml::Spanned;
use tracing::level_filters::LevelFilter;

use super::Errors;

/// How each log line is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (tracing-subscriber's default format).
    #[default]
    Text,
    /// One JSON object per line (tracing-subscriber's JSON format), for log collectors.
    Json,
}

/// `[log]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogConfig {
    /// `format` (default `"text"`).
    pub format: LogFormat,
    /// `level` (default `"info"`): the most verbose level written. The `TOLLGATE_LOG`
    /// environment variable (a tracing filter such as `info,tollgate_server=debug`) overrides it.
    pub level: LevelFilter,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Text,
            level: LevelFilter::INFO,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLog {
    format: Option<Spanned<String>>,
    level: Option<Spanned<String>>,
}

const FORMATS: &[(&str, LogFormat)] = &[("text", LogFormat::Text), ("json", LogFormat::Json)];
const LEVELS: &[(&str, LevelFilter)] = &[
    ("info", LevelFilter::INFO),
    ("warn", LevelFilter::WARN),
    ("error", LevelFilter::ERROR),
    ("debug", LevelFilter::DEBUG),
    ("trace", LevelFilter::TRACE),
    ("off", LevelFilter::OFF),
];

/// Validates `[log]`; its absence is the default.
pub(super) fn validate(raw: Option<RawLog>, errs: &mut Errors<'_>) -> Option<LogConfig> {
    let mut out = LogConfig::default();
    let Some(raw) = raw else {
        return Some(out);
    };
    let mut ok = true;
    if let Some(v) = &raw.format {
        match choose(v, "format", FORMATS, errs) {
            Some(f) => out.format = f,
            None => ok = false,
        }
    }
    if let Some(v) = &raw.level {
        match choose(v, "level", LEVELS, errs) {
            Some(l) => out.level = l,
            None => ok = false,
        }
    }
    ok.then_some(out)
}

fn choose<T: Copy>(
    v: &Spanned<String>,
    field: &str,
    choices: &[(&str, T)],
    errs: &mut Errors<'_>,
) -> Option<T> {
    let found = choices
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(v.get_ref()));
    if found.is_none() {
        let names: Vec<String> = choices.iter().map(|(n, _)| format!("\"{n}\"")).collect();
        errs.at(
            v.span().start,
            format!(
                "[log] field \"{field}\": {:?} is not one of {}; write e.g. {field} = {}",
                v.get_ref(),
                names.join(", "),
                names.first().map_or("", String::as_str)
            ),
        );
    }
    found.map(|(_, t)| *t)
}
