//! The memory store's bounds: idle keys go once their quota has reset, and `max_keys` holds
//! under a flood of a million unique keys without evicting the clients that matter.

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
