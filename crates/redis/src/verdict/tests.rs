//! Tests of the reply decoding: shapes that are protocol errors, and packed replies that decide
//! exactly as the whole state does.

use std::time::Duration;

use super::*;

#[test]
fn replies_of_the_wrong_shape_are_protocol_errors() {
    let policy = tollgate::Policy::new(
        "shape",
        Quota::fixed_window(5, std::time::Duration::from_secs(1)).unwrap_or_else(|e| panic!("{e}")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let check = Check::new(&policy, b"k", 1);
    for reply in [
        Value::Nil,
        Value::Array(vec![Value::Int(1)]),
        Value::Array(vec![Value::Nil; 3]),
        Value::Array(vec![Value::Int(-5); 3]),
        // Admitted by the script, denied by the algorithm (6 of 5 used).
        Value::Array(vec![Value::Int(1), Value::Int(1_000), Value::Int(6)]),
    ] {
        assert!(matches!(
            one_check(&check, reply),
            Err(StoreError::Protocol { .. })
        ));
    }
    let ok = Value::Array(vec![Value::Int(1), Value::Int(250_000), Value::Int(2)]);
    let grant = one_check(&check, ok).unwrap_or_else(|e| panic!("{e}"));
    assert!(grant.verdict.allowed);
    assert_eq!(grant.verdict.remaining, 2);
    assert_eq!(grant.verdict.reset_micros, 250_000);
}

fn policy(quota: Quota) -> tollgate::Policy {
    tollgate::Policy::new("packed", quota).unwrap_or_else(|e| panic!("{e}"))
}

fn ints(values: &[i64]) -> Value {
    Value::Array(values.iter().map(|&v| Value::Int(v)).collect())
}

/// 2^53: the scripts reply one integer only below it.
const EXACT: i64 = 1 << 53;

proptest::proptest! {
    /// An admitted sliding window counter's one integer, (left x (limit + 1) + current +
    /// weighted previous), decides exactly as the state the script read, replied whole.
    #[test]
    fn a_packed_counter_admission_decides_like_the_state(
        window_bits in 0u32..40,
        limit_bits in 0u32..32,
        low_bits in proptest::prelude::any::<u64>(),
        left in 0.0f64..2.0,
        current in 0.0f64..=1.0,
        previous in 0.0f64..=1.0,
        cost in 0.0f64..=1.0,
    ) {
        // Sizes spread over every magnitude, most of them where the packing fits 2^53.
        let window = (1u64 << window_bits) | (low_bits & ((1 << window_bits) - 1));
        let limit = (1u32 << limit_bits) | (low_bits as u32 & ((1 << limit_bits) - 1));
        let w = Duration::from_micros(window);
        let Ok(quota) = Quota::sliding_window_counter(limit, w) else {
            return Ok(());
        };
        let policy = policy(quota);
        let l = u64::from(limit);
        // As the script computes them; a left past the window is a clock stepped back.
        let left = ((window as f64 * left) as u64).clamp(1, 2 * window);
        let current = (l as f64 * current) as u64;
        let previous = (l as f64 * previous) as u64;
        let overlap = u128::from(left.min(window));
        let weighted = (u128::from(previous) * overlap).div_ceil(u128::from(window)) as u64;
        let room = l.saturating_sub(current + weighted);
        let cost = (((room as f64) * cost) as u32).max(1);
        proptest::prop_assume!(u64::from(cost) <= room);
        let packed = i128::from(left) * (i128::from(limit) + 1) + i128::from(current + weighted);
        proptest::prop_assume!(packed < i128::from(EXACT));
        let check = Check::new(&policy, b"k", cost);
        let whole = one_check(
            &check,
            ints(&[i64::from(cost), left as i64, current as i64, previous as i64]),
        );
        let packed = one_check(&check, Value::Int(packed as i64));
        let (whole, packed) = (whole.map_err(|e| e.to_string()), packed.map_err(|e| e.to_string()));
        proptest::prop_assert!(whole.is_ok(), "{whole:?}");
        let (whole, packed) = (whole.map(|g| g.verdict), packed.map(|g| g.verdict));
        proptest::prop_assert!(whole.as_ref().is_ok_and(|v| v.allowed));
        proptest::prop_assert_eq!(whole, packed);
    }

    /// An admitted sliding window log's one integer (the units in the window) decides as
    /// the log replied whole, wherever its newest unit is.
    #[test]
    fn a_packed_log_admission_decides_like_the_log(
        limit in 1u32..=u32::MAX,
        total in 0.0f64..=1.0,
        cost in 0.0f64..=1.0,
        newest in 0u64..1_000_000,
    ) {
        let Ok(quota) = Quota::sliding_window_log(limit, Duration::from_secs(1)) else {
            return Ok(());
        };
        let policy = policy(quota);
        let total = (f64::from(limit) * total) as u32;
        let cost = ((f64::from(limit - total) * cost) as u32).max(1);
        proptest::prop_assume!(u64::from(total) + u64::from(cost) <= u64::from(limit));
        let check = Check::new(&policy, b"k", cost);
        // Newest before now (the window's units), or none.
        let newest = if total == 0 { -(BASE as i64) } else { -(newest as i64) };
        let whole = one_check(&check, ints(&[i64::from(cost), i64::from(total), newest]));
        let packed = one_check(&check, Value::Int(i64::from(total)));
        let (whole, packed) = (
            whole.map(|g| g.verdict).map_err(|e| e.to_string()),
            packed.map(|g| g.verdict).map_err(|e| e.to_string()),
        );
        proptest::prop_assert!(whole.as_ref().is_ok_and(|v| v.allowed), "{whole:?}");
        proptest::prop_assert_eq!(whole, packed);
    }
}

#[test]
fn a_log_summary_decides_like_the_log() {
    // Units at 10, 10, 20 and 30 (total 4), the two oldest reported.
    let s = log_state(4, 30, &[(10, 1), (10, 1)]);
    assert_eq!(s.total, 4);
    assert_eq!(s.entries, VecDeque::from([(10, 2), (30, 2)]));
    // Nothing reported: everything at the newest.
    assert_eq!(log_state(3, 7, &[]).entries, VecDeque::from([(7, 3)]));
    assert!(log_state(0, 0, &[]).entries.is_empty());
}
