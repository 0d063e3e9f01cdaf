//! Memory grows with the number of keys, not with the length of the log. Proved on generated
//! logs two ways: the heap's peak while a replay runs (every allocation counted) is the same
//! for a log and for one four times as long over the same keys; and keys that go idle leave
//! the store, so the keys it holds stay at those live at once while thousands pass through.
//!
//! One test in this binary: the heap's peak is the whole process's.

mod common;

use common::*;
use peak_alloc::PeakAlloc;
use tollgate_replay::{Options, Summary};

#[global_allocator]
static HEAP: PeakAlloc = PeakAlloc;

/// What the longer log may add to the heap's peak: far less than one byte per extra line
/// (27,000 of them), so nothing kept per line, request or bad line fits in it.
const SLACK: usize = 16 * 1024;

/// Replays `options`: the summary, and the most heap the replay used above what was in use
/// before it (the summary it returns included).
fn replay_measured(options: Options) -> (Summary, usize) {
    HEAP.reset_peak_usage();
    let before = HEAP.current_usage();
    let summary = replay_with(options);
    (summary, HEAP.peak_usage().saturating_sub(before))
}

/// Five clients, each a request every two seconds, for `hours`; every 50th line is not a
/// request (bad lines are listed up to a cap, counted all).
fn five_clients(hours: i64) -> Vec<String> {
    let ips = [
        "192.0.2.1",
        "192.0.2.2",
        "192.0.2.3",
        "192.0.2.4",
        "192.0.2.5",
    ];
    let mut lines = Vec::new();
    for secs in 0..hours * 3_600 {
        for (i, ip) in ips.iter().enumerate() {
            if (secs + i as i64) % 2 == 0 {
                lines.push(line(ip, secs, "GET", "/v1/items"));
            }
            if lines.len() % 50 == 49 {
                lines.push("not a request".to_owned());
            }
        }
    }
    lines
}

/// Each minute for an hour, 40 clients never seen before make three requests and go quiet:
/// 2,400 keys in all, 40 of them live at a time.
fn clients_that_go_idle() -> Vec<String> {
    let mut requests = Vec::new();
    for minute in 0..60 {
        for k in 0..40 {
            let ip = format!("10.0.{minute}.{k}");
            for s in 0..3 {
                requests.push((minute * 60 + k + s, ip.clone()));
            }
        }
    }
    requests.sort_by_key(|(secs, _)| *secs);
    requests
        .iter()
        .map(|(secs, ip)| line(ip, *secs, "GET", "/v1/items"))
        .collect()
}

#[test]
fn memory_grows_with_the_keys_not_with_the_log() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let config = config(&policy("fixed_window"));

    // The same five keys for one hour and for four: four times the lines, the same peak.
    let short = write_log(dir.path(), "short.log", &five_clients(1));
    let long = write_log(dir.path(), "long.log", &five_clients(4));
    let (s1, peak_short) = replay_measured(Options::new(config.clone(), vec![short]));
    let (s4, peak_long) = replay_measured(Options::new(config.clone(), vec![long]));
    assert_eq!((s1.result.requests, s4.result.requests), (9_000, 36_000));
    assert_eq!((s1.bad_lines.count, s4.bad_lines.count), (183, 734));
    assert_eq!(s4.bad_lines.first.len(), 20);
    for s in [&s1, &s4] {
        let p = &s.result.policies[0];
        assert_eq!((p.keys, s.keys_held_max), (5, 5));
        assert!(p.timeline.admitted.len() <= 480);
    }
    assert!(
        peak_long <= peak_short + SLACK,
        "the heap's peak grew with the log: {peak_short} bytes for {} lines, {peak_long} for {}",
        s1.lines,
        s4.lines
    );

    // Keys that go idle leave the store: it holds the keys of about a minute (purged once a
    // minute of log), never the 2,400 that passed through. The statistics keep one entry per
    // key seen (that is the report), so they count all of them.
    let idle = write_log(dir.path(), "idle.log", &clients_that_go_idle());
    let s = replay_with(Options::new(config, vec![idle]));
    assert_eq!(s.result.requests, 7_200);
    assert_eq!(s.result.policies[0].keys, 2_400);
    assert!(
        (40..=80).contains(&s.keys_held_max),
        "the store held {} keys at once",
        s.keys_held_max
    );
}
