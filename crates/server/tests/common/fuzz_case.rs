//! The proxy fuzz's inputs: requests generated from a [`Spec`] (every combination of
//! `Connection`, `Transfer-Encoding` and `Content-Length`, bodies that hide a request,
//! absolute-form targets, duplicated fields, forwarding headers), written as bytes, and each
//! client's [`Case`]: pipelined requests, byte flips, pieces.
//!
//! Every request carries the key the limiter counts it under, in `X-Forwarded-For` (the proxy
//! trusts 127.0.0.0/8, where its clients connect from, so the element left of those is the
//! client): an IPv6 /64 of its own per round, client and key slot, whose groups check each other
//! ([`key_addr`]), so that a flipped byte can make a key unreadable or unknown, never another
//! request's. A request without one is counted under its peer, an address of its round's own
//! ([`peer_addr`]).
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

/// How a request says where its body ends.
#[derive(Clone, Debug)]
pub enum Framing {
    None,
    Length,
    LengthShort(usize),
    LengthLong(usize),
    LengthTwice,
    Chunked,
    ChunkedBadSize,
    ChunkedBareLf,
    ChunkedAndLength,
    ChunkedTwice,
    Gzip,
}

impl Framing {
    /// Its length lies: the bytes after it mean other requests than the generator's.
    pub fn lies(&self) -> bool {
        matches!(self, Framing::LengthShort(_) | Framing::LengthLong(_))
    }

    /// The proxy may count the request and then refuse or lose its body before the upstream
    /// has read its head.
    pub fn may_break_after_counting(&self) -> bool {
        matches!(
            self,
            Framing::ChunkedBadSize | Framing::ChunkedBareLf | Framing::LengthLong(_)
        )
    }
}

/// One request, as the generator means it.
#[derive(Clone, Debug)]
pub struct Spec {
    pub method: &'static str,
    /// 0 origin /api, 1 origin /pub, 2 absolute to b.test, 3 deep dots to /api, 4 /tight
    pub target: u8,
    /// 0, 1 `Host: a.test`; 2 two `Host`s; 3 none
    pub host: u8,
    /// 0 none; 2 two `x-api-key` headers (the `/pub` policy reads it: refused there)
    pub api_keys: u8,
    /// 0 the key alone; 1 after an address of the client's own; 2 the same in two lines;
    /// 3 after a byte that is not UTF-8; 4 no `X-Forwarded-For` (the peer is the key)
    pub forwarded: u8,
    /// Which of its client's keys it is counted under: requests may share one.
    pub key_slot: u8,
    pub connection: Vec<&'static str>,
    pub framing: Framing,
    /// The body carries a whole request of its own, under a key of its own.
    pub smuggle: bool,
    pub http10: bool,
}

/// What the client means: the id, method, origin-form target, host and key the upstream must
/// read, and the limiter count.
#[derive(Clone, Debug)]
pub struct Intent {
    pub id: String,
    pub method: &'static str,
    pub target: String,
    pub host: String,
    pub key: String,
}

/// Key slots 0..4 are a client's own; 4 + i is the one request `i`'s body hides.
pub const SMUGGLED_SLOT: usize = 4;

/// The address of key `slot` of `client` in `round`: `fdCS:hi:lo:check::1`, with the round's
/// halves and a check over the first three groups, so that changing any one group (a flipped
/// byte) makes it no key at all.
pub fn key_addr(round: u64, client: usize, slot: usize) -> Ipv6Addr {
    let tag = 0xfd00 | ((client as u16 & 0xf) << 4) | (slot as u16 & 0xf);
    let (hi, lo) = ((round >> 16) as u16, round as u16);
    Ipv6Addr::new(tag, hi, lo, tag ^ hi ^ lo ^ 0x5a5a, 0, 0, 0, 1)
}

/// The round of a key [`key_addr`] made, if `ip` is one.
pub fn key_round(ip: IpAddr) -> Option<u64> {
    let IpAddr::V6(v6) = ip else { return None };
    let [tag, hi, lo, check, ..] = v6.segments();
    (tag >> 8 == 0xfd && check == tag ^ hi ^ lo ^ 0x5a5a)
        .then(|| (u64::from(hi) << 16) | u64::from(lo))
}

/// The store key the `ip` selector makes of `ip`: the address, or its /64 (the default
/// `ipv6_prefix`).
pub fn ip_key(ip: IpAddr) -> String {
    match ip.to_canonical() {
        IpAddr::V4(v4) => format!("ip:{v4}"),
        IpAddr::V6(v6) => {
            let [a, b, c, d, ..] = v6.segments();
            format!("ip:{}/64", Ipv6Addr::new(a, b, c, d, 0, 0, 0, 0))
        }
    }
}

/// The address the clients of `round` connect from: one of 127.0.0.0/8 of its own, so that the
/// key of a request without a readable forwarded address (the peer's) is one no other round
/// shares.
pub fn peer_addr(round: u64) -> Ipv4Addr {
    let [.., a, b, c] = round.to_be_bytes();
    // 127.1.0.0 to 127.254.255.255: never 127.0.0.1, which the rest of the test uses.
    Ipv4Addr::new(127, a % 254 + 1, b, c)
}

