//! Time as the algorithms see it: a [`Timestamp`] in whole microseconds since the Unix epoch,
//! read from a [`Clock`] that callers inject.
//!
//! Microseconds, because Redis `TIME` has that resolution and because a Lua number (a double)
//! holds every such value exactly for the next few centuries, so the Redis scripts and the pure
//! algorithms in this crate compute the very same integers.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time: whole microseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The Unix epoch.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// A timestamp `micros` microseconds after the Unix epoch.
    pub const fn from_micros(micros: u64) -> Self {
        Timestamp(micros)
    }

    /// A timestamp `millis` milliseconds after the Unix epoch (saturating).
    pub const fn from_millis(millis: u64) -> Self {
        Timestamp(millis.saturating_mul(1_000))
    }

    /// A timestamp `secs` seconds after the Unix epoch (saturating).
    pub const fn from_secs(secs: u64) -> Self {
        Timestamp(secs.saturating_mul(1_000_000))
    }

    /// Microseconds since the Unix epoch.
    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// Converts a wall-clock time; times before the epoch become the epoch.
    pub fn from_system_time(time: SystemTime) -> Self {
        let micros = time
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        Timestamp(micros)
    }

    /// This timestamp moved `d` later, saturating at the end of time.
    pub fn saturating_add(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_add(duration_micros(d)))
    }

    /// This timestamp moved `d` earlier, saturating at the epoch.
    pub fn saturating_sub(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_sub(duration_micros(d)))
    }

    /// Time from `earlier` to `self`; zero when `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Timestamp) -> Duration {
        Duration::from_micros(self.0.saturating_sub(earlier.0))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:06}", self.0 / 1_000_000, self.0 % 1_000_000)
    }
}

/// Whole microseconds in `d`, saturating (a `Duration` can hold more than `u64` microseconds).
pub(crate) fn duration_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A source of time, injected into the [`Limiter`](crate::Limiter) so that tests and benchmarks
/// control it. The limiter reads it once per check; algorithms never read it.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;

    /// Completes once `duration` has passed on this clock. [`Limiter::acquire`] uses it to hold a
    /// request until its leaky-bucket slot.
    ///
    /// [`Limiter::acquire`]: crate::Limiter::acquire
    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + Send;
}

/// The wall clock, made monotonic and cheap to read.
///
/// It reads the system time once at creation and then advances with a monotonic clock, so a
/// step of the system clock (NTP, a human) never moves decisions backwards. Windows stay aligned
/// to the Unix epoch, so instances on different machines agree on window boundaries as far as
/// their clocks agree. Sleeping uses the tokio timer (a tokio runtime must be running).
///
/// The monotonic clock is the CPU's time-stamp counter where it is reliable (through `quanta`),
/// since one read per decision must cost nanoseconds: on virtual machines `clock_gettime` can
/// cost a fifth of a whole in-memory check. Elsewhere `quanta` falls back to the OS clock.
/// Raw readings become microseconds with one multiplication by a factor taken from `quanta`'s
/// calibration once, rather than through its nanoseconds and a division on every read.
#[derive(Clone, Debug)]
pub struct SystemClock {
    anchor_wall: Timestamp,
    anchor_raw: u64,
    /// Microseconds per raw tick, times 2⁶⁴.
    micros_per_tick: u64,
    source: quanta::Clock,
}

/// The span of raw ticks `SystemClock` measures its factor over: long enough that the factor
/// is exact to about 10⁻¹² (26 µs in a hundred days).
const CALIBRATION_TICKS: u64 = 1 << 40;

impl SystemClock {
    /// A clock anchored at the current system time.
    pub fn new() -> Self {
        let source = quanta::Clock::new();
        SystemClock {
            anchor_wall: Timestamp::from_system_time(SystemTime::now()),
            anchor_raw: source.raw(),
            micros_per_tick: micros_per_tick(&source),
            source,
        }
    }
}

/// `source`'s microseconds per tick, times 2⁶⁴: its nanoseconds for 2⁴⁰ ticks × 2²⁴ / 1000.
/// Saturates for a tick over a microsecond, which no `quanta` source has (TSC or nanoseconds).
fn micros_per_tick(source: &quanta::Clock) -> u64 {
    let nanos = source.delta_as_nanos(0, CALIBRATION_TICKS);
    u64::try_from((u128::from(nanos) << 24) / 1000).unwrap_or(u64::MAX)
}

/// `ticks` raw ticks in whole microseconds, by the factor of [`micros_per_tick`].
#[inline]
fn ticks_to_micros(ticks: u64, micros_per_tick: u64) -> u64 {
    ((u128::from(ticks) * u128::from(micros_per_tick)) >> 64) as u64
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Timestamp {
        // A reading before the anchor (a counter that differs between cores) counts as none.
        let ticks = self.source.raw().saturating_sub(self.anchor_raw);
        let micros = ticks_to_micros(ticks, self.micros_per_tick);
        Timestamp(self.anchor_wall.0.saturating_add(micros))
    }

    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(duration)
    }
}

