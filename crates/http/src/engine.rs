//! The policy engine: which policies a request falls under, whose key it is counted against,
//! what the limiter decides, and what to answer. Independent of tower, so the server's proxy,
//! check API and forward-auth endpoint use it exactly as the layer does.
//!
//! One request is two steps: [`Engine::prepare`] (synchronous: route matching, key selection,
//! JWT verification) and [`Engine::decide`] (one `check_all` against the store, all-or-nothing
//! across every matching policy). [`Engine::evaluate`] does both.

use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use smallvec::SmallVec;
use tollgate::{
    Check, Clock, Decision, Decisions, Error, Limiter, MemoryStore, Policy, Quota, Store,
    SystemClock,
};

use crate::client_ip::{ForwardedHeader, client_ip};
use crate::headers::{
    Field, HeaderList, PolicyHeaders, render, retry_after, retry_soon, t_of, write_lines,
};
use crate::key::DuplicateField;
use crate::key::{CredentialHasher, KeyBuf, KeyContext};
use crate::route::{NormalizedPath, PathTooDeep};
use crate::{
    ConfigError, HeaderConfig, JwtVerifier, KeyChain, KeySelector, RequestInfo, RouteMatch,
    TrustedProxies, problem,
};
use tollgate::headers::{aggregate_retry_after, t_secs};

mod queue;
pub use queue::QueueTicket;
pub(crate) mod overrides;

use overrides::{KeyOverride, Overrides};

/// The key a request without one is counted under (per policy), unless the policy requires a
/// key. Selector keys always contain a `:`, so no request can claim this one.
pub const ANONYMOUS_KEY: &[u8] = b"anonymous";

/// The default bound on a held request's wait with the `delay` action.
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(10);

/// What happens to a request a policy denies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Answer 429.
    Reject,
    /// Leaky bucket: hold the request until its slot, at most `max_delay`, then pass it on;
    /// answer 429 when the wait would be longer.
    Delay {
        /// The longest a request is held.
        max_delay: Duration,
    },
    /// Never block: count, log at debug level and report in the headers what would have
    /// happened. For rolling out a new policy safely.
    Shadow,
    /// Leaky bucket: a request over the rate is stored and delivered later at the policy's
    /// rate. The engine answers it 429 like [`Action::Reject`], with a [`QueueTicket`] on the
    /// answer ([`Answer::queue_ticket`]) for a caller that can queue it (the server's proxy);
    /// every other caller simply answers the 429.
    Queue,
}

impl Action {
    /// `"reject"`, `"delay"` (with `max_delay`, default [`DEFAULT_MAX_DELAY`]), `"shadow"` or
    /// `"queue"`.
    pub fn parse(input: &str, max_delay: Option<Duration>) -> Result<Self, ConfigError> {
        match input.trim() {
            "reject" => Ok(Action::Reject),
            "delay" => Ok(Action::Delay {
                max_delay: max_delay.unwrap_or(DEFAULT_MAX_DELAY),
            }),
            "shadow" => Ok(Action::Shadow),
            "queue" => Ok(Action::Queue),
            _ => Err(ConfigError::new(
                input,
                "use \"reject\", \"delay\", \"shadow\" or \"queue\"",
            )),
        }
    }
}

impl Action {
    /// The configuration name: `"reject"`, `"delay"`, `"shadow"` or `"queue"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Reject => "reject",
            Action::Delay { .. } => "delay",
            Action::Shadow => "shadow",
            Action::Queue => "queue",
        }
    }
}

impl FromStr for Action {
    type Err = ConfigError;

    fn from_str(input: &str) -> Result<Self, ConfigError> {
        Action::parse(input, None)
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Reject => f.write_str("reject"),
            Action::Delay { max_delay } => write!(f, "delay (max {max_delay:?})"),
            Action::Shadow => f.write_str("shadow"),
            Action::Queue => f.write_str("queue"),
        }
    }
}

/// What the engine does when the store fails (after the store's own timeout and fallback).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FailMode {
    /// Let the request through without rate-limit headers and log a warning (the default:
    /// an outage of the limiter should not become an outage of the API).
    #[default]
    Allow,
    /// Answer 503 with a generic problem+json body and `Retry-After: 1`.
    Deny,
}

impl FromStr for FailMode {
    type Err = ConfigError;

    fn from_str(input: &str) -> Result<Self, ConfigError> {
        match input.trim() {
            "allow" => Ok(FailMode::Allow),
            "deny" => Ok(FailMode::Deny),
            _ => Err(ConfigError::new(input, "use \"allow\" or \"deny\"")),
        }
    }
}

/// A policy as HTTP sees it: the core policy (algorithm and quota) plus where its keys come
/// from, which requests it applies to, what a request costs and what a denial does.
#[derive(Clone, Debug)]
pub struct HttpPolicy {
    /// Name, algorithm and quota.
    pub policy: Policy,
    /// Key selectors, first present wins.
    pub keys: KeyChain,
    /// Which requests it applies to.
    pub route: RouteMatch,
    /// What one request costs.
    pub cost: u32,
    /// What a denial does.
    pub action: Action,
    /// Answer 401 rather than count a request with no key under the anonymous key.
    pub require_key: bool,
}

