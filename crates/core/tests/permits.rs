//! Concurrency limits: the pure algorithm against a naive reference (a plain list of permits,
//! scanned whole on every step) on random traffic with a manual clock, and what the memory store
//! keeps for it (keys counted, swept and evicted like any state, memory bounded by the limit).
//!
//! Invariants checked on every step:
//! - the verdict (allowed, remaining, reset, retry_after) equals the reference's;
//! - never more than `limit` permits live;
//! - `remaining` is exact: that many new permits fit at the same instant and one more does not;
//! - a denial's `retry_after` is at most a second, and when the earliest permit expires sooner
//!   it is exact: still denied a microsecond earlier, admitted on time;
//! - a release reports whether the permit was still held, and the reference agrees.

use std::time::Duration;

use proptest::prelude::*;
use tollgate::algorithm::{Concurrency, ConcurrencyState};
use tollgate::{Check, ManualClock, MemoryStore, Policy, Quota, Store, Timestamp, Verdict};

const SECOND: u64 = 1_000_000;

/// The naive model: permits as `(id, expires_at)` in arrival order.
struct Reference {
    limit: u64,
    ttl: u64,
    permits: Vec<(u64, u64)>,
}

impl Reference {
    fn live(&mut self, now: u64) {
        self.permits.retain(|&(_, e)| e > now);
    }

    fn acquire(&mut self, now: u64, cost: u32, id: u64) -> Verdict {
        self.live(now);
        let cost = u64::from(cost);
        let live = self.permits.len() as u64;
        let held = self.permits.iter().any(|&(p, _)| p == id && id != 0);
        let others: Vec<u64> = self
            .permits
            .iter()
            .filter(|&&(p, _)| !(p == id && id != 0))
            .map(|&(_, e)| e)
            .collect();
        let earliest = self.permits.iter().map(|&(_, e)| e).min();
        // 0 while a permit is free; once full, until the earliest one expires, at most 1 s.
        let soon = |remaining: u64, earliest: Option<u64>| match earliest {
            Some(e) if remaining == 0 => (e - now).clamp(1, SECOND),
            _ => 0,
        };
        let reset = soon(self.limit - live, earliest);
        let verdict = |allowed, remaining, reset, retry| Verdict {
            allowed,
            limit: self.limit,
            remaining,
            reset_micros: reset,
            retry_after_micros: retry,
            delay_micros: 0,
        };
        if cost > self.limit || (cost > 0 && id == 0) {
            return verdict(false, self.limit - live, reset, None);
        }
        if cost == 0 {
            return verdict(true, self.limit - live, reset, None);
        }
        if others.len() as u64 + cost > self.limit {
            let first_other = others.iter().min().copied().unwrap_or(now);
            let retry = (first_other - now).min(SECOND);
            return verdict(false, self.limit - live, reset, Some(retry));
        }
        let expires = now + self.ttl;
        if held {
            for permit in &mut self.permits {
                if permit.0 == id {
                    permit.1 = expires;
                }
            }
        } else {
            self.permits.push((id, expires));
        }
        let after = self.permits.len() as u64;
        let first = self.permits.iter().map(|&(_, e)| e).min();
        verdict(
            true,
            self.limit - after,
            soon(self.limit - after, first),
            None,
        )
    }

    fn release(&mut self, now: u64, id: u64) -> bool {
        self.live(now);
        let before = self.permits.len();
        self.permits.retain(|&(p, _)| !(p == id && id != 0));
        self.permits.len() < before
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// Time passes.
    Wait(u64),
    Acquire {
        cost: u32,
        id: u64,
    },
    Release {
        id: u64,
    },
}

fn ops(ttl: u64, limit: u32) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => prop_oneof![
            3 => 0..ttl / 10,
            1 => 0..ttl * 2,
        ].prop_map(Op::Wait),
        6 => (prop_oneof![1 => Just(0u32), 8 => Just(1u32), 1 => 2..=limit + 1], 0..12u64)
            .prop_map(|(cost, id)| Op::Acquire { cost, id }),
        3 => (0..12u64).prop_map(|id| Op::Release { id }),
    ];
    prop::collection::vec(op, 1..150)
}

