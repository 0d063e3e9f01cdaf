//! The table against a map through crowded inserts, updates and removes, and its density.

use super::*;
use std::collections::HashMap;

/// A table against `HashMap` through random inserts, updates and removes, with hashes
/// crowded into few homes so that probe runs wrap and backward shifts happen.
#[test]
fn agrees_with_a_map() {
    let mut table = Table::default();
    let mut model: HashMap<u64, u64> = HashMap::new();
    let mut next = crate::test_rng::xorshift(0x9e37_79b9_7f4a_7c15_u64);
    for step in 0..200_000u64 {
        // Few distinct keys, the top bits (which pick the home) drawn from a small set.
        let r = next();
        let hash = identity(((r % 7) << 61) | ((r >> 40) % 3_000));
        match next() % 4 {
            0 | 1 => {
                if let Some(state) = table.get_mut(hash) {
                    *state = step;
                } else {
                    table.insert(hash, step);
                }
                model.insert(hash, step);
            }
            2 => assert_eq!(table.remove(hash), model.remove(&hash).is_some()),
            _ => {
                let got = table.get(hash).map(|s| s.load(Ordering::Relaxed));
                assert_eq!(got, model.get(&hash).copied());
                // Both ways of looking in the home line end at the same slot.
                let fresh = table.find(hash, false).map(|s| s.load(Ordering::Relaxed));
                assert_eq!(
                    table.find(hash, true).map(|s| s.load(Ordering::Relaxed)),
                    fresh
                );
            }
        }
        assert_eq!(table.len(), model.len());
        if step % 50_000 == 0 {
            table.retain(|h, _| h % 2 == 0);
            model.retain(|h, _| h % 2 == 0);
        }
    }
    let mut all: Vec<_> = table.iter().collect();
    all.sort_unstable();
    let mut expected: Vec<_> = model.into_iter().collect();
    expected.sort_unstable();
    assert_eq!(all, expected);
}

#[test]
fn a_home_line_is_one_cache_line() {
    let mut table = Table::default();
    table.insert(identity(7), 1);
    assert_eq!(std::mem::size_of::<Line<Entry>>(), 64);
    assert_eq!(table.lines.as_ptr() as usize % 64, 0);
}

#[test]
fn entries_are_sixteen_bytes_and_the_table_stays_dense() {
    assert_eq!(std::mem::size_of::<Entry>(), 16);
    let mut table = Table::default();
    for i in 1..=1_000_000u64 {
        table.insert(identity(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)), i);
        if i % 1000 == 0 && i > 1000 {
            let per_key = table.bytes() as f64 / i as f64;
            assert!(
                (16.0..=30.1).contains(&per_key),
                "{i} keys: {per_key} B/key"
            );
        }
    }
}