impl HttpPolicy {
    /// `policy` for every request, keyed by client IP, cost 1, rejecting.
    pub fn new(policy: Policy) -> Self {
        HttpPolicy {
            policy,
            keys: KeyChain::new([KeySelector::Ip]),
            route: RouteMatch::any(),
            cost: 1,
            action: Action::Reject,
            require_key: false,
        }
    }

    /// Sets the key selectors.
    pub fn keys(mut self, keys: KeyChain) -> Self {
        self.keys = keys;
        self
    }

    /// Sets the route.
    pub fn route(mut self, route: RouteMatch) -> Self {
        self.route = route;
        self
    }

    /// Sets the cost.
    pub fn cost(mut self, cost: u32) -> Self {
        self.cost = cost;
        self
    }

    /// Sets the action.
    pub fn action(mut self, action: Action) -> Self {
        self.action = action;
        self
    }

    /// Sets whether a key is required.
    pub fn require_key(mut self, require: bool) -> Self {
        self.require_key = require;
        self
    }
}

/// A policy with everything a request needs precomputed.
#[derive(Debug)]
struct Compiled {
    http: HttpPolicy,
    text: PolicyHeaders,
}

/// Finds a client address from the request; the engine's default reads the peer and, from
/// trusted proxies, the forwarding header.
type ResolveIp = dyn Fn(&RequestInfo<'_>) -> Option<IpAddr> + Send + Sync;

struct Inner<S, C> {
    limiter: Limiter<S, C>,
    policies: Vec<Compiled>,
    headers: HeaderConfig,
    jwt: Option<JwtVerifier>,
    hasher: CredentialHasher,
    ipv6_prefix: u8,
    fail_mode: FailMode,
    resolve_ip: Box<ResolveIp>,
    /// Whether some route matches on the path; if none does, requests skip normalising it.
    reads_path: bool,
    /// The request headers a decision can read (see [`Engine::headers_read`]).
    headers_read: Vec<HeaderName>,
    /// Per-key quotas in place of the policies' own.
    overrides: Overrides,
}

impl<S, C> fmt::Debug for Inner<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("policies", &self.policies)
            .field("headers", &self.headers)
            .field("jwt", &self.jwt)
            .field("ipv6_prefix", &self.ipv6_prefix)
            .field("fail_mode", &self.fail_mode)
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

/// Builds an [`Engine`].
pub struct EngineBuilder<S, C> {
    store: S,
    clock: C,
    policies: Vec<HttpPolicy>,
    headers: HeaderConfig,
    trusted: TrustedProxies,
    forwarded: ForwardedHeader,
    ipv6_prefix: u8,
    jwt: Option<JwtVerifier>,
    key_secret: Vec<u8>,
    fail_mode: FailMode,
}

impl<S, C> fmt::Debug for EngineBuilder<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineBuilder")
            .field("policies", &self.policies)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// A builder with the in-memory store and the system clock.
    pub fn builder() -> EngineBuilder<MemoryStore, SystemClock> {
        EngineBuilder {
            store: MemoryStore::default(),
            clock: SystemClock::new(),
            policies: Vec::new(),
            headers: HeaderConfig::default(),
            trusted: TrustedProxies::none(),
            forwarded: ForwardedHeader::default(),
            ipv6_prefix: 64,
            jwt: None,
            key_secret: Vec::new(),
            fail_mode: FailMode::default(),
        }
    }
}

impl<S, C> EngineBuilder<S, C> {
    /// Keeps state in `store`.
    pub fn store<S2: Store>(self, store: S2) -> EngineBuilder<S2, C> {
        EngineBuilder {
            store,
            clock: self.clock,
            policies: self.policies,
            headers: self.headers,
            trusted: self.trusted,
            forwarded: self.forwarded,
            ipv6_prefix: self.ipv6_prefix,
            jwt: self.jwt,
            key_secret: self.key_secret,
            fail_mode: self.fail_mode,
        }
    }

    /// Reads time (and sleeps held requests) with `clock`.
    pub fn clock<C2: Clock>(self, clock: C2) -> EngineBuilder<S, C2> {
        EngineBuilder {
            store: self.store,
            clock,
            policies: self.policies,
            headers: self.headers,
            trusted: self.trusted,
            forwarded: self.forwarded,
            ipv6_prefix: self.ipv6_prefix,
            jwt: self.jwt,
            key_secret: self.key_secret,
            fail_mode: self.fail_mode,
        }
    }

    /// Adds a policy. Policies are checked in the order they are added.
    pub fn policy(mut self, policy: HttpPolicy) -> Self {
        self.policies.push(policy);
        self
    }

