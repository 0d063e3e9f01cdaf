//! Many threads on one key never over-admit — whether its state is updated by compare-and-swap
//! on its packed word, under its own mutex (a spilled state, a sliding log) or while it moves
//! from one to the other — and batches that lock shards in opposite orders never deadlock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use tollgate::{Check, MemoryStore, Policy, Quota, Rate, Timestamp};

const NOW: Timestamp = Timestamp::from_secs(1_800_000_000);

fn hammer(store: &MemoryStore, policy: &Policy, threads: usize, per_thread: usize) -> u64 {
    hammer_at(store, policy, NOW, threads, per_thread)
}

fn hammer_at(
    store: &MemoryStore,
    policy: &Policy,
    now: Timestamp,
    threads: usize,
    per_thread: usize,
) -> u64 {
    let admitted = Arc::new(AtomicU64::new(0));
    thread::scope(|scope| {
        for _ in 0..threads {
            let admitted = Arc::clone(&admitted);
            scope.spawn(move || {
                for _ in 0..per_thread {
                    let d = store.apply_now(now, &[Check::new(policy, b"hot", 1)]);
                    admitted.fetch_add(u64::from(d.allowed()), Ordering::Relaxed);
                }
            });
        }
    });
    admitted.load(Ordering::Relaxed)
}

#[test]
fn every_algorithm_admits_exactly_its_quota_under_contention()
-> Result<(), Box<dyn std::error::Error>> {
    let rate: Rate = "1/1h".parse()?;
    let quotas = [
        Quota::fixed_window(5_000, Duration::from_secs(60))?,
        Quota::sliding_window_log(5_000, Duration::from_secs(60))?,
        Quota::sliding_window_counter(5_000, Duration::from_secs(60))?,
        Quota::token_bucket(5_000, rate)?,
        Quota::leaky_bucket(rate, 4_999)?,
    ];
    for quota in quotas {
        let store = MemoryStore::new();
        let policy = Policy::new("hot", quota)?;
        // 8 threads × 1,000 = 8,000 attempts at one instant against a quota of 5,000.
        assert_eq!(hammer(&store, &policy, 8, 1_000), 5_000, "{policy}");
    }
    Ok(())
}

/// States that do not fit a word: a sliding window counter whose counts pass 65,535 (it starts
/// packed and spills midway, while eight threads race on it) and a fixed window before 2024
/// (spilled from the first request).
#[test]
fn spilled_and_spilling_states_admit_exactly_their_quota() -> Result<(), Box<dyn std::error::Error>>
{
    let store = MemoryStore::new();
    let spilling = Policy::new(
        "spilling",
        Quota::sliding_window_counter(70_000, Duration::from_secs(60))?,
    )?;
    assert_eq!(hammer(&store, &spilling, 8, 10_000), 70_000);
    let old = Policy::new("old", Quota::fixed_window(5_000, Duration::from_secs(60))?)?;
    assert_eq!(
        hammer_at(&store, &old, Timestamp::from_secs(1_000_000), 8, 1_000),
        5_000
    );
    Ok(())
}

/// Threads on different keys do not disturb each other's counts: each of 64 keys, spread over
/// the shards and hammered by four threads at once, admits exactly its own quota.
#[test]
fn many_keys_many_threads_each_key_exact() -> Result<(), Box<dyn std::error::Error>> {
    let store = MemoryStore::builder().shards(16).build();
    let policy = Policy::new("k", Quota::token_bucket(100, "1/h".parse()?)?)?;
    let admitted: Vec<AtomicU64> = (0..64).map(|_| AtomicU64::new(0)).collect();
    thread::scope(|scope| {
        for t in 0..4u64 {
            let (store, policy, admitted) = (&store, &policy, &admitted);
            scope.spawn(move || {
                for i in 0..20_000u64 {
                    let k = ((i * 7 + t * 13) % 64) as usize;
                    let key = (k as u64).to_le_bytes();
                    let d = store.apply_now(NOW, &[Check::new(policy, &key, 1)]);
                    admitted[k].fetch_add(u64::from(d.allowed()), Ordering::Relaxed);
                }
            });
        }
    });
    for (k, a) in admitted.iter().enumerate() {
        assert_eq!(a.load(Ordering::Relaxed), 100, "key {k}");
    }
    Ok(())
}

