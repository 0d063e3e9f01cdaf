//! The drop-in promise as one list: one row per behaviour of envoyproxy/ratelimit's own config,
//! service and limiter tests (and its README examples) that Tollgate supports, each with
//! Tollgate's own YAML. A row either names a configuration the peer refuses (Tollgate must
//! refuse it, naming the file and the descriptor) or calls `ShouldRateLimit` step by step on a
//! manual clock and checks every status as the peer would answer it. The rows are in
//! `peer/config_rows.rs` and `peer/service_rows.rs`, each with the peer test it mirrors in a
//! comment.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod peer {
    pub(crate) mod config_rows;
    pub(crate) mod dsl;
    pub(crate) mod service_rows;
}

use std::time::Duration;

use peer::dsl::{Check, Row, Step};
use tollgate::{Limiter, ManualClock, Timestamp};
use tollgate_envoy::proto::envoy::service::ratelimit::v3::RateLimitResponse;
use tollgate_envoy::{Config, RlsService, parse_envoy_config};

/// 20 s into a minute, 800 s into an hour: resets are easy to tell apart.
const START: u64 = 1_700_000_000;

fn config(row: &Row) -> Result<Config, tollgate_envoy::ConfigError> {
    let mut config = Config::new();
    for (name, yaml) in row.files {
        config = config.domain(parse_envoy_config(name, yaml)?);
    }
    config.validate()?;
    Ok(config)
}

async fn run(row: &Row) {
    let steps = match &row.check {
        Check::Refused(needles) => {
            let err = config(row)
                .err()
                .unwrap_or_else(|| panic!("{}: the peer refuses this configuration", row.name))
                .to_string();
            for needle in *needles {
                assert!(
                    err.contains(needle),
                    "{}: {err:?} lacks {needle:?}",
                    row.name
                );
            }
            return;
        }
        Check::Steps(steps) => steps,
    };
    let config = config(row).unwrap_or_else(|e| panic!("{}: {e}", row.name));
    let clock = ManualClock::new(Timestamp::from_secs(START));
    let limiter = Limiter::builder().clock(clock.clone()).build().unwrap();
    let service = RlsService::new(limiter, &config).unwrap();
    for (n, step) in steps.iter().enumerate() {
        let at = format!("{} step {n}", row.name);
        match step {
            Step::Advance(secs) => clock.advance(Duration::from_secs(*secs)),
            Step::Refused(request, code) => {
                let err = service.should_rate_limit(request).await.unwrap_err();
                assert_eq!(err.code(), *code, "{at}: {err:?}");
            }
            Step::Call(request, want) => {
                let got = service.should_rate_limit(request).await.unwrap();
                check(&at, &got, want);
            }
        }
    }
}

fn check(at: &str, got: &RateLimitResponse, want: &peer::dsl::Want) {
    assert_eq!(
        got.overall_code, want.overall,
        "{at}: overall code in {got:?}"
    );
    assert_eq!(got.statuses.len(), want.statuses.len(), "{at}: {got:?}");
    for (i, (s, w)) in got.statuses.iter().zip(&want.statuses).enumerate() {
        let at = format!("{at} status {i}");
        assert_eq!(s.code, w.code, "{at}: code in {s:?}");
        match (&s.current_limit, &w.limit) {
            (None, None) => {}
            (Some(l), Some((rpu, unit, name))) => {
                assert_eq!(
                    (l.requests_per_unit, l.unit),
                    (*rpu, *unit as i32),
                    "{at}: {s:?}"
                );
                assert_eq!(l.name, *name, "{at}: name in {s:?}");
            }
            _ => panic!(
                "{at}: current_limit {:?}, wanted {:?}",
                s.current_limit, w.limit
            ),
        }
        if let Some(remaining) = w.remaining {
            assert_eq!(s.limit_remaining, remaining, "{at}: remaining in {s:?}");
        }
        if let Some(reset) = w.reset {
            let d = s.duration_until_reset.expect("duration_until_reset");
            assert_eq!((d.seconds, d.nanos), (reset, 0), "{at}: reset in {s:?}");
        }
    }
}

#[tokio::test]
async fn every_supported_peer_behaviour_holds() {
    let mut rows = peer::config_rows::rows();
    rows.extend(peer::service_rows::rows());
    let mut names = std::collections::HashSet::new();
    for row in &rows {
        assert!(names.insert(row.name), "two rows named {}", row.name);
        run(row).await;
    }
    assert!(rows.len() >= 30, "{} rows", rows.len());
}
