//! Random input through the whole engine: whatever the method, path, query, headers and peer,
//! evaluating never panics and answers only 200-class verdicts, 429, 401, or 400 for a key
//! field that came twice or a field that says what the request is and cannot be read.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use proptest::prelude::*;
use tollgate_http::{Disposition, ForwardedHeader, JwtVerifier, RequestInfo, TrustedProxies};

fn header_name() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "x-api-key",
        "authorization",
        "x-forwarded-for",
        "forwarded",
        "host",
        "x-tenant",
    ])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn evaluate_never_panics(
        path in "/[a-z%./0-9{}*]{0,40}",
        query in proptest::option::of("[a-z=&%+0-9]{0,30}"),
        headers in prop::collection::vec((header_name(), prop::collection::vec(any::<u8>(), 0..60)), 0..6),
        peer in any::<[u8; 16]>(),
        v4 in any::<bool>(),
        forwarded in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let engine = builder(manual_clock())
            .policy(policy(fixed("a", 3, 60), &["header:x-api-key", "jwt:sub", "query:k", "ip"], Some("/v1/**")))
            .policy(policy(fixed("b", 2, 60), &["header:x-tenant"], Some("/*/{id}/**")).require_key(true))
            .policy(policy(fixed("c", 1, 60), &[], None))
            .trusted_proxies(TrustedProxies::parse(["0.0.0.0/0", "::/0"]).unwrap())
            .forwarded_header(if forwarded { ForwardedHeader::Forwarded } else { ForwardedHeader::XForwardedFor })
            .jwt(JwtVerifier::hs256(b"k").unwrap())
            .build()
            .unwrap();
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            // Only what HTTP can carry: header values exclude control bytes other than tab.
            if let Ok(v) = HeaderValue::from_bytes(&value) {
                map.append(HeaderName::from_static(name), v);
            }
        }
        let peer: std::net::IpAddr = if v4 {
            std::net::Ipv4Addr::new(peer[0], peer[1], peer[2], peer[3]).into()
        } else {
            std::net::Ipv6Addr::from(peer).into()
        };
        let target = match &query {
            Some(q) => format!("{path}?{q}"),
            None => path.clone(),
        };
        let method = Method::GET;
        let info = RequestInfo::new(&method, &target, &map).with_peer(Some(peer));
        let evaluation = rt.block_on(engine.evaluate(&info));
        if let Disposition::Respond(answer) = evaluation.disposition() {
            let s = answer.status().as_u16();
            // 400 only for a key field that came more than once (a repeated header, or a
            // query that could name `k` twice); the 40-byte paths never reach the depth bound.
            let repeated = ["x-api-key", "authorization", "x-tenant"]
                .iter()
                .any(|n| map.get_all(*n).iter().count() > 1);
            let query_may_repeat = query.as_deref().is_some_and(|q| q.contains('&'));
            // ...or for a field that says what the request is and cannot be read: its host,
            // or what the (trusted) peer reported of the client.
            let describes = ["host", "x-forwarded-for", "forwarded"]
                .iter()
                .any(|n| map.contains_key(*n));
            prop_assert!(
                s == 429 || s == 401 || (s == 400 && (repeated || query_may_repeat || describes)),
                "status {}",
                s
            );
        }
    }
}
