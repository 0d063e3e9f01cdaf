//! The `queue` action in the engine, on a clock the test controls: a denial that only `queue`
//! policies gave carries a ticket and consumed nothing; admitting the ticket charges the other
//! policies (all-or-nothing, no `Retry-After`), refunding gives that back; a denial by another
//! policy carries no ticket; and the tower layer, which cannot queue, answers 429.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::IpAddr;

use common::*;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use tollgate::{ManualClock, MemoryStore, Policy, Quota};
use tollgate_http::{Action, Disposition, Engine, HttpPolicy, KeyChain, RequestInfo};

fn engine(clock: ManualClock, other_limit: u32) -> Engine<MemoryStore, ManualClock> {
    let hooks = Policy::new(
        "hooks",
        Quota::leaky_bucket("1/s".parse().unwrap(), 0).unwrap(),
    )
    .unwrap();
    builder(clock)
        .policy(
            HttpPolicy::new(hooks)
                .keys(KeyChain::parse(["header:x-tenant"]).unwrap())
                .action(Action::Queue),
        )
        .policy(policy(
            fixed("per-tenant", other_limit, 3600),
            &["header:x-tenant"],
            None,
        ))
        .build()
        .unwrap()
}

fn tenant(name: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("x-tenant", HeaderValue::from_str(name).unwrap());
    h
}

/// The remaining quota of policy `name` in an evaluation's headers, as `RateLimit-Policy` lists
/// the policies: read from a fresh check instead, through the limiter.
async fn remaining(engine: &Engine<MemoryStore, ManualClock>, key: &[u8]) -> u64 {
    let p = engine.limiter().policy("per-tenant").unwrap().clone();
    let d = engine
        .limiter()
        .check_all(&[tollgate::Check::new(&p, key, 0)])
        .await
        .unwrap();
    d.as_slice()[0].remaining
}

#[tokio::test]
async fn a_queue_only_denial_carries_a_ticket_and_admitting_it_charges_the_others() {
    let clock = manual_clock();
    let engine = engine(clock.clone(), 5);
    let headers = tenant("t1");
    let peer: IpAddr = "10.0.0.1".parse().unwrap();
    let info = RequestInfo::new(&Method::POST, "/hooks/a", &headers).with_peer(Some(peer));
    // Under the rate: passes, both policies count it.
    let first = engine.evaluate(&info).await;
    assert!(matches!(first.disposition(), Disposition::Pass));
    // Over the rate of the queue policy only: a 429 with a ticket, nothing consumed.
    let second = engine.evaluate(&info).await;
    let Disposition::Respond(answer) = second.disposition() else {
        panic!("expected a 429")
    };
    assert_eq!(answer.status(), StatusCode::TOO_MANY_REQUESTS);
    let ticket = answer.queue_ticket().expect("a ticket");
    assert_eq!(ticket.policy(), "hooks");
    assert_eq!(ticket.cost(), 1);
    assert!(!ticket.decision().allowed);
    let key = second.decisions().as_slice()[1].policy;
    assert_eq!(key, "per-tenant");
    // The fixed window's key is the same selector's: read it from the ticket's key.
    let before = remaining(&engine, ticket.key()).await;
    assert_eq!(before, 4, "the denied request consumed nothing");

    // Queued: the other policy counts it now, and the 202's headers carry no Retry-After.
    let admitted = engine.admit_queued(ticket).await.expect("admitted");
    assert!(admitted.names().all(|n| n != "retry-after"));
    assert!(admitted.names().any(|n| n == "ratelimit"));
    assert_eq!(remaining(&engine, ticket.key()).await, 3);
    // The queue refused it after all: the charge is given back (by a task of its own).
    engine.refund_queued(ticket);
    for _ in 0..50 {
        if remaining(&engine, ticket.key()).await == 4 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(remaining(&engine, ticket.key()).await, 4);
}

#[tokio::test]
async fn a_denial_by_another_policy_has_no_ticket_and_admitting_can_be_refused() {
    let clock = manual_clock();
    let engine = engine(clock.clone(), 2);
    let headers = tenant("t2");
    let info = RequestInfo::new(&Method::POST, "/hooks/a", &headers)
        .with_peer(Some("10.0.0.2".parse().unwrap()));
    assert!(matches!(
        engine.evaluate(&info).await.disposition(),
        Disposition::Pass
    ));
    let queued = engine.evaluate(&info).await;
    let Disposition::Respond(answer) = queued.disposition() else {
        panic!("expected a 429")
    };
    let ticket = answer.queue_ticket().expect("a ticket").clone();
    // The window's last unit goes to the queued request...
    assert!(engine.admit_queued(&ticket).await.is_ok());
    // ... so a second ticket for the same tenant is refused by the window, as any denial.
    let refused = engine.admit_queued(&ticket).await.expect_err("refused");
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(refused.queue_ticket().is_none());
    assert!(refused.headers().any(|(n, _)| n == "retry-after"));
    // Once the window is spent, a request is denied by it too: no ticket (queueing would not
    // get it past the window).
    clock.advance(std::time::Duration::from_secs(5));
    let after = engine.evaluate(&info).await;
    let Disposition::Respond(answer) = after.disposition() else {
        panic!("expected a 429")
    };
    assert!(answer.queue_ticket().is_none());
}

#[tokio::test]
async fn the_layer_cannot_queue_and_answers_429() {
    let clock = manual_clock();
    let app = app(engine(clock, 100));
    let h = [("x-tenant", "t3")];
    assert_eq!(
        status(&app, get("/hooks/a", "1.1.1.1", &h)).await,
        StatusCode::OK
    );
    let r = send(&app, get("/hooks/a", "1.1.1.1", &h)).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(header_u64(&r, "retry-after") >= 1);
}

#[test]
fn queue_is_an_action_of_leaky_buckets_only() {
    assert_eq!("queue".parse::<Action>().unwrap(), Action::Queue);
    assert_eq!(Action::Queue.to_string(), "queue");
    let err = builder(manual_clock())
        .policy(HttpPolicy::new(fixed("api", 5, 60)).action(Action::Queue))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("leaky_bucket"), "{err}");
}
