//! A policy's quota from the fields of its algorithm, one validator per algorithm, and the
//! refusal of fields that belong to another: the part of a policy that depends on `algorithm`.

use tollgate::{AlgorithmKind, Quota};

use super::super::fields::{count, duration};
use super::{Ctx, Errors, RawPolicy};
use crate::parse_rate;

/// Refuses the quota fields of other algorithms; false when there was one.
pub(super) fn foreign_fields(p: &RawPolicy, cx: &Ctx, errs: &mut Errors<'_>) -> bool {
    let given: &[(&str, Option<usize>)] = &[
        ("limit", p.limit.as_ref().map(|v| v.span().start)),
        ("window", p.window.as_ref().map(|v| v.span().start)),
        ("capacity", p.capacity.as_ref().map(|v| v.span().start)),
        ("refill", p.refill.as_ref().map(|v| v.span().start)),
        ("rate", p.rate.as_ref().map(|v| v.span().start)),
        ("queue", p.queue.as_ref().map(|v| v.span().start)),
        ("max_delay", p.max_delay.as_ref().map(|v| v.span().start)),
    ];
    let own: &[&str] = match cx.kind {
        AlgorithmKind::TokenBucket => &["capacity", "refill"],
        AlgorithmKind::LeakyBucket => &["rate", "queue", "max_delay"],
        AlgorithmKind::Concurrency => &["limit", "max_delay"],
        _ => &["limit", "window"],
    };
    // What the message lists: the algorithm's own fields, with those it shares with others
    // (a concurrency limit's `lease_ttl` is also the leases' field, so it is not checked here).
    let shown = match cx.kind {
        AlgorithmKind::Concurrency => "limit, lease_ttl, max_delay".to_owned(),
        _ => own.join(", "),
    };
    let mut ok = true;
    for (field, pos) in given {
        if let Some(pos) = pos
            && !own.contains(field)
        {
            errs.at(
                *pos,
                format!(
                    "{}field \"{field}\" does not apply to algorithm \"{}\", which takes {}; remove it or change the algorithm",
                    cx.prefix,
                    cx.kind.as_str(),
                    shown
                ),
            );
            ok = false;
        }
    }
    ok
}

/// The quota from the algorithm's own fields.
pub(super) fn quota(p: &RawPolicy, cx: &Ctx, errs: &mut Errors<'_>) -> Option<Quota> {
    if super::super::calendar::wanted(p) {
        return super::super::calendar::quota(p, cx.kind, cx.at, &cx.prefix, errs);
    }
    match cx.kind {
        AlgorithmKind::TokenBucket => token_bucket_quota(p, cx, errs),
        AlgorithmKind::LeakyBucket => leaky_bucket_quota(p, cx, errs),
        AlgorithmKind::Concurrency => concurrency_quota(p, cx, errs),
        AlgorithmKind::FixedWindow
        | AlgorithmKind::SlidingWindowLog
        | AlgorithmKind::SlidingWindowCounter => window_quota(p, cx, errs),
    }
}

/// How long a concurrency permit lives unless its request ends first, when `lease_ttl` is not
/// given: long enough for a slow export, short enough that a crashed instance's slots come
/// back within minutes.
const DEFAULT_PERMIT_TTL: std::time::Duration = std::time::Duration::from_secs(300);

/// `limit` and `lease_ttl` (how long a permit lives when nothing gives it back).
fn concurrency_quota(p: &RawPolicy, cx: &Ctx, errs: &mut Errors<'_>) -> Option<Quota> {
    let ctx = cx.prefix.as_str();
    let limit = match &p.limit {
        Some(v) => count(v, "limit", ctx, 1, errs),
        None => {
            cx.required(errs, "limit", "4");
            None
        }
    };
    let ttl = match &p.lease_ttl {
        Some(v) => duration(v, "lease_ttl", ctx, errs),
        None => Some(DEFAULT_PERMIT_TTL),
    };
    let (limit, ttl) = (limit?, ttl?);
    Quota::concurrency(limit, ttl)
        .map_err(|e| {
            let pos = p.lease_ttl.as_ref().map_or(cx.at, |v| v.span().start);
            errs.at(pos, format!("{ctx}{}", e.reason()));
        })
        .ok()
}

