//! What the replay does with real-world logs: bad lines, an empty log, lines out of time order,
//! several files, gzip, JSON lines.

mod common;

use std::io::Write as _;

use common::*;
use tollgate_replay::{Format, JsonFields, Options};

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn bad_lines_are_counted_with_their_numbers_and_the_rest_replays() {
    let dir = tempdir();
    let mut lines = twice_and_half();
    lines.insert(0, "this is not a log line".to_owned());
    lines.insert(10, String::new()); // blank: skipped, not bad
    lines.insert(
        20,
        "203.0.113.1 - - [01/Mar/2024:00:00:30 +0000] \"GET /v1/items".to_owned(),
    );
    lines.insert(
        30,
        "203.0.113.1 - - [30/Feb/2024:00:00:30 +0000] \"GET / HTTP/1.1\" 200 1".to_owned(),
    );
    lines.push("\u{0}\u{ff}\u{7f}garbage \"".to_owned());
    let log = write_log(dir.path(), "access.log", &lines);
    let s = replay(config(&policy("fixed_window")), vec![log]);
    assert_eq!(s.bad_lines.count, 4);
    let listed: Vec<u64> = s.bad_lines.first.iter().map(|b| b.at.line).collect();
    assert_eq!(listed, [1, 21, 31, 255]);
    assert!(
        s.bad_lines.first[1].reason.contains("not closed"),
        "{:?}",
        s.bad_lines.first
    );
    assert!(
        s.bad_lines.first[2].reason.contains("time"),
        "{:?}",
        s.bad_lines.first
    );
    // Every good line was still decided, exactly as without the bad ones.
    assert_eq!(
        (s.lines, s.result.requests, s.result.denied),
        (254, 250, 100)
    );
}

#[test]
fn an_empty_log_gives_an_empty_report() {
    let dir = tempdir();
    let log = write_log(dir.path(), "empty.log", &[]);
    let s = replay(config(&policy("sliding_window_counter")), vec![log]);
    assert_eq!((s.lines, s.result.requests, s.result.denied), (0, 0, 0));
    assert_eq!(s.first_time, None);
    assert_eq!(s.result.policies[0].keys, 0);
    // The report still renders: empty plots, empty tables.
    let out = dir.path().join("report");
    let written = tollgate_replay::report::write(&s, &out).unwrap_or_else(|e| panic!("{e}"));
    assert!(written.iter().all(|p| p.exists()), "{written:?}");
    assert!(tollgate_replay::table::render(&s).starts_with("0 lines"));
}

#[test]
fn lines_out_of_order_are_decided_at_the_replay_time_and_counted() {
    let dir = tempdir();
    // Eleven requests of one client in the first minute, the last logged as if 90 s earlier
    // than the one before: it is decided at the replay's time, in the same window, and denied.
    let mut lines: Vec<String> = (0..10)
        .map(|i| line("203.0.113.7", 30 + i, "GET", "/v1/a"))
        .collect();
    lines.push(line("203.0.113.7", -50, "GET", "/v1/a"));
    let log = write_log(dir.path(), "late.log", &lines);
    let s = replay(config(&policy("fixed_window")), vec![log]);
    assert_eq!(s.out_of_order.count, 1);
    assert_eq!(s.out_of_order.first[0].at.line, 11);
    assert!(
        (s.out_of_order.max_lag_secs - 89.0).abs() < 1e-9,
        "{}",
        s.out_of_order.max_lag_secs
    );
    assert_eq!(s.result.denied, 1);
    assert_eq!(s.first_time.as_deref(), Some("2024-03-01T00:00:30Z"));
}

#[test]
fn several_logs_are_merged_by_time() {
    let dir = tempdir();
    let all = twice_and_half();
    // Two servers' logs: the busy client's lines on one, the quiet one's on the other, given
    // in the "wrong" order on the command line.
    let (busy, quiet): (Vec<String>, Vec<String>) = all
        .iter()
        .cloned()
        .partition(|l| l.starts_with("203.0.113.1 "));
    let a = write_log(dir.path(), "a.log", &quiet);
    let b = write_log(dir.path(), "b.log", &busy);
    let merged = replay(config(&policy("sliding_window_log")), vec![a, b]);
    let one = replay(
        config(&policy("sliding_window_log")),
        vec![write_log(dir.path(), "all.log", &all)],
    );
    assert_eq!(merged.out_of_order.count, 0);
    assert_eq!(merged.lines, 250);
    assert_eq!(merged.result.denied, one.result.denied);
    assert_eq!(
        merged.result.policies[0].top_keys[0].denied,
        one.result.policies[0].top_keys[0].denied
    );
}