    /// Adds policies.
    pub fn policies(mut self, policies: impl IntoIterator<Item = HttpPolicy>) -> Self {
        self.policies.extend(policies);
        self
    }

    /// Which headers responses carry.
    pub fn headers(mut self, headers: HeaderConfig) -> Self {
        self.headers = headers;
        self
    }

    /// The proxies whose forwarding headers are believed (default: none).
    pub fn trusted_proxies(mut self, trusted: TrustedProxies) -> Self {
        self.trusted = trusted;
        self
    }

    /// Which forwarding header trusted proxies write (default `X-Forwarded-For`).
    pub fn forwarded_header(mut self, header: ForwardedHeader) -> Self {
        self.forwarded = header;
        self
    }

    /// How many leading bits of an IPv6 address form one client (default 64).
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits;
        self
    }

    /// Verifies Bearer tokens for `jwt:<claim>` selectors.
    pub fn jwt(mut self, verifier: JwtVerifier) -> Self {
        self.jwt = Some(verifier);
        self
    }

    /// The secret credentials are hashed with before they become store keys (default empty).
    /// Instances sharing a store must share it.
    pub fn key_hash_secret(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.key_secret = secret.into();
        self
    }

    /// What to do when the store fails (default [`FailMode::Allow`]).
    pub fn fail_mode(mut self, mode: FailMode) -> Self {
        self.fail_mode = mode;
        self
    }

    /// The engine, or the first configuration error.
    pub fn build(self) -> Result<Engine<S, C>, ConfigError>
    where
        S: Store,
        C: Clock,
    {
        if self.ipv6_prefix > 128 {
            return Err(ConfigError::new(
                &self.ipv6_prefix.to_string(),
                "ipv6_prefix must be from 0 to 128",
            ));
        }
        let mut compiled = Vec::with_capacity(self.policies.len());
        for mut http in self.policies {
            let name = http.policy.name().to_owned();
            let fail = |reason: &str| Err(ConfigError::new(&name, reason));
            if http.keys.uses_jwt() && self.jwt.is_none() {
                return fail(
                    "a \"jwt:<claim>\" key selector needs a JWT key ([jwt] in the config)",
                );
            }
            if http.require_key && http.keys.selectors().is_empty() {
                return fail("require_key needs at least one key selector");
            }
            let max = http.policy.quota().max_cost();
            if http.cost > max {
                return Err(ConfigError::new(
                    &name,
                    format!(
                        "cost {} exceeds the quota: no request could ever pass (at most {max})",
                        http.cost
                    ),
                ));
            }
            if let Action::Delay { max_delay } = http.action {
                // The bound is enforced by the algorithm, so a request that would wait too long
                // is denied before it consumes anything.
                let Quota::LeakyBucket(bucket) = http.policy.quota() else {
                    return fail("action \"delay\" needs algorithm \"leaky_bucket\"");
                };
                let bound = bucket.max_delay().map_or(max_delay, |d| d.min(max_delay));
                let quota = Quota::LeakyBucket(bucket.clone().with_max_delay(bound));
                http.policy =
                    Policy::new(&name, quota).map_err(|e| ConfigError::new(&name, e.reason()))?;
            }
            if http.action == Action::Queue && !matches!(http.policy.quota(), Quota::LeakyBucket(_))
            {
                return fail("action \"queue\" needs algorithm \"leaky_bucket\"");
            }
            let text = PolicyHeaders::new(&http.policy)?;
            compiled.push(Compiled { http, text });
        }
        let limiter = Limiter::builder()
            .store(self.store)
            .clock(self.clock)
            .policies(compiled.iter().map(|c| c.http.policy.clone()))
            .build()
            .map_err(|e| ConfigError::new("policies", e.to_string()))?;
        let trusted = self.trusted;
        let forwarded = self.forwarded;
        let resolve_ip: Box<ResolveIp> = Box::new(move |info: &RequestInfo<'_>| {
            if let Some(ip) = info.client_ip {
                return Some(ip.to_canonical());
            }
            info.peer
                .map(|peer| client_ip(peer, info.headers, &trusted, forwarded))
        });
        let reads_path = compiled.iter().any(|c| c.http.route.reads_path());
        let mut headers_read = vec![match self.forwarded {
            ForwardedHeader::XForwardedFor => HeaderName::from_static("x-forwarded-for"),
            ForwardedHeader::Forwarded => http::header::FORWARDED,
        }];
        for selector in compiled.iter().flat_map(|c| c.http.keys.selectors()) {
            let name = match selector {
                KeySelector::Header(name) => name.clone(),
                KeySelector::Jwt(_) => http::header::AUTHORIZATION,
                _ => continue,
            };
            if !headers_read.contains(&name) {
                headers_read.push(name);
            }
        }
        Ok(Engine {
            inner: Arc::new(Inner {
                reads_path,
                headers_read,
                limiter,
                policies: compiled,
                headers: self.headers,
                jwt: self.jwt,
                hasher: CredentialHasher::new(&self.key_secret),
                ipv6_prefix: self.ipv6_prefix,
                fail_mode: self.fail_mode,
                resolve_ip,
                overrides: Overrides::default(),
            }),
        })
    }
}

