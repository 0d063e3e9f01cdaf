//! Writes the `RateLimitResponse` of decided entries: per-descriptor statuses as
//! envoyproxy/ratelimit reports them, the overall code, and the rate limit headers,
//! written by [`tollgate::headers`] as the tower layer and the server write them.

use std::time::Duration;

use smallvec::SmallVec;
use tollgate::headers;
use tollgate::{Decision, Timestamp};

use super::Entry;
use super::decide::is_over;
use crate::proto::envoy::config::core::v3::HeaderValue;
use crate::proto::envoy::service::ratelimit::v3::RateLimitResponse;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use crate::tree::{Compiled, until_window_end};

/// The answer for a request no limit applies to.
pub(super) fn ok(statuses: Vec<DescriptorStatus>) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses,
        response_headers_to_add: Vec::new(),
        request_headers_to_add: Vec::new(),
    }
}

/// The answer for decided `entries`.
pub(super) fn answer(
    config: &Compiled,
    mut statuses: Vec<DescriptorStatus>,
    entries: &[Entry<'_>],
    decisions: &[Decision],
    now: Timestamp,
) -> RateLimitResponse {
    let over = is_over(entries, decisions);
    for (entry, d) in entries.iter().zip(decisions) {
        // Shadow mode reports OK; quota mode reports the limit's own verdict, as the peer does.
        let denied = !d.allowed && !entry.leaf.options.shadow;
        let status = &mut statuses[entry.index];
        status.code = if denied { Code::OverLimit } else { Code::Ok } as i32;
        status.current_limit.clone_from(&entry.leaf.current_limit);
        status.limit_remaining = u32::try_from(d.remaining).unwrap_or(u32::MAX);
        // Requests per unit: the end of the unit's window, as the peer reports it (even for a
        // counter never touched); other algorithms: when the quota is whole again.
        let reset = match entry.leaf.window {
            Some(window) => until_window_end(now, window),
            None => d.reset,
        };
        status.duration_until_reset = Some(prost_duration(reset));
    }
    RateLimitResponse {
        overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
        statuses,
        response_headers_to_add: rate_limit_headers(config, entries, decisions, over, now),
        request_headers_to_add: Vec::new(),
    }
}

fn prost_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        // Below one billion, so it always fits.
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// The rate limit headers over the limits not in shadow mode.
fn rate_limit_headers(
    config: &Compiled,
    entries: &[Entry<'_>],
    decisions: &[Decision],
    over: bool,
    now: Timestamp,
) -> Vec<HeaderValue> {
    let items: SmallVec<[(&Entry<'_>, &Decision); 4]> = entries
        .iter()
        .zip(decisions)
        .filter(|(e, _)| !e.leaf.options.shadow)
        .collect();
    let Some(&(worst_entry, worst)) = items
        .iter()
        .min_by(|(_, a), (_, b)| headers::cmp_restrictive(a, b))
    else {
        return Vec::new();
    };
    let mut out = Vec::with_capacity(6);
    if config.x_ratelimit_headers {
        out.push(header("X-RateLimit-Limit", number(worst.limit)));
        out.push(header("X-RateLimit-Remaining", number(worst.remaining)));
        if let Some(reset) = config.reset_format.reset_secs(now, worst) {
            out.push(header("X-RateLimit-Reset", number(reset)));
        }
    }
    if config.ietf_headers {
        out.push(header("RateLimit-Policy", policy_field(&items)));
        let mut field = String::with_capacity(worst_entry.leaf.quoted_name.len() + 24);
        headers::write_ratelimit_item(&mut field, &worst_entry.leaf.quoted_name, worst);
        out.push(header("RateLimit", field));
    }
    if over {
        // The core's one aggregation rule; where it finds no wait (a denial no wait fixes),
        // Envoy still gets one to pass on: the full reset (the tower layer leaves the field out).
        let denials = items.iter().filter(|(_, d)| !d.allowed).map(|(_, d)| *d);
        let wait = headers::aggregate_retry_after(denials).unwrap_or(worst.reset);
        let secs = headers::retry_after_secs(wait, headers::t_secs(worst));
        out.push(header("Retry-After", number(secs)));
    }
    out
}

/// `RateLimit-Policy`: each limit once, even when several descriptors matched it.
fn policy_field(items: &[(&Entry<'_>, &Decision)]) -> String {
    if let [(only, _)] = items {
        return only.leaf.policy_item.clone();
    }
    let mut listed: SmallVec<[&str; 4]> = SmallVec::new();
    let mut policy = String::with_capacity(items.len() * 32);
    for (e, _) in items {
        if listed.contains(&e.leaf.policy_item.as_str()) {
            continue;
        }
        listed.push(&e.leaf.policy_item);
        if !policy.is_empty() {
            policy.push_str(headers::LIST_SEPARATOR);
        }
        policy.push_str(&e.leaf.policy_item);
    }
    policy
}

fn number(n: u64) -> String {
    let mut s = String::with_capacity(20);
    headers::write_u64(&mut s, n);
    s
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
        raw_value: Vec::new(),
    }
}
