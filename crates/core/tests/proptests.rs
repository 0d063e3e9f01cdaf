//! Property tests: each algorithm against a naive reference model built differently (from the
//! full history of admitted requests, or by simulating tokens and water levels), on random
//! arrival times and costs with a controlled clock.
//!
//! Invariants checked on every step:
//! - the decision (allowed, remaining) equals the reference model's;
//! - `remaining` is exact: exactly that many unit requests fit at the same instant;
//! - `retry_after` is exact: the same request is still denied a microsecond (and a millisecond)
//!   earlier and admitted on time;
//! - a cost above the quota is denied with no retry time;
//! - the windowed totals never exceed what the algorithm allows.

use std::time::Duration;

use proptest::prelude::*;
use tollgate::algorithm::{
    Algorithm, FixedWindow, LeakyBucket, SlidingWindowCounter, SlidingWindowLog,
    SlidingWindowLogState, TokenBucket,
};
use tollgate::{Check, MemoryStore, Policy, Quota, Rate, Timestamp, Verdict};

/// A naive model of one algorithm for one key.
trait Reference {
    /// Whether a request of `cost` at `now` is admitted, and what remains afterwards; records it
    /// when admitted.
    fn step(&mut self, now: u64, cost: u32) -> (bool, u64);
}

/// The history of admitted requests, shared by the window references.
#[derive(Default)]
struct History(Vec<(u64, u32)>);

impl History {
    fn sum(&self, from: u64, to: u64) -> u64 {
        self.0
            .iter()
            .filter(|(t, _)| *t >= from && *t < to)
            .map(|(_, c)| u64::from(*c))
            .sum()
    }
}

struct FixedRef {
    limit: u64,
    window: u64,
    history: History,
}

impl Reference for FixedRef {
    fn step(&mut self, now: u64, cost: u32) -> (bool, u64) {
        let start = now / self.window * self.window;
        let used = self.history.sum(start, start + self.window);
        let cost = u64::from(cost);
        if used + cost <= self.limit {
            self.history.0.push((now, cost as u32));
            (true, self.limit - used - cost)
        } else {
            (false, self.limit - used)
        }
    }
}

struct LogRef {
    limit: u64,
    window: u64,
    history: History,
}

impl Reference for LogRef {
    fn step(&mut self, now: u64, cost: u32) -> (bool, u64) {
        let used = self
            .history
            .sum((now + 1).saturating_sub(self.window), now + 1);
        let cost = u64::from(cost);
        if used + cost <= self.limit {
            self.history.0.push((now, cost as u32));
            (true, self.limit - used - cost)
        } else {
            (false, self.limit - used)
        }
    }
}

struct CounterRef {
    limit: u64,
    window: u64,
    history: History,
}

impl Reference for CounterRef {
    fn step(&mut self, now: u64, cost: u32) -> (bool, u64) {
        let w = self.window;
        let start = now / w * w;
        let current = u128::from(self.history.sum(start, start + w));
        let previous = u128::from(self.history.sum(start.saturating_sub(w), start));
        let overlap = u128::from(w - (now - start));
        let (w, limit, c) = (u128::from(w), u128::from(self.limit), u128::from(cost));
        let used = previous * overlap + current * w;
        if used + c * w <= limit * w {
            self.history.0.push((now, cost));
            (true, ((limit * w - used - c * w) / w) as u64)
        } else {
            (false, ((limit * w).saturating_sub(used) / w) as u64)
        }
    }
}

/// Counts tokens, in microseconds of refill time: full at `capacity × interval`.
struct TokenRef {
    capacity: u64,
    interval: u64,
    level: u64,
    last: u64,
}

impl Reference for TokenRef {
    fn step(&mut self, now: u64, cost: u32) -> (bool, u64) {
        let full = self.capacity * self.interval;
        self.level = (self.level + (now - self.last)).min(full);
        self.last = now;
        let need = u64::from(cost) * self.interval;
        if self.level >= need {
            self.level -= need;
            (true, self.level / self.interval)
        } else {
            (false, self.level / self.interval)
        }
    }
}

/// Water in the bucket, in microseconds of draining time.
struct LeakyRef {
    depth: u64,
    interval: u64,
    max_delay: Option<u64>,
    water: u64,
    last: u64,
}

