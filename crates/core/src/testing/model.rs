//! The reference the randomized scenarios are held to: a reproducible generator of traffic,
//! the pure algorithms keyed by a small key ([`Model`]), and the scenarios that drive random
//! traffic through a store and the model alike. The other scenario files draw on both too.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::algorithm::{
    Algorithm, FixedWindow, LeakyBucket, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};
use crate::{Check, Policy, Quota, Store, Timestamp, Verdict};

use super::{T0, not_behind, one, unique};

/// A deterministic generator, so a failure reproduces (xorshift64*).
pub(super) struct Xorshift(pub(super) u64);

impl Xorshift {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub(super) enum Model {
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
    pub(super) fn new(quota: &Quota) -> Self {
        match quota {
            Quota::FixedWindow(a) => Model::Fixed(a.clone(), HashMap::new()),
            Quota::SlidingWindowLog(a) => Model::Log(a.clone(), HashMap::new()),
            Quota::SlidingWindowCounter(a) => Model::Counter(a.clone(), HashMap::new()),
            Quota::TokenBucket(a) => Model::Token(a.clone(), HashMap::new()),
            Quota::LeakyBucket(a) => Model::Leaky(a.clone(), HashMap::new()),
            Quota::Concurrency(_) => panic!("concurrency has a model of its own"),
        }
    }

    pub(super) fn check(&mut self, key: u8, now: Timestamp, cost: u32) -> Verdict {
        match self {
            Model::Fixed(a, s) => a.check(s.entry(key).or_default(), now, cost),
            Model::Log(a, s) => a.check(s.entry(key).or_default(), now, cost),
            Model::Counter(a, s) => a.check(s.entry(key).or_default(), now, cost),
            Model::Token(a, s) => a.check(s.entry(key).or_default(), now, cost),
            Model::Leaky(a, s) => a.check(s.entry(key).or_default(), now, cost),
        }
    }

    /// Charges `cost` whatever the quota says; what is left, as a peek reports it.
    pub(super) fn charge(&mut self, key: u8, now: Timestamp, cost: u32) -> Verdict {
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
    pub(super) fn evaluate(&mut self, key: u8, now: Timestamp, cost: u32) -> Verdict {
        match self {
            Model::Fixed(a, s) => a.evaluate(s.entry(key).or_default(), now, cost),
            Model::Log(a, s) => a.evaluate(s.entry(key).or_default(), now, cost),
            Model::Counter(a, s) => a.evaluate(s.entry(key).or_default(), now, cost),
            Model::Token(a, s) => a.evaluate(s.entry(key).or_default(), now, cost),
            Model::Leaky(a, s) => a.evaluate(s.entry(key).or_default(), now, cost),
        }
    }

    /// Gives `cost` back.
    pub(super) fn refund(&mut self, key: u8, now: Timestamp, cost: u32) {
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
    pub(super) fn step(&mut self, now: Timestamp) -> Timestamp {
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
        let started = Instant::now();
        for step in 0..400 {
            now = not_behind(rng.step(now), T0, started);
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
        let started = Instant::now();
        for step in 0..300 {
            now = not_behind(rng.step(now), T0, started);
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
