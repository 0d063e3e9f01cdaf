//! Tests of the configuration notation: durations, rates, algorithm names and quotas.

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
