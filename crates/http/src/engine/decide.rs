//! Deciding a prepared request: the store's answer for every matching policy at once, the wait
//! in line for a concurrency slot, and what the answer becomes (pass, hold, or respond), with
//! the paths that decide without awaiting on a store that answers at once.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use smallvec::SmallVec;
use tollgate::{Check, Clock, Decision, Decisions, Error, Store};

use super::{
    Action, Answer, Disposition, Engine, Entry, Evaluation, Hold, Now, Prepared, RateLimitHeaders,
    RefundGuard, Settle,
};
use crate::headers::{HeaderList, PolicyText, render};
use crate::{Refusal, RequestInfo};

impl<S: Store, C: Clock> Engine<S, C> {
    /// Matches, selects keys and decides.
    pub async fn evaluate(&self, info: &RequestInfo<'_>) -> Evaluation<S, C> {
        let prepared = self.prepare(info);
        self.decide(prepared).await
    }

    /// Decides a prepared request: one all-or-nothing `check_all` over every matching policy.
    pub async fn decide(&self, prepared: Prepared) -> Evaluation<S, C> {
        self.decide_ref(&prepared).await
    }

    /// [`decide`](Self::decide), leaving the prepared request with the caller, who can read its
    /// [`keys`](Prepared::keys) next to the decisions (the server's top-keys sketches do).
    pub async fn decide_prepared(&self, prepared: &Prepared) -> Evaluation<S, C> {
        self.decide_ref(prepared).await
    }

