//! A request refused before any policy counts it, answered the same way at every door: a
//! status, a title, the field at fault as that door names it, and why, as an RFC 9457 problem.
//!
//! The doors read requests in different shapes (a socket, `X-Forwarded-*` headers, a JSON
//! description, a log line), but what they cannot read they refuse alike: a request the limiter
//! could read one way and the upstream another is never counted under a guess.

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;
use http::StatusCode;

use crate::problem::push_json_string;

/// Why a request is answered before any policy counts it (400, 401, 414, 431...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    status: StatusCode,
    title: &'static str,
    field: Option<Cow<'static, str>>,
    detail: Cow<'static, str>,
}

impl Refusal {
    /// A refusal with `status`, `title` and `detail` that names no field (a framing error).
    pub const fn new(status: StatusCode, title: &'static str, detail: &'static str) -> Self {
        Refusal {
            status,
            title,
            field: None,
            detail: Cow::Borrowed(detail),
        }
    }

    /// A 400 for `field` (as the door names it: `X-Forwarded-Host`, `"path"`, `Host`), which
    /// `reason` completes: "`field` `reason`".
    pub fn bad_field(
        field: impl Into<Cow<'static, str>>,
        reason: impl Into<Cow<'static, str>>,
    ) -> Self {
        let field = field.into();
        let reason = reason.into();
        Refusal {
            status: StatusCode::BAD_REQUEST,
            title: "Bad Request",
            detail: Cow::Owned(format!("{field} {reason}")),
            field: Some(field),
        }
    }

    /// The same refusal, naming `field` as the door calls it.
    pub fn with_field(mut self, field: impl Into<Cow<'static, str>>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// The same refusal with another detail.
    pub fn with_detail(mut self, detail: impl Into<Cow<'static, str>>) -> Self {
        self.detail = detail.into();
        self
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The problem's title.
    pub fn title(&self) -> &str {
        self.title
    }

    /// The field at fault, when one is.
    pub fn field(&self) -> Option<&str> {
        self.field.as_deref()
    }

    /// What is wrong, and what to send instead.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// The `application/problem+json` body: `type`, `title`, `status`, `detail`, and `field`
    /// when one is at fault.
    pub fn body(&self) -> Bytes {
        let mut body = String::with_capacity(128 + self.detail.len());
        body.push_str("{\"type\":\"about:blank\",\"title\":");
        push_json_string(&mut body, self.title);
        body.push_str(",\"status\":");
        body.push_str(itoa::Buffer::new().format(self.status.as_u16()));
        body.push_str(",\"detail\":");
        push_json_string(&mut body, &self.detail);
        if let Some(field) = &self.field {
            body.push_str(",\"field\":");
            push_json_string(&mut body, field);
        }
        body.push('}');
        Bytes::from(body)
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.title,
            self.detail
        )
    }
}

impl std::error::Error for Refusal {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_name_the_field() {
        let r = Refusal::bad_field("X-Forwarded-Host", "must be a host \"name\"");
        let v: serde_json::Value = serde_json::from_slice(&r.body()).unwrap();
        assert_eq!(v["status"], 400);
        assert_eq!(v["field"], "X-Forwarded-Host");
        assert_eq!(v["detail"], "X-Forwarded-Host must be a host \"name\"");
        let r = Refusal::new(StatusCode::URI_TOO_LONG, "URI Too Long", "too deep");
        let v: serde_json::Value = serde_json::from_slice(&r.body()).unwrap();
        assert_eq!((v["status"].as_u64(), v.get("field")), (Some(414), None));
    }
}