/// `limit` and `window`: the fixed window and both sliding windows.
fn window_quota(p: &RawPolicy, cx: &Ctx, errs: &mut Errors<'_>) -> Option<Quota> {
    let ctx = cx.prefix.as_str();
    let limit = match &p.limit {
        Some(v) => count(v, "limit", ctx, 1, errs),
        None => {
            cx.required(errs, "limit", "100");
            None
        }
    };
    let window = match &p.window {
        Some(v) => duration(v, "window", ctx, errs),
        None => {
            cx.required(errs, "window", "\"1m\"");
            None
        }
    };
    match (limit, window) {
        (Some(l), Some(w)) => {
            let q = match cx.kind {
                AlgorithmKind::FixedWindow => Quota::fixed_window(l, w),
                AlgorithmKind::SlidingWindowLog => Quota::sliding_window_log(l, w),
                _ => Quota::sliding_window_counter(l, w),
            };
            q.map_err(|e| {
                let pos = p.window.as_ref().map_or(cx.at, |v| v.span().start);
                errs.at(pos, format!("{ctx}{}", e.reason()));
            })
            .ok()
        }
        _ => None,
    }
}

/// `capacity` and `refill`.
fn token_bucket_quota(p: &RawPolicy, cx: &Ctx, errs: &mut Errors<'_>) -> Option<Quota> {
    let ctx = cx.prefix.as_str();
    let capacity = match &p.capacity {
        Some(v) => count(v, "capacity", ctx, 1, errs),
        None => {
            cx.required(errs, "capacity", "20");
            None
        }
    };
    let refill = match &p.refill {
        Some(v) => parse_rate(v.get_ref())
            .map_err(|reason| {
                errs.at(
                    v.span().start,
                    format!("{ctx}field \"refill\": {reason}; write e.g. refill = \"1/s\""),
                );
            })
            .ok(),
        None => {
            cx.required(errs, "refill", "\"1/s\"");
            None
        }
    };
    match (capacity, refill) {
        (Some(c), Some(r)) => Quota::token_bucket(c, r)
            .map_err(|e| errs.at(cx.at, format!("{ctx}{}", e.reason())))
            .ok(),
        _ => None,
    }
}

/// `rate`, `queue` and `max_delay`.
fn leaky_bucket_quota(p: &RawPolicy, cx: &Ctx, errs: &mut Errors<'_>) -> Option<Quota> {
    let ctx = cx.prefix.as_str();
    let rate = match &p.rate {
        Some(v) => parse_rate(v.get_ref())
            .map_err(|reason| {
                errs.at(
                    v.span().start,
                    format!("{ctx}field \"rate\": {reason}; write e.g. rate = \"5/s\""),
                );
            })
            .ok(),
        None => {
            cx.required(errs, "rate", "\"5/s\"");
            None
        }
    };
    let queue = match &p.queue {
        Some(v) => count(v, "queue", ctx, 0, errs),
        None => Some(0),
    };
    let max_delay = match &p.max_delay {
        Some(v) => duration(v, "max_delay", ctx, errs).map(Some),
        None => Some(None),
    };
    match (rate, queue, max_delay) {
        (Some(r), Some(q), Some(md)) => match Quota::leaky_bucket(r, q) {
            Ok(Quota::LeakyBucket(lb)) => Some(Quota::LeakyBucket(match md {
                Some(d) => lb.with_max_delay(d),
                None => lb,
            })),
            Ok(other) => Some(other),
            Err(e) => {
                errs.at(cx.at, format!("{ctx}{}", e.reason()));
                None
            }
        },
        _ => None,
    }
}