/// Known keys decided under the shared lock stay exact while other threads take their shards
/// exclusively: a thread adding fresh keys (the tables grow under the exclusive lock, and move
/// every word), one sweeping, and one deciding batches. Twenty deciding threads, more than the
/// shard locks have per-thread slots, so some read at the gate instead.
#[test]
fn known_keys_stay_exact_while_tables_grow_and_sweep() -> Result<(), Box<dyn std::error::Error>> {
    let store = MemoryStore::builder().shards(4).build();
    let policy = Policy::new("k", Quota::token_bucket(1_000, "1/h".parse()?)?)?;
    let other = Policy::new(
        "other",
        Quota::fixed_window(1_000_000, Duration::from_secs(60))?,
    )?;
    let admitted: Vec<AtomicU64> = (0..16).map(|_| AtomicU64::new(0)).collect();
    thread::scope(|scope| {
        for t in 0..20_u64 {
            let (store, policy, admitted) = (&store, &policy, &admitted);
            scope.spawn(move || {
                for i in 0..2_000_u64 {
                    let k = ((i + t) % 16) as usize;
                    let key = format!("hot-{k}");
                    let d = store.apply_now(NOW, &[Check::new(policy, key.as_bytes(), 1)]);
                    admitted[k].fetch_add(u64::from(d.allowed()), Ordering::Relaxed);
                }
            });
        }
        let (store, policy, other) = (&store, &policy, &other);
        scope.spawn(move || {
            for i in 0..60_000_u64 {
                store.apply_now(NOW, &[Check::new(policy, &i.to_le_bytes(), 1)]);
            }
        });
        scope.spawn(move || {
            for _ in 0..200 {
                store.purge_expired(NOW);
                thread::yield_now();
            }
        });
        scope.spawn(move || {
            for i in 0..5_000_u64 {
                let key = (i % 100).to_le_bytes();
                store.apply_now(
                    NOW,
                    &[Check::new(other, &key, 1), Check::new(other, b"b", 1)],
                );
            }
        });
    });
    for (k, a) in admitted.iter().enumerate() {
        assert_eq!(a.load(Ordering::Relaxed), 1_000, "key {k}");
    }
    // The fresh keys all landed too: each has spent one of its thousand.
    for i in [0_u64, 29_999, 59_999] {
        let d = store.apply_now(NOW, &[Check::new(&policy, &i.to_le_bytes(), 0)]);
        assert_eq!(d.as_slice()[0].remaining, 999, "fresh key {i}");
    }
    Ok(())
}

#[test]
fn opposite_order_batches_neither_deadlock_nor_over_admit() -> Result<(), Box<dyn std::error::Error>>
{
    let store = MemoryStore::builder().shards(64).build();
    let a = Policy::new("a", Quota::fixed_window(3_000, Duration::from_secs(60))?)?;
    let b = Policy::new(
        "b",
        Quota::fixed_window(1_000_000, Duration::from_secs(60))?,
    )?;
    let admitted = AtomicU64::new(0);
    thread::scope(|scope| {
        for t in 0..4 {
            let (store, a, b, admitted) = (&store, &a, &b, &admitted);
            scope.spawn(move || {
                for i in 0..2_000u32 {
                    let other = (i % 50).to_be_bytes();
                    let batch = if t % 2 == 0 {
                        [Check::new(a, b"shared", 1), Check::new(b, &other, 1)]
                    } else {
                        [Check::new(b, &other, 1), Check::new(a, b"shared", 1)]
                    };
                    let d = store.apply_now(NOW, &batch);
                    admitted.fetch_add(u64::from(d.allowed()), Ordering::Relaxed);
                }
            });
        }
    });
    assert_eq!(admitted.load(Ordering::Relaxed), 3_000);
    // Policy b consumed exactly for the admitted requests, none for the denied ones.
    let used_b: u64 = (0..50u32)
        .map(|i| {
            let key = i.to_be_bytes();
            let d = store.apply_now(NOW, &[Check::new(&b, &key, 0)]);
            1_000_000 - d.as_slice()[0].remaining
        })
        .sum();
    assert_eq!(used_b, 3_000);
    Ok(())
}
