//! A `redis-server` process of a test's own, on a free loopback port, killed when dropped.
//!
//! A port picked free may be taken again before the server binds it, by another test's
//! server. Ours then says so and exits, while a connection to the port would reach the other
//! server, which goes away with its test. So a server counts as started only once its own log
//! says it accepts connections; when it exits first, another port is tried.

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How many ports are tried before giving up.
const TRIES: usize = 5;

/// A running `redis-server`, killed (and waited for) when dropped.
#[derive(Debug)]
pub struct RedisProcess {
    port: u16,
    child: Child,
}

impl RedisProcess {
    /// A plain server (no persistence) with `extra` options after the defaults, e.g.
    /// `["--requirepass", "x"]`. Panics, saying why, when none can be started.
    pub fn start(extra: &[&str]) -> RedisProcess {
        let args = |port: u16| {
            let mut args = plain_args(port);
            args.extend(extra.iter().map(|a| (*a).to_owned()));
            args
        };
        Self::start_with(args).unwrap_or_else(|why| panic!("{why}"))
    }

    /// A server with the arguments `args` gives for a port: for one that listens on it some
    /// other way, such as `--port 0 --tls-port <port>`. Its log must go to its output (no
    /// `--logfile`), where readiness is read. `Err` holds what the server said when
    /// it exited for another reason than its port being taken, or why it could not start.
    pub fn start_with(args: impl Fn(u16) -> Vec<String>) -> Result<RedisProcess, String> {
        for _ in 0..TRIES {
            let port = free_port()?;
            let mut child = Command::new("redis-server")
                .args(args(port))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| {
                    format!(
                        "cannot start redis-server ({e}): run scripts/test.sh, or \
                         `apt-get install -y redis-server`"
                    )
                })?;
            let Some(stdout) = child.stdout.take() else {
                return Err("redis-server's output could not be read".to_owned());
            };
            match wait_ready(stdout) {
                Ok(()) => return Ok(RedisProcess { port, child }),
                Err(log) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let mut err = String::new();
                    if let Some(mut stderr) = child.stderr.take() {
                        let _ = stderr.read_to_string(&mut err);
                    }
                    let said = format!("{err}{log}");
                    if !said.contains("Address already in use") {
                        return Err(format!("redis-server exited: {said}"));
                    }
                }
            }
        }
        Err(format!("redis-server found no free port in {TRIES} tries"))
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server now (SIGKILL, like a crash) and waits for it to exit.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The options of a server that keeps nothing on disk, listening on `port` on loopback.
pub fn plain_args(port: u16) -> Vec<String> {
    [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .collect()
}

/// A port nobody listens on right now.
fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free loopback port: {e}"))
}

/// Reads the server's log until it says it accepts connections (`Ok`), or until it ends or
/// 10 s pass (`Err` with what it said). The rest of its log is read on a thread, so that the
/// server never waits on a full pipe.
fn wait_ready(stdout: ChildStdout) -> Result<(), String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // Once the test stopped listening, the lines are only drained.
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut said = String::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains("Ready to accept connections") => return Ok(()),
            Ok(line) => {
                said.push_str(&line);
                said.push('\n');
            }
            Err(RecvTimeoutError::Timeout) => {
                return Err(format!("{said}(not ready after 10 s)"));
            }
            Err(RecvTimeoutError::Disconnected) => return Err(said),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::io::{Read, Write};
    use std::net::TcpStream;

    use super::*;

    fn ping(port: u16) -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.write_all(b"PING\r\n").ok()?;
        let mut reply = [0u8; 7];
        s.read_exact(&mut reply).ok()?;
        Some(String::from_utf8_lossy(&reply).into_owned())
    }

    #[test]
    fn a_started_server_answers_until_killed() {
        let mut redis = RedisProcess::start(&[]);
        assert_eq!(ping(redis.port()).as_deref(), Some("+PONG\r\n"));
        assert_eq!(redis.url(), format!("redis://127.0.0.1:{}", redis.port()));
        redis.kill();
        assert_eq!(ping(redis.port()), None);
    }

    /// A server whose port is always taken is never taken for started: each try sees the
    /// server exit, and the last error says so.
    #[test]
    fn a_taken_port_is_not_a_started_server() {
        let other = RedisProcess::start(&[]);
        let taken = other.port();
        let err = RedisProcess::start_with(|_| plain_args(taken)).map(|r| r.port());
        assert_eq!(
            err,
            Err(format!("redis-server found no free port in {TRIES} tries"))
        );
        assert_eq!(ping(taken).as_deref(), Some("+PONG\r\n"));
    }

    #[test]
    fn a_refused_option_is_said() {
        let said = RedisProcess::start_with(|port| {
            let mut args = plain_args(port);
            args.extend(["--no-such-option".to_owned(), "1".to_owned()]);
            args
        })
        .map(|r| r.port());
        assert!(
            said.as_ref().is_err_and(|e| e.contains("no-such-option")),
            "{said:?}"
        );
    }
}
