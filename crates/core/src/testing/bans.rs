//! Conformance scenarios for lockouts ([`Ban`]): every store applies the rule's state machine
//! with the check, in the same atomic step.

use std::time::Duration;

use super::{T0, one, unique};
use crate::{Ban, BanStatus, Check, Policy, Quota, Store, Timestamp};

fn banning(prefix: &str, limit: u32, after: u32, within: u64, ban_for: u64) -> Policy {
    let quota =
        Quota::fixed_window(limit, Duration::from_secs(1)).unwrap_or_else(|e| panic!("{e}"));
    let ban = Ban::new(
        after,
        Duration::from_secs(within),
        Duration::from_secs(ban_for),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    Policy::new(&unique(prefix), quota)
        .and_then(|p| p.with_ban(ban))
        .unwrap_or_else(|e| panic!("{e}"))
}

fn at(secs: u64, micros: u64) -> Timestamp {
    T0.saturating_add(Duration::from_secs(secs) + Duration::from_micros(micros))
}

/// The `after`-th denial within `within` starts a ban: that denial and every check until the
/// ban ends are refused with the ban's end as their retry time, even once the window has reset;
/// a banned check leaves the quota alone, so the key has its whole quota when the ban ends.
pub async fn ban_after_repeated_denials<S: Store>(store: &S) {
    let policy = banning("ban-basic", 2, 3, 10, 5);
    let key = unique("ban-basic-key");
    let key = key.as_bytes();
    for _ in 0..2 {
        assert!(one(store, T0, &policy, key, 1).await.allowed);
    }
    for n in 1..=2 {
        let d = one(store, T0, &policy, key, 1).await;
        assert!(!d.allowed, "denial {n}");
        assert_eq!(d.ban, BanStatus::None, "denial {n} is the quota's: {d:?}");
    }
    let third = one(store, at(0, 10), &policy, key, 1).await;
    assert!(!third.allowed);
    assert_eq!(third.ban, BanStatus::Started, "{third:?}");
    assert_eq!(third.retry_after, Some(Duration::from_secs(5)));
    assert_eq!(third.remaining, 0);
    // The window reset at T0 + 1 s; the key is still banned.
    let later = one(store, at(2, 10), &policy, key, 1).await;
    assert!(!later.allowed);
    assert_eq!(later.ban, BanStatus::Active, "{later:?}");
    assert_eq!(later.retry_after, Some(Duration::from_secs(3)));
    assert_eq!(later.limit, 2);
    let last = one(store, at(5, 9), &policy, key, 1).await;
    assert_eq!(
        last.ban,
        BanStatus::Active,
        "a microsecond before the end: {last:?}"
    );
    assert_eq!(last.retry_after, Some(Duration::from_micros(1)));
    let free = one(store, at(5, 10), &policy, key, 1).await;
    assert!(free.allowed, "the ban is over: {free:?}");
    assert_eq!(
        free.remaining, 1,
        "banned checks took nothing from the quota"
    );
}

/// Denials further apart than `within` never ban; a peek never counts; other keys and
/// policies are not banned with the key.
pub async fn ban_needs_denials_within_the_streak<S: Store>(store: &S) {
    let policy = banning("ban-streak", 1, 2, 3, 60);
    let other = banning("ban-streak-other", 1, 2, 3, 60);
    let key = unique("ban-streak-key");
    let key = key.as_bytes();
    for step in 0..4u64 {
        let now = at(step * 4, 0);
        assert!(
            one(store, now, &policy, key, 1).await.allowed,
            "step {step}"
        );
        let d = one(store, now, &policy, key, 1).await;
        assert_eq!(d.ban, BanStatus::None, "one denial per streak: {d:?}");
        // A peek of the exhausted key is denied but not counted.
        let peek = one(store, now, &policy, key, 0).await;
        assert_eq!(peek.ban, BanStatus::None, "{peek:?}");
    }
    let now = at(20, 0);
    assert!(one(store, now, &policy, key, 1).await.allowed);
    assert_eq!(one(store, now, &policy, key, 1).await.ban, BanStatus::None);
    assert_eq!(
        one(store, now, &policy, key, 1).await.ban,
        BanStatus::Started
    );
    assert!(
        one(store, now, &other, key, 1).await.allowed,
        "another policy"
    );
    let stranger = unique("ban-streak-stranger");
    assert!(
        one(store, now, &policy, stranger.as_bytes(), 1)
            .await
            .allowed
    );
}

/// `bans` lists a ban in force with its policy, key, start, end and denials (a peek while
/// banned is refused but not counted); `lift_ban` ends it at once (the key starts afresh), and
/// says whether there was one.
pub async fn bans_are_listed_and_lifted<S: Store>(store: &S) {
    let policy = banning("ban-list", 1, 2, 10, 30);
    let key = unique("ban-list-key");
    let key = key.as_bytes();
    assert!(one(store, T0, &policy, key, 1).await.allowed);
    one(store, T0, &policy, key, 1).await;
    assert_eq!(
        one(store, at(0, 5), &policy, key, 1).await.ban,
        BanStatus::Started
    );
    assert_eq!(
        one(store, at(1, 0), &policy, key, 1).await.ban,
        BanStatus::Active
    );
    // Peeks (cost 0) at the banned key, alone and in a request with another policy: refused
    // until the ban ends, but no denial, so a dashboard that peeks does not inflate the count.
    let other = banning("ban-list-other", 5, 2, 10, 30);
    for _ in 0..3 {
        let peek = one(store, at(1, 5), &policy, key, 0).await;
        assert!(!peek.allowed, "a banned key's peek is refused: {peek:?}");
        assert_eq!(peek.ban, BanStatus::Active, "{peek:?}");
        assert_eq!(peek.retry_after, Some(Duration::from_secs(29)), "{peek:?}");
        let both = [Check::new(&other, key, 0), Check::new(&policy, key, 0)];
        let d = match store.apply(at(1, 5), &both).await {
            Ok(d) => d,
            Err(e) => panic!("store failed: {e}"),
        };
        assert!(!d.allowed(), "{d:?}");
        assert_eq!(d.as_slice()[1].ban, BanStatus::Active, "{d:?}");
    }
    let listed = match store.bans(at(2, 0)).await {
        Ok(list) => list,
        Err(e) => panic!("bans failed: {e}"),
    };
    let mine: Vec<_> = listed
        .iter()
        .filter(|b| b.policy == policy.name())
        .collect();
    assert_eq!(mine.len(), 1, "{listed:?}");
    assert_eq!(mine[0].key, key);
    assert_eq!(mine[0].since, at(0, 5));
    assert_eq!(mine[0].until, at(30, 5));
    assert_eq!(
        mine[0].denials, 3,
        "two denials and one refusal while banned; the peeks are not denials"
    );
    let lifted = store.lift_ban(at(2, 0), policy.name(), key).await;
    assert!(matches!(lifted, Ok(true)), "{lifted:?}");
    let again = store.lift_ban(at(2, 0), policy.name(), key).await;
    assert!(matches!(again, Ok(false)), "{again:?}");
    let d = one(store, at(2, 0), &policy, key, 1).await;
    assert!(d.allowed, "lifted: {d:?}");
    let listed = store.bans(at(2, 0)).await.unwrap_or_default();
    assert!(!listed.iter().any(|b| b.policy == policy.name()));
    // Nothing to lift for a key never banned.
    let never = store
        .lift_ban(at(2, 0), policy.name(), b"never-banned")
        .await;
    assert!(matches!(never, Ok(false)));
}

/// In a request checked against several policies, a policy's ban counts only its own
/// denials, and a banned policy refuses the whole request without anything consumed.
pub async fn bans_in_batches<S: Store>(store: &S) {
    let tight = Policy::new(
        &unique("ban-batch-tight"),
        Quota::fixed_window(1, Duration::from_secs(1)).unwrap_or_else(|e| panic!("{e}")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let banning = banning("ban-batch", 3, 1, 10, 30);
    let key = unique("ban-batch-key");
    let key = key.as_bytes();
    let both = [Check::new(&tight, key, 1), Check::new(&banning, key, 1)];
    let apply = |now| async move {
        match store.apply(now, &both).await {
            Ok(d) => d,
            Err(e) => panic!("store failed: {e}"),
        }
    };
    assert!(apply(T0).await.allowed());
    // The tight policy denies; the banning one would admit: not its denial.
    for _ in 0..3 {
        let d = apply(T0).await;
        assert!(!d.allowed());
        assert_eq!(d.as_slice()[1].ban, BanStatus::None, "{d:?}");
        assert!(d.as_slice()[1].allowed);
    }
    // Next window: the banning policy runs out (3 per second) and its first denial bans.
    let now = at(1, 0);
    let singles = [Check::new(&banning, key, 1)];
    for _ in 0..2 {
        let d = store.apply(now, &singles).await.unwrap_or_default();
        assert!(d.allowed(), "{d:?}");
    }
    assert!(apply(now).await.allowed());
    let d = apply(now).await;
    assert!(!d.allowed());
    assert_eq!(d.as_slice()[1].ban, BanStatus::Started, "{d:?}");
    // Banned: the whole request is refused, and the tight policy's quota is untouched.
    let later = at(3, 0);
    let d = apply(later).await;
    assert!(!d.allowed());
    assert_eq!(d.as_slice()[1].ban, BanStatus::Active, "{d:?}");
    assert_eq!(d.as_slice()[0].remaining, 1, "nothing consumed: {d:?}");
    let alone = one(store, later, &tight, key, 1).await;
    assert!(alone.allowed, "{alone:?}");
}
