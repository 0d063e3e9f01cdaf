//! The compact log against the deque the pure algorithm keeps: the same decisions through
//! spills and returns, and a record that stays one cache line.

use super::*;
use crate::algorithm::{Algorithm, SlidingWindowLogState};
use std::time::Duration;

struct Xorshift(u64);

impl Xorshift {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn a_record_is_one_cache_line() {
    assert_eq!(std::mem::size_of::<CompactLog>(), 48, "log");
    assert_eq!(std::mem::size_of::<Record>(), 64);
    assert_eq!(std::mem::align_of::<Record>(), 64);
}

/// Whether a run must see the log spill and come back, or never spill.
#[derive(Clone, Copy, PartialEq)]
enum Spills {
    Never,
    AndReturns,
}

/// Random checks and refunds on one key, decided on the compact log and on the algorithm's own
/// deque, must agree field by field. `costs` and `gaps` pick what spills: long logs, merged costs
/// over 255, entries so far apart that few offsets pack.
fn agrees_with_the_deque(
    limit: u32,
    window: Duration,
    max_cost: u64,
    max_gap: u64,
    seed: u64,
    spills: Spills,
) {
    let alg = SlidingWindowLog::new(limit, window).unwrap_or_else(|e| panic!("{e}"));
    let mut compact = CompactLog::default();
    let mut deque = SlidingWindowLogState::default();
    let mut rng = Xorshift(seed);
    let mut now = Timestamp::from_secs(1_800_000_000);
    let (mut spilled, mut returned) = (0, 0);
    for step in 0..20_000 {
        // Bursts, steady traffic, and now and then a pause that empties much of the log.
        now = now.saturating_add(Duration::from_micros(match rng.below(40) {
            0..=9 => 0,
            10..=19 => rng.below(1_000),
            20..=38 => rng.below(max_gap),
            _ => rng.below(2 * window.as_micros() as u64),
        }));
        let cost = rng.below(max_cost + 1) as u32;
        let was_spilled = compact.is_spilled();
        if rng.below(10) == 0 {
            alg.refund(&mut deque, now, cost);
            alg.refund_log(&mut compact, now, cost);
            compact.tidy();
        } else {
            let want = alg.check(&mut deque, now, cost);
            let (got, _) = compact.step(&alg, now, cost, true);
            assert_eq!(got, want, "step {step} at {now} cost {cost}");
        }
        assert_eq!(compact.total(), deque.total, "step {step}");
        assert_eq!(
            compact.entries().collect::<Vec<_>>(),
            deque.entries.iter().copied().collect::<Vec<_>>(),
            "step {step}"
        );
        assert_eq!(alg.expires_at_log(&compact), alg.expires_at(&deque));
        spilled += usize::from(!was_spilled && compact.is_spilled());
        returned += usize::from(was_spilled && !compact.is_spilled());
    }
    match spills {
        Spills::Never => assert_eq!(spilled, 0, "a log that packs spilled"),
        Spills::AndReturns => assert!(
            spilled > 0 && returned > 0,
            "{spilled} spills, {returned} returns"
        ),
    }
}

#[test]
fn limits_below_the_inline_room_stay_inline_and_exact() {
    // Four entries pack over any span; costs are stored once one is not 1 (same-microsecond
    // requests merge), and then a minute holds 7 entries, a second 9.
    agrees_with_the_deque(
        4,
        Duration::from_secs(4 * 3600),
        200,
        1 << 36,
        1,
        Spills::Never,
    );
    agrees_with_the_deque(9, Duration::from_secs(1), 2, 200_000, 2, Spills::Never);
    agrees_with_the_deque(7, Duration::from_secs(60), 1, 20_000_000, 7, Spills::Never);
    // Every cost 1 and no two requests in one microsecond: a second holds 12 (20-bit offsets).
    agrees_with_the_deque(12, Duration::from_secs(1), 0, 200_000, 8, Spills::Never);
}

/// How many entries a record packs, as the docs say: offsets as wide as the span needs, 8 bits
/// more once a cost is not 1.
#[test]
fn a_record_packs_what_the_docs_say() {
    let start = Timestamp::from_secs(1_800_000_000).as_micros();
    let packs = |span: u64, first_cost: u32| {
        let mut log = CompactLog::default();
        log.push(start, first_cost);
        // From the second entry on, offsets need the span's full width.
        let mut n = 1;
        while !log.is_spilled() {
            log.push(start + span - 100 + n, 1);
            n += 1;
        }
        n as usize - 1
    };
    let (second, minute, hour) = (1_000_000, 60_000_000, 3_600_000_000);
    assert_eq!(packs(second, 1), 12);
    assert_eq!(packs(minute, 1), 9);
    assert_eq!(packs(hour, 1), 8);
    assert_eq!(packs(second, 2), 9);
    assert_eq!(packs(minute, 2), 7);
    assert_eq!(packs(hour, 2), 6);
    // Four entries pack over any span a time can have.
    assert!(packs(1 << 51, 255) >= INLINE);
}

/// Times from the year 2112 on do not pack (the base has 52 bits): such a log lives on the
/// heap, exactly.
#[test]
fn times_past_the_packed_range_spill_exactly() {
    let mut log = CompactLog::default();
    let t = (1 << 52) + 5;
    log.push(t, 1);
    log.push(t + 1, 3);
    assert!(log.is_spilled());
    assert_eq!(log.entries().collect::<Vec<_>>(), vec![(t, 1), (t + 1, 3)]);
    assert_eq!(log.total(), 4);
}

#[test]
fn longer_logs_spill_and_come_back_exactly() {
    agrees_with_the_deque(
        40,
        Duration::from_millis(500),
        3,
        40_000,
        3,
        Spills::AndReturns,
    );
    agrees_with_the_deque(
        1_000,
        Duration::from_secs(2),
        1,
        20_000,
        4,
        Spills::AndReturns,
    );
}

#[test]
fn large_costs_spill_and_come_back_exactly() {
    agrees_with_the_deque(
        2_000,
        Duration::from_millis(300),
        600,
        100_000,
        5,
        Spills::AndReturns,
    );
}

#[test]
fn entries_far_apart_spill_and_come_back_exactly() {
    // A three-hour window with entries up to 100 minutes apart: offsets of 33 bits, and with
    // costs 41 bits an entry, so six pack and the seventh spills.
    agrees_with_the_deque(
        9,
        Duration::from_secs(3 * 3600),
        2,
        6_000_000_000,
        6,
        Spills::AndReturns,
    );
}

#[test]
fn the_table_finds_drops_and_keeps_logs() {
    let mut table = LogTable::default();
    let alg = SlidingWindowLog::new(100, Duration::from_secs(1)).unwrap_or_else(|e| panic!("{e}"));
    let now = Timestamp::from_secs(1_800_000_000);
    for hash in 1..=1_000u64 {
        let mut log = CompactLog::default();
        log.step(&alg, now, (hash % 20) as u32 + 1, true);
        table.insert(hash, log);
    }
    assert_eq!(table.len(), 1_000);
    for hash in (1..=1_000u64).step_by(2) {
        assert!(table.remove(hash).is_some());
    }
    assert!(table.remove(1).is_none());
    table.retain(|log| log.total() > 15);
    for hash in 1..=1_000u64 {
        let want = (hash % 2 == 0 && hash % 20 + 1 > 15).then_some(hash % 20 + 1);
        let got = table.get(hash).map(|log| lock(log).total());
        assert_eq!(got, want, "hash {hash}");
    }
    assert_eq!(table.len(), 100);
}

/// Through the store (shared and exclusive paths, sweeps, spills), keys with limits below and
/// above the inline room decide exactly as the algorithm on its own deque.
#[test]
fn the_store_decides_as_the_algorithm_below_and_above_the_inline_room() {
    use crate::store::{Check, MemoryStore};
    use crate::{Policy, Quota};
    use std::collections::HashMap;

    for (limit, max_cost) in [(3, 2), (7, 3), (25, 4), (2_000, 400)] {
        let window = Duration::from_millis(400);
        let store = MemoryStore::builder().shards(2).build();
        let quota = Quota::sliding_window_log(limit, window).unwrap_or_else(|e| panic!("{e}"));
        let Quota::SlidingWindowLog(alg) = quota.clone() else {
            unreachable!("a sliding log quota");
        };
        let policy = Policy::new("log", quota).unwrap_or_else(|e| panic!("{e}"));
        let mut model: HashMap<u64, SlidingWindowLogState> = HashMap::new();
        let mut rng = Xorshift(u64::from(limit) * 7 + 1);
        let mut now = Timestamp::from_secs(1_800_000_000);
        for step in 0..6_000 {
            now = now.saturating_add(Duration::from_micros(match rng.below(10) {
                0..=3 => 0,
                4..=8 => rng.below(30_000),
                _ => rng.below(900_000),
            }));
            if step % 500 == 0 {
                store.purge_expired(now);
            }
            let key = rng.below(5);
            let cost = rng.below(max_cost + 1) as u32;
            let key_bytes = key.to_le_bytes();
            let got = store.apply_now(now, &[Check::new(&policy, &key_bytes, cost)]);
            let want = alg.check(model.entry(key).or_default(), now, cost);
            let want = want.into_decision(policy.shared_name());
            assert_eq!(got.as_slice(), [want], "limit {limit} step {step}");
        }
    }
}

/// Short (inline) logs are held to the byte budget too: a flood of new keys evicts other logs
/// and never the client being denied.
#[test]
fn inline_logs_stay_within_the_budget_and_keep_the_denied_key() {
    use crate::store::{Check, MemoryStore};
    use crate::{Policy, Quota};

    const BUDGET: usize = 32 << 10;
    let store = MemoryStore::builder()
        .shards(1)
        .max_log_bytes(BUDGET)
        .build();
    let quota =
        Quota::sliding_window_log(5, Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}"));
    let policy = Policy::new("log", quota).unwrap_or_else(|e| panic!("{e}"));
    let now = Timestamp::from_secs(1_800_000_000);
    for _ in 0..5 {
        assert!(
            store
                .apply_now(now, &[Check::new(&policy, b"abuser", 1)])
                .allowed()
        );
    }
    assert_eq!(
        store.log_bytes(),
        LOG_KEY_BYTES,
        "five entries fit the record"
    );
    assert!(
        !store
            .apply_now(now, &[Check::new(&policy, b"abuser", 1)])
            .allowed()
    );
    let later = now.saturating_add(Duration::from_secs(1));
    for i in 0u32..5_000 {
        store.apply_now(later, &[Check::new(&policy, &i.to_le_bytes(), 1)]);
        assert!(
            store.log_bytes() <= BUDGET,
            "{} bytes after {i} keys",
            store.log_bytes()
        );
    }
    assert!(
        store.len() < 1_000,
        "logs were evicted: {} keys",
        store.len()
    );
    let d = store.apply_now(later, &[Check::new(&policy, b"abuser", 1)]);
    assert!(!d.allowed(), "the denied key's log was evicted");
}

/// A spilled log keeps its newest entry in the record: requests at that same microsecond merge
/// there and leave the deque alone, and a later one moves it to the deque.
#[test]
fn a_spilled_log_merges_same_microsecond_requests_in_the_record() {
    // More entries than a record packs, a microsecond apart.
    const LONG: usize = packed::MAX_LEN + 2;
    let alg =
        SlidingWindowLog::new(1_000_000, Duration::from_secs(1)).unwrap_or_else(|e| panic!("{e}"));
    let mut log = CompactLog::default();
    let start = Timestamp::from_secs(1_800_000_000);
    for i in 0..LONG as u64 {
        log.step(
            &alg,
            start.saturating_add(Duration::from_micros(i)),
            1,
            true,
        );
    }
    let older_len = |log: &CompactLog| match log {
        CompactLog::Spilled { older, .. } => older.len(),
        CompactLog::Inline(_) => panic!("a log of {LONG} entries is inline"),
    };
    assert_eq!(older_len(&log), LONG - 1);
    let last = start.saturating_add(Duration::from_micros(LONG as u64 - 1));
    for _ in 0..100 {
        log.step(&alg, last, 1, true);
    }
    assert_eq!(
        older_len(&log),
        LONG - 1,
        "same-microsecond requests stay in the record"
    );
    assert_eq!(log.newest_time(), Some(last.as_micros()));
    assert_eq!(log.total(), LONG as u64 + 100);
    log.step(&alg, last.saturating_add(Duration::from_micros(1)), 1, true);
    assert_eq!(older_len(&log), LONG);
    assert_eq!(log.entries().last(), Some((last.as_micros() + 1, 1)));
    assert_eq!(log.entries().nth(LONG - 1), Some((last.as_micros(), 101)));
}

/// The ring of a spilled log against `VecDeque`, through growth, wrap-around and shrinking.
#[test]
fn the_heap_ring_behaves_as_a_deque() {
    use std::collections::VecDeque;
    let mut rng = Xorshift(7);
    let mut ring = HeapEntries::new([(1, 1), (2, 2)]);
    let mut deque: VecDeque<(u64, u32)> = [(1, 1), (2, 2)].into();
    for step in 0..50_000u64 {
        match rng.below(10) {
            0..=4 => {
                ring.push_back((step, step as u32));
                deque.push_back((step, step as u32));
            }
            5..=7 => assert_eq!(ring.pop_front(), deque.pop_front(), "step {step}"),
            8 => assert_eq!(ring.pop_back(), deque.pop_back(), "step {step}"),
            _ => ring.resize(ring.len() * 2),
        }
        assert_eq!(ring.len(), deque.len());
        assert!(ring.capacity() >= ring.len());
        assert_eq!(ring.front(), deque.front().copied());
        let i = rng.below(deque.len() as u64 + 2) as usize;
        assert_eq!(ring.get(i), deque.get(i).copied(), "step {step} entry {i}");
    }
}

/// The logs' table (a home of one record) against a set, through inserts and removes of hashes
/// crowded into few homes, so that probe runs wrap and removals shift records back.
#[test]
fn the_log_table_agrees_with_a_set() {
    let mut table = LogTable::default();
    let mut model = std::collections::HashSet::new();
    let mut rng = Xorshift(0x9e37_79b9_7f4a_7c15);
    for _ in 0..50_000 {
        // The top bits, which pick the home, from a small set.
        let hash = super::super::table::identity((rng.below(5) << 61) | rng.below(400));
        match rng.below(3) {
            0 => {
                if model.insert(hash) {
                    table.insert(hash, CompactLog::default());
                }
            }
            1 => assert_eq!(table.remove(hash).is_some(), model.remove(&hash)),
            _ => assert_eq!(table.get(hash).is_some(), model.contains(&hash)),
        }
        assert_eq!(table.len(), model.len());
    }
    let mut seen = Vec::new();
    table.for_each(|hash, _| seen.push(hash));
    seen.sort_unstable();
    let mut expected: Vec<u64> = model.into_iter().collect();
    expected.sort_unstable();
    assert_eq!(seen, expected);
}

/// Charges past `u32::MAX` in all (forced charges, never refused): the total stops there, the
/// entries sum to it, and giving them back or letting them leave never takes it below zero
/// (it used to underflow: a panic in a debug build, a wrapped total in a release one).
#[test]
fn a_total_past_u32_max_stops_there_and_comes_back_down_exactly() {
    let mut log = CompactLog::default();
    log.push(1_000, 3);
    log.spill();
    log.push(2_000, u32::MAX - 10);
    log.push(3_000, u32::MAX);
    log.push(3_000, 7);
    assert_eq!(log.total(), u64::from(u32::MAX));
    let sum: u64 = log.entries().map(|(_, c)| u64::from(c)).sum();
    assert_eq!(sum, u64::from(u32::MAX), "the entries sum to the total");
    log.take_newest(5);
    assert_eq!(log.total(), u64::from(u32::MAX) - 5);
    let mut pops = 0;
    while log.newest_time().is_some() {
        log.pop_oldest();
        pops += 1;
        assert!(pops < 10, "the log empties");
    }
    assert_eq!(log.total(), 0);
}
