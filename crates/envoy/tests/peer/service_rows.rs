//! Rows mirroring envoyproxy/ratelimit's service and limiter tests
//! (`test/service/ratelimit_test.go`, `test/redis/fixed_cache_impl_test.go`) and the README
//! examples they implement: how the descriptors of one request combine into the answer.
//! Where Tollgate deliberately differs (a request over the limit is not counted), no row
//! asserts the peer's count: `docs/envoy.md` lists those differences.

use super::dsl::{OK, OVER, Row, Step, Unit, call, none, ok, over, row, unlimited};

pub(crate) fn rows() -> Vec<Row> {
    vec![
        service(),
        empty_requests(),
        unlimited_descriptors(),
        blocklist(),
        replaces(),
        messaging(),
        hits_addend(),
        quota_regular_over(),
        quota_all_over(),
        quota_under(),
        quota_only_some_over(),
    ]
}

// TestService: two descriptors, one over its limit: the request is over; the other is OK with
// no limit; the limit's name is reported.
fn service() -> Row {
    const YAML: &str = "
domain: d
descriptors:
  - key: foo
    rate_limit: {name: key_name, unit: minute, requests_per_unit: 1}
";
    let both = || call(&[&[("foo", "bar")], &[("hello", "world")]]);
    row("service", &[("service.yaml", YAML)]).steps(vec![
        both().expect(
            OK,
            vec![ok(1, Unit::Minute).named("key_name").left(0), none()],
        ),
        both().expect(OVER, vec![over(1, Unit::Minute).named("key_name"), none()]),
    ])
}

// TestEmptyDomain, TestEmptyDescriptors (service): refused before any lookup.
fn empty_requests() -> Row {
    row(
        "empty_domain_or_descriptors",
        &[("any.yaml", "domain: d\n")],
    )
    .steps(vec![
        call(&[&[("hello", "world")]])
            .domain("")
            .refused(tonic::Code::InvalidArgument),
        call(&[]).refused(tonic::Code::InvalidArgument),
    ])
}

// TestUnlimited, README example 5: an unlimited descriptor is OK with everything remaining
// and no limit, never counted; beside it a limited one and an unmatched one.
fn unlimited_descriptors() -> Row {
    const YAML: &str = "
domain: d
descriptors:
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: baz
    rate_limit: {unlimited: true}
";
    let three = || call(&[&[("foo", "bar")], &[("hello", "world")], &[("baz", "qux")]]);
    row("unlimited", &[("unlimited.yaml", YAML)]).steps(vec![
        three().expect(OK, vec![ok(10, Unit::Minute).left(9), none(), unlimited()]),
        three().expect(OK, vec![ok(10, Unit::Minute).left(8), none(), unlimited()]),
    ])
}

// README example 3 (a blocklisted address, `requests_per_unit: 0`), and config_impl.go, where
// a missing requests_per_unit is 0: every request with hits is over the limit; with no hits
// (hits_addend 0, fixed_cache_impl_test.go's peek) it is OK.
fn blocklist() -> Row {
    const YAML: &str = "
domain: d
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: banned
    rate_limit:
      unit: hour
";
    let ip = |a| call(&[&[("remote_address", a)]]);
    row("readme_example_3_blocklist", &[("blocklist.yaml", YAML)]).steps(vec![
        ip("50.0.0.1").expect(OK, vec![ok(10, Unit::Second).left(9)]),
        ip("50.0.0.5").expect(OVER, vec![over(0, Unit::Second).reset(1)]),
        call(&[&[("banned", "x")]]).expect(OVER, vec![over(0, Unit::Hour).reset(2800)]),
        ip("50.0.0.5")
            .descriptor_hits(0, 0)
            .expect(OK, vec![ok(0, Unit::Second).left(0)]),
    ])
}

// README example 7 (`replaces`): when both limits apply, the replacing one alone is checked
// and counted; the replaced one is untouched and applies again on its own.
fn replaces() -> Row {
    const YAML: &str = "
domain: d
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          unit: second
          requests_per_unit: 1
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          unit: second
          requests_per_unit: 2
";
    let first: &[(&str, &str)] = &[("key_1", "value_1"), ("user", "bkthomps")];
    let second: &[(&str, &str)] = &[("key_2", "value_2"), ("user", "bkthomps")];
    row("readme_example_7_replaces", &[("replaces.yaml", YAML)]).steps(vec![
        call(&[first, second]).expect(OK, vec![none(), ok(2, Unit::Second).left(1)]),
        call(&[first, second]).expect(OK, vec![none(), ok(2, Unit::Second).left(0)]),
        call(&[first, second]).expect(OVER, vec![none(), over(2, Unit::Second)]),
        call(&[first]).expect(
            OK,
            vec![ok(1, Unit::Second).named("specific_limit").left(0)],
        ),
        call(&[first]).expect(OVER, vec![over(1, Unit::Second).named("specific_limit")]),
    ])
}

