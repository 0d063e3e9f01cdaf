//! Lockouts in `multi.lua`'s reply: each record's state as the script found it and what the
//! script did with it, replayed with the core's state machine ([`Ban`]) on the checks' verdicts;
//! a script that disagrees is a protocol error, as for the algorithms.

use tollgate::{Ban, BanState, Check, Decision, StoreError, Verdict};

use super::{at, protocol, unsigned};

/// What a check's lockout record did, with the script's clock and the ban's end (µs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BanMark {
    /// The key was banned: refused without its quota being asked.
    Active { now: u64, until: u64 },
    /// The check's denial started a ban.
    Started { now: u64, until: u64 },
}

/// One record as the script reported it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Record {
    state: BanState,
    /// 0 nothing, 1 refused while banned, 2 a denial counted, 3 a ban started.
    code: i64,
}

/// The records after the checks' states, one per check whose policy bans, by check.
pub(crate) fn read(
    checks: &[&Check<'_>],
    ints: &[i64],
    pos: &mut usize,
) -> Result<Vec<Option<Record>>, StoreError> {
    let mut out = Vec::with_capacity(checks.len());
    for check in checks {
        if check.policy.ban().is_none() {
            out.push(None);
            continue;
        }
        let mut next = || {
            let v = at(ints, *pos);
            *pos += 1;
            v
        };
        let state = BanState {
            streak_start: unsigned(next()?)?,
            denials: u32::try_from(next()?)
                .map_err(|_| protocol("a ban's denials out of range"))?,
            since: unsigned(next()?)?,
            until: unsigned(next()?)?,
        };
        out.push(Some(Record {
            state,
            code: next()?,
        }));
    }
    Ok(out)
}

/// Whether check `i` was banned at `now` (µs) before anything was decided.
pub(crate) fn banned(records: &[Option<Record>], i: usize, now: u64) -> bool {
    records
        .get(i)
        .and_then(Option::as_ref)
        .is_some_and(|r| now < r.state.until)
}

/// What each check's record did, checked against what the script says it did.
pub(crate) fn settle(
    checks: &[&Check<'_>],
    verdicts: &[Verdict],
    records: &[Option<Record>],
    now: u64,
) -> Result<Vec<Option<BanMark>>, StoreError> {
    let mut marks = Vec::with_capacity(checks.len());
    for ((check, verdict), record) in checks.iter().zip(verdicts).zip(records) {
        let (Some(rule), Some(record)) = (check.policy.ban(), record) else {
            marks.push(None);
            continue;
        };
        let mut state = record.state;
        let (code, mark) = if rule.is_banned(&state, now) {
            (
                1,
                Some(BanMark::Active {
                    now,
                    until: state.until,
                }),
            )
        } else if !verdict.allowed && check.cost > 0 {
            if rule.deny(&mut state, now) {
                (
                    3,
                    Some(BanMark::Started {
                        now,
                        until: state.until,
                    }),
                )
            } else {
                (2, None)
            }
        } else {
            (0, None)
        };
        if code != record.code {
            return Err(protocol(&format!(
                "the multi-check script and the ban of policy {:?} disagree ({} for {code})",
                check.policy.name(),
                record.code
            )));
        }
        marks.push(mark);
    }
    Ok(marks)
}

/// The decision of `check` from its verdict and what its lockout record did.
pub(crate) fn decision(check: &Check<'_>, verdict: Verdict, mark: Option<BanMark>) -> Decision {
    let name = check.policy.shared_name();
    match mark {
        None => verdict.into_decision(name),
        Some(BanMark::Active { now, until }) => {
            Ban::banned_decision(name, u64::from(check.policy.quota().limit()), now, until)
        }
        Some(BanMark::Started { now, until }) => {
            Ban::started(verdict.into_decision(name), now, until)
        }
    }
}
