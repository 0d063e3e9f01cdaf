//! The engine's answers: the rate-limit headers rendered from decisions, `Retry-After` by the
//! core's one rule, the 429, and what a store failure turns into under the fail mode.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use smallvec::SmallVec;
use tollgate::headers::{aggregate_retry_after, t_secs};
use tollgate::{Clock, Decision, Decisions, Error, ErrorKind, Store, Timestamp};

use crate::headers::{HeaderList, PolicyText, Retry, render_reporting, retry_after};
use crate::problem;

use super::{Action, Answer, Disposition, Engine, Entry, Evaluation, KeyOverride};

impl<S: Store, C: Clock> Engine<S, C> {
    pub(super) fn render(&self, decisions: &Decisions, entries: &[Entry]) -> HeaderList {
        let items: SmallVec<[(&Decision, PolicyText); 4]> = decisions
            .as_slice()
            .iter()
            .zip(entries.iter())
            .map(|(d, e)| (d, self.text(e)))
            .collect();
        let shadow: SmallVec<[bool; 4]> = entries.iter().map(|e| self.is_shadow(e)).collect();
        render_reporting(
            &self.inner.headers,
            self.decided_at(decisions),
            &items,
            &shadow,
        )
    }

    /// The headers for `decisions`, the i-th made by the policy at `indexes[i]`, under the
    /// quota `overrides[i]` when there is one.
    pub(super) fn render_at(
        &self,
        decisions: &Decisions,
        indexes: &[usize],
        overrides: &[Option<Arc<KeyOverride>>],
    ) -> HeaderList {
        let items: SmallVec<[(&Decision, PolicyText); 4]> = decisions
            .as_slice()
            .iter()
            .zip(indexes.iter())
            .enumerate()
            .map(|(n, (d, &i))| match overrides.get(n) {
                Some(Some(over)) => (d, PolicyText::Override(Arc::clone(&over.text))),
                _ => (d, PolicyText::Interned(self.inner.policies[i].text)),
            })
            .collect();
        let shadow: SmallVec<[bool; 4]> = indexes
            .iter()
            .map(|&i| self.inner.policies[i].http.action == Action::Shadow)
            .collect();
        render_reporting(
            &self.inner.headers,
            self.decided_at(decisions),
            &items,
            &shadow,
        )
    }

    /// What `decisions`' resets count from: the time they were decided at, or now when that
    /// was not recorded.
    fn decided_at(&self, decisions: &Decisions) -> Timestamp {
        decisions
            .decided_at()
            .unwrap_or_else(|| self.inner.limiter.clock().now())
    }

    /// `Retry-After` for denied `decisions` (the i-th made by the policy at `indexes[i]`): it
    /// covers every enforcing policy that denied, never earlier than the `t` in `headers`;
    /// shadow denials never delay. `None` when some denial can never pass.
    pub(super) fn retry_after_at(
        &self,
        decisions: &Decisions,
        headers: &HeaderList,
        indexes: &[usize],
    ) -> Option<(u64, Retry)> {
        let now = self.decided_at(decisions);
        let denials: SmallVec<[&Decision; 4]> = decisions
            .as_slice()
            .iter()
            .zip(indexes.iter())
            .filter(|(d, i)| !d.allowed && self.inner.policies[**i].http.action != Action::Shadow)
            .map(|(d, _)| d)
            .collect();
        let mut floor = denials.iter().map(|d| t_secs(d)).max().unwrap_or(0);
        // The core's one rule; with no enforcing denial there is nothing to wait for.
        let wait = if denials.is_empty() {
            Some(Duration::ZERO)
        } else {
            aggregate_retry_after(denials.iter().copied())
        };
        // RateLimit's `t` may come from another denying policy: never answer earlier than it.
        if let Some(t) = headers.t() {
            floor = floor.max(t);
        }
        wait.map(|w| retry_after(self.inner.headers.retry_after_format, now, w, floor))
    }

