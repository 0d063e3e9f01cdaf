//! Logs written for the tests: combined lines at chosen times, configurations, a replay.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};

use time::OffsetDateTime;
use time::macros::format_description;
use tollgate_config::Config;
use tollgate_replay::{Options, Summary};

/// 2024-03-01T00:00:00Z: a minute boundary, so fixed windows start with the log.
pub const START: i64 = 1_709_251_200;

/// A combined line for `ip` at `START + secs` (whole seconds).
pub fn line(ip: &str, secs: i64, method: &str, target: &str) -> String {
    let clf = format_description!("[day]/[month repr:short]/[year]:[hour]:[minute]:[second] +0000");
    let t = OffsetDateTime::from_unix_timestamp(START + secs)
        .ok()
        .and_then(|t| t.format(clf).ok())
        .unwrap_or_default();
    format!("{ip} - - [{t}] \"{method} {target} HTTP/1.1\" 200 42 \"-\" \"test/1.0\"")
}

/// One client at twice a limit of 10 a minute (every 3 s), one at half (every 12 s), for ten
/// minutes, in time order.
pub fn twice_and_half() -> Vec<String> {
    let mut lines = Vec::new();
    for secs in 0..600 {
        if secs % 3 == 0 {
            lines.push(line("203.0.113.1", secs, "GET", "/v1/items"));
        }
        if secs % 12 == 0 {
            lines.push(line("203.0.113.2", secs, "GET", "/v1/items"));
        }
    }
    lines
}

/// Writes `lines` to `dir/name`.
pub fn write_log(dir: &Path, name: &str, lines: &[String]) -> PathBuf {
    let path = dir.join(name);
    let mut text = lines.join("\n");
    if !text.is_empty() {
        text.push('\n');
    }
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    path
}

/// One policy: `algorithm` with q = 10, w = 1m, keyed by IP, on `/v1/**`.
pub fn policy(algorithm: &str) -> String {
    let quota = match algorithm {
        "token_bucket" => "capacity = 10\nrefill = \"10/1m\"".to_owned(),
        "leaky_bucket" => "rate = \"10/1m\"\nqueue = 9".to_owned(),
        _ => "limit = 10\nwindow = \"1m\"".to_owned(),
    };
    format!(
        "[[policy]]\nname = \"api\"\nalgorithm = \"{algorithm}\"\n{quota}\nkey = [\"header:x-api-key\", \"ip\"]\nmatch = {{ path = \"/v1/**\" }}\n"
    )
}

/// A validated configuration.
pub fn config(text: &str) -> Config {
    Config::parse("test.toml", text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// Replays `logs` through `config` with the default options.
pub fn replay(config: Config, logs: Vec<PathBuf>) -> Summary {
    replay_with(Options::new(config, logs))
}

/// Replays with `options`.
pub fn replay_with(options: Options) -> Summary {
    tollgate_replay::replay(&options, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"))
}
