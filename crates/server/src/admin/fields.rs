//! The admin API's readings of its inputs, shared by its endpoints: path segments and query
//! values decoded, expiries read and rounded, times written as RFC 3339, and the 400 that
//! names the field at fault.

use std::time::Duration;

use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use percent_encoding::percent_decode_str;
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tollgate::parse_duration;

use crate::api::unique::repeated_member;
use crate::response::{Body, full, read_body};

/// The largest admin request body, in bytes.
const MAX_BODY: usize = 16 * 1024;

/// The longest path segment (a policy name, a key, a list entry), in bytes.
const MAX_SEGMENT: usize = 512;

/// Input refused: the field at fault and why.
#[derive(Debug)]
pub(crate) struct BadField {
    field: String,
    detail: String,
}

impl BadField {
    pub(crate) fn new(field: &str, detail: impl Into<String>) -> Self {
        BadField {
            field: field.to_owned(),
            detail: detail.into(),
        }
    }

    pub(crate) fn response(&self) -> Response<Body> {
        bad_field(&self.field, &self.detail)
    }
}

/// An admin request's body as a JSON object; `None` for an empty (or all-blank) body. Read as
/// the decision API reads its bodies ([`read_body`]): within the listener's
/// `header_read_timeout` (408 after it, so a stalled body cannot hold a connection), at most
/// 16 KiB (413, refused on an announced length before any is read). A member named twice is
/// refused, as everywhere: the audit log would name one value and the store keep another.
/// `example` shows the object expected.
pub(crate) async fn json_object<B>(
    req: hyper::Request<B>,
    within: Duration,
    example: &str,
) -> Result<Option<serde_json::Map<String, Value>>, Response<Body>>
where
    B: hyper::body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let body = read_body(req, MAX_BODY, within).await?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    if let Some(reason) = repeated_member(&body) {
        return Err(bad_field("body", &reason));
    }
    match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Object(o)) => Ok(Some(o)),
        Ok(_) => Err(bad_field(
            "body",
            &format!("expected a JSON object like {example}"),
        )),
        Err(e) => Err(bad_field("body", &format!("malformed JSON: {e}"))),
    }
}

/// A 400 naming the field at fault, as RFC 9457 allows: an extension member `field`.
pub(crate) fn bad_field(field: &str, detail: &str) -> Response<Body> {
    let body = json!({
        "type": "about:blank",
        "title": "Bad Request",
        "status": 400,
        "detail": format!("{field}: {detail}"),
        "field": field,
    });
    let mut res = Response::new(full(body.to_string()));
    *res.status_mut() = StatusCode::BAD_REQUEST;
    res.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    res
}

/// An RFC 3339 time (UTC) of Unix seconds, in JSON (`null` past the year 9999).
pub(crate) fn rfc3339(unix_secs: u64) -> Value {
    i64::try_from(unix_secs)
        .ok()
        .and_then(rfc3339_text)
        .map_or(Value::Null, Value::from)
}

/// An RFC 3339 time (UTC) of Unix seconds; `None` out of the calendar's range.
pub(crate) fn rfc3339_text(unix_secs: i64) -> Option<String> {
    OffsetDateTime::from_unix_timestamp(unix_secs)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
}

/// Unix microseconds as RFC 3339 to the millisecond (`2026-12-05T00:02:03.481Z`): a ban's start
/// and end, shown as they are (whole seconds, one rounded down and the other up, made a
/// three-second ban look four seconds long).
pub(crate) fn rfc3339_millis(unix_micros: u64) -> Value {
    let ms = i128::from(unix_micros / 1_000);
    OffsetDateTime::from_unix_timestamp_nanos(ms * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .map_or(Value::Null, Value::from)
}

/// A path segment, percent-decoded; it must be UTF-8 without control characters.
pub(crate) fn decode(field: &str, raw: &str) -> Result<String, BadField> {
    let text = percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| BadField::new(field, "must be UTF-8 once percent-decoded"))?;
    if text.is_empty() || text.len() > MAX_SEGMENT {
        return Err(BadField::new(field, "must be 1 to 512 bytes long"));
    }
    if text.chars().any(char::is_control) {
        return Err(BadField::new(field, "must not contain control characters"));
    }
    Ok(text.into_owned())
}

/// The value of `name` in a query string, decoded (`+` is a space).
pub(crate) fn form_urlencoded_value(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then(|| {
            percent_decode_str(&v.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

/// Unix seconds of `text`, an RFC 3339 time or a duration from `now` (the time since the
/// epoch, to the nanosecond), rounded up to the second: what is kept is whole seconds, and an
/// entry must never end before the time asked. In the future, and at most the last second an
/// RFC 3339 time can write (9999-12-31T23:59:59Z), so that it can be shown.
pub(crate) fn expiry(text: &str, now: Duration) -> Result<u64, BadField> {
    let exact = match OffsetDateTime::parse(text.trim(), &Rfc3339) {
        // Before 1970: in the past.
        Ok(t) => u64::try_from(t.unix_timestamp())
            .map_or(Duration::ZERO, |secs| Duration::new(secs, t.nanosecond())),
        Err(_) => match parse_duration(text) {
            Ok(d) if d.is_zero() => return Err(BadField::new("expires", "is not in the future")),
            Ok(d) => now.saturating_add(d),
            Err(_) => {
                return Err(BadField::new(
                    "expires",
                    "write an RFC 3339 time like \"2030-01-01T00:00:00Z\", or a duration from \
                     now like \"2h\"",
                ));
            }
        },
    };
    if exact <= now {
        return Err(BadField::new("expires", "is not in the future"));
    }
    let whole = exact.as_secs();
    let whole = if exact.subsec_nanos() > 0 {
        whole.saturating_add(1)
    } else {
        whole
    };
    if i64::try_from(whole).ok().and_then(rfc3339_text).is_none() {
        return Err(BadField::new(
            "expires",
            "is too far in the future: at most 9999-12-31T23:59:59Z (leave it out for an \
             entry that never expires)",
        ));
    }
    Ok(whole)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_900_000_000;

    /// Expiries are kept to the second, rounded up: an entry or override never ends before the
    /// time asked (a cut fraction made "3s" last 2.3 s).
    #[test]
    fn expiries_round_up_to_the_second() {
        let now = Duration::from_secs(NOW) + Duration::from_millis(704);
        assert_eq!(expiry("3s", now).ok(), Some(NOW + 4));
        assert_eq!(expiry("1s", now).ok(), Some(NOW + 2));
        assert_eq!(
            expiry("0s", now).map_err(|b| b.field),
            Err("expires".to_owned())
        );
        // An RFC 3339 time: a fraction rounds up, a whole second stays.
        let at = |text: &str| expiry(text, Duration::from_secs(NOW)).ok();
        assert_eq!(at("2030-03-17T17:46:40.800Z"), Some(1_900_000_001));
        assert_eq!(at("2030-03-17T17:46:41Z"), Some(1_900_000_001));
        // Exactly now is not in the future.
        assert!(at("2030-03-17T17:46:40Z").is_none());
    }

    #[test]
    fn path_segments_are_percent_decoded() {
        assert_eq!(
            decode("key", "ip%3A2001%3Adb8%3A%3A%2F64").ok().as_deref(),
            Some("ip:2001:db8::/64")
        );
        assert!(decode("key", "%FF").is_err());
        assert!(decode("key", "a%0Ab").is_err());
        assert!(decode("key", "").is_err());
        assert_eq!(
            form_urlencoded_value("a=1&reason=all+done%21", "reason").as_deref(),
            Some("all done!")
        );
    }
}