impl LeakyRef {
    fn room(&self) -> u64 {
        let by_depth = (self.depth - self.water.min(self.depth)) / self.interval;
        match self.max_delay {
            Some(max) if self.water > max => 0,
            Some(max) => by_depth.min((max - self.water) / self.interval + 1),
            None => by_depth,
        }
    }
}

impl Reference for LeakyRef {
    fn step(&mut self, now: u64, cost: u32) -> (bool, u64) {
        self.water = self.water.saturating_sub(now - self.last);
        self.last = now;
        let add = u64::from(cost) * self.interval;
        let fits = self.water + add <= self.depth && self.max_delay.is_none_or(|m| self.water <= m);
        if fits {
            self.water += add;
        }
        (fits, self.room())
    }
}

/// Runs a trace through an algorithm and its reference, checking every invariant.
fn run<A: Algorithm>(
    alg: &A,
    reference: &mut dyn Reference,
    start: u64,
    trace: &[(u64, u32)],
) -> Vec<(u64, u32, Verdict)> {
    let mut state = A::State::default();
    let mut now = start;
    let mut admitted = Vec::new();
    for &(gap, cost) in trace {
        now += gap;
        let t = Timestamp::from_micros(now);
        let verdict = alg.evaluate(&mut state.clone(), t, cost);
        if cost > alg.max_cost() {
            assert!(!verdict.allowed, "cost {cost} above the quota was admitted");
            assert_eq!(
                verdict.retry_after_micros, None,
                "a final denial must not offer a retry"
            );
            continue;
        }
        let (ref_allowed, ref_remaining) = reference.step(now, cost);
        assert_eq!(
            verdict.allowed, ref_allowed,
            "at {now} cost {cost}: {verdict:?}"
        );
        assert_eq!(
            verdict.remaining, ref_remaining,
            "remaining at {now} cost {cost}"
        );
        assert!(verdict.remaining <= verdict.limit);
        check_remaining_is_exact(alg, &state, t, &verdict, cost);
        if !verdict.allowed {
            check_retry_after_is_exact(alg, &state, t, &verdict, cost);
        }
        let expected = evaluated_then_committed(alg, &state, t, cost);
        let applied = alg.check(&mut state, t, cost);
        assert_eq!(applied, verdict, "evaluate then commit equals check");
        assert_eq!(
            format!("{state:?}"),
            expected,
            "check leaves what commit would"
        );
        if applied.allowed && cost > 0 {
            admitted.push((now, cost, applied));
        }
    }
    admitted
}

/// The state `check` must leave, by the trait's definition: evaluate, and commit if admitted.
/// (An algorithm may fuse the two in its own `check`.) As its `Debug` text: states need not
/// be comparable.
fn evaluated_then_committed<A: Algorithm>(
    alg: &A,
    state: &A::State,
    now: Timestamp,
    cost: u32,
) -> String {
    let mut state = state.clone();
    if alg.evaluate(&mut state, now, cost).allowed {
        alg.commit(&mut state, now, cost);
    }
    format!("{state:?}")
}

fn check_remaining_is_exact<A: Algorithm>(
    alg: &A,
    state: &A::State,
    now: Timestamp,
    verdict: &Verdict,
    cost: u32,
) {
    let mut probe = state.clone();
    if verdict.allowed {
        alg.commit(&mut probe, now, cost);
    }
    for i in 0..verdict.remaining.min(64) {
        assert!(
            alg.check(&mut probe, now, 1).allowed,
            "remaining said {} but unit request {i} was denied",
            verdict.remaining
        );
    }
    if verdict.remaining < 64 {
        assert!(
            !alg.check(&mut probe, now, 1).allowed,
            "remaining said {} but one more fit",
            verdict.remaining
        );
    }
}

fn check_retry_after_is_exact<A: Algorithm>(
    alg: &A,
    state: &A::State,
    now: Timestamp,
    verdict: &Verdict,
    cost: u32,
) {
    let retry = verdict
        .retry_after_micros
        .unwrap_or_else(|| panic!("denied cost {cost} <= max without retry_after"));
    assert!(retry > 0, "denied with a zero retry_after");
    let at = |micros: u64| Timestamp::from_micros(micros);
    let on_time = now.as_micros() + retry;
    assert!(
        alg.evaluate(&mut state.clone(), at(on_time), cost).allowed,
        "denied again at retry_after {retry}µs"
    );
    assert!(
        !alg.evaluate(&mut state.clone(), at(on_time - 1), cost)
            .allowed,
        "admitted 1µs before retry_after {retry}µs"
    );
    if retry > 1_000 {
        assert!(
            !alg.evaluate(&mut state.clone(), at(on_time - 1_000), cost)
                .allowed
        );
    }
}

