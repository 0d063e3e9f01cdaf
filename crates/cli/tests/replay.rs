//! `tollgate replay` as a user runs it: the table on stdout, the report folder, a limit and a
//! window sweep's figures and plot, no progress bar when piped and one on a terminal, and clear
//! errors (exit 1) for a bad configuration, a missing log or a bad sweep.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

mod closed_stdout_support;

const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-replay-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const CONFIG: &str = "[[policy]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 3\nwindow = \"1m\"\nkey = [\"ip\"]\n";

/// Five requests of one client in one minute, one line that is not a request.
const LOG: &str = "\
198.51.100.3 - - [01/Mar/2024:10:00:01 +0000] \"GET /a HTTP/1.1\" 200 1 \"-\" \"t\"
198.51.100.3 - - [01/Mar/2024:10:00:02 +0000] \"GET /a HTTP/1.1\" 200 1 \"-\" \"t\"
not a request
198.51.100.3 - - [01/Mar/2024:10:00:03 +0000] \"GET /a HTTP/1.1\" 200 1 \"-\" \"t\"
198.51.100.3 - - [01/Mar/2024:10:00:04 +0000] \"GET /a HTTP/1.1\" 200 1 \"-\" \"t\"
198.51.100.3 - - [01/Mar/2024:10:00:05 +0000] \"GET /a HTTP/1.1\" 200 1 \"-\" \"t\"
";

