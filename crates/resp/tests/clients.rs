//! Real clients against the door: `redis-cli` (RESP2 and `-3`, inline commands from stdin,
//! `--pipe`), `redis-benchmark` (pipelined 16 deep, RESP2 and RESP3, no error and no warning),
//! Python's `redis` package (RESP2 and RESP3, pipelines, transactions, errors as exceptions),
//! and ioredis 5 and 6 with their default options (the ready check's `INFO`).
//!
//! Needs `redis-cli` and `redis-benchmark` (Debian's `redis-tools`), a Python that imports
//! `redis`: `$TOLLGATE_RESP_PYTHON`, else the venv `target/resp-pyvenv`, else one of the
//! other test venvs or `python3` if it has the package, and, where `node` is installed,
//! ioredis as `ioredis5` and `ioredis6` in `$TOLLGATE_RESP_NODE_MODULES` or
//! `target/resp-node/node_modules` (`npm install --prefix target/resp-node
//! ioredis5@npm:ioredis@5 ioredis6@npm:ioredis@6`). The tests install nothing and fail saying
//! what to run; the ioredis test is skipped, saying so, only where `node` is missing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::start;
use tollgate_resp::Limits;

fn run(cmd: &mut Command, stdin: Option<&[u8]>) -> Output {
    let program = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {program}: {e}; run scripts/test.sh, which installs it \
                 (Debian: apt-get install redis-tools)"
            )
        });
    let mut input = child.stdin.take().unwrap();
    if let Some(bytes) = stdin {
        input.write_all(bytes).unwrap();
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{program} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn cli(port: u16, args: &[&str]) -> String {
    let port = port.to_string();
    let out = run(
        Command::new("redis-cli").args(["-p", &port]).args(args),
        None,
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn redis_cli() {
    let door = start(Limits::default());
    let port = door.addr.port();
    assert_eq!(cli(port, &["PING"]), "PONG\n");
    assert_eq!(
        cli(port, &["CL.THROTTLE", "user123", "15", "30", "60"]),
        "0\n16\n15\n-1\n2\n"
    );
    assert_eq!(
        cli(port, &["CL.THROTTLE", "user123", "15", "30", "60", "20"]),
        "1\n16\n15\n-1\n2\n"
    );
    // redis-cli follows an error with an empty line.
    assert_eq!(
        cli(port, &["CL.THROTTLE", "user123", "x", "30", "60"]),
        "Cell error: Store error: Couldn't parse as integer: x\n\n"
    );
    // RESP3: the same array for CL.THROTTLE, a map for TOLLGATE.CHECK.
    assert_eq!(
        cli(port, &["-3", "CL.THROTTLE", "r3", "0", "1", "60"]),
        "0\n1\n0\n-1\n60\n"
    );
    let check = cli(port, &["-3", "TOLLGATE.CHECK", "tiny", "cli-key"]);
    assert!(
        check.starts_with("allowed 1\nlimit 2\nremaining 1\nreset ")
            && check.ends_with("\nretry_after -1\n"),
        "{check}"
    );
    // Commands typed on stdin, one per line (inline parsing on the client's side, then arrays).
    let out = run(
        Command::new("redis-cli").args(["-p", &port.to_string()]),
        Some(b"PING\nECHO \"two words\"\nCL.THROTTLE stdin 1 1 1\nNOSUCH a\n"),
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "PONG\ntwo words\n0\n2\n1\n-1\n1\nERR unknown command 'NOSUCH', with args beginning with: 'a' \n\n"
    );
}

#[test]
fn redis_cli_pipe_mode() {
    let door = start(Limits::default());
    let mut input = Vec::new();
    for i in 0..5_000 {
        let key = format!("pipe{}", i % 100);
        input.extend(common::frame(&[
            b"CL.THROTTLE",
            key.as_bytes(),
            b"10",
            b"100",
            b"1",
        ]));
    }
    // Protocol as redis-cli --pipe documents it, plus an inline line.
    input.extend(b"PING\r\n");
    let out = run(
        Command::new("redis-cli").args(["-p", &door.addr.port().to_string(), "--pipe"]),
        Some(&input),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("errors: 0, replies: 5001"), "{stdout}");
}

/// What `redis-benchmark` sends: `CL.THROTTLE` on random keys, with a quota none reaches.
const BENCH_THROTTLE: [&str; 6] = [
    "CL.THROTTLE",
    "bench:__rand_int__",
    "100",
    "1000000",
    "1",
    "1",
];

#[test]
fn redis_benchmark_pipelined() {
    let door = start(Limits::default());
    let port = door.addr.port().to_string();
    for protocol in [None, Some("-3")] {
        let mut cmd = Command::new("redis-benchmark");
        cmd.args([
            "-p", &port, "-n", "20000", "-c", "8", "-P", "16", "-r", "1000", "-q",
        ]);
        cmd.args(protocol);
        cmd.args(BENCH_THROTTLE);
        let out = run(&mut cmd, None);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stdout.contains("requests per second"), "{stdout}\n{stderr}");
        for bad in ["ERR", "rror", "WARNING"] {
            assert!(
                !stdout.contains(bad) && !stderr.contains(bad),
                "{stdout}\n{stderr}"
            );
        }
    }
    // Its own tests of the server's plumbing.
    let out = run(
        Command::new("redis-benchmark")
            .args(["-p", &port, "-n", "2000", "-c", "4", "-q", "-t", "ping"]),
        None,
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("PING_MBULK"));
}

fn has_redis_py(python: &Path) -> bool {
    Command::new(python)
        .args(["-c", "import redis"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A Python that imports `redis`.
fn python() -> PathBuf {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    [
        std::env::var_os("TOLLGATE_RESP_PYTHON").map(PathBuf::from),
        Some(target.join("resp-pyvenv/bin/python")),
        std::env::var_os("TOLLGATE_PYTHON").map(PathBuf::from),
        Some(target.join("envoy-pyvenv/bin/python")),
        Some(PathBuf::from("python3")),
    ]
    .into_iter()
    .flatten()
    .find(|p| has_redis_py(p))
    .unwrap_or_else(|| {
        panic!(
            "no Python with the redis package: run scripts/test.sh, which installs it, or: \
             python3 -m venv target/resp-pyvenv && target/resp-pyvenv/bin/python -m pip install \
             redis (Debian: apt-get install python3-venv first)"
        )
    })
}

const PYTHON_CLIENT: &str = r#"
import sys, redis

port = int(sys.argv[1])
for proto in (2, 3):
    r = redis.Redis(port=port, protocol=proto)
    assert r.ping() is True
    key = f"py{proto}"
    assert r.execute_command("CL.THROTTLE", key, 2, 1, 60) == [0, 3, 2, -1, 60]
    p = r.pipeline(transaction=False)
    for _ in range(4):
        p.execute_command("CL.THROTTLE", key, 2, 1, 60)
    assert [x[0] for x in p.execute()] == [0, 0, 1, 1], proto
    check = r.execute_command("TOLLGATE.CHECK", "tiny", key)
    if proto == 2:
        assert check[:3] == [1, 2, 1] and check[4] == -1, check
    else:
        assert check[b"allowed"] == 1 and check[b"remaining"] == 1 and check[b"retry_after"] == -1, check
    try:
        r.execute_command("CL.THROTTLE", key, "x", 1, 60)
        raise SystemExit("no error")
    except redis.ResponseError as e:
        assert str(e) == "Cell error: Store error: Couldn't parse as integer: x", str(e)
    try:
        r.execute_command("TOLLGATE.CHECK", "nope", key)
        raise SystemExit("no error")
    except redis.ResponseError as e:
        assert "unknown policy 'nope'" in str(e), str(e)
    r.client_setname(f"py-{proto}")
    assert r.client_getname() in (f"py-{proto}", f"py-{proto}".encode())
    assert r.echo("hi") == b"hi"
print("ok")
"#;

#[test]
fn python_redis_client() {
    let door = start(Limits::default());
    let python = python();
    let out = run(
        Command::new(&python).args(["-c", PYTHON_CLIENT, &door.addr.port().to_string()]),
        None,
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
}

const PYTHON_PASSWORD: &str = r#"
import sys, redis
port = int(sys.argv[1])
for proto in (2, 3):
    r = redis.Redis(port=port, protocol=proto, password="s3cret")
    assert r.ping() is True
    assert r.execute_command("CL.THROTTLE", f"pw{proto}", 2, 1, 60) == [0, 3, 2, -1, 60]
for bad in (None, "wrong"):
    try:
        redis.Redis(port=port, password=bad).execute_command("CL.THROTTLE", "pw", 2, 1, 60)
        raise SystemExit(f"{bad}: admitted")
    except redis.exceptions.AuthenticationError:
        pass
print("ok")
"#;

#[test]
fn clients_give_the_password() {
    let door = common::start_with(
        tollgate_resp::Handler::for_limiter(common::limiter()).with_password(&b"s3cret"[..]),
        Limits::default(),
    );
    let port = door.addr.port();
    // redis-cli: -a (or REDISCLI_AUTH), then the commands; without it, -NOAUTH.
    // [allowed, limit, remaining, reset (the hour's window: any second), retry_after].
    let admitted = cli(
        port,
        &[
            "--no-auth-warning",
            "-a",
            "s3cret",
            "TOLLGATE.CHECK",
            "tiny",
            "cli",
        ],
    );
    assert!(
        admitted.starts_with("1\n2\n1\n") && admitted.ends_with("\n-1\n"),
        "{admitted}"
    );
    assert_eq!(
        cli(port, &["TOLLGATE.CHECK", "tiny", "cli"]),
        "NOAUTH Authentication required.\n\n" // redis-cli follows an error with an empty line
    );
    // A wrong one: redis-cli says "AUTH failed: WRONGPASS ..." on stderr, then asks anyway.
    assert_eq!(
        cli(port, &["--no-auth-warning", "-a", "nope", "PING"]),
        "NOAUTH Authentication required.\n\n"
    );
    // redis-benchmark -a, pipelined: no error.
    let out = run(
        Command::new("redis-benchmark")
            .args([
                "-p",
                &port.to_string(),
                "-a",
                "s3cret",
                "-n",
                "4000",
                "-c",
                "4",
                "-P",
                "16",
                "-q",
            ])
            .args(BENCH_THROTTLE),
        None,
    );
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("requests per second") && !text.contains("rror"),
        "{text}"
    );
    // redis-py, RESP2 and RESP3 (HELLO 3 AUTH ...), and refused without it or with another.
    let out = run(
        Command::new(python()).args(["-c", PYTHON_PASSWORD, &port.to_string()]),
        None,
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
}

const PYTHON_TRANSACTION: &str = r#"
import sys, redis

port = int(sys.argv[1])
for proto in (2, 3):
    r = redis.Redis(port=port, protocol=proto)
    key = f"tx{proto}"
    # pipeline() is a transaction by default: MULTI, the commands, EXEC.
    p = r.pipeline()
    for _ in range(4):
        p.execute_command("CL.THROTTLE", key, 2, 1, 60)
    p.execute_command("TOLLGATE.CHECK", "tiny", key)
    got = p.execute()
    assert [x[0] for x in got[:4]] == [0, 0, 0, 1], got
    check = got[4]
    allowed = check[0] if proto == 2 else check[b"allowed"]
    assert allowed == 1, check
    # A command refused while queueing aborts the whole transaction: nothing runs.
    p = r.pipeline()
    p.execute_command("CL.THROTTLE", f"{key}-aborted", 2, 1, 60)
    p.execute_command("NOSUCH")
    try:
        p.execute()
        raise SystemExit("no error")
    except redis.ResponseError as e:
        assert "unknown command 'NOSUCH'" in str(e), str(e)
    assert r.execute_command("CL.THROTTLE", f"{key}-aborted", 2, 1, 60, 0) == [0, 3, 3, -1, 0]
    # WATCH is refused, saying so.
    try:
        with r.pipeline() as p:
            p.watch("k")
        raise SystemExit("WATCH admitted")
    except redis.ResponseError as e:
        assert "WATCH is not supported" in str(e), str(e)
    assert r.info()["loading"] == 0
print("ok")
"#;

/// redis-py's default `pipeline()` is a transaction: `MULTI`, the queued commands, `EXEC`.
#[test]
fn python_redis_transactions() {
    let door = start(Limits::default());
    let out = run(
        Command::new(python()).args(["-c", PYTHON_TRANSACTION, &door.addr.port().to_string()]),
        None,
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
}

/// Where ioredis 5 and 6 are installed, as `ioredis5` and `ioredis6`: `$TOLLGATE_RESP_NODE_MODULES`,
/// else `target/resp-node/node_modules`.
fn node_modules() -> PathBuf {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let dir = std::env::var_os("TOLLGATE_RESP_NODE_MODULES")
        .map(PathBuf::from)
        .unwrap_or_else(|| target.join("resp-node/node_modules"));
    assert!(
        dir.join("ioredis5").is_dir() && dir.join("ioredis6").is_dir(),
        "no ioredis in {}: npm install --prefix target/resp-node ioredis5@npm:ioredis@5 \
         ioredis6@npm:ioredis@6",
        dir.display()
    );
    dir
}

const IOREDIS_CLIENT: &str = r#"
const port = Number(process.argv[1]);
setTimeout(() => { console.log("timed out: the client never became ready"); process.exit(2); }, 15000);
(async () => {
  for (const name of ["ioredis5", "ioredis6"]) {
    const Redis = require(name);
    // Default options: the ready check (INFO) before any command.
    const r = new Redis({ port, host: "127.0.0.1" });
    r.on("error", (e) => console.log(`${name} error: ${e.message}`));
    await new Promise((ready) => r.once("ready", ready));
    const key = `io-${name}`;
    const first = await r.call("CL.THROTTLE", key, 2, 1, 60);
    if (JSON.stringify(first) !== "[0,3,2,-1,60]") throw new Error(`${name}: ${first}`);
    const tx = await r.multi().call("CL.THROTTLE", key, 2, 1, 60).call("TOLLGATE.CHECK", "tiny", key).exec();
    if (tx[0][0] !== null || tx[0][1][2] !== 1) throw new Error(`${name}: ${JSON.stringify(tx)}`);
    if (await r.ping() !== "PONG") throw new Error(`${name}: ping`);
    r.disconnect();
  }
  console.log("ok");
  process.exit(0);
})().catch((e) => { console.log(`failed: ${e.stack}`); process.exit(1); });
"#;

/// ioredis with its default options (5: RESP2; 6: RESP3 and `HELLO 3`): its ready check sends
/// `INFO` and reads `loading` before it lets any command through. Skipped, saying so, only
/// where `node` is not installed.
#[test]
fn ioredis_with_default_options() {
    if Command::new("node").arg("--version").output().is_err() {
        println!("skipped: node is not installed");
        return;
    }
    let modules = node_modules();
    let door = start(Limits::default());
    let out = run(
        Command::new("node").env("NODE_PATH", &modules).args([
            "-e",
            IOREDIS_CLIENT,
            &door.addr.port().to_string(),
        ]),
        None,
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
}
