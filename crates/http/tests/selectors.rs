//! Key selectors against a real axum app: each selector, the fallback chain, kinds kept apart,
//! spoofed forwarding headers, IPv6 grouping, JWTs that must not be trusted, anonymous keys
//! and `require_key`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use common::*;
use http::{Request, StatusCode};
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde::Serialize;
use tollgate_http::{JwtVerifier, TrustedProxies, UserId};

/// Test-only key pair (generated for these tests; protects nothing).
const EC_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgqtOkNsMjB+WeQzyB
BAEc9RE7LqPtbe7rKDSHnLF2qyShRANCAAT3Oh0ZfVIeid+CWxioYyvja1TWS/Wv
0HeRQdpCl8vRJe4/oAUeeE/4ciemeoi6beFikMtiwntAU8P7/JPrJM1p
-----END PRIVATE KEY-----
";
const EC_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE9zodGX1SHonfglsYqGMr42tU1kv1
r9B3kUHaQpfL0SXuP6AFHnhP+HInpnqIum3hYpDLYsJ7QFPD+/yT6yTNaQ==
-----END PUBLIC KEY-----
";
const RSA_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MIIEvAIBADANBgkqhkiG9w0BAQEFAASCBKYwggSiAgEAAoIBAQDUp6QgroTy0e+g
gWFl4YpdRFNCChjzQGogp3Vpc4OdWU2ZqWDNo9ITD8jjhAh86rqocqieHSijq4aH
JMpjq+gp0eDTQC40e6l/ohYqJumHrNm7nJA2ZsqVG+mfdaceeWYHi1F1GwFDUCkR
mnptZvjRQ09Gt18b13sDP5wEoj3yDAiMyDfY+yHLbcSexxPMVaWYtSHxoD/8Q5rK
Ta+KJCfRLFtM9A4iaFj9ovBskOz7yn3M75O1Ei1db30tO2xHHnxPCAGyfp8b1eus
AuxCpBd2bRm/zOVyDGX/++Jrj0PR7eSQaQnrArRDYGTJNhJVqZCz5ReuILOtps79
lt/MaMnLAgMBAAECggEABea2YfHLNAcqDy+H9GZ94Hi07BrmS68jQs9i2A+h52FD
C1tCmceiB3AOCGzxj1s0Mth7tWePE9D+urav/HQYzTr1x5GltpnNP616eqZPH2S8
kL2Xgur3VDaiFRAUGH8QmxpSowf3e6wNzQnsZnzPtX7uBEMHxfivgTeSrM4+dH5e
qb7kQfrvakzXZGH4oPzkb3JJVEmeo9ZemtD3btRfkOMO4/J8jQe84sGt4LiwX806
p58sjt59uLUfrUq6yCID+kIRmcIFXfUXzfWcD/iyS8JzvjYGM/J8ksWndBC4vCMo
4bk873XmbO4z5+MM2auim39Rlbn+Vv3YJ4WgKCm3AQKBgQD+Lmvbk9RHvDS04BD2
YC7aflP7TTE5MeTzGFavmV/d6D4JskTIg0ptZkTbph5ikFk/aN9paAHaeblnyQF6
H9cvOIuwFnGywbiqKXk0jo+k09zG392o31NKIQNLbO4uPG8N9BrzakyXlpZM0+rU
VHEiEU/pzWvlrfCD8P9es1fayQKBgQDWLSgXFHe8Cz7UQ8ZNDYhgQ3lwyk5VOYYZ
o8Lh8Js5Z2956JEsKiZItNkcsgEGmNLeXWyq86w0mPz5RjvP966y9hqOQXPlmTR3
4j68LEctsOj68hQm5lUwJrpXUM9UVkLS65WYqBnhuCZQ6E2UDMnY/GZLMmhoguB0
Vbm1NbS18wKBgBbVFq03v0beWiGxSvTGuQ65cFPPoE9R8w3/LrJBZcIqPYBjehhE
6uee2yqb5njWHJ48jm0KgbgdXRE8lhxhRdQhETM1IOt8yVjHtvKIp9CXk2pt65xi
yzmKc6BP3alblmI7fjxFXTH0vfWSx7JhD3SO9425/So5kLRZbqcUFx05AoGAXLXl
YcBBaEvx4Y6I+3e9LfZnTjS0nd2tt9GUnZs6hinJLptGpDiGo/hs9yfym7lxpkII
tSOPyqDi+MC3SXnszJkNu8CHe77K4I42G9yK3zNyVpaNtJ0GCTbqeLuJU/eXK5hB
BHjX40aEh4dXdZvnkB8J5MkoOv1UTeeB4PgjhpMCgYA9MRVp4Ni3yO236qGxzWXu
VjLEmJ9t9E91HdddCu2b5AHI3aS780uzpgiOW2UP3krFZLNXIkZkmi4vaM75HjT1
Qhd/jdhJYwnR0BiJ0hv6FiM93sEKBy9in92NR3R45MInKdHTG+1LgdjVzCcK78NV
n7LHgpXx76kEcTQzWiW4ag==
-----END PRIVATE KEY-----
";
const RSA_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA1KekIK6E8tHvoIFhZeGK
XURTQgoY80BqIKd1aXODnVlNmalgzaPSEw/I44QIfOq6qHKonh0oo6uGhyTKY6vo
KdHg00AuNHupf6IWKibph6zZu5yQNmbKlRvpn3WnHnlmB4tRdRsBQ1ApEZp6bWb4
0UNPRrdfG9d7Az+cBKI98gwIjMg32Pshy23EnscTzFWlmLUh8aA//EOayk2viiQn
0SxbTPQOImhY/aLwbJDs+8p9zO+TtRItXW99LTtsRx58TwgBsn6fG9XrrALsQqQX
dm0Zv8zlcgxl//via49D0e3kkGkJ6wK0Q2BkyTYSVamQs+UXriCzrabO/ZbfzGjJ
ywIDAQAB
-----END PUBLIC KEY-----
";
const SECRET: &[u8] = b"test-secret-for-hs256-only-in-tests";

