//! A `redis-server` of the test's own on a free loopback port, killed when dropped.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// A running `redis-server`.
pub struct Redis {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl Redis {
    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Stops it (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts one once it says it accepts connections, or `None` when `redis-server` cannot be
/// started. A port picked free may be taken again before the server binds it (by another
/// test's server): then the server says so and exits, and another port is tried. (A
/// connection alone could reach the other test's server, which goes away with its test.)
pub fn redis() -> Option<Redis> {
    for _ in 0..5 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let mut child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let mut lines = BufReader::new(child.stdout.take()?).lines();
        let ready = lines
            .by_ref()
            .map_while(Result::ok)
            .any(|line| line.contains("Ready to accept connections"));
        if ready {
            // Its log goes on; read it so that the server never waits on a full pipe.
            std::thread::spawn(move || lines.for_each(drop));
            return Some(Redis { child, port });
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    None
}
