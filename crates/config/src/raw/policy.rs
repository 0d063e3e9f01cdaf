//! One `[[policy]]`: its algorithm and quota, cost, key chain, route, action, queue settings
//! and hot-key lease. Fields that belong to another algorithm are refused, so a typo in
//! `algorithm` cannot silently drop a limit.

use tollgate::{AlgorithmKind, Lease, Policy, Quota, parse_duration};
use tollgate_http::{Charge, CostFrom, KeyChain, KeySelector, RouteMatch, StatusSet, parse_method};

use super::fields::{count, duration, one_of};
use super::{Errors, RawMatch, RawPolicy};
use crate::{Action, PolicyConfig, make_policy, parse_algorithm, parse_rate};

/// What a policy's validation needs at every step: where the table starts (for errors about a
/// missing field), the message prefix naming the policy, and its algorithm.
struct Ctx {
    at: usize,
    prefix: String,
    kind: AlgorithmKind,
}

impl Ctx {
    /// Reports a missing field the algorithm requires.
    fn required(&self, errs: &mut Errors<'_>, field: &str, example: &str) {
        errs.at(
            self.at,
            format!(
                "{}field \"{field}\" is required for algorithm \"{}\"; write e.g. {field} = {example}",
                self.prefix,
                self.kind.as_str()
            ),
        );
    }
}

/// One `[[policy]]` starting at byte `at`; `None` when any field was refused (each reported).
pub(super) fn validate(at: usize, p: RawPolicy, errs: &mut Errors<'_>) -> Option<PolicyConfig> {
    let Some(name) = p.name.as_ref() else {
        errs.at(
            at,
            "[[policy]]: field \"name\" is required; write e.g. name = \"api\"".to_owned(),
        );
        return None;
    };
    let n = name.get_ref().clone();
    if !n.is_empty() && !tollgate::headers::is_printable_ascii(&n) {
        // Every answer names its policies in the RateLimit headers, which carry ASCII only.
        errs.at(
            name.span().start,
            format!(
                "policy {n:?}: field \"name\": a policy name must be printable ASCII (letters, digits, punctuation, spaces) to appear in the RateLimit headers; write e.g. name = \"cafe\""
            ),
        );
        return None;
    }
    let prefix = format!("policy \"{n}\": ");
    let kind = match &p.algorithm {
        Some(v) => match parse_algorithm(v.get_ref()) {
            Ok(k) => k,
            Err(reason) => {
                errs.at(v.span().start, format!("{prefix}field \"algorithm\": {reason}; write e.g. algorithm = \"sliding_window_counter\""));
                return None;
            }
        },
        None => AlgorithmKind::SlidingWindowCounter,
    };
    let cx = Ctx { at, prefix, kind };
    let mut ok = foreign_fields(&p, &cx, errs);

    let policy = quota(&p, &cx, errs).and_then(|q| {
        make_policy(&n, q)
            .map_err(|reason| {
                errs.at(
                    name.span().start,
                    format!("policy {n:?}: field \"name\": {reason}"),
                )
            })
            .ok()
    });
    let (policy, lease_ok) = validate_lease(&p, policy, (&cx.prefix, cx.kind), errs);
    ok &= lease_ok;
    let (policy, ban_ok) = super::ban::validate(p.ban.as_ref(), policy, &cx.prefix, errs);
    ok &= ban_ok;
    let (cost, cost_ok) = cost(&p, policy.as_ref(), &cx, errs);
    ok &= cost_ok;
    let (keys, jwt_key_at, keys_ok) = keys(&p, &cx.prefix, errs);
    ok &= keys_ok;
    let route = match &p.route {
        None => Some(RouteMatch::any()),
        Some(m) => {
            let route = route(m.get_ref(), &cx.prefix, errs);
            ok &= route.is_some();
            route
        }
    };
    let (action, action_ok) = action(&p, &cx, errs);
    ok &= action_ok;
    let (charge, count_status, charge_ok) = charge(&p, &cx, errs);
    ok &= charge_ok;
    // What reading the response cannot change: a concurrency slot, and a queued request, which
    // the queue delivers later, each delivery taking one slot of the drain rate.
    let not_by_response = if kind == AlgorithmKind::Concurrency {
        Some(
            "algorithm \"concurrency\": a slot is held while the request runs and given back at its end, whatever the response says",
        )
    } else if action == Some(Action::Queue) {
        Some(
            "action \"queue\": the queue delivers a request later at the policy's rate, each delivery taking one slot, and reads no response for a cost; use action = \"delay\" to hold requests and charge their responses",
        )
    } else {
        None
    };
    if let Some(why) = not_by_response {
        let by_response = [
            (
                "charge",
                p.charge
                    .as_ref()
                    .filter(|c| c.get_ref() != "request")
                    .map(|c| c.span().start),
            ),
            (
                "count_status",
                p.count_status.as_ref().map(|c| c.span().start),
            ),
        ];
        for (field, at) in by_response {
            if let Some(at) = at {
                errs.at(
                    at,
                    format!("{}field \"{field}\" does not apply to {why}", cx.prefix),
                );
                ok = false;
            }
        }
    }
    let queue_fields = crate::queue::RawQueueFields {
        max_body: p.queue_max_body.as_ref(),
        max_depth: p.queue_max_depth.as_ref(),
        attempts: p.queue_attempts.as_ref(),
        backoff: p.queue_backoff.as_ref(),
        claim_after: p.queue_claim_after.as_ref(),
        concurrency: p.queue_concurrency.as_ref(),
    };
    let queue = crate::queue::validate(
        &queue_fields,
        action == Some(Action::Queue),
        &cx.prefix,
        errs,
    );
    if !ok {
        return None;
    }
    Some(PolicyConfig {
        policy: policy?,
        keys: KeyChain::new(keys),
        route: route?,
        jwt_key_at,
        cost: cost?,
        action: action?,
        require_key: p.require_key.unwrap_or(false),
        queue: queue?,
        charge,
        count_status,
    })
}

