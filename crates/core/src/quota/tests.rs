//! Tests of the configuration notation: durations, rates, algorithm names and quotas.

use proptest::prelude::*;

use super::*;

#[test]
fn durations_in_every_unit() -> Result<(), QuotaError> {
    assert_eq!(parse_duration("250ms")?, Duration::from_millis(250));
    assert_eq!(parse_duration("1s")?, Duration::from_secs(1));
    assert_eq!(parse_duration("5m")?, Duration::from_secs(300));
    assert_eq!(parse_duration("2h")?, Duration::from_secs(7200));
    assert_eq!(parse_duration("1d")?, Duration::from_secs(86_400));
    assert_eq!(parse_duration(" 1m30s ")?, Duration::from_secs(90));
    Ok(())
}

#[test]
fn microseconds_in_every_spelling() -> Result<(), QuotaError> {
    assert_eq!(parse_duration("1us")?, Duration::from_micros(1));
    // The micro sign, and the Greek mu that some keyboards give for it.
    assert_eq!(parse_duration("250µs")?, Duration::from_micros(250));
    assert_eq!(parse_duration("250μs")?, Duration::from_micros(250));
    assert_eq!(parse_duration("1ms500us")?, Duration::from_micros(1_500));
    assert_eq!(parse_duration("0us")?, Duration::ZERO);
    assert_eq!("3/1500us".parse::<Rate>()?.period_micros(), 1_500);
    assert_eq!("1/us".parse::<Rate>()?.period_micros(), 1);
    for (input, needle) in [("5µ", "unknown unit"), ("5 us", "missing unit")] {
        let text = parse_duration(input)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(text.contains(needle), "{input:?}: {text}");
    }
    Ok(())
}

/// A duration as `format_duration` writes it reads back as the same whole microseconds.
fn round_trips(d: Duration) -> Result<(), TestCaseError> {
    let micros = crate::clock::duration_micros(d);
    let text = format_duration(d);
    let back = parse_duration(&text).map_err(|e| TestCaseError::fail(format!("{d:?}: {e}")))?;
    prop_assert_eq!(back, Duration::from_micros(micros), "{:?} as {}", d, text);
    prop_assert_eq!(format_duration(back), text);
    Ok(())
}

#[test]
fn formatted_durations_parse_back_at_the_edges() -> Result<(), TestCaseError> {
    for d in [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_nanos(999),
        Duration::from_nanos(1_500),
        Duration::from_micros(1),
        Duration::from_micros(999_999),
        Duration::from_millis(1_001),
        Duration::from_secs(86_400 * 400),
        Duration::from_micros(u64::MAX),
        Duration::from_micros(u64::MAX / 86_400_000_000 * 86_400_000_000),
        Duration::MAX,
    ] {
        round_trips(d)?;
    }
    Ok(())
}

/// Any duration: nanoseconds at random, any microseconds, and whole numbers of each unit (the
/// unit `format_duration` picks) with a few microseconds added or not.
fn durations() -> impl Strategy<Value = Duration> {
    let units = vec![
        1u64,
        1_000,
        1_000_000,
        60_000_000,
        3_600_000_000,
        86_400_000_000,
    ];
    let whole = (
        prop::sample::select(units),
        0u64..1_000_000_000,
        prop::sample::select(vec![0u64, 1, 999, 1_000]),
    )
        .prop_map(|(unit, k, extra)| {
            Duration::from_micros(unit.saturating_mul(k).saturating_add(extra))
        });
    prop_oneof![
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        any::<u64>().prop_map(Duration::from_micros),
        whole,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    #[test]
    fn formatted_durations_parse_back(d in durations()) {
        round_trips(d)?;
    }
}

#[test]
fn bad_durations_say_what_is_wrong() {
    for (input, needle) in [
        ("", "empty"),
        ("5", "missing unit"),
        ("5y", "unknown unit"),
        ("ms", "whole number"),
        ("-1s", "whole number"),
        ("1.5s", "whole numbers"),
        ("99999999999999999999999s", "too large"),
    ] {
        let err = parse_duration(input).err();
        let text = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains(needle), "{input:?}: {text}");
    }
}

#[test]
fn rates_and_limits() -> Result<(), QuotaError> {
    let rate: Rate = "10/s".parse()?;
    assert_eq!((rate.count(), rate.period()), (10, Duration::from_secs(1)));
    let limit: Rate = "100/1m".parse()?;
    assert_eq!(
        (limit.count(), limit.period()),
        (100, Duration::from_secs(60))
    );
    let odd: Rate = "3/250ms".parse()?;
    assert_eq!(odd.to_string(), "3/250ms");
    assert_eq!(rate.interval_micros("10/s")?, 100_000);
    // 3 per second rounds the interval up: never faster than configured.
    let three: Rate = "3/s".parse()?;
    assert_eq!(three.interval_micros("3/s")?, 333_334);
    Ok(())
}

