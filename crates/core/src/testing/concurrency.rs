//! The conformance scenarios of concurrency limits: permits taken, given back, renewed and
//! taken back by their TTL, all-or-nothing with the rate algorithms, under concurrent callers,
//! and decisions equal to the pure algorithm's ([`Concurrency`]) field by field.
//!
//! Every scenario uses a `lease_ttl` of a minute or more: a Redis store gives its sorted set a
//! TTL of `lease_ttl` in Redis's own time, so a shorter one could take permits back while a slow
//! test machine is still in the middle of a scenario.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::{T0, Xorshift, apply, not_behind, one, unique};
use crate::algorithm::{Algorithm, Concurrency, ConcurrencyState, FixedWindowState};
use crate::{Check, Decision, Policy, Quota, Store, Timestamp, Verdict};

const MINUTE: Duration = Duration::from_secs(60);

fn concurrency(prefix: &str, limit: u32, ttl: Duration) -> Policy {
    let quota = Quota::concurrency(limit, ttl).unwrap_or_else(|e| panic!("scenario quota: {e}"));
    Policy::new(&unique(prefix), quota).unwrap_or_else(|e| panic!("scenario policy: {e}"))
}

fn fixed(prefix: &str, limit: u32) -> Policy {
    let quota = Quota::fixed_window(limit, MINUTE).unwrap_or_else(|e| panic!("{e}"));
    Policy::new(&unique(prefix), quota).unwrap_or_else(|e| panic!("{e}"))
}

/// One check naming `permit`.
async fn take<S: Store>(
    store: &S,
    now: Timestamp,
    policy: &Policy,
    key: &[u8],
    permit: u64,
) -> Decision {
    let check = Check::new(policy, key, 1).with_permit(permit);
    apply(store, now, &[check])
        .await
        .into_first()
        .unwrap_or_else(|| panic!("{}: no decision", policy.name()))
}

