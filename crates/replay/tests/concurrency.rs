//! Requests in flight, replayed: a line's `$request_time` says how long its request held a
//! concurrency slot, so the replay refuses what would have found every slot taken.

mod common;

use common::{START, config, line, replay, write_log};

/// Two slots; requests of one key arrive a second apart and each takes 2.5 s: the first two
/// run side by side, the third finds both taken, the fourth finds the first one back.
#[test]
fn slots_are_held_for_the_logged_duration() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    // `$msec` is when a request ended and `$request_time` how long it took: arrivals at 0, 1,
    // 2 and 3 s.
    let lines: Vec<String> = (0..4)
        .map(|i| {
            format!(
                "{} \"k1\" {}.500 2.500",
                line("192.0.2.1", 0, "POST", "/v1/export/1"),
                START + i + 2
            )
        })
        .collect();
    let log = write_log(dir.path(), "exports.log", &lines);
    let text = "[[policy]]\nname = \"exports\"\nalgorithm = \"concurrency\"\nlimit = 2\n\
                key = [\"header:x-api-key\"]\nmatch = { path = \"/v1/export/**\" }\n";
    let s = replay(config(text), vec![log]);
    assert_eq!(s.bad_lines.count, 0, "{:?}", s.bad_lines.first);
    assert_eq!((s.result.requests, s.result.denied), (4, 1));
}
