//! Rows mirroring envoyproxy/ratelimit's configuration tests (`test/config/config_test.go`,
//! its `test/config/*.yaml` cases) and its README examples: what a file means, and what the
//! peer refuses to load. Domain `d` throughout; the clock starts 20 s into a minute, 800 s
//! into an hour and 80,000 s into a day.

use super::dsl::{OK, OVER, Row, Unit, call, none, ok, over, row, unlimited};

pub(crate) fn rows() -> Vec<Row> {
    let mut rows = vec![
        basic(),
        override_limit(),
        shadow(),
        wildcards(),
        share_threshold(),
    ];
    rows.extend([empty_value(), metadata(), units_any_case(), depth()]);
    rows.extend(refused());
    rows
}

// TestBasicConfig (basic_config.yaml): key-only defaults, exact values winning, a value with
// no limit (allow-listed), names, unlimited, and descriptors deeper or shallower than the tree.
const BASIC: &str = "
domain: d
descriptors:
  - key: route
    value: checkout
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: user
        value: admin
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: plan
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: plan
    value: gold
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: plan
    value: free
  - key: region
    rate_limit: {name: per-region, unit: hour, requests_per_unit: 1}
  - key: internal
    rate_limit: {unlimited: true}
  - key: tier
    value: pro
    rate_limit: {unit: day, requests_per_unit: 15}
    descriptors:
      - key: seat
        value: owner
        rate_limit: {unit: day, requests_per_unit: 25}
";

fn basic() -> Row {
    row("basic_config", &[("basic.yaml", BASIC)]).steps(vec![
        call(&[&[("plan", "gold")]])
            .domain("other")
            .expect(OK, vec![none()]),
        call(&[&[("route", "checkout")]]).expect(OK, vec![none()]),
        call(&[&[("route", "elsewhere"), ("user", "u1")]]).expect(OK, vec![none()]),
        call(&[&[("route", "checkout"), ("user", "u1")]])
            .expect(OK, vec![ok(5, Unit::Second).left(4).reset(1)]),
        call(&[&[("route", "checkout"), ("user", "admin")]])
            .expect(OK, vec![ok(10, Unit::Second).left(9)]),
        call(&[&[("plan", "silver")]]).expect(OK, vec![ok(20, Unit::Minute).left(19).reset(40)]),
        call(&[&[("plan", "gold")]]).expect(OK, vec![ok(30, Unit::Minute).left(29)]),
        call(&[&[("plan", "free")]]).expect(OK, vec![none()]),
        call(&[&[("region", "eu")]]).expect(
            OK,
            vec![ok(1, Unit::Hour).named("per-region").left(0).reset(2800)],
        ),
        call(&[&[("region", "eu")]]).expect(OVER, vec![over(1, Unit::Hour).named("per-region")]),
        call(&[&[("internal", "x")]]).expect(OK, vec![unlimited()]),
        call(&[&[("tier", "pro"), ("seat", "guest")]]).expect(OK, vec![none()]),
        call(&[&[("tier", "pro")]]).expect(OK, vec![ok(15, Unit::Day).left(14).reset(6400)]),
        call(&[&[("tier", "pro"), ("seat", "owner")]]).expect(OK, vec![ok(25, Unit::Day).left(24)]),
        call(&[&[("plan", "gold"), ("extra", "x")]]).expect(OK, vec![none()]),
    ])
}

// TestConfigLimitOverride: a descriptor's `limit` applies in a known domain whatever the tree
// says (here over a shadow-mode node: an override is never in shadow mode), unnamed, counted
// per value; in an unknown domain nothing applies.
fn override_limit() -> Row {
    const YAML: &str = "
domain: d
descriptors:
  - key: route
    value: checkout
    descriptors:
      - key: user
        shadow_mode: true
        rate_limit: {unit: second, requests_per_unit: 5}
";
    let user =
        |u| call(&[&[("route", "checkout"), ("user", u)]]).limit_override(0, 2, Unit::Minute);
    row("config_limit_override", &[("override.yaml", YAML)]).steps(vec![
        user("u1").expect(OK, vec![ok(2, Unit::Minute).left(1).reset(40)]),
        user("u1").expect(OK, vec![ok(2, Unit::Minute).left(0)]),
        user("u1").expect(OVER, vec![over(2, Unit::Minute)]),
        user("u2").expect(OK, vec![ok(2, Unit::Minute).left(1)]),
        call(&[&[("nowhere", "x")]])
            .limit_override(0, 2, Unit::Minute)
            .expect(OK, vec![ok(2, Unit::Minute).left(1)]),
        call(&[&[("route", "checkout"), ("user", "u1")]])
            .domain("other")
            .limit_override(0, 2, Unit::Minute)
            .expect(OK, vec![none()]),
    ])
}

