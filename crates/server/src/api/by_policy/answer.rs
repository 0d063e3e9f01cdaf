//! A by-policy check's answer, written as JSON straight into a buffer on the stack: the
//! common answer allocates nothing.

use serde_json::Value;
use smallvec::SmallVec;
use tollgate::Decision;

/// The answer's fields.
pub(super) struct Answer<'a> {
    pub(super) action: &'static str,
    pub(super) policy: &'a str,
    /// `None` when the store failed open: admitted, with no quota to report.
    pub(super) decision: Option<&'a Decision>,
    pub(super) cost: u32,
    pub(super) fail_open: bool,
    /// With `"mode": "acquire"`: the lease, or `null` when none was taken.
    pub(super) lease: Option<Option<&'a str>>,
}

impl Answer<'_> {
    /// `{"action":..,"allowed":..,["banned":true,]"delay":..,["detail":..,]"fail_open":..,
    /// ["lease":..,]"limit":..,"policy":..,"remaining":..,"reset":..,"retry_after":..}`.
    pub(super) fn write(&self) -> AnswerBody {
        let mut out = AnswerBody::new();
        let d = self.decision;
        out.extend_from_slice(b"{\"action\":");
        string(&mut out, self.action);
        out.extend_from_slice(b",\"allowed\":");
        out.extend_from_slice(if d.is_none_or(|d| d.allowed) {
            b"true"
        } else {
            b"false"
        });
        // A lockout says so, as a described request's decisions do; its retry_after is when
        // the ban ends.
        if d.is_some_and(|d| d.ban.is_ban()) {
            out.extend_from_slice(b",\"banned\":true");
        }
        out.extend_from_slice(b",\"delay\":");
        // Only a `delay` policy holds a request: under any other action it passes (or not) at
        // once, whatever wait its algorithm computed.
        match d.and_then(|d| d.delay).filter(|_| self.action == "delay") {
            // As the JSON writer formats a float.
            Some(delay) => number(&mut out, &Value::from(delay.as_secs_f64())),
            None => out.extend_from_slice(b"null"),
        }
        if let Some(d) = d
            && !d.allowed
            && d.retry_after.is_none()
        {
            // Never admissible: denied, and no retry_after, which would lie.
            out.extend_from_slice(b",\"detail\":");
            let detail = format!(
                "cost {} exceeds what the quota can ever admit ({})",
                self.cost, d.limit
            );
            string(&mut out, &detail);
        }
        out.extend_from_slice(b",\"fail_open\":");
        out.extend_from_slice(if self.fail_open { b"true" } else { b"false" });
        if let Some(lease) = self.lease {
            out.extend_from_slice(b",\"lease\":");
            match lease {
                Some(l) => string(&mut out, l),
                None => out.extend_from_slice(b"null"),
            }
        }
        out.extend_from_slice(b",\"limit\":");
        int(&mut out, d.map(|d| d.limit));
        out.extend_from_slice(b",\"policy\":");
        string(&mut out, self.policy);
        out.extend_from_slice(b",\"remaining\":");
        int(&mut out, d.map(|d| d.remaining));
        out.extend_from_slice(b",\"reset\":");
        int(&mut out, d.map(|d| ceil_secs(d.reset)));
        out.extend_from_slice(b",\"retry_after\":");
        int(
            &mut out,
            d.and_then(|d| d.retry_after).map(|r| ceil_secs(r).max(1)),
        );
        out.push(b'}');
        out
    }
}

/// An answer's JSON, on the stack unless it is longer than a policy name and a lease make it
/// (about 150 bytes): a check that allocates nothing for its answer.
pub(crate) type AnswerBody = SmallVec<[u8; 256]>;

/// Lets serde_json write into an [`AnswerBody`].
struct Sink<'a>(&'a mut AnswerBody);

impl std::io::Write for Sink<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn string(out: &mut AnswerBody, s: &str) {
    // Writing into memory cannot fail.
    let _ = serde_json::to_writer(Sink(out), s);
}

fn number(out: &mut AnswerBody, v: &Value) {
    let _ = serde_json::to_writer(Sink(out), v);
}

fn int(out: &mut AnswerBody, n: Option<u64>) {
    match n {
        Some(n) => out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes()),
        None => out.extend_from_slice(b"null"),
    }
}

fn ceil_secs(d: std::time::Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}