#[test]
fn gzip_is_read_as_is_and_a_truncated_one_is_reported() {
    let dir = tempdir();
    let text = twice_and_half().join("\n") + "\n";
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    let bytes = gz.finish().unwrap_or_else(|e| panic!("{e}"));
    // No .gz in the name: the magic bytes decide.
    let whole = dir.path().join("access.log.1");
    std::fs::write(&whole, &bytes).unwrap_or_else(|e| panic!("{e}"));
    let s = replay(config(&policy("fixed_window")), vec![whole]);
    assert_eq!((s.lines, s.bad_lines.count, s.result.denied), (250, 0, 100));
    let cut = dir.path().join("cut.log.gz");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap_or_else(|e| panic!("{e}"));
    let s = replay(config(&policy("fixed_window")), vec![cut]);
    assert_eq!(s.bad_lines.count, 1, "{:?}", s.bad_lines);
    assert!(
        s.bad_lines.first[0].reason.contains("cannot read"),
        "{:?}",
        s.bad_lines
    );
    assert!(s.lines > 50 && s.lines < 250, "{}", s.lines);
}

#[test]
fn json_lines_with_mapped_fields_and_a_user_key() {
    let dir = tempdir();
    let lines: Vec<String> = (0..30)
        .map(|i| {
            format!(
                r#"{{"ts":{},"verb":"POST","uri":"/v1/orders?x={i}","vhost":"api.example.com","client":"198.51.100.4","uid":"customer-{}"}}"#,
                (START + i) * 1000,
                i % 2
            )
        })
        .collect();
    let log = write_log(dir.path(), "app.jsonl", &lines);
    let text = "[[policy]]\nname = \"orders\"\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1m\"\n\
                key = [\"user\", \"ip\"]\nmatch = { path = \"/v1/orders\", methods = [\"POST\"], host = \"api.example.com\" }\n";
    let mut options = Options::new(config(text), vec![log]);
    options.format = Format::Auto;
    options.fields = JsonFields {
        time: "ts".into(),
        method: "verb".into(),
        path: "uri".into(),
        host: "vhost".into(),
        ip: "client".into(),
        user: "uid".into(),
        ..JsonFields::default()
    };
    let s = replay_with(options);
    assert_eq!(s.logs[0].format, "json");
    let p = &s.result.policies[0];
    assert_eq!((p.requests, p.denied, p.keys), (30, 10, 2));
    let keys: Vec<&str> = p.top_keys.iter().map(|k| k.key.as_str()).collect();
    assert_eq!(keys, ["user:customer-0", "user:customer-1"]);
}

#[test]
fn api_keys_are_shown_hashed_and_routes_and_costs_apply() {
    let dir = tempdir();
    let mut lines = Vec::new();
    for i in 0..8 {
        // Tollgate's log_format: the API key and $msec after the user agent.
        lines.push(format!(
            "{} \"secret-key-1\" {}.250",
            line("192.0.2.1", i, "POST", "/v1/export/1"),
            START + i
        ));
        lines.push(format!(
            "{} \"-\" {}.500",
            line("192.0.2.2", i, "GET", "/healthz"),
            START + i
        ));
    }
    let log = write_log(dir.path(), "tollgate.log", &lines);
    let text = "[[policy]]\nname = \"export\"\nalgorithm = \"token_bucket\"\ncapacity = 20\nrefill = \"1/h\"\ncost = 5\n\
                key = [\"header:x-api-key\", \"ip\"]\nmatch = { path = \"/v1/export/*\", methods = [\"POST\"] }\n";
    let s = replay(config(text), vec![log]);
    let r = &s.result;
    assert_eq!((r.requests, r.unmatched, r.denied), (16, 8, 4));
    let p = &r.policies[0];
    assert_eq!(p.top_keys.len(), 1);
    let key = &p.top_keys[0].key;
    assert!(key.starts_with("header:x-api-key:"), "{key}");
    assert!(!key.contains("secret"), "the credential leaked: {key}");
    // Peak demand counts cost: 8 requests of 5 within the hour-long refill.
    assert_eq!(p.top_keys[0].peak, 40);
    assert_eq!(s.first_time.as_deref(), Some("2024-03-01T00:00:00.25Z"));
}

/// nginx writes `$msec` when the request ends; `$request_time` after it says how long the
/// request took, so the replay decides it when it arrived, as the server did. Two requests of
/// one key against 1 a second: by their ends both fall in second 11 (the second denied); by
/// their arrivals (10.7 and 11.2) each has a second of its own.
#[test]
fn request_time_moves_each_request_back_to_its_arrival() {
    let dir = tempdir();
    let lines = [
        format!(
            "{} \"k1\" {}.200 0.500",
            line("192.0.2.1", 11, "GET", "/v1/slow"),
            START + 11
        ),
        format!(
            "{} \"k1\" {}.300 0.100",
            line("192.0.2.1", 11, "GET", "/v1/fast"),
            START + 11
        ),
    ];
    let log = write_log(dir.path(), "timed.log", &lines);
    let text = "[[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1s\"\nkey = [\"header:x-api-key\"]\n";
    let s = replay(config(text), vec![log.clone()]);
    assert_eq!(s.bad_lines.count, 0, "{:?}", s.bad_lines.first);
    assert_eq!(s.first_time.as_deref(), Some("2024-03-01T00:00:10.7Z"));
    assert_eq!(s.last_time.as_deref(), Some("2024-03-01T00:00:11.2Z"));
    assert_eq!((s.result.requests, s.result.denied), (2, 0));

    // The same lines without $request_time: decided at their ends, the second one denied.
    let ends: Vec<String> = lines
        .iter()
        .map(|l| {
            l.rsplit_once(' ')
                .map_or(l.as_str(), |(head, _)| head)
                .to_owned()
        })
        .collect();
    let log = write_log(dir.path(), "ends.log", &ends);
    let s = replay(config(text), vec![log]);
    assert_eq!((s.result.requests, s.result.denied), (2, 1));
}

