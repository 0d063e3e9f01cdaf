//! The policy engine: which policies a request falls under, whose key it is counted against,
//! what the limiter decides, and what to answer. Independent of tower, so the server's proxy,
//! check API and forward-auth endpoint use it exactly as the layer does.
//!
//! One request is two steps: [`Engine::prepare`] (synchronous: route matching, key selection,
//! JWT verification) and [`Engine::decide`] (one `check_all` against the store, all-or-nothing
//! across every matching policy). [`Engine::evaluate`] does both.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, StatusCode};
use smallvec::SmallVec;
use tollgate::{Clock, Decisions, Limiter, MemoryStore, OnError, Store, SystemClock};

use crate::headers::PolicyHeaders;
use crate::key::{CredentialHasher, KeyBuf, KeyContext};
use crate::route::{NormalizedPath, PathTooDeep};
use crate::{HeaderConfig, JwtVerifier, Refusal, RequestInfo, normalize};

mod bans;
mod builder;
mod decide;
mod evaluation;
mod lists;
mod outage;
pub(crate) mod overrides;
mod permits;
mod policy;
mod queue;
mod respond;
mod settle;
mod slot_lease;

pub use bans::BANNED_TITLE;
pub use builder::EngineBuilder;
pub use evaluation::{Answer, Disposition, Evaluation, Hold, Prepared, RateLimitHeaders};
use evaluation::{Entry, RefundGuard};
pub use lists::{ListAction, ListEntry, ListHit, ListSpec};
pub use permits::REMOTE_POLL;
pub use policy::{Action, HttpPolicy};
pub use queue::QueueTicket;
pub use settle::{Charge, Settle, StatusSet, UsageCounters};
pub use slot_lease::LeaseError;

use overrides::{KeyOverride, Overrides};

/// The key a request without one is counted under (per policy), unless the policy requires a
/// key. Selector keys always contain a `:`, so no request can claim this one.
pub const ANONYMOUS_KEY: &[u8] = b"anonymous";

/// The default bound on a held request's wait with the `delay` action.
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(10);

/// A policy with everything a request needs precomputed.
#[derive(Debug)]
struct Compiled {
    http: HttpPolicy,
    text: &'static PolicyHeaders,
    /// Whether an admitted request has something to do when its exchange ends: a true-up
    /// once its response is known (`charge = "response"` or `count_status`), or a slot to
    /// give back (a concurrency limit).
    settles: bool,
    /// A concurrency limit: each request takes a permit.
    concurrent: bool,
    /// A concurrency limit with `delay`: a request denied a slot waits in line for one.
    waits: bool,
    /// This instance's slots of a concurrency limit, for metrics.
    slots: permits::SlotCounts,
    /// Responses charged the fallback because their cost was missing or bad.
    usage: Arc<settle::UsageCount>,
}

/// What the tower layer takes of a decision made at once: the headers, what to do, and the
/// true-up to hand the response to.
pub(crate) type Now<S, C> = (
    RateLimitHeaders,
    Disposition<S, C>,
    Option<Box<Settle<S, C>>>,
);

/// Finds a client address from the request; the engine's default reads the peer and, from
/// trusted proxies, the forwarding header.
type ResolveIp = dyn Fn(&RequestInfo<'_>) -> Result<Option<IpAddr>, Refusal> + Send + Sync;

struct Inner<S, C> {
    limiter: Limiter<S, C>,
    policies: Vec<Compiled>,
    headers: HeaderConfig,
    jwt: Option<JwtVerifier>,
    hasher: CredentialHasher,
    ipv6_prefix: u8,
    on_error: OnError,
    resolve_ip: Box<ResolveIp>,
    /// Whether some route matches on the path; if none does, requests skip normalising it.
    reads_path: bool,
    /// Whether some route matches on the host; if none does, the layer does not look it up.
    reads_host: bool,
    /// The request headers a decision can read (see [`Engine::headers_read`]).
    headers_read: Vec<HeaderName>,
    /// Per-key quotas in place of the policies' own.
    overrides: Overrides,
    /// Requests waiting for a concurrency slot, by policy and key.
    lines: permits::Lines,
    /// The key lease tokens are signed under.
    lease_tag: tollgate::key_digest::KeyDigest,
    /// Allow and deny lists, applied before any policy.
    lists: lists::Lists,
    /// The log of store failures: rate-limited, and told when they end.
    outage: outage::Outage,
}

impl<S, C> fmt::Debug for Inner<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("policies", &self.policies)
            .field("headers", &self.headers)
            .field("jwt", &self.jwt)
            .field("ipv6_prefix", &self.ipv6_prefix)
            .field("on_error", &self.on_error)
            .finish_non_exhaustive()
    }
}

