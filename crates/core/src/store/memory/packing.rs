//! How the counter and bucket states fit the memory store: in one 64-bit word (the table's
//! atomic state, updated by compare-and-swap), or, for the rare state that does not fit, in a
//! 16-byte [`Slot`] kept beside the table.
//!
//! - Token and leaky bucket: the one timestamp, as is.
//! - Fixed window: the window's index since 2024 (32 bits) and the count (32 bits). A calendar
//!   window (a day, a month… in a time zone) has no one length: its index counts seconds, so
//!   its end (a whole second) fits until 2160.
//! - Sliding window counter: the window's index since 2024 (32 bits) and both counts (16 bits
//!   each).
//!
//! A window index counts windows, not microseconds, so 32 bits last 136 years for one-second
//! windows. What does not fit spills to a [`Slot`]: windows shorter than about 100 ms (whose
//! index outgrows 32 bits), times before 2024, and sliding-window counts over 65,535.

use crate::algorithm::{
    Algorithm, Divisor, FixedWindow, FixedWindowState, LeakyBucket, LeakyBucketState,
    SlidingWindowCounter, SlidingWindowCounterState, TokenBucket, TokenBucketState,
};

/// The word that marks a state kept in a [`Slot`]. No packed state is all ones: bucket times
/// would be in the year 586,000 and window indexes stop below `u32::MAX`.
pub(super) const SPILLED: u64 = u64::MAX;

/// The word of a slot that holds no state yet: an empty slot's, and a new key's between the
/// moment a thread claims its slot and its first compare-and-swap. It reads as a new key's
/// state. No packed state is this word either (see [`SPILLED`]: its high half is all ones).
pub(super) const VACANT: u64 = u64::MAX - 1;

/// 2024-01-01T00:00:00Z in microseconds since the Unix epoch: where window indexes start.
const INDEX_EPOCH: u64 = 1_704_067_200_000_000;

/// A state that does not fit a word: the representation of every state before the tables
/// packed them, kept for the few that need it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Slot {
    pub(super) expires_at: u64,
    pub(super) a: u32,
    pub(super) b: u32,
}

/// Counter and bucket algorithms, whose state packs into a word or a [`Slot`].
pub(super) trait Packed: Algorithm {
    /// What [`encode`](Self::encode) and [`decode`](Self::decode) measure from: the index of the
    /// window that contains [`INDEX_EPOCH`], or 0 for the buckets. Computed once per table.
    fn base(&self) -> u64;
    /// The state as a word, or `None` when it does not fit one.
    fn encode(&self, base: u64, state: &Self::State) -> Option<u64>;
    /// The state of a word that [`encode`](Self::encode) made.
    fn decode(&self, base: u64, word: u64) -> Self::State;
    /// The state as a [`Slot`].
    fn widen(&self, state: &Self::State) -> Slot;
    /// The state of a [`Slot`] that [`widen`](Self::widen) made.
    fn narrow(&self, slot: Slot) -> Self::State;
}

/// `window_end / window − base` when `window_end` is a window boundary and the index fits.
fn window_index(window_end: u64, window: Divisor, base: u64) -> Option<u64> {
    let index = window.div(window_end);
    if index * window.get() != window_end {
        return None;
    }
    index.checked_sub(base).filter(|&i| i < u64::from(u32::MAX))
}

impl Packed for FixedWindow {
    fn base(&self) -> u64 {
        INDEX_EPOCH / self.index_unit().get()
    }

    #[inline]
    fn encode(&self, base: u64, state: &FixedWindowState) -> Option<u64> {
        let index = window_index(state.window_end, self.index_unit(), base)?;
        Some(index << 32 | u64::from(state.count))
    }

    #[inline]
    fn decode(&self, base: u64, word: u64) -> FixedWindowState {
        FixedWindowState {
            window_end: ((word >> 32) + base) * self.index_unit().get(),
            count: word as u32,
        }
    }

    fn widen(&self, state: &FixedWindowState) -> Slot {
        Slot {
            expires_at: state.window_end,
            a: state.count,
            b: 0,
        }
    }

    fn narrow(&self, slot: Slot) -> FixedWindowState {
        FixedWindowState {
            window_end: slot.expires_at,
            count: slot.a,
        }
    }
}

impl Packed for SlidingWindowCounter {
    fn base(&self) -> u64 {
        INDEX_EPOCH / self.window_micros()
    }

    #[inline]
    fn encode(&self, base: u64, state: &SlidingWindowCounterState) -> Option<u64> {
        let index = window_index(state.window_end, self.per_window(), base)?;
        let current = u16::try_from(state.current).ok()?;
        let previous = u16::try_from(state.previous).ok()?;
        Some(index << 32 | u64::from(current) << 16 | u64::from(previous))
    }

    #[inline]
    fn decode(&self, base: u64, word: u64) -> SlidingWindowCounterState {
        SlidingWindowCounterState {
            window_end: ((word >> 32) + base) * self.window_micros(),
            current: u32::from((word >> 16) as u16),
            previous: u32::from(word as u16),
        }
    }