#[test]
fn bad_rates_are_rejected_with_reasons() {
    for (input, needle) in [
        ("0/s", "at least 1"),
        ("-5/s", "whole number"),
        ("ten/s", "whole number"),
        ("10", "COUNT/PERIOD"),
        ("10/", "missing the period"),
        ("10/0s", "longer than zero"),
        ("10/401d", "at most 400 days"),
        ("10/fortnight", "unknown unit"),
    ] {
        let text = input
            .parse::<Rate>()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(text.contains(needle), "{input:?}: {text}");
        assert!(text.contains(input), "{input:?} should be named in: {text}");
    }
}

/// Both buckets are held to the horizon the Redis scripts' doubles stay exact within: a full
/// token bucket refills, a full leaky bucket (`queue + 1` slots) drains, within 100 years.
#[test]
fn buckets_past_a_hundred_years_are_refused() -> Result<(), QuotaError> {
    let century = Duration::from_secs(100 * 365 * 86_400);
    for (quota, needle) in [
        (
            Quota::leaky_bucket("1/400d".parse()?, 1_000),
            "take over 100 years to drain",
        ),
        (
            Quota::leaky_bucket("1/s".parse()?, u32::MAX - 1),
            "take over 100 years to drain",
        ),
        (
            Quota::leaky_bucket("1/1d".parse()?, 36_500),
            "take over 100 years to drain",
        ),
        (
            Quota::token_bucket(u32::MAX, "1/s".parse()?),
            "take over 100 years to refill",
        ),
    ] {
        let text = quota.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains(needle), "{text}");
        assert!(text.contains("use a smaller"), "says what to do: {text}");
    }
    // The bound itself is allowed: 36,500 slots of a day, a capacity of 36,500 days.
    let leaky = Quota::leaky_bucket("1/1d".parse()?, 36_499)?;
    assert_eq!(leaky.window(), century);
    let token = Quota::token_bucket(36_500, "1/1d".parse()?)?;
    assert_eq!(token.window(), century);
    // The queue's own bound still comes first.
    let text = Quota::leaky_bucket("1000000/s".parse()?, u32::MAX)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(text.contains("queue must be below"), "{text}");
    Ok(())
}

#[test]
fn impossible_rates_are_rejected() -> Result<(), QuotaError> {
    let fast: Rate = "2000/1ms".parse()?;
    assert!(Quota::token_bucket(10, fast).is_err());
    Ok(())
}

#[test]
fn algorithm_names_round_trip() {
    for kind in AlgorithmKind::ALL {
        assert_eq!(kind.as_str().parse::<AlgorithmKind>().ok(), Some(kind));
    }
    assert!("gcra".parse::<AlgorithmKind>().is_err());
}

#[test]
fn quotas_describe_themselves() -> Result<(), QuotaError> {
    let q = Quota::sliding_window_counter(100, Duration::from_secs(60))?;
    assert_eq!(q.to_string(), "sliding_window_counter limit=100 window=1m");
    assert_eq!((q.limit(), q.window()), (100, Duration::from_secs(60)));
    let t = Quota::token_bucket(20, "1/s".parse()?)?;
    assert_eq!(t.window(), Duration::from_secs(20));
    assert!(Quota::fixed_window(0, Duration::from_secs(1)).is_err());
    assert!(Quota::fixed_window(10, Duration::ZERO).is_err());
    Ok(())
}

#[test]
fn concurrency_quotas() -> Result<(), QuotaError> {
    let q = Quota::concurrency(4, Duration::from_secs(300))?;
    assert_eq!(q.to_string(), "concurrency limit=4 lease_ttl=5m");
    assert_eq!(q.kind(), AlgorithmKind::Concurrency);
    assert_eq!(
        "concurrency".parse::<AlgorithmKind>()?,
        AlgorithmKind::Concurrency
    );
    assert_eq!(
        (q.limit(), q.window(), q.max_cost()),
        (4, Duration::from_secs(300), 4)
    );
    let Quota::Concurrency(a) = &q else {
        panic!("{q:?}");
    };
    assert_eq!((a.limit(), a.lease_ttl_micros()), (4, 300_000_000));
    assert!(Quota::concurrency(0, Duration::from_secs(1)).is_err());
    assert!(Quota::concurrency(1, Duration::ZERO).is_err());
    assert!(Quota::concurrency(1, MAX_PERIOD + Duration::from_secs(1)).is_err());
    Ok(())
}
