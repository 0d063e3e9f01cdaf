//! JSON lines: one object per line, the request's parts under field names the user maps
//! (`--time-field`, `--method-field`, ...). Time may be RFC 3339, the combined notation, or
//! seconds (or milliseconds) since the epoch as a number or a string.

use std::borrow::Cow;

use serde_json::Value;

use super::time::{from_epoch_number, parse_text};
use super::{Cost, LineError, LoggedRequest, method, split_target, status_code};

/// The JSON field that holds each part of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsonFields {
    /// When (default `time`); required.
    pub time: String,
    /// The method (default `method`); required.
    pub method: String,
    /// The path with its query (default `path`); required.
    pub path: String,
    /// The host (default `host`).
    pub host: String,
    /// The client's address (default `ip`).
    pub ip: String,
    /// The API key (default `api_key`).
    pub api_key: String,
    /// The authenticated user (default `user`).
    pub user: String,
    /// The status the server answered with (default `status`), for `count_status`.
    pub status: String,
    /// What the request cost (default `cost`), for `charge = "response"`: a number, or a
    /// string of digits; anything else is a bad cost, charged the policy's `cost`.
    pub cost: String,
    /// How long the request took, in seconds (default `request_time`): a concurrency limit
    /// holds the request's slot for it.
    pub duration: String,
}

impl Default for JsonFields {
    fn default() -> Self {
        JsonFields {
            time: "time".to_owned(),
            method: "method".to_owned(),
            path: "path".to_owned(),
            host: "host".to_owned(),
            ip: "ip".to_owned(),
            api_key: "api_key".to_owned(),
            user: "user".to_owned(),
            status: "status".to_owned(),
            cost: "cost".to_owned(),
            duration: "request_time".to_owned(),
        }
    }
}

/// Reads JSON lines; the object of the last line is kept for the request borrowed from it.
#[derive(Debug)]
pub(crate) struct Parser {
    fields: JsonFields,
    object: Value,
}

impl Parser {
    pub(crate) fn new(fields: JsonFields) -> Self {
        Parser {
            fields,
            object: Value::Null,
        }
    }

    pub(crate) fn parse<'a>(&'a mut self, line: &[u8]) -> Result<LoggedRequest<'a>, LineError> {
        self.object = serde_json::from_slice(line)
            .map_err(|e| LineError(Cow::Owned(format!("not JSON: {e}"))))?;
        let Value::Object(object) = &self.object else {
            return Err(LineError::new("not a JSON object"));
        };
        let f = &self.fields;
        let text = |name: &str| -> Option<Cow<'a, str>> {
            match object.get(name)? {
                Value::String(s) if !s.is_empty() && s != "-" => Some(Cow::Borrowed(s.as_str())),
                Value::Number(n) => Some(Cow::Owned(n.to_string())),
                _ => None,
            }
        };
        let time = match object.get(&f.time) {
            Some(Value::Number(n)) => n.as_f64().and_then(from_epoch_number),
            Some(Value::String(s)) => parse_text(s),
            _ => return Err(missing(&f.time)),
        }
        .ok_or_else(|| LineError(Cow::Owned(format!("field {:?} is not a time", f.time))))?;
        let method_name = text(&f.method).ok_or_else(|| missing(&f.method))?;
        let method = method(method_name.as_bytes())?;
        let path = text(&f.path).ok_or_else(|| missing(&f.path))?;
        let (target, url_host) = split_target(path)?;
        let ip = match text(&f.ip) {
            Some(s) => Some(s.parse().map_err(|_| {
                LineError(Cow::Owned(format!("field {:?} is not an IP address", f.ip)))
            })?),
            None => None,
        };
        Ok(LoggedRequest {
            time,
            method,
            target,
            host: text(&f.host).or(url_host),
            ip,
            api_key: text(&f.api_key).map(|k| match k {
                Cow::Borrowed(s) => Cow::Borrowed(s.as_bytes()),
                Cow::Owned(s) => Cow::Owned(s.into_bytes()),
            }),
            user: text(&f.user),
            status: text(&f.status).and_then(|s| status_code(s.as_bytes())),
            cost: cost(object.get(&f.cost)),
            took: match text(&f.duration) {
                Some(d) => Some(
                    d.parse::<f64>()
                        .ok()
                        .and_then(|secs| std::time::Duration::try_from_secs_f64(secs).ok())
                        .ok_or_else(|| {
                            LineError(Cow::Owned(format!(
                                "field {:?} is not a duration in seconds",
                                f.duration
                            )))
                        })?,
                ),
                None => None,
            },
        })
    }
}

