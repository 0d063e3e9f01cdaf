//! The log subscriber, set up from `[log]`: text or JSON lines on standard error, at the
//! configured level. `TOLLGATE_LOG` (or `RUST_LOG`), a tracing filter such as
//! `info,tollgate_server=debug`, overrides the level.

use tollgate_server::config::{LogConfig, LogFormat};
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber for `log`.
pub(crate) fn init(log: &LogConfig) {
    let filter = EnvFilter::try_from_env("TOLLGATE_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new(log.level.to_string()));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match log.format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        // One object per line with the event's fields at the top level, as log collectors
        // expect; spans add nothing here (the server logs events).
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .init(),
    }
}
