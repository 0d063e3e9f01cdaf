//! A policy's `ban = { after = 5, within = "10m", for = "1h" }`: a key the policy denies `after`
//! times within `within` is refused for `for` (see [`tollgate::Ban`]).

use serde::Deserialize;
use tollgate::{Ban, Policy};

use super::fields::{count, duration};
use super::{Errors, S};

/// The `ban` table as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(in crate::raw) struct RawBan {
    after: Option<S<i64>>,
    within: Option<S<String>>,
    #[serde(rename = "for")]
    ban_for: Option<S<String>>,
}

/// `policy` with the ban `raw` describes (when there is one), and whether the table was valid.
/// `at` is where the policy's table starts, `ctx` the prefix naming it.
pub(in crate::raw) fn validate(
    raw: Option<&S<RawBan>>,
    policy: Option<Policy>,
    ctx: &str,
    errs: &mut Errors<'_>,
) -> (Option<Policy>, bool) {
    let Some(raw) = raw else {
        return (policy, true);
    };
    let at = raw.span().start;
    let b = raw.get_ref();
    let example = "write e.g. ban = { after = 5, within = \"10m\", for = \"1h\" }";
    let missing = |errs: &mut Errors<'_>, field: &str| {
        errs.at(
            at,
            format!("{ctx}field \"ban\" needs \"{field}\"; {example}"),
        );
    };
    let after = match &b.after {
        Some(v) => count(v, "ban.after", ctx, 1, errs),
        None => {
            missing(errs, "after");
            None
        }
    };
    let mut times = [None, None];
    for (slot, (field, value)) in times
        .iter_mut()
        .zip([("within", &b.within), ("for", &b.ban_for)])
    {
        *slot = match value {
            Some(v) => duration(v, &format!("ban.{field}"), ctx, errs),
            None => {
                missing(errs, field);
                None
            }
        };
    }
    let (Some(after), [Some(within), Some(ban_for)]) = (after, times) else {
        return (policy, false);
    };
    let rule = match Ban::new(after, within, ban_for) {
        Ok(rule) => rule,
        Err(e) => {
            errs.at(at, format!("{ctx}field \"ban\": {}; {example}", e.reason()));
            return (policy, false);
        }
    };
    let Some(policy) = policy else {
        return (None, true);
    };
    match policy.with_ban(rule) {
        Ok(banned) => (Some(banned), true),
        Err(e) => {
            errs.at(at, format!("{ctx}field \"ban\": {}", e.reason()));
            (None, false)
        }
    }
}