/// A clock that follows tokio's timer, so `tokio::time::pause()` and `advance()` drive it.
///
/// Meant for tests of code that sleeps through tokio (the HTTP layer's `delay` action): pausing
/// time then moves this clock and the held requests together, with no real waiting.
#[derive(Clone, Debug)]
pub struct TokioClock {
    anchor_wall: Timestamp,
    anchor_mono: tokio::time::Instant,
}

impl TokioClock {
    /// A clock anchored at the current system time and tokio's current instant.
    pub fn new() -> Self {
        TokioClock {
            anchor_wall: Timestamp::from_system_time(SystemTime::now()),
            anchor_mono: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        self.anchor_wall.saturating_add(self.anchor_mono.elapsed())
    }

    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(duration)
    }
}

/// A clock that moves only when told to: for tests of the limiter and of code built on it.
///
/// Clones share the same time. [`Clock::sleep`] on a manual clock completes when the clock has
/// been advanced past the deadline, so a test can hold a request and release it deterministically.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    shared: Arc<ManualShared>,
}

#[derive(Debug, Default)]
struct ManualShared {
    now: AtomicU64,
    sleepers: Mutex<Vec<Waker>>,
}

impl ManualClock {
    /// A manual clock that starts at `start`.
    pub fn new(start: Timestamp) -> Self {
        let clock = ManualClock::default();
        clock.set(start);
        clock
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.shared
            .now
            .fetch_add(duration_micros(d), Ordering::SeqCst);
        self.wake_sleepers();
    }

    /// Sets the clock to `t` (which may be earlier, to test clock steps).
    pub fn set(&self, t: Timestamp) {
        self.shared.now.store(t.as_micros(), Ordering::SeqCst);
        self.wake_sleepers();
    }

    fn wake_sleepers(&self) {
        let sleepers = std::mem::take(
            &mut *self
                .shared
                .sleepers
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for waker in sleepers {
            waker.wake();
        }
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.shared.now.load(Ordering::SeqCst))
    }

    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + Send {
        ManualSleep {
            shared: Arc::clone(&self.shared),
            deadline: self.now().saturating_add(duration).as_micros(),
        }
    }
}

/// The future of [`ManualClock::sleep`].
struct ManualSleep {
    shared: Arc<ManualShared>,
    deadline: u64,
}

impl Future for ManualSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.shared.now.load(Ordering::SeqCst) >= self.deadline {
            return Poll::Ready(());
        }
        let mut sleepers = self
            .shared
            .sleepers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Check again under the lock: an advance between the load above and this lock would
        // otherwise wake nobody.
        if self.shared.now.load(Ordering::SeqCst) >= self.deadline {
            return Poll::Ready(());
        }
        sleepers.push(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(Timestamp::from_secs(10));
        assert_eq!(clock.now(), Timestamp::from_secs(10));
        clock.advance(Duration::from_millis(1500));
        assert_eq!(clock.now(), Timestamp::from_micros(11_500_000));
        let clone = clock.clone();
        clone.set(Timestamp::from_secs(3));
        assert_eq!(clock.now(), Timestamp::from_secs(3));
    }

    #[tokio::test]
    async fn manual_sleep_completes_after_advance() {
        let clock = ManualClock::new(Timestamp::from_secs(1));
        let sleeper = {
            let clock = clock.clone();
            tokio::spawn(async move { clock.sleep(Duration::from_secs(2)).await })
        };
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished());
        clock.advance(Duration::from_secs(1));
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished());
        clock.advance(Duration::from_secs(1));
        assert!(sleeper.await.is_ok());
    }

    /// The one-multiplication scaling agrees with `quanta`'s own to the microsecond, from a tick
    /// to a year of ticks.
    #[test]
    fn system_clock_scales_ticks_as_quanta_does() {
        let source = quanta::Clock::new();
        let factor = micros_per_tick(&source);
        let mut ticks = 1_u64;
        while ticks < 1 << 56 {
            for t in [ticks - 1, ticks, ticks + ticks / 3] {
                let expected = source.delta_as_nanos(0, t) / 1_000;
                let got = ticks_to_micros(t, factor);
                assert!(
                    got.abs_diff(expected) <= 1 + expected / 10_000_000_000,
                    "{t} ticks: {got} µs, quanta says {expected}"
                );
            }
            ticks *= 2;
        }
    }

    #[test]
    fn system_clock_is_near_wall_time_and_monotonic() {
        let clock = SystemClock::new();
        let a = clock.now();
        let b = clock.now();
        assert!(b >= a);
        let wall = Timestamp::from_system_time(SystemTime::now());
        assert!(wall.saturating_duration_since(a) < Duration::from_secs(5));
    }
}
