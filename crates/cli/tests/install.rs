//! What an installed `tollgate` offers besides serving: `--version`, shell completions and man
//! pages generated from the command line itself, and `[log]` (text or JSON lines at a level).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

fn output(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn version_names_the_binary_and_the_crate_version() {
    assert_eq!(
        output(&["--version"]).trim(),
        format!("tollgate {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn completions_cover_every_subcommand_in_each_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = output(&["completions", shell]);
        for word in ["serve", "validate", "completions", "config"] {
            assert!(script.contains(word), "{shell} completion lacks {word}");
        }
    }
    let bash = output(&["completions", "bash"]);
    assert!(bash.contains("complete -F _tollgate"), "{bash}");
}

#[test]
fn man_pages_for_the_binary_and_each_subcommand() {
    let page = output(&["man"]);
    assert!(page.contains(".TH tollgate 1"), "{page}");
    assert!(page.contains("serve"), "{page}");
    let dir = tempfile::tempdir().unwrap();
    let dir_arg = dir.path().display().to_string();
    output(&["man", "--dir", &dir_arg]);
    for name in ["tollgate.1", "tollgate-serve.1", "tollgate-validate.1"] {
        let text = std::fs::read_to_string(dir.path().join(name)).unwrap();
        assert!(
            text.starts_with(".ie") || text.contains(".TH"),
            "{name}: {text}"
        );
    }
    let serve = std::fs::read_to_string(dir.path().join("tollgate-serve.1")).unwrap();
    assert!(serve.contains("config"), "{serve}");
}

/// Starts `serve` on a configuration of a Redis store that is not there and no key secret
/// (warned about at start) plus `log_section`, stops it once it is serving, and returns its
/// standard error.
fn log_of_a_short_run(log_section: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let file: PathBuf = dir.path().join("tollgate.toml");
    // Port 1 on loopback: nothing listens there, and an unreachable Redis is not fatal.
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\n\n\
         [store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1\"\n\n{log_section}"
    );
    std::fs::write(&file, &text).unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&file)
        .env_remove("TOLLGATE_LOG")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut line = String::new();
    while !line.contains("admin") {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "serve exited early"
        );
        assert!(Instant::now() < deadline, "no banner");
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn json_logs_are_one_object_per_line() {
    let log = log_of_a_short_run("[log]\nformat = \"json\"\n");
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    let warning = lines
        .iter()
        .find(|l| l["level"] == "WARN")
        .unwrap_or_else(|| panic!("no warning in {log}"));
    let message = warning["message"].as_str().unwrap();
    assert!(message.contains("key_secret_env is not set"), "{message}");
    assert_eq!(warning["target"], "tollgate_server");
    assert!(warning["timestamp"].is_string());
    let stopping = lines.iter().find(|l| l["level"] == "INFO");
    assert!(
        stopping.is_some_and(|l| l["message"].as_str().unwrap().starts_with("shutting down")),
        "{log}"
    );
}

#[test]
fn text_logs_at_the_level_drop_what_is_below_it() {
    let log = log_of_a_short_run("[log]\nformat = \"text\"\nlevel = \"warn\"\n");
    assert!(log.contains(" WARN "), "{log}");
    assert!(log.contains("key_secret_env is not set"), "{log}");
    assert!(!log.contains(" INFO "), "info lines at level warn: {log}");
    assert!(serde_json::from_str::<serde_json::Value>(log.lines().next().unwrap()).is_err());
}
