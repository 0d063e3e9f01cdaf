//! A `queue` policy's settings, the `queue_*` fields of a `[[policy]]` with `action = "queue"`:
//! how large a request may be to be queued, how many may wait, how often and how patiently a
//! delivery is tried, and when another instance takes over a stopped one's messages.

use std::time::Duration;

use tollgate::parse_duration;
use toml::Spanned;

use super::Errors;

/// `queue_*`: how a `queue` policy stores and delivers requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueSettings {
    /// `queue_max_body`: the largest request body queued, in bytes (default 1 MiB); a larger
    /// one is answered 413.
    pub max_body: usize,
    /// `queue_max_depth`: the most requests waiting or being delivered (default 10,000); past
    /// it, 429 with `Retry-After`.
    pub max_depth: u64,
    /// `queue_attempts`: deliveries tried before a request becomes a dead letter (default 10).
    pub attempts: u32,
    /// `queue_backoff`: the wait before the first retry (default 1s); it doubles each time, up
    /// to [`MAX_BACKOFF`].
    pub backoff: Duration,
    /// `queue_claim_after`: how long a request taken by an instance that stopped (no heartbeat)
    /// waits before another instance takes it over (default 30s; Redis only).
    pub claim_after: Duration,
    /// `queue_concurrency`: requests one instance holds at once, being delivered or waiting for
    /// a retry (default 64).
    pub concurrency: usize,
}

/// The longest wait between two attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

impl Default for QueueSettings {
    fn default() -> Self {
        QueueSettings {
            max_body: 1 << 20,
            max_depth: 10_000,
            attempts: 10,
            backoff: Duration::from_secs(1),
            claim_after: Duration::from_secs(30),
            concurrency: 64,
        }
    }
}

impl QueueSettings {
    /// The wait before retry number `retry` (1 for the first): `backoff × 2^(retry − 1)`, at
    /// most [`MAX_BACKOFF`].
    pub fn backoff_for(&self, retry: u32) -> Duration {
        let doublings = retry.saturating_sub(1).min(30);
        self.backoff
            .saturating_mul(1 << doublings)
            .min(MAX_BACKOFF.max(self.backoff))
    }
}

/// The `queue_*` fields of one `[[policy]]`, as written.
pub(super) struct RawQueueFields<'a> {
    pub(super) max_body: Option<&'a Spanned<i64>>,
    pub(super) max_depth: Option<&'a Spanned<i64>>,
    pub(super) attempts: Option<&'a Spanned<i64>>,
    pub(super) backoff: Option<&'a Spanned<String>>,
    pub(super) claim_after: Option<&'a Spanned<String>>,
    pub(super) concurrency: Option<&'a Spanned<i64>>,
}

impl RawQueueFields<'_> {
    /// Each field that is set, with where it is written.
    fn present(&self) -> Vec<(&'static str, usize)> {
        let int = |f: Option<&Spanned<i64>>| f.map(|v| v.span().start);
        let text = |f: Option<&Spanned<String>>| f.map(|v| v.span().start);
        [
            ("queue_max_body", int(self.max_body)),
            ("queue_max_depth", int(self.max_depth)),
            ("queue_attempts", int(self.attempts)),
            ("queue_backoff", text(self.backoff)),
            ("queue_claim_after", text(self.claim_after)),
            ("queue_concurrency", int(self.concurrency)),
        ]
        .into_iter()
        .filter_map(|(name, at)| at.map(|at| (name, at)))
        .collect()
    }
}

