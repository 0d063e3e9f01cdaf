//! Per-key overrides through the layer: the overridden key is decided under the override's
//! quota (and told so in its headers), other keys under the policy's, all-or-nothing still
//! holds, and expiry follows the engine's clock. A property compares the engine against a
//! reference limiter whose policies carry the quotas the overrides stand for.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use http::StatusCode;
use proptest::prelude::*;
use tollgate::{Check, Clock, Limiter, ManualClock, MemoryStore, Quota, Store, Timestamp};
use tollgate_http::{Engine, OverrideError, QuotaFields};

fn limit(n: u32) -> QuotaFields {
    QuotaFields {
        limit: Some(n),
        ..QuotaFields::default()
    }
}

fn engine_with(clock: ManualClock) -> Engine<MemoryStore, ManualClock> {
    builder(clock)
        .policy(policy(swc("api", 5, 60), &["ip"], None))
        .build()
        .unwrap()
}

fn set(
    engine: &Engine<MemoryStore, ManualClock>,
    key: &str,
    fields: QuotaFields,
    expires: Option<Timestamp>,
) {
    let over = engine.compile_override("api", &fields, expires).unwrap();
    engine.set_overrides([(Box::<[u8]>::from(key.as_bytes()), over)]);
}

#[tokio::test]
async fn an_override_sets_the_quota_of_one_key_and_its_headers() {
    let engine = engine_with(manual_clock());
    set(&engine, "ip:1.1.1.1", limit(2), None);
    assert_eq!(engine.override_count(), 1);
    let app = app(engine);
    for expected in [
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
    ] {
        let r = send(&app, get("/x", "1.1.1.1", &[])).await;
        assert_eq!(r.status(), expected);
        assert_eq!(header_u64(&r, "x-ratelimit-limit"), 2);
        let policy = sf_items(header(&r, "ratelimit-policy").unwrap());
        assert_eq!((policy[0].name.as_str(), policy[0].param("q")), ("api", 2));
        assert_eq!(policy[0].param("w"), 60);
    }
    // Everyone else keeps the policy's quota.
    for _ in 0..5 {
        let r = send(&app, get("/x", "2.2.2.2", &[])).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header_u64(&r, "x-ratelimit-limit"), 5);
    }
    assert_eq!(
        status(&app, get("/x", "2.2.2.2", &[])).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn all_or_nothing_holds_when_an_override_denies() {
    let clock = manual_clock();
    let engine = builder(clock.clone())
        .policy(policy(swc("wide", 10, 60), &["ip"], None))
        .policy(policy(swc("api", 10, 60), &["ip"], None))
        .build()
        .unwrap();
    let over = engine.compile_override("api", &limit(1), None).unwrap();
    let wide = engine.policies().next().unwrap().policy.clone();
    engine.set_overrides([(Box::<[u8]>::from(&b"ip:1.1.1.1"[..]), over)]);
    let app = app(engine.clone());
    assert_eq!(
        status(&app, get("/x", "1.1.1.1", &[])).await,
        StatusCode::OK
    );
    for _ in 0..3 {
        let r = send(&app, get("/x", "1.1.1.1", &[])).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            body_json(r).await["violated-policies"],
            serde_json::json!(["api"])
        );
    }
    // The denied requests took nothing from the other policy: one unit spent, nine left.
    let now = clock.now();
    let peek = engine
        .limiter()
        .store()
        .apply(now, &[Check::new(&wide, b"ip:1.1.1.1", 0)])
        .await
        .unwrap();
    assert_eq!(peek.as_slice()[0].remaining, 9);
}

