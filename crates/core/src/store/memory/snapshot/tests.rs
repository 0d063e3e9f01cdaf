//! Where a store's keys sit in its tables, through eviction and restores: a store at its bound
//! keeps its keys spread over their homes, and so does its restore; a restore into a smaller
//! store makes tables for what it keeps; a snapshot whose keys crowd a few homes (as a store that
//! evicted the lowest hashes first wrote them) restores in one pass over the slots, deciding as
//! the store that wrote it.

use std::time::Duration;

use super::super::Words;
use super::super::table::{Layout, WALKED};
use crate::algorithm::LeakyBucket;
use crate::{Check, MemoryStore, Policy, Quota, Timestamp};

const T0: Timestamp = Timestamp::from_secs(1_800_057_600);

/// Fixed, so that the keys' homes are the same at every run.
const HASH_KEY: (u64, u64) = (0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210);

fn snapshot(store: &MemoryStore) -> Vec<u8> {
    let mut bytes = Vec::new();
    store.write_snapshot(T0, &mut bytes).unwrap();
    bytes
}

/// Slots the entries sit past their homes, on average and at most.
fn spread(layout: Layout) -> (f64, usize) {
    (
        layout.total as f64 / layout.entries.max(1) as f64,
        layout.longest,
    )
}

/// Keys spread over the homes of tables at most four-fifths full sit a slot or two past their
/// home on average, and a few dozen at most: lookups read one line, two now and then.
fn assert_spread(what: &str, layout: Layout) {
    let (mean, longest) = spread(layout);
    assert!(
        mean < 8.0 && longest < 256,
        "{what}: entries sit {mean:.1} slots past their homes on average, {longest} at most \
         ({layout:?})"
    );
}

/// Four times `max_keys` one-request keys through a store: every eviction is among keys alike
/// in stake and expiry. Ties broken by the hash kept the keys of the highest homes, and after
/// a few rounds every key of a shard sat in one run the length of its table, thousands of
/// slots from its home: every check walked it, and a restore walked it for every key (19 to
/// 30 s for a million).
#[test]
fn a_store_at_its_bound_keeps_its_keys_spread_over_their_homes() {
    const MAX_KEYS: usize = 40_000;
    let policy = Policy::new(
        "api",
        Quota::fixed_window(100, Duration::from_secs(3600)).unwrap(),
    )
    .unwrap();
    let builder = || {
        MemoryStore::builder()
            .max_keys(MAX_KEYS)
            .shards(4)
            .hash_key(HASH_KEY, Words::Mixed)
    };
    let store = builder().build();
    for i in 0..4 * MAX_KEYS as u64 {
        store.apply_now(T0, &[Check::new(&policy, &i.to_le_bytes(), 1)]);
    }
    assert!(store.len() <= MAX_KEYS && store.len() > MAX_KEYS * 15 / 16 - 4);
    assert_spread("the store at its bound", store.layout());

    let bytes = snapshot(&store);
    let (restored, counts) = MemoryStore::restore_snapshot(builder(), T0, &mut &bytes[..]).unwrap();
    assert_eq!(counts.restored, store.len() as u64, "{counts:?}");
    assert_spread("its restore", restored.layout());
    // And the restore's snapshot, restored again.
    let bytes = snapshot(&restored);
    let (again, _) = MemoryStore::restore_snapshot(builder(), T0, &mut &bytes[..]).unwrap();
    assert_spread("its restore's restore", again.layout());
}

/// A restore into a store smaller than its snapshot makes each table the size of the shard's
/// share, not of every key the snapshot gives it: each eviction ranks the whole table, and a
/// table of 50,000 slots ranked for the 2 keys a round drops made a restore of a million keys
/// into `max_keys = 1000` take 25 s.
#[test]
fn a_restore_into_a_smaller_store_makes_tables_for_what_it_keeps() {
    let policy = Policy::new(
        "api",
        Quota::fixed_window(100, Duration::from_secs(3600)).unwrap(),
    )
    .unwrap();
    let store = MemoryStore::builder()
        .hash_key(HASH_KEY, Words::Mixed)
        .build();
    for i in 0..50_000_u64 {
        store.apply_now(T0, &[Check::new(&policy, &i.to_le_bytes(), 1)]);
    }
    let bytes = snapshot(&store);
    for shards in [1, 4, 32] {
        let builder = MemoryStore::builder().max_keys(1000).shards(shards);
        let (small, counts) = MemoryStore::restore_snapshot(builder, T0, &mut &bytes[..]).unwrap();
        assert_eq!(counts.restored + counts.evicted, 50_000, "{counts:?}");
        assert!(small.len() <= small.max_keys(), "{counts:?}");
        let layout = small.layout();
        assert!(
            layout.slots <= 2 * small.max_keys() + 16 * shards,
            "{shards} shards: {} slots for at most {} keys",
            layout.slots,
            small.max_keys()
        );
    }
}

