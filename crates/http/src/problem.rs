//! The bodies of the responses the engine answers itself, as RFC 9457 problem details: 429 for
//! a denial (with `violated-policies` and `retry_after`), 503 when the store fails and the
//! engine fails closed; refusals write their own ([`Refusal`](crate::Refusal)). None of them
//! carries internals.

use bytes::Bytes;
use http::header::HeaderValue;

/// `application/problem+json`.
pub const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");

/// The problem type of a 429 (the IANA HTTP problem type registry).
pub const QUOTA_EXCEEDED_TYPE: &str =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The title of a 429.
pub const QUOTA_EXCEEDED_TITLE: &str =
    "Request cannot be satisfied as assigned quota has been exceeded";

/// The 429 body: `violated` names the denying policies; `retry_after` is absent when the request
/// can never be admitted (its cost exceeds the quota).
pub(crate) fn quota_exceeded<'a>(
    violated: impl Iterator<Item = &'a str>,
    retry_after: Option<u64>,
) -> Bytes {
    let mut body = String::with_capacity(256);
    body.push_str("{\"type\":\"");
    body.push_str(QUOTA_EXCEEDED_TYPE);
    body.push_str("\",\"title\":\"");
    body.push_str(QUOTA_EXCEEDED_TITLE);
    body.push_str("\",\"status\":429,\"violated-policies\":[");
    for (i, name) in violated.enumerate() {
        if i > 0 {
            body.push(',');
        }
        push_json_string(&mut body, name);
    }
    body.push(']');
    if let Some(secs) = retry_after {
        body.push_str(",\"retry_after\":");
        body.push_str(itoa::Buffer::new().format(secs));
    }
    body.push('}');
    Bytes::from(body)
}

/// The 503 body when the store fails and the engine fails closed.
pub(crate) fn unavailable() -> Bytes {
    Bytes::from_static(
        b"{\"type\":\"about:blank\",\"title\":\"Service Unavailable\",\"status\":503,\
          \"detail\":\"Rate limiting is temporarily unavailable; try again shortly.\"}",
    )
}

pub(crate) fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                out.push_str("\\u00");
                out.push(char::from(
                    b"0123456789abcdef"[(u32::from(c) >> 4) as usize],
                ));
                out.push(char::from(
                    b"0123456789abcdef"[(u32::from(c) & 0xf) as usize],
                ));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_json() {
        let body = quota_exceeded(["per-key", "we\"ird"].into_iter(), Some(23));
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["status"], 429);
        assert_eq!(v["violated-policies"][1], "we\"ird");
        assert_eq!(v["retry_after"], 23);
        let v: serde_json::Value = serde_json::from_slice(&unavailable()).unwrap();
        assert_eq!(v["status"], 503);
    }
}
