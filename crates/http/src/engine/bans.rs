//! The answer to a banned client (see [`tollgate::Ban`]): a 429 like any denial, with
//! `Retry-After` until the ban ends, and a problem that says it is a ban, which policy, and when
//! it ends.

use bytes::Bytes;
use tollgate::Timestamp;

use crate::problem::push_json_string;

/// The problem title of a ban.
pub const BANNED_TITLE: &str = "Banned";

/// The 429 body of a request refused by the bans of `policies`, the last ending at `until`
/// (`retry_after` seconds from now).
pub(crate) fn banned_body(policies: &[&str], until: Timestamp, retry_after: Option<u64>) -> Bytes {
    let mut body = String::with_capacity(256);
    body.push_str("{\"type\":\"about:blank\",\"title\":\"");
    body.push_str(BANNED_TITLE);
    body.push_str("\",\"status\":429,\"detail\":");
    let mut detail = String::from("Too many denied requests: policy ");
    for (i, name) in policies.iter().enumerate() {
        if i > 0 {
            detail.push_str(" and ");
        }
        detail.push_str(&serde_json::Value::from(*name).to_string());
    }
    detail.push_str(" refuses this client until ");
    let until_text = rfc3339(until);
    detail.push_str(&until_text);
    detail.push('.');
    push_json_string(&mut body, &detail);
    body.push_str(",\"violated-policies\":[");
    for (i, name) in policies.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        push_json_string(&mut body, name);
    }
    body.push_str("],\"banned_until\":");
    push_json_string(&mut body, &until_text);
    if let Some(secs) = retry_after {
        body.push_str(",\"retry_after\":");
        body.push_str(itoa::Buffer::new().format(secs));
    }
    body.push('}');
    Bytes::from(body)
}

/// `t` in RFC 3339, UTC, to the second (rounded up: the ban is over by then).
pub(crate) fn rfc3339(t: Timestamp) -> String {
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
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
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
