//! The protobuf messages of Envoy's rate limit service (v3) and of gRPC health checking, written
//! as `prost` structs that match the vendored `.proto` files under `crates/envoy/proto/` field
//! for field (same numbers, same types), so they are wire-compatible with Envoy's. No `protoc`
//! is needed to build them.
//!
//! Module layout follows what `prost-build` would generate, one module per protobuf package.

/// `google.protobuf`: the well-known types used here.
pub mod google {
    /// `google.protobuf`.
    pub mod protobuf {
        /// `google.protobuf.Duration`.
        #[derive(Clone, Copy, PartialEq, Eq, ::prost::Message)]
        pub struct Duration {
            /// Whole seconds.
            #[prost(int64, tag = "1")]
            pub seconds: i64,
            /// Nanoseconds beyond `seconds` (0 to 999,999,999).
            #[prost(int32, tag = "2")]
            pub nanos: i32,
        }

        /// `google.protobuf.UInt64Value`.
        #[derive(Clone, Copy, PartialEq, Eq, ::prost::Message)]
        pub struct UInt64Value {
            /// The value.
            #[prost(uint64, tag = "1")]
            pub value: u64,
        }

        impl From<std::time::Duration> for Duration {
            fn from(d: std::time::Duration) -> Self {
                Duration {
                    seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                    // Below one billion, so it always fits.
                    nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
                }
            }
        }
    }
}

/// `envoy.*` packages.
pub mod envoy {
    /// `envoy.config.core.v3`.
    pub mod config_core_v3 {
        /// `envoy.config.core.v3.HeaderValue`.
        #[derive(Clone, PartialEq, Eq, ::prost::Message)]
        pub struct HeaderValue {
            /// Header name.
            #[prost(string, tag = "1")]
            pub key: String,
            /// Header value.
            #[prost(string, tag = "2")]
            pub value: String,
            /// Header value as bytes (Envoy uses it instead of `value` when set).
            #[prost(bytes = "vec", tag = "3")]
            pub raw_value: Vec<u8>,
        }
    }

    /// `envoy.extensions.common.ratelimit.v3`.
    pub mod common_ratelimit_v3 {
        /// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`: a list of key/value
        /// entries, matched against the configured descriptor tree.
        #[derive(Clone, PartialEq, Eq, ::prost::Message)]
        pub struct RateLimitDescriptor {
            /// The entries, outermost first.
            #[prost(message, repeated, tag = "1")]
            pub entries: Vec<rate_limit_descriptor::Entry>,
            /// A limit override: applies instead of the configured limit (see the crate docs).
            #[prost(message, optional, tag = "2")]
            pub limit: Option<rate_limit_descriptor::RateLimitOverride>,
            /// Hits this descriptor adds, overriding the request's `hits_addend`.
            #[prost(message, optional, tag = "3")]
            pub hits_addend: Option<super::super::google::protobuf::UInt64Value>,
        }

        /// Nested messages of [`RateLimitDescriptor`].
        pub mod rate_limit_descriptor {
            /// One key/value entry.
            #[derive(Clone, PartialEq, Eq, ::prost::Message)]
            pub struct Entry {
                /// Descriptor key.
                #[prost(string, tag = "1")]
                pub key: String,
                /// Descriptor value.
                #[prost(string, tag = "2")]
                pub value: String,
            }

            /// `RateLimitOverride`: a limit the client asks for instead of the configured one.
            #[derive(Clone, Copy, PartialEq, Eq, ::prost::Message)]
            pub struct RateLimitOverride {
                /// Requests per unit of time.
                #[prost(uint32, tag = "1")]
                pub requests_per_unit: u32,
                /// `envoy.type.v3.RateLimitUnit` as its number: `SECOND` 1, `MINUTE` 2, `HOUR` 3,
                /// `DAY` 4, `MONTH` 5, `YEAR` 6, `WEEK` 7 (an `int32` on the wire, as an enum is).
                #[prost(int32, tag = "2")]
                pub unit: i32,
            }
        }
    }

    /// `envoy.service.ratelimit.v3`.
    pub mod service_ratelimit_v3 {
        use super::common_ratelimit_v3::RateLimitDescriptor;
        use super::config_core_v3::HeaderValue;

        /// The gRPC path of `ShouldRateLimit`.
        pub const SHOULD_RATE_LIMIT_PATH: &str =
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

        /// `envoy.service.ratelimit.v3.RateLimitRequest`.
        #[derive(Clone, PartialEq, Eq, ::prost::Message)]
        pub struct RateLimitRequest {
            /// The configuration domain the descriptors are matched in.
            #[prost(string, tag = "1")]
            pub domain: String,
            /// The descriptors; the request is over limit if any of them is.
            #[prost(message, repeated, tag = "2")]
            pub descriptors: Vec<RateLimitDescriptor>,
            /// Hits the request adds to each matched limit; 0 means 1.
            #[prost(uint32, tag = "3")]
            pub hits_addend: u32,
        }

