//! Decides the matched descriptors of one request. Tollgate's all-or-nothing call meets
//! envoyproxy/ratelimit's modes: shadow-mode limits never make a request over the limit, and
//! quota-mode limits do only when every quota-mode limit of the request is over. So the first
//! all-or-nothing store call may leave uncounted a request that goes on; then the limits that
//! admitted it are counted in another all-or-nothing call. A request over the limit is still
//! counted by every descriptor, as the peer counts it: Envoy sends the usage of a finished
//! stream (`apply_on_stream_done`) as a request's `hits_addend`, and a usage report that found
//! its quota spent must not be lost.

use smallvec::SmallVec;
use tollgate::{Check, Clock, Decision, Limiter, Store, Timestamp};

use super::Entry;
use crate::tree::{LeafLimit, until_window_end};

/// The decisions of one request, in entry order, inline for up to four descriptors.
pub(super) type DecisionList = SmallVec<[Decision; 4]>;

/// Decides every entry. The first store call counts all of them at once, or peeks (cost 0)
/// when an enforced entry is over the limit whatever the store says; while the request goes
/// on (see [`is_over`]) but that call did not count it, the entries that admitted it are
/// counted in another all-or-nothing call. Each such call has one entry fewer than the last
/// (the one that now denies), so this ends.
pub(super) async fn decide<S: Store, C: Clock>(
    limiter: &Limiter<S, C>,
    entries: &[Entry<'_>],
    now: Timestamp,
) -> Result<DecisionList, tollgate::Error> {
    let peek = entries
        .iter()
        .any(|e| e.denied_up_front && !e.leaf.options.shadow);
    let mut decisions: DecisionList = entries.iter().map(|e| preset(e, now)).collect();
    let counted: SmallVec<[usize; 4]> = (0..entries.len())
        .filter(|&i| entries[i].leaf.policy().is_some())
        .collect();
    let cost = |e: &Entry<'_>| if peek || e.denied_up_front { 0 } else { e.cost };
    let mut committed = check(limiter, entries, &counted, cost, &mut decisions).await? && !peek;
    for (e, d) in entries.iter().zip(decisions.iter_mut()) {
        if e.denied_up_front {
            // It can never pass: no wait would be true.
            d.allowed = false;
            d.retry_after = None;
        }
    }
    while !committed && !is_over(entries, &decisions) {
        let again: SmallVec<[usize; 4]> = (0..entries.len())
            .filter(|&i| {
                let e = &entries[i];
                e.leaf.policy().is_some()
                    && !e.denied_up_front
                    && e.cost > 0
                    && decisions[i].allowed
            })
            .collect();
        if again.is_empty() {
            break;
        }
        committed = check(limiter, entries, &again, |e| e.cost, &mut decisions).await?;
    }
    if !committed && is_over(entries, &decisions) {
        charge_all(limiter, entries, now, &mut decisions).await?;
    }
    Ok(decisions)
}

/// Charges every counted descriptor of a request over the limit its hits, whatever its quota
/// says (never refused), and reports what each has left afterwards; the decisions stay denied
/// where they were.
async fn charge_all<S: Store, C: Clock>(
    limiter: &Limiter<S, C>,
    entries: &[Entry<'_>],
    now: Timestamp,
    decisions: &mut DecisionList,
) -> Result<(), tollgate::Error> {
    let charged: SmallVec<[usize; 4]> = (0..entries.len())
        .filter(|&i| entries[i].leaf.policy().is_some() && entries[i].cost > 0)
        .collect();
    let checks: SmallVec<[Check<'_>; 4]> = charged
        .iter()
        .filter_map(|&i| {
            let e = &entries[i];
            Some(Check::new(e.leaf.policy()?, &e.key, e.cost))
        })
        .collect();
    if checks.is_empty() {
        return Ok(());
    }
    let after = limiter.store().charge(now, &checks).await?;
    for (&i, d) in charged.iter().zip(after.as_slice()) {
        decisions[i].remaining = d.remaining;
        decisions[i].reset = d.reset;
    }
    Ok(())
}

/// Whether the request is over the limit, as envoyproxy/ratelimit's service decides it: a
/// denying limit in neither shadow nor quota mode, or quota-mode limits all denying (a
/// shadow-mode one never denies).
pub(super) fn is_over(entries: &[Entry<'_>], decisions: &[Decision]) -> bool {
    let mut quota_total = 0usize;
    let mut quota_denied = 0usize;
    for (e, d) in entries.iter().zip(decisions) {
        let denies = !d.allowed && !e.leaf.options.shadow;
        if e.leaf.options.quota_mode {
            quota_total += 1;
            quota_denied += usize::from(denies);
        } else if denies {
            return true;
        }
    }
    quota_total > 0 && quota_denied == quota_total
}

/// One all-or-nothing store call for the entries at `indices`, each for `cost(entry)`; their
/// decisions replace those in `decisions`. Whether the store admitted (and so counted) all.
async fn check<S: Store, C: Clock>(
    limiter: &Limiter<S, C>,
    entries: &[Entry<'_>],
    indices: &[usize],
    cost: impl Fn(&Entry<'_>) -> u32,
    decisions: &mut DecisionList,
) -> Result<bool, tollgate::Error> {
    let checks: SmallVec<[Check<'_>; 4]> = indices
        .iter()
        .filter_map(|&i| {
            let e = &entries[i];
            Some(Check::new(e.leaf.policy()?, &e.key, cost(e)))
        })
        .collect();
    if checks.is_empty() {
        return Ok(true);
    }
    let answers = limiter.check_all(&checks).await?;
    let mut all = true;
    for (&i, d) in indices.iter().zip(answers.as_slice()) {
        all &= d.allowed;
        decisions[i] = *d;
    }
    Ok(all)
}

/// The decision an entry starts with: a blocked limit's, which never reaches the store
/// (nothing left, full window to wait, allowed only when it adds no hits); a placeholder for a
/// counted one, which the store's answer replaces.
fn preset(e: &Entry<'_>, now: Timestamp) -> Decision {
    let reset = e
        .leaf
        .window
        .map(|w| until_window_end(now, w))
        .unwrap_or_default();
    Decision {
        policy: "",
        allowed: !matches!(e.leaf.limit, LeafLimit::Blocked) || e.cost == 0,
        limit: 0,
        remaining: 0,
        reset,
        retry_after: None,
        delay: None,
        ban: tollgate::BanStatus::None,
    }
}
