//! What the reading side found about the lines themselves: those that are not requests, those
//! whose cost is not a whole number, and those earlier than a line replayed before them.

use std::time::Duration;

use serde::Serialize;
use tollgate::Timestamp;

/// A line of one of the logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LineRef {
    /// Index into [`Summary::logs`](super::Summary::logs).
    pub file: usize,
    /// 1-based line number.
    pub line: u64,
}

/// What the reading side counts, for the summary.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) lines: u64,
    pub(crate) bad: u64,
    pub(crate) bad_listed: Vec<(LineRef, String)>,
    pub(crate) bad_costs: u64,
    pub(crate) bad_costs_listed: Vec<LineRef>,
    pub(crate) late: u64,
    pub(crate) late_max: Duration,
    pub(crate) late_listed: Vec<(LineRef, Duration)>,
    pub(crate) first: Option<Timestamp>,
    pub(crate) last: Option<Timestamp>,
    pub(crate) keys_held_max: usize,
}

impl Counts {
    /// The lines the summary lists: bad, with a bad cost, out of order.
    pub(crate) fn into_listed(self) -> (BadLines, BadCosts, OutOfOrder) {
        let bad = BadLines {
            count: self.bad,
            first: self
                .bad_listed
                .into_iter()
                .map(|(at, reason)| BadLine { at, reason })
                .collect(),
        };
        let costs = BadCosts {
            count: self.bad_costs,
            first: self.bad_costs_listed,
        };
        let late = OutOfOrder {
            count: self.late,
            max_lag_secs: self.late_max.as_secs_f64(),
            first: self
                .late_listed
                .into_iter()
                .map(|(at, lag)| LateLine {
                    at,
                    lag_secs: lag.as_secs_f64(),
                })
                .collect(),
        };
        (bad, costs, late)
    }
}

/// Lines that are not requests.
#[derive(Clone, Debug, Serialize)]
pub struct BadLines {
    /// How many.
    pub count: u64,
    /// The first few, with the reason.
    pub first: Vec<BadLine>,
}

/// One bad line.
#[derive(Clone, Debug, Serialize)]
pub struct BadLine {
    /// Where.
    #[serde(flatten)]
    pub at: LineRef,
    /// Why it is not a request.
    pub reason: String,
}

/// Requests whose logged cost is not a whole number (`12.5`, `-3`, `abc`): replayed all the
/// same, each policy charged by the response charging its `cost`, as the server charges a
/// response whose cost is bad (and counts it in
/// [`PolicySummary::usage_fallbacks`](super::PolicySummary::usage_fallbacks)).
#[derive(Clone, Debug, Serialize)]
pub struct BadCosts {
    /// How many.
    pub count: u64,
    /// The first few.
    pub first: Vec<LineRef>,
}

/// Lines earlier than one replayed before them: decided at the replay's time of then.
#[derive(Clone, Debug, Serialize)]
pub struct OutOfOrder {
    /// How many.
    pub count: u64,
    /// The largest lag, in seconds.
    pub max_lag_secs: f64,
    /// The first few, with their lag.
    pub first: Vec<LateLine>,
}

/// One line out of order.
#[derive(Clone, Debug, Serialize)]
pub struct LateLine {
    /// Where.
    #[serde(flatten)]
    pub at: LineRef,
    /// How much earlier than the replay's time it was, in seconds.
    pub lag_secs: f64,
}