/// One matching policy and the key the request is counted under.
#[derive(Clone, Debug)]
struct Entry {
    index: usize,
    key: KeyBuf,
    /// The key's override of the policy's quota, when it has one.
    over: Option<Arc<KeyOverride>>,
}

/// The synchronous half of an evaluation: which policies match and the keys. Owns its data, so
/// it can cross an `await` without borrowing the request.
#[derive(Clone, Debug, Default)]
pub struct Prepared {
    // Inline room for the usual one or two matching policies; the future that carries this
    // across the store call is moved around whole.
    entries: SmallVec<[Entry; 2]>,
    refusal: Option<Refusal>,
}

/// Why a prepared request is answered before any policy counts it.
#[derive(Clone, Debug)]
enum Refusal {
    /// No key for the policy at this index, which requires one: 401.
    MissingKey(usize),
    /// A field a key is read from came more than once: 400.
    DuplicateField(DuplicateField),
    /// The path cannot be normalised within the bound: 414.
    PathTooDeep,
}

impl Prepared {
    /// Whether no policy applies (the request passes untouched, without headers).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.refusal.is_none()
    }

    /// Each matching policy (its index among the engine's policies, in order) with the key the
    /// request is counted under, as the store sees it: credentials appear as their keyed hash.
    /// In the order of the outcome's decisions.
    pub fn keys(&self) -> impl Iterator<Item = (usize, &[u8])> {
        self.entries.iter().map(|e| (e.index, &e.key[..]))
    }
}

/// What to do with a request.
#[derive(Debug)]
pub enum Verdict<S: Store, C: Clock> {
    /// Pass it on now, adding the outcome's headers to the response.
    Pass,
    /// Hold it for [`Hold::delay`], then pass it on. Dropping the hold before it completes
    /// gives the request's quota back.
    Hold(Hold<S, C>),
    /// Answer with this response (429, 401, 400, 414 or 503) instead of passing it on. It already carries
    /// the outcome's headers. Boxed: the admitted requests, which are most, then move a small
    /// verdict around, and a refusal allocates once.
    Respond(Box<Answer>),
}

/// A response the engine gives instead of passing the request on: a 429, a 401 (no key for a
/// policy that requires one), a 400 (a field a key is read from sent twice), a 414 (a path too
/// deep to normalise) or a 503 (the store failed and the engine fails closed), always an RFC
/// 9457 `application/problem+json` body.
///
/// Kept as its parts rather than an `http::Response`: a server that writes HTTP/1.1 itself
/// copies them out directly, where a `HeaderMap` would be built, hashed and dropped for every
/// refusal, which is most of what a refusal costs. [`Answer::into_response`] builds the
/// response for everyone else.
#[derive(Clone, Debug)]
pub struct Answer {
    status: StatusCode,
    /// After `Content-Type`: the rate-limit headers and `Retry-After`, when there are any.
    headers: HeaderList,
    body: Bytes,
    /// Set on a 429 that only `queue` policies gave: what a caller needs to queue the request.
    queue: Option<Box<QueueTicket>>,
}

impl Answer {
    fn new(status: StatusCode, headers: HeaderList, body: Bytes) -> Box<Self> {
        Box::new(Answer {
            status,
            headers,
            body,
            queue: None,
        })
    }

    /// On a 429 that only [`Action::Queue`] policies gave (every other policy admits the
    /// request): the queue the request may join instead, and what joining it charges. See
    /// [`Engine::admit_queued`].
    pub fn queue_ticket(&self) -> Option<&QueueTicket> {
        self.queue.as_deref()
    }

    /// 429, 401, 400 (a key field sent twice), 414 (a path too deep to normalise) or 503.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The headers besides `Content-Type` ([`problem::PROBLEM_JSON`](crate::problem::PROBLEM_JSON)),
    /// in order: the rate-limit headers, then `Retry-After`. Each value is made as it is
    /// asked for; [`Answer::write_headers`] writes them without making any.
    pub fn headers(&self) -> impl Iterator<Item = (HeaderName, HeaderValue)> + '_ {
        self.headers
            .iter()
            .map(|f| (f.which.name(), f.header_value()))
    }

    /// Appends [`Answer::headers`] to `out` as HTTP/1.1 header lines (`name: value` and CRLF
    /// each, names in lower case), for a server that writes its responses itself: numbers are
    /// formatted straight into `out`, with no allocation.
    pub fn write_headers(&self, out: &mut Vec<u8>) {
        write_lines(&self.headers, out);
    }

    /// The problem+json body.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The answer as a response: `Content-Type` first, then [`Answer::headers`].
    pub fn into_response(self) -> Response<Bytes> {
        let mut response = Response::new(self.body);
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        // Sized once: growing the map midway would rehash it.
        headers.reserve(self.headers.len() + 1);
        headers.insert(http::header::CONTENT_TYPE, problem::PROBLEM_JSON);
        for f in &self.headers {
            headers.insert(f.which.name(), f.header_value());
        }
        response
    }
}

