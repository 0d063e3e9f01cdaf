//! A Python client generated with grpcio-tools from the vendored `.proto` files calls
//! `ShouldRateLimit` over 127.0.0.1 and sees OVER_LIMIT: proves the generated Rust messages
//! are wire-compatible with protoc's output.
//!
//! Needs a Python that imports `grpc` and `grpc_tools`: `$TOLLGATE_PYTHON`, else the venv
//! `scripts/test.sh` installs them into (`target/envoy-pyvenv`), else `python3`. The test
//! installs nothing; without them it fails saying the command to run.
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
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let candidates = [
        std::env::var_os("TOLLGATE_PYTHON").map(PathBuf::from),
        Some(target.join("envoy-pyvenv/bin/python")),
        Some(PathBuf::from("python3")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|p| has_grpc(p))
        .unwrap_or_else(|| {
            panic!(
                "no Python with grpcio and grpcio-tools: run scripts/test.sh, which installs \
                 them, or: python3 -m venv target/envoy-pyvenv && \
                 target/envoy-pyvenv/bin/python -m pip install grpcio grpcio-tools \
                 (Debian: apt-get install python3-venv first)"
            )
        })
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
                "envoy/type/v3/ratelimit_unit.proto",
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
