//! The memory store's bounds: idle keys go once their quota has reset, `max_keys` holds under a
//! flood of a million unique keys without evicting the clients that matter, and the sliding
//! logs stay within their byte budget, keeping the client that is being denied.

use std::time::Duration;

use tollgate::{Check, MemoryStore, Policy, Quota, Rate, Timestamp};

const NOW: Timestamp = Timestamp::from_secs(1_800_000_000);

#[test]
fn max_keys_holds_under_a_flood_of_unique_keys() -> Result<(), Box<dyn std::error::Error>> {
    let rate: Rate = "1/s".parse()?;
    for quota in [
        Quota::token_bucket(10, rate)?,
        Quota::fixed_window(10, Duration::from_secs(60))?,
        Quota::sliding_window_counter(10, Duration::from_secs(60))?,
        Quota::sliding_window_log(10, Duration::from_secs(60))?,
    ] {
        let store = MemoryStore::builder().max_keys(10_000).build();
        let policy = Policy::new("flood", quota)?;
        // An abuser uses up its quota and keeps getting denied throughout the flood.
        for _ in 0..10 {
            assert!(
                store
                    .apply_now(NOW, &[Check::new(&policy, b"abuser", 1)])
                    .allowed()
            );
        }
        for i in 0u32..1_000_000 {
            let key = i.to_le_bytes();
            store.apply_now(NOW, &[Check::new(&policy, &key, 1)]);
            if i % 100_000 == 0 {
                assert!(store.len() <= 10_000, "{policy}: {} keys", store.len());
                let d = store.apply_now(NOW, &[Check::new(&policy, b"abuser", 1)]);
                assert!(
                    !d.allowed(),
                    "{policy}: the abuser was evicted and got a fresh quota"
                );
            }
        }
        assert!(store.len() <= 10_000, "{policy}: {} keys", store.len());
        assert!(
            store.len() >= 5_000,
            "{policy}: eviction is batched, not wholesale"
        );
        let d = store.apply_now(NOW, &[Check::new(&policy, b"abuser", 1)]);
        assert!(!d.allowed(), "{policy}: the abuser survived the flood");
    }
    Ok(())
}

#[test]
fn idle_keys_are_dropped_once_their_quota_has_reset() -> Result<(), Box<dyn std::error::Error>> {
    let store = MemoryStore::new();
    let policy = Policy::new(
        "idle",
        Quota::sliding_window_counter(10, Duration::from_secs(1))?,
    )?;
    for i in 0u32..1_000 {
        store.apply_now(NOW, &[Check::new(&policy, &i.to_le_bytes(), 1)]);
    }
    assert_eq!(store.len(), 1_000);
    // The counts still weigh in the next window: nothing may go yet.
    assert_eq!(
        store.purge_expired(NOW.saturating_add(Duration::from_millis(1_500))),
        0
    );
    // Two windows on, every estimate is zero.
    assert_eq!(
        store.purge_expired(NOW.saturating_add(Duration::from_secs(2))),
        1_000
    );
    assert!(store.is_empty());
    Ok(())
}

#[test]
fn growing_store_sweeps_expired_keys_by_itself() -> Result<(), Box<dyn std::error::Error>> {
    let store = MemoryStore::builder().shards(1).build();
    let policy = Policy::new("grow", Quota::fixed_window(10, Duration::from_secs(1))?)?;
    for round in 0u64..20 {
        let now = NOW.saturating_add(Duration::from_secs(round));
        for i in 0u32..500 {
            store.apply_now(
                now,
                &[Check::new(
                    &policy,
                    &(round as u32 * 1_000 + i).to_le_bytes(),
                    1,
                )],
            );
        }
    }
    // 20 rounds × 500 keys, but each round's keys expire by the next: sweeps keep it small.
    assert!(store.len() <= 2_000, "{} keys", store.len());
    Ok(())
}

