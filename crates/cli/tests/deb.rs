//! The Debian package, built and installed for real. `scripts/deb.sh` packages the test build
//! with cargo-deb (`--profile dev --no-build`, which spares CI a release build), `dpkg -i`
//! installs it, `tollgate validate` accepts the installed `/etc/tollgate/tollgate.toml` as it
//! is, the installed binary serves as the `tollgate` user, tells a systemd-style notify socket
//! it is ready, and gives a decision, and `dpkg --purge` removes it all.
//!
//! Needs root (dpkg) and cargo-deb (`scripts/test.sh` installs it). The package is installed
//! machine-wide, so concurrent runs of this test wait for each other on a lock file.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(unix)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_tollgate");
const INSTALLED: &str = "/usr/bin/tollgate";
const CONFFILE: &str = "/etc/tollgate/tollgate.toml";
const UNIT: &str = "/usr/lib/systemd/system/tollgate.service";

#[test]
fn the_debian_package_installs_validates_serves_and_purges() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test installs a package with dpkg -i: run it as root"
    );
    let _lock = machine_lock();
    let dir = tempfile::tempdir().unwrap();
    // The service user must reach the copy of the configuration written here.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let deb = dir.path().join("tollgate.deb");
    build_package(&deb);

    dpkg(&["-i", &deb.display().to_string()]);
    let _purge = Purge;
    for path in [
        INSTALLED,
        CONFFILE,
        UNIT,
        "/usr/share/man/man1/tollgate.1.gz",
    ] {
        assert!(Path::new(path).is_file(), "{path} is not installed");
    }
    let conffiles = run(Command::new("dpkg-query").args(["-W", "-f=${Conffiles}", "tollgate"]));
    assert!(
        stdout(&conffiles).contains(CONFFILE),
        "{CONFFILE} is a conffile"
    );
    let unit = std::fs::read_to_string(UNIT).unwrap();
    for line in [
        "Type=notify",
        "User=tollgate",
        "LimitNOFILE=",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        // Where [store] path keeps the memory store's state.
        "StateDirectory=tollgate",
    ] {
        assert!(unit.contains(line), "the unit lacks {line}");
    }
    let conffile = std::fs::read_to_string(CONFFILE).unwrap();
    assert!(
        conffile.contains("# path = \"/var/lib/tollgate/state\""),
        "the packaged configuration points [store] path at the state directory, commented"
    );
    if Path::new("/usr/bin/systemd-analyze").is_file() {
        let verify = Command::new("systemd-analyze")
            .args(["verify", UNIT])
            .output()
            .unwrap();
        assert!(
            verify.status.success(),
            "systemd-analyze verify: {}",
            stderr(&verify)
        );
    }

    let version = run(Command::new(INSTALLED).arg("--version"));
    assert_eq!(
        stdout(&version).trim(),
        format!("tollgate {}", env!("CARGO_PKG_VERSION"))
    );
    let validate = run(Command::new(INSTALLED).args(["validate", CONFFILE]));
    assert!(stdout(&validate).starts_with("default: sliding_window_counter limit=100"));

    serve_as_the_service_user(dir.path());
}