    /// Charges a prepared request's costs whatever the quotas say, never refusing: a usage
    /// report (`/v1/check` with `"mode": "report"`, a cost known only once the work was done).
    /// The decisions are admitted and say what each key has left; a failed store is answered
    /// by the one failure rule, as any request.
    pub async fn report_prepared(&self, prepared: &Prepared) -> Evaluation<S, C> {
        if let Some(refusal) = &prepared.refusal {
            return self.refused(refusal);
        }
        let entries = &prepared.entries;
        if entries.is_empty() {
            return self.evaluation(Decisions::new(), HeaderList::new(), Disposition::Pass);
        }
        let checks: SmallVec<[Check<'_>; 4]> = entries.iter().map(|e| self.check(e)).collect();
        let now = self.inner.limiter.clock().now();
        match self.inner.limiter.store().charge(now, &checks).await {
            Ok(decisions) if decisions.len() == entries.len() => {
                let decisions = decisions.at(now);
                let headers = self.render(&decisions, entries);
                self.evaluation(decisions, headers, Disposition::Pass)
            }
            Ok(_) => self.failed(miscounted(), entries),
            Err(e) => self.failed(e.into(), entries),
        }
    }

    /// Decides a prepared request without awaiting, when the store answers at once (the memory
    /// store, see [`Store::is_immediate`]); hands the request back for [`decide`](Self::decide)
    /// otherwise. The evaluation is the one `decide` would give. A caller on a hot path saves the
    /// future it would otherwise have to keep (and usually box) across the store call.
    // Both sides are moved once, on the stack; boxing either would add the allocation per
    // request this function exists to avoid.
    #[allow(clippy::result_large_err)]
    pub fn decide_now(&self, prepared: Prepared) -> Result<Evaluation<S, C>, Prepared> {
        match self.decide_now_ref(&prepared) {
            Some(evaluation) => Ok(evaluation),
            None => Err(prepared),
        }
    }

    /// [`decide_now`](Self::decide_now) without taking the request: `None` when the store
    /// does not answer at once (then [`decide_prepared`](Self::decide_prepared)). The caller
    /// keeps the request, to read its [`keys`](Prepared::keys) next to the decisions.
    pub fn decide_now_ref(&self, prepared: &Prepared) -> Option<Evaluation<S, C>> {
        if !self.inner.limiter.store().is_immediate() || self.may_wait(prepared) {
            return None;
        }
        Some(match self.decide_one_now(prepared) {
            Some(Ok((decision, headers))) => self.evaluation(
                std::iter::once(decision).collect(),
                headers,
                Disposition::Pass,
            ),
            Some(Err(evaluation)) => evaluation,
            None => self.decide_polled(prepared),
        })
    }

    /// What the tower layer needs of [`decide_now`](Self::decide_now): the headers and the
    /// disposition, without the decisions. The request stays with the caller, and an admitted
    /// request (most) returns 136 bytes where an evaluation is 328: both are moves the layer
    /// pays on every request.
    pub(crate) fn disposition_now(&self, prepared: &Prepared) -> Option<Now<S, C>> {
        if !self.inner.limiter.store().is_immediate() || self.may_wait(prepared) {
            return None;
        }
        let mut evaluation = match self.decide_one_now(prepared) {
            Some(Ok((_, headers))) => {
                return Some((RateLimitHeaders(headers), Disposition::Pass, None));
            }
            Some(Err(evaluation)) => evaluation,
            None => self.decide_polled(prepared),
        };
        let settle = evaluation.take_settle();
        let (_, headers, disposition) = evaluation.into_parts();
        Some((headers, disposition, settle))
    }

    /// The general path, polled once on an immediate store.
    pub(super) fn decide_polled(&self, prepared: &Prepared) -> Evaluation<S, C> {
        let decided = {
            let future = std::pin::pin!(self.decide_ref(prepared));
            future.poll(&mut Context::from_waker(Waker::noop()))
        };
        match decided {
            Poll::Ready(evaluation) => evaluation,
            // The store broke its promise; what it was doing is dropped unfinished.
            Poll::Pending => self.failed(pending_immediate_store(), &prepared.entries),
        }
    }

    /// The common request, one rejecting policy, decided by an immediate store: one poll of the
    /// store's single-check future and the headers of one decision, without the general path's
    /// lists and state machine (a tenth of what the layer adds to a request). `Ok` with the
    /// decision and its headers when admitted, `Err` with the evaluation otherwise; `None` for any
    /// other request, before anything is decided.
    #[inline]
    #[allow(clippy::result_large_err)]
    pub(super) fn decide_one_now(
        &self,
        prepared: &Prepared,
    ) -> Option<Result<(Decision, HeaderList), Evaluation<S, C>>> {
        let [entry] = prepared.entries.as_slice() else {
            return None;
        };
        let compiled = &self.inner.policies[entry.index];
        if prepared.refusal.is_some() || compiled.http.action != Action::Reject || compiled.settles
        {
            return None;
        }
        let now = self.inner.limiter.clock().now();
        let future = std::pin::pin!(self.inner.limiter.store().apply_one(now, self.check(entry)));
        let decision = match future.poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(Ok(decision)) => decision,
            Poll::Ready(Err(error)) => {
                return Some(Err(self.failed(error.into(), &prepared.entries)));
            }
            Poll::Pending => {
                return Some(Err(
                    self.failed(pending_immediate_store(), &prepared.entries)
                ));
            }
        };
        if !decision.allowed {
            let decisions = Decisions::from_iter([decision]).at(now);
            let headers = self.render(&decisions, &prepared.entries);
            return Some(Err(self.deny(decisions, headers, &prepared.entries)));
        }
        let headers = render(&self.inner.headers, now, &[(&decision, self.text(entry))]);
        Some(Ok((decision, headers)))
    }

    pub(super) async fn decide_ref(&self, prepared: &Prepared) -> Evaluation<S, C> {
        if let Some(refusal) = &prepared.refusal {
            return self.refused(refusal);
        }
        if prepared.entries.is_empty() {
            return self.evaluation(Decisions::new(), HeaderList::new(), Disposition::Pass);
        }
        let entries = &prepared.entries;
        let mut waited = false;
        let mut evaluation = self.decide_entries(entries, &mut waited).await;
        evaluation.waited_for_slot = waited;
        evaluation
    }

