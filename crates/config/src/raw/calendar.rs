//! A fixed window by the calendar: `calendar = "day" | "week" | "month" | "year"` instead of
//! `window`, with `timezone` (an IANA name, `"UTC"` by default). Each refused combination is
//! reported at the field that breaks it.

use tollgate::{AlgorithmKind, Calendar, CalendarUnit, Quota};

use super::fields::count;
use super::{Errors, RawPolicy};

/// Whether the policy asks for a calendar (names `calendar` or `timezone`): its quota then
/// comes from [`quota`].
pub(super) fn wanted(p: &RawPolicy) -> bool {
    p.calendar.is_some() || p.timezone.is_some()
}

/// The quota of a policy that names `calendar` or `timezone`; `None` when anything was refused
/// (each reported). `at` is where the table starts, `prefix` names the policy.
pub(super) fn quota(
    p: &RawPolicy,
    kind: AlgorithmKind,
    at: usize,
    prefix: &str,
    errs: &mut Errors<'_>,
) -> Option<Quota> {
    let Some(unit_field) = &p.calendar else {
        if let Some(zone) = &p.timezone {
            errs.at(
                zone.span().start,
                format!(
                    "{prefix}field \"timezone\" applies only to a calendar window; add e.g. \
                     calendar = \"day\" (with algorithm = \"fixed_window\"), or remove it"
                ),
            );
        }
        return None;
    };
    let mut ok = true;
    if kind != AlgorithmKind::FixedWindow {
        errs.at(
            unit_field.span().start,
            format!(
                "{prefix}field \"calendar\" applies only to algorithm \"fixed_window\", not \
                 \"{}\"; write algorithm = \"fixed_window\", or use window = \"1d\" instead",
                kind.as_str()
            ),
        );
        ok = false;
    }
    if let Some(window) = &p.window {
        errs.at(
            window.span().start,
            format!(
                "{prefix}fields \"calendar\" and \"window\" cannot be used together: a calendar \
                 period is the window; remove one of them"
            ),
        );
        ok = false;
    }
    let unit = match unit_field.get_ref().parse::<CalendarUnit>() {
        Ok(u) => Some(u),
        Err(e) => {
            errs.at(
                unit_field.span().start,
                format!(
                    "{prefix}field \"calendar\": {}; write e.g. calendar = \"month\"",
                    e.reason()
                ),
            );
            None
        }
    };
    let zone = p.timezone.as_ref();
    let zone_name = zone.map_or("UTC", |z| z.get_ref().as_str());
    let calendar = unit.and_then(|u| match Calendar::new(u, zone_name) {
        Ok(c) => Some(c),
        Err(e) => {
            errs.at(
                zone.map_or(at, |z| z.span().start),
                format!(
                    "{prefix}field \"timezone\": {:?}: {}",
                    zone_name,
                    e.reason()
                ),
            );
            None
        }
    });
    let limit = match &p.limit {
        Some(v) => count(v, "limit", prefix, 1, errs),
        // Another algorithm was already refused above: its own fields are not a fixed window's.
        None if kind != AlgorithmKind::FixedWindow => None,
        None => {
            errs.at(
                at,
                format!(
                    "{prefix}field \"limit\" is required for algorithm \"fixed_window\"; write \
                     e.g. limit = 10000"
                ),
            );
            None
        }
    };
    let (limit, calendar) = (limit?, calendar?);
    if !ok {
        return None;
    }
    Quota::fixed_calendar(limit, calendar)
        .map_err(|e| errs.at(unit_field.span().start, format!("{prefix}{}", e.reason())))
        .ok()
}
