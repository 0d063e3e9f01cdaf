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

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use crate::algorithm::{
    Algorithm, FixedWindow, LeakyBucket, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};
use crate::{Check, Decision, Decisions, Policy, Quota, Store, Timestamp, Verdict};

mod bans;
mod calendar;
mod charges;
mod concurrency;
pub mod sliding_error;

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

/// A start time aligned to every window the scenarios use (a multiple of one day).
pub const T0: Timestamp = Timestamp::from_secs(1_800_057_600);

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

/// A deterministic generator, so a failure reproduces (xorshift64*).
struct Xorshift(u64);

impl Xorshift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

enum Model {
    Fixed(FixedWindow, HashMap<u8, <FixedWindow as Algorithm>::State>),
    Log(
        SlidingWindowLog,
        HashMap<u8, <SlidingWindowLog as Algorithm>::State>,
    ),
    Counter(
        SlidingWindowCounter,
        HashMap<u8, <SlidingWindowCounter as Algorithm>::State>,
    ),
    Token(TokenBucket, HashMap<u8, <TokenBucket as Algorithm>::State>),
    Leaky(LeakyBucket, HashMap<u8, <LeakyBucket as Algorithm>::State>),
}

impl Model {
    fn new(quota: &Quota) -> Self {
        match quota {
            Quota::FixedWindow(a) => Model::Fixed(a.clone(), HashMap::new()),
            Quota::SlidingWindowLog(a) => Model::Log(a.clone(), HashMap::new()),
            Quota::SlidingWindowCounter(a) => Model::Counter(a.clone(), HashMap::new()),
            Quota::TokenBucket(a) => Model::Token(a.clone(), HashMap::new()),
            Quota::LeakyBucket(a) => Model::Leaky(a.clone(), HashMap::new()),
            Quota::Concurrency(_) => panic!("concurrency has a model of its own"),
        }
    }

    fn check(&mut self, key: u8, now: Timestamp, cost: u32) -> Verdict {
        match self {
            Model::Fixed(a, s) => a.check(s.entry(key).or_default(), now, cost),
            Model::Log(a, s) => a.check(s.entry(key).or_default(), now, cost),
            Model::Counter(a, s) => a.check(s.entry(key).or_default(), now, cost),
            Model::Token(a, s) => a.check(s.entry(key).or_default(), now, cost),
            Model::Leaky(a, s) => a.check(s.entry(key).or_default(), now, cost),
        }
    }

    /// Charges `cost` whatever the quota says; what is left, as a peek reports it.
    fn charge(&mut self, key: u8, now: Timestamp, cost: u32) -> Verdict {
        fn charged<A: Algorithm>(a: &A, s: &mut A::State, now: Timestamp, cost: u32) -> Verdict {
            a.charge(s, now, cost);
            Verdict::charged(a.evaluate(s, now, 0))
        }
        match self {
            Model::Fixed(a, s) => charged(a, s.entry(key).or_default(), now, cost),
            Model::Log(a, s) => charged(a, s.entry(key).or_default(), now, cost),
            Model::Counter(a, s) => charged(a, s.entry(key).or_default(), now, cost),
            Model::Token(a, s) => charged(a, s.entry(key).or_default(), now, cost),
            Model::Leaky(a, s) => charged(a, s.entry(key).or_default(), now, cost),
        }
    }

    /// Decides without consuming (a check of a request that another check refuses).
    fn evaluate(&mut self, key: u8, now: Timestamp, cost: u32) -> Verdict {
        match self {
            Model::Fixed(a, s) => a.evaluate(s.entry(key).or_default(), now, cost),
            Model::Log(a, s) => a.evaluate(s.entry(key).or_default(), now, cost),
            Model::Counter(a, s) => a.evaluate(s.entry(key).or_default(), now, cost),
            Model::Token(a, s) => a.evaluate(s.entry(key).or_default(), now, cost),
            Model::Leaky(a, s) => a.evaluate(s.entry(key).or_default(), now, cost),
        }
    }

    /// Gives `cost` back.
    fn refund(&mut self, key: u8, now: Timestamp, cost: u32) {
        match self {
            Model::Fixed(a, s) => a.refund(s.entry(key).or_default(), now, cost),
            Model::Log(a, s) => a.refund(s.entry(key).or_default(), now, cost),
            Model::Counter(a, s) => a.refund(s.entry(key).or_default(), now, cost),
            Model::Token(a, s) => a.refund(s.entry(key).or_default(), now, cost),
            Model::Leaky(a, s) => a.refund(s.entry(key).or_default(), now, cost),
        }
    }
}

