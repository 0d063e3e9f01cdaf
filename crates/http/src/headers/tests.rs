//! The headers' text, both ways out (a `HeaderValue`, HTTP/1.1 lines), against what the header contract
//! says; number caches; `Retry-After` in both forms.

use std::time::Duration;

use tollgate::{Decision, Timestamp};

use super::field::{number, recent_number};
use super::*;

#[test]
fn cached_and_uncached_numbers() {
    for n in [
        0,
        1,
        9,
        10,
        99,
        4242,
        9_999,
        10_000,
        1_700_000_000,
        u64::MAX,
    ] {
        assert_eq!(number(n).to_str().ok(), Some(n.to_string().as_str()));
    }
}

#[test]
fn recent_numbers() {
    for n in [
        7,
        1_700_000_000,
        1_700_000_000,
        1_700_000_001,
        10_001,
        u64::MAX,
    ] {
        assert_eq!(recent_number(n).to_str().ok(), Some(n.to_string().as_str()));
    }
}

/// A list with only `retry` in it, written as HTTP/1.1 and as a `HeaderValue`.
fn retry_text(retry: Retry) -> (String, Option<String>) {
    let mut list = HeaderList::new();
    list.set_retry(retry);
    let mut lines = Vec::new();
    write_lines(&list, &mut lines);
    let value = list
        .fields()
        .next()
        .and_then(|f| f.header_value().to_str().ok().map(str::to_owned));
    (String::from_utf8_lossy(&lines).into_owned(), value)
}

#[test]
fn retry_after_in_seconds_and_as_a_date() {
    let (secs, retry) = retry_after(
        RetryAfterFormat::Seconds,
        Timestamp::from_secs(0),
        Duration::ZERO,
        0,
    );
    assert_eq!((secs, retry), (1, Retry::Seconds(1)));
    assert_eq!(
        retry_text(retry),
        ("retry-after: 1\r\n".into(), Some("1".into()))
    );
    let (_, retry) = retry_after(
        RetryAfterFormat::HttpDate,
        Timestamp::from_secs(784_111_777),
        Duration::from_millis(1),
        0,
    );
    let date = "Sun, 06 Nov 1994 08:49:38 GMT";
    assert_eq!(
        retry_text(retry),
        (format!("retry-after: {date}\r\n"), Some(date.into()))
    );
    // Past what an HTTP date can name: the last one, not a panic.
    let (_, far) = retry_text(Retry::Date(u64::MAX));
    assert_eq!(far.as_deref(), Some("Fri, 31 Dec 9999 23:59:59 GMT"));
    assert_eq!(
        retry_text(HeaderList::retry_soon().retry()),
        ("retry-after: 1\r\n".into(), Some("1".into()))
    );
}

fn text(name: &str, limit: u32) -> &'static PolicyHeaders {
    let quota = tollgate::Quota::fixed_window(limit, Duration::from_secs(60));
    let policy = quota.and_then(|q| Policy::new(name, q));
    match policy.ok().map(|p| PolicyHeaders::new(&p)) {
        Some(Ok(text)) => text,
        _ => panic!("a valid policy"),
    }
}

fn decision(policy: &'static str, limit: u64, remaining: u64, reset_secs: u64) -> Decision {
    Decision {
        policy,
        allowed: true,
        limit,
        remaining,
        reset: Duration::from_secs(reset_secs),
        retry_after: None,
        delay: None,
        ban: tollgate::BanStatus::None,
    }
}