fn run(dir: &std::path::Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .current_dir(dir)
        .arg("replay")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn replay_prints_the_table_and_writes_the_report() {
    let dir = temp_dir("ok");
    std::fs::write(dir.join("t.toml"), CONFIG).unwrap();
    std::fs::write(dir.join("access.log"), LOG).unwrap();
    let out = run(
        &dir,
        &[
            "--config",
            "t.toml",
            "access.log",
            "--out",
            "report",
            "--sweep",
            "limit=2,5",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // Piped: no progress bar, nothing on stderr.
    assert!(stderr.is_empty(), "{stderr}");
    assert!(stdout.contains("6 lines"), "{stdout}");
    assert!(stdout.contains("bad line access.log:3"), "{stdout}");
    assert!(
        stdout.contains("5 requests: 0 under no policy, 2 answered 429"),
        "{stdout}"
    );
    assert!(stdout.contains("ip:198.51.100.3"), "{stdout}");
    for f in [
        "report.html",
        "summary.json",
        "sweep.svg",
        "sweep.png",
        "timeline-1-api.png",
        "peaks-1-api.svg",
    ] {
        assert!(dir.join("report").join(f).is_file(), "{f} missing");
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report/summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["result"]["denied"], 2);
    assert_eq!(summary["sweep"]["candidates"][0]["result"]["denied"], 3);
    assert_eq!(summary["sweep"]["candidates"][1]["result"]["denied"], 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn replay_refuses_bad_input_clearly() {
    let dir = temp_dir("bad");
    std::fs::write(dir.join("t.toml"), CONFIG).unwrap();
    std::fs::write(
        dir.join("bad.toml"),
        "[[policy]]\nname = \"x\"\nlimit = 0\n",
    )
    .unwrap();
    std::fs::write(dir.join("access.log"), LOG).unwrap();
    for (args, needle) in [
        (&["--config", "bad.toml", "access.log"][..], "bad.toml:"),
        (&["--config", "t.toml", "missing.log"], "missing.log"),
        (
            &["--config", "t.toml", "access.log", "--sweep", "limit=0"],
            "whole number",
        ),
        (
            &["--config", "t.toml", "access.log", "--format", "csv"],
            "combined, json or auto",
        ),
        (
            &["--config", "t.toml", "access.log", "--policy", "api"],
            "add a --sweep",
        ),
    ] {
        let out = run(&dir, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A system error is printed once, through the same printing as the other commands' errors:
/// it came twice, "... (os error 2): No such file or directory (os error 2)".
#[test]
fn a_missing_configuration_is_one_line_with_its_cause_once() {
    let dir = temp_dir("missing");
    let out = run(&dir, &["--config", "missing.toml", "some.log"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        "tollgate replay: missing.toml: cannot read the configuration: No such file or directory \
         (os error 2)"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tollgate replay ... | head -1`: the reader goes away and the replay ends quietly (status
/// 0, see crates/cli/src/stdout.rs), never a panic ("failed printing to stdout: Broken pipe");
/// the report --out asked for is written all the same.
#[test]
fn a_closed_stdout_ends_the_replay_quietly_and_the_report_is_still_written() {
    let dir = temp_dir("closed");
    std::fs::write(dir.join("t.toml"), CONFIG).unwrap();
    std::fs::write(dir.join("access.log"), LOG).unwrap();
    let bare = ["replay", "--config", "t.toml", "access.log"];
    let out = closed_stdout_support::run(BIN, &dir, &bare);
    closed_stdout_support::assert_quiet(&bare, &out);
    let with_out = [
        "replay",
        "--config",
        "t.toml",
        "access.log",
        "--out",
        "report",
    ];
    let out = closed_stdout_support::run(BIN, &dir, &with_out);
    closed_stdout_support::assert_quiet(&with_out, &out);
    for f in ["report.html", "summary.json"] {
        assert!(dir.join("report").join(f).is_file(), "{f} missing");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two requests a second for ten seconds from one client, against 3 per window: a window of
/// 1 s denies none, 5 s denies 7 of each 10, 1 m denies 17 of 20.
#[test]
fn a_window_sweep_gives_each_window_its_figures_and_plot() {
    let dir = temp_dir("window");
    std::fs::write(dir.join("t.toml"), CONFIG).unwrap();
    let log: String = (0..20)
        .map(|i| {
            format!(
                "198.51.100.7 - - [01/Mar/2024:10:00:{:02} +0000] \"GET /a HTTP/1.1\" 200 1 \"-\" \"t\"\n",
                i / 2
            )
        })
        .collect();
    std::fs::write(dir.join("access.log"), log).unwrap();
    let out = run(
        &dir,
        &[
            "--config",
            "t.toml",
            "access.log",
            "--out",
            "report",
            "--sweep",
            "window=1s,5s,1m",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The table: one row per candidate, its quota, denied count and share.
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("sweep of api:"))
        .skip(2)
        .take_while(|l| !l.is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    let want = [
        [
            "window=1s",
            "fixed_window",
            "limit=3",
            "window=1s",
            "0",
            "0.0%",
        ],
        [
            "window=5s",
            "fixed_window",
            "limit=3",
            "window=5s",
            "14",
            "70.0%",
        ],
        [
            "window=1m",
            "fixed_window",
            "limit=3",
            "window=1m",
            "17",
            "85.0%",
        ],
    ];
    assert_eq!(rows.len(), want.len(), "{stdout}");
    for (row, want) in rows.iter().zip(want) {
        assert_eq!(&row[..6], want, "{stdout}");
    }
    // summary.json: the same figures per candidate, with its window.
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report/summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["sweep"]["policy"], "api");
    let candidates = summary["sweep"]["candidates"].as_array().unwrap();
    let got: Vec<(&str, f64, u32, u64, f64)> = candidates
        .iter()
        .map(|c| {
            let p = &c["result"]["policies"][0];
            assert_eq!(p["name"], "api");
            (
                c["label"].as_str().unwrap(),
                c["window_secs"].as_f64().unwrap(),
                u32::try_from(c["limit"].as_u64().unwrap()).unwrap(),
                p["denied"].as_u64().unwrap(),
                p["denied_share"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("window=1s", 1.0, 3, 0, 0.0),
            ("window=5s", 5.0, 3, 14, 0.7),
            ("window=1m", 60.0, 3, 17, 0.85),
        ]
    );
    // The configuration as given (3 a minute) is replayed too.
    assert_eq!(summary["result"]["denied"], 17);
    // The sweep plot, drawn against the window.
    let svg = std::fs::read_to_string(dir.join("report/sweep.svg")).unwrap();
    assert!(svg.contains("candidate window (seconds)"), "{svg}");
    let png = std::fs::read(dir.join("report/sweep.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 1_000);
    let _ = std::fs::remove_dir_all(&dir);
}

/// On a terminal (a pseudo-terminal from `script`, util-linux) the progress bar is drawn on
/// stderr and cleared before the table, and the report is still written.
#[cfg(target_os = "linux")]
#[test]
fn on_a_terminal_a_progress_bar_is_drawn_then_cleared() {
    let dir = temp_dir("tty");
    std::fs::write(dir.join("t.toml"), CONFIG).unwrap();
    std::fs::write(dir.join("access.log"), LOG).unwrap();
    let replay = format!("'{BIN}' replay --config t.toml access.log --out report");
    let out = Command::new("script")
        .args(["--quiet", "--return", "--command", &replay, "/dev/null"])
        .current_dir(&dir)
        // A terminal that draws: the bar stays hidden where TERM is unset or dumb.
        .env("TERM", "xterm")
        .output()
        .unwrap_or_else(|e| panic!("cannot run script (util-linux's bsdutils): {e}"));
    let terminal = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{terminal}");
    // The bar full, with the log's size and the lines read as its message.
    let size = LOG.len();
    let full = format!("{} {size} B/{size} B 6 lines", "█".repeat(40));
    assert!(terminal.contains(&full), "{terminal:?}");
    // Erased (ESC [2K) right before the table, so the table is not written over it.
    assert!(
        terminal.contains("\x1b[2K6 lines, 2024-03-01T10:00:01Z"),
        "{terminal:?}"
    );
    assert!(terminal.contains("2 answered 429"), "{terminal:?}");
    assert!(dir.join("report/report.html").is_file());
    let _ = std::fs::remove_dir_all(&dir);
}
