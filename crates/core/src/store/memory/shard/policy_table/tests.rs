//! New keys added under the shared lock ([`PolicyTable::try_new`]), raced by threads; and a
//! concurrency table taking a reloaded limit.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::PolicyTable;
use crate::algorithm::ConcurrencyState;
use crate::store::Check;
use crate::{MemoryStore, Policy, Quota, Timestamp};

const NOW: Timestamp = Timestamp::from_secs(1_800_000_000);

fn packed_quotas() -> Result<Vec<Quota>, crate::QuotaError> {
    let rate = "1/h".parse()?;
    Ok(vec![
        Quota::fixed_window(3, Duration::from_secs(60))?,
        Quota::sliding_window_counter(3, Duration::from_secs(60))?,
        Quota::token_bucket(3, rate)?,
        Quota::leaky_bucket(rate, 2)?,
    ])
}

/// Four threads meet on the same new keys, each key first seen by several at once: every
/// key admits exactly its quota, and each is stored once (the count is exact).
#[test]
fn racing_threads_on_new_keys_admit_exactly_the_quota() -> Result<(), Box<dyn std::error::Error>> {
    const KEYS: u64 = 20_000;
    for quota in packed_quotas()? {
        let store = MemoryStore::builder().shards(4).build();
        let policy = Policy::new("p", quota)?;
        let admitted: Vec<AtomicU64> = (0..KEYS).map(|_| AtomicU64::new(0)).collect();
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let (store, policy, admitted) = (&store, &policy, &admitted);
                scope.spawn(move || {
                    // Two visits of every key per thread, in orders that overlap.
                    for i in 0..2 * KEYS {
                        let k = (i / 2 + t * 17) % KEYS;
                        let key = k.to_le_bytes();
                        let d = store.apply_now(NOW, &[Check::new(policy, &key, 1)]);
                        admitted[k as usize].fetch_add(u64::from(d.allowed()), Ordering::Relaxed);
                    }
                });
            }
        });
        for (k, a) in admitted.iter().enumerate() {
            assert_eq!(a.load(Ordering::Relaxed), 3, "{policy}: key {k}");
        }
        assert_eq!(store.len(), KEYS as usize, "{policy}");
    }
    Ok(())
}

/// A flood of new keys from several threads stays within `max_keys`: a new key is added under
/// the shared lock only while the shard would neither sweep nor evict.
#[test]
fn racing_threads_stay_within_max_keys() -> Result<(), Box<dyn std::error::Error>> {
    for quota in packed_quotas()? {
        let store = MemoryStore::builder().max_keys(2_000).shards(4).build();
        let policy = Policy::new("p", quota)?;
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let (store, policy) = (&store, &policy);
                scope.spawn(move || {
                    for i in 0..25_000u64 {
                        let key = (t << 32 | i).to_le_bytes();
                        store.apply_now(NOW, &[Check::new(policy, &key, 1)]);
                        assert!(store.len() <= store.max_keys() + 4, "{policy}");
                    }
                });
            }
        });
        assert!(store.len() <= store.max_keys(), "{policy}: {}", store.len());
    }
    Ok(())
}

/// A concurrency table takes a reloaded policy's limit, which its fingerprint leaves out:
/// a key's share of its quota, which eviction ranks keys by, is then reckoned against the
/// limit in force.
#[test]
fn a_concurrency_table_follows_its_reloaded_limit() -> Result<(), Box<dyn std::error::Error>> {
    let ttl = Duration::from_secs(60);
    let before = Policy::new("c", Quota::concurrency(2, ttl)?)?;
    let after = Policy::new("c", Quota::concurrency(8, ttl)?)?;
    assert_eq!(before.fingerprint(), after.fingerprint());
    let mut table = PolicyTable::new(&before);
    let Quota::Concurrency(alg) = before.quota() else {
        return Err("not a concurrency quota".into());
    };
    let mut state = ConcurrencyState::default();
    assert!(alg.check(&mut state, NOW, 1, 7).allowed);
    table.permits.insert(1, Mutex::new(state));
    let stake = |table: &mut PolicyTable| {
        let mut out = Vec::new();
        table.ranked(NOW, 0, &mut out);
        out.first().map(|c| c.stake)
    };
    let held = stake(&mut table);
    table.follow(&after);
    assert_eq!(table.quota, *after.quota());
    let share = stake(&mut table);
    assert!(
        share < held,
        "one slot of 8 ranks below one of 2: {share:?} {held:?}"
    );
    Ok(())
}

/// A key denied or only peeked at when new is not stored, under the shared lock as under
/// the exclusive one.
#[test]
fn new_keys_that_are_denied_or_peeked_are_not_stored() -> Result<(), Box<dyn std::error::Error>> {
    let store = MemoryStore::builder().shards(1).build();
    let policy = Policy::new("p", Quota::token_bucket(3, "1/h".parse()?)?)?;
    // The shard's table exists (one key), so later keys take the shared path.
    assert!(
        store
            .apply_now(NOW, &[Check::new(&policy, b"first", 1)])
            .allowed()
    );
    assert!(
        store
            .apply_now(NOW, &[Check::new(&policy, b"peek", 0)])
            .allowed()
    );
    assert!(
        !store
            .apply_now(NOW, &[Check::new(&policy, b"big", 4)])
            .allowed()
    );
    assert_eq!(store.len(), 1);
    Ok(())
}
