//! Generated logs whose answers are known: one client at twice the limit, one at half.

mod common;

use common::*;
use tollgate_replay::Sweep;

#[test]
fn a_fixed_window_denies_exactly_the_excess() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = write_log(dir.path(), "access.log", &twice_and_half());
    let s = replay(config(&policy("fixed_window")), vec![log]);
    assert_eq!(
        (s.lines, s.bad_lines.count, s.out_of_order.count),
        (250, 0, 0)
    );
    let r = &s.result;
    assert_eq!((r.requests, r.unmatched, r.denied), (250, 0, 100));
    let p = &r.policies[0];
    assert_eq!((p.requests, p.admitted, p.denied), (250, 150, 100));
    assert_eq!((p.keys, p.keys_affected), (2, 1));
    assert_eq!(p.top_keys.len(), 1);
    let top = &p.top_keys[0];
    assert_eq!(top.key, "ip:203.0.113.1");
    assert_eq!((top.requests, top.denied, top.peak), (200, 100, 20));
    // Twenty a minute for the busy client, five for the quiet one.
    assert_eq!((p.peak.p50, p.peak.max), (5, 20));
    assert_eq!(p.timeline.admitted.iter().sum::<u64>(), 150);
    assert_eq!(p.timeline.denied.iter().sum::<u64>(), 100);
    assert_eq!(s.first_time.as_deref(), Some("2024-03-01T00:00:00Z"));
    assert_eq!(s.last_time.as_deref(), Some("2024-03-01T00:09:57Z"));
}

#[test]
fn every_algorithm_halves_the_busy_client_and_spares_the_quiet_one() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = write_log(dir.path(), "access.log", &twice_and_half());
    for algorithm in [
        "fixed_window",
        "sliding_window_log",
        "sliding_window_counter",
        "token_bucket",
        "leaky_bucket",
    ] {
        let s = replay(config(&policy(algorithm)), vec![log.clone()]);
        let p = &s.result.policies[0];
        let busy = &p.top_keys[0];
        assert_eq!(busy.key, "ip:203.0.113.1", "{algorithm}");
        // Ten minutes at 20 a minute against 10 a minute: about half, give or take the first
        // window's burst (the buckets start full) and the sliding counter's estimate (which
        // weighs the previous window's admitted requests, and so admits a little less).
        assert!(
            (85..=115).contains(&busy.denied),
            "{algorithm}: {}",
            busy.denied
        );
        assert_eq!(
            p.keys_affected, 1,
            "{algorithm}: the quiet client was denied"
        );
        assert_eq!(p.denied, busy.denied, "{algorithm}");
    }
}

#[test]
fn a_sweep_shows_the_denied_share_fall_as_the_limit_rises() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = write_log(dir.path(), "access.log", &twice_and_half());
    let mut options = tollgate_replay::Options::new(config(&policy("fixed_window")), vec![log]);
    options.sweep = Some(Sweep {
        policy: None,
        dimensions: vec![
            "limit=4,10,20"
                .parse()
                .unwrap_or_else(|e: String| panic!("{e}")),
        ],
    });
    let s = replay_with(options);
    let sweep = s.sweep.as_ref().unwrap_or_else(|| panic!("no sweep"));
    let denied: Vec<u64> = sweep
        .candidates
        .iter()
        .map(|c| c.policy("api").map_or(u64::MAX, |p| p.denied))
        .collect();
    // 4 a minute: the busy client loses 16 of 20, the quiet one 1 of 5, every minute.
    assert_eq!(denied, [10 * 16 + 10, 100, 0]);
    // The configuration as given is replayed too, unchanged.
    assert_eq!(s.result.denied, 100);
}
