//! What the summary says, in the table on stdout and in `summary.json` alike: requests refused
//! before any policy, by the status they would have had; bad lines beyond those shown.

mod common;

use common::*;
use tollgate_replay::Options;

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"))
}

/// A path of 2,000 segments is answered 414 (as the live server answers it), a target with a
/// fragment 400: each is counted under its own status, as `--decisions` reports it, and not
/// under one "unreadable (400)".
#[test]
fn refusals_are_counted_by_their_status() {
    let dir = tempdir();
    let deep = format!("/v1/{}", "a/".repeat(2_000));
    let lines = [
        line("203.0.113.1", 0, "GET", "/v1/items"),
        line("203.0.113.1", 1, "GET", &deep),
        line("203.0.113.1", 2, "GET", "/v1/items#top"),
    ];
    let log = write_log(dir.path(), "access.log", &lines);
    let decisions = dir.path().join("decisions.jsonl");
    let mut options = Options::new(config(&policy("fixed_window")), vec![log]);
    options.decisions = Some(decisions.clone());
    let s = replay_with(options);
    assert_eq!(s.bad_lines.count, 0, "{:?}", s.bad_lines.first);
    let r = &s.result;
    assert_eq!(r.refused, 2);
    let by_status: Vec<(u16, u64)> = r.refused_by_status.iter().map(|(s, n)| (*s, *n)).collect();
    assert_eq!(by_status, [(400, 1), (414, 1)]);

    let table = tollgate_replay::table::render(&s);
    assert!(
        table.contains(", 2 refused before any policy (1 answered 400, 1 answered 414), "),
        "{table}"
    );
    assert!(!table.contains("unreadable"), "{table}");
    let json = serde_json::to_value(&s).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(json["result"]["refused"], 2);
    assert_eq!(json["result"]["refused_by_status"]["400"], 1);
    assert_eq!(json["result"]["refused_by_status"]["414"], 1);

    let traced = std::fs::read_to_string(&decisions).unwrap_or_else(|e| panic!("{e}"));
    let statuses: Vec<u64> = traced
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}"));
            v["status"].as_u64().unwrap_or_default()
        })
        .collect();
    assert_eq!(statuses, [200, 414, 400]);
}

/// The table shows the first five bad lines and says how many more there are, and whether
/// summary.json lists them all or only its first twenty.
#[test]
fn bad_lines_beyond_those_shown_are_announced() {
    let dir = tempdir();
    let garbage = |n: usize| -> Vec<String> { (0..n).map(|i| format!("garbage {i}")).collect() };
    let log = write_log(dir.path(), "ten.log", &garbage(10));
    let s = replay(config(&policy("fixed_window")), vec![log]);
    assert_eq!((s.bad_lines.count, s.bad_lines.first.len()), (10, 10));
    let table = tollgate_replay::table::render(&s);
    assert_eq!(table.matches("  bad line ").count(), 5, "{table}");
    assert!(
        table.contains("\n  ... and 5 more bad lines, all listed in summary.json (--out)\n"),
        "{table}"
    );

    let log = write_log(dir.path(), "many.log", &garbage(25));
    let s = replay(config(&policy("fixed_window")), vec![log]);
    assert_eq!((s.bad_lines.count, s.bad_lines.first.len()), (25, 20));
    let table = tollgate_replay::table::render(&s);
    assert!(
        table.contains("\n  ... and 20 more bad lines; summary.json (--out) lists the first 20\n"),
        "{table}"
    );
    // The report lists summary.json's twenty and says the rest are not listed.
    let out = dir.path().join("report");
    tollgate_replay::report::write(&s, &out).unwrap_or_else(|e| panic!("{e}"));
    let page = std::fs::read_to_string(out.join("report.html")).unwrap_or_else(|e| panic!("{e}"));
    assert!(page.contains("<li>… and 5 more</li>"), "{page}");

    // Five or fewer: nothing more to announce.
    let log = write_log(dir.path(), "five.log", &garbage(5));
    let s = replay(config(&policy("fixed_window")), vec![log]);
    assert!(!tollgate_replay::table::render(&s).contains("more bad lines"));
}
