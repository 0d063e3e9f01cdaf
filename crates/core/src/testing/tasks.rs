//! Scenarios about a store's futures under a runtime rather than its arithmetic: many tasks
//! racing on one key, and an immediate store's futures ready at their first poll.

use std::time::Duration;

use crate::{Check, Policy, Quota, Store};

use super::{T0, five_policies, unique};

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