#[derive(Serialize)]
struct Claims<'a> {
    sub: &'a str,
    exp: u64,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn hs256(sub: &str, exp: u64, secret: &[u8]) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        &Claims { sub, exp },
        &EncodingKey::from_secret(secret),
    )
    .unwrap()
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// `limit` a minute per `x-api-key`, or per IP without one.
fn api_key_or_ip(
    limit: u32,
) -> tollgate_http::Engine<tollgate::MemoryStore, tollgate::ManualClock> {
    builder(manual_clock())
        .policy(policy(
            fixed("api", limit, 60),
            &["header:x-api-key", "ip"],
            None,
        ))
        .build()
        .unwrap()
}

#[tokio::test]
async fn header_key_each_key_has_its_own_quota() {
    let engine = api_key_or_ip(2);
    let app = app(engine);
    for _ in 0..2 {
        assert_eq!(
            status(&app, get("/", "1.1.1.1", &[("x-api-key", "a")])).await,
            StatusCode::OK
        );
    }
    assert_eq!(
        status(&app, get("/", "2.2.2.2", &[("x-api-key", "a")])).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another key, same IP: its own quota.
    assert_eq!(
        status(&app, get("/", "1.1.1.1", &[("x-api-key", "b")])).await,
        StatusCode::OK
    );
    // No key: falls back to the IP.
    assert_eq!(status(&app, get("/", "1.1.1.1", &[])).await, StatusCode::OK);
}

#[tokio::test]
async fn selector_kind_is_part_of_the_key() {
    let engine = api_key_or_ip(1);
    let app = app(engine);
    // The IP 1.2.3.4 spends its quota...
    assert_eq!(status(&app, get("/", "1.2.3.4", &[])).await, StatusCode::OK);
    assert_eq!(
        status(&app, get("/", "1.2.3.4", &[])).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // ...the API key "1.2.3.4" still has its own.
    assert_eq!(
        status(&app, get("/", "9.9.9.9", &[("x-api-key", "1.2.3.4")])).await,
        StatusCode::OK
    );
}

#[tokio::test]
async fn query_key() {
    let engine = builder(manual_clock())
        .policy(policy(fixed("api", 1, 60), &["query:api_key", "ip"], None))
        .build()
        .unwrap();
    let app = app(engine);
    assert_eq!(
        status(&app, get("/x?api_key=k1", "1.1.1.1", &[])).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&app, get("/x?a=b&api%5Fkey=k1", "2.2.2.2", &[])).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status(&app, get("/x?api_key=k2", "1.1.1.1", &[])).await,
        StatusCode::OK
    );
}

#[tokio::test]
async fn user_key_from_extensions() {
    let engine = builder(manual_clock())
        .policy(policy(fixed("api", 1, 60), &["user", "ip"], None))
        .build()
        .unwrap();
    let app = app(engine);
    let as_user = |user: &str, ip: &str| {
        let mut r = get("/", ip, &[]);
        r.extensions_mut().insert(UserId::new(user));
        r
    };
    assert_eq!(
        status(&app, as_user("alice", "1.1.1.1")).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&app, as_user("alice", "2.2.2.2")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status(&app, as_user("bob", "1.1.1.1")).await,
        StatusCode::OK
    );
    // A user id longer than 256 bytes is hashed, and still one key.
    let long = "u".repeat(10_000);
    assert_eq!(
        status(&app, as_user(&long, "3.3.3.3")).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&app, as_user(&long, "4.4.4.4")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn spoofed_forwarded_for_from_an_untrusted_peer_is_ignored() {
    let engine = builder(manual_clock())
        .policy(policy(fixed("api", 1, 60), &["ip"], None))
        .trusted_proxies(TrustedProxies::parse(["10.0.0.0/8"]).unwrap())
        .build()
        .unwrap();
    let app = app(engine);
    assert_eq!(
        status(
            &app,
            get("/", "203.0.113.9", &[("x-forwarded-for", "1.1.1.1")])
        )
        .await,
        StatusCode::OK
    );
    // A new forged address each time: still the same peer, still the same key.
    assert_eq!(
        status(
            &app,
            get("/", "203.0.113.9", &[("x-forwarded-for", "2.2.2.2")])
        )
        .await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status(
            &app,
            get("/", "203.0.113.9", &[("forwarded", "for=3.3.3.3")])
        )
        .await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn trusted_proxy_hops_are_walked_right_to_left() {
    let engine = builder(manual_clock())
        .policy(policy(fixed("api", 1, 60), &["ip"], None))
        .trusted_proxies(TrustedProxies::parse(["10.0.0.0/8"]).unwrap())
        .build()
        .unwrap();
    let app = app(engine);
    // Client 198.51.100.7 behind two trusted proxies; the left-most entry is the client's own
    // forgery and must not matter.
    let xff = [("x-forwarded-for", "6.6.6.6, 198.51.100.7, 10.0.0.5")];
    assert_eq!(
        status(&app, get("/", "10.0.0.1", &xff)).await,
        StatusCode::OK
    );
    let xff = [("x-forwarded-for", "7.7.7.7, 198.51.100.7, 10.0.0.5")];
    assert_eq!(
        status(&app, get("/", "10.0.0.2", &xff)).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let other = [("x-forwarded-for", "198.51.100.8")];
    assert_eq!(
        status(&app, get("/", "10.0.0.1", &other)).await,
        StatusCode::OK
    );
}

#[tokio::test]
async fn ipv6_rotation_inside_one_64_shares_a_key() {
    let engine = builder(manual_clock())
        .policy(policy(fixed("api", 2, 60), &["ip"], None))
        .build()
        .unwrap();
    let app = app(engine);
    assert_eq!(
        status(&app, get("/", "2001:db8:1:2::1", &[])).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&app, get("/", "2001:db8:1:2:ffff:1:2:3", &[])).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&app, get("/", "2001:db8:1:2:dead:beef::9", &[])).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The next /64 is another client.
    assert_eq!(
        status(&app, get("/", "2001:db8:1:3::1", &[])).await,
        StatusCode::OK
    );
}

#[tokio::test]
async fn ipv6_prefix_is_configurable() {
    let engine = builder(manual_clock())
        .policy(policy(fixed("api", 1, 60), &["ip"], None))
        .ipv6_prefix(48)
        .build()
        .unwrap();
    let app = app(engine);
    assert_eq!(
        status(&app, get("/", "2001:db8:1:2::1", &[])).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&app, get("/", "2001:db8:1:3::1", &[])).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

fn jwt_app(verifier: JwtVerifier) -> axum::Router {
    let engine = builder(manual_clock())
        .policy(policy(fixed("api", 1, 60), &["jwt:sub", "ip"], None))
        .jwt(verifier)
        .build()
        .unwrap();
    app(engine)
}

#[tokio::test]
async fn valid_hs256_jwt_gives_the_key() {
    let app = jwt_app(JwtVerifier::hs256(SECRET).unwrap());
    let alice = bearer(&hs256("alice", now() + 3600, SECRET));
    assert_eq!(
        status(&app, get("/", "1.1.1.1", &[("authorization", &alice)])).await,
        StatusCode::OK
    );
    // Same subject from another address: same key.
    assert_eq!(
        status(&app, get("/", "2.2.2.2", &[("authorization", &alice)])).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let bob = bearer(&hs256("bob", now() + 3600, SECRET));
    assert_eq!(
        status(&app, get("/", "2.2.2.2", &[("authorization", &bob)])).await,
        StatusCode::OK
    );
}

#[tokio::test]
async fn es256_jwt_verifies_with_the_public_key() {
    let app = jwt_app(JwtVerifier::es256_pem(EC_PUBLIC.as_bytes()).unwrap());
    let key = EncodingKey::from_ec_pem(EC_PRIVATE.as_bytes()).unwrap();
    let token = encode(
        &Header::new(Algorithm::ES256),
        &Claims {
            sub: "carol",
            exp: now() + 60,
        },
        &key,
    )
    .unwrap();
    let auth = bearer(&token);
    assert_eq!(
        status(&app, get("/", "1.1.1.1", &[("authorization", &auth)])).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&app, get("/", "2.2.2.2", &[("authorization", &auth)])).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // An HS256 token "signed" with the public key (the classic confusion attack) is absent.
    let confused = hs256("carol", now() + 60, EC_PUBLIC.as_bytes());
    assert_eq!(
        status(
            &app,
            get("/", "3.3.3.3", &[("authorization", &bearer(&confused))])
        )
        .await,
        StatusCode::OK
    );
}

#[tokio::test]
async fn rs256_jwt_verifies_with_the_public_key() {
    let app = jwt_app(JwtVerifier::rs256_pem(RSA_PUBLIC.as_bytes()).unwrap());
    let key = EncodingKey::from_rsa_pem(RSA_PRIVATE.as_bytes()).unwrap();
    let token = encode(
        &Header::new(Algorithm::RS256),
        &Claims {
            sub: "dave",
            exp: now() + 60,
        },
        &key,
    )
    .unwrap();
    let auth = bearer(&token);
    assert_eq!(
        status(&app, get("/", "1.1.1.1", &[("authorization", &auth)])).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&app, get("/", "2.2.2.2", &[("authorization", &auth)])).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // A token signed with the ES256 test key does not verify against the RSA key.
    let ec = EncodingKey::from_ec_pem(EC_PRIVATE.as_bytes()).unwrap();
    let other = encode(
        &Header::new(Algorithm::ES256),
        &Claims {
            sub: "dave",
            exp: now() + 60,
        },
        &ec,
    )
    .unwrap();
    assert_eq!(
        status(
            &app,
            get("/", "3.3.3.3", &[("authorization", &bearer(&other))])
        )
        .await,
        StatusCode::OK
    );
}

#[test]
fn bad_keys_are_configuration_errors() {
    let err = JwtVerifier::rs256_pem(b"not a pem").unwrap_err();
    assert!(err.to_string().contains("RSA public key"), "{err}");
    let err = JwtVerifier::es256_pem(RSA_PUBLIC.as_bytes()).unwrap_err();
    assert!(err.to_string().contains("EC public key"), "{err}");
    assert!(JwtVerifier::hs256(b"").is_err());
}

/// Forged, `alg: none`, expired and oversized tokens are absent: the request falls back to its
/// IP, so each of them from a fresh IP passes, and none of them spends the real subject's quota.
#[tokio::test]
async fn untrusted_jwts_are_absent() {
    let app = jwt_app(JwtVerifier::hs256(SECRET).unwrap());
    let forged = hs256("alice", now() + 3600, b"not-the-secret");
    let expired = hs256("alice", now() - 3600, SECRET);
    let none = {
        use base64_like::encode as b64;
        format!(
            "{}.{}.",
            b64(br#"{"alg":"none","typ":"JWT"}"#),
            b64(format!(r#"{{"sub":"alice","exp":{}}}"#, now() + 3600).as_bytes())
        )
    };
    let huge = format!(
        "{}.{}.{}",
        "a".repeat(30_000),
        "b".repeat(30_000),
        "c".repeat(5_000)
    );
    for (i, token) in [forged, expired, none, huge].iter().enumerate() {
        let ip = format!("10.9.9.{i}");
        let auth = bearer(token);
        assert_eq!(
            status(&app, get("/", &ip, &[("authorization", &auth)])).await,
            StatusCode::OK,
            "token {i}"
        );
        // Its key was the IP: the second request from that IP is limited.
        assert_eq!(
            status(&app, get("/", &ip, &[("authorization", &auth)])).await,
            StatusCode::TOO_MANY_REQUESTS,
            "token {i}"
        );
    }
    // alice's quota is untouched.
    let alice = bearer(&hs256("alice", now() + 3600, SECRET));
    assert_eq!(
        status(&app, get("/", "8.8.8.8", &[("authorization", &alice)])).await,
        StatusCode::OK
    );
}

/// Just enough unpadded base64url for the hand-made `alg: none` token.
mod base64_like {
    pub(crate) fn encode(input: &[u8]) -> String {
        const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in input.chunks(3) {
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..=chunk.len() {
                out.push(char::from(T[((n >> (18 - 6 * i)) & 63) as usize]));
            }
        }
        out
    }
}

#[tokio::test]
async fn no_key_counts_under_anonymous() {
    let engine = builder(manual_clock())
        .policy(policy(fixed("api", 1, 60), &["header:x-api-key"], None))
        .build()
        .unwrap();
    let app = app(engine);
    assert_eq!(status(&app, get("/", "1.1.1.1", &[])).await, StatusCode::OK);
    // Everyone without a key shares one quota.
    assert_eq!(
        status(&app, get("/", "2.2.2.2", &[])).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status(&app, get("/", "2.2.2.2", &[("x-api-key", "k")])).await,
        StatusCode::OK
    );
}

#[tokio::test]
async fn require_key_answers_401_problem_json() {
    let engine = builder(manual_clock())
        .policy(
            policy(fixed("api", 5, 60), &["header:x-api-key"], Some("/v1/**")).require_key(true),
        )
        .build()
        .unwrap();
    let app = app(engine);
    let response = send(&app, get("/v1/x", "1.1.1.1", &[])).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        header(&response, "content-type"),
        Some("application/problem+json")
    );
    let body = body_json(response).await;
    assert_eq!(body["status"], 401);
    assert_eq!(
        status(&app, get("/v1/x", "1.1.1.1", &[("x-api-key", "k")])).await,
        StatusCode::OK
    );
    // Outside the policy's routes no key is needed.
    assert_eq!(
        status(&app, get("/health", "1.1.1.1", &[])).await,
        StatusCode::OK
    );
}

#[tokio::test]
async fn peer_from_axum_connect_info() {
    use axum::extract::ConnectInfo;
    use std::net::SocketAddr;
    use tollgate_http::RateLimitLayer;
    let engine = builder(manual_clock())
        .policy(policy(fixed("api", 1, 60), &["ip"], None))
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(engine)
        .peer_addr(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()));
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "hi" }))
        .layer(layer);
    let req = |ip: [u8; 4]| {
        Request::builder()
            .uri("/")
            .extension(ConnectInfo(SocketAddr::from((ip, 1234))))
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(status(&app, req([1, 1, 1, 1])).await, StatusCode::OK);
    assert_eq!(
        status(&app, req([1, 1, 1, 1])).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(status(&app, req([2, 2, 2, 2])).await, StatusCode::OK);
}

/// A route that matches on the host, through the layer: the `Host` header or the URI's
/// authority decides; other hosts pass uncounted and without headers. (The layer looks the host
/// up only for engines with such a route.)
#[tokio::test]
async fn a_host_route_through_the_layer_counts_only_its_host() {
    let route = tollgate_http::RouteMatch::any()
        .host("api.example.com")
        .unwrap();
    let engine = builder(manual_clock())
        .policy(
            tollgate_http::HttpPolicy::new(fixed("api-host", 1, 60))
                .keys(tollgate_http::KeyChain::parse(["ip"]).unwrap())
                .route(route),
        )
        .build()
        .unwrap();
    let app = app(engine);
    let with_host = |uri: &str, host: Option<&str>| {
        let mut b = Request::builder().uri(uri).extension(peer("192.0.2.1"));
        if let Some(host) = host {
            b = b.header("host", host);
        }
        b.body(Body::empty()).unwrap()
    };
    let other = send(&app, with_host("/x", Some("www.example.com"))).await;
    assert_eq!(other.status(), StatusCode::OK);
    assert!(header(&other, "ratelimit-policy").is_none());
    let first = send(&app, with_host("/x", Some("api.example.com"))).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(header(&first, "x-ratelimit-remaining"), Some("0"));
    assert_eq!(
        status(&app, with_host("/x", Some("api.example.com"))).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The authority of an absolute URI counts as the host.
    assert_eq!(
        status(&app, with_host("http://api.example.com/y", None)).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status(&app, with_host("/x", Some("www.example.com"))).await,
        StatusCode::OK
    );
}

/// The layer asks for the peer address only when a key needs the client's address: a request
/// keyed by its API key never looks, an anonymous one falls back to the IP and does.
#[tokio::test]
async fn the_peer_is_looked_up_only_when_a_key_needs_it() {
    use std::net::IpAddr;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tollgate_http::RateLimitLayer;
    static LOOKUPS: AtomicUsize = AtomicUsize::new(0);
    fn counted(ext: &http::Extensions) -> Option<IpAddr> {
        LOOKUPS.fetch_add(1, Ordering::SeqCst);
        tollgate_http::rate_limit::default_peer(ext)
    }
    let engine = api_key_or_ip(1);
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "hi" }))
        .layer(RateLimitLayer::new(engine).peer_addr(counted));
    assert_eq!(
        status(&app, get("/", "192.0.2.1", &[("x-api-key", "k1")])).await,
        StatusCode::OK
    );
    assert_eq!(LOOKUPS.load(Ordering::SeqCst), 0);
    assert_eq!(
        status(&app, get("/", "192.0.2.1", &[])).await,
        StatusCode::OK
    );
    assert_eq!(LOOKUPS.load(Ordering::SeqCst), 1);
    // The peer it found is the key: the same address again is over its limit.
    assert_eq!(
        status(&app, get("/", "192.0.2.1", &[])).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[test]
fn the_engine_lists_the_headers_its_decisions_read() {
    let engine = builder(manual_clock())
        .policy(policy(swc("a", 10, 60), &["header:x-api-key", "ip"], None))
        .policy(policy(
            swc("b", 10, 60),
            &["jwt:sub", "header:X-API-Key", "query:k"],
            None,
        ))
        .jwt(tollgate_http::JwtVerifier::hs256(b"0123456789abcdef0123456789abcdef").unwrap())
        .build()
        .unwrap();
    let names: Vec<&str> = engine.headers_read().iter().map(|n| n.as_str()).collect();
    assert_eq!(names, ["x-forwarded-for", "x-api-key", "authorization"]);
    let engine = builder(manual_clock())
        .forwarded_header(tollgate_http::ForwardedHeader::Forwarded)
        .policy(policy(swc("a", 10, 60), &["ip"], None))
        .build()
        .unwrap();
    let names: Vec<&str> = engine.headers_read().iter().map(|n| n.as_str()).collect();
    assert_eq!(names, ["forwarded"]);
}
