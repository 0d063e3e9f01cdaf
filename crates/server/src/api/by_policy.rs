//! `POST /v1/check` by policy and key: `{"policy": "api", "key": "customer-42", "cost": 1,
//! "mode": "check"}`, the call other services make on every request they serve.
//!
//! What it costs is what a decision costs them, so the common body is read field by field into
//! borrowed text (no JSON tree, no copy of an unescaped string) and the answer is written
//! straight into its buffer, in the same bytes the general JSON writer gave: keys in
//! alphabetical order, `null` where there is no value.

use std::borrow::Cow;

use bytes::Bytes;
use hyper::{Response, StatusCode};
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;
use tollgate::AlgorithmKind;
use tollgate_http::{RateLimitHeaders, Refusal};

use crate::config::{Action, PolicyConfig};
use crate::generation::{Disposition, Generation};
use crate::response::{Body, full, json_bytes_response, problem, problem_response};
use crate::serve::quick;
use crate::telemetry::Trace;
use answer::Answer;
pub(crate) use answer::AnswerBody;

mod answer;

/// What a by-policy check asks, each field as sent (checked in [`check`]).
pub(super) struct Asked<'a> {
    policy: Field<'a>,
    key: Field<'a>,
    cost: Field<'a>,
    mode: Field<'a>,
}

/// A field's value: absent (or `null`), a string, or anything else (its JSON text).
enum Field<'a> {
    Absent,
    Text(Cow<'a, str>),
    Number(u64),
    Other,
}

/// The body's fields the quick reading looks at. A body with any other member goes the general
/// way, which looks inside every member (a member given twice at any depth is refused there):
/// skipped unread here, it could hide one.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Probe<'a> {
    #[serde(borrow)]
    policy: Option<&'a RawValue>,
    #[serde(borrow)]
    key: Option<&'a RawValue>,
    #[serde(borrow)]
    cost: Option<&'a RawValue>,
    #[serde(borrow)]
    mode: Option<&'a RawValue>,
}

impl<'a> Field<'a> {
    fn raw(value: Option<&'a RawValue>) -> Self {
        let Some(raw) = value else {
            return Field::Absent;
        };
        let text = raw.get();
        if text == "null" {
            return Field::Absent;
        }
        if let Some(inner) = text.strip_prefix('"') {
            // Borrowed unless it holds escapes: the raw value is valid JSON, so a string
            // without a backslash is its text between the quotes. (serde's `Cow<str>` would be
            // a copy every time: it borrows only as a struct's field.)
            if !inner.contains('\\') {
                return inner
                    .strip_suffix('"')
                    .map_or(Field::Other, |t| Field::Text(Cow::Borrowed(t)));
            }
            return serde_json::from_str::<String>(text)
                .map(|t| Field::Text(Cow::Owned(t)))
                .unwrap_or(Field::Other);
        }
        text.parse::<u64>()
            .map(Field::Number)
            .unwrap_or(Field::Other)
    }

    fn value(value: Option<&'a Value>) -> Self {
        match value {
            None | Some(Value::Null) => Field::Absent,
            Some(Value::String(s)) => Field::Text(Cow::Borrowed(s)),
            Some(v) => v.as_u64().map_or(Field::Other, Field::Number),
        }
    }

    fn text(&self) -> Option<&str> {
        match self {
            Field::Text(t) => Some(t),
            _ => None,
        }
    }
}

impl<'a> Asked<'a> {
    /// The body read quickly, when it is a JSON object naming a policy (not `null`), whose
    /// fields are each given once; `None` sends it the general way.
    pub(super) fn read(body: &'a [u8]) -> Option<Self> {
        // JSON is UTF-8 text: a body that is not goes the general way, whose parse refuses it
        // (skipping an unknown member, this one would not look inside it).
        std::str::from_utf8(body).ok()?;
        // An object only: serde would also read the fields from an array, in order.
        if body.trim_ascii_start().first() != Some(&b'{') {
            return None;
        }
        let probe: Probe<'a> = serde_json::from_slice(body).ok()?;
        let policy = Field::raw(probe.policy);
        if matches!(policy, Field::Absent) {
            return None;
        }
        Some(Asked {
            policy,
            key: Field::raw(probe.key),
            cost: Field::raw(probe.cost),
            mode: Field::raw(probe.mode),
        })
    }

    /// The same fields from a body read the general way.
    pub(super) fn from_map(obj: &'a serde_json::Map<String, Value>) -> Self {
        Asked {
            policy: Field::value(obj.get("policy")),
            key: Field::value(obj.get("key")),
            cost: Field::value(obj.get("cost")),
            mode: Field::value(obj.get("mode")),
        }
    }
}

