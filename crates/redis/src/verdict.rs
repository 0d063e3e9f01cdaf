//! Verdicts from the scripts' replies: each script reports the key's state as it found it, and
//! the pure algorithms of `tollgate::algorithm` turn it into the verdict, so the Redis store
//! decides exactly as the memory store does by construction. A script whose admission disagrees
//! with the algorithm's is a protocol error.

use std::collections::VecDeque;

use redis::Value;
use tollgate::algorithm::{
    Algorithm, FixedWindowState, LeakyBucketState, Occupancy, SlidingWindowCounterState,
    SlidingWindowLogState, TokenBucketState,
};
use tollgate::{Check, Quota, StoreError, Timestamp, Verdict};

/// One key's state, of any algorithm.
#[derive(Clone, Debug)]
pub(crate) enum State {
    Fixed(FixedWindowState),
    Log(SlidingWindowLogState),
    Counter(SlidingWindowCounterState),
    Token(TokenBucketState),
    Leaky(LeakyBucketState),
    /// A concurrency key as one check's permit sees it: reported per check, since what a
    /// permit sees depends on which it is (and `multi.lua` counts the permits the request's
    /// earlier checks took).
    Permits(Occupancy),
}

impl State {
    fn evaluate(
        &mut self,
        quota: &Quota,
        now: Timestamp,
        cost: u32,
        permit: u64,
    ) -> Result<Verdict, StoreError> {
        Ok(match (quota, self) {
            (Quota::Concurrency(a), State::Permits(o)) => a.decide(*o, now, cost, permit),
            (Quota::FixedWindow(a), State::Fixed(s)) => a.evaluate(s, now, cost),
            (Quota::SlidingWindowLog(a), State::Log(s)) => a.evaluate(s, now, cost),
            (Quota::SlidingWindowCounter(a), State::Counter(s)) => a.evaluate(s, now, cost),
            (Quota::TokenBucket(a), State::Token(s)) => a.evaluate(s, now, cost),
            (Quota::LeakyBucket(a), State::Leaky(s)) => a.evaluate(s, now, cost),
            _ => return Err(protocol("two algorithms on one key")),
        })
    }

    fn charge(&mut self, quota: &Quota, now: Timestamp, cost: u32) {
        match (quota, self) {
            (Quota::FixedWindow(a), State::Fixed(s)) => a.charge(s, now, cost),
            (Quota::SlidingWindowLog(a), State::Log(s)) => a.charge(s, now, cost),
            (Quota::SlidingWindowCounter(a), State::Counter(s)) => a.charge(s, now, cost),
            (Quota::TokenBucket(a), State::Token(s)) => a.charge(s, now, cost),
            (Quota::LeakyBucket(a), State::Leaky(s)) => a.charge(s, now, cost),
            // A charge takes no permit.
            _ => {}
        }
    }

    fn commit(&mut self, quota: &Quota, now: Timestamp, cost: u32) {
        match (quota, self) {
            (Quota::FixedWindow(a), State::Fixed(s)) => a.commit(s, now, cost),
            (Quota::SlidingWindowLog(a), State::Log(s)) => a.commit(s, now, cost),
            (Quota::SlidingWindowCounter(a), State::Counter(s)) => a.commit(s, now, cost),
            (Quota::TokenBucket(a), State::Token(s)) => a.commit(s, now, cost),
            (Quota::LeakyBucket(a), State::Leaky(s)) => a.commit(s, now, cost),
            // The script reports each check's occupancy with the earlier checks' permits.
            _ => {}
        }
    }
}

/// What a one-check script did: the verdict for the check's cost, and what it took.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Grant {
    /// Units written: 0 when denied (or a peek), the cost, or up to the lease asked for.
    pub(crate) granted: u32,
    /// The verdict for the check's own cost, as the pure algorithm gives it.
    pub(crate) verdict: Verdict,
    /// The verdict for taking all `granted` units (a lease: its `remaining` and `reset`).
    pub(crate) after_grant: Verdict,
    /// Leases only (0 otherwise): the script's clock, µs.
    pub(crate) now: u64,
    /// Leases only: how long after `now` the window the units count in ends (fixed window,
    /// sliding window counter; 0 for the others).
    pub(crate) window_left: u64,
}