/// The policy engine. Cheap to clone; clones share the limiter, the store and the policies.
#[derive(Debug)]
pub struct Engine<S = MemoryStore, C = SystemClock> {
    // One shared allocation, the limiter inside: a clone per request (as tower services make)
    // is one reference-count update, which matters when cores contend for it.
    inner: Arc<Inner<S, C>>,
}

impl<S, C> Clone for Engine<S, C> {
    fn clone(&self) -> Self {
        Engine {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S: Store, C: Clock> Engine<S, C> {
    /// The rate-limit headers for decisions of this engine's policies made outside a request, by a
    /// decision API that checks a policy by name (the server's `/v1/check`): the same headers a
    /// request through the layer gets, `Retry-After` included when denied. Empty when a decision
    /// comes from a policy this engine does not have.
    pub fn headers_for(&self, decisions: &Decisions) -> RateLimitHeaders {
        self.headers_for_overridden(decisions, &[])
    }

    /// [`headers_for`](Self::headers_for) decisions of which the i-th was made under the
    /// override `overrides[i]` when there is one (see [`Engine::key_override`]).
    pub fn headers_for_overridden(
        &self,
        decisions: &Decisions,
        overrides: &[Option<Arc<KeyOverride>>],
    ) -> RateLimitHeaders {
        let indexes: SmallVec<[usize; 4]> = decisions
            .as_slice()
            .iter()
            .filter_map(|d| {
                self.inner
                    .policies
                    .iter()
                    .position(|p| p.http.policy.name() == d.policy)
            })
            .collect();
        if indexes.len() != decisions.len() {
            return RateLimitHeaders::default();
        }
        let mut headers = self.render_at(decisions, &indexes, overrides);
        if !decisions.allowed()
            && let Some((_, field)) = self.retry_after_at(decisions, &headers, &indexes)
        {
            headers.set_retry(field);
        }
        RateLimitHeaders(headers)
    }

    /// The limiter (for checks by policy name, such as the server's `/v1/check`).
    pub fn limiter(&self) -> &Limiter<S, C> {
        &self.inner.limiter
    }

    /// The policies, in order.
    pub fn policies(&self) -> impl Iterator<Item = &HttpPolicy> {
        self.inner.policies.iter().map(|c| &c.http)
    }

    /// The request headers a decision can read: each `header:` key selector's, `Authorization`
    /// when some key is a `jwt:` claim, and the forwarding header read from trusted proxies.
    /// (`Host` is [`RequestInfo::host`].) A caller that hands the engine a reduced header map,
    /// as the server's relay does, copies these and needs nothing else.
    pub fn headers_read(&self) -> &[HeaderName] {
        &self.inner.headers_read
    }

    /// Whether some policy's route matches on the host.
    pub(crate) fn reads_host(&self) -> bool {
        self.inner.reads_host
    }

    /// The header settings.
    pub fn header_config(&self) -> &HeaderConfig {
        &self.inner.headers
    }

    /// Matches the request against the policies and selects its keys.
    pub fn prepare(&self, info: &RequestInfo<'_>) -> Prepared {
        let mut prepared = Prepared::default();
        let path = if self.inner.reads_path {
            match NormalizedPath::new(info.path) {
                Ok(path) => path,
                Err(PathTooDeep) => {
                    let refusal = Refusal::new(StatusCode::URI_TOO_LONG, "URI Too Long", "")
                        .with_detail(format!("The request {PathTooDeep}."));
                    prepared.refusal = Some(Box::new(refusal));
                    return prepared;
                }
            }
        } else {
            NormalizedPath::default()
        };
        let cx = KeyContext {
            info,
            jwt: self.inner.jwt.as_ref(),
            claims: Default::default(),
            client_ip: Default::default(),
            resolve_ip: &*self.inner.resolve_ip,
            ipv6_prefix: self.inner.ipv6_prefix,
        };
        if self.apply_lists(&cx, &mut prepared) {
            return prepared;
        }
        for (index, policy) in self.inner.policies.iter().enumerate() {
            let http = &policy.http;
            if !http.route.matches(info.method, &path, info.host) {
                continue;
            }
            let mut key = KeyBuf::new();
            let found = match cx.key(&http.keys, &self.inner.hasher, &mut key) {
                Ok(found) => found,
                Err(refusal) => {
                    prepared.refusal = Some(Box::new(refusal));
                    prepared.entries.clear();
                    return prepared;
                }
            };
            if !found {
                if http.require_key {
                    prepared.refusal = Some(Box::new(key_required(http.policy.name())));
                    prepared.entries.clear();
                    return prepared;
                }
                key.clear();
                key.extend_from_slice(ANONYMOUS_KEY);
            }
            let over = self.live_override(index, &key);
            let cost = http.cost;
            prepared.entries.push(Entry {
                index,
                key,
                cost,
                over,
                permit: self.permit_for(index),
            });
        }
        if !prepared.entries.is_empty()
            && let Err(refusal) = readable(info)
        {
            prepared.refusal = Some(Box::new(refusal));
            prepared.entries.clear();
        }
        prepared
    }

    /// Prepares a check of `key` under the policy named `policy` for `cost`, as the doors that
    /// name a policy do (`/v1/check` by policy, the Redis-protocol door): the key is counted as
    /// [`store_key`](Self::store_key) writes it, under its override when it has one, and
    /// decided like any request (the same failure rule, headers and 429). `None` for a policy
    /// this engine does not have.
    pub fn prepare_key(&self, policy: &str, key: &[u8], cost: u32) -> Option<Prepared> {
        let index = self
            .inner
            .policies
            .iter()
            .position(|p| p.http.policy.name() == policy)?;
        let mut stored = KeyBuf::new();
        self.store_key(key, &mut stored);
        let mut prepared = Prepared::default();
        if self.apply_key_lists(&stored, &mut prepared) {
            return Some(prepared);
        }
        let over = self.live_override(index, &stored);
        prepared.entries.push(Entry {
            index,
            key: stored,
            cost,
            over,
            permit: self.permit_for(index),
        });
        Some(prepared)
    }

    /// Appends the key a store counts a caller's `key` under (a key given by name rather than
    /// selected from a request): the core's long-key rule
    /// ([`KeyDigest::write_key`](tollgate::key_digest::KeyDigest::write_key)) under the
    /// engine's key secret. This is the form `/v1/top` shows and overrides and lists take.
    pub fn store_key(&self, key: &[u8], out: &mut impl Extend<u8>) {
        self.inner.hasher.write_key(key, out);
    }

    /// A fresh permit for a request under the policy at `index` when it is a concurrency
    /// limit; 0 (none) otherwise.
    #[inline]
    fn permit_for(&self, index: usize) -> u64 {
        if self.inner.policies[index].concurrent {
            tollgate::next_permit()
        } else {
            0
        }
    }

    /// Whether deciding `prepared` may wait for a concurrency slot, which only the general,
    /// awaited path does.
    fn may_wait(&self, prepared: &Prepared) -> bool {
        prepared.entries.iter().any(|e| self.waits(e.index))
    }

    /// The override of `key` under the policy at `index`, if one applies now. The clock is
    /// read only for a key that has one.
    #[inline]
    fn live_override(&self, index: usize, key: &[u8]) -> Option<Arc<KeyOverride>> {
        let over = self.inner.overrides.get(index, key)?;
        over.applies_at(self.inner.limiter.clock().now())
            .then_some(over)
    }
}

/// Whether the request's target and host read the same to the routes as to the upstream, by
/// the readings every door shares ([`normalize`]): a target with a fragment or a byte outside
/// visible ASCII, a host with an empty port, are refused as at every door. Checked only for a
/// request some policy counts; a door that read them already (the proxy, forward-auth,
/// `/v1/check`) has refused what would fail here.
fn readable(info: &RequestInfo<'_>) -> Result<(), Refusal> {
    const TARGET: &str = "the request target";
    let visible = |b: &u8| (0x21..=0x7e).contains(b) && *b != b'#';
    let path_ok = info.path.starts_with('/') && info.path.bytes().all(|b| visible(&b));
    let query_ok = info.query.is_none_or(|q| q.bytes().all(|b| visible(&b)));
    if !(path_ok && query_ok) {
        // The shared reading's own refusal, with its wording.
        normalize::target(b"", TARGET)?;
    }
    let host = info.host.map(str::as_bytes).or_else(|| {
        info.headers
            .get(http::header::HOST)
            .map(http::HeaderValue::as_bytes)
    });
    if let Some(host) = host {
        normalize::authority(host, "Host")?;
    }
    Ok(())
}

/// The 401 of a request without a key for `policy`, which requires one.
fn key_required(policy: &str) -> Refusal {
    let mut detail =
        String::from("This request needs a key (API key, token or identity) for policy ");
    // The name inside quotes, as JSON would escape it.
    detail.push_str(&serde_json::Value::from(policy).to_string());
    Refusal::new(StatusCode::UNAUTHORIZED, "Unauthorized", "").with_detail(detail)
}