// TestShadowModeConfig (shadowmode_config.yaml), with the service's TestRuleShadowMode and
// TestMixedRuleShadowMode: a shadow-mode limit is counted and reported but answers OK.
fn shadow() -> Row {
    const YAML: &str = "
domain: d
descriptors:
  - key: team
    value: core
    descriptors:
      - key: member
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: member
        value: bot
        shadow_mode: true
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: path
    value: /admin
    rate_limit: {unit: minute, requests_per_unit: 1}
";
    let bot: &[(&str, &str)] = &[("team", "core"), ("member", "bot")];
    let alice: &[(&str, &str)] = &[("team", "core"), ("member", "alice")];
    row("shadow_mode", &[("shadow.yaml", YAML)]).steps(vec![
        call(&[bot]).expect(OK, vec![ok(1, Unit::Second).left(0)]),
        call(&[bot]).expect(OK, vec![ok(1, Unit::Second).left(0)]),
        call(&[alice]).expect(OK, vec![ok(1, Unit::Second).left(0)]),
        call(&[alice]).expect(OVER, vec![over(1, Unit::Second)]),
        // Every limit in shadow mode: OK.
        call(&[&[("path", "/a")], bot]).expect(
            OK,
            vec![ok(1, Unit::Minute).left(0), ok(1, Unit::Second).left(0)],
        ),
        // Mixed: the enforced limit decides.
        call(&[&[("path", "/a")], &[("path", "/admin")]]).expect(
            OK,
            vec![ok(1, Unit::Minute).left(0), ok(1, Unit::Minute).left(0)],
        ),
        call(&[&[("path", "/a")], &[("path", "/admin")]]).expect(
            OVER,
            vec![ok(1, Unit::Minute).left(0), over(1, Unit::Minute)],
        ),
    ])
}

// TestWildcardConfig (wildcard.yaml): `*` trailing, in the middle and more than once; each
// matching value counted apart; a plain value never matches as a prefix.
fn wildcards() -> Row {
    const YAML: &str = "
domain: d
descriptors:
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: exact
    value: foo
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: mid
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: multi
    value: foo*bar*baz
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: parent
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit: {unit: minute, requests_per_unit: 2}
";
    let one = |k, v| call(&[&[(k, v)]]);
    row("wildcard", &[("wildcard.yaml", YAML)]).steps(vec![
        one("wild", "foo1").expect(OK, vec![ok(2, Unit::Minute).left(1)]),
        one("wild", "foo2").expect(OK, vec![ok(2, Unit::Minute).left(1)]),
        one("wild", "bar").expect(OK, vec![none()]),
        one("exact", "foo1").expect(OK, vec![none()]),
        one("mid", "barab").expect(OK, vec![ok(2, Unit::Minute).left(1)]),
        one("mid", "bar123b").expect(OK, vec![ok(2, Unit::Minute).left(1)]),
        one("mid", "barb").expect(OK, vec![ok(2, Unit::Minute).left(1)]),
        one("mid", "bara").expect(OK, vec![none()]),
        one("mid", "xbarb").expect(OK, vec![none()]),
        one("multi", "foo123bar456baz").expect(OK, vec![ok(1, Unit::Minute).left(0)]),
        one("multi", "foobarbaz").expect(OK, vec![ok(1, Unit::Minute).left(0)]),
        one("multi", "foo123baz").expect(OK, vec![none()]),
        one("multi", "bar456baz").expect(OK, vec![none()]),
        call(&[&[("parent", "val1"), ("wild", "goo2")]])
            .expect(OK, vec![ok(2, Unit::Minute).left(1)]),
    ])
}

