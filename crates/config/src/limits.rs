//! What every listener bounds, whatever door it serves.

use std::time::Duration;

/// Bounds every listener applies.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections served at once; further ones wait in the kernel's backlog.
    pub max_connections: usize,
    /// Time a client has to send a request's headers, and the longest a write of an answer may
    /// wait for the client to take its bytes.
    pub header_read_timeout: Duration,
    /// Largest request head (line and headers), in bytes; larger ones get 431.
    pub max_header_bytes: usize,
    /// How long shutdown waits for in-flight requests.
    pub drain: Duration,
    /// How long a proxy connection may sit idle between requests before it is closed.
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 10_000,
            header_read_timeout: Duration::from_secs(10),
            max_header_bytes: 64 * 1024,
            drain: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(75),
        }
    }
}