#[tokio::test]
async fn an_override_ends_when_the_engine_clock_passes_its_expiry() {
    let clock = manual_clock();
    let engine = engine_with(clock.clone());
    set(
        &engine,
        "ip:1.1.1.1",
        limit(1),
        Some(Timestamp::from_secs(START + 10)),
    );
    let app = app(engine.clone());
    assert_eq!(
        status(&app, get("/x", "1.1.1.1", &[])).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&app, get("/x", "1.1.1.1", &[])).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert!(engine.key_override("api", b"ip:1.1.1.1").is_some());
    clock.advance(Duration::from_secs(10));
    assert!(engine.key_override("api", b"ip:1.1.1.1").is_none());
    // Back on the policy's own state, which the overridden requests never touched.
    for _ in 0..5 {
        let r = send(&app, get("/x", "1.1.1.1", &[])).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header_u64(&r, "x-ratelimit-limit"), 5);
    }
    assert_eq!(
        status(&app, get("/x", "1.1.1.1", &[])).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Removing every override takes effect at once, too.
    engine.set_overrides([]);
    assert_eq!(engine.override_count(), 0);
}

#[test]
fn overrides_that_cannot_apply_are_refused_by_field() {
    let engine = builder(manual_clock())
        .policy(policy(swc("api", 5, 60), &["ip"], None).cost(3))
        .build()
        .unwrap();
    assert_eq!(
        engine.compile_override("nope", &limit(3), None).err(),
        Some(OverrideError::UnknownPolicy)
    );
    let capacity = QuotaFields {
        capacity: Some(3),
        ..QuotaFields::default()
    };
    for (fields, field) in [
        (capacity, "capacity"),
        (limit(2), "limit"),
        (limit(0), "limit"),
    ] {
        match engine.compile_override("api", &fields, None) {
            Err(OverrideError::Field { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{fields:?}: {other:?}"),
        }
    }
    assert!(engine.compile_override("api", &limit(3), None).is_ok());
}

/// One step of the property: a request from key `0` (overridden) or `1`, after `advance_ms`.
#[derive(Clone, Debug)]
struct Step {
    key: usize,
    advance_ms: u64,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (0usize..2, prop_oneof![Just(0u64), 0u64..3_000])
            .prop_map(|(key, advance_ms)| Step { key, advance_ms }),
        1..120,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Through the engine, an overridden key gets exactly the decisions of a plain limiter
    /// whose policy has the override's quota; the other key those of the configured quota.
    #[test]
    fn decisions_equal_a_policy_with_the_override_quota(
        steps in steps(),
        base in 1u32..6,
        over in 1u32..6,
        window in 1u64..8,
        algorithm in 0usize..3,
    ) {
        let make = |limit: u32| {
            let w = Duration::from_secs(window);
            match algorithm {
                0 => Quota::fixed_window(limit, w),
                1 => Quota::sliding_window_log(limit, w),
                _ => Quota::sliding_window_counter(limit, w),
            }
            .unwrap()
        };
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let clock = manual_clock();
            let engine = builder(clock.clone())
                .policy(policy(tollgate::Policy::new("api", make(base)).unwrap(), &["ip"], None))
                .build()
                .unwrap();
            set(&engine, "ip:1.1.1.1", limit(over), None);
            let reference_clock = manual_clock();
            let reference = Limiter::builder()
                .clock(reference_clock.clone())
                .policy(tollgate::Policy::new("overridden", make(over)).unwrap())
                .policy(tollgate::Policy::new("configured", make(base)).unwrap())
                .build()
                .unwrap();
            let app = app(engine);
            for step in steps {
                clock.advance(Duration::from_millis(step.advance_ms));
                reference_clock.advance(Duration::from_millis(step.advance_ms));
                let ip = ["1.1.1.1", "2.2.2.2"][step.key];
                let got = send(&app, get("/x", ip, &[])).await;
                let want = reference
                    .check(["overridden", "configured"][step.key], format!("ip:{ip}"), 1)
                    .await
                    .unwrap();
                prop_assert_eq!(got.status() == StatusCode::OK, want.allowed, "{:?}", step);
                prop_assert_eq!(header_u64(&got, "x-ratelimit-remaining"), want.remaining);
                prop_assert_eq!(header_u64(&got, "x-ratelimit-limit"), u64::from([over, base][step.key]));
            }
            Ok(())
        })?;
    }
}
