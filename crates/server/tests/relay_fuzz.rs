//! The proxy's invariant, fuzzed: random and mutated byte streams (pipelined requests, every
//! combination of `Connection`, `Transfer-Encoding` and `Content-Length`, bodies that hide a
//! request, absolute-form targets, duplicated fields, forwarding headers; see
//! `common/fuzz_case.rs`) go through the real proxy, from several clients at once, to a
//! recording upstream that reads HTTP/1.1 as leniently as a careless server would
//! (`common/lenient.rs`). Every request carries a key of its own (or of its client's), and
//! which policies count it depends on its method, path and host. Then, per case:
//!
//! - every request the upstream read was counted as exactly that request: for each policy that
//!   its method, target and host match, under the key its `X-Forwarded-For` gives, the limiter
//!   counted (read back from `/v1/check` at cost 0) at least as many requests as the upstream
//!   read; when no byte was flipped and no length lied, exactly as many, give or take a
//!   request whose body broke after it was counted. In a quarter of the cases (`audit`), the
//!   counters of every request the clients sent are read too: nothing was counted on them but
//!   what went up;
//! - the upstream never reads a request that was only ever a body (a smuggled one), and every
//!   request it reads is the one the client sent under that id: same method, target, host and
//!   key (when the stream was not mutated);
//! - every answer a client reads is for one of its own requests, in order, once;
//! - meanwhile (every 16th case), the proxy answers a plain request from another client.
//!
//! The number of cases is bounded for CI (`TOLLGATE_FUZZ_CASES`, default 1000); run more by
//! hand with a larger value.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
// Only this test uses them: included here rather than in `common/mod.rs`, which every test
// binary compiles.
#[path = "common/fuzz_case.rs"]
mod fuzz_case;
#[path = "common/fuzz_count.rs"]
mod fuzz_count;
#[path = "common/lenient.rs"]
mod lenient;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use fuzz_case::{Case, Framing, Intent, SMUGGLED_SLOT, Spec, ip_key, key_addr, read_id};
use fuzz_count::{Counted, POLICIES, Pair, Policy, client_of, pairs, round_of};
use lenient::Seen;
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;
use tollgate_http::RouteMatch;

/// The shared setup: a runtime, the recording upstream, the proxy and its decision API.
struct Rig {
    rt: tokio::runtime::Runtime,
    proxy: SocketAddr,
    api: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    routes: Vec<RouteMatch>,
}

fn rig() -> &'static Rig {
    static RIG: OnceLock<Rig> = OnceLock::new();
    RIG.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (proxy, api) = rt.block_on(async {
            let up = lenient::upstream(Arc::clone(&seen)).await;
            let mut text = format!(
                "[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{up}\"\ntimeout = \"1s\"\ntrusted_proxies = [\"127.0.0.0/8\"]\n\n"
            );
            for p in &POLICIES {
                text.push_str(&p.toml());
            }
            let s = common::start_text(&text).await;
            let addrs = (s.proxy.unwrap(), s.api);
            // Kept running for the whole test binary.
            std::mem::forget(s);
            addrs
        });
        Rig {
            rt,
            proxy,
            api,
            seen,
            routes: POLICIES.iter().map(Policy::route).collect(),
        }
    })
}

/// [`fuzz_count::counted_all`] on the rig's server.
fn counted_all(rig: &Rig, pairs: impl Iterator<Item = Pair>) -> HashMap<Pair, u64> {
    rig.rt.block_on(fuzz_count::counted_all(rig.api, pairs))
}

// ---------------------------------------------------------------------------------------------
// A case.

