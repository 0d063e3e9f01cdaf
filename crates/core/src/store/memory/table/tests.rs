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

/// Every entry's slot is reached from its home over taken slots only, as lookups and
/// backward-shift deletion need.
fn assert_probe_runs_unbroken(table: &Table) {
    let capacity = table.capacity();
    for i in 0..capacity {
        let hash = table.slot(i).hash();
        if hash == EMPTY {
            continue;
        }
        let mut j = table.home(hash);
        while j != i {
            assert_ne!(
                table.slot(j).hash(),
                EMPTY,
                "a hole between {hash:#x}'s home and slot {i}"
            );
            j = table.next(j);
        }
    }
}

/// [`Table::extend`] against a map: batches of keys crowded into the top homes (their runs
/// wrap past the last slot), into an empty table and into one that holds keys already, then
/// updates and removes (backward shifts through the runs it built) and more batches.
#[test]
fn extend_agrees_with_a_map() {
    let mut table = Table::default();
    let mut model: HashMap<u64, u64> = HashMap::new();
    let mut next = crate::test_rng::xorshift(0x2545_f491_4f6c_dd1d);
    let mut wrapped = 0;
    for round in 0..30_u64 {
        // Mostly the top sixteenth of the hashes, some anywhere.
        let mut batch: Vec<(u64, u64)> = (0..next() % 1_200)
            .map(|_| {
                let r = next();
                let hash = if r.is_multiple_of(8) {
                    r
                } else {
                    r | 0xf000_0000_0000_0000
                };
                (identity(hash), round)
            })
            .filter(|(hash, _)| !model.contains_key(hash))
            .collect();
        batch.sort_unstable();
        batch.dedup_by_key(|(hash, _)| *hash);
        model.extend(batch.iter().copied());
        table.extend_words(batch);
        assert_eq!(table.len(), model.len());
        assert!(table.len() <= table.max_len);
        assert_probe_runs_unbroken(&table);
        wrapped += (0..table.capacity())
            .filter(|&i| table.slot(i).hash() != EMPTY && i < table.home(table.slot(i).hash()))
            .count();
        for (&hash, &state) in &model {
            assert_eq!(
                table.get(hash).map(|s| s.load(Ordering::Relaxed)),
                Some(state)
            );
            let fresh = table.find(hash, false).map(|s| s.load(Ordering::Relaxed));
            assert_eq!(fresh, Ok(state));
            assert_eq!(
                table.find(hash, true).map(|s| s.load(Ordering::Relaxed)),
                fresh
            );
        }
        // An absent key's probe ends at an empty slot.
        assert!(table.get(identity(next())).is_none());
        // Updates, removes and one-at-a-time inserts between batches.
        let keys: Vec<u64> = model.keys().copied().collect();
        for (k, &hash) in keys.iter().enumerate() {
            match (k as u64 + round) % 5 {
                0 => {
                    assert!(table.remove(hash));
                    model.remove(&hash);
                }
                1 => {
                    *table.get_mut(hash).unwrap() = round + 1000;
                    model.insert(hash, round + 1000);
                }
                _ => {}
            }
        }
        for _ in 0..100 {
            let hash = identity(next() | 0xf000_0000_0000_0000);
            if let std::collections::hash_map::Entry::Vacant(slot) = model.entry(hash) {
                table.insert(hash, round);
                slot.insert(round);
            }
        }
        assert_probe_runs_unbroken(&table);
        assert_eq!(table.len(), model.len());
    }
    assert!(wrapped > 0, "no run wrapped past the last slot");
    let mut all: Vec<_> = table.iter().collect();
    all.sort_unstable();
    let mut expected: Vec<_> = model.into_iter().collect();
    expected.sort_unstable();
    assert_eq!(all, expected);
}

/// Keys spread over a table sized for them do not crowd it; keys in a sixteenth of its homes
/// do, by a wide margin either way.
#[test]
fn crowding_is_told_apart() {
    let mut next = crate::test_rng::xorshift(0x9e37_79b9_7f4a_7c15);
    let spread: Vec<u64> = (0..50_000).map(|_| identity(next())).collect();
    let crowded: Vec<u64> = spread.iter().map(|h| h | 0xf000_0000_0000_0000).collect();
    let mut table = Table::<Entry>::default();
    table.reserve(spread.len());
    assert!(!table.would_crowd(spread.iter().copied()));
    assert!(table.would_crowd(crowded.iter().copied()));
    // The same for one-slot homes (logs).
    let records = {
        let mut records = Table::<super::super::log::Record>::default();
        records.reserve(spread.len());
        records
    };
    assert!(!records.would_crowd(spread.iter().copied()));
    assert!(records.would_crowd(crowded.iter().copied()));
}