fn check_remaining_is_exact(
    alg: &Concurrency,
    state: &ConcurrencyState,
    now: Timestamp,
    v: &Verdict,
) {
    let mut probe = state.clone();
    // Fresh ids, none of them held.
    for i in 0..v.remaining {
        let fresh = alg.check(&mut probe, now, 1, 1_000 + i);
        assert!(
            fresh.allowed,
            "remaining said {} but permit {i} was denied",
            v.remaining
        );
    }
    assert!(
        !alg.check(&mut probe, now, 1, 999_999).allowed,
        "remaining said {} but one more fit",
        v.remaining
    );
}

fn check_retry_after(
    alg: &Concurrency,
    state: &ConcurrencyState,
    now: Timestamp,
    v: &Verdict,
    cost: u32,
    id: u64,
) {
    let Some(retry) = v.retry_after_micros else {
        return;
    };
    assert!(retry > 0 && retry <= SECOND, "retry_after {retry}");
    // Below a second, the earliest permit's expiry: exact if nobody gives one back. (A cost
    // above 1 may need more than one permit back; the rule is still "soon".)
    if retry < SECOND && cost == 1 {
        let at = |us: u64| Timestamp::from_micros(now.as_micros() + us);
        assert!(
            !alg.evaluate(&mut state.clone(), at(retry - 1), cost, id)
                .allowed
        );
        assert!(
            alg.evaluate(&mut state.clone(), at(retry), cost, id)
                .allowed
        );
    }
}