impl Xorshift {
    /// The next instant of random traffic: half at once (bursts), the rest after gaps up to
    /// 1.5 s (across window boundaries).
    fn step(&mut self, now: Timestamp) -> Timestamp {
        now.saturating_add(Duration::from_micros(match self.below(10) {
            0..=4 => 0,
            5..=7 => self.below(50_000),
            8 => self.below(400_000),
            _ => self.below(1_500_000),
        }))
    }
}

/// Random traffic (bursts, gaps across window boundaries, costs 0 to 4, three keys) decides
/// exactly as the pure algorithms do, field by field.
pub async fn matches_the_pure_algorithms<S: Store>(store: &S) {
    against_the_pure_algorithms(store, "model", false).await;
}

/// The same traffic, each check asked of [`Store::apply_one_immediately`] first, through
/// [`Store::apply_one`] when it says "not here", or at random: both ways decide as the pure
/// algorithms do, and share the keys' state.
pub async fn immediately_matches_the_pure_algorithms<S: Store>(store: &S) {
    against_the_pure_algorithms(store, "immediately", true).await;
}

async fn against_the_pure_algorithms<S: Store>(store: &S, name: &str, immediately: bool) {
    let prefix = unique(name);
    let mut quotas = vec![
        Quota::fixed_window(7, Duration::from_millis(700)),
        Quota::sliding_window_log(7, Duration::from_millis(700)),
        Quota::sliding_window_counter(7, Duration::from_millis(700)),
        "3/250ms".parse().and_then(|r| Quota::token_bucket(7, r)),
        "3/250ms".parse().and_then(|r| Quota::leaky_bucket(r, 6)),
    ];
    quotas.push("7/700ms".parse().and_then(|r| {
        LeakyBucket::new(r, 6)
            .map(|l| Quota::LeakyBucket(l.with_max_delay(Duration::from_millis(300))))
    }));
    for (n, quota) in quotas.into_iter().enumerate() {
        let quota = quota.unwrap_or_else(|e| panic!("{e}"));
        let policy = Policy::new(&format!("{prefix}-{n}-{}", quota.kind()), quota.clone())
            .unwrap_or_else(|e| panic!("{e}"));
        let mut model = Model::new(&quota);
        let mut rng = Xorshift(0x9e37_79b9_7f4a_7c15 ^ n as u64);
        let mut now = T0;
        for step in 0..400 {
            now = rng.step(now);
            let key = rng.below(3) as u8;
            let cost = rng.below(5) as u32;
            let stored_key = format!("{prefix}-{key}");
            let check = Check::new(&policy, stored_key.as_bytes(), cost);
            let answered = match immediately && rng.below(4) != 0 {
                true => store.apply_one_immediately(now, check),
                false => None,
            };
            let got = match answered {
                Some(decision) => decision,
                None if immediately => store
                    .apply_one(now, check)
                    .await
                    .unwrap_or_else(|e| panic!("apply_one failed: {e}")),
                None => one(store, now, &policy, stored_key.as_bytes(), cost).await,
            };
            let want = model
                .check(key, now, cost)
                .into_decision(policy.shared_name());
            assert_eq!(
                got,
                want,
                "{} step {step} at {now} cost {cost}",
                policy.name()
            );
        }
    }
}

