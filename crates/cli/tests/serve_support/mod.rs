//! `tollgate serve` processes for end-to-end tests: started from a configuration in a
//! directory the test keeps (so a restart finds the same files), optionally under libfaketime
//! at a chosen date, stopped with SIGTERM (a clean stop) or SIGKILL (a crash); and
//! `POST /v1/check` answers with their headers.
//!
//! libfaketime is preloaded into the server itself rather than through the `faketime` command,
//! which runs the server as its own child: killing that command left the server running, an
//! orphan that outlived the test.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

/// A running `tollgate serve`, killed when dropped.
pub struct Server {
    child: Child,
    /// `[server] listen`: `/v1/check`.
    pub api: SocketAddr,
    pub admin: SocketAddr,
    /// `[proxy] listen`, when the configuration has one.
    pub proxy: Option<SocketAddr>,
    /// Everything the server wrote to stderr so far (its log).
    pub log: Arc<Mutex<String>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where libfaketime is (`/usr/lib/<arch>/faketime/libfaketime.so.1` on Debian), or a panic
/// that says how to install it.
fn libfaketime() -> PathBuf {
    let lib = |dir: &Path| dir.join("faketime").join("libfaketime.so.1");
    let candidates = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|arch| lib(&arch.path()))
        .chain([lib(Path::new("/usr/lib")), lib(Path::new("/usr/local/lib"))]);
    for candidate in candidates {
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "libfaketime not found: the calendar tests run the server under libfaketime; install \
         it with `apt-get install -y faketime` (scripts/test.sh does)"
    )
}

impl Server {
    /// `tollgate serve` with `config` (listeners added, on port 0) written to `dir/tollgate.toml`.
    /// `start_at`: a UTC date and time (`"2027-01-31 23:59:57"`) the server's clock starts from
    /// and runs on from, through libfaketime.
    pub fn start(dir: &Path, config: &str, start_at: Option<&str>) -> Server {
        Server::start_with_env(dir, config, start_at, &[])
    }

    /// [`Server::start`] with environment variables set for the server (`NOTIFY_SOCKET`).
    pub fn start_with_env(
        dir: &Path,
        config: &str,
        start_at: Option<&str>,
        env: &[(&str, &Path)],
    ) -> Server {
        let file = dir.join("tollgate.toml");
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n{config}"
        );
        std::fs::write(&file, text).unwrap();
        let wants_proxy = config.contains("[proxy]");
        let mut cmd = Command::new(BIN);
        if let Some(at) = start_at {
            // The date is UTC; the decisions' own clock (the CPU's counter) runs from the
            // faked start at the real pace, as does tokio's timer.
            cmd.env("LD_PRELOAD", libfaketime())
                .env("FAKETIME", format!("@{at}"))
                .env("TZ", "UTC")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        cmd.envs(env.iter().copied());
        let mut child = cmd
            .args(["serve", "--config"])
            .arg(&file)
            .env("TOLLGATE_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (mut api, mut admin, mut proxy) = (None, None, None);
        while api.is_none() || admin.is_none() || (wants_proxy && proxy.is_none()) {
            let Some(Ok(line)) = lines.next() else {
                let _ = child.wait();
                panic!(
                    "the server stopped before it listened:\n{}",
                    log.lock().unwrap()
                );
            };
            let url = line.split_whitespace().find(|w| w.starts_with("http://"));
            let addr =
                || -> SocketAddr { url.unwrap().trim_start_matches("http://").parse().unwrap() };
            if line.trim_start().starts_with("decision API") {
                api = Some(addr());
            } else if line.trim_start().starts_with("admin") {
                admin = Some(addr());
            } else if line.trim_start().starts_with("proxy") {
                proxy = Some(addr());
            }
        }
        std::thread::spawn(move || for _ in lines {});
        Server {
            child,
            api: api.unwrap(),
            admin: admin.unwrap(),
            proxy,
            log,
        }
    }

    /// SIGTERM, then waits for the process to end (a clean stop); its exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        self.child.wait().unwrap()
    }

    /// SIGKILL: the process ends as in a crash.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// `POST /v1/check` by policy.
    pub fn check(&self, policy: &str, key: &str, cost: u32) -> Answer {
        let body = format!(r#"{{"policy":"{policy}","key":"{key}","cost":{cost}}}"#);
        http(self.api, "POST", "/v1/check", &body)
    }
}

/// One HTTP answer: status, headers (names in lower case), body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: HashMap<String, String>,
    pub body: String,
}

impl Answer {
    /// A header's value as a number.
    pub fn number(&self, name: &str) -> u64 {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name} in {self:?}"))
            .parse()
            .unwrap_or_else(|e| panic!("{name}: {e} in {self:?}"))
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }
}

/// One HTTP/1.1 request on a new connection (`Host` the address itself, which the admin
/// listener takes writes from without a token).
pub fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> Answer {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {out}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// A fresh directory for one server's files.
pub fn dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// A path inside `dir`.
pub fn path(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}