/// The key of a request without a readable forwarded address in `round`: its peer's.
pub fn peer_key(round: u64) -> String {
    ip_key(IpAddr::V4(peer_addr(round)))
}

/// Requests of every shape [`Spec`] describes.
pub fn spec() -> impl Strategy<Value = Spec> {
    (
        (
            prop::sample::select(vec!["GET", "POST", "PUT", "HEAD", "DELETE"]),
            0u8..5,
            0u8..4,
            prop_oneof![3 => Just(0u8), 1 => Just(2u8)],
            prop_oneof![4 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8), 1 => Just(3u8), 1 => Just(4u8)],
            0u8..3,
        ),
        prop::collection::vec(
            prop::sample::select(vec![
                "close",
                "keep-alive",
                "content-length",
                "transfer-encoding",
                "host",
                "x-api-key",
                "x-forwarded-for",
                "x-req-id",
                "upgrade",
            ]),
            0..3,
        ),
        prop_oneof![
            4 => Just(Framing::None),
            4 => Just(Framing::Length),
            1 => (1usize..4).prop_map(Framing::LengthShort),
            1 => (1usize..4).prop_map(Framing::LengthLong),
            1 => Just(Framing::LengthTwice),
            4 => Just(Framing::Chunked),
            1 => Just(Framing::ChunkedBadSize),
            1 => Just(Framing::ChunkedBareLf),
            1 => Just(Framing::ChunkedAndLength),
            1 => Just(Framing::ChunkedTwice),
            1 => Just(Framing::Gzip),
        ],
        any::<bool>(),
        prop::bool::weighted(0.1),
    )
        .prop_map(
            |(
                (method, target, host, api_keys, forwarded, key_slot),
                connection,
                framing,
                smuggle,
                http10,
            )| Spec {
                method,
                target,
                host,
                api_keys,
                forwarded,
                key_slot,
                connection,
                framing,
                smuggle,
                http10,
            },
        )
}

/// Who sent a request: what an id [`request_id`] made says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestId {
    pub round: u64,
    pub client: usize,
    pub request: usize,
    /// The request the body of that one hides.
    pub hidden: bool,
}

/// The id of request `request` of `client` in `round`: `c{round}x{client}r{request}k{check}`,
/// the check a hash of the rest, so that a flipped byte can make an id unreadable, never
/// another request's (the one its body hides has `s` in front).
pub fn request_id(round: u64, client: usize, request: usize) -> String {
    let bare = format!("c{round}x{client}r{request}");
    format!("{bare}k{:04x}", id_check(&bare))
}

/// FNV-1a of `bare`, folded to 16 bits.
fn id_check(bare: &str) -> u16 {
    let h = bare.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    (h ^ (h >> 16)) as u16
}

/// What `id` says, if [`request_id`] made it.
pub fn read_id(id: &str) -> Option<RequestId> {
    let (hidden, id) = match id.strip_prefix('s') {
        Some(rest) => (true, rest),
        None => (false, id),
    };
    let (bare, check) = id.rsplit_once('k')?;
    if check.len() != 4 || u16::from_str_radix(check, 16).ok()? != id_check(bare) {
        return None;
    }
    let (round, rest) = bare.strip_prefix('c')?.split_once('x')?;
    let (client, request) = rest.split_once('r')?;
    Some(RequestId {
        round: round.parse().ok()?,
        client: client.parse().ok()?,
        request: request.parse().ok()?,
        hidden,
    })
}