/// Validates the `queue_*` fields of a policy: `Some(None)` for a policy that does not queue
/// (where they are errors), `Some(Some(..))` for one that does, `None` after an error.
pub(super) fn validate(
    fields: &RawQueueFields<'_>,
    queues: bool,
    ctx: &str,
    errs: &mut Errors<'_>,
) -> Option<Option<QueueSettings>> {
    if !queues {
        let present = fields.present();
        for (name, at) in &present {
            errs.at(
                *at,
                format!("{ctx}field \"{name}\" applies to action = \"queue\" only; remove it or set action = \"queue\""),
            );
        }
        return present.is_empty().then_some(None);
    }
    let d = QueueSettings::default();
    let second = Duration::from_secs(1);
    // Each checked, so that every mistake is reported, then combined.
    let max_body = int(fields.max_body, "queue_max_body", (0, 64 << 20), ctx, errs);
    let max_depth = int(
        fields.max_depth,
        "queue_max_depth",
        (1, 100_000_000),
        ctx,
        errs,
    );
    let attempts = int(fields.attempts, "queue_attempts", (1, 1_000), ctx, errs);
    let concurrency = int(
        fields.concurrency,
        "queue_concurrency",
        (1, 4_096),
        ctx,
        errs,
    );
    let backoff = time(
        fields.backoff,
        "queue_backoff",
        Duration::from_millis(1),
        ctx,
        errs,
    );
    let claim_after = time(fields.claim_after, "queue_claim_after", second, ctx, errs);
    Some(Some(QueueSettings {
        max_body: max_body?.map_or(Some(d.max_body), |n| usize::try_from(n).ok())?,
        max_depth: max_depth?.map_or(Some(d.max_depth), |n| u64::try_from(n).ok())?,
        attempts: attempts?.map_or(Some(d.attempts), |n| u32::try_from(n).ok())?,
        backoff: backoff?.unwrap_or(d.backoff),
        claim_after: claim_after?.unwrap_or(d.claim_after),
        concurrency: concurrency?.map_or(Some(d.concurrency), |n| usize::try_from(n).ok())?,
    }))
}

/// An integer field within `(min, max)`: `Some(None)` when absent, `None` after an error.
fn int(
    v: Option<&Spanned<i64>>,
    name: &str,
    (min, max): (i64, i64),
    ctx: &str,
    errs: &mut Errors<'_>,
) -> Option<Option<i64>> {
    let Some(v) = v else { return Some(None) };
    let n = *v.get_ref();
    if (min..=max).contains(&n) {
        return Some(Some(n));
    }
    let shown = errs.shown(v.span().start, n);
    errs.at(
        v.span().start,
        format!("{ctx}field \"{name}\" must be from {min} to {max}, not {shown}"),
    );
    None
}