/// Gaps that mix bursts (0), short gaps and gaps across whole windows.
fn trace(window: u64, max_cost: u32) -> impl Strategy<Value = Vec<(u64, u32)>> {
    let gap = prop_oneof![
        4 => Just(0u64),
        4 => 0..window / 10,
        2 => 0..window,
        1 => 0..window * 3,
    ];
    prop::collection::vec((gap, 0..=max_cost + 1), 1..120)
}

/// A start aligned to nothing in particular, so windows begin mid-trace.
fn start() -> impl Strategy<Value = u64> {
    1_700_000_000_000_000u64..1_700_000_100_000_000
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn fixed_window_matches_reference(
        limit in 1u32..12, window_ms in 1u64..2_000, start in start(),
        trace in trace(2_000_000, 12),
    ) {
        let window = window_ms * 1_000;
        let alg = FixedWindow::new(limit, Duration::from_micros(window)).unwrap();
        let mut r = FixedRef { limit: limit.into(), window, history: History::default() };
        let admitted = run(&alg, &mut r, start, &trace);
        // Never more than the limit in one aligned window.
        for &(t, _, _) in &admitted {
            let s = t / window * window;
            prop_assert!(r.history.sum(s, s + window) <= limit.into());
        }
    }

    #[test]
    fn sliding_log_matches_reference(
        limit in 1u32..12, window_ms in 1u64..2_000, start in start(),
        trace in trace(2_000_000, 12),
    ) {
        let window = window_ms * 1_000;
        let alg = SlidingWindowLog::new(limit, Duration::from_micros(window)).unwrap();
        let mut r = LogRef { limit: limit.into(), window, history: History::default() };
        let admitted = run(&alg, &mut r, start, &trace);
        // Never more than the limit in any window ending at an admission.
        for &(t, _, _) in &admitted {
            prop_assert!(r.history.sum((t + 1).saturating_sub(window), t + 1) <= limit.into());
        }
    }

    #[test]
    fn sliding_counter_matches_reference(
        limit in 1u32..12, window_ms in 1u64..2_000, start in start(),
        trace in trace(2_000_000, 12),
    ) {
        let window = window_ms * 1_000;
        let alg = SlidingWindowCounter::new(limit, Duration::from_micros(window)).unwrap();
        let mut r = CounterRef { limit: limit.into(), window, history: History::default() };
        let admitted = run(&alg, &mut r, start, &trace);
        // The estimate never lets more than the limit through one aligned window.
        for &(t, _, _) in &admitted {
            let s = t / window * window;
            prop_assert!(r.history.sum(s, s + window) <= limit.into());
        }
    }

    #[test]
    fn token_bucket_matches_reference(
        capacity in 1u32..12, count in 1u32..20, period_ms in 1u64..2_000, start in start(),
        trace in trace(2_000_000, 12),
    ) {
        let rate = Rate::new(count, Duration::from_millis(period_ms)).unwrap();
        let alg = TokenBucket::new(capacity, rate).unwrap();
        let interval = alg.interval_micros();
        let full = u64::from(capacity) * interval;
        let mut r = TokenRef { capacity: capacity.into(), interval, level: full, last: start };
        let admitted = run(&alg, &mut r, start, &trace);
        // Between any two admissions: at most capacity + refill × elapsed.
        for (i, &(t1, _, _)) in admitted.iter().enumerate() {
            let mut spent = 0u64;
            for &(t2, cost, _) in &admitted[i..] {
                spent += u64::from(cost);
                prop_assert!(spent <= u64::from(capacity) + (t2 - t1) / interval);
            }
        }
    }

    #[test]
    fn leaky_bucket_matches_reference(
        queue in 0u32..10, count in 1u32..20, period_ms in 1u64..2_000,
        max_delay_ms in prop::option::of(0u64..1_000), start in start(),
        trace in trace(2_000_000, 11),
    ) {
        let rate = Rate::new(count, Duration::from_millis(period_ms)).unwrap();
        let mut alg = LeakyBucket::new(rate, queue).unwrap();
        if let Some(ms) = max_delay_ms {
            alg = alg.with_max_delay(Duration::from_millis(ms));
        }
        let interval = alg.interval_micros();
        let mut r = LeakyRef {
            depth: u64::from(queue + 1) * interval,
            interval,
            max_delay: max_delay_ms.map(|ms| ms * 1_000),
            water: 0,
            last: start,
        };
        let admitted = run(&alg, &mut r, start, &trace);
        // Departures (admission time + delay) never come faster than one interval per unit.
        let mut departures: Vec<(u64, u32)> =
            admitted.iter().map(|&(t, cost, v)| (t + v.delay_micros, cost)).collect();
        departures.sort_unstable();
        for pair in departures.windows(2) {
            prop_assert!(pair[1].0 - pair[0].0 >= u64::from(pair[0].1) * interval);
        }
    }
}

