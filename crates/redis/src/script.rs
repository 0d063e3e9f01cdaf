//! The server-side scripts: one small script per algorithm for the usual one-check request, one
//! for the all-or-nothing multi-check request, one for refunds and lease returns, one for
//! concurrency permits given back.
//!
//! Each script only decides what to write, atomically, and replies with the key's state as it
//! found it; the caller computes the verdict from that state with the pure algorithms
//! ([`crate::verdict`]). Everything the caller can do stays out of Lua: it picks the script
//! for the algorithm, computes the parameters (horizons, depths, lease sizes), and reads plain
//! integers back. The clock is chosen once per store by the prelude the scripts start with:
//! Redis `TIME`, or the caller's `now` (then the first `ARGV`, taken off before the body runs).

use redis::{Cmd, Script as RedisScript};
use tollgate::{Check, Quota, StoreError, Timestamp};

use crate::config::ClockSource;

/// A Lua double is exact below 2^53, and the scripts add a leaky bucket's depth to timestamps
/// (about 2^51 µs today): buckets deeper than this (71 years) are refused, not rounded.
pub const MAX_DEPTH: u64 = 1 << 51;

/// A `max_delay` the scripts treat as no bound: above any wait a bucket can have.
const NO_MAX_DELAY: i64 = 1 << 52;

/// Reads Redis's clock (Redis 5 or later replicates a script's effects, so a script may write
/// after reading `TIME`).
const REDIS_CLOCK: &str = "local now = redis.call('TIME')\nnow = now[1] * 1000000 + now[2]\n";

/// Takes the caller's clock from the first `ARGV`, which the store sends in this mode only; the
/// bodies see the same `ARGV` in both modes.
const LOCAL_CLOCK: &str = "local now = tonumber(table.remove(ARGV, 1))\n";

const CEIL_MUL_DIV: &str = include_str!("script/ceil_mul_div.lua");

/// Exact integers past 2^53 (`split`, `join`), spliced where a script meets a time that large.
const BIG_TIME: &str = include_str!("script/big_time.lua");

/// The latest time a bucket's state may hold, as the algorithms cap it (`tollgate`'s
/// `MAX_TIME`): a charge far past the limit stops there. The scripts cap their exact sums at it
/// too, and the step a bucket's charge or refund sends is capped here (no sum needs more).
const MAX_TIME: u64 = u64::MAX >> 1;

/// Which script.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ScriptKind {
    FixedWindow,
    SlidingLog,
    SlidingCounter,
    TokenBucket,
    LeakyBucket,
    Multi,
    Refund,
    Concurrency,
    Release,
}

impl ScriptKind {
    pub(crate) const ALL: [ScriptKind; 9] = [
        ScriptKind::FixedWindow,
        ScriptKind::SlidingLog,
        ScriptKind::SlidingCounter,
        ScriptKind::TokenBucket,
        ScriptKind::LeakyBucket,
        ScriptKind::Multi,
        ScriptKind::Refund,
        ScriptKind::Concurrency,
        ScriptKind::Release,
    ];

    /// The one-check script of `quota`'s algorithm.
    pub(crate) fn of(quota: &Quota) -> ScriptKind {
        match quota {
            Quota::FixedWindow(_) => ScriptKind::FixedWindow,
            Quota::SlidingWindowLog(_) => ScriptKind::SlidingLog,
            Quota::SlidingWindowCounter(_) => ScriptKind::SlidingCounter,
            Quota::TokenBucket(_) => ScriptKind::TokenBucket,
            Quota::LeakyBucket(_) => ScriptKind::LeakyBucket,
            Quota::Concurrency(_) => ScriptKind::Concurrency,
        }
    }