/// The bytes of `spec` as request `request` of `client` in `round` (its id: [`request_id`]).
pub fn render(spec: &Spec, round: u64, client: usize, request: usize) -> (Vec<u8>, Intent) {
    let id = request_id(round, client, request);
    let target = match spec.target {
        0 => format!("/api/{id}"),
        1 => format!("/pub/{id}"),
        2 => format!("http://b.test/api/{id}"),
        3 => format!("/x/y/../../api/./{id}"),
        _ => format!("/tight/{id}"),
    };
    // The host the upstream must read: the target's authority, the Host header, or (HTTP/1.0
    // without one) the upstream's own, which the intent leaves open.
    let host = match (spec.target, spec.host) {
        (2, _) => "b.test",
        (_, 3) => "",
        _ => "a.test",
    }
    .to_owned();
    let origin = target
        .strip_prefix("http://b.test")
        .unwrap_or(&target)
        .to_owned();
    let version = if spec.http10 { "HTTP/1.0" } else { "HTTP/1.1" };
    let mut head = format!("{} {target} {version}\r\n", spec.method);
    match spec.host {
        0 | 1 => head.push_str("Host: a.test\r\n"),
        2 => head.push_str("Host: a.test\r\nHost: b.test\r\n"),
        _ => {}
    }
    head.push_str(&format!("x-req-id: {id}\r\n"));
    for n in 0..spec.api_keys {
        head.push_str(&format!("x-api-key: k{n}-{id}\r\n"));
    }
    let addr = key_addr(round, client, usize::from(spec.key_slot));
    match spec.forwarded {
        0 => head.push_str(&format!("X-Forwarded-For: {addr}\r\n")),
        1 => head.push_str(&format!("X-Forwarded-For: 203.0.113.7, {addr}\r\n")),
        2 => head.push_str(&format!(
            "X-Forwarded-For: 203.0.113.7\r\nX-Forwarded-For: {addr}\r\n"
        )),
        // DEL stands for a byte that is not UTF-8, put in below.
        3 => head.push_str(&format!("X-Forwarded-For: \u{7f}, {addr}\r\n")),
        _ => {}
    }
    let key = if spec.forwarded == 4 {
        peer_key(round)
    } else {
        ip_key(addr.into())
    };
    if !spec.connection.is_empty() {
        head.push_str(&format!("Connection: {}\r\n", spec.connection.join(", ")));
    }
    let payload = if spec.smuggle {
        let hidden = key_addr(round, client, SMUGGLED_SLOT + request);
        format!(
            "GET /api/s{id} HTTP/1.1\r\nHost: a.test\r\nx-req-id: s{id}\r\nX-Forwarded-For: {hidden}\r\n\r\n"
        )
    } else {
        format!("body-of-{id}")
    };
    let (framing, body) = frame(&spec.framing, &payload);
    head.push_str(&framing);
    head.push_str("\r\n");
    head.push_str(&body);
    let mut bytes = head.into_bytes();
    if let Some(del) = bytes.iter().position(|&b| b == 0x7f) {
        bytes[del] = 0xe9;
    }
    let intent = Intent {
        id,
        method: spec.method,
        target: origin,
        host,
        key,
    };
    (bytes, intent)
}

/// The framing header lines and the body for `payload`.
fn frame(framing: &Framing, payload: &str) -> (String, String) {
    let chunk = |p: &str| format!("{:x}\r\n{p}\r\n0\r\n\r\n", p.len());
    let n = payload.len();
    match framing {
        Framing::None => (String::new(), String::new()),
        Framing::Length => (format!("Content-Length: {n}\r\n"), payload.into()),
        Framing::LengthShort(k) => (
            format!("Content-Length: {}\r\n", n.saturating_sub(*k)),
            payload.into(),
        ),
        Framing::LengthLong(k) => (format!("Content-Length: {}\r\n", n + k), payload.into()),
        Framing::LengthTwice => (
            format!("Content-Length: {n}\r\nContent-Length: 0\r\n"),
            payload.into(),
        ),
        Framing::Chunked => ("Transfer-Encoding: chunked\r\n".into(), chunk(payload)),
        Framing::ChunkedBadSize => (
            "Transfer-Encoding: chunked\r\n".into(),
            format!("ACE {payload}\r\n0\r\n\r\n"),
        ),
        Framing::ChunkedBareLf => (
            "Transfer-Encoding: chunked\r\n".into(),
            format!("{n:x}\n{payload}\r\n0\r\n\n"),
        ),
        Framing::ChunkedAndLength => (
            format!("Transfer-Encoding: chunked\r\nContent-Length: {n}\r\n"),
            chunk(payload),
        ),
        Framing::ChunkedTwice => (
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n".into(),
            chunk(payload),
        ),
        Framing::Gzip => (
            "Transfer-Encoding: gzip, chunked\r\n".into(),
            chunk(payload),
        ),
    }
}

/// One client's case: its requests, and byte flips over the whole stream.
#[derive(Clone, Debug)]
pub struct Case {
    pub specs: Vec<Spec>,
    pub flips: Vec<(prop::sample::Index, u8)>,
    /// Written in pieces of this size (0: at once).
    pub piece: usize,
}

impl Case {
    /// The bytes it sends, flips applied, and what each of its requests means.
    pub fn render(&self, round: u64, client: usize) -> (Vec<u8>, Vec<Intent>) {
        let mut bytes = Vec::new();
        let mut intents = Vec::new();
        for (i, spec) in self.specs.iter().enumerate() {
            let (b, intent) = render(spec, round, client, i);
            bytes.extend_from_slice(&b);
            intents.push(intent);
        }
        for (at, byte) in &self.flips {
            let i = at.index(bytes.len());
            bytes[i] = *byte;
        }
        (bytes, intents)
    }

    /// Whether request `i` means what the generator meant: no byte was flipped and no earlier
    /// request's length lied (`...r0GET /api/...` is a valid request for method `0GET`, and a
    /// shortened length turns a body into a request the limiter does decide on).
    pub fn as_meant(&self, i: usize) -> bool {
        self.flips.is_empty() && !self.specs.iter().take(i).any(|s| s.framing.lies())
    }
}

/// One to three requests, a quarter of the time with bytes flipped, and a quarter of the time
/// written a few bytes at a time.
pub fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(spec(), 1..4),
        prop_oneof![
            3 => Just(Vec::new()),
            1 => prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ],
        prop_oneof![3 => Just(0usize), 1 => 1usize..7],
    )
        .prop_map(|(specs, flips, piece)| Case {
            specs,
            flips,
            piece,
        })
}