/// Steps `alg` at instants in any order (a clock stepped back; a state last decided by a caller
/// whose clock ran ahead; a store's sweep or eviction that reads every key's state at its own
/// instant): every answer keeps `remaining` within the limit, and nothing panics.
fn run_unordered<A: Algorithm>(alg: &A, start: u64, steps: &[(u64, u32)]) {
    let mut state = A::State::default();
    for &(offset, cost) in steps {
        let now = Timestamp::from_micros(start + offset);
        let peek = alg.evaluate(&mut state.clone(), now, 0);
        assert!(peek.remaining <= peek.limit, "peek at +{offset}: {peek:?}");
        let expected = evaluated_then_committed(alg, &state, now, cost);
        let verdict = alg.check(&mut state, now, cost);
        assert!(
            verdict.remaining <= verdict.limit,
            "at +{offset}: {verdict:?}"
        );
        assert_eq!(format!("{state:?}"), expected, "check at +{offset}");
        let _ = alg.expires_at(&state);
    }
}

fn unordered(span: u64, max_cost: u32) -> impl Strategy<Value = Vec<(u64, u32)>> {
    prop::collection::vec((0..span, 0..=max_cost + 1), 1..80)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_clock_that_goes_back_never_breaks_an_algorithm(
        limit in 1u32..12, count in 1u32..20, ms in 1u64..2_000, start in start(),
        steps in unordered(6_000_000, 12),
    ) {
        let window = Duration::from_millis(ms);
        let rate = Rate::new(count, window).unwrap();
        run_unordered(&FixedWindow::new(limit, window).unwrap(), start, &steps);
        run_unordered(&SlidingWindowLog::new(limit, window).unwrap(), start, &steps);
        run_unordered(&SlidingWindowCounter::new(limit, window).unwrap(), start, &steps);
        run_unordered(&TokenBucket::new(limit, rate).unwrap(), start, &steps);
        run_unordered(&LeakyBucket::new(rate, limit).unwrap(), start, &steps);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Instants out of order (two threads whose clock reads crossed on the way to a key's lock,
    /// a clock stepped back): a log stays in time order, a late request logged at the newest
    /// entry's time, and the memory store's compact logs decide exactly as the algorithm's own
    /// state does.
    #[test]
    fn a_log_stays_in_order_whatever_the_order_of_its_instants(
        limit in 1u32..12, ms in 1u64..2_000, start in start(),
        steps in unordered(6_000_000, 12),
    ) {
        let alg = SlidingWindowLog::new(limit, Duration::from_millis(ms)).unwrap();
        let policy = Policy::new("log", Quota::SlidingWindowLog(alg.clone())).unwrap();
        let store = MemoryStore::new();
        let mut state = SlidingWindowLogState::default();
        for &(offset, cost) in &steps {
            let now = Timestamp::from_micros(start + offset);
            let want = alg.check(&mut state, now, cost).into_decision(policy.shared_name());
            let times: Vec<u64> = state.entries.iter().map(|&(t, _)| t).collect();
            prop_assert!(times.windows(2).all(|w| w[0] < w[1]), "out of order: {:?}", times);
            let sum: u64 = state.entries.iter().map(|&(_, c)| u64::from(c)).sum();
            prop_assert_eq!(state.total, sum);
            let got = store.apply_now(now, &[Check::new(&policy, b"k", cost)]);
            prop_assert_eq!(got.as_slice(), &[want][..], "at +{}", offset);
        }
    }
}