    fn body(self) -> &'static str {
        match self {
            ScriptKind::FixedWindow => include_str!("script/fixed_window.lua"),
            ScriptKind::SlidingLog => include_str!("script/sliding_log.lua"),
            ScriptKind::SlidingCounter => include_str!("script/sliding_counter.lua"),
            ScriptKind::TokenBucket => include_str!("script/token_bucket.lua"),
            ScriptKind::LeakyBucket => include_str!("script/leaky_bucket.lua"),
            ScriptKind::Multi => include_str!("script/multi.lua"),
            ScriptKind::Refund => include_str!("script/refund.lua"),
            ScriptKind::Concurrency => include_str!("script/concurrency.lua"),
            ScriptKind::Release => include_str!("script/release.lua"),
        }
    }

    /// The full source for `clock`: the clock prelude, the helper it needs, the body.
    pub(crate) fn source(self, clock: ClockSource) -> String {
        let prelude = match clock {
            ClockSource::Redis => REDIS_CLOCK,
            ClockSource::Local => LOCAL_CLOCK,
        };
        let body = self
            .body()
            .replace("--[[ceil_mul_div]]", CEIL_MUL_DIV.trim())
            .replace("--[[big_time]]", BIG_TIME.trim());
        format!("{prelude}{body}")
    }
}

/// One loaded script: its source and SHA1.
pub(crate) struct Script {
    pub(crate) source: String,
    pub(crate) sha: String,
}

/// Every script, for one clock.
pub(crate) struct Scripts {
    scripts: Vec<Script>,
}

impl Scripts {
    pub(crate) fn new(clock: ClockSource) -> Self {
        Scripts {
            scripts: ScriptKind::ALL
                .iter()
                .map(|kind| {
                    let source = kind.source(clock);
                    let sha = RedisScript::new(&source).get_hash().to_owned();
                    Script { source, sha }
                })
                .collect(),
        }
    }

    pub(crate) fn get(&self, kind: ScriptKind) -> &Script {
        // ALL lists the kinds in declaration order.
        &self.scripts[kind as usize]
    }
}

/// The algorithm codes of `multi.lua` and `refund.lua`.
fn code(quota: &Quota) -> i64 {
    match quota {
        Quota::FixedWindow(_) => 1,
        Quota::SlidingWindowLog(_) => 2,
        Quota::SlidingWindowCounter(_) => 3,
        Quota::TokenBucket(_) => 4,
        Quota::LeakyBucket(_) => 5,
        Quota::Concurrency(_) => 6,
    }
}