    /// The 429.
    pub(super) fn deny(
        &self,
        decisions: Decisions,
        mut headers: HeaderList,
        entries: &[Entry],
    ) -> Evaluation<S, C> {
        let indexes: SmallVec<[usize; 4]> = entries.iter().map(|e| e.index).collect();
        let retry = self.retry_after_at(&decisions, &headers, &indexes);
        let violated = decisions
            .as_slice()
            .iter()
            .zip(entries.iter())
            .filter(|(d, e)| !d.allowed && !self.is_shadow(e))
            .map(|(d, _)| d.policy);
        tracing::debug!(policies = ?violated.clone().collect::<SmallVec<[&str; 4]>>(), "rate limited");
        let retry_secs = retry.as_ref().map(|(s, _)| *s);
        let body = match self.ban_of(&decisions, entries) {
            Some((banning, until)) => super::bans::banned_body(&banning, until, retry_secs),
            None => problem::quota_exceeded(violated, retry_secs),
        };
        if let Some((_, field)) = retry {
            headers.set_retry(field);
        }
        let mut answer = Answer::new(StatusCode::TOO_MANY_REQUESTS, headers.clone(), body);
        answer.queue = self.queue_ticket(&decisions, entries);
        self.evaluation(decisions, headers, Disposition::Respond(answer))
    }

    /// The enforcing policies whose bans refused the request, and when the last one ends;
    /// `None` when no ban did.
    fn ban_of(
        &self,
        decisions: &Decisions,
        entries: &[Entry],
    ) -> Option<(SmallVec<[&'static str; 2]>, tollgate::Timestamp)> {
        let banning: SmallVec<[&Decision; 2]> = decisions
            .as_slice()
            .iter()
            .zip(entries.iter())
            .filter(|(d, e)| !d.allowed && d.ban.is_ban() && !self.is_shadow(e))
            .map(|(d, _)| d)
            .collect();
        let longest = banning.iter().filter_map(|d| d.retry_after).max()?;
        let until = self.inner.limiter.clock().now().saturating_add(longest);
        Some((banning.iter().map(|d| d.policy).collect(), until))
    }

    pub(super) fn failed(&self, error: Error, entries: &[Entry]) -> Evaluation<S, C> {
        match error.kind() {
            ErrorKind::CostExceedsQuota { policy, .. } => {
                // Cannot happen for configured costs (the builder refuses them); answered as
                // a denial no wait fixes: 429 with no Retry-After, since waiting never helps.
                let body = problem::quota_exceeded([policy.as_str()].into_iter(), None);
                let answer = Answer::new(StatusCode::TOO_MANY_REQUESTS, HeaderList::new(), body);
                self.evaluation(
                    Decisions::new(),
                    HeaderList::new(),
                    Disposition::Respond(answer),
                )
            }
            _ => {
                let names: SmallVec<[&str; 4]> = entries
                    .iter()
                    .map(|e| self.inner.policies[e.index].http.policy.name())
                    .collect();
                self.inner
                    .outage
                    .failed(&error, &names, self.inner.on_error);
                // A shadow policy never blocks, not even for want of a store: a request only
                // shadow policies apply to goes on whatever `on_error` says.
                let only_shadow = entries.iter().all(|e| self.is_shadow(e));
                let mut evaluation = if self.inner.on_error.admits() || only_shadow {
                    // Fail open: no quota was counted, so none is reported.
                    self.evaluation(Decisions::new(), HeaderList::new(), Disposition::Pass)
                } else {
                    // Fail closed: unavailable, not "too many requests" (the client may be
                    // well within its quota).
                    let answer = Answer::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        HeaderList::retry_soon(),
                        problem::unavailable(),
                    );
                    self.evaluation(
                        Decisions::new(),
                        HeaderList::new(),
                        Disposition::Respond(answer),
                    )
                };
                evaluation.store_failed = true;
                evaluation
            }
        }
    }
}
