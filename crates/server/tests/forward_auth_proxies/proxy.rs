//! A real proxy process for a test: its binary found where `scripts/test.sh` installs it, a
//! scratch directory for its files, and a wait, with a bound, until it forwards requests.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hyper::StatusCode;

use super::upstream;

/// Where `scripts/test.sh` puts the pip-installed proxies (Caddy, Traefik).
fn test_tools() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/test-tools/bin")
}

/// The path of `name`: on `PATH`, in `/usr/sbin` (nginx), or in `target/test-tools/bin`.
pub(crate) fn tool(name: &str, install: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), test_tools()])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("{name} is not installed: run scripts/test.sh, which installs it ({install})")
        })
}

/// A loopback port that was free a moment ago.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

/// A running proxy; killed when dropped, its scratch directory removed.
pub(crate) struct Proxy {
    pub(crate) addr: SocketAddr,
    child: Child,
    log: PathBuf,
    /// Removed when the proxy is dropped.
    _dir: tempfile::TempDir,
}

impl Proxy {
    /// Starts `command` (output to `proxy.log` in `dir`) and waits until a request for a
    /// path that no policy matches comes back from the application through it.
    pub(crate) async fn start(
        name: &str,
        mut command: Command,
        dir: tempfile::TempDir,
        port: u16,
    ) -> Proxy {
        let log = dir.path().join("proxy.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = command
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let mut proxy = Proxy {
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            child,
            log,
            _dir: dir,
        };
        proxy.wait_ready(name).await;
        proxy
    }

    /// Polls until the proxy forwards a request (Traefik loads its routes and compiles its
    /// plugin after it starts listening), for at most a minute.
    async fn wait_ready(&mut self, name: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = None;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{name} exited ({status}):\n{}", self.log_text());
            }
            let probe =
                tokio::time::timeout(Duration::from_secs(2), try_get(self.addr, "/ready-probe"))
                    .await;
            if let Ok(Some(StatusCode::OK)) = probe {
                return;
            }
            last = probe.ok().flatten().or(last);
            assert!(
                Instant::now() < deadline,
                "{name} did not forward a request within a minute (last answer: {last:?}):\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The status of `GET target`, or `None` if the proxy does not answer yet.
async fn try_get(addr: SocketAddr, target: &str) -> Option<StatusCode> {
    let from = IpAddr::V4(Ipv4Addr::LOCALHOST);
    upstream::try_send(addr, from, "GET", target, &[])
        .await
        .ok()
        .map(|r| r.status)
}

/// Writes `text` to `path` under `dir`, creating its folders.
pub(crate) fn write(dir: &Path, path: &str, text: &str) {
    let path = dir.join(path);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&path, text).unwrap();
}
