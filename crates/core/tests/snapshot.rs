//! The memory store's snapshot: what is written comes back deciding exactly as before, for
//! every algorithm; expired keys stay behind; a damaged snapshot restores nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use tollgate::algorithm::LeakyBucket;
use tollgate::store::snapshot::SnapshotError;
use tollgate::{Calendar, CalendarUnit, Check, MemoryStore, Policy, Quota, Timestamp};

const T0: Timestamp = Timestamp::from_secs(1_800_057_600);

fn policies() -> Vec<Policy> {
    let second = Duration::from_secs(1);
    let minute = Duration::from_secs(60);
    let quotas = vec![
        Quota::fixed_window(10, minute).unwrap(),
        // A window under 100 ms spills out of the packed word.
        Quota::fixed_window(10, Duration::from_millis(10)).unwrap(),
        Quota::fixed_calendar(
            10,
            Calendar::new(CalendarUnit::Month, "Europe/Lisbon").unwrap(),
        )
        .unwrap(),
        Quota::sliding_window_log(40, minute).unwrap(),
        Quota::sliding_window_counter(10, minute).unwrap(),
        Quota::token_bucket(10, "1/s".parse().unwrap()).unwrap(),
        Quota::LeakyBucket(
            LeakyBucket::new("2/s".parse().unwrap(), 5)
                .unwrap()
                .with_max_delay(second),
        ),
        Quota::concurrency(3, minute).unwrap(),
    ];
    quotas
        .into_iter()
        .enumerate()
        .map(|(i, q)| Policy::new(&format!("p{i}-{}", q.kind()), q).unwrap())
        .collect()
}

fn keys() -> Vec<Vec<u8>> {
    (0..50u32)
        .map(|i| format!("key-{i}").into_bytes())
        .collect()
}

/// Traffic on every policy and key: key i spends i % 13 (a sliding log with long logs).
fn load(store: &MemoryStore, policies: &[Policy], now: Timestamp) {
    for p in policies {
        for (i, k) in keys().iter().enumerate() {
            for n in 0..(i % 13) {
                let at = now.saturating_add(Duration::from_micros(n as u64 * 1_000));
                let mut check = Check::new(p, k, 1);
                check.permit = (i * 100 + n + 1) as u64;
                store.apply_now(at, &[check]);
            }
        }
    }
}

fn snapshot(store: &MemoryStore, now: Timestamp) -> Vec<u8> {
    let mut bytes = Vec::new();
    store.write_snapshot(now, &mut bytes).unwrap();
    bytes
}

#[test]
fn a_restored_store_decides_as_the_original() {
    let policies = policies();
    let store = MemoryStore::new();
    load(&store, &policies, T0);
    let now = T0.saturating_add(Duration::from_millis(50));
    let bytes = snapshot(&store, now);
    let (restored, counts) =
        MemoryStore::restore_snapshot(MemoryStore::builder(), now, &mut &bytes[..]).unwrap();
    assert!(counts.restored > 0, "{counts:?}");
    assert_eq!(counts.unreadable, 0);
    // Later traffic decides the same on both, key by key (permits aside: they are not kept).
    for step in 0..30u64 {
        let at = now.saturating_add(Duration::from_millis(step * 137));
        for p in policies
            .iter()
            .filter(|p| !matches!(p.quota(), Quota::Concurrency(_)))
        {
            for k in keys() {
                let check = Check::new(p, &k, (step % 3) as u32);
                let a = store.apply_now(at, &[check]);
                let b = restored.apply_now(at, &[check]);
                assert_eq!(
                    a,
                    b,
                    "{} {:?} step {step}",
                    p.name(),
                    String::from_utf8_lossy(&k)
                );
            }
        }
    }
    // Concurrency permits were not kept: their requests ended with the old process.
    let conc = policies.last().unwrap();
    let peek = restored.apply_now(now, &[Check::new(conc, b"key-12", 0)]);
    assert_eq!(peek.into_first().map(|d| d.remaining), Some(3));
}

#[test]
fn expired_keys_are_not_restored() {
    let policies = policies();
    let store = MemoryStore::new();
    load(&store, &policies, T0);
    let bytes = snapshot(&store, T0);
    // Two days on, only the monthly calendar window (the month is not over) holds anything.
    let later = T0.saturating_add(Duration::from_secs(2 * 86_400));
    let (restored, counts) =
        MemoryStore::restore_snapshot(MemoryStore::builder(), later, &mut &bytes[..]).unwrap();
    assert!(counts.expired > 0);
    // Every key but 0, 13, 26 and 39 spent something: 46 monthly keys.
    assert_eq!(counts.restored, 46, "{counts:?}");
    assert_eq!(restored.len(), 46);
}

