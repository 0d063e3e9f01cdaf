//! How an [`Engine`] is put together: policies compiled once (header text, the headers keys
//! are read from), the store, the clock, proxies, JWT and the credential hash secret.

use std::fmt;
use std::sync::Arc;

use http::HeaderName;
use tollgate::{Clock, Limiter, MemoryStore, OnError, Policy, Quota, Store, SystemClock};

use crate::client_ip::{ForwardedHeader, client_address};
use crate::headers::PolicyHeaders;
use crate::key::CredentialHasher;
use crate::{ConfigError, HeaderConfig, JwtVerifier, KeySelector, RequestInfo, TrustedProxies};

use super::lists::Lists;
use super::{
    Action, Charge, Compiled, Engine, HttpPolicy, Inner, ListSpec, Overrides, ResolveIp,
    UsageCounters,
};

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
    on_error: OnError,
    lists: Vec<ListSpec>,
    usage: UsageCounters,
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
            on_error: OnError::default(),
            lists: Vec::new(),
            usage: UsageCounters::default(),
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
            on_error: self.on_error,
            lists: self.lists,
            usage: self.usage,
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
            on_error: self.on_error,
            lists: self.lists,
            usage: self.usage,
        }
    }

    /// Counts the responses whose cost could not be read in `counters`, by policy name, instead
    /// of counters of this engine's own: engines built one after another with the same handle
    /// (a server's configuration reloads) keep counting where the last one was, and log each
    /// policy's first fallback once.
    pub fn usage_counters(mut self, counters: UsageCounters) -> Self {
        self.usage = counters;
        self
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

    /// What to do when the store fails (default [`OnError::Allow`]).
    pub fn on_error(mut self, mode: OnError) -> Self {
        self.on_error = mode;
        self
    }

    /// Allow and deny lists, applied before any policy (see [`ListSpec`]); names unique.
    pub fn lists(mut self, lists: impl IntoIterator<Item = ListSpec>) -> Self {
        self.lists.extend(lists);
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
        let has_jwt = self.jwt.is_some();
        let mut compiled = Vec::with_capacity(self.policies.len());
        for http in self.policies {
            compiled.push(compile(http, has_jwt, &self.usage)?);
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
                return Ok(Some(ip.to_canonical()));
            }
            info.resolved_peer()
                .map(|peer| client_address(peer, info.headers, &trusted, forwarded))
                .transpose()
        });
        let reads_path = compiled.iter().any(|c| c.http.route.reads_path());
        let reads_host = compiled
            .iter()
            .any(|c| c.http.route.host_pattern().is_some());
        let mut headers_read = headers_read(&compiled, self.forwarded);
        for name in Lists::headers(&self.lists) {
            if !headers_read.contains(&name) {
                headers_read.push(name);
            }
        }
        let lists = Lists::new(self.lists, has_jwt)?;
        Ok(Engine {
            inner: Arc::new(Inner {
                reads_path,
                reads_host,
                headers_read,
                limiter,
                policies: compiled,
                headers: self.headers,
                jwt: self.jwt,
                hasher: CredentialHasher::new(&self.key_secret),
                ipv6_prefix: self.ipv6_prefix,
                on_error: self.on_error,
                resolve_ip,
                overrides: Overrides::default(),
                lines: Default::default(),
                lease_tag: super::slot_lease::tag_key(&self.key_secret),
                lists,
                outage: Default::default(),
            }),
        })
    }
}

/// One policy checked against what the engine can do (a JWT key for `jwt:` selectors, a cost
/// the quota can admit, the leaky bucket for `delay` and `queue`), with its header text.
fn compile(
    mut http: HttpPolicy,
    has_jwt: bool,
    usage: &UsageCounters,
) -> Result<Compiled, ConfigError> {
    let name = http.policy.name().to_owned();
    let fail = |reason: &str| Err(ConfigError::new(&name, reason));
    if http.keys.uses_jwt() && !has_jwt {
        return fail("a \"jwt:<claim>\" key selector needs a JWT key ([jwt] in the config)");
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
    if let Action::Delay { max_delay } = http.action
        && !matches!(http.policy.quota(), Quota::Concurrency(_))
    {
        // The bound is enforced by the algorithm, so a request that would wait too long
        // is denied before it consumes anything. (A concurrency limit's wait is the engine's:
        // in line for a slot, at most `max_delay`.)
        let Quota::LeakyBucket(bucket) = http.policy.quota() else {
            return fail("action \"delay\" needs algorithm \"leaky_bucket\" or \"concurrency\"");
        };
        let bound = bucket.max_delay().map_or(max_delay, |d| d.min(max_delay));
        let quota = Quota::LeakyBucket(bucket.clone().with_max_delay(bound));
        let bounded = Policy::new(&name, quota).map_err(|e| ConfigError::new(&name, e.reason()))?;
        // The same policy but for the bound: its ban is kept. (A leaky bucket has no lease.)
        http.policy = match http.policy.ban() {
            Some(ban) => bounded
                .with_ban(*ban)
                .map_err(|e| ConfigError::new(&name, e.reason()))?,
            None => bounded,
        };
    }
    if http.action == Action::Queue && !matches!(http.policy.quota(), Quota::LeakyBucket(_)) {
        return fail("action \"queue\" needs algorithm \"leaky_bucket\"");
    }
    if matches!(http.charge, Charge::Response(_)) && http.action == Action::Queue {
        return fail(
            "charge = \"response\" cannot go with action \"queue\" (a queued request's response comes long after, to nobody)",
        );
    }
    let concurrent = matches!(http.policy.quota(), Quota::Concurrency(_));
    if concurrent {
        if http.cost != 1 {
            return fail("a request holds one slot of a concurrency limit: its cost is 1");
        }
        if matches!(http.charge, Charge::Response(_)) || http.count_status.is_some() {
            return fail(
                "a concurrency limit holds a slot while the request runs, whatever the response says: charge = \"response\" and count_status do not apply",
            );
        }
    }
    let text = PolicyHeaders::new(&http.policy)?;
    let settles =
        concurrent || matches!(http.charge, Charge::Response(_)) || http.count_status.is_some();
    let waits = concurrent && matches!(http.action, Action::Delay { .. });
    Ok(Compiled {
        text,
        settles,
        concurrent,
        waits,
        slots: Default::default(),
        usage: usage.of(http.policy.name()),
        http,
    })
}

/// The request headers the engine reads, for a caller that copies only those: the forwarding
/// header, and every header a key selector names (`Authorization` for `jwt:`).
fn headers_read(compiled: &[Compiled], forwarded: ForwardedHeader) -> Vec<HeaderName> {
    let mut headers_read = vec![match forwarded {
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
    headers_read
}
