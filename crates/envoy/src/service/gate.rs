//! Allow and deny lists for Envoy's door: a request whose descriptors carry the client's
//! address (an entry `remote_address`, as Envoy's `remote_address` action sends it) is judged
//! by it before any descriptor is counted: on a deny list, every descriptor is answered
//! `OVER_LIMIT` (Envoy refuses the request with its rate-limited status, 429 unless its filter
//! says otherwise), with an `x-tollgate-list` header naming the list; on an allow list,
//! everything is `OK` and nothing is counted. A request without that entry is decided as usual.

use std::net::IpAddr;
use std::sync::Arc;

use crate::proto::envoy::config::core::v3::HeaderValue;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

/// The descriptor entry key that carries the client's address.
pub const REMOTE_ADDRESS: &str = "remote_address";

/// What a list said of an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Never limited: answered OK, nothing counted.
    Allow {
        /// The list's name.
        list: String,
    },
    /// Refused before any descriptor.
    Deny {
        /// The list's name.
        list: String,
    },
}

/// Judges a client address by the allow and deny lists (`None`: on neither). The server gives
/// its running engine's lists.
pub type AddressGate = Arc<dyn Fn(IpAddr) -> Option<Gate> + Send + Sync>;

/// The client address the request's descriptors carry, if any. A link-local IPv6 address may
/// carry its zone (`fe80::1%eth0`), the interface it came in on: the address is the client.
pub(super) fn address(request: &RateLimitRequest) -> Option<IpAddr> {
    let text = request
        .descriptors
        .iter()
        .flat_map(|d| &d.entries)
        .find(|e| e.key == REMOTE_ADDRESS)?
        .value
        .trim();
    let unzoned = text.split_once('%').map_or(text, |(address, _)| address);
    unzoned.parse::<IpAddr>().ok()
}

/// The answer a list gives, all descriptors alike.
pub(super) fn answer(gate: &Gate, count: usize) -> RateLimitResponse {
    let (code, list) = match gate {
        Gate::Allow { list } => (Code::Ok, list),
        Gate::Deny { list } => (Code::OverLimit, list),
    };
    let statuses = (0..count)
        .map(|_| DescriptorStatus {
            code: code as i32,
            limit_remaining: if code == Code::Ok { u32::MAX } else { 0 },
            ..DescriptorStatus::default()
        })
        .collect();
    let headers = match gate {
        Gate::Deny { .. } => vec![HeaderValue {
            key: "x-tollgate-list".to_owned(),
            value: list.clone(),
            ..HeaderValue::default()
        }],
        Gate::Allow { .. } => Vec::new(),
    };
    RateLimitResponse {
        overall_code: code as i32,
        statuses,
        response_headers_to_add: headers,
        request_headers_to_add: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

    fn with_address(value: &str) -> RateLimitRequest {
        RateLimitRequest {
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: REMOTE_ADDRESS.to_owned(),
                    value: value.to_owned(),
                }],
                ..RateLimitDescriptor::default()
            }],
            ..RateLimitRequest::default()
        }
    }

    #[test]
    fn a_zoned_address_is_its_address() {
        let parsed = |v: &str| address(&with_address(v));
        assert_eq!(parsed("fe80::1%eth0"), "fe80::1".parse().ok());
        assert_eq!(parsed(" 192.0.2.7 "), "192.0.2.7".parse().ok());
        assert_eq!(parsed("not an address"), None);
        assert_eq!(parsed("%eth0"), None);
    }
}
