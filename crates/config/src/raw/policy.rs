//! One `[[policy]]`: its algorithm and quota, cost, key chain, route, action, queue settings
//! and hot-key lease. Fields that belong to another algorithm are refused, so a typo in
//! `algorithm` cannot silently drop a limit.

use tollgate::{AlgorithmKind, Lease, Policy, parse_duration};
use tollgate_http::{KeyChain, KeySelector, RouteMatch, parse_method};

use super::fields::{count, duration, one_of};
use super::{Errors, RawMatch, RawPolicy};
use crate::{Action, PolicyConfig, make_policy, parse_algorithm};

mod charge;
mod quota;

use charge::{charge, cost};
use quota::{foreign_fields, quota};

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