/// A calendar window's bounds as the scripts take them: the end of the period that contains
/// `now`, and the end of the next (for a Redis clock that has passed the first). The periods are
/// computed here, so the scripts need no time zone rules and the call stays one round trip.
fn calendar_ends(a: &tollgate::algorithm::FixedWindow, now: Timestamp) -> Option<(i64, i64)> {
    let calendar = a.calendar()?;
    let end = calendar.period(now.as_micros()).end;
    Some((int(end), int(calendar.period(end).end)))
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A permit's id as the scripts store it: 16 hex digits, a string (a Lua number is a double and
/// cannot hold a 64-bit id).
pub(crate) fn permit_id(permit: u64) -> String {
    format!("{permit:016x}")
}

/// The cost a concurrency check sends: its own, or one past the limit when it names no permit,
/// so that the script takes nothing for what the algorithm denies for good.
fn permit_cost(check: &Check<'_>, a: &tollgate::algorithm::Concurrency) -> u64 {
    if check.permit == 0 && check.cost > 0 {
        u64::from(a.limit()) + 1
    } else {
        u64::from(check.cost)
    }
}

/// The leaky bucket's depth and `max_delay` as the scripts take them, or an error for a bucket
/// deeper than their exact arithmetic reaches.
fn leaky_params(
    check: &Check<'_>,
    a: &tollgate::algorithm::LeakyBucket,
) -> Result<[i64; 3], StoreError> {
    let depth = u64::from(a.burst()).saturating_mul(a.interval_micros());
    if depth >= MAX_DEPTH {
        return Err(StoreError::Protocol {
            reason: format!(
                "policy {:?}: a leaky bucket deeper than 2^51 µs is beyond the Redis store's \
                 exact arithmetic",
                check.policy.name()
            ),
        });
    }
    // Any bound past the bucket's depth behaves like none.
    let max_delay = a.max_delay().map_or(NO_MAX_DELAY, |d| {
        int(u64::try_from(d.as_micros()).unwrap_or(u64::MAX)).min(NO_MAX_DELAY)
    });
    Ok([int(a.interval_micros()), int(depth), max_delay])
}

/// Checks a policy against the scripts' limits before any call (a too-deep leaky bucket).
pub(crate) fn validate(check: &Check<'_>) -> Result<(), StoreError> {
    match check.policy.quota() {
        Quota::LeakyBucket(a) => leaky_params(check, a).map(|_| ()),
        _ => Ok(()),
    }
}

/// Appends the one-check script's `ARGV` for `check`: admit its cost or, when `want` exceeds
/// it, take up to `want` units (a lease) logged `at` µs later (sliding window log). Every value
/// Redis parses costs (an argument, a Lua string, a `tonumber`): a plain check of cost 1 sends
/// two, as the least script for the decision would, and the leaky bucket gets its step (cost x
/// interval) ready-made.
pub(crate) fn one_check_args(
    cmd: &mut Cmd,
    now: Timestamp,
    check: &Check<'_>,
    want: u32,
    at: u64,
) -> Result<(), StoreError> {
    let cost = check.cost;
    let (p1, p2) = match check.policy.quota() {
        Quota::FixedWindow(a) if a.calendar().is_some() => {
            let (end, next) = calendar_ends(a, now).unwrap_or_default();
            let want = if want > cost { want } else { 0 };
            cmd.arg(-end).arg(a.limit()).arg(cost).arg(want).arg(next);
            return Ok(());
        }
        Quota::Concurrency(a) => {
            cmd.arg(int(a.lease_ttl_micros()))
                .arg(a.limit())
                .arg(permit_id(check.permit));
            let cost = permit_cost(check, a);
            if cost != 1 {
                cmd.arg(cost);
            }
            return Ok(());
        }
        Quota::FixedWindow(a) => (a.window_micros(), u64::from(a.limit())),
        Quota::SlidingWindowCounter(a) => (a.window_micros(), u64::from(a.limit())),
        Quota::SlidingWindowLog(a) => (a.window_micros(), u64::from(a.limit())),
        Quota::TokenBucket(a) => (
            a.interval_micros(),
            u64::from(a.capacity()) * a.interval_micros(),
        ),
        Quota::LeakyBucket(a) => {
            let [interval, depth, max_delay] = leaky_params(check, a)?;
            // A step past the depth is denied whatever its size: capped, it stays exact.
            let step = interval.saturating_mul(i64::from(cost)).min(NO_MAX_DELAY);
            cmd.arg(step).arg(depth);
            if max_delay < NO_MAX_DELAY {
                cmd.arg(max_delay);
            }
            return Ok(());
        }
    };
    cmd.arg(int(p1)).arg(int(p2));
    if cost != 1 || want > cost {
        cmd.arg(cost);
    }
    if want > cost {
        cmd.arg(want);
        if matches!(check.policy.quota(), Quota::SlidingWindowLog(_)) {
            cmd.arg(int(at));
        }
    }
    Ok(())
}

/// Appends `multi.lua`'s five values for `check`; `oldest` is how many of a sliding window
/// log's oldest units to report (enough for any retry time this request can have). A bucket's
/// fifth value is its step ([`bucket_step`]), not its cost.
pub(crate) fn multi_args(
    cmd: &mut Cmd,
    now: Timestamp,
    check: &Check<'_>,
    oldest: u64,
) -> Result<(), StoreError> {
    let quota = check.policy.quota();
    if let Quota::Concurrency(a) = quota {
        cmd.arg(code(quota))
            .arg(int(a.lease_ttl_micros()))
            .arg(a.limit())
            .arg(permit_id(check.permit))
            .arg(permit_cost(check, a));
        return Ok(());
    }
    let [p1, p2, p3] = match quota {
        Quota::FixedWindow(a) => match calendar_ends(a, now) {
            Some((end, next)) => [end, i64::from(a.limit()), next],
            None => [int(a.window_micros()), i64::from(a.limit()), 0],
        },
        Quota::SlidingWindowLog(a) => [int(a.window_micros()), i64::from(a.limit()), int(oldest)],
        Quota::SlidingWindowCounter(a) => [int(a.window_micros()), i64::from(a.limit()), 0],
        Quota::TokenBucket(a) => [
            int(a.interval_micros()),
            int(u64::from(a.capacity()) * a.interval_micros()),
            0,
        ],
        Quota::LeakyBucket(a) => leaky_params(check, a)?,
        Quota::Concurrency(_) => [0; 3],
    };
    cmd.arg(code(quota)).arg(p1).arg(p2).arg(p3);
    match bucket_step(quota, check.cost) {
        Some(step) => cmd.arg(step),
        None => cmd.arg(check.cost),
    };
    Ok(())
}

/// A bucket's step for `cost`: cost × interval µs, which a charge or a refund moves its time
/// by, multiplied exactly here (a Lua double is not past 2^53; a charge's cost can take it
/// there) and capped at [`MAX_TIME`], past which the algorithms cap the time anyway. `None`
/// for the other algorithms.
fn bucket_step(quota: &Quota, cost: u32) -> Option<u64> {
    let interval = match quota {
        Quota::TokenBucket(a) => a.interval_micros(),
        Quota::LeakyBucket(a) => a.interval_micros(),
        _ => return None,
    };
    Some(u64::from(cost).saturating_mul(interval).min(MAX_TIME))
}

/// Appends `multi.lua`'s lockout records, one per check whose policy bans, in order: the
/// check's index (from 1), `after`, `within` and `for` in µs, and the key as the caller names it
/// (kept in the record, for listing bans).
pub(crate) fn ban_args(cmd: &mut Cmd, checks: &[&Check<'_>]) {
    for (i, check) in checks.iter().enumerate() {
        if let Some(ban) = check.policy.ban() {
            cmd.arg(i + 1)
                .arg(ban.after())
                .arg(int(ban.within_micros()))
                .arg(int(ban.duration_micros()))
                .arg(check.key);
        }
    }
}

/// The clock prelude of the scripts for `clock`, for a script outside [`ScriptKind`].
pub(crate) fn clock_prelude(clock: ClockSource) -> &'static str {
    match clock {
        ClockSource::Redis => REDIS_CLOCK,
        ClockSource::Local => LOCAL_CLOCK,
    }
}

/// Appends `refund.lua`'s five values: give back `cost` of `check`'s quota, only where `guard`
/// says the units were taken (0: anywhere, as a plain refund does); a concurrency check's
/// permit. A bucket's third value is its step ([`bucket_step`]), not its cost.
pub(crate) fn refund_args(cmd: &mut Cmd, now: Timestamp, check: &Check<'_>, cost: u32, guard: u64) {
    let quota = check.policy.quota();
    let p1 = match quota {
        Quota::FixedWindow(a) => match calendar_ends(a, now) {
            Some((end, _)) => {
                cmd.arg(code(quota))
                    .arg(-end)
                    .arg(cost)
                    .arg(int(guard))
                    .arg(0);
                return;
            }
            None => a.window_micros(),
        },
        Quota::SlidingWindowLog(a) => a.window_micros(),
        Quota::SlidingWindowCounter(a) => a.window_micros(),
        Quota::TokenBucket(a) => a.interval_micros(),
        Quota::LeakyBucket(a) => a.interval_micros(),
        Quota::Concurrency(a) => a.lease_ttl_micros(),
    };
    cmd.arg(code(quota)).arg(int(p1));
    match bucket_step(quota, cost) {
        Some(step) => cmd.arg(step),
        None => cmd.arg(cost),
    };
    cmd.arg(int(guard));
    match quota {
        Quota::Concurrency(_) => cmd.arg(permit_id(check.permit)),
        _ => cmd.arg(0),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_index_their_scripts() {
        let scripts = Scripts::new(ClockSource::Redis);
        for kind in ScriptKind::ALL {
            let source = &scripts.get(kind).source;
            assert!(source.starts_with(REDIS_CLOCK) && !source.contains("--[["));
        }
        let local = Scripts::new(ClockSource::Local);
        assert_ne!(
            local.get(ScriptKind::Multi).sha,
            scripts.get(ScriptKind::Multi).sha
        );
    }
}
