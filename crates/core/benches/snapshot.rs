//! The memory store's snapshot at 1,000,000 keys: how long writing one takes and how large it
//! is, how much memory the process gains while it runs (one shard's entries at a time, not a
//! copy of the store), what it does to decision latency (p50/p99/p99.9 of single checks on
//! another thread, with and without snapshots running back to back), and how long restoring it
//! takes.
//!
//! Latencies are wall-clock per decision (two `Instant` reads each); compare the two columns of
//! one run, not runs on different machines. Resident memory from `/proc/self/statm` (Linux).
//!
//! `cargo bench -p tollgate --bench snapshot` (`-- 200000` for fewer keys)
//!
//! `-- restore` (with `ROUNDS=n`, default 5) times only restores, each the best and median of
//! its rounds, of stores with different pasts: one that never reached `max_keys`, one that did
//! and evicted (twice its keys through it), that one's restore restored again, and the evicted
//! one into a store of 1,000 keys.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufReader, BufWriter, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate::{Check, MemoryStore, Policy, Quota, Timestamp};

const T0: Timestamp = Timestamp::from_secs(1_800_057_600);

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn percentiles(mut v: Vec<u32>) -> String {
    v.sort_unstable();
    let at = |q: f64| v[((v.len() as f64 - 1.0) * q) as usize];
    format!(
        "p50 {:>6} ns  p99 {:>6} ns  p99.9 {:>7} ns  max {:>9} ns  ({} decisions)",
        at(0.50),
        at(0.99),
        at(0.999),
        v.last().copied().unwrap_or(0),
        v.len()
    )
}

/// Single checks on random known keys for `run`: each one's latency in nanoseconds.
fn decide_for(store: &MemoryStore, policy: &Policy, keys: u64, run: Duration) -> Vec<u32> {
    let mut out = Vec::with_capacity(4_000_000);
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let start = Instant::now();
    while start.elapsed() < run {
        for _ in 0..256 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let key = (seed % keys).to_le_bytes();
            let t = Instant::now();
            let d = store.apply_one_now(T0, &Check::new(policy, &key, 0));
            let ns = t.elapsed().as_nanos();
            std::hint::black_box(d);
            out.push(u32::try_from(ns).unwrap_or(u32::MAX));
        }
    }
    out
}

fn main() {
    let keys: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    if std::env::args().any(|a| a == "restore") {
        let rounds = std::env::var("ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5);
        restores(keys, rounds);
        return;
    }
    let dir = std::env::temp_dir().join(format!("tollgate-snapshot-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state");

    let policy = Policy::new(
        "api",
        Quota::fixed_window(100, Duration::from_secs(3600)).unwrap(),
    )
    .unwrap();
    let store = MemoryStore::builder().max_keys(2 * keys as usize).build();
    for i in 0..keys {
        store.apply_now(T0, &[Check::new(&policy, &i.to_le_bytes(), 1)]);
    }
    println!(
        "{} keys of one fixed-window policy, default shards",
        store.len()
    );

    // One snapshot, alone: time, size, memory gained meanwhile.
    let before = resident_bytes();
    let peak = Arc::new(AtomicU64::new(before));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (Arc::clone(&peak), Arc::clone(&done));
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(resident_bytes(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let t = Instant::now();
    let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(&path).unwrap());
    let written = store.write_snapshot(T0, &mut out).unwrap().keys;
    out.flush().unwrap();
    out.into_inner().unwrap().sync_all().unwrap();
    let took = t.elapsed();
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let size = std::fs::metadata(&path).unwrap().len();
    println!(
        "snapshot: {written} keys, {:.1} MB, {:.0} ms (fsync included), resident memory +{:.1} MB while it ran",
        size as f64 / 1e6,
        took.as_secs_f64() * 1e3,
        peak.load(Ordering::Relaxed).saturating_sub(before) as f64 / 1e6
    );

    // Decision latency without, then with, snapshots running back to back on another thread.
    let run = Duration::from_secs(3);
    println!(
        "decisions alone:            {}",
        percentiles(decide_for(&store, &policy, keys, run))
    );
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (store, stop, path) = (store.clone(), Arc::clone(&stop), dir.join("busy"));
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let mut out =
                    BufWriter::with_capacity(1 << 20, std::fs::File::create(&path).unwrap());
                store.write_snapshot(T0, &mut out).unwrap();
                out.flush().unwrap();
                n += 1;
            }
            n
        })
    };
    let during = decide_for(&store, &policy, keys, run);
    stop.store(true, Ordering::Relaxed);
    let snapshots = writer.join().unwrap();
    println!(
        "decisions during snapshots: {}  ({snapshots} snapshots)",
        percentiles(during)
    );

    // Restore.
    let t = Instant::now();
    let mut input = BufReader::with_capacity(1 << 20, std::fs::File::open(&path).unwrap());
    let (restored, counts) = MemoryStore::restore_snapshot(
        MemoryStore::builder().max_keys(2 * keys as usize),
        T0,
        &mut input,
    )
    .unwrap();
    println!(
        "restore: {} keys in {:.0} ms",
        counts.restored,
        t.elapsed().as_secs_f64() * 1e3
    );
    assert_eq!(restored.len() as u64, keys);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Restores `bytes` into stores built by `builder`, `rounds` times: the best and the median
