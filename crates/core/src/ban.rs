//! Lockouts: a policy's opt-in rule that a key denied too often is refused for a while, whatever
//! its quota says. A login endpoint limited to 10 tries a minute still lets a patient attacker
//! try 14,400 passwords a day; with `ban = { after = 5, within = "10m", for = "1h" }` the fifth
//! denial within ten minutes locks the key out for an hour.
//!
//! [`Ban`] is the rule and [`BanState`] one key's record under it; the rule's methods are the
//! whole state machine, with no I/O and time passed in, as the algorithms are. Stores keep a
//! record per (policy name, key) beside the quota's state and apply the machine in the same
//! atomic step as the check: the memory store under the key's shard lock, the Redis store inside
//! the check's one script. The record is keyed by the policy's *name*, not its quota, so a ban
//! outlives a reload that changes the numbers, and a key's override is banned with it.
//!
//! # Semantics
//!
//! - A *denial* is a check of cost above zero that the policy's own quota refuses (a denial by
//!   another policy of the same request does not count, nor does a peek).
//! - Denials are counted in a streak that starts with the first one and lasts `within`; the
//!   `after`-th denial of a streak starts a ban of `for` from that instant, and the check that
//!   caused it is answered as banned.
//! - While banned, every check of the key by the policy is refused without touching the quota:
//!   a banned request is not counted against the window and does not extend the ban. It is
//!   counted in the record's [`denials`](BanState::denials), so operators see the pressure.
//! - The first denial after the ban ends (or after the streak's `within` passed) starts a new
//!   streak. Lifting a ban forgets the record: the key starts afresh, its quota as it stands.

use std::fmt;
use std::time::Duration;

use crate::clock::duration_micros;
use crate::quota::format_duration;
use crate::{Decision, QuotaError, Timestamp, Verdict};

/// A lockout rule: `after` denials within `within` refuse the key for `duration`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ban {
    after: u32,
    within_micros: u64,
    duration_micros: u64,
}

/// Whether a decision was a ban.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BanStatus {
    /// Not a ban (admitted, or denied by the quota alone).
    #[default]
    None,
    /// Refused because the key was already banned.
    Active,
    /// Denied by the quota, and this denial started a ban.
    Started,
}

impl BanStatus {
    /// Whether the request was refused by a ban (one in force, or one it started).
    pub fn is_ban(self) -> bool {
        self != BanStatus::None
    }
}

/// One key's lockout record under one policy, in microseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BanState {
    /// When the current streak of denials began (0: none yet).
    pub streak_start: u64,
    /// Denials counted in the streak, and refusals while banned.
    pub denials: u32,
    /// When the ban began (0: never banned in this record).
    pub since: u64,
    /// When the ban ends (0: not banned); banned while `now < until`.
    pub until: u64,
}

impl Ban {
    /// A rule refusing a key for `duration` once it was denied `after` times within `within`.
    /// `after` is at least 1; `within` and `duration` are above zero and at most 400 days.
    pub fn new(after: u32, within: Duration, duration: Duration) -> Result<Self, QuotaError> {
        let input = format!(
            "ban after {after} within {} for {}",
            format_duration(within),
            format_duration(duration)
        );
        if after == 0 {
            return Err(QuotaError::new(
                &input,
                "after must be at least 1 (the denials that start a ban)",
            ));
        }
        for (what, d) in [("within", within), ("for", duration)] {
            if duration_micros(d) == 0 || d > crate::MAX_PERIOD {
                return Err(QuotaError::new(
                    &input,
                    &format!("{what} must be above zero and at most 400 days"),
                ));
            }
        }
        Ok(Ban {
            after,
            within_micros: duration_micros(within),
            duration_micros: duration_micros(duration),
        })
    }

    /// The denials within [`within`](Self::within) that start a ban.
    pub fn after(&self) -> u32 {
        self.after
    }

    /// How long a streak of denials lasts.
    pub fn within(&self) -> Duration {
        Duration::from_micros(self.within_micros)
    }

    /// How long a ban lasts (`for` in the configuration).
    pub fn duration(&self) -> Duration {
        Duration::from_micros(self.duration_micros)
    }

    /// [`within`](Self::within) in microseconds.
    pub fn within_micros(&self) -> u64 {
        self.within_micros
    }

    /// [`duration`](Self::duration) in microseconds.
    pub fn duration_micros(&self) -> u64 {
        self.duration_micros
    }

    /// Whether `state` bans the key at `now` (µs).
    #[inline]
    pub fn is_banned(&self, state: &BanState, now: u64) -> bool {
        now < state.until
    }

    /// A check refused because the key is banned: counted, nothing else changes.
    pub fn refuse(&self, state: &mut BanState) {
        state.denials = state.denials.saturating_add(1);
    }