/// `charge`, `cost_from` and `count_status`: when a request is charged, where its cost is read
/// from the response, and which statuses count. `charge = "response"` needs `cost_from`, and
/// `cost_from` needs it.
fn charge(p: &RawPolicy, cx: &Ctx, errs: &mut Errors<'_>) -> (Charge, Option<StatusSet>, bool) {
    let mut ok = true;
    let cost_from = match &p.cost_from {
        Some(v) => match v.get_ref().parse::<CostFrom>() {
            Ok(c) => Some(c),
            Err(e) => {
                errs.at(
                    v.span().start,
                    format!(
                        "{}field \"cost_from\": {}; write e.g. cost_from = \"json:usage.total_tokens\" or \"header:x-usage-tokens\"",
                        cx.prefix,
                        e.reason()
                    ),
                );
                ok = false;
                None
            }
        },
        None => None,
    };
    let charge = match (&p.charge, cost_from) {
        (None, None) => Charge::Request,
        (Some(v), cost_from) if v.get_ref() == "request" => {
            if let (Some(c), Some(at)) = (cost_from, &p.cost_from) {
                errs.at(
                    at.span().start,
                    format!(
                        "{}field \"cost_from\" ({c}) reads the cost from the response: it needs charge = \"response\"",
                        cx.prefix
                    ),
                );
                ok = false;
            }
            Charge::Request
        }
        (Some(v), Some(c)) if v.get_ref() == "response" => Charge::Response(c),
        (Some(v), None) if v.get_ref() == "response" => {
            if p.cost_from.is_none() {
                errs.at(
                    v.span().start,
                    format!(
                        "{}charge = \"response\" needs cost_from, where the response says what it cost; write e.g. cost_from = \"json:usage.total_tokens\"",
                        cx.prefix
                    ),
                );
            }
            ok = false;
            Charge::Request
        }
        (Some(v), _) => {
            errs.at(
                v.span().start,
                format!(
                    "{}field \"charge\": use \"request\" (the default: charged up front) or \"response\" (charged what the response says, from cost_from)",
                    cx.prefix
                ),
            );
            ok = false;
            Charge::Request
        }
        (None, Some(c)) => {
            if let Some(at) = &p.cost_from {
                errs.at(
                    at.span().start,
                    format!(
                        "{}field \"cost_from\" ({c}) reads the cost from the response: add charge = \"response\"",
                        cx.prefix
                    ),
                );
            }
            ok = false;
            Charge::Request
        }
    };
    let count_status = match &p.count_status {
        Some(list) => {
            let items: Vec<&str> = list
                .get_ref()
                .iter()
                .map(|s| s.get_ref().as_str())
                .collect();
            match StatusSet::parse(&items) {
                Ok(set) => Some(set),
                Err(e) => {
                    let at = list
                        .get_ref()
                        .iter()
                        .find(|s| s.get_ref().trim() == e.input())
                        .map_or(list.span().start, |s| s.span().start);
                    errs.at(
                        at,
                        format!(
                            "{}field \"count_status\": {:?}: {}; write e.g. count_status = [\"401\", \"403\", \"5xx\"]",
                            cx.prefix,
                            e.input(),
                            e.reason()
                        ),
                    );
                    ok = false;
                    None
                }
            }
        }
        None => None,
    };
    (charge, count_status, ok)
}