/// Both ways out (a `HeaderValue`, bytes written for HTTP/1.1) carry the same text, for one
/// policy and for several, every family on.
#[test]
fn header_values_and_written_lines_agree() {
    let api = text("api", 100);
    let burst = text("burst", 10);
    // Interned: the same policy text is one value.
    assert!(std::ptr::eq(api, text("api", 100)));
    let config = HeaderConfig::default();
    let now = Timestamp::from_secs(1_700_000_000);
    let one = decision("api", 100, 12, 3_600);
    let other = decision("burst", 10, 3, 5);
    let mut cases = vec![
        render(&config, now, &[(&one, PolicyText::Interned(api))]),
        render(
            &config,
            now,
            &[
                (&one, PolicyText::Interned(api)),
                (&other, PolicyText::Interned(burst)),
            ],
        ),
        render(
            &config,
            now,
            &[(&decision("api", 7, 99_999, 1), PolicyText::Interned(api))],
        ),
    ];
    let mut with_retry = cases[1].clone();
    with_retry.set_retry(Retry::Date(784_111_778));
    cases.push(with_retry);
    for list in &cases {
        let mut lines = Vec::new();
        write_lines(list, &mut lines);
        let mut expected = String::new();
        for f in list.fields() {
            assert_eq!(f.which.name().as_str(), f.which.as_str());
            assert_eq!(
                f.which.line_start(),
                format!("{}: ", f.which.as_str()).as_bytes()
            );
            let value = f.header_value();
            expected.push_str(&format!(
                "{}: {}\r\n",
                f.which.as_str(),
                value.to_str().unwrap_or("<not text>")
            ));
        }
        assert_eq!(String::from_utf8_lossy(&lines), expected);
        assert_eq!(list.fields().len(), list.fields().count());
        assert!(!list.is_empty());
    }
    let written = |list: &HeaderList| {
        let mut lines = Vec::new();
        write_lines(list, &mut lines);
        String::from_utf8_lossy(&lines).into_owned()
    };
    assert_eq!(
        written(&cases[0]),
        "x-ratelimit-limit: 100\r\nx-ratelimit-remaining: 12\r\n\
         x-ratelimit-reset: 1700003600\r\nratelimit-policy: \"api\";q=100;w=60\r\n\
         ratelimit: \"api\";r=12;t=3600\r\n"
    );
    assert_eq!(
        written(&cases[1]),
        "x-ratelimit-limit: 10\r\nx-ratelimit-remaining: 3\r\n\
         x-ratelimit-reset: 1700000005\r\n\
         ratelimit-policy: \"api\";q=100;w=60, \"burst\";q=10;w=60\r\n\
         ratelimit: \"burst\";r=3;t=5\r\n"
    );
    // A limit other than the policy's own (the decision's) is written as a number.
    assert!(written(&cases[2]).starts_with("x-ratelimit-limit: 7\r\n"));
    assert!(written(&cases[3]).ends_with("retry-after: Sun, 06 Nov 1994 08:49:38 GMT\r\n"));
    assert_eq!(cases[0].t(), Some(3_600));
}

/// The families follow the config, and a list with nothing to write says so.
#[test]
fn families_follow_the_config() {
    let api = text("api", 100);
    let now = Timestamp::from_secs(1_700_000_000);
    let one = decision("api", 100, 12, 3_600);
    let names = |config: HeaderConfig| {
        let list = render(&config, now, &[(&one, PolicyText::Interned(api))]);
        let names: Vec<&str> = list.fields().map(|f| f.which.as_str()).collect();
        (names, list.is_empty(), list.t())
    };
    let config = HeaderConfig::default();
    assert_eq!(
        names(HeaderConfig {
            ietf: false,
            ..config
        }),
        (
            vec![
                "x-ratelimit-limit",
                "x-ratelimit-remaining",
                "x-ratelimit-reset"
            ],
            false,
            None
        )
    );
    assert_eq!(
        names(HeaderConfig {
            legacy: false,
            ..config
        }),
        (vec!["ratelimit-policy", "ratelimit"], false, Some(3_600))
    );
    assert_eq!(
        names(HeaderConfig {
            ietf: false,
            reset_format: ResetFormat::Omitted,
            ..config
        }),
        (
            vec!["x-ratelimit-limit", "x-ratelimit-remaining"],
            false,
            None
        )
    );
    assert_eq!(
        names(HeaderConfig {
            legacy: false,
            ietf: false,
            ..config
        }),
        (vec![], true, None)
    );
    assert!(render(&config, now, &[]).is_empty());
    assert!(HeaderList::new().is_empty());
    assert!(!HeaderList::retry_soon().is_empty());
}

/// What a response future carries: small enough to move cheaply, whatever the config (two
/// policy texts inline, each a pointer and the tag that says whether it is an override's).
#[test]
fn a_list_is_small() {
    let size = std::mem::size_of::<HeaderList>();
    assert!(size <= 96, "{size} bytes");
}
