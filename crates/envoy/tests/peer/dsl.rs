//! The little language of the peer table: rows of YAML files and steps, requests built from
//! entry lists, and the statuses envoyproxy/ratelimit would answer.
#![allow(dead_code)]

use tollgate_envoy::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_envoy::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use tollgate_envoy::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate_envoy::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
pub(crate) use tollgate_envoy::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;

pub(crate) const OK: i32 = Code::Ok as i32;
pub(crate) const OVER: i32 = Code::OverLimit as i32;

/// One behaviour of the peer.
pub(crate) struct Row {
    pub(crate) name: &'static str,
    /// `(file name, YAML)`: one domain each.
    pub(crate) files: &'static [(&'static str, &'static str)],
    pub(crate) check: Check,
}

pub(crate) enum Check {
    /// The peer refuses the files: so must Tollgate, with all of these in its error.
    Refused(&'static [&'static str]),
    /// The peer loads them and answers these steps so.
    Steps(Vec<Step>),
}

pub(crate) enum Step {
    Call(RateLimitRequest, Want),
    /// A request the service refuses with this gRPC code.
    Refused(RateLimitRequest, tonic::Code),
    /// The clock moves on, in seconds.
    Advance(u64),
}

pub(crate) fn row(
    name: &'static str,
    files: &'static [(&'static str, &'static str)],
) -> RowBuilder {
    RowBuilder { name, files }
}

pub(crate) struct RowBuilder {
    name: &'static str,
    files: &'static [(&'static str, &'static str)],
}

impl RowBuilder {
    pub(crate) fn refused(self, needles: &'static [&'static str]) -> Row {
        Row {
            name: self.name,
            files: self.files,
            check: Check::Refused(needles),
        }
    }

    pub(crate) fn steps(self, steps: Vec<Step>) -> Row {
        Row {
            name: self.name,
            files: self.files,
            check: Check::Steps(steps),
        }
    }
}

/// A request in domain `d` (the rows' usual domain), one descriptor per entry list.
pub(crate) fn call(descriptors: &[&[(&str, &str)]]) -> Req {
    Req(RateLimitRequest {
        domain: "d".to_owned(),
        descriptors: descriptors
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| Entry {
                        key: (*k).to_owned(),
                        value: (*v).to_owned(),
                    })
                    .collect(),
                limit: None,
                hits_addend: None,
            })
            .collect(),
        hits_addend: 0,
    })
}

pub(crate) struct Req(RateLimitRequest);

impl Req {
    pub(crate) fn domain(mut self, domain: &str) -> Self {
        self.0.domain = domain.to_owned();
        self
    }

    pub(crate) fn hits(mut self, hits: u32) -> Self {
        self.0.hits_addend = hits;
        self
    }

    /// Descriptor `i`'s own `hits_addend`.
    pub(crate) fn descriptor_hits(mut self, i: usize, hits: u64) -> Self {
        self.0.descriptors[i].hits_addend = Some(hits);
        self
    }

    /// Descriptor `i`'s `limit` override.
    pub(crate) fn limit_override(mut self, i: usize, requests_per_unit: u32, unit: Unit) -> Self {
        self.0.descriptors[i].limit = Some(RateLimitOverride {
            requests_per_unit,
            unit: unit as i32,
        });
        self
    }

    pub(crate) fn expect(self, overall: i32, statuses: Vec<St>) -> Step {
        Step::Call(self.0, Want { overall, statuses })
    }

    pub(crate) fn refused(self, code: tonic::Code) -> Step {
        Step::Refused(self.0, code)
    }
}

pub(crate) struct Want {
    pub(crate) overall: i32,
    pub(crate) statuses: Vec<St>,
}

/// One expected status.
pub(crate) struct St {
    pub(crate) code: i32,
    pub(crate) limit: Option<(u32, Unit, &'static str)>,
    pub(crate) remaining: Option<u32>,
    pub(crate) reset: Option<i64>,
}

/// OK with no limit (nothing matched, or a limit replaced).
pub(crate) fn none() -> St {
    St {
        code: OK,
        limit: None,
        remaining: Some(0),
        reset: None,
    }
}

/// An unlimited descriptor: OK, no limit, everything remaining.
pub(crate) fn unlimited() -> St {
    St {
        code: OK,
        limit: None,
        remaining: Some(u32::MAX),
        reset: None,
    }
}

/// OK under `requests_per_unit` per `unit`, unnamed.
pub(crate) fn ok(requests_per_unit: u32, unit: Unit) -> St {
    St {
        code: OK,
        limit: Some((requests_per_unit, unit, "")),
        remaining: None,
        reset: None,
    }
}

/// OVER_LIMIT under `requests_per_unit` per `unit`, unnamed, nothing remaining.
pub(crate) fn over(requests_per_unit: u32, unit: Unit) -> St {
    St {
        code: OVER,
        limit: Some((requests_per_unit, unit, "")),
        remaining: Some(0),
        reset: None,
    }
}

impl St {
    pub(crate) fn named(mut self, name: &'static str) -> Self {
        if let Some(limit) = &mut self.limit {
            limit.2 = name;
        }
        self
    }

    pub(crate) fn left(mut self, remaining: u32) -> Self {
        self.remaining = Some(remaining);
        self
    }

    /// `duration_until_reset`, whole seconds.
    pub(crate) fn reset(mut self, secs: i64) -> Self {
        self.reset = Some(secs);
        self
    }
}