/// Runs one client's case from `peer`; what it read: the ids of the answers it got, in order.
async fn run_client(addr: SocketAddr, peer: Ipv4Addr, bytes: Vec<u8>, piece: usize) -> Vec<String> {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind((peer, 0).into()).unwrap();
    let mut s = socket.connect(addr).await.expect("the proxy is up");
    let pieces: Vec<&[u8]> = if piece == 0 {
        vec![&bytes[..]]
    } else {
        bytes.chunks(piece).collect()
    };
    for p in pieces {
        if s.write_all(p).await.is_err() {
            break;
        }
    }
    let _ = s.shutdown().await;
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got)).await;
    let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
    text.split("\r\n")
        .filter_map(|l| l.strip_prefix("x-echo: "))
        .filter_map(lenient::unhex)
        .collect()
}

/// Runs every client of `round` at once; each one's answers, and what the upstream read
/// meanwhile.
fn run(
    rig: &'static Rig,
    round: u64,
    streams: Vec<(Vec<u8>, usize)>,
) -> (Vec<Vec<String>>, Vec<Seen>) {
    let from = rig.seen.lock().unwrap().len();
    let peer = fuzz_case::peer_addr(round);
    let answers = rig.rt.block_on(async {
        let runs: Vec<_> = streams
            .into_iter()
            .map(|(bytes, piece)| tokio::spawn(run_client(rig.proxy, peer, bytes, piece)))
            .collect();
        let mut answers = Vec::new();
        for run in runs {
            answers.push(run.await.unwrap());
        }
        answers
    });
    let seen = rig.seen.lock().unwrap()[from..].to_vec();
    (answers, seen)
}

/// The counters the client meant each request (and each request its body hides) for, and how
/// far the count may exceed what the upstream read on each key: `None` when the bytes may mean
/// other requests (flips, a lying length before), else the requests that may be counted and
/// then break before their head goes up.
struct Meant {
    pairs: Vec<Pair>,
    slack: HashMap<String, Option<u64>>,
}

fn meant(rig: &Rig, clients: &[Case], intents: &[Vec<Intent>], round: u64) -> Meant {
    let mut m = Meant {
        pairs: Vec::new(),
        slack: HashMap::new(),
    };
    for (c, (case, intents)) in clients.iter().zip(intents).enumerate() {
        for (i, (spec, intent)) in case.specs.iter().zip(intents).enumerate() {
            let hidden = ip_key(key_addr(round, c, SMUGGLED_SLOT + i).into());
            let mut requests = vec![(
                intent.method,
                intent.target.as_str(),
                intent.host.as_str(),
                &intent.key,
            )];
            if spec.smuggle {
                requests.push(("GET", "/api/s", "a.test", &hidden));
            }
            for (method, target, host, key) in requests {
                // Routed as if it had no `x-api-key`: its counters by address, which a request
                // refused for two of them must leave alone.
                let request = Counted {
                    method,
                    target,
                    host: Some(host).filter(|h| !h.is_empty()),
                    ip_key: key.clone(),
                    api_keys: 0,
                };
                let routed = pairs(&rig.routes, &request).unwrap_or_default();
                m.pairs
                    .extend(routed.into_iter().map(|(p, _)| (p, key.clone())));
            }
            let may_break = u64::from(spec.framing.may_break_after_counting());
            let slack = m.slack.entry(intent.key.clone()).or_insert(Some(0));
            *slack = match slack {
                Some(s) if case.as_meant(i) => Some(*s + may_break),
                _ => None,
            };
            // Only ever a body when its request means what it says.
            m.slack.insert(hidden, case.as_meant(i).then_some(0));
        }
    }
    // A flipped byte or a lying length anywhere may turn any request's forwarded address
    // unreadable: the key they then share is the peer's.
    let all_meant = clients.iter().all(|c| c.as_meant(c.specs.len()));
    if !all_meant {
        m.slack.insert(fuzz_case::peer_key(round), None);
    }
    m
}

static ROUND: AtomicU64 = AtomicU64::new(0);

