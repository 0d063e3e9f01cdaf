//! `tollgate replay` as a user runs it: the table on stdout, the report folder, no progress bar
//! when piped, and clear errors (exit 1) for a bad configuration, a missing log or a bad sweep.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

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
