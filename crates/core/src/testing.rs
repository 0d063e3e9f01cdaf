//! The store conformance suite: one set of scenarios that every [`Store`] must pass, with time
//! under the test's control. A store's own tests instantiate it with
//! [`store_conformance_tests!`](crate::store_conformance_tests):
//!
//! ```text
//! tollgate::store_conformance_tests!(|| async { tollgate::MemoryStore::new() });
//! ```
//!
//! Every scenario passes `now` explicitly, so a store under test must use the caller's clock
//! (the Redis store's `clock = "local"`). Each scenario uses policy names and keys of its own,
//! with a per-run random suffix, so scenarios can run at the same time against one shared
//! server. The decisions are compared with the pure algorithms of [`crate::algorithm`] field by
//! field: a store may persist state however it likes, but must decide exactly as they do.

use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, Instant};

use crate::{Check, Decision, Decisions, Policy, Quota, Store, Timestamp};

mod bans;
mod calendar;
mod charges;
mod concurrency;
mod model;
pub mod sliding_error;
mod tasks;

pub use bans::{
    ban_after_repeated_denials, ban_needs_denials_within_the_streak, bans_are_listed_and_lifted,
    bans_in_batches,
};
pub use calendar::{
    calendar_all_or_nothing_charge_and_refund, calendar_day_spans_a_23_hour_day,
    calendar_matches_the_pure_algorithm, calendar_month_resets_at_its_boundary, utc,
};
pub use charges::charges_far_past_the_limit;

pub use concurrency::{
    concurrency_admits_the_limit_then_denies, concurrency_all_or_nothing,
    concurrency_batches_match_the_pure_algorithms, concurrency_charge_and_refund,
    concurrency_concurrent_holders_never_exceed_the_limit, concurrency_matches_the_pure_algorithm,
    concurrency_peek_takes_nothing, concurrency_permits_expire_at_their_ttl,
    concurrency_release_frees_a_permit, concurrency_renewal_takes_no_second_permit,
};
use model::{Model, Xorshift};
pub use model::{
    charges_match_the_pure_algorithms, immediately_matches_the_pure_algorithms,
    matches_the_pure_algorithms,
};
pub use tasks::{concurrent_callers_never_over_admit, immediate_means_ready_on_first_poll};

/// A start time aligned to every window the scenarios use (a multiple of one day).
pub const T0: Timestamp = Timestamp::from_secs(1_800_057_600);

/// `now`, or, when that is earlier, `from` plus the real time since `started`.
///
/// A store that keeps its state in another process (Redis) expires keys on its own clock, by
/// TTLs computed on the scenario's: a scenario whose clock stood still while real time passed
/// (a window with 1 ms left, then steps that do not advance, on a loaded machine) would see
/// that store drop a count the model rightly keeps. A scenario's clock passed through this
/// never falls behind real time, and stays the same for every store and the model.
pub fn not_behind(now: Timestamp, from: Timestamp, started: Instant) -> Timestamp {
    now.max(from.saturating_add(started.elapsed()))
}

/// A name unique to this run: scenarios sharing one server never see each other's keys.
pub fn unique(prefix: &str) -> String {
    let nonce = RandomState::new().hash_one(std::time::SystemTime::now());
    format!("{prefix}-{nonce:016x}")
}

/// One policy of each algorithm, each admitting 5 at once, named after `prefix`.
pub fn five_policies(prefix: &str) -> Vec<Policy> {
    let second = Duration::from_secs(1);
    let quotas = [
        Quota::fixed_window(5, second),
        Quota::sliding_window_log(5, second),
        Quota::sliding_window_counter(5, second),
        "5/s".parse().and_then(|rate| Quota::token_bucket(5, rate)),
        "5/s".parse().and_then(|rate| Quota::leaky_bucket(rate, 4)),
    ];
    quotas
        .into_iter()
        .map(|q| {
            let q = q.unwrap_or_else(|e| panic!("scenario quota: {e}"));
            Policy::new(&format!("{prefix}-{}", q.kind()), q)
                .unwrap_or_else(|e| panic!("scenario policy: {e}"))
        })
        .collect()
}

async fn one<S: Store>(
    store: &S,
    now: Timestamp,
    policy: &Policy,
    key: &[u8],
    cost: u32,
) -> Decision {
    let decisions = apply(store, now, &[Check::new(policy, key, cost)]).await;
    decisions
        .into_first()
        .unwrap_or_else(|| panic!("{}: a check returned no decision", policy.name()))
}

