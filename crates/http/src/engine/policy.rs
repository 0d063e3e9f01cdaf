//! What an HTTP policy is: a core [`Policy`] with the request-side choices around it (keys,
//! route, cost, what to do on a denial).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use tollgate::Policy;

use crate::{ConfigError, KeyChain, KeySelector, RouteMatch};

use super::{Charge, StatusSet};

use super::DEFAULT_MAX_DELAY;

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
    /// rate. The engine answers it 429 like [`Action::Reject`], with a
    /// [`QueueTicket`](crate::QueueTicket) on the answer
    /// ([`Answer::queue_ticket`](crate::Answer::queue_ticket)) for a caller that can queue it
    /// (the server's proxy); every other caller simply answers the 429.
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
    /// When a request is charged: up front, or as its response says (`charge = "response"`).
    pub charge: Charge,
    /// Only responses with these statuses count (`count_status`); the others are given back.
    pub count_status: Option<StatusSet>,
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
            charge: Charge::Request,
            count_status: None,
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

    /// Sets when a request is charged: [`Charge::Response`] charges what the response says it
    /// cost (the [`cost`](Self::cost) is what admission needs left, and charges up front).
    pub fn charge(mut self, charge: Charge) -> Self {
        self.charge = charge;
        self
    }

    /// Counts only responses with these statuses; the others cost nothing.
    pub fn count_status(mut self, statuses: StatusSet) -> Self {
        self.count_status = Some(statuses);
        self
    }
}
