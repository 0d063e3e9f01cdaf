//! A charge far past the limit: a usage report (`mode = "report"`) of a cost in the hundreds of
//! thousands, or near 2^32, against a quota of 5. The charge is taken, never refused; what it
//! leaves is what every later check, batch, charge and refund sees, exactly as the pure
//! algorithms have it. A store may keep such a charge in any form (the Redis store keeps a log's
//! units past its limit as a count, not one member each, and bucket times past 2^53 µs as exact
//! strings), but must decide alike.

use std::time::Duration;

use crate::quota::Rate;
use crate::{Check, Decision, Policy, Quota, Store, Verdict};

use super::{Model, T0, apply, one, unique};

/// One step of the scenario, `at` µs after [`T0`].
#[derive(Clone, Copy, Debug)]
enum Step {
    Check(u64, u32),
    Charge(u64, u32),
    Refund(u64, u32),
    /// Two checks of the key in one request, while it is past its quota (both denied).
    Batch(u64, u32, u32),
}

/// Every algorithm, charged 200,000 and 2^32 − 6 past a quota of 5 (and charged again, refunded
/// in part then in full, and asked later on), decides field by field as the pure algorithms
/// do. The buckets include one refilling a token every 12 s, whose time such a charge puts
/// about 1,600 years ahead (past 2^53 µs, where a double is no longer exact), and one
/// refilling every 400 days, whose time it puts past the latest a bucket may hold (capped).
pub async fn charges_far_past_the_limit<S: Store>(store: &S) {
    let prefix = unique("far");
    let minute = Duration::from_secs(60);
    let days_400 = Duration::from_secs(400 * 86_400);
    let quotas = [
        Quota::fixed_window(5, minute),
        Quota::sliding_window_counter(5, minute),
        Rate::new(5, minute).and_then(|r| Quota::token_bucket(5, r)),
        Rate::new(5, minute).and_then(|r| Quota::leaky_bucket(r, 4)),
        Rate::new(1, days_400).and_then(|r| Quota::token_bucket(1, r)),
        Rate::new(1, days_400).and_then(|r| Quota::leaky_bucket(r, 0)),
        Quota::sliding_window_log(5, minute),
    ];
    for (n, quota) in quotas.into_iter().enumerate() {
        let quota = quota.unwrap_or_else(|e| panic!("scenario quota: {e}"));
        let log = matches!(quota, Quota::SlidingWindowLog(_));
        let policy = Policy::new(&format!("{prefix}-{n}-{}", quota.kind()), quota.clone())
            .unwrap_or_else(|e| panic!("scenario policy: {e}"));
        for big in [200_000, u32::MAX - 5] {
            let mut steps = vec![
                Step::Check(0, 2),
                Step::Charge(1_000, big),
                Step::Check(1_000, 0),
                Step::Check(1_000, 1),
                Step::Check(1_000, 5),
                Step::Check(1_000, 6),
                Step::Charge(1_000, 0),
                Step::Batch(2_000, 1, 0),
                Step::Check(2_000, 1),
            ];
            // A second charge: counts saturate at 2^32 − 1, bucket times stop at the latest
            // they may hold. (Not the log's second 2^32 − 6: the scenario keeps a log's total
            // within 2^32 − 1, as the memory store's log counts it.)
            if !log || big == 200_000 {
                steps.extend([
                    Step::Charge(2_000, big),
                    Step::Check(2_000, 0),
                    Step::Check(2_000, 1),
                    Step::Refund(3_000, big),
                ]);
            }
            steps.extend([
                // Given back in part, then in full (and more: never below empty).
                Step::Refund(500_000, big - 1),
                Step::Check(500_000, 0),
                Step::Check(500_000, 1),
                Step::Check(500_000, 2),
                Step::Check(500_001, 3),
                Step::Charge(600_000, big),
                Step::Check(600_000, 1),
                Step::Refund(700_000, big),
                Step::Refund(700_000, 1),
                Step::Check(700_000, 0),
                Step::Check(700_000, 5),
                Step::Charge(800_000, big),
                // Later: the windows roll over (the counter still weighs the previous one);
                // the buckets are still far ahead.
                Step::Check(61_000_000, 0),
                Step::Check(61_000_000, 1),
                Step::Check(130_000_000, 0),
                Step::Check(130_000_000, 1),
                Step::Refund(130_000_000, big / 2),
                Step::Check(130_000_000, 1),
            ]);
            run(store, &policy, &quota, big, &steps).await;
        }
    }
}

async fn run<S: Store>(store: &S, policy: &Policy, quota: &Quota, big: u32, steps: &[Step]) {
    let key = unique("far-key");
    let key = key.as_bytes();
    let mut model = Model::new(quota);
    let name = policy.shared_name();
    let decision = |v: Verdict| v.into_decision(name);
    for (i, &step) in steps.iter().enumerate() {
        let what = format!("{} (charged {big}) step {i}: {step:?}", policy.name());
        let at = |micros: u64| T0.saturating_add(Duration::from_micros(micros));
        match step {
            Step::Check(t, cost) => {
                let got = one(store, at(t), policy, key, cost).await;
                assert_eq!(got, decision(model.check(0, at(t), cost)), "{what}");
            }
            Step::Charge(t, cost) => {
                let got = match store.charge(at(t), &[Check::new(policy, key, cost)]).await {
                    Ok(d) => d.into_first(),
                    Err(e) => panic!("{what}: store failed: {e}"),
                };
                let want = decision(model.charge(0, at(t), cost));
                assert_eq!(got, Some(want), "{what}");
            }
            Step::Refund(t, cost) => {
                if let Err(e) = store.refund(at(t), &[Check::new(policy, key, cost)]).await {
                    panic!("{what}: refund failed: {e}");
                }
                model.refund(0, at(t), cost);
            }
            Step::Batch(t, a, b) => {
                let checks = [Check::new(policy, key, a), Check::new(policy, key, b)];
                let got = apply(store, at(t), &checks).await.as_slice().to_vec();
                let want: Vec<Decision> = [a, b]
                    .into_iter()
                    .map(|cost| model.evaluate(0, at(t), cost))
                    .inspect(|v| assert!(!v.allowed, "{what}: the scenario expects a denial"))
                    .map(decision)
                    .collect();
                assert_eq!(got, want, "{what}");
            }
        }
    }
}