async fn apply<S: Store>(store: &S, now: Timestamp, checks: &[Check<'_>]) -> Decisions {
    match store.apply(now, checks).await {
        Ok(d) => {
            assert_eq!(d.len(), checks.len(), "one decision per check");
            d
        }
        Err(e) => panic!("store failed: {e}"),
    }
}

/// Each algorithm admits its quota at one instant, then denies with a retry time, and
/// `remaining` counts down to zero.
pub async fn admits_the_quota_then_denies<S: Store>(store: &S) {
    let key = unique("quota");
    for policy in five_policies(&unique("quota")) {
        for expected_remaining in (0..5).rev() {
            let d = one(store, T0, &policy, key.as_bytes(), 1).await;
            assert!(d.allowed, "{}: {d:?}", policy.name());
            assert_eq!(d.remaining, expected_remaining, "{}", policy.name());
            assert_eq!(d.limit, 5, "{}", policy.name());
            assert_eq!(d.policy, policy.name());
        }
        let d = one(store, T0, &policy, key.as_bytes(), 1).await;
        assert!(!d.allowed, "{}: the sixth is denied", policy.name());
        assert_eq!(d.remaining, 0);
        assert!(
            d.retry_after.is_some_and(|r| r > Duration::ZERO),
            "{}",
            policy.name()
        );
    }
}

/// `retry_after` is exact: a microsecond early is still denied, on time is admitted.
pub async fn retry_after_is_exact<S: Store>(store: &S) {
    let key = unique("retry");
    for policy in five_policies(&unique("retry")) {
        let start = T0.saturating_add(Duration::from_millis(137));
        for _ in 0..5 {
            assert!(one(store, start, &policy, key.as_bytes(), 1).await.allowed);
        }
        let denied = one(store, start, &policy, key.as_bytes(), 1).await;
        let retry = denied
            .retry_after
            .unwrap_or_else(|| panic!("{}: denied without retry_after", policy.name()));
        let early = start
            .saturating_add(retry)
            .saturating_sub(Duration::from_micros(1));
        let d = one(store, early, &policy, key.as_bytes(), 1).await;
        assert!(
            !d.allowed,
            "{}: admitted 1µs before retry_after {retry:?}",
            policy.name()
        );
        let on_time = start.saturating_add(retry);
        let d = one(store, on_time, &policy, key.as_bytes(), 1).await;
        assert!(
            d.allowed,
            "{}: denied at retry_after {retry:?}: {d:?}",
            policy.name()
        );
    }
}

/// Keys and policies do not share state; the key is bytes of any length.
pub async fn keys_and_policies_are_independent<S: Store>(store: &S) {
    let prefix = unique("indep");
    let policies = five_policies(&prefix);
    let long = vec![b'x'; 10_000];
    let mut long2 = long.clone();
    long2[9_999] = b'y';
    let keys: [&[u8]; 5] = [b"a", b"b", &long, &long2, &[0, 159, 146, 150, 255]];
    for policy in &policies {
        for key in keys {
            for _ in 0..5 {
                let d = one(store, T0, policy, key, 1).await;
                assert!(d.allowed, "{}: key of {} bytes", policy.name(), key.len());
            }
            assert!(!one(store, T0, policy, key, 1).await.allowed);
        }
    }
    // The same key under a policy that was not touched is fresh.
    let other = Policy::new(
        &format!("{prefix}-other"),
        Quota::fixed_window(5, Duration::from_secs(1)).unwrap_or_else(|e| panic!("{e}")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(one(store, T0, &other, b"a", 1).await.remaining, 4);
}

/// A request denied by one policy consumes from none.
pub async fn all_or_nothing_across_policies<S: Store>(store: &S) {
    let prefix = unique("aon");
    let roomy = Policy::new(
        &format!("{prefix}-roomy"),
        Quota::sliding_window_counter(10, Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{e}")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    for tight in five_policies(&prefix) {
        let key = unique("aon-key");
        let key = key.as_bytes();
        // Use up the tight policy alone.
        for _ in 0..5 {
            assert!(one(store, T0, &tight, key, 1).await.allowed);
        }
        let before = one(store, T0, &roomy, key, 0).await.remaining;
        let batch = [Check::new(&roomy, key, 2), Check::new(&tight, key, 1)];
        let decisions = apply(store, T0, &batch).await;
        assert!(!decisions.allowed(), "{}", tight.name());
        let after = one(store, T0, &roomy, key, 0).await.remaining;
        assert_eq!(
            before,
            after,
            "{}: the denied request consumed from the other policy",
            tight.name()
        );
        let roomy_decision = &decisions.as_slice()[0];
        assert!(
            roomy_decision.allowed,
            "the roomy policy alone would admit it"
        );
        assert_eq!(
            roomy_decision.remaining, before,
            "and reports its quota as it stands"
        );
        // Both admit: both consume.
        let fresh = unique("aon-fresh");
        let batch = [
            Check::new(&roomy, fresh.as_bytes(), 2),
            Check::new(&tight, fresh.as_bytes(), 1),
        ];
        let decisions = apply(store, T0, &batch).await;
        assert!(decisions.allowed());
        assert_eq!(decisions.as_slice()[0].remaining, 8);
        assert_eq!(decisions.as_slice()[1].remaining, 4);
    }
}

/// The same (policy, key) twice in one batch counts twice.
pub async fn repeated_check_in_a_batch_counts_twice<S: Store>(store: &S) {
    for policy in five_policies(&unique("twice")) {
        let key = unique("twice-key");
        let batch = [
            Check::new(&policy, key.as_bytes(), 3),
            Check::new(&policy, key.as_bytes(), 3),
        ];
        let d = apply(store, T0, &batch).await;
        assert!(!d.allowed(), "{}: 3 + 3 exceeds 5", policy.name());
        assert_eq!(
            one(store, T0, &policy, key.as_bytes(), 0).await.remaining,
            5
        );
    }
}

/// Costs above one consume that much; cost zero peeks and consumes nothing.
pub async fn costs_and_peeks<S: Store>(store: &S) {
    for policy in five_policies(&unique("cost")) {
        let key = unique("cost-key");
        let key = key.as_bytes();
        let peek = one(store, T0, &policy, key, 0).await;
        assert!(peek.allowed);
        assert_eq!(peek.remaining, 5, "{}", policy.name());
        assert_eq!(one(store, T0, &policy, key, 3).await.remaining, 2);
        assert_eq!(one(store, T0, &policy, key, 0).await.remaining, 2);
        let d = one(store, T0, &policy, key, 3).await;
        assert!(!d.allowed, "{}: 3 more do not fit in 2", policy.name());
        assert_eq!(d.remaining, 2, "a denial consumes nothing");
        assert!(one(store, T0, &policy, key, 2).await.allowed);
        // A cost above the quota can never pass: no retry time that would lie.
        let d = one(store, T0, &policy, unique("cost-big").as_bytes(), 6).await;
        assert!(!d.allowed);
        assert_eq!(d.retry_after, None, "{}", policy.name());
    }
}

/// Quotas come back as time passes: windows roll over, buckets refill and drain.
pub async fn quota_returns_with_time<S: Store>(store: &S) {
    for policy in five_policies(&unique("time")) {
        let key = unique("time-key");
        for _ in 0..5 {
            assert!(one(store, T0, &policy, key.as_bytes(), 1).await.allowed);
        }
        let full = one(store, T0, &policy, key.as_bytes(), 0).await.reset;
        assert!(
            full > Duration::ZERO && full <= Duration::from_secs(2),
            "{}: {full:?}",
            policy.name()
        );
        let later = T0.saturating_add(full);
        let d = one(store, later, &policy, key.as_bytes(), 0).await;
        assert_eq!(
            d.remaining,
            5,
            "{}: full again after reset {full:?}",
            policy.name()
        );
        assert_eq!(d.reset, Duration::ZERO);
    }
}

/// The leaky bucket's delay grows one interval per queued request, and a refund frees a place.
pub async fn leaky_bucket_delays_and_refunds<S: Store>(store: &S) {
    let rate = "10/s".parse().unwrap_or_else(|e| panic!("{e}"));
    let quota = Quota::leaky_bucket(rate, 3).unwrap_or_else(|e| panic!("{e}"));
    let policy = Policy::new(&unique("leaky"), quota).unwrap_or_else(|e| panic!("{e}"));
    let key = unique("leaky-key");
    let mut delays = Vec::new();
    for _ in 0..4 {
        let d = one(store, T0, &policy, key.as_bytes(), 1).await;
        assert!(d.allowed);
        delays.push(d.delay.unwrap_or_default());
    }
    let expected: Vec<Duration> = (0..4).map(|i| Duration::from_millis(100 * i)).collect();
    assert_eq!(delays, expected);
    assert!(
        !one(store, T0, &policy, key.as_bytes(), 1).await.allowed,
        "queue of 3 is full"
    );
    if let Err(e) = store
        .refund(T0, &[Check::new(&policy, key.as_bytes(), 1)])
        .await
    {
        panic!("refund failed: {e}");
    }
    let d = one(store, T0, &policy, key.as_bytes(), 1).await;
    assert!(d.allowed, "the refunded place is free again");
    assert_eq!(d.delay, Some(Duration::from_millis(300)));
}

/// A charge past what is left is taken, never refused, and the key is then denied until its
/// quota comes back; a charge of 0 changes nothing.
pub async fn charges_are_never_refused<S: Store>(store: &S) {
    let key = unique("charged");
    for policy in five_policies(&unique("charged")) {
        let check = |cost| Check::new(&policy, key.as_bytes(), cost);
        let charged = match store.charge(T0, &[check(12)]).await {
            Ok(d) => d,
            Err(e) => panic!("store failed: {e}"),
        };
        let d = charged
            .into_first()
            .unwrap_or_else(|| panic!("{}: no decision", policy.name()));
        assert!(
            d.allowed,
            "{}: a charge is never refused: {d:?}",
            policy.name()
        );
        assert_eq!(d.remaining, 0, "{}: {d:?}", policy.name());
        let again = one(store, T0, &policy, key.as_bytes(), 1).await;
        assert!(
            !again.allowed,
            "{}: over its limit: {again:?}",
            policy.name()
        );
        let peek = match store.charge(T0, &[check(0)]).await {
            Ok(d) => d.into_first(),
            Err(e) => panic!("store failed: {e}"),
        };
        assert_eq!(peek.map(|d| d.remaining), Some(0), "{}", policy.name());
        // Long after, the quota is whole again.
        let later = T0.saturating_add(Duration::from_secs(60));
        let back = one(store, later, &policy, key.as_bytes(), 1).await;
        assert!(back.allowed, "{}: {back:?}", policy.name());
    }
}

/// Instantiates every conformance scenario as a `#[tokio::test]` for the store that `$make`
/// (a closure returning a future of the store) builds. The store must be `Clone` and use the
/// caller's `now`.
#[macro_export]
macro_rules! store_conformance_tests {
    ($make:expr) => {
        $crate::store_conformance_tests!(@tests $make;
            admits_the_quota_then_denies,
            retry_after_is_exact,
            keys_and_policies_are_independent,
            all_or_nothing_across_policies,
            repeated_check_in_a_batch_counts_twice,
            costs_and_peeks,
            quota_returns_with_time,
            leaky_bucket_delays_and_refunds,
            matches_the_pure_algorithms,
            immediately_matches_the_pure_algorithms,
            charges_match_the_pure_algorithms,
            charges_are_never_refused,
            charges_far_past_the_limit,
            concurrent_callers_never_over_admit,
            immediate_means_ready_on_first_poll,
            concurrency_admits_the_limit_then_denies,
            concurrency_release_frees_a_permit,
            concurrency_permits_expire_at_their_ttl,
            concurrency_renewal_takes_no_second_permit,
            concurrency_peek_takes_nothing,
            concurrency_charge_and_refund,
            concurrency_all_or_nothing,
            concurrency_concurrent_holders_never_exceed_the_limit,
            concurrency_matches_the_pure_algorithm,
            concurrency_batches_match_the_pure_algorithms,
            ban_after_repeated_denials,
            ban_needs_denials_within_the_streak,
            bans_are_listed_and_lifted,
            bans_in_batches,
            calendar_month_resets_at_its_boundary,
            calendar_day_spans_a_23_hour_day,
            calendar_all_or_nothing_charge_and_refund,
            calendar_matches_the_pure_algorithm,
        );
    };
    (@tests $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let store = ($make)().await;
                $crate::testing::$name(&store).await;
            }
        )*
    };
}