fn cases() -> u32 {
    std::env::var("TOLLGATE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// Every request the upstream read was counted as exactly that request; with no byte flipped
/// and no length lying, nothing else was counted on its keys. With `audit`, the counters of
/// every request the clients sent are read too, the upstream's or not: nothing was counted on
/// them but what went up. (Most requests of a case never do: refused, or after a refusal. Their
/// counters are most of the reads, and a read costs about a quarter of a millisecond.)
fn check_counts(
    rig: &'static Rig,
    seen: &[Seen],
    meant: &Meant,
    round: u64,
    audit: bool,
) -> Result<(), TestCaseError> {
    let mut read: HashMap<Pair, u64> = HashMap::new();
    for s in seen {
        let request = Counted {
            method: &s.method,
            target: &s.target,
            host: Some(s.host.as_str()),
            ip_key: ip_key(client_of(&s.forwarded_for)),
            api_keys: s.api_keys.len(),
        };
        let routed =
            pairs(&rig.routes, &request).map_err(|e| TestCaseError::fail(format!("{e}: {s:?}")))?;
        for (policy, key) in routed {
            // An `x-api-key` is stored as a keyed hash: its counter cannot be named here.
            if let Some(key) = key {
                *read.entry((policy, key)).or_default() += 1;
            }
        }
    }
    let mut all: Vec<Pair> = read.keys().cloned().collect();
    if audit {
        all.extend(meant.pairs.iter().cloned());
    }
    all.sort();
    all.dedup();
    let now = counted_all(rig, all.into_iter());
    for (pair, &n) in &now {
        let r = read.get(pair).copied().unwrap_or(0);
        prop_assert!(
            n >= r,
            "the upstream read {r} requests on {pair:?}, the limiter counted {n}: {seen:#?}"
        );
        // Keys of this round whose requests all meant what the generator meant: nothing more
        // counted than read, but for bodies that broke after the count.
        let ours = pair.1 == fuzz_case::peer_key(round) || round_of(&pair.1) == Some(round);
        if let (true, Some(Some(slack))) = (ours, meant.slack.get(&pair.1)) {
            prop_assert!(
                n <= r + slack,
                "{pair:?}: counted {n}, the upstream read {r} (slack {slack}): {seen:#?}"
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_request_upstream_was_counted_as_itself_and_no_client_reads_anothers_answer(
        clients in prop::collection::vec(fuzz_case::case(), 1..4),
        audit in prop::bool::weighted(0.25),
    ) {
        let rig = rig();
        let round = ROUND.fetch_add(1, Ordering::SeqCst);
        let rendered: Vec<(Vec<u8>, Vec<Intent>)> =
            clients.iter().enumerate().map(|(c, case)| case.render(round, c)).collect();
        let intents: Vec<Vec<Intent>> = rendered.iter().map(|(_, i)| i.clone()).collect();
        let meant = meant(rig, &clients, &intents, round);
        let mut streams: Vec<(Vec<u8>, usize)> =
            rendered.into_iter().zip(&clients).map(|((b, _), c)| (b, c.piece)).collect();
        // Every 16th case (each is another connection and exchange), a plain request alongside.
        let plain = round.is_multiple_of(16).then(|| plain_request(round));
        if let Some((bytes, _)) = &plain {
            streams.push((bytes.clone(), 0));
        }
        let (mut answers, seen) = run(rig, round, streams);
        if let Some((_, id)) = plain {
            prop_assert_eq!(answers.pop(), Some(vec![id]), "the proxy stopped answering");
        }
        check_identity(&clients, &intents, &seen, round)?;
        check_answers(&answers, round)?;
        check_counts(rig, &seen, &meant, round, audit)?;
    }
}

/// A plain request from another client of the round, and its id: while the case's clients do
/// what they do, the proxy still answers it.
fn plain_request(round: u64) -> (Vec<u8>, String) {
    let id = format!("plain{round}");
    let key = key_addr(round, 0xf, 0xf);
    let request =
        format!("GET /pub/{id} HTTP/1.1\r\nHost: a.test\r\nX-Forwarded-For: {key}\r\n\r\n");
    (request.into_bytes(), id)
}

/// The upstream never read a request that was only ever a body, and read every request the way
/// its client meant it: method, target, host and key.
fn check_identity(
    clients: &[Case],
    intents: &[Vec<Intent>],
    seen: &[Seen],
    round: u64,
) -> Result<(), TestCaseError> {
    for s in seen {
        // Which client and request sent it (one a body hid carries `s` and the id of the
        // request whose body it was).
        let Some(sent) = read_id(&s.id).filter(|id| id.round == round) else {
            continue;
        };
        let Some(case) = clients.get(sent.client) else {
            continue;
        };
        if !case.as_meant(sent.request) {
            continue;
        }
        prop_assert!(!sent.hidden, "smuggled past the limiter: {s:?}");
        let Some(intent) = intents[sent.client].get(sent.request) else {
            continue;
        };
        prop_assert_eq!(&s.method, intent.method, "{:?}", s);
        prop_assert_eq!(&s.target, &intent.target, "{:?}", s);
        if !intent.host.is_empty() {
            prop_assert_eq!(&s.host, &intent.host, "{:?}", s);
        }
        prop_assert_eq!(
            ip_key(client_of(&s.forwarded_for)),
            intent.key.clone(),
            "{:?}",
            s
        );
    }
    Ok(())
}

/// Every answer a client read is for one of its own requests, in order, once. (An id a flipped
/// byte garbled is unreadable, and skipped.)
fn check_answers(answers: &[Vec<String>], round: u64) -> Result<(), TestCaseError> {
    for (c, ids) in answers.iter().enumerate() {
        let mut last: Option<usize> = None;
        for id in ids {
            let Some(sent) = read_id(id).filter(|id| id.round == round) else {
                continue;
            };
            prop_assert_eq!(sent.client, c, "client {} read an answer for {}", c, id);
            if sent.hidden {
                continue;
            }
            prop_assert!(
                last.is_none_or(|l| sent.request > l),
                "client {c}: answers out of order: {ids:?}"
            );
            last = Some(sent.request);
        }
    }
    Ok(())
}

/// The smuggling attempt of issue 12, on keys of its own: counted once, as itself, on the
/// policies its method and path match; the request its body hides counted nowhere and read by
/// no one.
#[test]
fn a_smuggling_attempt_is_counted_once_as_itself() {
    let rig = rig();
    // A round the fuzz never reaches.
    let round = 0xffff_ffff;
    let case = Case {
        specs: vec![Spec {
            method: "POST",
            target: 0,
            host: 0,
            api_keys: 0,
            forwarded: 0,
            key_slot: 0,
            connection: vec!["content-length"],
            framing: Framing::Length,
            smuggle: true,
            http10: false,
        }],
        flips: Vec::new(),
        piece: 0,
    };
    let (bytes, intents) = case.render(round, 0);
    let (answers, seen) = run(rig, round, vec![(bytes, 0)]);
    assert_eq!(answers, [vec![intents[0].id.clone()]]);
    let key = intents[0].key.clone();
    let hidden = ip_key(key_addr(round, 0, SMUGGLED_SLOT).into());
    let read: Vec<&Seen> = seen
        .iter()
        .filter(|s| [&key, &hidden].contains(&&ip_key(client_of(&s.forwarded_for))))
        .collect();
    assert_eq!(read.len(), 1, "{read:?}");
    assert_eq!(read[0].id, intents[0].id);
    let want = [
        (("every", key.clone()), 1),
        (("api-write", key.clone()), 1),
        (("api-read", key.clone()), 0),
        (("every", hidden.clone()), 0),
        (("api-read", hidden), 0),
    ];
    let got = counted_all(rig, want.iter().map(|(p, _)| p.clone()));
    for (pair, n) in want {
        assert_eq!(got[&pair], n, "{pair:?}");
    }
}
