//! The dashboard at `/` on the admin listener: one page, its script and its style sheet,
//! compiled into the binary (no CDN: it works offline and behind any firewall). The page polls
//! `/v1/stats`, `/v1/top`, `/v1/overrides` and `/v1/policies`; it holds no data itself, so it
//! is served without the admin token, which it asks for and sends with its own requests.

use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderName, HeaderValue};
use hyper::{Response, StatusCode};

use crate::response::{Body, full};

const INDEX: &str = include_str!("dashboard/index.html");
const SCRIPT: &str = include_str!("dashboard/dashboard.js");
const STYLE: &str = include_str!("dashboard/dashboard.css");

/// Only the page's own files, no inline script or style: injected markup could not run.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                      connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
                      form-action 'none'; frame-ancestors 'none'";

/// The response for `path` when it is one of the dashboard's files.
pub(super) fn asset(path: &str) -> Option<Response<Body>> {
    let (body, kind) = match path {
        "/" | "/index.html" => (INDEX, "text/html; charset=utf-8"),
        "/dashboard.js" => (SCRIPT, "text/javascript; charset=utf-8"),
        "/dashboard.css" => (STYLE, "text/css; charset=utf-8"),
        _ => return None,
    };
    let mut res = Response::new(full(body));
    *res.status_mut() = StatusCode::OK;
    let headers = res.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        HeaderName::from_static("content-security-policy"),
        HeaderValue::from_static(POLICY),
    );
    headers.insert(
        HeaderName::from_static("x-content-type-options"),
        HeaderValue::from_static("nosniff"),
    );
    Some(res)
}