// TestShareThreshold (share_threshold.yaml): every value a `share_threshold` wildcard matches
// shares one counter; an exact value keeps its own; nested, only the sharing level shares;
// middle wildcards share too.
fn share_threshold() -> Row {
    const YAML: &str = "
domain: d
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: file
    value: test1
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: file
    value: test*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: user
    value: user/*
    share_threshold: true
    descriptors:
      - key: resource
        value: res/*
        descriptors:
          - key: action
            rate_limit: {unit: minute, requests_per_unit: 2}
  - key: midpath
    value: /api*v1
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
";
    let one = |k, v| call(&[&[(k, v)]]);
    let nested = |u, r| call(&[&[("user", u), ("resource", r), ("action", "read")]]);
    row("share_threshold", &[("share.yaml", YAML)]).steps(vec![
        one("files", "files/a.pdf").expect(OK, vec![ok(3, Unit::Minute).left(2)]),
        one("files", "files/b.csv").expect(OK, vec![ok(3, Unit::Minute).left(1)]),
        one("files", "files/c.txt").expect(OK, vec![ok(3, Unit::Minute).left(0)]),
        one("files", "files/d").expect(OVER, vec![over(3, Unit::Minute)]),
        one("file", "test1").expect(OK, vec![ok(1, Unit::Minute).left(0)]),
        one("file", "test2").expect(OK, vec![ok(2, Unit::Minute).left(1)]),
        one("file", "test23").expect(OK, vec![ok(2, Unit::Minute).left(0)]),
        one("file", "test123").expect(OVER, vec![over(2, Unit::Minute)]),
        one("file", "test1").expect(OVER, vec![over(1, Unit::Minute)]),
        nested("user/alice", "res/1").expect(OK, vec![ok(2, Unit::Minute).left(1)]),
        nested("user/bob", "res/1").expect(OK, vec![ok(2, Unit::Minute).left(0)]),
        nested("user/carol", "res/2").expect(OK, vec![ok(2, Unit::Minute).left(1)]),
        one("midpath", "/api/v1").expect(OK, vec![ok(2, Unit::Minute).left(1)]),
        one("midpath", "/api-beta-v1").expect(OK, vec![ok(2, Unit::Minute).left(0)]),
        one("midpath", "/apiXv1").expect(OVER, vec![over(2, Unit::Minute)]),
        one("midpath", "/api/v2").expect(OK, vec![none()]),
    ])
}

// config_impl.go loadDescriptors: the node's key is `key` alone when `value` is empty, so
// `value: ""` is a key-only node matching any value, each counted apart.
fn empty_value() -> Row {
    const YAML: &str = "
domain: d
descriptors:
  - key: client
    value: ''
    rate_limit: {unit: minute, requests_per_unit: 1}
";
    row("empty_value_is_no_value", &[("empty_value.yaml", YAML)]).steps(vec![
        call(&[&[("client", "a")]]).expect(OK, vec![ok(1, Unit::Minute).left(0)]),
        call(&[&[("client", "b")]]).expect(OK, vec![ok(1, Unit::Minute).left(0)]),
        call(&[&[("client", "a")]]).expect(OVER, vec![over(1, Unit::Minute)]),
    ])
}

// TestMetadata (metadata.yaml): descriptor metadata loads; the limits apply as without it.
fn metadata() -> Row {
    const YAML: &str = "
domain: d
descriptors:
  - key: svc
    value: billing
    descriptors:
      - key: user
        metadata:
          name: service_1
        rate_limit: {unit: second, requests_per_unit: 5}
  - key: tenant
    metadata:
      quota:
        owner: team_2
    rate_limit: {unit: minute, requests_per_unit: 20}
";
    row("metadata", &[("metadata.yaml", YAML)]).steps(vec![
        call(&[&[("svc", "billing"), ("user", "u")]]).expect(OK, vec![ok(5, Unit::Second).left(4)]),
        call(&[&[("tenant", "t")]]).expect(OK, vec![ok(20, Unit::Minute).left(19)]),
    ])
}

// config_impl.go loadDescriptors reads the unit upper-cased: any case is a unit; a week is 7.
fn units_any_case() -> Row {
    const YAML: &str = "
domain: d
descriptors:
  - key: a
    rate_limit: {unit: MINUTE, requests_per_unit: 4}
  - key: b
    rate_limit: {unit: Week, requests_per_unit: 4}
";
    row("units_any_case", &[("units.yaml", YAML)]).steps(vec![
        call(&[&[("a", "x")]]).expect(OK, vec![ok(4, Unit::Minute).left(3)]),
        call(&[&[("b", "x")]]).expect(OK, vec![ok(4, Unit::Week).left(3)]),
    ])
}

// README, example 4: a descriptor matches only as deep as it goes, entry for level.
fn depth() -> Row {
    const YAML: &str = "
domain: d
descriptors:
  - key: key
    value: value
    rate_limit: {unit: second, requests_per_unit: 300}
  - key: nested
    value: value
    descriptors:
      - key: subkey
        rate_limit: {unit: second, requests_per_unit: 300}
";
    row("readme_example_4_depth", &[("depth.yaml", YAML)]).steps(vec![
        call(&[&[("key", "value"), ("subkey", "subvalue")]]).expect(OK, vec![none()]),
        call(&[&[("nested", "value"), ("subkey", "subvalue")]])
            .expect(OK, vec![ok(300, Unit::Second).left(299)]),
    ])
}

/// What the peer refuses to load, each with what Tollgate's error must name.
fn refused() -> Vec<Row> {
    vec![
        // TestEmptyDomain (empty_domain.yaml).
        row("empty_domain", &[("empty_domain.yaml", "descriptors:\n")])
            .refused(&["empty_domain.yaml", "domain"]),
        // TestDuplicateDomain (duplicate_domain.yaml after basic_config.yaml).
        row("duplicate_domain", &[("a.yaml", "domain: d\n"), ("dup.yaml", "domain: d\ndescriptors:\n")])
            .refused(&["dup.yaml", "twice"]),
        // TestEmptyKey (empty_key.yaml).
        row("empty_key", &[("empty_key.yaml", "domain: d\ndescriptors:\n  - value: value1\n")])
            .refused(&["empty_key.yaml", "empty key"]),
        // TestDuplicateKey (duplicate_key.yaml).
        row(
            "duplicate_key",
            &[("duplicate_key.yaml", "domain: d\ndescriptors:\n  - {key: key1, value: value1}\n  - {key: key1, value: value1}\n")],
        )
        .refused(&["duplicate_key.yaml", "d.key1_value1", "twice"]),
        // config_impl.go loadDescriptors: `value: ""` has the key-only node's composite key.
        row(
            "key_only_beside_empty_value",
            &[("empty_value.yaml", "domain: d\ndescriptors:\n  - key: client\n  - key: client\n    value: ''\n")],
        )
        .refused(&["empty_value.yaml", "d.client", "twice"]),
        // TestBadLimitUnit (bad_limit_unit.yaml).
        row(
            "bad_limit_unit",
            &[("bad_unit.yaml", "domain: d\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n")],
        )
        .refused(&["bad_unit.yaml", "d.key1_value1", "fortnight"]),
        // config_impl.go loadDescriptors: no unit is an invalid unit unless unlimited.
        row(
            "no_unit",
            &[("no_unit.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 5}\n")],
        )
        .refused(&["no_unit.yaml", "d.k", "unit"]),
        // TestReplacesSelf (replaces_self.yaml).
        row(
            "replaces_self",
            &[("replaces_self.yaml", "domain: d\ndescriptors:\n  - key: key1\n    value: value1\n    descriptors:\n      - key: subkey1\n        rate_limit: {name: self, replaces: [{name: self}], unit: second, requests_per_unit: 5}\n")],
        )
        .refused(&["replaces_self.yaml", "d.key1_value1.subkey1", "replaces itself"]),
        // TestReplacesEmpty (replaces_empty.yaml).
        row(
            "replaces_empty",
            &[("replaces_empty.yaml", "domain: d\ndescriptors:\n  - key: key1\n    value: value1\n    descriptors:\n      - key: subkey1\n        rate_limit:\n          name: self\n          replaces:\n            - name:\n          unit: second\n          requests_per_unit: 5\n")],
        )
        .refused(&["replaces_empty.yaml", "d.key1_value1.subkey1", "replaces entry"]),
        // TestBadYaml (bad_yaml.yaml).
        row("bad_yaml", &[("bad_yaml.yaml", "'''\n")]).refused(&["bad_yaml.yaml"]),
        // TestMisspelledKey (misspelled_key.yaml, misspelled_key2.yaml).
        row(
            "misspelled_key",
            &[("misspelled.yaml", "domain: d\ndescriptors:\n  - key: key1\n    ratelimit: {unit: day, requests_per_unit: 5}\n")],
        )
        .refused(&["misspelled.yaml", "ratelimit"]),
        row(
            "misspelled_key2",
            &[("misspelled2.yaml", "domain: d\ndescriptors:\n  - key: key1\n    rate_limit: {unit: day, requestsperunit: 5}\n")],
        )
        .refused(&["misspelled2.yaml", "requestsperunit"]),
        // TestNonStringKey (non_string_key.yaml).
        row("non_string_key", &[("non_string_key.yaml", "0.25: d\ndescriptors: []\n")])
            .refused(&["non_string_key.yaml"]),
        // TestNonMapList (non_map_list.yaml).
        row("non_map_list", &[("non_map_list.yaml", "domain: d\ndescriptors:\n  - a\n  - b\n")])
            .refused(&["non_map_list.yaml"]),
        // TestUnlimitedWithRateLimitUnit (unlimited_with_unit.yaml).
        row(
            "unlimited_with_unit",
            &[("unlimited_with_unit.yaml", "domain: d\ndescriptors:\n  - key: foo\n    rate_limit: {unlimited: true, unit: day, requests_per_unit: 25}\n")],
        )
        .refused(&["unlimited_with_unit.yaml", "d.foo", "unlimited"]),
        // config_impl.go loadDescriptors: share_threshold only with a wildcard value.
        row(
            "share_threshold_without_wildcard",
            &[("share.yaml", "domain: d\ndescriptors:\n  - key: files\n    value: files\n    share_threshold: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")],
        )
        .refused(&["share.yaml", "d.files_files", "share_threshold"]),
    ]
}
