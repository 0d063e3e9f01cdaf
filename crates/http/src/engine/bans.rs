//! The answer to a banned client (see [`tollgate::Ban`]): a 429 like any denial, with
//! `Retry-After` until the ban ends, and a problem that says it is a ban, which policy, and when
//! it ends.

use bytes::Bytes;
use tollgate::Timestamp;

use crate::problem::push_json_string;

/// The problem title of a ban.
pub const BANNED_TITLE: &str = "Banned";

/// The 429 body of a request refused by the bans of `policies`, the last ending at `until`
/// (`retry_after` seconds from now). Written straight into one buffer: a banned client may send
/// many requests, and each is answered this way.
pub(crate) fn banned_body(policies: &[&str], until: Timestamp, retry_after: Option<u64>) -> Bytes {
    let mut until_text = [0u8; 20];
    let until_text = rfc3339_into(until, &mut until_text);
    let mut body = String::with_capacity(256);
    body.push_str("{\"type\":\"about:blank\",\"title\":\"");
    body.push_str(BANNED_TITLE);
    body.push_str("\",\"status\":429,\"detail\":\"Too many denied requests: policy ");
    for (i, name) in policies.iter().enumerate() {
        if i > 0 {
            body.push_str(" and ");
        }
        body.push_str("\\\"");
        push_escaped(&mut body, name);
        body.push_str("\\\"");
    }
    body.push_str(" refuses this client until ");
    body.push_str(until_text);
    body.push_str(".\",\"violated-policies\":[");
    for (i, name) in policies.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        push_json_string(&mut body, name);
    }
    body.push_str("],\"banned_until\":\"");
    body.push_str(until_text);
    body.push('"');
    if let Some(secs) = retry_after {
        body.push_str(",\"retry_after\":");
        body.push_str(itoa::Buffer::new().format(secs));
    }
    body.push('}');
    Bytes::from(body)
}

/// `s` inside a JSON string: as it is when it needs no escape (policy names usually do not).
fn push_escaped(out: &mut String, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push_str(s);
        return;
    }
    let mut quoted = String::with_capacity(s.len() + 8);
    push_json_string(&mut quoted, s);
    out.push_str(&quoted[1..quoted.len() - 1]);
}

/// `t` in RFC 3339, UTC, to the second (rounded up: the ban is over by then).
#[cfg(test)]
fn rfc3339(t: Timestamp) -> String {
    let mut buf = [0u8; 20];
    rfc3339_into(t, &mut buf).to_owned()
}

/// `t` in RFC 3339, UTC, to the second (rounded up: the ban is over by then), written into
/// `buf` without the formatting machinery.
fn rfc3339_into(t: Timestamp, buf: &mut [u8; 20]) -> &str {
    let secs = t.as_micros().div_ceil(1_000_000);
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2);
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = (yoe + era * 400 + i64::from(month <= 2)).clamp(0, 9999);
    let digits = |buf: &mut [u8; 20], at: usize, width: usize, mut v: u64| {
        for i in (0..width).rev() {
            buf[at + i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    let field = |v: i64| u64::try_from(v).unwrap_or(0);
    digits(buf, 0, 4, field(year));
    buf[4] = b'-';
    digits(buf, 5, 2, field(month));
    buf[7] = b'-';
    digits(buf, 8, 2, field(day));
    buf[10] = b'T';
    digits(buf, 11, 2, rem / 3600);
    buf[13] = b':';
    digits(buf, 14, 2, rem % 3600 / 60);
    buf[16] = b':';
    digits(buf, 17, 2, rem % 60);
    buf[19] = b'Z';
    std::str::from_utf8(&buf[..]).unwrap_or("1970-01-01T00:00:00Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_is_utc_to_the_second() {
        assert_eq!(rfc3339(Timestamp::EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(Timestamp::from_secs(1_800_057_600)),
            "2027-01-16T00:00:00Z"
        );
        assert_eq!(
            rfc3339(Timestamp::from_micros(951_782_400_000_001)),
            "2000-02-29T00:00:01Z"
        );
    }

    #[test]
    fn the_body_says_it_is_a_ban() {
        let body = banned_body(&["login"], Timestamp::from_secs(60), Some(60));
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        assert_eq!(v["title"], "Banned");
        assert_eq!(v["status"], 429);
        assert_eq!(v["banned_until"], "1970-01-01T00:01:00Z");
        assert!(
            v["detail"]
                .as_str()
                .is_some_and(|d| d.contains("\"login\""))
        );
    }
}