/// The result of evaluating a request.
#[derive(Debug)]
pub struct Outcome<S: Store, C: Clock> {
    decisions: Decisions,
    headers: HeaderList,
    verdict: Verdict<S, C>,
    store_failed: bool,
}

impl<S: Store, C: Clock> Outcome<S, C> {
    /// One decision per matching policy, in policy order; empty when none matched, the key was
    /// missing or the store failed.
    pub fn decisions(&self) -> &Decisions {
        &self.decisions
    }

    /// Whether the store failed, so the request was let through ([`FailMode::Allow`]) or
    /// answered 503 ([`FailMode::Deny`]) undecided.
    pub fn store_failed(&self) -> bool {
        self.store_failed
    }

    /// Whether the request goes on (now or after a hold).
    pub fn allowed(&self) -> bool {
        !matches!(self.verdict, Verdict::Respond(_))
    }

    /// The rate-limit headers for the response (each value made as it is asked for).
    pub fn headers(&self) -> impl Iterator<Item = (HeaderName, HeaderValue)> + '_ {
        self.headers
            .iter()
            .map(|f| (f.which.name(), f.header_value()))
    }

    /// Adds the rate-limit headers to `headers`.
    pub fn apply_headers(&self, headers: &mut HeaderMap) {
        for f in &self.headers {
            headers.insert(f.which.name(), f.header_value());
        }
    }

    /// What to do.
    pub fn verdict(&self) -> &Verdict<S, C> {
        &self.verdict
    }

    /// The decisions, the headers and what to do, by value.
    pub fn into_parts(self) -> (Decisions, RateLimitHeaders, Verdict<S, C>) {
        (self.decisions, RateLimitHeaders(self.headers), self.verdict)
    }
}

/// The rate-limit headers of an outcome, to add to the response once there is one.
#[derive(Clone, Debug, Default)]
pub struct RateLimitHeaders(HeaderList);

impl RateLimitHeaders {
    /// Adds the headers to `headers`, replacing any of the same name.
    pub fn apply(self, headers: &mut HeaderMap) {
        // One growth of the map up front rather than a rehash midway.
        headers.reserve(self.0.len());
        for f in &self.0 {
            headers.insert(f.which.name(), f.header_value());
        }
    }

    /// Whether there are none (no policy matched, or the store failed open).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The headers, each value made as it is asked for ([`RateLimitHeaders::write`] makes
    /// none).
    pub fn iter(&self) -> impl Iterator<Item = (HeaderName, HeaderValue)> + '_ {
        self.0.iter().map(|f| (f.which.name(), f.header_value()))
    }

    /// The headers' names, in lower case.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.0.iter().map(|f| f.which.as_str())
    }

    /// Appends the headers to `out` as HTTP/1.1 header lines (`name: value` and CRLF each,
    /// names in lower case), for a server that writes its responses itself: the numbers are
    /// formatted straight into `out`, with no allocation.
    pub fn write(&self, out: &mut Vec<u8>) {
        write_lines(&self.0, out);
    }
}