#[test]
fn a_damaged_snapshot_restores_nothing() {
    let policies = policies();
    let store = MemoryStore::new();
    load(&store, &policies, T0);
    let bytes = snapshot(&store, T0);
    let restore = |b: &[u8]| MemoryStore::restore_snapshot(MemoryStore::builder(), T0, &mut &b[..]);
    // Cut anywhere: refused.
    for cut in [0, 1, 10, bytes.len() / 2, bytes.len() - 1] {
        assert!(restore(&bytes[..cut]).is_err(), "cut at {cut}");
    }
    // A changed byte anywhere: refused.
    for at in (0..bytes.len()).step_by(bytes.len() / 97 + 1) {
        let mut bad = bytes.clone();
        bad[at] ^= 0x20;
        assert!(restore(&bad).is_err(), "byte {at}");
    }
    // Another format version: said so.
    let mut future = Vec::new();
    let mut header = vec![];
    header.extend_from_slice(&99u16.to_le_bytes());
    header.extend_from_slice(&[0; 24]);
    tollgate::store::snapshot::write_frame(&mut future, 1, &header).unwrap();
    assert!(matches!(restore(&future), Err(SnapshotError::Version(99))));
}

#[test]
fn a_snapshot_streams_shard_by_shard() {
    // 200,000 keys of one policy: the snapshot holds each once, about 30 bytes a key.
    let policy = Policy::new(
        "fw",
        Quota::fixed_window(5, Duration::from_secs(60)).unwrap(),
    )
    .unwrap();
    let store = MemoryStore::builder().shards(64).build();
    for i in 0..200_000u32 {
        store.apply_now(T0, &[Check::new(&policy, &i.to_le_bytes(), 1)]);
    }
    let mut bytes = Vec::new();
    let written = store.write_snapshot(T0, &mut bytes).unwrap();
    assert_eq!(written.keys, 200_000);
    assert_eq!(written.bans, 0);
    assert!(bytes.len() < 200_000 * 32, "{} bytes", bytes.len());
    let (restored, counts) =
        MemoryStore::restore_snapshot(MemoryStore::builder().shards(8), T0, &mut &bytes[..])
            .unwrap();
    assert_eq!(counts.restored, 200_000);
    let d = restored.apply_now(T0, &[Check::new(&policy, &7u32.to_le_bytes(), 0)]);
    assert_eq!(d.into_first().map(|d| d.remaining), Some(4));
}

#[test]
fn lockouts_and_running_streaks_survive_a_restore() {
    let ban = tollgate::Ban::new(2, Duration::from_secs(60), Duration::from_secs(600)).unwrap();
    let policy = Policy::new(
        "logins",
        Quota::fixed_window(1, Duration::from_secs(10)).unwrap(),
    )
    .and_then(|p| p.with_ban(ban))
    .unwrap();
    let store = MemoryStore::new();
    let check = |store: &MemoryStore, key: &'static [u8], at: Timestamp| {
        store
            .apply_now(at, &[Check::new(&policy, key, 1)])
            .into_first()
            .unwrap()
    };
    // "banned" is denied twice (a ban); "streak" once (a streak running); "done" once, long ago.
    for key in [&b"banned"[..], b"banned", b"banned", b"streak", b"streak"] {
        check(&store, key, T0);
    }
    assert!(check(&store, b"banned", T0).ban.is_ban());
    let now = T0.saturating_add(Duration::from_secs(30));
    let mut bytes = Vec::new();
    let written = store.write_snapshot(now, &mut bytes).unwrap();
    assert_eq!(written.bans, 2, "{written:?}");
    // Cut anywhere, or with a byte changed, the file with lockout records restores nothing.
    for cut in 0..bytes.len() {
        assert!(
            MemoryStore::restore_snapshot(MemoryStore::builder(), now, &mut &bytes[..cut]).is_err(),
            "cut at {cut}"
        );
    }
    for at in (0..bytes.len()).step_by(7) {
        let mut changed = bytes.clone();
        changed[at] ^= 0x40;
        assert!(
            MemoryStore::restore_snapshot(MemoryStore::builder(), now, &mut &changed[..]).is_err(),
            "byte {at} changed"
        );
    }
    let (restored, counts) =
        MemoryStore::restore_snapshot(MemoryStore::builder(), now, &mut &bytes[..]).unwrap();
    assert_eq!(counts.bans, 2, "{counts:?}");
    let listed = restored.bans_now(now);
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].key, b"banned");
    assert_eq!(listed[0].policy, "logins");
    assert_eq!(listed[0].until, T0.saturating_add(Duration::from_secs(600)));
    // Still banned after the restore, with the window long reset.
    let d = check(&restored, b"banned", now);
    assert!(!d.allowed && d.ban.is_ban(), "{d:?}");
    // The running streak goes on: one more denial within the minute bans.
    assert!(check(&restored, b"streak", now).allowed);
    let second = check(&restored, b"streak", now);
    assert_eq!(second.ban, tollgate::BanStatus::Started, "{second:?}");
    // Once the ban is over and the streak is old, a snapshot keeps nothing of them.
    let later = T0.saturating_add(Duration::from_secs(4000));
    let bytes = snapshot(&restored, later);
    let (_, counts) =
        MemoryStore::restore_snapshot(MemoryStore::builder(), later, &mut &bytes[..]).unwrap();
    assert_eq!(counts.bans, 0, "{counts:?}");
}