/// A policy of each kind a snapshot keeps: packed states, a state too wide for a word, a
/// sliding log.
fn policies() -> Vec<Policy> {
    let minute = Duration::from_secs(60);
    [
        Quota::fixed_window(10, minute).unwrap(),
        // A window under 100 ms spills out of the packed word.
        Quota::fixed_window(10, Duration::from_millis(10)).unwrap(),
        Quota::sliding_window_counter(10, minute).unwrap(),
        Quota::token_bucket(10, "1/s".parse().unwrap()).unwrap(),
        Quota::LeakyBucket(LeakyBucket::new("2/s".parse().unwrap(), 5).unwrap()),
        Quota::sliding_window_log(10, minute).unwrap(),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, q)| Policy::new(&format!("p{i}-{}", q.kind()), q).unwrap())
    .collect()
}

/// A snapshot whose keys crowd the top eighth of the homes, as a store that evicted the keys of
/// the lowest homes first wrote them. One at a time, each key of a run walked the whole run:
/// a restore quadratic in a shard's keys. In one pass it steps past each slot about once, and
/// the store decides every key as the one that wrote it.
#[test]
fn a_snapshot_of_crowded_keys_restores_in_one_pass() {
    const KEYS: usize = 6_000;
    let policies = policies();
    let builder = || {
        MemoryStore::builder()
            .max_keys(8 * KEYS)
            .shards(2)
            .hash_key(HASH_KEY, Words::Mixed)
    };
    let store = builder().build();
    // Keys whose hash's three top bits are set: their homes are the top eighth of every table.
    let keys: Vec<[u8; 8]> = (0_u64..)
        .map(u64::to_le_bytes)
        .filter(|key| store.hashed(key).value >> 61 == 0b111)
        .take(KEYS)
        .collect();
    // Key i spends i % 4 + 1 of each quota, over a few milliseconds.
    for (i, key) in keys.iter().enumerate() {
        for p in &policies {
            for n in 0..i % 4 + 1 {
                let at = T0.saturating_add(Duration::from_micros(n as u64 * 1_000));
                store.apply_now(at, &[Check::new(p, key, 1)]);
            }
        }
    }
    let now = T0.saturating_add(Duration::from_millis(5));
    let mut bytes = Vec::new();
    store.write_snapshot(now, &mut bytes).unwrap();

    WALKED.with(|w| w.set(0));
    let (restored, counts) =
        MemoryStore::restore_snapshot(builder(), now, &mut &bytes[..]).unwrap();
    let walked = WALKED.with(std::cell::Cell::get);
    let layout = restored.layout();
    assert_eq!(counts.restored, store.len() as u64, "{counts:?}");
    assert_eq!(layout.entries, restored.len());
    let (mean, _) = spread(layout);
    assert!(mean > 100.0, "the keys crowd their homes: {layout:?}");
    // One at a time: about the entries times their mean distance from home (here a few
    // million slots).
    assert!(
        walked <= layout.entries + layout.slots,
        "the restore stepped past {walked} slots placing {} entries in {} slots",
        layout.entries,
        layout.slots
    );

    for (i, key) in keys.iter().enumerate() {
        for p in &policies {
            for cost in [0, 1, 10] {
                let check = Check::new(p, key, cost);
                assert_eq!(
                    restored.apply_one_now(now, &check),
                    store.apply_one_now(now, &check),
                    "key {i}, {p}, cost {cost}"
                );
            }
        }
    }
    // Past its bound, the restored store evicts (deleting from its crowded tables) as the one
    // that wrote it, and goes on deciding as it.
    for i in 0..8 * KEYS as u64 {
        let key = (1 << 40 | i).to_le_bytes();
        let check = Check::new(&policies[0], &key, 1);
        assert_eq!(
            restored.apply_one_now(now, &check),
            store.apply_one_now(now, &check)
        );
    }
    assert_eq!(restored.len(), store.len());
    assert!(store.len() <= store.max_keys());
    for (i, key) in keys.iter().enumerate() {
        for p in &policies {
            let check = Check::new(p, key, 0);
            assert_eq!(
                restored.apply_one_now(now, &check),
                store.apply_one_now(now, &check),
                "key {i}, {p}, after evictions"
            );
        }
    }
}