fn run(limit: u32, ttl: u64, start: u64, trace: &[Op]) {
    let alg = Concurrency::new(limit, Duration::from_micros(ttl)).unwrap_or_else(|e| panic!("{e}"));
    let clock = ManualClock::new(Timestamp::from_micros(start));
    let mut reference = Reference {
        limit: u64::from(limit),
        ttl,
        permits: Vec::new(),
    };
    let mut state = ConcurrencyState::default();
    for op in trace {
        let now = tollgate::Clock::now(&clock);
        match *op {
            Op::Wait(us) => clock.advance(Duration::from_micros(us)),
            Op::Release { id } => {
                let held = alg.release(&mut state, now, id);
                assert_eq!(
                    held,
                    reference.release(now.as_micros(), id),
                    "release {id} at {now}"
                );
            }
            Op::Acquire { cost, id } => {
                let verdict = alg.evaluate(&mut state.clone(), now, cost, id);
                let want = reference.acquire(now.as_micros(), cost, id);
                assert_eq!(verdict, want, "cost {cost} permit {id} at {now}");
                check_remaining_is_exact(
                    &alg,
                    &{
                        let mut s = state.clone();
                        alg.commit(&mut s, now, u32::from(verdict.allowed) * cost, id);
                        s
                    },
                    now,
                    &verdict,
                );
                if !verdict.allowed {
                    check_retry_after(&alg, &state, now, &verdict, cost, id);
                }
                assert_eq!(
                    alg.check(&mut state, now, cost, id),
                    verdict,
                    "evaluate then commit"
                );
            }
        }
        let live = state
            .permits
            .iter()
            .filter(|&&(e, _)| e > now.as_micros())
            .count();
        assert!(live <= limit as usize, "{live} permits live, limit {limit}");
        assert!(
            state.permits.capacity() <= limit as usize,
            "room for more than the limit"
        );
        assert!(
            state.permits.windows(2).all(|w| w[0] <= w[1]),
            "out of order"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn concurrency_matches_reference(
        limit in 1u32..6,
        ttl in prop_oneof![Just(1u64), 1..5_000u64, 1..600 * SECOND],
        start in 1_700_000_000_000_000u64..1_700_000_100_000_000,
        trace in ops(5 * SECOND, 6),
    ) {
        run(limit, ttl, start, &trace);
    }

    /// The memory store decides as the pure algorithm, through its shared path (known keys) and
    /// its exclusive one (new keys, releases), and keeps a key exactly while a permit lives.
    #[test]
    fn the_memory_store_matches_the_algorithm(
        limit in 1u32..5,
        trace in ops(5 * SECOND, 5),
    ) {
        let quota = Quota::concurrency(limit, Duration::from_secs(5)).unwrap_or_else(|e| panic!("{e}"));
        let Quota::Concurrency(alg) = quota.clone() else { unreachable!() };
        let policy = Policy::new("inflight", quota).unwrap_or_else(|e| panic!("{e}"));
        let store = MemoryStore::new();
        let clock = ManualClock::new(Timestamp::from_secs(1_800_000_000));
        let mut state = ConcurrencyState::default();
        for op in &trace {
            let now = tollgate::Clock::now(&clock);
            match *op {
                Op::Wait(us) => clock.advance(Duration::from_micros(us)),
                Op::Release { id } => {
                    let check = Check::new(&policy, b"k", 1).with_permit(id);
                    prop_assert_eq!(
                        store.release_now(now, &[check]),
                        u32::from(alg.release(&mut state, now, id))
                    );
                }
                Op::Acquire { cost, id } => {
                    let check = Check::new(&policy, b"k", cost).with_permit(id);
                    let got = store.apply_one_now(now, &check);
                    let want = alg.check(&mut state, now, cost, id);
                    prop_assert_eq!(got, want.into_decision("inflight"));
                }
            }
            store.purge_expired(now);
            let live = state.permits.iter().any(|&(e, _)| e > now.as_micros());
            prop_assert_eq!(store.len(), usize::from(live));
        }
    }
}

/// A key whose permits were all given back or all expired is gone: counted in `len`, swept by
/// `purge_expired`, and what eviction drops when the store is full.
#[tokio::test]
async fn keys_are_counted_swept_and_evicted() -> Result<(), Box<dyn std::error::Error>> {
    let policy = Policy::new("inflight", Quota::concurrency(2, Duration::from_secs(60))?)?;
    let store = MemoryStore::builder().max_keys(64).shards(1).build();
    let t0 = Timestamp::from_secs(1_800_000_000);
    let check = |key: &'static [u8], id| Check::new(&policy, key, 1).with_permit(id);
    assert!(store.apply(t0, &[check(b"a", 1)]).await?.allowed());
    assert!(store.apply(t0, &[check(b"a", 2)]).await?.allowed());
    assert!(store.apply(t0, &[check(b"b", 1)]).await?.allowed());
    assert_eq!(store.len(), 2);
    assert_eq!(store.release(t0, &[check(b"b", 1)]).await?, 1);
    assert_eq!(
        store.len(),
        1,
        "a key with no permit left is dropped at once"
    );
    let later = t0.saturating_add(Duration::from_secs(60));
    assert_eq!(store.purge_expired(later), 1, "expired permits: swept");
    assert!(store.is_empty());
    // Full of keys holding permits: new keys evict the least at stake, never grow past it.
    let keys: Vec<Vec<u8>> = (0..200u32).map(|i| i.to_le_bytes().to_vec()).collect();
    for (i, key) in keys.iter().enumerate() {
        let d = store
            .apply(
                later,
                &[Check::new(&policy, key, 1).with_permit(i as u64 + 1)],
            )
            .await?;
        assert!(d.allowed());
        assert!(store.len() <= store.max_keys());
    }
    Ok(())
}

/// A request whose window denies it holds no permit, and one the permits deny takes nothing of
/// the window, in the memory store's batch path, also with the concurrency key new.
#[test]
fn a_batch_denied_anywhere_holds_no_permit() -> Result<(), Box<dyn std::error::Error>> {
    let inflight = Policy::new("inflight", Quota::concurrency(1, Duration::from_secs(60))?)?;
    let window = Policy::new("window", Quota::fixed_window(1, Duration::from_secs(60))?)?;
    let store = MemoryStore::new();
    let t0 = Timestamp::from_secs(1_800_000_000);
    assert!(
        store
            .apply_now(t0, &[Check::new(&window, b"k", 1)])
            .allowed()
    );
    let batch = [
        Check::new(&inflight, b"k", 1).with_permit(7),
        Check::new(&window, b"k", 1),
    ];
    assert!(!store.apply_now(t0, &batch).allowed());
    assert_eq!(store.len(), 1, "the new concurrency key was taken back");
    assert_eq!(store.release_now(t0, &batch), 0);
    // Renewed in a denied batch: its expiry is put back.
    assert!(store.apply_now(t0, &batch[..1]).allowed());
    let later = t0.saturating_add(Duration::from_secs(30));
    assert!(!store.apply_now(later, &batch).allowed());
    let peek = store.apply_now(later, &[Check::new(&inflight, b"k", 0)]);
    assert_eq!(
        (peek.as_slice()[0].remaining, peek.as_slice()[0].reset),
        (0, Duration::from_secs(1)),
        "still held, so the key is full"
    );
    // Its first expiry stands: another permit is admitted at it.
    let expiry = t0.saturating_add(Duration::from_secs(60));
    let other = [Check::new(&inflight, b"k", 1).with_permit(8)];
    assert!(
        store.apply_now(expiry, &other).allowed(),
        "the renewal was undone"
    );
    Ok(())
}