#[test]
fn a_restore_into_a_smaller_store_counts_what_it_kept() {
    let policy = Policy::new(
        "fw",
        Quota::fixed_window(5, Duration::from_secs(3600)).unwrap(),
    )
    .unwrap();
    let store = MemoryStore::new();
    for i in 0..5_001u32 {
        // Key i spends i % 5 + 1: the keys differ in what they have at stake.
        store.apply_now(T0, &[Check::new(&policy, &i.to_le_bytes(), i % 5 + 1)]);
    }
    let mut bytes = Vec::new();
    assert_eq!(store.write_snapshot(T0, &mut bytes).unwrap().keys, 5_001);
    for shards in [1, 8, 32] {
        let builder = MemoryStore::builder().max_keys(100).shards(shards);
        let (small, counts) = MemoryStore::restore_snapshot(builder, T0, &mut &bytes[..]).unwrap();
        // The bound is an equal share per shard, rounded down: 100 over 32 shards is 96.
        assert_eq!(small.max_keys(), 100 / shards * shards);
        assert_eq!(counts.restored, small.len() as u64, "{counts:?}");
        assert!(small.len() <= small.max_keys(), "{counts:?}");
        assert!(
            small.len() * 10 >= small.max_keys() * 9,
            "kept {}",
            small.len()
        );
        assert_eq!(counts.restored + counts.evicted, 5_001, "{counts:?}");
        assert_eq!((counts.expired, counts.unreadable), (0, 0), "{counts:?}");
    }
    // A store large enough keeps every key, and evicts none.
    let (_, counts) =
        MemoryStore::restore_snapshot(MemoryStore::builder(), T0, &mut &bytes[..]).unwrap();
    assert_eq!((counts.restored, counts.evicted), (5_001, 0));
}

/// A snapshot written by a build whose store hashed every key with SipHash, eight-byte ones
/// too (format 1, kept as written): its keys are found again, eight-byte ones included (an
/// IPv4 address written out, an eight-character API key, a `u64`), and the restored store
/// writes snapshots that say it hashes so, which restore the same keys again.
#[test]
fn a_snapshot_of_the_format_before_restores_every_key() {
    let hour = Duration::from_secs(3600);
    let fixed = Policy::new("fixed", Quota::fixed_window(10, hour).unwrap()).unwrap();
    let bucket = Policy::new(
        "bucket",
        Quota::token_bucket(10, "10/h".parse().unwrap()).unwrap(),
    )
    .unwrap();
    // What the file holds: key i spent i + 1 of each policy at T0.
    let keys: [&[u8]; 4] = [
        b"10.0.0.1",
        b"apikey-8",
        &42u64.to_le_bytes(),
        b"customer-42",
    ];
    let bytes = include_bytes!("fixtures/store-format-1.snapshot");
    assert_eq!(
        u16::from_le_bytes([bytes[5], bytes[6]]),
        1,
        "a format 1 file"
    );
    let now = T0.saturating_add(Duration::from_secs(1));
    let (store, counts) =
        MemoryStore::restore_snapshot(MemoryStore::builder(), now, &mut &bytes[..]).unwrap();
    assert_eq!(counts.restored, 8, "{counts:?}");
    let remaining = |store: &MemoryStore| -> Vec<u64> {
        keys.iter()
            .flat_map(|k| {
                [&fixed, &bucket].map(|p| store.apply_one_now(now, &Check::new(p, k, 0)).remaining)
            })
            .collect()
    };
    let expected = vec![9, 9, 8, 8, 7, 7, 6, 6];
    assert_eq!(remaining(&store), expected);
    let again = snapshot(&store, now);
    let (store, _) =
        MemoryStore::restore_snapshot(MemoryStore::builder(), now, &mut &again[..]).unwrap();
    assert_eq!(remaining(&store), expected);
}