/// The integers of a script's reply: integers, or decimal strings for the values past 2^53
/// that a Lua number cannot hold exactly (a bucket's time after a charge far past the limit).
pub(crate) fn integers(reply: Value) -> Result<Vec<i64>, StoreError> {
    let Value::Array(items) = reply else {
        return Err(protocol(&format!(
            "expected an array from the script, got {reply:?}"
        )));
    };
    items
        .into_iter()
        .map(|item| match item {
            Value::Int(i) => Ok(i),
            Value::BulkString(ref digits) => std::str::from_utf8(digits)
                .ok()
                .and_then(|d| d.parse().ok())
                .ok_or_else(|| {
                    protocol(&format!(
                        "expected an integer in the script's reply, got {item:?}"
                    ))
                }),
            other => Err(protocol(&format!(
                "expected an integer in the script's reply, got {other:?}"
            ))),
        })
        .collect()
}

fn at(ints: &[i64], i: usize) -> Result<i64, StoreError> {
    ints.get(i)
        .copied()
        .ok_or_else(|| protocol(&format!("the script replied {} integers", ints.len())))
}

fn unsigned(v: i64) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| protocol(&format!("negative value {v} from the script")))
}

fn small<T: TryInto<u32> + Copy + std::fmt::Display>(v: T) -> Result<u32, StoreError> {
    v.try_into()
        .map_err(|_| protocol(&format!("count {v} out of range")))
}

/// The one-check scripts report times relative to their clock; the pure algorithms run on an
/// instant this far from the epoch instead (decisions carry only durations).
const BASE: u64 = 1 << 50;

/// A fixed window's or sliding window counter's instant and window end for a window ending
/// `left` µs from now: the end on the window grid, as the algorithms normalise it.
fn on_grid(window: u64, left: u64) -> (u64, u64) {
    let end = (BASE / window + left / window + 2) * window;
    (end - left, end)
}

/// A sliding window log with `total` units, the newest at `newest`, whose oldest units (in
/// order) are `oldest`: what the pure algorithm needs of a log to decide, without the log.
fn log_state(total: u64, newest: u64, oldest: &[(u64, u64)]) -> SlidingWindowLogState {
    let mut entries: VecDeque<(u64, u32)> = VecDeque::with_capacity(oldest.len() + 1);
    let mut listed = 0;
    for &(t, units) in oldest {
        let units = units.min(total - listed);
        if units == 0 {
            break;
        }
        match entries.back_mut() {
            Some((last, c)) if *last == t => *c = c.saturating_add(small_sat(units)),
            _ => entries.push_back((t, small_sat(units))),
        }
        listed += units;
    }
    if total > listed {
        entries.push_back((newest, small_sat(total - listed)));
    }
    SlidingWindowLogState { entries, total }
}