// README example 2: one call, several descriptors, each against its own limit; the request is
// over when any is (a logical OR).
fn messaging() -> Row {
    const YAML: &str = "
domain: d
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 2}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 3}
";
    let both = || {
        call(&[
            &[("message_type", "marketing"), ("to_number", "206")],
            &[("to_number", "206")],
        ])
    };
    row("readme_example_2_messaging", &[("messaging.yaml", YAML)]).steps(vec![
        both().expect(OK, vec![ok(2, Unit::Day).left(1), ok(3, Unit::Day).left(2)]),
        both().expect(OK, vec![ok(2, Unit::Day).left(0), ok(3, Unit::Day).left(1)]),
        both().expect(OVER, vec![over(2, Unit::Day), ok(3, Unit::Day)]),
        call(&[&[("to_number", "555")]]).expect(OK, vec![ok(3, Unit::Day).left(2)]),
    ])
}

// fixed_cache_impl_test.go TestRedis: a descriptor's own hits_addend wins, 0 included (checked,
// not counted), and a request addend of 0 means 1; duration_until_reset is the time to the end
// of the unit's window, even for a counter never touched.
fn hits_addend() -> Row {
    const YAML: &str = "
domain: d
descriptors:
  - key: key2
    value: value2
    descriptors:
      - key: subkey2
        rate_limit: {unit: minute, requests_per_unit: 10}
  - key: key3
    value: value3
    rate_limit: {unit: hour, requests_per_unit: 10}
";
    let key3 = || call(&[&[("key3", "value3")]]);
    row("per_descriptor_hits_addend", &[("hits.yaml", YAML)]).steps(vec![
        key3()
            .descriptor_hits(0, 0)
            .expect(OK, vec![ok(10, Unit::Hour).left(10).reset(2800)]),
        call(&[
            &[("key2", "value2")],
            &[("key2", "value2"), ("subkey2", "x")],
        ])
        .descriptor_hits(0, 0)
        .descriptor_hits(1, 1)
        .expect(OK, vec![none(), ok(10, Unit::Minute).left(9).reset(40)]),
        key3().hits(0).expect(OK, vec![ok(10, Unit::Hour).left(9)]),
        key3().hits(4).expect(OK, vec![ok(10, Unit::Hour).left(5)]),
        Step::Advance(40),
        key3()
            .descriptor_hits(0, 0)
            .expect(OK, vec![ok(10, Unit::Hour).left(5).reset(2760)]),
    ])
}

// The quota-mode rows share one file: `regular` is an ordinary limit, `quota` and `quota2`
// are in quota mode.
const QUOTA: &str = "
domain: d
descriptors:
  - key: regular
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
";

// TestServicePerDescriptorQuotaMode: an ordinary limit over makes the request over, whatever
// the quota-mode ones say.
fn quota_regular_over() -> Row {
    row("quota_mode_regular_over", &[("quota.yaml", QUOTA)]).steps(vec![
        call(&[&[("regular", "a")]]).expect(OK, vec![ok(1, Unit::Minute).left(0)]),
        call(&[&[("regular", "a")], &[("quota", "a")]])
            .expect(OVER, vec![over(1, Unit::Minute), ok(1, Unit::Minute)]),
    ])
}

// TestServiceMixedPerDescriptorModes: the only quota-mode limit over (so all of them are) makes
// the request over, though the ordinary one is under.
fn quota_all_over() -> Row {
    row("quota_mode_mixed_quota_over", &[("quota.yaml", QUOTA)]).steps(vec![
        call(&[&[("quota", "b")]]).expect(OK, vec![ok(1, Unit::Minute).left(0)]),
        call(&[&[("quota", "b")]]).expect(OVER, vec![over(1, Unit::Minute)]),
        call(&[&[("regular", "b")], &[("quota", "b")]])
            .expect(OVER, vec![ok(1, Unit::Minute), over(1, Unit::Minute)]),
        // The request was over, and the ordinary limit counted it all the same (as the peer
        // counts every hit): it is spent.
        call(&[&[("regular", "b")]]).expect(OVER, vec![over(1, Unit::Minute)]),
    ])
}

// TestServiceMixedPerDescriptorModesUnderLimit: all under, OK.
fn quota_under() -> Row {
    row("quota_mode_mixed_under", &[("quota.yaml", QUOTA)]).steps(vec![
        call(&[&[("regular", "c")], &[("quota", "c")]]).expect(
            OK,
            vec![ok(1, Unit::Minute).left(0), ok(1, Unit::Minute).left(0)],
        ),
    ])
}

// TestServiceQuotaModeOnlySomeOverTheLimit and TestServiceQuotaModeOnlyAllOverTheLimit: with
// only quota-mode limits, one over reports OVER_LIMIT for itself but the request is OK (and
// the others count it); all over, the request is over.
fn quota_only_some_over() -> Row {
    let both = || call(&[&[("quota", "d")], &[("quota2", "d")]]);
    row(
        "quota_mode_only_some_then_all_over",
        &[("quota.yaml", QUOTA)],
    )
    .steps(vec![
        both().expect(
            OK,
            vec![ok(1, Unit::Minute).left(0), ok(2, Unit::Minute).left(1)],
        ),
        both().expect(OK, vec![over(1, Unit::Minute), ok(2, Unit::Minute).left(0)]),
        both().expect(OVER, vec![over(1, Unit::Minute), over(2, Unit::Minute)]),
    ])
}