    /// [`decide_ref`](Self::decide_ref) for a request some policy counts; `waited` is set
    /// when it waited in a line for a concurrency slot.
    pub(super) async fn decide_entries(
        &self,
        entries: &[Entry],
        waited: &mut bool,
    ) -> Evaluation<S, C> {
        // Others wait for this key's slots: behind them, without asking first. That wait is
        // the request's whole `max_delay`: it does not wait again once it is over.
        let lined_up = self.must_line_up(entries);
        *waited = lined_up;
        let decided = if lined_up {
            self.wait_for_slot(entries, None).await.map(|(d, _)| d)
        } else {
            self.check_all(&self.checks(entries)).await
        };
        let mut decisions = match decided {
            Ok(d) if d.len() == entries.len() => d,
            Ok(_) => return self.failed(miscounted(), entries),
            Err(e) => return self.failed(e, entries),
        };
        if !lined_up && !decisions.allowed() && self.only_slots_missing(&decisions, entries) {
            *waited = true;
            decisions = match self.wait_for_slot(entries, Some(decisions)).await {
                Ok((d, _)) if d.len() == entries.len() => d,
                Ok(_) => return self.failed(miscounted(), entries),
                Err(e) => return self.failed(e, entries),
            };
        }
        let mut consumed = decisions.allowed();
        if !consumed {
            let enforced_denial = decisions
                .as_slice()
                .iter()
                .zip(entries.iter())
                .any(|(d, e)| !d.allowed && !self.is_shadow(e));
            for (d, e) in decisions.as_slice().iter().zip(entries.iter()) {
                if !d.allowed && self.is_shadow(e) {
                    tracing::debug!(policy = d.policy, "shadow policy would deny this request");
                }
            }
            if !enforced_denial {
                // Only shadow policies deny: the request goes on, so the enforcing policies
                // must count it, in their own all-or-nothing call.
                match self.count_enforced(decisions, entries).await {
                    Ok((counted, admitted)) => (decisions, consumed) = (counted, admitted),
                    Err(evaluation) => return evaluation,
                }
            }
        }
        let headers = self.render(&decisions, entries);
        if !consumed {
            return self.deny(decisions, headers, entries);
        }
        self.admitted(decisions, headers, entries)
    }

    /// The answer to a request refused before any count: 401 without a required key, 400 for
    /// a field the request cannot be read by (a key field sent twice, a client address a trusted
    /// proxy reported unreadably), 414 for a path too deep to normalise.
    pub(super) fn refused(&self, refusal: &Refusal) -> Evaluation<S, C> {
        tracing::debug!(%refusal, "request refused before any policy counted it");
        let answer = Answer::new(refusal.status(), HeaderList::new(), refusal.body());
        self.evaluation(
            Decisions::new(),
            HeaderList::new(),
            Disposition::Respond(answer),
        )
    }

