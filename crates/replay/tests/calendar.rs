//! Calendar windows in a replay: days counted in the policy's zone, by the log's clock, and
//! sweeps that keep or change the calendar.

mod common;

use common::*;
use tollgate_replay::Sweep;

/// One request an hour for three days from 2024-03-01T00:00Z.
fn hourly() -> Vec<String> {
    (0..72)
        .map(|h| line("203.0.113.1", h * 3_600, "GET", "/v1/items"))
        .collect()
}

fn daily(zone: &str, limit: u32) -> String {
    format!(
        "[[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = {limit}\ncalendar = \"day\"\ntimezone = \"{zone}\"\nkey = [\"ip\"]\n"
    )
}

#[test]
fn days_are_counted_in_the_policys_zone() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = write_log(dir.path(), "access.log", &hourly());
    // In UTC the log spans three whole days: 5 admitted in each.
    let s = replay(config(&daily("UTC", 5)), vec![log.clone()]);
    assert_eq!(s.result.policies[0].admitted, 15);
    // In New York (UTC-5 then) days start at 05:00Z: the log touches four of them.
    let s = replay(config(&daily("America/New_York", 5)), vec![log]);
    assert_eq!(s.result.policies[0].admitted, 20);
    assert_eq!(s.result.policies[0].denied, 52);
}

#[test]
fn a_sweep_keeps_the_calendar_or_tries_others() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log = write_log(dir.path(), "access.log", &hourly());
    let mut options =
        tollgate_replay::Options::new(config(&daily("America/New_York", 5)), vec![log]);
    options.sweep = Some(Sweep {
        policy: None,
        dimensions: vec![
            "limit=5,10"
                .parse()
                .unwrap_or_else(|e: String| panic!("{e}")),
            "calendar=day,week"
                .parse()
                .unwrap_or_else(|e: String| panic!("{e}")),
        ],
    });
    let s = replay_with(options);
    let sweep = s.sweep.as_ref().unwrap_or_else(|| panic!("no sweep"));
    let admitted: Vec<(String, u64)> = sweep
        .candidates
        .iter()
        .map(|c| {
            (
                c.label.clone(),
                c.policy("api").map_or(u64::MAX, |p| p.admitted),
            )
        })
        .collect();
    // 2024-03-01 is a Friday: the log lies in one New York week.
    assert_eq!(
        admitted,
        [
            ("limit=5 calendar=day".to_owned(), 20),
            ("limit=5 calendar=week".to_owned(), 5),
            ("limit=10 calendar=day".to_owned(), 35),
            ("limit=10 calendar=week".to_owned(), 10),
        ]
    );
    assert!(
        "calendar=fortnight"
            .parse::<tollgate_replay::sweep::Dimension>()
            .is_err()
    );
}
