//! The `Limiter` API: check, check_all, acquire (waiting for a leaky-bucket slot, refusing past
//! the bound, giving the slot back when abandoned) and its errors.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tollgate::{
    Ban, BanStatus, Check, Clock, Error, ErrorKind, Limiter, ManualClock, MemoryStore, Policy,
    Quota, Rate, Timestamp,
};

const START: Timestamp = Timestamp::from_secs(1_800_000_000);

fn limiter(
    clock: &ManualClock,
) -> Result<Limiter<MemoryStore, ManualClock>, Box<dyn std::error::Error>> {
    let rate: Rate = "10/s".parse()?;
    Ok(Limiter::builder()
        .clock(clock.clone())
        .policy(Policy::new(
            "api",
            Quota::sliding_window_counter(3, Duration::from_secs(60))?,
        )?)
        .policy(Policy::new("burst", Quota::token_bucket(2, rate)?)?)
        .policy(Policy::new("outbound", Quota::leaky_bucket(rate, 2)?)?)
        .policy(
            Policy::new("login", Quota::fixed_window(2, Duration::from_secs(10))?)?.with_ban(
                Ban::new(2, Duration::from_secs(10), Duration::from_secs(5))?,
            )?,
        )
        .build()?)
}

#[tokio::test]
async fn unknown_policies_and_impossible_costs_are_errors() -> Result<(), Box<dyn std::error::Error>>
{
    let clock = ManualClock::new(START);
    let limiter = limiter(&clock)?;
    assert!(matches!(
        limiter
            .check("nope", "k", 1)
            .await
            .map_err(Error::into_kind),
        Err(ErrorKind::UnknownPolicy(_))
    ));
    let err = limiter.check("api", "k", 4).await.err();
    assert!(
        matches!(
            err.as_ref().map(Error::kind),
            Some(ErrorKind::CostExceedsQuota {
                cost: 4,
                max: 3,
                ..
            })
        ),
        "{err:?}"
    );
    assert!(!err.is_some_and(|e| e.is_retryable()));
    Ok(())
}

#[tokio::test]
async fn duplicate_policy_names_are_rejected() -> Result<(), Box<dyn std::error::Error>> {
    let q = Quota::fixed_window(1, Duration::from_secs(1))?;
    let built = Limiter::builder()
        .policy(Policy::new("twice", q.clone())?)
        .policy(Policy::new("twice", q)?)
        .build();
    assert!(
        matches!(built.map_err(Error::into_kind), Err(ErrorKind::DuplicatePolicy(name)) if name == "twice")
    );
    Ok(())
}

#[tokio::test]
async fn check_all_is_all_or_nothing() -> Result<(), Box<dyn std::error::Error>> {
    let clock = ManualClock::new(START);
    let limiter = limiter(&clock)?;
    let (api, burst) = (
        limiter.policy("api").cloned(),
        limiter.policy("burst").cloned(),
    );
    let (Some(api), Some(burst)) = (api, burst) else {
        panic!("policies missing")
    };
    let both = [Check::new(&api, b"k", 1), Check::new(&burst, b"k", 1)];
    assert!(limiter.check_all(&both).await?.allowed());
    assert!(limiter.check_all(&both).await?.allowed());
    let third = limiter.check_all(&both).await?;
    assert!(!third.allowed(), "the bucket of 2 is empty");
    assert_eq!(third.most_restrictive().map(|d| d.policy), Some("burst"));
    // The denied request took nothing from "api": one left of 3.
    assert_eq!(limiter.check("api", "k", 0).await?.remaining, 1);
    Ok(())
}

#[tokio::test]
async fn acquire_waits_for_the_slot_on_the_clock() -> Result<(), Box<dyn std::error::Error>> {
    let clock = ManualClock::new(START);
    let limiter = limiter(&clock)?;
    // The first departs at once, the next two wait 100 ms and 200 ms.
    assert_eq!(limiter.acquire("outbound", "tenant", 1).await?.delay, None);
    let waiter = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire("outbound", "tenant", 1).await })
    };
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished(), "held until its slot");
    clock.advance(Duration::from_millis(100));
    let decision = waiter.await??;
    assert_eq!(decision.delay, Some(Duration::from_millis(100)));
    Ok(())
}

#[tokio::test]
async fn acquire_refuses_when_the_queue_is_full() -> Result<(), Box<dyn std::error::Error>> {
    let clock = ManualClock::new(START);
    let limiter = limiter(&clock)?;
    let mut held = Vec::new();
    for _ in 0..3 {
        let limiter = limiter.clone();
        held.push(tokio::spawn(async move {
            limiter.acquire("outbound", "t", 1).await
        }));
        tokio::task::yield_now().await;
    }
    let refused = limiter.acquire("outbound", "t", 1).await;
    match refused.map_err(Error::into_kind) {
        Err(ErrorKind::Refused(d)) => assert_eq!(d.retry_after, Some(Duration::from_millis(100))),
        other => panic!("expected a refusal, got {other:?}"),
    }
    clock.advance(Duration::from_secs(1));
    for h in held {
        assert!(h.await?.is_ok());
    }
    Ok(())
}