        /// `envoy.service.ratelimit.v3.RateLimitResponse`.
        #[derive(Clone, PartialEq, Eq, ::prost::Message)]
        pub struct RateLimitResponse {
            /// OK or OVER_LIMIT, over all descriptors.
            #[prost(enumeration = "rate_limit_response::Code", tag = "1")]
            pub overall_code: i32,
            /// One status per descriptor of the request, in order.
            #[prost(message, repeated, tag = "2")]
            pub statuses: Vec<rate_limit_response::DescriptorStatus>,
            /// Headers Envoy adds to the response to the client.
            #[prost(message, repeated, tag = "3")]
            pub response_headers_to_add: Vec<HeaderValue>,
            /// Headers Envoy adds to the request it forwards upstream.
            #[prost(message, repeated, tag = "4")]
            pub request_headers_to_add: Vec<HeaderValue>,
        }

        /// Nested types of [`RateLimitResponse`].
        pub mod rate_limit_response {
            /// `RateLimitResponse.Code`.
            #[derive(
                Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration,
            )]
            #[repr(i32)]
            pub enum Code {
                /// Not known.
                Unknown = 0,
                /// Under limit.
                Ok = 1,
                /// Over limit.
                OverLimit = 2,
            }

            /// `RateLimitResponse.RateLimit`: a limit as requests per unit.
            #[derive(Clone, PartialEq, Eq, ::prost::Message)]
            pub struct RateLimit {
                /// A name for the limit.
                #[prost(string, tag = "3")]
                pub name: String,
                /// Requests per unit of time.
                #[prost(uint32, tag = "1")]
                pub requests_per_unit: u32,
                /// The unit of time.
                #[prost(enumeration = "rate_limit::Unit", tag = "2")]
                pub unit: i32,
            }

            /// Nested types of [`RateLimit`].
            pub mod rate_limit {
                /// `RateLimitResponse.RateLimit.Unit`.
                #[derive(
                    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration,
                )]
                #[repr(i32)]
                pub enum Unit {
                    /// Not known (also: a window that is none of the units below).
                    Unknown = 0,
                    /// A second.
                    Second = 1,
                    /// A minute.
                    Minute = 2,
                    /// An hour.
                    Hour = 3,
                    /// A day.
                    Day = 4,
                    /// A month (30 days).
                    Month = 5,
                    /// A year (365 days).
                    Year = 6,
                    /// A week (7 days): added after `YEAR`, hence its number (envoy PR 37494).
                    Week = 7,
                }
            }

            /// `RateLimitResponse.DescriptorStatus`: the answer for one descriptor.
            #[derive(Clone, PartialEq, Eq, ::prost::Message)]
            pub struct DescriptorStatus {
                /// OK or OVER_LIMIT for this descriptor.
                #[prost(enumeration = "Code", tag = "1")]
                pub code: i32,
                /// The limit that applied; unset when none matched.
                #[prost(message, optional, tag = "2")]
                pub current_limit: Option<RateLimit>,
                /// What is left in the current window.
                #[prost(uint32, tag = "3")]
                pub limit_remaining: u32,
                /// Time until the limit is fully available again.
                #[prost(message, optional, tag = "4")]
                pub duration_until_reset: Option<super::super::super::google::protobuf::Duration>,
            }
        }
    }
}

/// `grpc.health.v1`.
pub mod health_v1 {
    /// The gRPC path of `Check`.
    pub const CHECK_PATH: &str = "/grpc.health.v1.Health/Check";
    /// The gRPC path of `Watch` (answered UNIMPLEMENTED).
    pub const WATCH_PATH: &str = "/grpc.health.v1.Health/Watch";

    /// `grpc.health.v1.HealthCheckRequest`.
    #[derive(Clone, PartialEq, Eq, ::prost::Message)]
    pub struct HealthCheckRequest {
        /// The service asked about; empty for the server as a whole.
        #[prost(string, tag = "1")]
        pub service: String,
    }

    /// `grpc.health.v1.HealthCheckResponse`.
    #[derive(Clone, PartialEq, Eq, ::prost::Message)]
    pub struct HealthCheckResponse {
        /// The status.
        #[prost(enumeration = "health_check_response::ServingStatus", tag = "1")]
        pub status: i32,
    }

    /// Nested types of [`HealthCheckResponse`].
    pub mod health_check_response {
        /// `HealthCheckResponse.ServingStatus`.
        #[derive(
            Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration,
        )]
        #[repr(i32)]
        pub enum ServingStatus {
            /// Not known.
            Unknown = 0,
            /// Serving.
            Serving = 1,
            /// Not serving.
            NotServing = 2,
            /// No such service.
            ServiceUnknown = 3,
        }
    }
}
