//! The fixed window's known flaw, shown: up to twice the limit across a window boundary. The
//! sliding algorithms do not have it.

use std::time::Duration;

use tollgate::algorithm::{Algorithm, FixedWindow, SlidingWindowCounter, SlidingWindowLog};
use tollgate::{QuotaError, Timestamp};

const MINUTE: u64 = 60_000_000;
/// 0:59 and 1:00 of some aligned minute.
const BEFORE: u64 = 1_800_000_000 * 1_000_000 + 59 * 1_000_000;
const AFTER: u64 = BEFORE + 1_000_000;

/// 100 requests at 0:59 and 100 more at 1:00: how many are admitted within those two seconds.
fn burst_across_boundary<A: Algorithm>(alg: &A) -> u32 {
    assert_eq!(AFTER % MINUTE, 0, "AFTER is a window boundary");
    let mut state = A::State::default();
    let mut admitted = 0;
    for t in [BEFORE, AFTER] {
        for _ in 0..100 {
            admitted += u32::from(alg.check(&mut state, Timestamp::from_micros(t), 1).allowed);
        }
    }
    admitted
}

#[test]
fn fixed_window_admits_twice_the_limit_across_a_boundary() -> Result<(), QuotaError> {
    let alg = FixedWindow::new(100, Duration::from_secs(60))?;
    assert_eq!(burst_across_boundary(&alg), 200);
    Ok(())
}

#[test]
fn sliding_window_log_holds_the_limit_across_a_boundary() -> Result<(), QuotaError> {
    let alg = SlidingWindowLog::new(100, Duration::from_secs(60))?;
    assert_eq!(burst_across_boundary(&alg), 100);
    Ok(())
}

#[test]
fn sliding_window_counter_holds_the_limit_across_a_boundary() -> Result<(), QuotaError> {
    let alg = SlidingWindowCounter::new(100, Duration::from_secs(60))?;
    // At 1:00 the previous window weighs fully: 100 + 0 leaves no room.
    assert_eq!(burst_across_boundary(&alg), 100);
    Ok(())
}