#[tokio::test]
async fn abandoned_acquire_gives_its_slot_back() -> Result<(), Box<dyn std::error::Error>> {
    let clock = ManualClock::new(START);
    let limiter = limiter(&clock)?;
    limiter.acquire("outbound", "t", 1).await?;
    let held = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire("outbound", "t", 1).await })
    };
    tokio::task::yield_now().await;
    held.abort();
    let _ = held.await;
    // The refund runs as its own task; let it.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let next = limiter.check("outbound", "t", 1).await?;
    assert_eq!(
        next.delay,
        Some(Duration::from_millis(100)),
        "the abandoned slot was reused"
    );
    Ok(())
}

#[tokio::test]
async fn acquire_within_waits_for_other_algorithms() -> Result<(), Box<dyn std::error::Error>> {
    let clock = ManualClock::new(START);
    let limiter = limiter(&clock)?;
    limiter.check("burst", "k", 2).await?;
    assert!(matches!(
        limiter
            .acquire("burst", "k", 1)
            .await
            .map_err(Error::into_kind),
        Err(ErrorKind::Refused(_))
    ));
    let waiter = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            limiter
                .acquire_within("burst", "k", 1, Duration::from_secs(1))
                .await
        })
    };
    tokio::task::yield_now().await;
    clock.advance(Duration::from_millis(100));
    assert!(waiter.await??.allowed);
    assert_eq!(
        limiter.clock().now(),
        START.saturating_add(Duration::from_millis(100))
    );
    Ok(())
}

/// A memory store that yields once before each answer, so the limiter takes its path for stores
/// that wait.
struct Yielding(MemoryStore);

impl tollgate::Store for Yielding {
    async fn apply(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
    ) -> Result<tollgate::Decisions, tollgate::StoreError> {
        tokio::task::yield_now().await;
        Ok(self.0.apply_now(now, checks))
    }

    async fn charge(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
    ) -> Result<tollgate::Decisions, tollgate::StoreError> {
        tokio::task::yield_now().await;
        Ok(self.0.charge_now(now, checks))
    }

    async fn refund(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
    ) -> Result<(), tollgate::StoreError> {
        tokio::task::yield_now().await;
        self.0.refund_now(now, checks);
        Ok(())
    }

    async fn release(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
    ) -> Result<u32, tollgate::StoreError> {
        tokio::task::yield_now().await;
        Ok(self.0.release_now(now, checks))
    }
}

/// A store that says it is immediate only after a check began (no store should): the check
/// ends in a store error rather than waiting for ever.
struct Fickle {
    store: Yielding,
    immediate: Arc<AtomicBool>,
}

impl tollgate::Store for Fickle {
    fn is_immediate(&self) -> bool {
        self.immediate.load(Ordering::Relaxed)
    }

    async fn apply(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
    ) -> Result<tollgate::Decisions, tollgate::StoreError> {
        self.store.apply(now, checks).await
    }

    async fn charge(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
    ) -> Result<tollgate::Decisions, tollgate::StoreError> {
        self.store.charge(now, checks).await
    }

    async fn refund(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
    ) -> Result<(), tollgate::StoreError> {
        self.store.refund(now, checks).await
    }