    /// When only shadow policies denied: the enforcing policies count the request in their own
    /// all-or-nothing call. Their decisions replace the first ones (shadow ones stay), with
    /// whether they admitted; `Err` is the evaluation to answer at once.
    pub(super) async fn count_enforced(
        &self,
        decisions: Decisions,
        entries: &[Entry],
    ) -> Result<(Decisions, bool), Evaluation<S, C>> {
        let enforced: SmallVec<[Check<'_>; 4]> = entries
            .iter()
            .filter(|e| !self.is_shadow(e))
            .map(|e| self.check(e))
            .collect();
        if enforced.is_empty() {
            let headers = self.render(&decisions, entries);
            return Err(self.evaluation(decisions, headers, Disposition::Pass));
        }
        let again = match self.check_all(&enforced).await {
            Ok(d) => d,
            Err(e) => return Err(self.failed(e, entries)),
        };
        let admitted = again.allowed();
        // The first decisions' instant, the earlier: the shadow policies' resets count from
        // it, and the enforcing policies', from a moment later, are then off by that moment
        // at most, never past a window's whole-second end.
        let at = decisions.decided_at();
        let mut again = again.into_iter();
        let decisions = decisions
            .into_iter()
            .zip(entries.iter())
            .map(|(d, e)| {
                if self.is_shadow(e) {
                    Some(d)
                } else {
                    again.next()
                }
            })
            .collect::<Option<Decisions>>()
            .unwrap_or_default();
        if decisions.len() != entries.len() {
            return Err(self.failed(miscounted(), entries));
        }
        let decisions = match at {
            Some(at) => decisions.at(at),
            None => decisions,
        };
        Ok((decisions, admitted))
    }

    /// An admitted request: held for the longest slot a `delay` policy asks for, or passed.
    pub(super) fn admitted(
        &self,
        decisions: Decisions,
        headers: HeaderList,
        entries: &[Entry],
    ) -> Evaluation<S, C> {
        let delay = decisions
            .as_slice()
            .iter()
            .zip(entries.iter())
            .filter(|(_, e)| matches!(self.action(e), Action::Delay { .. }))
            .filter_map(|(d, _)| d.delay)
            .max();
        let settle = self.settle_for(&decisions, entries);
        let mut evaluation = match delay {
            Some(delay) if !delay.is_zero() => {
                let hold = Hold {
                    delay,
                    guard: Some(RefundGuard {
                        engine: self.clone(),
                        // A concurrency slot is given back by the request's settle, held
                        // or not: only the others' quota is refunded here.
                        entries: entries
                            .iter()
                            .filter(|e| {
                                !self.is_shadow(e) && !self.inner.policies[e.index].concurrent
                            })
                            .cloned()
                            .collect(),
                        armed: true,
                    }),
                };
                self.evaluation(decisions, headers, Disposition::Hold(hold))
            }
            _ => self.evaluation(decisions, headers, Disposition::Pass),
        };
        evaluation.settle = settle;
        evaluation
    }

    /// The true-up of an admitted request: the policies that counted it and charge by its
    /// response (`charge = "response"`, `count_status`); `None` when there are none.
    pub(super) fn settle_for(
        &self,
        decisions: &Decisions,
        entries: &[Entry],
    ) -> Option<Box<Settle<S, C>>> {
        let due = |(d, e): &(&tollgate::Decision, &Entry)| {
            d.allowed && self.inner.policies[e.index].settles
        };
        let pairs = || decisions.as_slice().iter().zip(entries.iter());
        if !pairs().any(|p| due(&p)) {
            return None;
        }
        let concurrent = |e: &Entry| self.inner.policies[e.index].concurrent;
        let dues = pairs()
            .filter(|p| due(p) && !concurrent(p.1))
            .map(|(_, e)| e.clone());
        let slots = pairs()
            .filter(|p| due(p) && concurrent(p.1))
            .map(|(_, e)| e.clone())
            .collect();
        Some(Box::new(Settle::new(self.clone(), dues, slots)))
    }

    pub(super) fn evaluation(
        &self,
        decisions: Decisions,
        headers: HeaderList,
        disposition: Disposition<S, C>,
    ) -> Evaluation<S, C> {
        Evaluation {
            decisions,
            headers,
            disposition,
            store_failed: false,
            settle: None,
            waited_for_slot: false,
        }
    }

    /// The limiter's `check_all`, with the store's single-check path for the common request that
    /// one policy applies to, the decisions recorded with the time they were decided at (what
    /// the headers' absolute reset time counts from). Costs were checked against their quotas
    /// when the engine was built.
    pub(super) async fn check_all(&self, checks: &[Check<'_>]) -> Result<Decisions, Error> {
        let now = self.inner.limiter.clock().now();
        if let [check] = checks {
            let decision = self.inner.limiter.store().apply_one(now, *check).await?;
            self.inner.outage.answered();
            return Ok(Decisions::from_iter([decision]).at(now));
        }
        let decisions = self.inner.limiter.check_all_at(now, checks).await?;
        self.inner.outage.answered();
        Ok(decisions.at(now))
    }

    pub(super) fn check<'e>(&'e self, entry: &'e Entry) -> Check<'e> {
        let http = &self.inner.policies[entry.index].http;
        let policy = entry.over.as_ref().map_or(&http.policy, |o| &o.policy);
        Check::new(policy, &entry.key, entry.cost).with_permit(entry.permit)
    }

    /// The header text of the quota `entry` is decided under: its override's, or its policy's.
    pub(super) fn text(&self, entry: &Entry) -> PolicyText {
        match &entry.over {
            Some(over) => PolicyText::Override(Arc::clone(&over.text)),
            None => PolicyText::Interned(self.inner.policies[entry.index].text),
        }
    }

    pub(super) fn action(&self, entry: &Entry) -> Action {
        self.inner.policies[entry.index].http.action
    }

    pub(super) fn is_shadow(&self, entry: &Entry) -> bool {
        self.action(entry) == Action::Shadow
    }
}

/// A store that answered a different number of decisions than it was asked for is broken: its
/// answer is treated as a failure, not trusted.
pub(super) fn miscounted() -> Error {
    Error::from(tollgate::StoreError::Protocol {
        reason: "the store answered a different number of decisions than checks".to_owned(),
    })
}

/// A store that said it answers immediately left a decision pending: treated as a failure, so
/// the configured fail mode decides.
fn pending_immediate_store() -> Error {
    Error::from(tollgate::StoreError::Protocol {
        reason: "an immediate store left a decision pending".to_owned(),
    })
}