/// The cost `value` says: none when absent, `null`, `""` or `"-"`; a whole number when a
/// number or a string of digits (`"$upstream_http_x_usage_tokens"`); anything else is bad.
fn cost(value: Option<&Value>) -> Option<Cost> {
    match value? {
        Value::Null => None,
        Value::String(s) if s.is_empty() || s == "-" => None,
        Value::String(s) => Some(Cost::read(s.as_bytes())),
        Value::Number(n) => Some(n.as_u64().map_or(Cost::Bad, Cost::Whole)),
        Value::Bool(_) | Value::Array(_) | Value::Object(_) => Some(Cost::Bad),
    }
}

fn missing(field: &str) -> LineError {
    LineError(Cow::Owned(format!("no field {field:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate::Timestamp;

    #[test]
    fn fields_are_read_under_their_mapped_names() -> Result<(), LineError> {
        let mut p = Parser::new(JsonFields {
            time: "ts".into(),
            ip: "client".into(),
            api_key: "key".into(),
            user: "uid".into(),
            ..JsonFields::default()
        });
        let line = br#"{"ts":"2000-10-10T20:55:36.5Z","method":"POST","path":"/v1/x?y=1","host":"api.example.com","client":"2001:db8::1","key":"k1","uid":42}"#;
        let r = p.parse(line)?;
        assert_eq!(r.time, Timestamp::from_micros(971_211_336_500_000));
        assert_eq!(r.method, http::Method::POST);
        assert_eq!(r.target, "/v1/x?y=1");
        assert_eq!(r.host.as_deref(), Some("api.example.com"));
        assert_eq!(r.ip, "2001:db8::1".parse().ok());
        assert_eq!(r.api_key.as_deref(), Some(&b"k1"[..]));
        assert_eq!(r.user.as_deref(), Some("42"));
        Ok(())
    }

    #[test]
    fn epoch_numbers_and_absent_optionals() -> Result<(), LineError> {
        let mut p = Parser::new(JsonFields::default());
        let r =
            p.parse(br#"{"time":971211336123,"method":"GET","path":"/","api_key":"-","ip":null}"#)?;
        assert_eq!(r.time, Timestamp::from_millis(971_211_336_123));
        assert_eq!((r.api_key, r.ip, r.user), (None, None, None));
        Ok(())
    }

    /// A cost that is not a whole number does not make the line bad: the request is replayed
    /// with a bad cost, as the server hears a response whose cost is bad.
    #[test]
    fn costs_and_statuses_that_say_nothing_are_not_bad_lines() -> Result<(), LineError> {
        let mut p = Parser::new(JsonFields::default());
        let mut read = |extra: &str| {
            let line = format!(r#"{{"time":1,"method":"GET","path":"/"{extra}}}"#);
            p.parse(line.as_bytes()).map(|r| (r.status, r.cost))
        };
        assert_eq!(
            read(r#","status":"401","cost":"12""#)?,
            (Some(401), Some(Cost::Whole(12)))
        );
        assert_eq!(
            read(r#","status":200,"cost":7"#)?,
            (Some(200), Some(Cost::Whole(7)))
        );
        for cost in [
            "12.5", "-3", "-0", "1e3", "\"abc\"", "\"12.5\"", "true", "[1]", "{}",
        ] {
            let got = read(&format!(r#","cost":{cost}"#))?;
            assert_eq!(got, (None, Some(Cost::Bad)), "{cost}");
        }
        for cost in ["null", "\"\"", "\"-\""] {
            assert_eq!(read(&format!(r#","cost":{cost}"#))?, (None, None), "{cost}");
        }
        for status in [
            "0", "\"000\"", "99", "1000", "\"abc\"", "\"-\"", "null", "4.01",
        ] {
            assert_eq!(
                read(&format!(r#","status":{status}"#))?,
                (None, None),
                "{status}"
            );
        }
        Ok(())
    }

    #[test]
    fn bad_objects_say_why() {
        let mut p = Parser::new(JsonFields::default());
        for (line, needle) in [
            (&br#"{"time":1,"method":"GET""#[..], "not JSON"),
            (br#"[1,2]"#, "not a JSON object"),
            (br#"{"method":"GET","path":"/"}"#, "\"time\""),
            (
                br#"{"time":"soon","method":"GET","path":"/"}"#,
                "not a time",
            ),
            (br#"{"time":1,"path":"/"}"#, "\"method\""),
            (br#"{"time":1,"method":"GET"}"#, "\"path\""),
            (
                br#"{"time":1,"method":"GET","path":"/","ip":"nope"}"#,
                "IP address",
            ),
        ] {
            let err = p
                .parse(line)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                err.contains(needle),
                "{}: {err}",
                String::from_utf8_lossy(line)
            );
        }
    }
}