impl<S: Store, C: Clock> Engine<S, C> {
    /// The SPEC §5 headers for decisions of this engine's policies made outside a request, by a
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
            headers.push(field);
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
                    prepared.refusal = Some(Refusal::PathTooDeep);
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
        for (index, policy) in self.inner.policies.iter().enumerate() {
            let http = &policy.http;
            if !http.route.matches(info.method, &path, info.host) {
                continue;
            }
            let mut key = KeyBuf::new();
            let found = match cx.key(&http.keys, &self.inner.hasher, &mut key) {
                Ok(found) => found,
                Err(field) => {
                    prepared.refusal = Some(Refusal::DuplicateField(field));
                    prepared.entries.clear();
                    return prepared;
                }
            };
            if !found {
                if http.require_key {
                    prepared.refusal = Some(Refusal::MissingKey(index));
                    prepared.entries.clear();
                    return prepared;
                }
                key.clear();
                key.extend_from_slice(ANONYMOUS_KEY);
            }
            let over = self.live_override(index, &key);
            prepared.entries.push(Entry { index, key, over });
        }
        prepared
    }

    /// The override of `key` under the policy at `index`, if one applies now. The clock is
    /// read only for a key that has one.
    #[inline]
    fn live_override(&self, index: usize, key: &[u8]) -> Option<Arc<KeyOverride>> {
        let over = self.inner.overrides.get(index, key)?;
        over.applies_at(self.inner.limiter.clock().now())
            .then_some(over)
    }

    /// Matches, selects keys and decides.
    pub async fn evaluate(&self, info: &RequestInfo<'_>) -> Outcome<S, C> {
        let prepared = self.prepare(info);
        self.decide(prepared).await
    }

    /// Decides a prepared request: one all-or-nothing `check_all` over every matching policy.
    pub async fn decide(&self, prepared: Prepared) -> Outcome<S, C> {
        self.decide_ref(&prepared).await
    }

    /// [`decide`](Self::decide), leaving the prepared request with the caller, who can read its
    /// [`keys`](Prepared::keys) next to the decisions (the server's top-keys sketches do).
    pub async fn decide_prepared(&self, prepared: &Prepared) -> Outcome<S, C> {
        self.decide_ref(prepared).await
    }

    /// Decides a prepared request without awaiting, when the store answers at once (the memory
    /// store, see [`Store::is_immediate`]); hands the request back for [`decide`](Self::decide)
    /// otherwise. The outcome is the one `decide` would give. A caller on a hot path saves the
    /// future it would otherwise have to keep (and usually box) across the store call.
    // Both sides are moved once, on the stack; boxing either would add the allocation per
    // request this function exists to avoid.
    #[allow(clippy::result_large_err)]
    pub fn decide_now(&self, prepared: Prepared) -> Result<Outcome<S, C>, Prepared> {
        if !self.inner.limiter.store().is_immediate() {
            return Err(prepared);
        }
        if let Some(outcome) = self.decide_one_now(&prepared) {
            return Ok(outcome);
        }
        let decided = {
            let future = std::pin::pin!(self.decide_ref(&prepared));
            future.poll(&mut Context::from_waker(Waker::noop()))
        };
        Ok(match decided {
            Poll::Ready(outcome) => outcome,
            // The store broke its promise; what it was doing is dropped unfinished.
            Poll::Pending => self.failed(pending_immediate_store(), &prepared.entries),
        })
    }

    /// The common request, one rejecting policy, decided by an immediate store: one poll of the
    /// store's single-check future and the headers of one decision, without the general path's
    /// lists and state machine (a tenth of what the layer adds to a request). `None` for any
    /// other request, before anything is decided.
    #[inline]
    fn decide_one_now(&self, prepared: &Prepared) -> Option<Outcome<S, C>> {
        let [entry] = prepared.entries.as_slice() else {
            return None;
        };
        let compiled = &self.inner.policies[entry.index];
        if prepared.refusal.is_some() || compiled.http.action != Action::Reject {
            return None;
        }
        let now = self.inner.limiter.clock().now();
        let future = std::pin::pin!(self.inner.limiter.store().apply_one(now, self.check(entry)));
        let decision = match future.poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(Ok(decision)) => decision,
            Poll::Ready(Err(error)) => return Some(self.failed(error.into(), &prepared.entries)),
            Poll::Pending => {
                return Some(self.failed(pending_immediate_store(), &prepared.entries));
            }
        };
        let decisions: Decisions = std::iter::once(decision).collect();
        if !decision.allowed {
            let headers = self.render(&decisions, &prepared.entries);
            return Some(self.deny(decisions, headers, &prepared.entries));
        }
        let mut headers = HeaderList::new();
        render(
            &self.inner.headers,
            now,
            &[(&decision, self.text(entry))],
            &mut headers,
        );
        Some(self.outcome(decisions, headers, Verdict::Pass))
    }

    async fn decide_ref(&self, prepared: &Prepared) -> Outcome<S, C> {
        let policies = &self.inner.policies;
        if let Some(refusal) = &prepared.refusal {
            let (status, body) = match refusal {
                Refusal::MissingKey(index) => {
                    let name = policies.get(*index).map_or("", |p| p.http.policy.name());
                    tracing::debug!(
                        policy = name,
                        "request without a key for a policy that requires one"
                    );
                    (StatusCode::UNAUTHORIZED, problem::key_required(name))
                }
                Refusal::DuplicateField(field) => {
                    tracing::debug!(%field, "request refused: a key field sent more than once");
                    (
                        StatusCode::BAD_REQUEST,
                        problem::duplicate_field(&field.to_string()),
                    )
                }
                Refusal::PathTooDeep => {
                    tracing::debug!("request refused: path too deep to normalise");
                    (StatusCode::URI_TOO_LONG, problem::path_too_deep())
                }
            };
            let answer = Answer::new(status, HeaderList::new(), body);
            return self.outcome(
                Decisions::new(),
                HeaderList::new(),
                Verdict::Respond(answer),
            );
        }
        if prepared.entries.is_empty() {
            return self.outcome(Decisions::new(), HeaderList::new(), Verdict::Pass);
        }
        let entries = &prepared.entries;
        let checks: SmallVec<[Check<'_>; 4]> = entries.iter().map(|e| self.check(e)).collect();
        let mut decisions = match self.check_all(&checks).await {
            Ok(d) if d.len() == entries.len() => d,
            Ok(_) => return self.failed(miscounted(), entries),
            Err(e) => return self.failed(e, entries),
        };
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
                let enforced: SmallVec<[Check<'_>; 4]> = entries
                    .iter()
                    .filter(|e| !self.is_shadow(e))
                    .map(|e| self.check(e))
                    .collect();
                if enforced.is_empty() {
                    let headers = self.render(&decisions, entries);
                    return self.outcome(decisions, headers, Verdict::Pass);
                }
                let again = match self.check_all(&enforced).await {
                    Ok(d) => d,
                    Err(e) => return self.failed(e, entries),
                };
                consumed = again.allowed();
                let mut again = again.into_iter();
                decisions = decisions
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
                    return self.failed(miscounted(), entries);
                }
            }
        }
        let headers = self.render(&decisions, entries);
        if !consumed {
            return self.deny(decisions, headers, entries);
        }
        // Admitted. Hold for the longest slot a `delay` policy asks for.
        let delay = decisions
            .as_slice()
            .iter()
            .zip(entries.iter())
            .filter(|(_, e)| matches!(self.action(e), Action::Delay { .. }))
            .filter_map(|(d, _)| d.delay)
            .max();
        match delay {
            Some(delay) if !delay.is_zero() => {
                let hold = Hold {
                    delay,
                    guard: Some(RefundGuard {
                        engine: self.clone(),
                        entries: entries
                            .iter()
                            .filter(|e| !self.is_shadow(e))
                            .cloned()
                            .collect(),
                        armed: true,
                    }),
                };
                self.outcome(decisions, headers, Verdict::Hold(hold))
            }
            _ => self.outcome(decisions, headers, Verdict::Pass),
        }
    }

    fn outcome(
        &self,
        decisions: Decisions,
        headers: HeaderList,
        verdict: Verdict<S, C>,
    ) -> Outcome<S, C> {
        Outcome {
            decisions,
            headers,
            verdict,
            store_failed: false,
        }
    }

    /// The limiter's `check_all`, with the store's single-check path for the common request that
    /// one policy applies to. Costs were checked against their quotas when the engine was built.
    async fn check_all(&self, checks: &[Check<'_>]) -> Result<Decisions, Error> {
        if let [check] = checks {
            let now = self.inner.limiter.clock().now();
            let decision = self.inner.limiter.store().apply_one(now, *check).await?;
            return Ok(std::iter::once(decision).collect());
        }
        self.inner.limiter.check_all(checks).await
    }

    fn check<'e>(&'e self, entry: &'e Entry) -> Check<'e> {
        let http = &self.inner.policies[entry.index].http;
        let policy = entry.over.as_ref().map_or(&http.policy, |o| &o.policy);
        Check::new(policy, &entry.key, http.cost)
    }

    /// The header text of the quota `entry` is decided under: its override's, or its policy's.
    fn text<'e>(&'e self, entry: &'e Entry) -> &'e PolicyHeaders {
        match &entry.over {
            Some(over) => &over.text,
            None => &self.inner.policies[entry.index].text,
        }
    }

    fn action(&self, entry: &Entry) -> Action {
        self.inner.policies[entry.index].http.action
    }

    fn is_shadow(&self, entry: &Entry) -> bool {
        self.action(entry) == Action::Shadow
    }

    fn render(&self, decisions: &Decisions, entries: &[Entry]) -> HeaderList {
        let items: SmallVec<[(&Decision, &PolicyHeaders); 4]> = decisions
            .as_slice()
            .iter()
            .zip(entries.iter())
            .map(|(d, e)| (d, self.text(e)))
            .collect();
        self.render_items(&items)
    }

    /// The headers for `decisions`, the i-th made by the policy at `indexes[i]`, under the
    /// quota `overrides[i]` when there is one.
    fn render_at(
        &self,
        decisions: &Decisions,
        indexes: &[usize],
        overrides: &[Option<Arc<KeyOverride>>],
    ) -> HeaderList {
        let items: SmallVec<[(&Decision, &PolicyHeaders); 4]> = decisions
            .as_slice()
            .iter()
            .zip(indexes.iter())
            .enumerate()
            .map(|(n, (d, &i))| match overrides.get(n) {
                Some(Some(over)) => (d, &over.text),
                _ => (d, &self.inner.policies[i].text),
            })
            .collect();
        self.render_items(&items)
    }

    fn render_items(&self, items: &[(&Decision, &PolicyHeaders)]) -> HeaderList {
        let mut headers = HeaderList::new();
        render(
            &self.inner.headers,
            self.inner.limiter.clock().now(),
            items,
            &mut headers,
        );
        headers
    }

    /// `Retry-After` for denied `decisions` (the i-th made by the policy at `indexes[i]`): it
    /// covers every enforcing policy that denied, never earlier than the `t` in `headers`;
    /// shadow denials never delay. `None` when some denial can never pass.
    fn retry_after_at(
        &self,
        decisions: &Decisions,
        headers: &HeaderList,
        indexes: &[usize],
    ) -> Option<(u64, Field)> {
        let now = self.inner.limiter.clock().now();
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
        if let Some(t) = t_of(headers) {
            floor = floor.max(t);
        }
        wait.map(|w| retry_after(self.inner.headers.retry_after_format, now, w, floor))
    }

    /// The 429.
    fn deny(
        &self,
        decisions: Decisions,
        mut headers: HeaderList,
        entries: &[Entry],
    ) -> Outcome<S, C> {
        let indexes: SmallVec<[usize; 4]> = entries.iter().map(|e| e.index).collect();
        let retry = self.retry_after_at(&decisions, &headers, &indexes);
        let violated = decisions
            .as_slice()
            .iter()
            .zip(entries.iter())
            .filter(|(d, e)| !d.allowed && !self.is_shadow(e))
            .map(|(d, _)| d.policy);
        tracing::debug!(policies = ?violated.clone().collect::<SmallVec<[&str; 4]>>(), "rate limited");
        let body = problem::quota_exceeded(violated, retry.as_ref().map(|(s, _)| *s));
        if let Some((_, field)) = retry {
            headers.push(field);
        }
        let mut answer = Answer::new(StatusCode::TOO_MANY_REQUESTS, headers.clone(), body);
        answer.queue = self.queue_ticket(&decisions, entries);
        self.outcome(decisions, headers, Verdict::Respond(answer))
    }

    fn failed(&self, error: Error, entries: &[Entry]) -> Outcome<S, C> {
        match error {
            Error::CostExceedsQuota { policy, .. } => {
                // Cannot happen for configured costs (the builder refuses them); answered as
                // the SPEC says: 429 with no Retry-After, since waiting never helps.
                let body = problem::quota_exceeded([policy.as_str()].into_iter(), None);
                let answer = Answer::new(StatusCode::TOO_MANY_REQUESTS, HeaderList::new(), body);
                self.outcome(
                    Decisions::new(),
                    HeaderList::new(),
                    Verdict::Respond(answer),
                )
            }
            error => {
                let names: SmallVec<[&str; 4]> = entries
                    .iter()
                    .map(|e| self.inner.policies[e.index].http.policy.name())
                    .collect();
                tracing::warn!(%error, policies = ?names, fail_mode = ?self.inner.fail_mode, "rate limit store failed");
                let mut outcome = match self.inner.fail_mode {
                    FailMode::Allow => {
                        self.outcome(Decisions::new(), HeaderList::new(), Verdict::Pass)
                    }
                    FailMode::Deny => {
                        let mut retry = HeaderList::new();
                        retry.push(retry_soon());
                        let answer = Answer::new(
                            StatusCode::SERVICE_UNAVAILABLE,
                            retry,
                            problem::unavailable(),
                        );
                        self.outcome(
                            Decisions::new(),
                            HeaderList::new(),
                            Verdict::Respond(answer),
                        )
                    }
                };
                outcome.store_failed = true;
                outcome
            }
        }
    }
}

