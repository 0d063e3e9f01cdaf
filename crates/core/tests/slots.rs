//! Concurrency limits through the `Limiter`: slots taken with `take_slot`, given back by
//! `release` or by dropping them, taken back when their lease ends; and the calls that do not
//! fit a policy's kind refused with a reason.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use tollgate::{ErrorKind, Limiter, ManualClock, MemoryStore, Policy, Quota, Timestamp};

const TTL: Duration = Duration::from_secs(30);

fn limiter() -> (Limiter<MemoryStore, ManualClock>, ManualClock) {
    let clock = ManualClock::new(Timestamp::from_secs(1_700_000_000));
    let limiter = Limiter::builder()
        .clock(clock.clone())
        .policy(Policy::new("uploads", Quota::concurrency(2, TTL).unwrap()).unwrap())
        .policy(
            Policy::new(
                "api",
                Quota::fixed_window(5, Duration::from_secs(60)).unwrap(),
            )
            .unwrap(),
        )
        .build()
        .unwrap();
    (limiter, clock)
}

fn refused<T>(result: Result<T, tollgate::Error>) -> tollgate::Decision {
    match result.map_err(tollgate::Error::into_kind) {
        Err(ErrorKind::Refused(decision)) => *decision,
        Err(other) => panic!("not a refusal: {other}"),
        Ok(_) => panic!("admitted"),
    }
}

#[tokio::test]
async fn a_key_holds_at_most_its_limit_of_slots_and_each_release_frees_one() {
    let (limiter, clock) = limiter();
    let first = limiter.take_slot("uploads", "tenant-7").await.unwrap();
    assert_eq!(first.decision().remaining, 1);
    assert_eq!(first.key(), b"tenant-7");
    let second = limiter.take_slot("uploads", "tenant-7").await.unwrap();
    assert_eq!(second.decision().remaining, 0);
    let third = refused(limiter.take_slot("uploads", "tenant-7").await);
    assert_eq!(third.policy, "uploads");
    // A slot may come back any moment: try again in a second (or when the earliest lease
    // ends, if sooner).
    assert_eq!(third.retry_after, Some(Duration::from_secs(1)));
    // Another key has slots of its own.
    let other = limiter.take_slot("uploads", "tenant-8").await.unwrap();
    // A release frees exactly one slot.
    clock.advance(Duration::from_secs(1));
    assert!(first.release().await.unwrap());
    let again = limiter.take_slot("uploads", "tenant-7").await.unwrap();
    refused(limiter.take_slot("uploads", "tenant-7").await);
    drop((again, other));
    // A dropped slot is given back at once on the memory store.
    let last = limiter.take_slot("uploads", "tenant-7").await.unwrap();
    assert_eq!(last.decision().remaining, 0);
    drop(second);
    drop(last);
    let a = limiter.take_slot("uploads", "tenant-7").await.unwrap();
    let b = limiter.take_slot("uploads", "tenant-7").await.unwrap();
    assert!(a.release().await.unwrap() && b.release().await.unwrap());
}

#[tokio::test]
async fn a_slot_never_given_back_is_taken_back_when_its_lease_ends() {
    let (limiter, clock) = limiter();
    let kept = [
        limiter.take_slot("uploads", "k").await.unwrap(),
        limiter.take_slot("uploads", "k").await.unwrap(),
    ];
    refused(limiter.take_slot("uploads", "k").await);
    clock.advance(TTL);
    let fresh = limiter.take_slot("uploads", "k").await.unwrap();
    // Their leases ended: releasing them says so, and frees nothing of the fresh slot's.
    for slot in kept {
        assert!(!slot.release().await.unwrap());
    }
    assert_eq!(fresh.decision().remaining, 1);
    let other = limiter.take_slot("uploads", "k").await.unwrap();
    refused(limiter.take_slot("uploads", "k").await);
    drop((fresh, other));
}

/// A check, a report or an acquire of a concurrency limit cannot say when its request ends:
/// each is refused with a reason that names the call that fits. And a slot of a policy that is
/// not a concurrency limit is refused too.
#[tokio::test]
async fn calls_that_do_not_fit_the_policy_say_which_does() {
    let (limiter, _) = limiter();
    let wrong = |e: tollgate::Error| match e.into_kind() {
        ErrorKind::WrongKind { policy, reason } => format!("{policy}: {reason}"),
        other => panic!("{other}"),
    };
    for error in [
        limiter.check("uploads", "k", 1).await.unwrap_err(),
        limiter.check_now("uploads", "k", 1).unwrap_err(),
        limiter.report("uploads", "k", 1).await.unwrap_err(),
        limiter.acquire("uploads", "k", 1).await.unwrap_err(),
    ] {
        let text = error.to_string();
        assert!(text.contains("take_slot"), "{text}");
        assert!(wrong(error).starts_with("uploads: limits requests in flight"));
    }
    let error = limiter.take_slot("api", "k").await.err().unwrap();
    assert!(wrong(error).contains("is not a concurrency limit"));
    // The policy is still there by name, and unknown names stay unknown.
    assert!(limiter.policy("uploads").is_some());
    let unknown = limiter.check("nope", "k", 1).await.unwrap_err();
    assert!(matches!(unknown.kind(), ErrorKind::UnknownPolicy(_)));
    let unknown = limiter.take_slot("nope", "k").await.err().unwrap();
    assert!(matches!(unknown.kind(), ErrorKind::UnknownPolicy(_)));
    // The other policy is checked as before.
    assert!(limiter.check("api", "k", 1).await.unwrap().allowed);
}

/// Many tasks on two threads, each holding a slot for a while: never more than the limit at
/// once, and every slot comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_held_by_racing_tasks_never_exceed_the_limit() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let limiter = Limiter::builder()
        .policy(Policy::new("jobs", Quota::concurrency(3, TTL).unwrap()).unwrap())
        .build()
        .unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let admitted = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (limiter, inside, most, admitted) = (
                limiter.clone(),
                Arc::clone(&inside),
                Arc::clone(&most),
                Arc::clone(&admitted),
            );
            tokio::spawn(async move {
                for _ in 0..20 {
                    if let Ok(slot) = limiter.take_slot("jobs", "shared").await {
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        admitted.fetch_add(1, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        assert!(slot.release().await.unwrap());
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert!(most.load(Ordering::SeqCst) <= 3);
    assert!(admitted.load(Ordering::SeqCst) >= 20, "some work got slots");
    // All given back: the whole limit is free.
    let mut slots = Vec::new();
    for _ in 0..3 {
        slots.push(limiter.take_slot("jobs", "shared").await.unwrap());
    }
    refused(limiter.take_slot("jobs", "shared").await);
    drop(slots);
}
