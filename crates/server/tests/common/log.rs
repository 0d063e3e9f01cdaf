//! The server's log lines, captured for a test that asserts on them.

use std::future::Future;
use std::io::Write;
use std::sync::{Arc, Mutex};

/// A writer the log lines go to, shared with the test.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Everything logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// The log lines containing `text`.
    pub fn count(&self, text: &str) -> usize {
        self.text().lines().filter(|l| l.contains(text)).count()
    }
}

/// Runs `test` on one thread with its log lines captured (the server's tasks run where this
/// subscriber is the default).
pub fn with_log<F: Future<Output = ()>>(test: impl FnOnce(Captured) -> F) {
    let captured = Captured::default();
    let sink = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .finish();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(subscriber, || rt.block_on(test(captured)));
}