/// Refuses the quota fields of other algorithms; false when there was one.
fn foreign_fields(p: &RawPolicy, cx: &Ctx, errs: &mut Errors<'_>) -> bool {
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
fn quota(p: &RawPolicy, cx: &Ctx, errs: &mut Errors<'_>) -> Option<Quota> {
    if super::calendar::wanted(p) {
        return super::calendar::quota(p, cx.kind, cx.at, &cx.prefix, errs);
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

/// `cost` (default 1), which must fit what the quota can ever admit; `(None, _)` when refused.
fn cost(
    p: &RawPolicy,
    policy: Option<&Policy>,
    cx: &Ctx,
    errs: &mut Errors<'_>,
) -> (Option<u32>, bool) {
    let cost = match &p.cost {
        Some(v) => count(v, "cost", &cx.prefix, 1, errs),
        None => Some(1),
    };
    if let (Some(c), Some(at)) = (cost, &p.cost)
        && cx.kind == AlgorithmKind::Concurrency
        && c != 1
    {
        errs.at(
            at.span().start,
            format!("{}field \"cost\" = {c}: a request holds one slot of a concurrency limit, so its cost is 1; remove the field", cx.prefix),
        );
        return (cost, false);
    }
    if let (Some(c), Some(pol)) = (cost, policy) {
        let max = pol.quota().max_cost();
        if c > max {
            let pos = p.cost.as_ref().map_or(cx.at, |v| v.span().start);
            errs.at(
                pos,
                format!("{}field \"cost\" = {c} exceeds what the quota can ever admit ({max}); every request would be refused. Lower the cost or raise the quota", cx.prefix),
            );
            return (cost, false);
        }
    }
    (cost, true)
}

/// `key`: the key chain (default: the client IP), where a `jwt:<claim>` selector is, and
/// whether every selector was valid.
fn keys(
    p: &RawPolicy,
    ctx: &str,
    errs: &mut Errors<'_>,
) -> (Vec<KeySelector>, Option<usize>, bool) {
    let mut keys = Vec::new();
    let mut jwt_key_at = None;
    let mut ok = true;
    match &p.key {
        Some(list) => {
            if list.get_ref().is_empty() {
                errs.at(list.span().start, format!("{ctx}field \"key\" is empty; write e.g. key = [\"header:x-api-key\", \"ip\"]"));
                ok = false;
            }
            for k in list.get_ref() {
                match k.get_ref().parse::<KeySelector>() {
                    Ok(sel) => {
                        if matches!(sel, KeySelector::Jwt(_)) {
                            jwt_key_at = Some(k.span().start);
                        }
                        keys.push(sel);
                    }
                    Err(e) => {
                        errs.at(
                            k.span().start,
                            format!("{ctx}field \"key\": {:?}: {}", e.input(), e.reason()),
                        );
                        ok = false;
                    }
                }
            }
        }
        None => keys.push(KeySelector::Ip),
    }
    (keys, jwt_key_at, ok)
}

/// `match`: the path pattern, methods and host a policy applies to; `None` when one was refused.
fn route(m: &RawMatch, ctx: &str, errs: &mut Errors<'_>) -> Option<RouteMatch> {
    let mut route = Some(RouteMatch::any());
    if let Some(path) = &m.path {
        route = match route.map(|r| r.path(path.get_ref())) {
            Some(Ok(r)) => Some(r),
            Some(Err(e)) => {
                errs.at(
                    path.span().start,
                    format!(
                        "{ctx}match.path {:?}: {}; write e.g. path = \"/v1/**\"",
                        path.get_ref(),
                        e.reason()
                    ),
                );
                None
            }
            None => None,
        };
    }
    let mut methods = Vec::new();
    for method in m.methods.iter().flatten() {
        match parse_method(method.get_ref()) {
            Ok(_) => methods.push(method.get_ref().clone()),
            Err(e) => {
                errs.at(
                    method.span().start,
                    format!(
                        "{ctx}match.methods: {:?}: {}; write e.g. methods = [\"GET\", \"POST\"]",
                        e.input(),
                        e.reason()
                    ),
                );
                route = None;
            }
        }
    }
    if !methods.is_empty() {
        route = route.and_then(|r| r.methods(&methods).ok());
    }
    if let Some(host) = &m.host {
        route = match route.map(|r| r.host(host.get_ref())) {
            Some(Ok(r)) => Some(r),
            Some(Err(e)) => {
                errs.at(
                    host.span().start,
                    format!(
                        "{ctx}match.host {:?}: {}; write e.g. host = \"api.example.com\"",
                        host.get_ref(),
                        e.reason()
                    ),
                );
                None
            }
            None => None,
        };
    }
    route
}

/// `action` (default `reject`): `delay` and `queue` need the leaky bucket, whose rate they
/// follow; `(None, _)` when refused.
fn action(p: &RawPolicy, cx: &Ctx, errs: &mut Errors<'_>) -> (Option<Action>, bool) {
    let mut ok = true;
    let action = match &p.action {
        Some(v) => one_of(
            v,
            "action",
            &cx.prefix,
            &[
                ("reject", Action::Reject),
                (
                    "delay",
                    Action::Delay {
                        max_delay: p
                            .max_delay
                            .as_ref()
                            .and_then(|v| parse_duration(v.get_ref()).ok())
                            .unwrap_or(tollgate_http::DEFAULT_MAX_DELAY),
                    },
                ),
                ("shadow", Action::Shadow),
                ("queue", Action::Queue),
            ],
            errs,
        ),
        None => Some(Action::Reject),
    };
    if matches!(action, Some(Action::Delay { .. }))
        && !matches!(
            cx.kind,
            AlgorithmKind::LeakyBucket | AlgorithmKind::Concurrency
        )
    {
        let pos = p.action.as_ref().map_or(cx.at, |v| v.span().start);
        errs.at(pos, format!("{}action \"delay\" needs algorithm \"leaky_bucket\" or \"concurrency\" (it holds a request until its slot); use action = \"reject\" with \"{}\"", cx.prefix, cx.kind.as_str()));
        ok = false;
    }
    if action == Some(Action::Queue) && cx.kind != AlgorithmKind::LeakyBucket {
        let pos = p.action.as_ref().map_or(cx.at, |v| v.span().start);
        errs.at(pos, format!("{}action \"queue\" needs algorithm \"leaky_bucket\" (its rate is the rate queued requests are delivered at); use action = \"reject\" with \"{}\"", cx.prefix, cx.kind.as_str()));
        ok = false;
    }
    (action, ok)
}

/// `lease` and `lease_ttl`: hot-key leases for the Redis store, refused where unsound for the
/// algorithm. Returns the policy with its lease, and whether the fields were valid.
fn validate_lease(
    p: &RawPolicy,
    policy: Option<Policy>,
    (ctx, kind): (&str, AlgorithmKind),
    errs: &mut Errors<'_>,
) -> (Option<Policy>, bool) {
    if kind == AlgorithmKind::Concurrency {
        if let Some(size) = &p.lease {
            errs.at(
                size.span().start,
                format!("{ctx}field \"lease\" does not apply to algorithm \"concurrency\": a permit is taken and given back at the store each time; its lease_ttl is how long a permit lives when its request never ends"),
            );
            return (policy, false);
        }
        return (policy, true);
    }
    let Some(size) = &p.lease else {
        if let Some(ttl) = &p.lease_ttl {
            errs.at(
                ttl.span().start,
                format!("{ctx}field \"lease_ttl\" needs \"lease\" (how many units a lease takes); write e.g. lease = 100"),
            );
            return (policy, false);
        }
        return (policy, true);
    };
    let Some(units) = count(size, "lease", ctx, 1, errs) else {
        return (policy, false);
    };
    let ttl = match &p.lease_ttl {
        Some(v) => match duration(v, "lease_ttl", ctx, errs) {
            Some(d) => Some(d),
            None => return (policy, false),
        },
        None => None,
    };
    let Some(policy) = policy else {
        return (None, true);
    };
    let ttl = ttl.unwrap_or_else(|| Lease::default_ttl(policy.quota()));
    match Lease::new(units, ttl).and_then(|lease| policy.with_lease(lease)) {
        Ok(leased) => (Some(leased), true),
        Err(e) => {
            errs.at(
                size.span().start,
                format!("{ctx}field \"lease\": {}", e.reason()),
            );
            (None, false)
        }
    }
}