/// Random traffic mixing checks with charges (usage reports and true-ups, costs up to twice
/// the limit, so keys go past their limit) decides exactly as the pure algorithms do: a charge
/// is never refused, and what it leaves is what later checks see.
pub async fn charges_match_the_pure_algorithms<S: Store>(store: &S) {
    let prefix = unique("charge");
    let quotas = [
        Quota::fixed_window(7, Duration::from_millis(700)),
        Quota::sliding_window_log(7, Duration::from_millis(700)),
        Quota::sliding_window_counter(7, Duration::from_millis(700)),
        "3/250ms".parse().and_then(|r| Quota::token_bucket(7, r)),
        "3/250ms".parse().and_then(|r| Quota::leaky_bucket(r, 6)),
    ];
    for (n, quota) in quotas.into_iter().enumerate() {
        let quota = quota.unwrap_or_else(|e| panic!("{e}"));
        let policy = Policy::new(&format!("{prefix}-{n}-{}", quota.kind()), quota.clone())
            .unwrap_or_else(|e| panic!("{e}"));
        let mut model = Model::new(&quota);
        let mut rng = Xorshift(0x51ed_2701_f3a4_c6b9 ^ n as u64);
        let mut now = T0;
        for step in 0..300 {
            now = rng.step(now);
            let key = rng.below(3) as u8;
            let stored_key = format!("{prefix}-{key}");
            let charge = rng.below(3) == 0;
            let cost = rng.below(if charge { 15 } else { 5 }) as u32;
            let check = Check::new(&policy, stored_key.as_bytes(), cost);
            let (got, want) = if charge {
                let got = match store.charge(now, &[check]).await {
                    Ok(d) => d.into_first(),
                    Err(e) => panic!("store failed: {e}"),
                };
                (got, model.charge(key, now, cost))
            } else {
                (
                    Some(one(store, now, &policy, stored_key.as_bytes(), cost).await),
                    model.check(key, now, cost),
                )
            };
            let want = want.into_decision(policy.shared_name());
            assert_eq!(
                got,
                Some(want),
                "{} step {step} at {now} {} {cost}",
                policy.name(),
                if charge { "charge" } else { "check" }
            );
        }
    }
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

/// Many tasks on one key at one instant admit exactly the limit: no over-admission, no lost
/// update.
pub async fn concurrent_callers_never_over_admit<S: Store + Clone>(store: &S) {
    let policy = Policy::new(
        &unique("race"),
        Quota::fixed_window(100, Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let key = unique("race-key");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let store = store.clone();
        let policy = policy.clone();
        let key = key.clone();
        tasks.spawn(async move {
            let mut admitted = 0u32;
            for _ in 0..40 {
                let d = store
                    .apply(T0, &[Check::new(&policy, key.as_bytes(), 1)])
                    .await
                    .unwrap_or_else(|e| panic!("store failed: {e}"));
                admitted += u32::from(d.allowed());
            }
            admitted
        });
    }
    let mut total = 0;
    while let Some(admitted) = tasks.join_next().await {
        total += admitted.unwrap_or_else(|e| panic!("task failed: {e}"));
    }
    assert_eq!(total, 100, "8 × 40 requests against a limit of 100");
}

/// A store that says it [is immediate](Store::is_immediate) keeps the promise: `apply`,
/// `apply_one`, `refund` and `release` are each ready on their first poll, with a waker that
/// does nothing.
/// For a store that does not say so there is nothing to check.
pub async fn immediate_means_ready_on_first_poll<S: Store>(store: &S) {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    fn first_poll<T>(what: &str, future: impl Future<Output = T>) -> T {
        let future = std::pin::pin!(future);
        match future.poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(value) => value,
            Poll::Pending => panic!("{what}: pending on the first poll of an immediate store"),
        }
    }
    if !store.is_immediate() {
        return;
    }
    let key = unique("immediate");
    for policy in five_policies(&unique("immediate")) {
        let check = Check::new(&policy, key.as_bytes(), 1);
        let d = first_poll("apply_one", store.apply_one(T0, check))
            .unwrap_or_else(|e| panic!("apply_one failed: {e}"));
        assert!(d.allowed && d.remaining == 4, "{}: {d:?}", policy.name());
        let batch = first_poll("apply", store.apply(T0, &[check, check]))
            .unwrap_or_else(|e| panic!("apply failed: {e}"));
        assert!(batch.allowed(), "{}: {batch:?}", policy.name());
        first_poll("refund", store.refund(T0, &[check]))
            .unwrap_or_else(|e| panic!("refund failed: {e}"));
        let peek = first_poll(
            "apply_one",
            store.apply_one(T0, Check::new(&policy, key.as_bytes(), 0)),
        )
        .unwrap_or_else(|e| panic!("apply_one failed: {e}"));
        assert_eq!(
            peek.remaining,
            3,
            "{}: three taken, one given back",
            policy.name()
        );
    }
    let quota = Quota::concurrency(1, Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}"));
    let inflight =
        Policy::new(&unique("immediate-inflight"), quota).unwrap_or_else(|e| panic!("{e}"));
    let check = Check::new(&inflight, key.as_bytes(), 1).with_permit(1);
    let d = first_poll("apply_one", store.apply_one(T0, check))
        .unwrap_or_else(|e| panic!("apply_one failed: {e}"));
    assert!(d.allowed, "{d:?}");
    let back = first_poll("release", store.release(T0, &[check]))
        .unwrap_or_else(|e| panic!("release failed: {e}"));
    assert_eq!(back, 1);
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