/// Runs the installed binary as `tollgate` on the installed configuration (its two addresses
/// moved to free ports, so the test never collides with whatever uses 8080), and asks it.
fn serve_as_the_service_user(dir: &Path) {
    let (api, admin) = (free_port(), free_port());
    let text = std::fs::read_to_string(CONFFILE).unwrap();
    for (from, _) in [("127.0.0.1:8080", api), ("127.0.0.1:9090", admin)] {
        assert!(
            text.contains(from),
            "the installed configuration no longer listens on {from}"
        );
    }
    let text = text
        .replace("127.0.0.1:8080", &api.to_string())
        .replace("127.0.0.1:9090", &admin.to_string());
    let config = dir.join("tollgate.toml");
    std::fs::write(&config, text).unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let socket_path = dir.join("notify.sock");
    let notify = UnixDatagram::bind(&socket_path).unwrap();
    std::fs::set_permissions(&socket_path, std::fs::Permissions::from_mode(0o777)).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();

    let (uid, gid) = (id("-u"), id("-g"));
    let log_path = dir.join("serve.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = Command::new(INSTALLED)
        .args(["serve", "--config"])
        .arg(&config)
        .env("NOTIFY_SOCKET", &socket_path)
        .uid(uid)
        .gid(gid)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut message = [0u8; 256];
    let n = notify
        .recv(&mut message)
        .expect("READY=1 on the notify socket");
    assert_eq!(&message[..n], b"READY=1\n");

    let reply = post(
        api,
        "/v1/check",
        r#"{"policy":"default","key":"k1","cost":1}"#,
    );
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("\"allowed\":true"), "{reply}");
    assert!(
        reply
            .to_ascii_lowercase()
            .contains("x-ratelimit-limit: 100"),
        "{reply}"
    );

    run(Command::new("kill").args(["-TERM", &child.id().to_string()]));
    let n = notify
        .recv(&mut message)
        .expect("STOPPING=1 on the notify socket");
    assert_eq!(&message[..n], b"STOPPING=1\n");
    let status = child.wait().unwrap();
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(status.success(), "exit {status}: {log}");
}

/// Packages the binary this test was built with.
fn build_package(deb: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/deb.sh");
    // BIN is <target>/debug/tollgate.
    let target = Path::new(BIN).parent().and_then(Path::parent).unwrap();
    let mut command = Command::new(script);
    command
        .args(["--profile", "dev", "--no-build", "--fast", "--output"])
        .arg(deb)
        .env("CARGO_TARGET_DIR", target);
    if let Some(dir) = cargo_bin_dir() {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
        dirs.push(dir);
        command.env("PATH", std::env::join_paths(dirs).unwrap());
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "scripts/deb.sh failed (cargo-deb missing? run scripts/test.sh, which installs it: \
         cargo install cargo-deb --locked):\n{}",
        stderr(&out)
    );
}

/// `~/.cargo/bin`, where `cargo install` puts cargo-deb.
fn cargo_bin_dir() -> Option<PathBuf> {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .map(|c| c.join("bin"))
}

/// Removes the package, even when an assertion failed.
struct Purge;

impl Drop for Purge {
    fn drop(&mut self) {
        let out = dpkg_retrying(&["--purge", "tollgate"]);
        let gone = !Path::new(INSTALLED).exists() && !Path::new(CONFFILE).exists();
        if !std::thread::panicking() {
            assert!(out.status.success(), "dpkg --purge: {}", stderr(&out));
            assert!(gone, "the package left files behind");
        }
    }
}

fn dpkg(args: &[&str]) {
    let out = dpkg_retrying(args);
    assert!(
        out.status.success(),
        "dpkg {args:?}: {}{}",
        stdout(&out),
        stderr(&out)
    );
}

/// dpkg, retried for up to two minutes while another package manager holds its lock.
fn dpkg_retrying(args: &[&str]) -> Output {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let out = Command::new("dpkg").args(args).output().unwrap();
        let locked = stderr(&out).contains("lock");
        if out.status.success() || !locked || Instant::now() > deadline {
            return out;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Holds an exclusive lock, across processes, until dropped.
fn machine_lock() -> std::fs::File {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(std::env::temp_dir().join("tollgate-deb-test.lock"))
        .unwrap();
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive).unwrap();
    file
}

fn id(flag: &str) -> u32 {
    let out = run(Command::new("id").args([flag, "tollgate"]));
    stdout(&out)
        .trim()
        .parse()
        .expect("the package created the tollgate user")
}

fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
}

/// POSTs `body` once the server accepts connections (it was told it is ready, but the kernel
/// decides when the first connect lands).
fn post(addr: SocketAddr, path: &str, body: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut stream = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(e) => {
                assert!(Instant::now() < deadline, "cannot connect to {addr}: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply
}

fn run(command: &mut Command) -> Output {
    let out = command.output().unwrap();
    assert!(out.status.success(), "{command:?}: {}", stderr(&out));
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}