/// What a `/v1/check` by policy asks for (`"mode"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Decide, and count when admitted (the default).
    Check,
    /// Charge the cost whatever the quota says, never deny.
    Report,
    /// Take a concurrency slot, answered with a lease to give it back with.
    Acquire,
}

impl Mode {
    fn read(field: &Field<'_>) -> Result<Self, Refusal> {
        match field {
            Field::Absent => Ok(Mode::Check),
            Field::Text(m) if m == "check" => Ok(Mode::Check),
            Field::Text(m) if m == "report" => Ok(Mode::Report),
            Field::Text(m) if m == "acquire" => Ok(Mode::Acquire),
            _ => Err(Refusal::bad_field(
                "\"mode\"",
                "must be \"check\" (the default), \"report\" (charge the cost, never deny) or \
                 \"acquire\" (take a concurrency slot, answered with a lease)",
            )),
        }
    }

    /// Whether the mode means anything for `policy`: a concurrency limit is asked with
    /// `acquire` only (a slot taken by a plain check could never be given back), and only a
    /// concurrency limit has slots to acquire.
    fn fits(self, policy: &PolicyConfig) -> Result<(), Refusal> {
        let concurrent = policy.policy.quota().kind() == AlgorithmKind::Concurrency;
        let name = policy.name();
        match (self, concurrent) {
            (Mode::Acquire, false) => Err(Refusal::bad_field(
                "\"mode\"",
                format!(
                    "\"acquire\" takes a concurrency slot, and policy {name:?} is a {}, which has none; use \"check\"",
                    policy.policy.quota().kind().as_str()
                ),
            )),
            (Mode::Check | Mode::Report, true) => Err(Refusal::bad_field(
                "\"mode\"",
                format!(
                    "must be \"acquire\" for policy {name:?}, which limits requests in flight: it answers a lease, and POST /v1/release {{\"lease\": \"...\"}} gives the slot back"
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// Decides a by-policy check and answers it: the decision as JSON with the rate-limit headers,
/// 200 or 429; 400 naming what cannot be read; 404 for a policy not configured.
pub(super) async fn check(engine: &Generation, asked: Asked<'_>, trace: Trace<'_>) -> Checked {
    let refused = |field: &'static str, reason: &'static str| {
        Checked::Other(problem_response(&Refusal::bad_field(field, reason)))
    };
    let Some(name) = asked.policy.text() else {
        return refused("\"policy\"", "must be a string");
    };
    let Some(key) = asked.key.text() else {
        return refused("\"key\"", "is required and must be a string");
    };
    let cost = match asked.cost {
        Field::Absent => 1,
        Field::Number(c) => match u32::try_from(c) {
            Ok(c) => c,
            Err(_) => return refused("\"cost\"", COST),
        },
        _ => return refused("\"cost\"", COST),
    };
    let mode = match Mode::read(&asked.mode) {
        Ok(m) => m,
        Err(refusal) => return Checked::Other(problem_response(&refusal)),
    };
    let Some(pc) = engine.policy(name) else {
        return Checked::Other(unknown_policy(engine, name));
    };
    if let Err(refusal) = mode.fits(pc) {
        return Checked::Other(problem_response(&refusal));
    }
    if mode == Mode::Acquire && cost != 1 {
        // A slot is one request: a cost of 0 would be answered as an admission that holds
        // nothing, and its lease would give back nothing.
        return refused(
            "\"cost\"",
            "of an acquire is 1 (absent or 1): a request holds one slot",
        );
    }
    let decided = if mode == Mode::Report {
        engine.report_key(name, key.as_bytes(), cost, trace).await
    } else {
        engine.check_key(name, key.as_bytes(), cost, trace).await
    };
    let Some(mut eval) = decided else {
        return Checked::Other(unknown_policy(engine, name));
    };
    let shadow = pc.action == Action::Shadow;
    let fail_open = eval.store_failed() && eval.allowed();
    let lease = eval.take_settle().and_then(|mut s| s.lease());
    let (decisions, headers, disposition) = eval.into_parts();
    match disposition {
        // Refused before any count, or the store failed closed: the engine's own answer.
        Disposition::Respond(a) if a.status() != StatusCode::TOO_MANY_REQUESTS => {
            return Checked::Other(a.into_response().map(full));
        }
        // The caller holds the request; keep its slot rather than give it back.
        Disposition::Hold(hold) => drop(tokio::spawn(hold.wait())),
        _ => {}
    }
    let decision = decisions.as_slice().first();
    let answer = Answer {
        action: pc.action.as_str(),
        policy: pc.name(),
        decision,
        cost,
        fail_open,
        lease: (mode == Mode::Acquire).then_some(lease.as_deref()),
    };
    let status = if decisions.allowed() || shadow {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    Checked::Decided {
        status,
        headers: (!shadow).then_some(headers),
        body: answer.write(),
    }
}

/// A by-policy check's answer.
// The decided answer is the common one, and its body is inline on purpose: boxing it would be
// the allocation per check that the inline body avoids.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Checked {
    /// Decided: the decision as JSON, with the rate-limit headers (none for a shadow policy).
    Decided {
        status: StatusCode,
        headers: Option<RateLimitHeaders>,
        body: AnswerBody,
    },
    /// Anything else: a refusal of the request, or the engine's own answer.
    Other(Response<Body>),
}

impl Checked {
    pub(crate) fn into_response(self) -> Response<Body> {
        match self {
            Checked::Decided {
                status,
                headers,
                body,
            } => {
                let mut res = json_bytes_response(status, Bytes::copy_from_slice(&body));
                if let Some(headers) = headers {
                    headers.apply(res.headers_mut());
                }
                res
            }
            Checked::Other(res) => res,
        }
    }

    /// Appends the answer as HTTP/1.1 to `out`, in the bytes hyper writes for
    /// [`into_response`](Self::into_response), but with no header map built on the way;
    /// `false` for a body that cannot be written at once (never one of the API's).
    pub(crate) fn write_http1(self, out: &mut Vec<u8>) -> bool {
        match self {
            Checked::Decided {
                status,
                headers,
                body,
            } => {
                quick::status_line(status, out);
                out.extend_from_slice(b"content-type: application/json\r\n");
                if let Some(headers) = headers {
                    headers.write(out);
                }
                quick::finish(&body, out);
                true
            }
            Checked::Other(res) => quick::write_response(res, out),
        }
    }
}

const COST: &str = "must be a whole number from 0 to 4294967295";

fn unknown_policy(engine: &Generation, name: &str) -> Response<Body> {
    let known: Vec<&str> = engine.config().policies.iter().map(|p| p.name()).collect();
    problem(
        StatusCode::NOT_FOUND,
        "Unknown policy",
        Some(&format!(
            "no policy named {:?}; configured: {}",
            name.chars().take(128).collect::<String>(),
            known.join(", ")
        )),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fields(body: &str) -> (Option<String>, Option<String>) {
        let asked = Asked::read(body.as_bytes()).expect("a body by policy");
        (
            asked.policy.text().map(str::to_owned),
            asked.key.text().map(str::to_owned),
        )
    }

    #[test]
    fn a_plain_string_is_borrowed_from_the_body() {
        let body = br#"{"policy":"api","key":"customer-42"}"#;
        let asked = Asked::read(body).expect("a body by policy");
        assert!(matches!(
            asked.key,
            Field::Text(Cow::Borrowed("customer-42"))
        ));
        assert!(matches!(asked.policy, Field::Text(Cow::Borrowed("api"))));
    }

    #[test]
    fn an_escaped_string_is_read_as_json_means_it() {
        assert_eq!(
            fields(r#"{"policy":"api","key":"a\u0062c \"q\" \\ \n"}"#),
            (Some("api".into()), Some("abc \"q\" \\ \n".into()))
        );
        assert_eq!(
            fields(r#"{"policy":"api","key":""}"#).1.as_deref(),
            Some("")
        );
    }

    /// Bytes JSON does not allow in a string (a raw control character, invalid UTF-8, a lone
    /// surrogate) are never taken as a key: the quick reading refuses them, as the general one
    /// does, so the request is answered 400.
    #[test]
    fn a_string_json_forbids_is_no_key() {
        let bodies: [&[u8]; 3] = [
            b"{\"policy\":\"api\",\"key\":\"a\x01b\"}",
            b"{\"policy\":\"api\",\"key\":\"a\xffb\"}",
            br#"{"policy":"api","key":"\ud800"}"#,
        ];
        for body in bodies {
            let quick = Asked::read(body);
            assert!(quick.is_none_or(|a| a.key.text().is_none()), "{body:?}");
            assert!(serde_json::from_slice::<Value>(body).is_err(), "{body:?}");
        }
    }

    proptest! {
        /// The quick reading and the general one (a JSON tree) agree on every string.
        #[test]
        fn the_quick_reading_agrees_with_the_json_tree(policy in any::<String>(), key in any::<String>()) {
            let body = serde_json::json!({"policy": policy, "key": key, "cost": 2}).to_string();
            let tree: Value = serde_json::from_str(&body).unwrap();
            let general = Asked::from_map(tree.as_object().unwrap());
            let quick = Asked::read(body.as_bytes()).unwrap();
            prop_assert_eq!(quick.policy.text(), general.policy.text());
            prop_assert_eq!(quick.key.text(), general.key.text());
            prop_assert_eq!(quick.key.text(), Some(key.as_str()));
        }
    }
}