    /// A denial by the quota at `now` (µs), the key not banned: counted in the streak (a new
    /// one when there is none, the last one is over, or a ban ended since it began). Whether it
    /// starts a ban.
    pub fn deny(&self, state: &mut BanState, now: u64) -> bool {
        let streak_over = now >= state.streak_start.saturating_add(self.within_micros);
        let ban_over = state.until != 0 && state.until <= now;
        if state.denials == 0 || streak_over || ban_over {
            *state = BanState {
                streak_start: now,
                ..BanState::default()
            };
        }
        state.denials = state.denials.saturating_add(1);
        if state.denials >= self.after {
            state.since = now;
            state.until = now.saturating_add(self.duration_micros);
            return true;
        }
        false
    }

    /// When `state` means nothing any more (µs): its streak is over and its ban ended. A store
    /// may forget it then.
    pub fn expires_at(&self, state: &BanState) -> u64 {
        state
            .streak_start
            .saturating_add(self.within_micros)
            .max(state.until)
    }

    /// The decision of policy `name` (with quota limit `limit`) for a key banned until `until`,
    /// at `now`: refused, nothing remaining, retry when the ban ends.
    pub fn banned_decision(name: &'static str, limit: u64, now: u64, until: u64) -> Decision {
        let left = until.saturating_sub(now);
        let mut decision = Verdict {
            allowed: false,
            limit,
            remaining: 0,
            reset_micros: left,
            retry_after_micros: Some(left),
            delay_micros: 0,
        }
        .into_decision(name);
        decision.ban = BanStatus::Active;
        decision
    }

    /// `decision`, a quota's denial, turned into the one that started a ban lasting until
    /// `until`.
    pub fn started(mut decision: Decision, now: u64, until: u64) -> Decision {
        let left = Duration::from_micros(until.saturating_sub(now));
        decision.allowed = false;
        decision.remaining = 0;
        decision.reset = decision.reset.max(left);
        decision.retry_after = Some(left);
        decision.ban = BanStatus::Started;
        decision
    }
}

impl fmt::Display for Ban {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ban for {} after {} denials within {}",
            format_duration(self.duration()),
            self.after,
            format_duration(self.within())
        )
    }
}

/// A ban in force, as a store lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BanRecord {
    /// The policy's name.
    pub policy: String,
    /// The key, as the store was given it.
    pub key: Vec<u8>,
    /// When the ban began.
    pub since: Timestamp,
    /// When it ends.
    pub until: Timestamp,
    /// Denials in the streak that started it, and refusals since.
    pub denials: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(after: u32, within: u64, duration: u64) -> Ban {
        Ban::new(
            after,
            Duration::from_secs(within),
            Duration::from_secs(duration),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    const S: u64 = 1_000_000;

    #[test]
    fn the_after_th_denial_within_the_streak_bans() {
        let ban = rule(3, 10, 60);
        let mut s = BanState::default();
        assert!(!ban.deny(&mut s, 100 * S));
        assert!(!ban.deny(&mut s, 105 * S));
        assert!(ban.deny(&mut s, 109 * S));
        assert!(ban.is_banned(&s, 109 * S));
        assert!(ban.is_banned(&s, 169 * S - 1));
        assert!(!ban.is_banned(&s, 169 * S));
        assert_eq!((s.since, s.until), (109 * S, 169 * S));
    }

    #[test]
    fn a_streak_past_within_starts_over() {
        let ban = rule(2, 10, 60);
        let mut s = BanState::default();
        assert!(!ban.deny(&mut s, 100 * S));
        assert!(
            !ban.deny(&mut s, 110 * S),
            "the first streak ended at 110 s"
        );
        assert!(ban.deny(&mut s, 111 * S));
    }

    #[test]
    fn refusals_while_banned_count_but_change_nothing_else() {
        let ban = rule(1, 10, 60);
        let mut s = BanState::default();
        assert!(ban.deny(&mut s, 100 * S));
        let before = s;
        ban.refuse(&mut s);
        assert_eq!(s.denials, before.denials + 1);
        assert_eq!(s.until, before.until);
    }

    #[test]
    fn after_a_ban_ends_a_new_streak_begins() {
        let ban = rule(2, 1000, 60);
        let mut s = BanState::default();
        ban.deny(&mut s, 100 * S);
        assert!(ban.deny(&mut s, 101 * S));
        assert!(!ban.deny(&mut s, 161 * S), "a fresh streak of one");
        assert!(ban.deny(&mut s, 162 * S));
        assert_eq!(
            ban.expires_at(&s),
            (161 + 1000) * S,
            "the streak began at 161 s"
        );
    }

    #[test]
    fn bad_rules_are_refused() {
        assert!(Ban::new(0, Duration::from_secs(1), Duration::from_secs(1)).is_err());
        assert!(Ban::new(1, Duration::ZERO, Duration::from_secs(1)).is_err());
        assert!(Ban::new(1, Duration::from_secs(1), Duration::ZERO).is_err());
        assert!(Ban::new(1, Duration::from_secs(1), Duration::from_secs(401 * 86_400)).is_err());
    }
}
