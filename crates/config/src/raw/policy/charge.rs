//! What a request of a policy costs: the `cost` taken up front, or a cost read from the
//! response (`charge`, `cost_from`, `count_status`), with the combinations each refuses.

use tollgate::{AlgorithmKind, Policy};
use tollgate_http::{Charge, CostFrom, StatusSet};

use super::super::fields::count;
use super::{Ctx, Errors, RawPolicy};

/// `charge`, `cost_from` and `count_status`: when a request is charged, where its cost is read
/// from the response, and which statuses count. `charge = "response"` needs `cost_from`, and
/// `cost_from` needs it.
pub(super) fn charge(
    p: &RawPolicy,
    cx: &Ctx,
    errs: &mut Errors<'_>,
) -> (Charge, Option<StatusSet>, bool) {
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

/// `cost` (default 1), which must fit what the quota can ever admit; `(None, _)` when refused.
pub(super) fn cost(
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