async fn release<S: Store>(store: &S, now: Timestamp, checks: &[Check<'_>]) -> u32 {
    match store.release(now, checks).await {
        Ok(n) => n,
        Err(e) => panic!("release failed: {e}"),
    }
}

fn permit_of<'a>(policy: &'a Policy, key: &'a [u8], permit: u64) -> Check<'a> {
    Check::new(policy, key, 1).with_permit(permit)
}

/// N permits are admitted, counting `remaining` down; the next is denied with `remaining` 0
/// and a `retry_after` of at most a second (a permit usually comes back when a request ends).
pub async fn concurrency_admits_the_limit_then_denies<S: Store>(store: &S) {
    let policy = concurrency("inflight", 3, Duration::from_secs(300));
    let key = unique("inflight-key");
    for (i, remaining) in [2, 1, 0].into_iter().enumerate() {
        let d = take(store, T0, &policy, key.as_bytes(), 100 + i as u64).await;
        assert!(d.allowed, "{d:?}");
        assert_eq!((d.limit, d.remaining), (3, remaining), "{d:?}");
        let expected = if remaining > 0 {
            Duration::ZERO
        } else {
            Concurrency::MAX_RETRY_AFTER
        };
        assert_eq!(d.reset, expected, "free now, or soon once full: {d:?}");
        assert_eq!((d.retry_after, d.delay), (None, None));
    }
    let later = T0.saturating_add(Duration::from_secs(10));
    let d = take(store, later, &policy, key.as_bytes(), 999).await;
    assert!(!d.allowed, "{d:?}");
    assert_eq!(d.remaining, 0);
    assert_eq!(
        d.retry_after,
        Some(Concurrency::MAX_RETRY_AFTER),
        "soon: {d:?}"
    );
    assert_eq!(d.reset, Concurrency::MAX_RETRY_AFTER, "soon, not the TTL");
    // A request that names no permit could never give it back: denied for good.
    let other = unique("inflight-anonymous");
    let d = one(store, T0, &policy, other.as_bytes(), 1).await;
    assert!(!d.allowed && d.retry_after.is_none(), "{d:?}");
    assert_eq!(d.remaining, 3, "and nothing taken");
}

/// A release frees its permit at once; releasing it again returns 0 and frees nothing more.
pub async fn concurrency_release_frees_a_permit<S: Store>(store: &S) {
    let policy = concurrency("release", 2, MINUTE);
    let key = unique("release-key");
    let key = key.as_bytes();
    assert!(take(store, T0, &policy, key, 1).await.allowed);
    assert!(take(store, T0, &policy, key, 2).await.allowed);
    assert!(!take(store, T0, &policy, key, 3).await.allowed);
    let first = permit_of(&policy, key, 1);
    assert_eq!(release(store, T0, &[first]).await, 1);
    let d = take(store, T0, &policy, key, 3).await;
    assert!(d.allowed, "the released permit is free at once: {d:?}");
    assert_eq!(release(store, T0, &[first]).await, 0, "released twice");
    assert!(
        !take(store, T0, &policy, key, 4).await.allowed,
        "the second release freed nothing"
    );
    // Never taken, another key, a check of another algorithm: nothing to give back.
    let window = fixed("release-window", 5);
    let stray = [
        permit_of(&policy, key, 77),
        permit_of(&policy, b"release-elsewhere", 2),
        permit_of(&window, key, 2),
    ];
    assert_eq!(release(store, T0, &stray).await, 0);
    // Several at once, in one call.
    let both = [permit_of(&policy, key, 2), permit_of(&policy, key, 3)];
    assert_eq!(release(store, T0, &both).await, 2);
    let peek = one(store, T0, &policy, key, 0).await;
    assert_eq!(
        (peek.remaining, peek.reset),
        (2, Duration::ZERO),
        "{peek:?}"
    );
}

/// A permit is taken back at exactly `now + lease_ttl`: a new one is denied a microsecond
/// before and admitted at it; the expired permit's release then returns 0.
pub async fn concurrency_permits_expire_at_their_ttl<S: Store>(store: &S) {
    let policy = concurrency("expire", 1, MINUTE);
    let key = unique("expire-key");
    let key = key.as_bytes();
    let start = T0.saturating_add(Duration::from_millis(137));
    assert!(take(store, start, &policy, key, 10).await.allowed);
    let end = start.saturating_add(MINUTE);
    let early = end.saturating_sub(Duration::from_micros(1));
    let d = take(store, early, &policy, key, 11).await;
    assert!(!d.allowed, "taken back early: {d:?}");
    assert_eq!(d.retry_after, Some(Duration::from_micros(1)));
    assert_eq!(d.reset, Duration::from_micros(1));
    let d = take(store, end, &policy, key, 11).await;
    assert!(d.allowed, "not taken back at its TTL: {d:?}");
    assert_eq!(release(store, end, &[permit_of(&policy, key, 10)]).await, 0);
    assert_eq!(release(store, end, &[permit_of(&policy, key, 11)]).await, 1);
}

/// Asking again with a permit the key holds renews it: no second permit, even when full, and
/// the renewed permit expires `lease_ttl` after the renewal.
pub async fn concurrency_renewal_takes_no_second_permit<S: Store>(store: &S) {
    let policy = concurrency("renew", 2, MINUTE);
    let key = unique("renew-key");
    let key = key.as_bytes();
    assert_eq!(take(store, T0, &policy, key, 5).await.remaining, 1);
    let again = take(store, T0, &policy, key, 5).await;
    assert!(again.allowed);
    assert_eq!(again.remaining, 1, "renewed, not a second permit");
    let t1 = T0.saturating_add(Duration::from_secs(10));
    assert_eq!(take(store, t1, &policy, key, 6).await.remaining, 0);
    assert!(!take(store, t1, &policy, key, 7).await.allowed);
    let t2 = T0.saturating_add(Duration::from_secs(20));
    let renewed = take(store, t2, &policy, key, 5).await;
    assert!(
        renewed.allowed,
        "a held permit renews when full: {renewed:?}"
    );
    assert_eq!(renewed.remaining, 0);
    assert_eq!(renewed.reset, Concurrency::MAX_RETRY_AFTER, "full: soon");
    // 5's first TTL has passed, but it was renewed: still held, with 6.
    let t3 = T0.saturating_add(Duration::from_secs(65));
    assert!(
        !take(store, t3, &policy, key, 7).await.allowed,
        "5 and 6 held"
    );
    // 6 is taken back at T0 + 70 s; 5 is still held.
    let t4 = T0.saturating_add(Duration::from_secs(75));
    let d = take(store, t4, &policy, key, 7).await;
    assert!(d.allowed && d.remaining == 0, "{d:?}");
}

/// A peek (cost 0) takes nothing and reports the key's permits.
pub async fn concurrency_peek_takes_nothing<S: Store>(store: &S) {
    let policy = concurrency("peek", 2, MINUTE);
    let key = unique("peek-key");
    let key = key.as_bytes();
    let peek = Check::new(&policy, key, 0).with_permit(9);
    for _ in 0..3 {
        let d = apply(store, T0, &[peek]).await.into_first();
        assert_eq!(d.map(|d| (d.allowed, d.remaining)), Some((true, 2)));
    }
    assert!(take(store, T0, &policy, key, 1).await.allowed);
    let later = T0.saturating_add(Duration::from_secs(15));
    let d = one(store, later, &policy, key, 0).await;
    assert_eq!((d.remaining, d.reset), (1, Duration::ZERO), "one is free");
    assert_eq!(
        release(store, later, &[peek]).await,
        0,
        "the peek held nothing"
    );
}

/// A charge takes nothing (a concurrency limit counts requests in flight, not usage) and
/// answers as a peek; a refund gives the permit back as a release does.
pub async fn concurrency_charge_and_refund<S: Store>(store: &S) {
    let policy = concurrency("charge", 1, MINUTE);
    let key = unique("charge-key");
    let key = key.as_bytes();
    let check = permit_of(&policy, key, 4);
    let charged = match store.charge(T0, &[check]).await {
        Ok(d) => d.into_first(),
        Err(e) => panic!("charge failed: {e}"),
    };
    assert_eq!(charged.map(|d| (d.allowed, d.remaining)), Some((true, 1)));
    assert!(
        take(store, T0, &policy, key, 4).await.allowed,
        "the charge took nothing"
    );
    if let Err(e) = store.refund(T0, &[check]).await {
        panic!("refund failed: {e}");
    }
    assert!(
        take(store, T0, &policy, key, 8).await.allowed,
        "refunded: free again"
    );
}

/// All-or-nothing with a rate policy in one request, both ways: a concurrency denial consumes
/// nothing of the window, and a window denial holds no permit. With the two keyed on different
/// values too (different Cluster slots: a permit taken in one slot is given back when a later
/// slot denies).
pub async fn concurrency_all_or_nothing<S: Store>(store: &S) {
    for spread in [false, true] {
        let inflight = concurrency("aon-inflight", 1, MINUTE);
        let window = fixed("aon-window", 2);
        let a = unique("aon-a");
        let b = if spread { unique("aon-b") } else { a.clone() };
        let (a, b) = (a.as_bytes(), b.as_bytes());
        // The window runs out: a request denied by it holds no permit.
        assert!(one(store, T0, &window, b, 2).await.allowed);
        let batch = [
            Check::new(&inflight, a, 1).with_permit(1),
            Check::new(&window, b, 1),
        ];
        let d = apply(store, T0, &batch).await;
        assert!(!d.allowed(), "{d:?}");
        assert!(d.as_slice()[0].allowed, "the permit alone was free");
        assert_eq!(d.as_slice()[0].remaining, 1, "reported as it stands");
        assert_eq!(
            one(store, T0, &inflight, a, 0).await.remaining,
            1,
            "no permit held"
        );
        assert_eq!(release(store, T0, &batch[..1]).await, 0);
        // The permit is held elsewhere: a request denied by it consumes nothing of a window.
        let roomy = fixed("aon-roomy", 5);
        assert!(take(store, T0, &inflight, a, 2).await.allowed);
        let batch = [
            Check::new(&roomy, b, 1),
            Check::new(&inflight, a, 1).with_permit(3),
        ];
        let d = apply(store, T0, &batch).await;
        assert!(!d.allowed(), "{d:?}");
        assert_eq!(d.as_slice()[0].remaining, 5, "reported as it stands");
        assert!(d.as_slice()[1].retry_after.is_some());
        assert_eq!(
            one(store, T0, &roomy, b, 0).await.remaining,
            5,
            "nothing consumed"
        );
        // Both admit: both take.
        assert_eq!(release(store, T0, &[permit_of(&inflight, a, 2)]).await, 1);
        let d = apply(store, T0, &batch).await;
        assert!(d.allowed(), "{d:?}");
        assert_eq!(d.as_slice()[0].remaining, 4);
        assert_eq!(d.as_slice()[1].remaining, 0);
        assert_eq!(
            release(store, T0, &batch).await,
            1,
            "the permit, not the window"
        );
    }
}

/// Many tasks on one key, each taking a permit, holding it a moment and giving it back: never
/// more than N hold one at once, and every permit comes back.
pub async fn concurrency_concurrent_holders_never_exceed_the_limit<S: Store + Clone>(store: &S) {
    const LIMIT: u32 = 3;
    let policy = concurrency("holders", LIMIT, Duration::from_secs(600));
    let key = unique("holders-key");
    let live = Arc::new(AtomicU32::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..8u64 {
        let (store, policy, key, live) = (store.clone(), policy.clone(), key.clone(), live.clone());
        tasks.spawn(async move {
            let mut admitted = 0u32;
            for round in 0..25u64 {
                let permit = (task + 1) << 32 | round;
                let check = Check::new(&policy, key.as_bytes(), 1).with_permit(permit);
                let d = store
                    .apply(T0, &[check])
                    .await
                    .unwrap_or_else(|e| panic!("store failed: {e}"));
                if !d.allowed() {
                    tokio::task::yield_now().await;
                    continue;
                }
                admitted += 1;
                let now_live = live.fetch_add(1, Ordering::SeqCst) + 1;
                assert!(
                    now_live <= LIMIT,
                    "{now_live} requests in flight, limit {LIMIT}"
                );
                tokio::task::yield_now().await;
                live.fetch_sub(1, Ordering::SeqCst);
                let back = store
                    .release(T0, &[check])
                    .await
                    .unwrap_or_else(|e| panic!("release failed: {e}"));
                assert_eq!(back, 1, "a held permit comes back once");
            }
            admitted
        });
    }
    let mut total = 0;
    while let Some(admitted) = tasks.join_next().await {
        total += admitted.unwrap_or_else(|e| panic!("task failed: {e}"));
    }
    assert!(total >= LIMIT, "only {total} admitted");
    let peek = one(store, T0, &policy, key.as_bytes(), 0).await;
    assert_eq!(peek.remaining, u64::from(LIMIT), "every permit came back");
}

/// Random traffic on three keys (takes of cost 0 to 2 naming one of a few permits, releases,
/// time passing across the TTL) decides exactly as the pure algorithm, field by field, and
/// releases report what it reports.
pub async fn concurrency_matches_the_pure_algorithm<S: Store>(store: &S) {
    let policy = concurrency("model", 3, MINUTE);
    let Quota::Concurrency(alg) = policy.quota().clone() else {
        return;
    };
    let prefix = unique("model-key");
    let mut states = [(); 3].map(|_| ConcurrencyState::default());
    let mut rng = Xorshift(0x6a09_e667_f3bc_c908);
    let mut now = T0;
    let started = Instant::now();
    for step in 0..400 {
        let gap = Duration::from_micros(match rng.below(10) {
            0..=5 => 0,
            6..=7 => rng.below(5_000_000),
            8 => rng.below(30_000_000),
            _ => rng.below(61_000_000),
        });
        now = not_behind(now.saturating_add(gap), T0, started);
        let k = rng.below(3) as usize;
        let key = format!("{prefix}-{k}");
        let permit = rng.below(6);
        if rng.below(4) == 0 {
            let got = release(
                store,
                now,
                &[Check::new(&policy, key.as_bytes(), 1).with_permit(permit)],
            )
            .await;
            let want = u32::from(alg.release(&mut states[k], now, permit));
            assert_eq!(got, want, "step {step} release {permit} at {now}");
            continue;
        }
        let cost = [0, 1, 1, 1, 2][rng.below(5) as usize];
        let check = Check::new(&policy, key.as_bytes(), cost).with_permit(permit);
        let got = apply(store, now, &[check]).await.into_first();
        let want = alg.check(&mut states[k], now, cost, permit);
        assert_eq!(
            got,
            Some(want.into_decision(policy.shared_name())),
            "step {step} cost {cost} permit {permit} at {now}"
        );
    }
}

/// Random requests of two to four checks on one key (two concurrency policies, a window),
/// naming permits that repeat within a request, decide all-or-nothing exactly as the pure
/// algorithms applied in order do (tentative takes while every check admits; when one denies,
/// nothing taken and the admitting checks report their quota as it stands).
pub async fn concurrency_batches_match_the_pure_algorithms<S: Store>(store: &S) {
    let first = concurrency("batch-a", 2, MINUTE);
    let second = concurrency("batch-b", 3, MINUTE);
    let window = fixed("batch-window", 6);
    let algs: Vec<Concurrency> = [&first, &second]
        .iter()
        .filter_map(|p| match p.quota() {
            Quota::Concurrency(a) => Some(a.clone()),
            _ => None,
        })
        .collect();
    let Quota::FixedWindow(fixed_alg) = window.quota().clone() else {
        return;
    };
    let key = unique("batch-key");
    let key = key.as_bytes();
    let mut permits = [ConcurrencyState::default(), ConcurrencyState::default()];
    let mut count = FixedWindowState::default();
    let mut rng = Xorshift(0xbb67_ae85_84ca_a73b);
    let mut now = T0;
    let started = Instant::now();
    for step in 0..250 {
        let gap = Duration::from_micros(match rng.below(6) {
            0..=3 => 0,
            4 => rng.below(20_000_000),
            _ => rng.below(70_000_000),
        });
        now = not_behind(now.saturating_add(gap), T0, started);
        if rng.below(3) == 0 {
            let (p, permit) = (rng.below(2) as usize, rng.below(5));
            let policy = if p == 0 { &first } else { &second };
            let got = release(
                store,
                now,
                &[Check::new(policy, key, 1).with_permit(permit)],
            )
            .await;
            assert_eq!(
                got,
                u32::from(algs[p].release(&mut permits[p], now, permit))
            );
            continue;
        }
        let mut batch = Vec::new();
        for _ in 0..2 + rng.below(3) {
            let which = rng.below(5) as usize;
            let cost = [0, 1, 1, 1, 2][rng.below(5) as usize];
            let policy = [&first, &second, &window, &first, &second][which];
            batch.push(Check::new(policy, key, cost).with_permit(rng.below(5)));
        }
        let got = apply(store, now, &batch).await;
        // The model: tentative steps on copies, kept only when every check admits.
        let (mut p, mut c) = (permits.clone(), count);
        let mut verdicts: Vec<Verdict> = Vec::new();
        let mut all = true;
        for check in &batch {
            let v = match check.policy.quota() {
                Quota::Concurrency(_) => {
                    let i = usize::from(std::ptr::eq(check.policy, &second));
                    let v = algs[i].evaluate(&mut p[i], now, check.cost, check.permit);
                    if all && v.allowed {
                        algs[i].commit(&mut p[i], now, check.cost, check.permit);
                    }
                    v
                }
                _ => {
                    let v = fixed_alg.evaluate(&mut c, now, check.cost);
                    if all && v.allowed {
                        fixed_alg.commit(&mut c, now, check.cost);
                    }
                    v
                }
            };
            all &= v.allowed;
            verdicts.push(v);
        }
        if all {
            (permits, count) = (p, c);
        } else {
            for (check, v) in batch.iter().zip(verdicts.iter_mut()) {
                if v.allowed {
                    *v = match check.policy.quota() {
                        Quota::Concurrency(_) => {
                            let i = usize::from(std::ptr::eq(check.policy, &second));
                            algs[i].evaluate(&mut permits[i].clone(), now, 0, 0)
                        }
                        _ => fixed_alg.evaluate(&mut count.clone(), now, 0),
                    };
                }
            }
        }
        let want: Vec<Decision> = batch
            .iter()
            .zip(verdicts)
            .map(|(check, v)| v.into_decision(check.policy.shared_name()))
            .collect();
        assert_eq!(got.as_slice(), want.as_slice(), "step {step} at {now}");
    }
}