/// A duration field from `min` to a day: `Some(None)` when absent, `None` after an error.
fn time(
    v: Option<&Spanned<String>>,
    name: &str,
    min: Duration,
    ctx: &str,
    errs: &mut Errors<'_>,
) -> Option<Option<Duration>> {
    let Some(v) = v else { return Some(None) };
    let message = match parse_duration(v.get_ref()) {
        Ok(t) if t >= min && t <= Duration::from_secs(86_400) => return Some(Some(t)),
        Ok(_) => format!("{ctx}field \"{name}\" must be from {min:?} to 1d"),
        Err(e) => format!(
            "{ctx}field \"{name}\": {}; write e.g. {name} = \"1s\"",
            e.reason()
        ),
    };
    errs.at(v.span().start, message);
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, ConfigError};

    const PROXY: &str = "[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:3000\"\n";

    fn errors(text: &str) -> Vec<String> {
        match Config::parse("q.toml", text) {
            Err(ConfigError::Invalid(d)) => d.0.iter().map(ToString::to_string).collect(),
            other => panic!("expected errors, got {other:?}"),
        }
    }

    #[test]
    fn a_queue_policy_has_defaults_and_shows_them() {
        let text = format!(
            "{PROXY}[[policy]]\nname = \"hooks\"\nalgorithm = \"leaky_bucket\"\nrate = \"5/s\"\n\
             action = \"queue\"\nqueue_attempts = 4\nqueue_backoff = \"250ms\"\n"
        );
        let config = Config::parse("q.toml", &text).expect("valid");
        let p = &config.policies[0];
        assert_eq!(
            p.queue,
            Some(QueueSettings {
                attempts: 4,
                backoff: Duration::from_millis(250),
                ..QueueSettings::default()
            })
        );
        assert!(p.to_string().contains("action=queue queue_max_body=1048576 queue_max_depth=10000 queue_attempts=4 queue_backoff=250ms"), "{p}");
    }

    #[test]
    fn misplaced_or_wrong_queue_fields_are_reported_with_their_line() {
        let text = format!(
            "{PROXY}[[policy]]\nname = \"api\"\nlimit = 5\nwindow = \"1m\"\naction = \"queue\"\n\
             [[policy]]\nname = \"plain\"\nalgorithm = \"leaky_bucket\"\nrate = \"5/s\"\nqueue_max_depth = 5\n\
             [[policy]]\nname = \"hooks\"\nalgorithm = \"leaky_bucket\"\nrate = \"5/s\"\naction = \"queue\"\n\
             queue_attempts = 0\nqueue_backoff = \"1.5s\"\nqueue_claim_after = \"10ms\"\n"
        );
        let errs = errors(&text);
        let expect = [
            "q.toml:8:10: policy \"api\": action \"queue\" needs algorithm \"leaky_bucket\"",
            "q.toml:13:19: policy \"plain\": field \"queue_max_depth\" applies to action = \"queue\" only",
            "q.toml:19:18: policy \"hooks\": field \"queue_attempts\" must be from 1 to 1000, not 0",
            "q.toml:20:17: policy \"hooks\": field \"queue_backoff\": ",
            "q.toml:21:21: policy \"hooks\": field \"queue_claim_after\" must be from 1s to 1d",
        ];
        assert_eq!(errs.len(), expect.len(), "{errs:#?}");
        for (e, want) in errs.iter().zip(expect) {
            assert!(e.starts_with(want), "{e}\nwanted {want}");
        }
    }

    #[test]
    fn the_reference_configuration_documents_a_valid_queue_policy_with_the_defaults() {
        let example = include_str!("../examples/tollgate.toml");
        let block: Vec<&str> = crate::tests::commented_policies(example)
            .into_iter()
            .find(|b| b.contains(&"action = \"queue\""))
            .unwrap_or_default();
        assert!(block.len() > 10, "no queue policy in the example");
        let text = format!("{PROXY}{}\n", block.join("\n"));
        let config = Config::parse("example", &text).expect("the example's queue policy is valid");
        assert_eq!(config.policies[0].queue, Some(QueueSettings::default()));
    }

    #[test]
    fn a_queue_policy_refuses_charging_by_the_response() {
        let head = format!(
            "{PROXY}[[policy]]\nname = \"hooks\"\nalgorithm = \"leaky_bucket\"\nrate = \"5/s\"\n\
             action = \"queue\"\n"
        );
        for (extra, at, field) in [
            (
                "charge = \"response\"\ncost_from = \"header:x-cost\"\n",
                "q.toml:9:10:",
                "charge",
            ),
            ("count_status = [\"5xx\"]\n", "q.toml:9:16:", "count_status"),
        ] {
            let errs = errors(&format!("{head}{extra}"));
            assert_eq!(errs.len(), 1, "{extra}: {errs:?}");
            let want = format!(
                "{at} policy \"hooks\": field \"{field}\" does not apply to action \"queue\""
            );
            assert!(errs[0].starts_with(&want), "{errs:?}");
        }
        // Held with `delay`, the same policy charges what each response says.
        let delayed = format!(
            "{PROXY}[[policy]]\nname = \"hooks\"\nalgorithm = \"leaky_bucket\"\nrate = \"5/s\"\n\
             action = \"delay\"\ncharge = \"response\"\ncost_from = \"header:x-cost\"\n"
        );
        assert!(Config::parse("q.toml", &delayed).is_ok());
    }

    #[test]
    fn a_queue_policy_needs_the_proxy() {
        let text = "[[policy]]\nname = \"hooks\"\nalgorithm = \"leaky_bucket\"\nrate = \"5/s\"\naction = \"queue\"\n";
        let errs = errors(text);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with("q.toml:1:1: policy \"hooks\": action \"queue\" needs [proxy]"),
            "{errs:?}"
        );
    }

    #[test]
    fn backoff_doubles_up_to_the_bound() {
        let s = QueueSettings {
            backoff: Duration::from_millis(100),
            ..QueueSettings::default()
        };
        let waits: Vec<u128> = (1..=5).map(|n| s.backoff_for(n).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600]);
        assert_eq!(s.backoff_for(40), MAX_BACKOFF);
        // A first wait above the bound is kept as it is, never shortened.
        let long = QueueSettings {
            backoff: Duration::from_secs(600),
            ..QueueSettings::default()
        };
        assert_eq!(long.backoff_for(3), Duration::from_secs(600));
    }
}