/// time, and the last store.
fn timed_restore(
    what: &str,
    builder: impl Fn() -> tollgate::store::MemoryStoreBuilder,
    bytes: &[u8],
    rounds: usize,
) -> MemoryStore {
    let mut times = Vec::with_capacity(rounds);
    let mut last = None;
    for _ in 0..rounds.max(1) {
        drop(last.take());
        let t = Instant::now();
        let restored = MemoryStore::restore_snapshot(builder(), T0, &mut &bytes[..]).unwrap();
        times.push(t.elapsed());
        last = Some(restored);
    }
    let (store, counts) = last.unwrap();
    times.sort_unstable();
    println!(
        "{what:<44} {:>7} kept {:>7} evicted   best {:>8.1} ms  median {:>8.1} ms  ({} rounds)",
        counts.restored,
        counts.evicted,
        times[0].as_secs_f64() * 1e3,
        times[times.len() / 2].as_secs_f64() * 1e3,
        times.len()
    );
    store
}

/// Restores of stores with different pasts, one fixed-window policy: one that never reached
/// `max_keys`; one that did, twice its keys having gone through it (it evicted: which keys it
/// kept decides where they sit in their tables); that one's restore, snapshotted and restored
/// again; and the evicted one into a store of 1,000 keys, which drops nearly all of them.
fn restores(keys: u64, rounds: usize) {
    let policy = Policy::new(
        "api",
        Quota::fixed_window(100, Duration::from_secs(3600)).unwrap(),
    )
    .unwrap();
    let snapshot = |store: &MemoryStore| {
        let mut bytes = Vec::new();
        store.write_snapshot(T0, &mut bytes).unwrap();
        bytes
    };
    let roomy = || MemoryStore::builder().max_keys(2 * keys as usize);
    let bound = || MemoryStore::builder().max_keys(keys as usize);
    let never = roomy().build();
    for i in 0..keys {
        never.apply_now(T0, &[Check::new(&policy, &i.to_le_bytes(), 1)]);
    }
    let bytes = snapshot(&never);
    drop(never);
    timed_restore("never evicted", roomy, &bytes, rounds);
    drop(bytes);
    let full = bound().build();
    for i in 0..2 * keys {
        full.apply_now(T0, &[Check::new(&policy, &i.to_le_bytes(), 1)]);
    }
    let bytes = snapshot(&full);
    drop(full);
    let again = timed_restore(
        "evicted (2 x max_keys keys through it)",
        bound,
        &bytes,
        rounds,
    );
    let bytes2 = snapshot(&again);
    drop(again);
    timed_restore("  its restore's snapshot, restored", bound, &bytes2, rounds);
    drop(bytes2);
    timed_restore(
        "  into max_keys = 1000",
        || MemoryStore::builder().max_keys(1000),
        &bytes,
        rounds,
    );
}