fn small_sat(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// The array a one-check script's one-integer reply stands for, written into `out`; how many
/// integers it is. The integer is `r` when the script admitted, `-1 - r` when it denied. A
/// fixed window packs `window_end - now` and the count as `left x (limit + 1) + count`. A
/// sliding window counter that admitted a cost of 1 or more packs `left x (limit + 1) + used`,
/// where `used` is the current count plus the previous one's weight: it stands for the state
/// (`current = used`, `previous = 0`), which the algorithm admits with the same `remaining`
/// and `reset` as the state the script read (the verdict test in this module checks it);
/// otherwise `(left x (limit + 1) + current) x (limit + 1) + previous`. A sliding window log
/// replies one integer only for an admitted cost of 1 or more: the units in the window, all
/// the algorithm's verdict of an admission needs.
fn unpack(check: &Check<'_>, packed: i64, out: &mut [i64; 4]) -> Result<usize, StoreError> {
    let admitted = packed >= 0;
    let r = if admitted { packed } else { -1 - packed };
    let granted = if admitted { i64::from(check.cost) } else { 0 };
    let ints: &[i64] = match check.policy.quota() {
        Quota::FixedWindow(a) => {
            let radix = i64::from(a.limit()) + 1;
            &[granted, r / radix, r % radix]
        }
        Quota::SlidingWindowCounter(a) if admitted && check.cost > 0 => {
            let radix = i64::from(a.limit()) + 1;
            &[granted, r / radix, r % radix, 0]
        }
        Quota::SlidingWindowCounter(a) => {
            let radix = i64::from(a.limit()) + 1;
            let (rest, previous) = (r / radix, r % radix);
            &[granted, rest / radix, rest % radix, previous]
        }
        Quota::SlidingWindowLog(_) if admitted && check.cost > 0 => &[granted, r, 0],
        Quota::TokenBucket(_) => &[granted, r],
        // The leaky bucket's array says admitted (1) or not.
        Quota::LeakyBucket(_) => &[i64::from(admitted), r],
        other => {
            return Err(protocol(&format!(
                "the {} script replied one integer, {packed}",
                other.kind()
            )));
        }
    };
    out[..ints.len()].copy_from_slice(ints);
    Ok(ints.len())
}

/// The verdict of a one-check script's reply (see the scripts' headers for the layouts).
pub(crate) fn one_check(check: &Check<'_>, reply: Value) -> Result<Grant, StoreError> {
    if let Quota::Concurrency(alg) = check.policy.quota() {
        return permits::one_check(check, alg, reply);
    }
    let mut unpacked = [0; 4];
    let array;
    let ints: &[i64] = match reply {
        Value::Int(packed) => {
            let n = unpack(check, packed, &mut unpacked)?;
            &unpacked[..n]
        }
        other => {
            array = integers(other)?;
            &array
        }
    };
    let quota = check.policy.quota();
    let granted = small(at(ints, 0)?)?;
    let mut window_left = 0;
    // The extra integer a lease's reply ends with: the script's clock.
    let mut lease_now = None;
    let (now, state) = match quota {
        Quota::FixedWindow(a) => {
            window_left = unsigned(at(ints, 1)?)?;
            let (now, window_end) = on_grid(a.window_micros(), window_left);
            lease_now = ints.get(3);
            let count = small(at(ints, 2)?)?;
            (now, State::Fixed(FixedWindowState { window_end, count }))
        }
        Quota::SlidingWindowCounter(a) => {
            window_left = unsigned(at(ints, 1)?)?;
            let (now, window_end) = on_grid(a.window_micros(), window_left);
            lease_now = ints.get(4);
            let state = SlidingWindowCounterState {
                window_end,
                current: small(at(ints, 2)?)?,
                previous: small(at(ints, 3)?)?,
            };
            (now, State::Counter(state))
        }
        Quota::SlidingWindowLog(_) => {
            let total = unsigned(at(ints, 1)?)?;
            let newest = BASE.saturating_add_signed(at(ints, 2)?);
            // After a denial: the unit whose expiry makes room (and every older one).
            let mut oldest = Vec::new();
            match ints.get(3) {
                Some(&extra) if granted == 0 => {
                    let cost = u64::from(check.cost);
                    let free = (total + cost).saturating_sub(u64::from(quota.limit()));
                    oldest.push((BASE.saturating_add_signed(extra), free));
                }
                other => lease_now = other,
            }
            (BASE, State::Log(log_state(total, newest, &oldest)))
        }
        Quota::TokenBucket(_) => {
            let tat = BASE + unsigned(at(ints, 1)?)?;
            (BASE, State::Token(TokenBucketState { tat }))
        }
        Quota::LeakyBucket(_) => {
            let next_free = BASE + unsigned(at(ints, 1)?)?;
            (BASE, State::Leaky(LeakyBucketState { next_free }))
        }
        Quota::Concurrency(_) => return Err(protocol("a concurrency reply read as a rate's")),
    };
    pruned(quota, &state, now)?;
    let time = Timestamp::from_micros(now);
    let verdict = state
        .clone()
        .evaluate(quota, time, check.cost, check.permit)?;
    let leaky = matches!(quota, Quota::LeakyBucket(_));
    let admitted = if leaky {
        granted == 1
    } else {
        granted >= check.cost && (check.cost > 0 || verdict.allowed)
    };
    if admitted != verdict.allowed {
        return Err(protocol(&format!(
            "the {} script and the algorithm disagree (granted {granted} for cost {})",
            quota.kind(),
            check.cost
        )));
    }
    let after_grant = if granted > check.cost && !leaky {
        state.clone().evaluate(quota, time, granted, check.permit)?
    } else {
        verdict
    };
    Ok(Grant {
        granted: if leaky {
            check.cost * u32::from(verdict.allowed)
        } else {
            granted
        },
        verdict,
        after_grant,
        now: lease_now.copied().map_or(Ok(0), unsigned)?,
        window_left,
    })
}

/// The verdicts of `multi.lua`'s reply: the checks replayed on the reported states as the
/// memory store applies a batch (tentative commits while every check admits; when one denies,
/// or in a dry run, the admitting ones report their quota as it stands).
pub(crate) fn multi(
    checks: &[&Check<'_>],
    keys: &[&str],
    reply: Value,
    commit: bool,
) -> Result<Vec<Decided>, StoreError> {
    let ints = integers(reply)?;
    let now = Timestamp::from_micros(unsigned(at(&ints, 0)?)?);
    let script_admitted = at(&ints, 1)? == 1;
    let mut pos = 2;
    // One state per distinct key, from its first check's report; and each check's own, which
    // concurrency checks decide on.
    let mut initial: Vec<(&str, State)> = Vec::with_capacity(checks.len());
    let mut reported: Vec<State> = Vec::with_capacity(checks.len());
    for (check, &key) in checks.iter().zip(keys) {
        let state = read_state(check.policy.quota(), &ints, &mut pos)?;
        pruned(check.policy.quota(), &state, now.as_micros())?;
        if !initial.iter().any(|(k, _)| *k == key) {
            initial.push((key, state.clone()));
        }
        reported.push(state);
    }
    let records = bans::read(checks, &ints, &mut pos)?;
    if pos != ints.len() {
        return Err(protocol(
            "the multi-check script replied more than its states",
        ));
    }
    let index = |key: &str| initial.iter().position(|(k, _)| *k == key).unwrap_or(0);
    let mut states: Vec<State> = initial.iter().map(|(_, s)| s.clone()).collect();
    let mut verdicts = Vec::with_capacity(checks.len());
    let mut all = true;
    for (i, ((check, &key), own)) in checks.iter().zip(keys).zip(reported.iter_mut()).enumerate() {
        let quota = check.policy.quota();
        if bans::banned(&records, i, now.as_micros()) {
            // Refused by its ban, its quota not asked.
            verdicts.push(Verdict::denied_for_good(u64::from(quota.limit())));
            all = false;
            continue;
        }
        let state = match own {
            State::Permits(_) => own,
            _ => &mut states[index(key)],
        };
        let verdict = state.evaluate(quota, now, check.cost, check.permit)?;
        if all && verdict.allowed && check.cost > 0 {
            state.commit(quota, now, check.cost);
        }
        all &= verdict.allowed;
        verdicts.push(verdict);
    }
    if all != script_admitted {
        return Err(protocol(
            "the multi-check script and the algorithms disagree",
        ));
    }
    if !all || !commit {
        // Nothing was written: report each admitting check's quota as it stands.
        for ((check, &key), verdict) in checks.iter().zip(keys).zip(verdicts.iter_mut()) {
            if verdict.allowed {
                // A concurrency key's first check sees all its permits as they stood.
                let mut state = initial[index(key)].1.clone();
                *verdict = state.evaluate(check.policy.quota(), now, 0, 0)?;
            }
        }
    }
    let marks = bans::settle(checks, &verdicts, &records, now.as_micros())?;
    Ok(verdicts.into_iter().zip(marks).collect())
}

/// The verdicts of a charge by `multi.lua` (force mode, every cost written): each check's
/// state as the script found it, charged by the pure algorithms, then what is left, as a peek
/// reports it.
pub(crate) fn charged(
    checks: &[&Check<'_>],
    keys: &[&str],
    reply: Value,
) -> Result<Vec<Verdict>, StoreError> {
    let ints = integers(reply)?;
    let now = Timestamp::from_micros(unsigned(at(&ints, 0)?)?);
    let mut pos = 2;
    let mut states: Vec<(&str, State)> = Vec::with_capacity(checks.len());
    let mut reported: Vec<State> = Vec::with_capacity(checks.len());
    for (check, &key) in checks.iter().zip(keys) {
        let state = read_state(check.policy.quota(), &ints, &mut pos)?;
        pruned(check.policy.quota(), &state, now.as_micros())?;
        if !states.iter().any(|(k, _)| *k == key) {
            states.push((key, state.clone()));
        }
        reported.push(state);
    }
    if pos != ints.len() {
        return Err(protocol("the charge replied more than its states"));
    }
    let mut verdicts = Vec::with_capacity(checks.len());
    for ((check, &key), own) in checks.iter().zip(keys).zip(reported.iter_mut()) {
        let quota = check.policy.quota();
        let state = match own {
            State::Permits(_) => own,
            _ => match states.iter_mut().find(|(k, _)| *k == key) {
                Some((_, state)) => state,
                None => return Err(protocol("a charged key without a state")),
            },
        };
        state.charge(quota, now, check.cost);
        verdicts.push(Verdict::charged(state.evaluate(quota, now, 0, 0)?));
    }
    Ok(verdicts)
}

/// A log the script reports must hold no unit that has left the window (the script prunes
/// first): one that does would count twice against the pure algorithm's own pruning. Likewise
/// a concurrency key's permits must all be live.
fn pruned(quota: &Quota, state: &State, now: u64) -> Result<(), StoreError> {
    if let State::Permits(o) = state
        && ((o.own != 0 && o.own <= now) || (o.others > 0 && o.others_earliest <= now))
    {
        return Err(protocol(
            "the concurrency script reported an expired permit",
        ));
    }
    if let (Quota::SlidingWindowLog(a), State::Log(s)) = (quota, state)
        && s.entries
            .front()
            .is_some_and(|&(t, _)| t + a.window_micros() <= now)
    {
        return Err(protocol("the log script reported units outside the window"));
    }
    Ok(())
}

fn read_state(quota: &Quota, ints: &[i64], pos: &mut usize) -> Result<State, StoreError> {
    let mut next = || {
        let v = at(ints, *pos).and_then(unsigned);
        *pos += 1;
        v
    };
    Ok(match quota {
        Quota::FixedWindow(_) => State::Fixed(FixedWindowState {
            window_end: next()?,
            count: small(next()?)?,
        }),
        Quota::SlidingWindowCounter(_) => State::Counter(SlidingWindowCounterState {
            window_end: next()?,
            current: small(next()?)?,
            previous: small(next()?)?,
        }),
        Quota::TokenBucket(_) => State::Token(TokenBucketState { tat: next()? }),
        Quota::LeakyBucket(_) => State::Leaky(LeakyBucketState { next_free: next()? }),
        Quota::Concurrency(_) => State::Permits(Occupancy {
            others: next()?,
            own: next()?,
            others_earliest: next()?,
        }),
        Quota::SlidingWindowLog(_) => {
            let (total, newest, listed) = (next()?, next()?, next()?);
            if listed > total {
                return Err(protocol("the log lists more units than it holds"));
            }
            let mut oldest = Vec::with_capacity(usize::try_from(listed).unwrap_or(0));
            for _ in 0..listed {
                oldest.push((next()?, 1));
            }
            State::Log(log_state(total, newest, &oldest))
        }
    })
}

pub(crate) fn protocol(reason: &str) -> StoreError {
    StoreError::Protocol {
        reason: reason.to_owned(),
    }
}

pub(crate) mod bans;
mod permits;
#[cfg(test)]
mod tests;

/// A check's verdict, and whether its lockout record refused it or started a ban.
pub(crate) type Decided = (Verdict, Option<bans::BanMark>);