    fn widen(&self, state: &SlidingWindowCounterState) -> Slot {
        Slot {
            expires_at: state.window_end,
            a: state.current,
            b: state.previous,
        }
    }

    fn narrow(&self, slot: Slot) -> SlidingWindowCounterState {
        SlidingWindowCounterState {
            window_end: slot.expires_at,
            current: slot.a,
            previous: slot.b,
        }
    }
}

impl Packed for TokenBucket {
    fn base(&self) -> u64 {
        0
    }

    #[inline]
    fn encode(&self, _: u64, state: &TokenBucketState) -> Option<u64> {
        (state.tat < VACANT).then_some(state.tat)
    }

    #[inline]
    fn decode(&self, _: u64, word: u64) -> TokenBucketState {
        TokenBucketState { tat: word }
    }

    fn widen(&self, state: &TokenBucketState) -> Slot {
        Slot {
            expires_at: state.tat,
            a: 0,
            b: 0,
        }
    }

    fn narrow(&self, slot: Slot) -> TokenBucketState {
        TokenBucketState {
            tat: slot.expires_at,
        }
    }
}

impl Packed for LeakyBucket {
    fn base(&self) -> u64 {
        0
    }

    #[inline]
    fn encode(&self, _: u64, state: &LeakyBucketState) -> Option<u64> {
        (state.next_free < VACANT).then_some(state.next_free)
    }

    #[inline]
    fn decode(&self, _: u64, word: u64) -> LeakyBucketState {
        LeakyBucketState { next_free: word }
    }

    fn widen(&self, state: &LeakyBucketState) -> Slot {
        Slot {
            expires_at: state.next_free,
            a: 0,
            b: 0,
        }
    }

    fn narrow(&self, slot: Slot) -> LeakyBucketState {
        LeakyBucketState {
            next_free: slot.expires_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{QuotaError, Timestamp};
    use std::time::Duration;

    fn round_trips<A: Packed>(alg: &A, state: A::State) -> bool
    where
        A::State: PartialEq,
    {
        let base = alg.base();
        assert_eq!(alg.narrow(alg.widen(&state)), state);
        match alg.encode(base, &state) {
            Some(word) => {
                assert!(word != SPILLED && word != VACANT);
                assert_eq!(alg.decode(base, word), state);
                true
            }
            None => false,
        }
    }

    #[test]
    fn states_pack_into_a_word_or_spill() -> Result<(), QuotaError> {
        let now = Timestamp::from_secs(1_800_000_000);
        let fixed = FixedWindow::new(100, Duration::from_secs(60))?;
        let mut state = FixedWindowState::default();
        fixed.commit(&mut state, now, 7);
        assert!(round_trips(&fixed, state));
        state.count = u32::MAX;
        assert!(round_trips(&fixed, state));
        // Before 2024, or not a window boundary: spilled.
        assert!(!round_trips(
            &fixed,
            FixedWindowState {
                window_end: 60_000_000,
                count: 1
            }
        ));
        let off = FixedWindowState {
            window_end: state.window_end + 1,
            count: 1,
        };
        assert!(!round_trips(&fixed, off));

        // A calendar window packs its end in seconds.
        let monthly = FixedWindow::with_calendar(
            10,
            crate::Calendar::new(crate::CalendarUnit::Month, "Europe/Lisbon")?,
        )?;
        let mut state = FixedWindowState::default();
        monthly.commit(&mut state, now, 3);
        assert!(round_trips(&monthly, state));

        let sliding = SlidingWindowCounter::new(100_000, Duration::from_secs(1))?;
        let mut state = SlidingWindowCounterState::default();
        sliding.commit(&mut state, now, 65_535);
        sliding.commit(&mut state, now.saturating_add(Duration::from_secs(1)), 9);
        assert_eq!((state.current, state.previous), (9, 65_535));
        assert!(round_trips(&sliding, state));
        state.current = 65_536;
        assert!(!round_trips(&sliding, state));
        // A 1 ms window's index outgrows 32 bits 49 days after 2024.
        let fast = SlidingWindowCounter::new(10, Duration::from_millis(1))?;
        let mut state = SlidingWindowCounterState::default();
        fast.commit(&mut state, now, 1);
        assert!(!round_trips(&fast, state));

        let bucket = TokenBucket::new(10, "1/s".parse()?)?;
        assert!(round_trips(
            &bucket,
            TokenBucketState {
                tat: 1_800_000_000_123_456
            }
        ));
        assert!(!round_trips(&bucket, TokenBucketState { tat: SPILLED }));
        assert!(!round_trips(&bucket, TokenBucketState { tat: VACANT }));
        let leaky = LeakyBucket::new("1/s".parse()?, 3)?;
        assert!(round_trips(&leaky, LeakyBucketState { next_free: 42 }));
        assert!(!round_trips(&leaky, LeakyBucketState { next_free: VACANT }));
        Ok(())
    }
}