    async fn release(
        &self,
        now: Timestamp,
        checks: &[Check<'_>],
    ) -> Result<u32, tollgate::StoreError> {
        self.store.release(now, checks).await
    }
}

#[tokio::test]
async fn a_store_that_turns_immediate_during_a_check_fails_it()
-> Result<(), Box<dyn std::error::Error>> {
    let immediate = Arc::new(AtomicBool::new(false));
    let limiter = Limiter::builder()
        .store(Fickle {
            store: Yielding(MemoryStore::new()),
            immediate: Arc::clone(&immediate),
        })
        .policy(Policy::new("api", Quota::token_bucket(2, "1/s".parse()?)?)?)
        .build()?;
    assert!(limiter.check("api", "k", 1).await?.allowed);
    let check = limiter.check("api", "k", 1);
    immediate.store(true, Ordering::Relaxed);
    match check.await {
        Err(error) => {
            assert!(matches!(error.kind(), ErrorKind::Store(_)), "{error}");
            assert!(error.to_string().contains("immediate"), "{error}");
        }
        Ok(decision) => panic!("decided {decision:?}"),
    }
    // The failed check took nothing: the bucket of two has one left.
    immediate.store(false, Ordering::Relaxed);
    assert!(limiter.check("api", "k", 1).await?.allowed);
    assert!(!limiter.check("api", "k", 1).await?.allowed);
    Ok(())
}

/// `check_policy` with a policy resolved once decides exactly as `check` by name, on an
/// immediate store and on one that waits, and so do the synchronous `check_now` and
/// `check_policy_now`, through admits, denials, refills, lockouts and errors.
#[tokio::test]
async fn check_policy_and_the_synchronous_checks_decide_as_check_by_name()
-> Result<(), Box<dyn std::error::Error>> {
    let clock = ManualClock::new(START);
    let by_name = limiter(&clock)?;
    let resolved = limiter(&clock)?;
    let sync_by_name = limiter(&clock)?;
    let sync_resolved = limiter(&clock)?;
    let policies: Vec<Policy> = limiter(&clock)?.policies().cloned().collect();
    let waiting = Limiter::builder()
        .store(Yielding(MemoryStore::new()))
        .clock(clock.clone())
        .policies(policies.clone())
        .build()?;
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut lockouts = 0;
    for step in 0..600 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let policy = &policies[(seed % policies.len() as u64) as usize];
        let key = format!("k{}", (seed >> 8) % 4);
        let cost = ((seed >> 16) % 5) as u32;
        let expected = by_name.check(policy.name(), &key, cost).await;
        let handle = resolved.policy(policy.name()).ok_or("policy")?;
        let got = resolved.check_policy(handle, &key, cost).await;
        let got_waiting = waiting.check_policy(policy, &key, cost).await;
        let got_now = sync_by_name.check_now(policy.name(), &key, cost);
        let handle = sync_resolved.policy(policy.name()).ok_or("policy")?;
        let got_policy_now = sync_resolved.check_policy_now(handle, &key, cost);
        lockouts += usize::from(matches!(&expected, Ok(d) if d.ban.is_ban()));
        assert_eq!(format!("{got:?}"), format!("{expected:?}"), "step {step}");
        assert_eq!(
            format!("{got_now:?}"),
            format!("{expected:?}"),
            "step {step}"
        );
        assert_eq!(
            format!("{got_policy_now:?}"),
            format!("{expected:?}"),
            "step {step}"
        );
        assert_eq!(
            format!("{got_waiting:?}"),
            format!("{expected:?}"),
            "step {step}"
        );
        if seed.is_multiple_of(4) {
            clock.advance(Duration::from_millis((seed >> 24) % 700));
        }
    }
    assert!(lockouts > 0, "the traffic never reached a lockout");
    Ok(())
}

/// What `docs/algorithms.md` says of peeks (cost 0): admitted while the key is within its
/// quota; refused once a charge took it past its quota, until it is back; refused while the
/// key is banned, with the ban's end as the retry time, counted in the ban's denials without
/// extending it.
#[tokio::test]
async fn peeks_are_refused_past_the_quota_and_under_a_ban() -> Result<(), Box<dyn std::error::Error>>
{
    let clock = ManualClock::new(START);
    let limiter = limiter(&clock)?;
    let login = limiter.policy("login").ok_or("login")?;
    assert!(limiter.check_now("login", "k", 0)?.allowed);

    // Charged 5 of 2 in a 10 s window: a peek is denied until the window ends.
    limiter
        .store()
        .charge_now(START, &[Check::new(login, b"charged", 5)]);
    let peek = limiter.check_now("login", "charged", 0)?;
    assert!(!peek.allowed && !peek.ban.is_ban(), "{peek:?}");
    assert_eq!(
        (peek.remaining, peek.retry_after),
        (0, Some(Duration::from_secs(10)))
    );

    // Two denials ban "k" for 5 s.
    for _ in 0..2 {
        assert!(limiter.check_now("login", "k", 1)?.allowed);
    }
    assert!(!limiter.check_now("login", "k", 1)?.ban.is_ban());
    assert_eq!(limiter.check_now("login", "k", 1)?.ban, BanStatus::Started);
    let denials = |limiter: &Limiter<MemoryStore, ManualClock>| {
        let bans = limiter.store().bans_now(clock.now());
        bans.iter().map(|b| (b.denials, b.until)).next()
    };
    let before = denials(&limiter).ok_or("no ban")?;
    clock.advance(Duration::from_secs(2));
    let peek = limiter.check_now("login", "k", 0)?;
    assert!(!peek.allowed, "{peek:?}");
    assert_eq!(peek.ban, BanStatus::Active);
    assert_eq!(
        (peek.remaining, peek.retry_after),
        (0, Some(Duration::from_secs(3)))
    );
    assert_eq!(
        denials(&limiter),
        Some(before),
        "a peek is refused but is no denial: not counted, not extended"
    );
    // Once the ban is over, a peek reads the whole quota again.
    clock.advance(Duration::from_secs(10));
    let peek = limiter.check_now("login", "k", 0)?;
    assert!(peek.allowed && peek.remaining == 2, "{peek:?}");
    Ok(())
}