/// A log that cannot be opened is named once with the OS's reason, also when the error is
/// printed with its chain of sources (as `tollgate replay` prints it, with anyhow's `{:#}`).
#[test]
fn a_missing_log_is_named_once_with_its_reason() {
    let dir = tempdir();
    let missing = dir.path().join("nope.log");
    let options = Options::new(config(&policy("fixed_window")), vec![missing]);
    let err = tollgate_replay::replay(&options, &mut |_| {})
        .err()
        .unwrap_or_else(|| panic!("a missing log was replayed"));
    let printed = with_sources(&err);
    let reason = std::fs::File::open(dir.path().join("nope.log"))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_else(|| panic!("nope.log exists"));
    assert_eq!(printed.matches(&reason).count(), 1, "{printed}");
    assert!(
        printed.ends_with(&format!("nope.log: cannot read the log: {reason}")),
        "{printed}"
    );
}

/// An error as anyhow's `{:#}` prints it: its message, then each source's, `: `-separated.
fn with_sources(err: &dyn std::error::Error) -> String {
    let mut chain = vec![err.to_string()];
    let mut source = err.source();
    while let Some(e) = source {
        chain.push(e.to_string());
        source = e.source();
    }
    chain.join(": ")
}

/// A report folder that cannot be made is named once with the OS's reason, as a log is.
#[test]
fn an_unwritable_report_is_named_once_with_its_reason() {
    let dir = tempdir();
    let log = write_log(dir.path(), "access.log", &twice_and_half());
    let s = replay(config(&policy("fixed_window")), vec![log.clone()]);
    // A folder inside a file: it cannot be created.
    let out = log.join("report");
    let err = tollgate_replay::report::write(&s, &out)
        .err()
        .unwrap_or_else(|| panic!("a report was written inside a file"));
    let printed = with_sources(&err);
    let reason = std::fs::create_dir_all(&out)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_else(|| panic!("{} was made", out.display()));
    assert_eq!(printed.matches(&reason).count(), 1, "{printed}");
    assert!(printed.contains(": cannot write the report: "), "{printed}");
}

/// A JSON-lines log saved with a UTF-8 byte order mark is still JSON lines, and its first line
/// is read like the others.
#[test]
fn a_byte_order_mark_is_not_part_of_the_first_line() {
    let dir = tempdir();
    let lines: Vec<String> = (0..3)
        .map(|i| {
            format!(
                r#"{{"time":{},"method":"GET","path":"/v1/items","ip":"198.51.100.4"}}"#,
                START + i
            )
        })
        .collect();
    let mut text = "\u{feff}".to_owned() + &lines.join("\n");
    text.push('\n');
    let json = dir.path().join("bom.jsonl");
    std::fs::write(&json, &text).unwrap_or_else(|e| panic!("{e}"));
    let s = replay(config(&policy("fixed_window")), vec![json]);
    assert_eq!(s.logs[0].format, "json");
    assert_eq!(
        (s.bad_lines.count, s.result.requests),
        (0, 3),
        "{:?}",
        s.bad_lines
    );

    // A combined log too: the mark would otherwise be read into the first line's address,
    // and that request counted under no client's key. Eleven requests of one client against
    // ten a minute: all under its address, the eleventh denied.
    let combined = dir.path().join("bom.log");
    let lines: Vec<String> = (0..11)
        .map(|i| line("203.0.113.9", i, "GET", "/v1/items"))
        .collect();
    let text = format!("\u{feff}{}\n", lines.join("\n"));
    std::fs::write(&combined, text).unwrap_or_else(|e| panic!("{e}"));
    let s = replay(config(&policy("fixed_window")), vec![combined]);
    assert_eq!(s.logs[0].format, "combined");
    let p = &s.result.policies[0];
    assert_eq!(p.keys, 1);
    let top: Vec<(&str, u64, u64)> = p
        .top_keys
        .iter()
        .map(|k| (k.key.as_str(), k.requests, k.denied))
        .collect();
    assert_eq!(top, [("ip:203.0.113.9", 11, 1)]);
}