/// The flood comes *after* the abuser, so every flood key expires later than the abuser's
/// bucket: evicting by expiry alone would hand the abuser a fresh bucket. Eviction goes by the
/// share of the quota in use, and the abuser's is all of it.
#[test]
fn a_later_flood_does_not_evict_the_denied_abuser() -> Result<(), Box<dyn std::error::Error>> {
    let store = MemoryStore::builder().max_keys(1_000).build();
    let policy = Policy::new("bucket", Quota::token_bucket(10, "1/s".parse()?)?)?;
    for _ in 0..10 {
        assert!(
            store
                .apply_now(NOW, &[Check::new(&policy, b"abuser", 1)])
                .allowed()
        );
    }
    // 9.5 s on, the abuser's bucket (full again at NOW + 10 s) has refilled 9 tokens; it spends
    // them and is denied. The flood's buckets are full again a second after each request.
    let later = NOW.saturating_add(Duration::from_millis(9_500));
    while store
        .apply_now(later, &[Check::new(&policy, b"abuser", 1)])
        .allowed()
    {}
    for i in 0u32..100_000 {
        let now = later.saturating_add(Duration::from_micros(u64::from(i)));
        store.apply_now(now, &[Check::new(&policy, &i.to_le_bytes(), 1)]);
    }
    assert!(store.len() <= 1_000, "{} keys", store.len());
    let end = later.saturating_add(Duration::from_millis(100));
    let d = store.apply_now(end, &[Check::new(&policy, b"abuser", 1)]);
    assert!(
        !d.allowed(),
        "the abuser was evicted and got a fresh bucket"
    );
    Ok(())
}

/// Sliding logs are held to `max_log_bytes`: a flood of keys evicts other logs, never the
/// abuser's full one, and the bytes stay within the budget (plus the one log being written).
#[test]
fn sliding_logs_stay_within_their_byte_budget() -> Result<(), Box<dyn std::error::Error>> {
    const BUDGET: usize = 64 << 10;
    let store = MemoryStore::builder()
        .shards(1)
        .max_log_bytes(BUDGET)
        .build();
    let policy = Policy::new(
        "log",
        Quota::sliding_window_log(1_000, Duration::from_secs(60))?,
    )?;
    // The abuser logs 1,000 requests (each its own microsecond, so each its own entry).
    for i in 0..1_000u64 {
        let now = NOW.saturating_add(Duration::from_micros(i));
        assert!(
            store
                .apply_now(now, &[Check::new(&policy, b"abuser", 1)])
                .allowed()
        );
    }
    let abuser_bytes = store.log_bytes();
    assert!(
        abuser_bytes > 16_000,
        "{abuser_bytes} bytes for 1,000 entries"
    );
    let later = NOW.saturating_add(Duration::from_millis(10));
    for i in 0u32..5_000 {
        for _ in 0..3 {
            store.apply_now(later, &[Check::new(&policy, &i.to_le_bytes(), 1)]);
        }
        assert!(
            store.log_bytes() <= BUDGET + 1_024,
            "{} bytes after {i} keys",
            store.log_bytes()
        );
    }
    assert!(
        store.len() < 20_000,
        "logs were evicted: {} keys",
        store.len()
    );
    let d = store.apply_now(later, &[Check::new(&policy, b"abuser", 1)]);
    assert!(!d.allowed(), "the abuser's log was evicted");
    Ok(())
}

/// States decided at a later instant than the one an eviction runs at (a clock stepped back,
/// callers with their own clocks) are ranked like any other, for every algorithm: the eviction
/// once overflowed on a token bucket whose bucket was further ahead than a full one.
#[test]
fn eviction_at_an_earlier_instant_than_the_states() -> Result<(), Box<dyn std::error::Error>> {
    let rate: Rate = "1/s".parse()?;
    let quotas = [
        Quota::token_bucket(3, rate)?,
        Quota::leaky_bucket(rate, 3)?,
        Quota::fixed_window(3, Duration::from_secs(1))?,
        Quota::sliding_window_counter(3, Duration::from_secs(1))?,
        Quota::sliding_window_log(3, Duration::from_secs(1))?,
    ];
    for quota in quotas {
        let store = MemoryStore::builder().max_keys(64).build();
        let policy = Policy::new("ahead", quota)?;
        let later = NOW.saturating_add(Duration::from_secs(3_600));
        for i in 0u32..64 {
            // Each key is left deep in its quota an hour from NOW.
            for _ in 0..3 {
                store.apply_now(later, &[Check::new(&policy, &i.to_le_bytes(), 1)]);
            }
        }
        // New keys at NOW make room by ranking the keys decided an hour later.
        for i in 64u32..256 {
            let d = store.apply_now(NOW, &[Check::new(&policy, &i.to_le_bytes(), 1)]);
            assert!(d.allowed(), "{policy}: a new key is admitted");
        }
        assert!(store.len() <= 64, "{policy}: {} keys", store.len());
    }
    Ok(())
}
