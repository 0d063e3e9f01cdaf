//! `tollgate replay`: access logs run through a configuration's policies, to choose limits on
//! numbers rather than guesses.
//!
//! Every logged request goes through the very engine `tollgate serve` runs
//! ([`tollgate_config::http_engine`], the configuration's policies, keys, routes and costs)
//! over a memory store, on a [`ManualClock`](tollgate::ManualClock) set to the line's time:
//! a day of traffic replays in seconds and decides exactly as the server would have. The
//! logs stream through; memory grows with the number of keys, not with the log.
//!
//! - [`format`](mod@format): nginx/Apache combined lines (and Tollgate's documented
//!   `log_format` with the API key, `$msec` and `$request_time`), JSON lines with mapped field
//!   names; gzip read as is.
//! - [`replay`]: the run; [`Summary`]: what it found, per policy and per sweep candidate;
//!   [`sweep`]: `limit=`, `window=` and `algorithm=` candidates.
//! - [`report`]: `report.html`, `summary.json` and the plots (PNG and SVG); [`table::render`]
//!   the same figures as text.

mod engine;
pub mod format;
mod input;
mod options;
pub mod report;
mod run;
mod stats;
pub mod summary;
pub mod sweep;
pub mod table;

pub use format::{Format, JsonFields};
pub use run::{Options, Progress, ReplayError, replay};
pub use summary::Summary;
pub use sweep::Sweep;
