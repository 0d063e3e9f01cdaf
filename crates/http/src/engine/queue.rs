//! The engine's side of the `queue` action: which denials a caller may queue instead of
//! answering 429, and what queueing a request charges.
//!
//! A request is decided all-or-nothing as always, so a request some `queue` policy denies has
//! consumed from no policy. When only `queue` policies deny it, the 429 carries a
//! [`QueueTicket`]. A caller that queues the request calls [`Engine::admit_queued`], which
//! charges every other enforcing policy the request falls under (all-or-nothing again): the
//! request is counted by those now, and by its queue's policy when it is delivered, so each
//! policy counts it once. A caller that does not queue answers the 429, and nothing was
//! consumed.

use std::sync::Arc;

use smallvec::SmallVec;
use tollgate::{Clock, Decision, Decisions, Store};

use super::overrides::KeyOverride;
use super::{
    Action, Answer, Disposition, Engine, Entry, RateLimitHeaders, RefundGuard, decide::miscounted,
};
use crate::key::KeyBuf;

/// A request that only `queue` policies denied: the first of them (whose queue it joins),
/// the key it is counted under there, and the other policies to charge when it is queued.
#[derive(Clone, Debug)]
pub struct QueueTicket {
    index: usize,
    key: KeyBuf,
    cost: u32,
    decision: Decision,
    /// The key's override of the `queue` policy's quota, for the headers of the `202`.
    over: Option<Arc<KeyOverride>>,
    /// The enforcing policies the request falls under besides the denying `queue` ones.
    others: SmallVec<[Entry; 2]>,
}

impl QueueTicket {
    /// The name of the `queue` policy whose queue the request joins.
    pub fn policy(&self) -> &'static str {
        self.decision.policy
    }

    /// The key the request is counted under by that policy: a delivery is decided against the
    /// same bucket (stored with the request, so it is the engine's key, credentials hashed).
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// What one delivery costs that policy.
    pub fn cost(&self) -> u32 {
        self.cost
    }

    /// That policy's decision (the denial).
    pub fn decision(&self) -> &Decision {
        &self.decision
    }
}

impl<S: Store, C: Clock> Engine<S, C> {
    /// The ticket for a denial when every enforcing policy that denied is a `queue` policy.
    pub(super) fn queue_ticket(
        &self,
        decisions: &Decisions,
        entries: &[Entry],
    ) -> Option<Box<QueueTicket>> {
        let mut first: Option<(&Decision, &Entry)> = None;
        for (d, e) in decisions.as_slice().iter().zip(entries.iter()) {
            if d.allowed || self.is_shadow(e) {
                continue;
            }
            // A banned client is refused, never queued.
            if self.action(e) != Action::Queue || d.ban.is_ban() {
                return None;
            }
            first = first.or(Some((d, e)));
        }
        let (decision, entry) = first?;
        let others = decisions
            .as_slice()
            .iter()
            .zip(entries.iter())
            .filter(|(d, e)| !self.is_shadow(e) && (d.allowed || self.action(e) != Action::Queue))
            .map(|(_, e)| e.clone())
            .collect();
        Some(Box::new(QueueTicket {
            index: entry.index,
            key: entry.key.clone(),
            cost: entry.cost,
            decision: *decision,
            over: entry.over.clone(),
            others,
        }))
    }

    /// Charges the request's other enforcing policies for a request its caller queues, in one
    /// all-or-nothing check. `Ok`: the rate-limit headers for the caller's `202` (the queue
    /// policy's denial and the others' admissions; no `Retry-After`). `Err`: what to answer
    /// instead, as a request denied by those policies (429 and its `Retry-After`) or, when the
    /// store fails under [`OnError::Deny`](tollgate::OnError::Deny), 503. Under
    /// [`OnError::Allow`](tollgate::OnError::Allow) a failed store lets the request be queued
    /// uncharged, as it would let it through.
    pub async fn admit_queued(
        &self,
        ticket: &QueueTicket,
    ) -> Result<RateLimitHeaders, Box<Answer>> {
        let mut decisions = Decisions::new();
        decisions.push(ticket.decision);
        let mut indexes: SmallVec<[usize; 4]> = SmallVec::new();
        indexes.push(ticket.index);
        let mut overrides: SmallVec<[Option<Arc<KeyOverride>>; 4]> = SmallVec::new();
        overrides.push(ticket.over.clone());
        if !ticket.others.is_empty() {
            let checks: SmallVec<[tollgate::Check<'_>; 4]> =
                ticket.others.iter().map(|e| self.check(e)).collect();
            let evaluation = match self.check_all(&checks).await {
                Ok(d) if d.len() != ticket.others.len() => {
                    self.failed(miscounted(), &ticket.others)
                }
                Ok(d) if d.allowed() => {
                    for (decision, e) in d.into_iter().zip(ticket.others.iter()) {
                        decisions.push(decision);
                        indexes.push(e.index);
                        overrides.push(e.over.clone());
                    }
                    return Ok(RateLimitHeaders(
                        self.render_at(&decisions, &indexes, &overrides),
                    ));
                }
                Ok(d) => {
                    let headers = self.render(&d, &ticket.others);
                    self.deny(d, headers, &ticket.others)
                }
                Err(e) => self.failed(e, &ticket.others),
            };
            return match evaluation.disposition {
                Disposition::Respond(mut answer) => {
                    // Denied by the others: answered, not queued again.
                    answer.queue = None;
                    Err(answer)
                }
                Disposition::Pass | Disposition::Hold(_) => Ok(RateLimitHeaders::default()),
            };
        }
        Ok(RateLimitHeaders(
            self.render_at(&decisions, &indexes, &overrides),
        ))
    }

    /// Gives back what [`Engine::admit_queued`] charged, for a request the queue then could not
    /// take (full, or its store failed). Runs as its own task, as a held request's refund does.
    pub fn refund_queued(&self, ticket: &QueueTicket) {
        drop(RefundGuard {
            engine: self.clone(),
            entries: ticket.others.to_vec(),
            armed: !ticket.others.is_empty(),
        });
    }
}
