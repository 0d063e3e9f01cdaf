//! Shared helpers of the gRPC tests: a server on 127.0.0.1:0 with a manual clock, request
//! builders, and a structured-field reader for the IETF headers (the `sfv` parser, never a
//! regex).
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate::{Limiter, ManualClock, MemoryStore, Store, Timestamp};
use tollgate_envoy::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_envoy::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_envoy::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use tollgate::{AlgorithmKind, Quota};
use tollgate_envoy::{Config, Descriptor, Domain, RateLimit, RlsClient, RlsService, Unit, serve};

/// A running server; stops when dropped.
pub struct Server {
    pub addr: SocketAddr,
    pub clock: ManualClock,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Server {
    pub async fn client(&self) -> RlsClient {
        RlsClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

pub const START: u64 = 1_700_000_000;

/// The configuration most gRPC tests share.
pub fn edge() -> Config {
    Config::new().domain(
        Domain::new("edge")
            .descriptor(Descriptor::new("api_key").rate_limit(RateLimit::per(5, Unit::Minute)))
            .descriptor(
                Descriptor::new("api_key")
                    .value("gold")
                    .rate_limit(RateLimit::per(2, Unit::Minute)),
            )
            .descriptor(Descriptor::new("generic_key").value("foo").descriptor(
                Descriptor::new("remote_address").rate_limit(RateLimit::per(1, Unit::Second)),
            ))
            .descriptor(Descriptor::new("path").rate_limit(RateLimit::per(10, Unit::Hour)))
            .descriptor(
                Descriptor::new("client")
                    .value("beta")
                    .shadow_mode(true)
                    .rate_limit(RateLimit::per(1, Unit::Minute)),
            )
            .descriptor(
                Descriptor::new("remote_address")
                    .value("10.0.0.1")
                    .rate_limit(RateLimit::unlimited()),
            )
            .descriptor(
                Descriptor::new("tb").rate_limit(
                    RateLimit::per(3, Unit::Second).algorithm(AlgorithmKind::TokenBucket),
                ),
            )
            .descriptor(Descriptor::new("custom").rate_limit(RateLimit::quota(
                Quota::sliding_window_counter(7, Duration::from_secs(90)).unwrap(),
            ))),
    )
}

pub async fn start(config: Config) -> Server {
    start_with(MemoryStore::default(), config).await
}

pub async fn start_with<S: Store>(store: S, config: Config) -> Server {
    let clock = ManualClock::new(Timestamp::from_secs(START));
    let limiter = Limiter::builder()
        .store(store)
        .clock(clock.clone())
        .build()
        .expect("limiter");
    let service = RlsService::new(limiter, &config).expect("config");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        serve(listener, service, async {
            let _ = stopped.await;
        })
        .await
        .expect("serve");
    });
    Server {
        addr,
        clock,
        stop: Some(stop),
        task: Some(task),
    }
}

pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        limit: None,
        hits_addend: None,
    }
}

pub fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors.iter().map(|d| descriptor(d)).collect(),
        hits_addend: 0,
    }
}

pub fn header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

/// One item of a structured-field list: a string name with integer parameters.
#[derive(Debug, PartialEq, Eq)]
pub struct Item {
    pub name: String,
    pub params: Vec<(String, i64)>,
}

impl Item {
    pub fn param(&self, key: &str) -> i64 {
        self.params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("no {key} in {self:?}"))
    }
}

/// Parses a structured-field list of named items with integer parameters, as the IETF draft writes them
/// `RateLimit-Policy` and `RateLimit` are.
pub fn sf_items(value: &str) -> Vec<Item> {
    use sfv::{BareItem, ListEntry, Parser};
    let list = Parser::new(value)
        .parse::<sfv::List>()
        .expect("structured field list");
    list.into_iter()
        .map(|entry| match entry {
            ListEntry::Item(item) => {
                let name = match item.bare_item {
                    BareItem::String(s) => s.as_str().to_owned(),
                    other => panic!("item is not a string: {other:?}"),
                };
                let params = item
                    .params
                    .into_iter()
                    .map(|(k, v)| match v {
                        BareItem::Integer(i) => (k.as_str().to_owned(), i64::from(i)),
                        other => panic!("parameter {k:?} is not an integer: {other:?}"),
                    })
                    .collect();
                Item { name, params }
            }
            ListEntry::InnerList(_) => panic!("inner list in {value:?}"),
        })
        .collect()
}
