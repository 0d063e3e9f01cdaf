//! The doors that decide a request they only hear described (`/v1/forward-auth`, and
//! `POST /v1/check` by request attributes) answer before the upstream does and never learn the
//! response's status, so they cannot decide a policy that counts requests by it
//! (`count_status`). They refuse such a request loudly, with the same 500, rather than count it:
//! counting every request would lock out the users the policy is meant to spare (every correct
//! login, for a failed-login policy).
//!
//! A policy that charges by the response's usage (`charge = "response"`) is another matter: it
//! is decided by admission's charge, and the application reports the rest with `/v1/check` in
//! `"mode": "report"`.

use std::sync::atomic::{AtomicBool, Ordering};

use hyper::{Response, StatusCode};
use tollgate_http::Prepared;

use crate::generation::Generation;
use crate::response::{Body, problem};

/// The first matching policy that counts a request by its response's status.
pub(super) fn counted_by_status<'g>(
    engine: &'g Generation,
    prepared: &Prepared,
) -> Option<&'g str> {
    prepared.keys().find_map(|(index, _)| {
        engine
            .http()
            .policies()
            .nth(index)
            .filter(|p| p.count_status.is_some())
            .map(|p| p.policy.name())
    })
}

/// 500 naming `policy` and what to do about it; `door` is how the caller knows the door.
pub(super) fn refuse(policy: &str, door: &str) -> Response<Body> {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::error!(
            policy,
            door,
            "a described request matched a policy with count_status; this door cannot see \
             responses and refuses such requests (logged once)"
        );
    }
    problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "Policy needs the response",
        Some(&format!(
            "policy {policy:?} counts requests by their response status (count_status), which \
             {door} never sees; decide it at Tollgate's proxy or tower layer, or narrow its \
             match so these requests do not reach it"
        )),
    )
}
