//! A Python client generated with grpcio-tools from the vendored `.proto` files calls
//! `ShouldRateLimit` over 127.0.0.1 and sees OVER_LIMIT: proves the hand-written Rust messages
//! are wire-compatible with protoc's output.
//!
//! Needs `python3`. When `grpc` and `grpc_tools` are not importable, they are installed with
//! pip into a virtual environment under Cargo's target directory (kept for later runs).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::start;
use tollgate_envoy::{Config, Descriptor, Domain, RateLimit, Unit};

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn has_grpc(python: &Path) -> bool {
    Command::new(python)
        .args(["-c", "import grpc, grpc_tools.protoc"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A Python interpreter that can import `grpc` and `grpc_tools`.
fn python() -> PathBuf {
    let system = PathBuf::from("python3");
    match Command::new(&system).arg("--version").output() {
        Ok(o) if o.status.success() => {}
        _ => panic!(
            "python3 is required for this test (Debian: apt-get install python3 python3-venv); \
             grpcio and grpcio-tools are then installed with pip into a venv"
        ),
    }
    if has_grpc(&system) {
        return system;
    }
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("envoy-pyvenv");
    let python = venv.join("bin/python");
    if !has_grpc(&python) {
        run(
            Command::new(&system).args(["-m", "venv"]).arg(&venv),
            "python3 -m venv (Debian: apt-get install python3-venv)",
        );
        run(
            Command::new(&python).args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "grpcio",
                "grpcio-tools",
            ]),
            "pip install grpcio grpcio-tools",
        );
    }
    python
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_generated_from_the_vendored_protos_sees_over_limit() {
    let python = tokio::task::spawn_blocking(python).await.unwrap();
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let generated =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("envoy-pygen-{}", std::process::id()));
    std::fs::create_dir_all(&generated).unwrap();
    // The well-known google/protobuf files come from grpc_tools' own copy, as Python's protobuf
    // runtime already registers them; Envoy's come from the vendored directory.
    let include = run(
        Command::new(&python).args([
            "-c",
            "import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), '_proto'))",
        ]),
        "locating grpc_tools' protos",
    );
    run(
        Command::new(&python)
            .args(["-m", "grpc_tools.protoc"])
            .arg(format!("-I{}", include.trim()))
            .arg(format!("-I{}", crate_dir.join("proto").display()))
            .arg(format!("--python_out={}", generated.display()))
            .arg(format!("--grpc_python_out={}", generated.display()))
            .args([
                "envoy/service/ratelimit/v3/rls.proto",
                "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
                "envoy/config/core/v3/base.proto",
            ]),
        "grpc_tools.protoc",
    );

    let config =
        Config::new()
            .domain(Domain::new("edge").descriptor(
                Descriptor::new("api_key").rate_limit(RateLimit::per(1, Unit::Minute)),
            ));
    let server = start(config).await;
    let script = crate_dir.join("tests/python/rls_client.py");
    let addr = server.addr.to_string();
    let out = tokio::task::spawn_blocking(move || {
        let out = run(
            Command::new(&python).arg(script).arg(&generated).arg(addr),
            "the Python client",
        );
        let _ = std::fs::remove_dir_all(&generated);
        out
    })
    .await
    .unwrap();
    assert!(out.contains("OVER_LIMIT as expected"), "{out}");
}