/// A store that answered a different number of decisions than it was asked for is broken: its
/// answer is treated as a failure, not trusted.
fn miscounted() -> Error {
    Error::Store(tollgate::StoreError::Protocol {
        reason: "the store answered a different number of decisions than checks".to_owned(),
    })
}

/// A store that said it answers immediately left a decision pending: treated as a failure, so
/// the configured fail mode decides.
fn pending_immediate_store() -> Error {
    Error::Store(tollgate::StoreError::Protocol {
        reason: "an immediate store left a decision pending".to_owned(),
    })
}

/// A request held for its leaky-bucket slot.
#[derive(Debug)]
pub struct Hold<S: Store, C: Clock> {
    delay: Duration,
    guard: Option<RefundGuard<S, C>>,
}

impl<S: Store, C: Clock> Hold<S, C> {
    /// How long the request is held.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// Waits out the hold on the limiter's clock. If this future is dropped first (the client
    /// went away), the request's quota is given back.
    pub async fn wait(mut self) {
        if let Some(guard) = &self.guard {
            guard.engine.inner.limiter.clock().sleep(self.delay).await;
        }
        // Served: nothing to give back.
        if let Some(guard) = &mut self.guard {
            guard.armed = false;
        }
    }
}

/// Gives the quota of an abandoned held request back to the store.
#[derive(Debug)]
struct RefundGuard<S: Store, C: Clock> {
    engine: Engine<S, C>,
    // Only held requests get here: a Vec keeps `Verdict` small for all the others.
    entries: Vec<Entry>,
    armed: bool,
}

impl<S: Store, C: Clock> Drop for RefundGuard<S, C> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // The refund talks to the store, which may be remote: it runs as its own task. Outside
        // a runtime there is nothing to run it on, and the slot simply passes unused.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let engine = self.engine.clone();
        let entries = std::mem::take(&mut self.entries);
        runtime.spawn(async move {
            let checks: SmallVec<[Check<'_>; 4]> =
                entries.iter().map(|e| engine.check(e)).collect();
            let now = engine.inner.limiter.clock().now();
            if let Err(error) = engine.inner.limiter.store().refund(now, &checks).await {
                tracing::debug!(%error, "could not give back a held request's quota");
            }
        });
    }
}
