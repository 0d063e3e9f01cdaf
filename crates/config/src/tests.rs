//! Unit tests of configuration validation: positions, collected errors, the built-in default.

use super::*;

/// The commented-out `[[policy]]` blocks of a configuration, each line uncommented.
pub(crate) fn commented_policies(text: &str) -> Vec<Vec<&str>> {
    let mut blocks = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line != "# [[policy]]" {
            continue;
        }
        let mut block = vec!["[[policy]]"];
        while let Some(l) = lines.next_if(|l| l.starts_with("# ")) {
            block.push(&l[2..]);
        }
        blocks.push(block);
    }
    blocks
}

fn errors(text: &str) -> Vec<String> {
    match Config::parse("t.toml", text) {
        Ok(_) => Vec::new(),
        Err(ConfigError::Invalid(d)) => d.0.iter().map(ToString::to_string).collect(),
        Err(e) => vec![e.to_string()],
    }
}

#[test]
fn builtin_default_is_valid() {
    let c = Config::parse("d", DEFAULT_CONFIG);
    assert!(c.is_ok(), "{c:?}");
    let c = Config::builtin();
    assert_eq!(c.policies.len(), 1);
}

#[test]
fn spec_example_is_valid() {
    // PATH stands in for the JWT secret's variable: it is always set.
    let text = include_str!("../examples/tollgate.toml").replace("TOLLGATE_JWT_SECRET", "PATH");
    let c = Config::parse("examples/tollgate.toml", &text);
    assert!(c.is_ok(), "{c:?}");
}

/// Every commented-out policy of the reference configuration is valid as written, with a
/// proxy (a queue policy needs one).
#[test]
fn the_reference_configurations_commented_policies_are_valid() {
    let example = include_str!("../examples/tollgate.toml");
    let blocks = commented_policies(example);
    assert!(blocks.len() >= 3, "{} blocks", blocks.len());
    for block in blocks {
        let text = format!(
            "[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:3000\"\n{}\n",
            block.join("\n")
        );
        let e = errors(&text);
        assert!(e.is_empty(), "{text}\n{e:?}");
    }
}

#[test]
fn missing_limit_names_line_column_and_fix() {
    let e = errors(
        "[[policy]]\nname = \"api\"\nalgorithm = \"sliding_window_counter\"\nwindow = \"1m\"\n",
    );
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].starts_with("t.toml:1:"), "{e:?}");
    assert!(e[0].contains("field \"limit\" is required for algorithm \"sliding_window_counter\"; write e.g. limit = 100"), "{e:?}");
}

#[test]
fn every_unknown_field_and_type_error_is_reported() {
    let e = errors(
        "[server]\nlisen = \"x\"\n\n[[policy]]\nname = \"a\"\nlimt = 3\nlimit = \"3\"\nwindow = \"1m\"\n",
    );
    assert_eq!(e.len(), 3, "{e:?}");
    assert!(
        e[0].starts_with(
            "t.toml:2:1: unknown field \"lisen\" in [server]; did you mean \"listen\"?"
        ),
        "{e:?}"
    );
    assert!(
        e[1].starts_with("t.toml:6:1: unknown field \"limt\""),
        "{e:?}"
    );
    assert!(e[2].starts_with("t.toml:7:9: field \"limit\""), "{e:?}");
}

#[test]
fn semantic_errors_are_collected() {
    let e = errors(concat!(
        "[store]\non_error = \"maybe\"\n",
        "[[policy]]\nname = \"a\"\nlimit = 10\nwindow = \"1 minute\"\nkey = [\"cookie:x\"]\n",
        "[[policy]]\nname = \"b\"\nalgorithm = \"token_bucket\"\ncapacity = 5\nrefill = \"1/s\"\ncost = 6\n",
    ));
    assert_eq!(e.len(), 4, "{e:?}");
    assert!(e[0].starts_with("t.toml:2:12:"), "{e:?}");
}

/// A policy name the RateLimit headers cannot carry is refused when the file is validated
/// (`tollgate validate` included), not when the server builds its engine.
#[test]
fn a_policy_name_must_be_printable_ascii() {
    for name in ["caf\u{e9}", "tab\\there", "\u{1f600}"] {
        let e = errors(&format!(
            "[[policy]]\nname = \"{name}\"\nlimit = 1\nwindow = \"1m\"\n"
        ));
        assert!(
            e.len() == 1
                && e[0].starts_with("t.toml:2:8: policy ")
                && e[0].contains("must be printable ASCII"),
            "{name}: {e:?}"
        );
    }
    let ok = r#"[[policy]]
name = "api \"v2\" (beta)"
limit = 1
window = "1m"
"#;
    assert!(Config::parse("t.toml", ok).is_ok(), "{ok}");
}

#[test]
fn listener_limits_default_and_set() {
    let c = Config::parse("t.toml", "");
    let limits = c.map(|c| c.limits).ok();
    let d = crate::Limits::default();
    assert_eq!(
        limits.map(|l| (
            l.header_read_timeout,
            l.max_header_bytes,
            l.max_connections,
            l.idle_timeout
        )),
        Some((
            d.header_read_timeout,
            d.max_header_bytes,
            d.max_connections,
            d.idle_timeout
        ))
    );
    let c = Config::parse(
        "t.toml",
        "[server]\nheader_read_timeout = \"3s\"\nmax_header_bytes = 16384\nmax_connections = 500\n\n[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:1\"\nidle_timeout = \"20s\"\n",
    );
    let l = c.map(|c| c.limits).ok();
    assert_eq!(
        l.map(|l| (
            l.header_read_timeout,
            l.max_header_bytes,
            l.max_connections,
            l.idle_timeout
        )),
        Some((Duration::from_secs(3), 16384, 500, Duration::from_secs(20)))
    );
    for (written, drain) in [("5s", 5), ("0s", 0)] {
        let text = format!("[server]\ndrain_timeout = \"{written}\"\n");
        let c = Config::parse("t.toml", &text).map(|c| c.limits.drain);
        assert_eq!(c.ok(), Some(Duration::from_secs(drain)), "{written}");
    }
    assert_eq!(d.drain, Duration::from_secs(30));
}

#[test]
fn bad_listener_limits_name_the_field_and_the_fix() {
    let e = errors(concat!(
        "[server]\nheader_read_timeout = \"0s\"\nmax_header_bytes = 10\nmax_connections = 0\n",
        "[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:1\"\nidle_timeout = \"soon\"\n",
    ));
    assert_eq!(e.len(), 4, "{e:?}");
    assert!(
        e.iter().any(|m| m.starts_with("t.toml:2:")
            && m.contains("[server] field \"header_read_timeout\" must be positive; write e.g. header_read_timeout = \"10s\"")),
        "{e:?}"
    );
    assert!(
        e.iter().any(|m| m.starts_with("t.toml:3:")
            && m.contains("[server] field \"max_header_bytes\" must be 1024 to 1048576, not 10; write e.g. max_header_bytes = 65536")),
        "{e:?}"
    );
    assert!(
        e.iter().any(|m| m.starts_with("t.toml:4:")
            && m.contains("[server] field \"max_connections\" must be 1 to 1000000, not 0; write e.g. max_connections = 10000")),
        "{e:?}"
    );
    assert!(
        e.iter().any(|m| m.starts_with("t.toml:8:")
            && m.contains("[proxy] field \"idle_timeout\"")
            && m.contains("write e.g. idle_timeout = ")),
        "{e:?}"
    );
    // A string where a number belongs is caught by the shape check, with its position.
    let e = errors("[server]\nmax_connections = \"many\"\n");
    assert!(e.iter().any(|m| m.starts_with("t.toml:2:")), "{e:?}");
    // The drain: zero (stop without waiting) up to an hour.
    let e = errors("[server]\ndrain_timeout = \"2h\"\n");
    assert!(
        e.iter().any(|m| m.starts_with("t.toml:2:")
            && m.contains("[server] field \"drain_timeout\" must be at most 1h; write e.g. drain_timeout = \"30s\"")),
        "{e:?}"
    );
    let e = errors("[server]\ndrain_timeout = \"later\"\n");
    assert!(e.iter().any(|m| m.starts_with("t.toml:2:")), "{e:?}");
}

#[test]
fn key_secret_comes_from_the_environment_and_is_never_printed() {
    // PATH is always set, and longer than the 16 bytes a secret needs.
    let c = Config::parse("t.toml", "[store]\nkey_secret_env = \"PATH\"\n");
    let c = c.unwrap_or_else(|e| panic!("{e}"));
    let secret = c
        .store
        .key_secret
        .clone()
        .unwrap_or_else(|| panic!("no secret"));
    let path = std::env::var("PATH").unwrap_or_default();
    assert_eq!(secret.expose(), path.as_bytes());
    assert!(
        !format!("{c:?}").contains(&path),
        "the secret leaked into Debug"
    );
    assert_eq!(crate::key_hash_secret(&c.store), path.as_bytes());

    let e = errors("[store]\nkey_secret_env = \"TOLLGATE_TEST_SURELY_UNSET_VARIABLE\"\n");
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].starts_with("t.toml:2:18:"), "{e:?}");
    assert!(
        e[0].contains("\"TOLLGATE_TEST_SURELY_UNSET_VARIABLE\" is not set")
            && e[0].contains("openssl rand -hex 32"),
        "{e:?}"
    );
    // Cargo sets this one for tests; one byte is far too short a secret.
    if std::env::var("CARGO_PKG_VERSION_MAJOR").is_ok_and(|v| v.len() < Secret::MIN_LEN) {
        let e = errors("[store]\nkey_secret_env = \"CARGO_PKG_VERSION_MAJOR\"\n");
        assert!(e.len() == 1 && e[0].contains("use at least 16"), "{e:?}");
    }
}

#[test]
fn the_redis_doors_password_comes_from_the_environment_and_needs_the_door() {
    let c = Config::parse(
        "t.toml",
        "[server]\nresp_listen = \"127.0.0.1:6380\"\nresp_password_env = \"PATH\"\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let path = std::env::var("PATH").unwrap_or_default();
    let password = c
        .resp_password
        .clone()
        .unwrap_or_else(|| panic!("no password"));
    assert_eq!(password.expose(), path.as_bytes());
    assert!(
        !format!("{c:?}").contains(&path),
        "the password leaked into Debug"
    );
    assert_eq!(Config::builtin().resp_password, None);

    let e = errors(
        "[server]\nresp_listen = \"127.0.0.1:6380\"\nresp_password_env = \"TOLLGATE_TEST_SURELY_UNSET_VARIABLE\"\n",
    );
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].starts_with("t.toml:3:21:"), "{e:?}");
    assert!(
        e[0].contains("\"TOLLGATE_TEST_SURELY_UNSET_VARIABLE\" is not set"),
        "{e:?}"
    );
    let e = errors("[server]\nresp_password_env = \"PATH\"\n");
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("t.toml:2:21: [server] field \"resp_password_env\"")
            && e[0].contains("add resp_listen"),
        "{e:?}"
    );
}

#[test]
fn without_a_key_secret_memory_draws_one_per_process_and_redis_shares_the_builtin() {
    let memory = Config::builtin().store;
    let first = crate::key_hash_secret(&memory);
    assert_eq!(first.len(), 32);
    assert_eq!(
        crate::key_hash_secret(&memory),
        first,
        "stable across reloads"
    );
    assert_ne!(first, tollgate_redis::DEFAULT_KEY_SECRET);
    let redis = StoreConfig {
        kind: StoreKind::Redis,
        ..Config::builtin().store
    };
    assert_eq!(
        crate::key_hash_secret(&redis),
        tollgate_redis::DEFAULT_KEY_SECRET,
        "instances sharing a Redis must hash alike"
    );
}

#[test]
fn leases_parse_and_show() {
    let text = "[[policy]]\nname = \"tenant\"\nlimit = 50000\nwindow = \"1m\"\nlease = 50\nlease_ttl = \"500ms\"\n\n[[policy]]\nname = \"default-ttl\"\nalgorithm = \"token_bucket\"\ncapacity = 100\nrefill = \"10/s\"\nlease = 5\n";
    let c = Config::parse("t.toml", text).unwrap_or_else(|e| panic!("{e}"));
    let lease = c.policies[0].policy.lease().copied();
    assert_eq!(
        lease.map(|l| (l.size(), l.ttl())),
        Some((50, Duration::from_millis(500)))
    );
    assert!(
        c.policies[0]
            .to_string()
            .ends_with(" lease=50 lease_ttl=500ms")
    );
    let lease = c.policies[1].policy.lease().copied();
    assert_eq!(lease.map(|l| l.ttl()), Some(tollgate::DEFAULT_LEASE_TTL));
}

#[test]
fn unsound_leases_are_refused_with_their_position() {
    let leaky = errors(
        "[[policy]]\nname = \"hooks\"\nalgorithm = \"leaky_bucket\"\nrate = \"5/s\"\nlease = 2\n",
    );
    assert_eq!(leaky.len(), 1, "{leaky:?}");
    assert!(
        leaky[0].starts_with("t.toml:5:9: policy \"hooks\": field \"lease\": a leaky bucket"),
        "{leaky:?}"
    );
    let big = errors("[[policy]]\nname = \"a\"\nlimit = 10\nwindow = \"1m\"\nlease = 11\n");
    assert!(
        big.len() == 1 && big[0].contains("larger than the quota"),
        "{big:?}"
    );
    let long = errors(
        "[[policy]]\nname = \"a\"\nlimit = 10\nwindow = \"1s\"\nlease = 2\nlease_ttl = \"2s\"\n",
    );
    assert!(
        long.len() == 1 && long[0].contains("longer than the window"),
        "{long:?}"
    );
    let zero = errors("[[policy]]\nname = \"a\"\nlimit = 10\nwindow = \"1s\"\nlease = 0\n");
    assert!(
        zero.len() == 1 && zero[0].contains("\"lease\" must be between 1"),
        "{zero:?}"
    );
    let orphan =
        errors("[[policy]]\nname = \"a\"\nlimit = 10\nwindow = \"1s\"\nlease_ttl = \"1s\"\n");
    assert!(
        orphan.len() == 1
            && orphan[0].starts_with("t.toml:5:13:")
            && orphan[0].contains("needs \"lease\""),
        "{orphan:?}"
    );
}

#[test]
fn concurrency_limits_parse_and_refuse_what_does_not_apply() {
    let ok = "[[policy]]\nname = \"exports\"\nalgorithm = \"concurrency\"\nlimit = 4\n\
              lease_ttl = \"2m\"\naction = \"delay\"\nmax_delay = \"20s\"\n\
              [[policy]]\nname = \"plain\"\nalgorithm = \"concurrency\"\nlimit = 2\n";
    let c = match Config::parse("t.toml", ok) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(
        c.policies[0].policy.quota().to_string(),
        "concurrency limit=4 lease_ttl=2m"
    );
    assert_eq!(
        c.policies[0].action,
        Action::Delay {
            max_delay: std::time::Duration::from_secs(20)
        }
    );
    assert!(
        c.policies[1]
            .policy
            .quota()
            .to_string()
            .ends_with("lease_ttl=5m"),
        "the default permit lifetime"
    );
    let head = "[[policy]]\nname = \"c\"\nalgorithm = \"concurrency\"\nlimit = 4\n";
    for (extra, at, needle) in [
        (
            "window = \"1m\"\n",
            "t.toml:5:10:",
            "does not apply to algorithm \"concurrency\"",
        ),
        (
            "lease = 2\n",
            "t.toml:5:9:",
            "field \"lease\" does not apply",
        ),
        ("cost = 2\n", "t.toml:5:8:", "holds one slot"),
        (
            "count_status = [\"401\"]\n",
            "t.toml:5:16:",
            "field \"count_status\" does not apply",
        ),
        (
            "action = \"queue\"\n",
            "t.toml:5:10:",
            "needs algorithm \"leaky_bucket\"",
        ),
        ("lease_ttl = \"soon\"\n", "t.toml:5:13:", "lease_ttl"),
    ] {
        let e = errors(&format!("{head}{extra}"));
        assert!(
            e.len() == 1 && e[0].starts_with(at) && e[0].contains(needle),
            "{extra}: {e:?}"
        );
    }
    let e = errors("[[policy]]\nname = \"c\"\nalgorithm = \"concurrency\"\n");
    assert!(
        e.len() == 1 && e[0].contains("field \"limit\" is required"),
        "{e:?}"
    );
}

#[test]
fn telemetry_is_off_by_default_and_checked_when_given() {
    let c = match Config::parse("t.toml", "") {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(c.telemetry.otlp_endpoint, None);
    let text = "[telemetry]\notlp_endpoint = \"http://127.0.0.1:4317\"\nsample_ratio = 0.01\n";
    let c = match Config::parse("t.toml", text) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(
        (
            c.telemetry.otlp_endpoint.as_deref(),
            c.telemetry.sample_ratio
        ),
        (Some("http://127.0.0.1:4317"), 0.01)
    );
    assert_eq!(c.telemetry.service_name, "tollgate");
    let e = errors("[telemetry]\notlp_endpoint = \"127.0.0.1:4317\"\nsample_ratio = 2\n");
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(
        e[0].starts_with("t.toml:2:17:") && e[0].contains("http://"),
        "{e:?}"
    );
    assert!(
        e[1].starts_with("t.toml:3:16:") && e[1].contains("from 0 to 1"),
        "{e:?}"
    );
    let e = errors("[telemetry]\nsample_ratio = \"all\"\n");
    assert!(e.len() == 1 && e[0].contains("must be a number"), "{e:?}");
}

/// Two listeners on one port are refused where the second is written, naming the first: the
/// server could not bind it, and `validate` passing such a file let `serve` fail at start.
#[test]
fn two_listeners_on_one_port_are_refused() {
    let e = errors("[server]\nlisten = \"127.0.0.1:8080\"\n[admin]\nlisten = \"127.0.0.1:8080\"\n");
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("t.toml:4:10: [admin] listen = \"127.0.0.1:8080\" takes the port of [server] listen (127.0.0.1:8080)"),
        "{e:?}"
    );
    // Every address of the family takes the port on each of them; a default counts too.
    let e = errors("[admin]\nlisten = \"0.0.0.0:8080\"\n");
    assert!(
        e.len() == 1 && e[0].contains("[server] listen (127.0.0.1:8080, its default)"),
        "{e:?}"
    );
    let e = errors(
        "[server]\nlisten = \"127.0.0.1:7000\"\nresp_listen = \"[::]:7000\"\n[proxy]\nlisten = \"127.0.0.1:7000\"\nupstream = \"http://127.0.0.1:9\"\n",
    );
    assert_eq!(e.len(), 3, "{e:?}");
    // Other ports, other addresses of a port, and port 0 (any free port) are fine.
    for ok in [
        "[server]\nlisten = \"127.0.0.1:7000\"\nresp_listen = \"127.0.0.1:7001\"\n",
        "[server]\nlisten = \"127.0.0.1:7000\"\n[admin]\nlisten = \"127.0.0.2:7000\"\n",
        "[server]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n",
        "[server]\nlisten = \"0.0.0.0:7000\"\n[admin]\nlisten = \"[::1]:7000\"\n",
    ] {
        assert!(Config::parse("t.toml", ok).is_ok(), "{ok}");
    }
}

/// Values that validate but could only misbehave are refused with a reason: a proxy timeout
/// of zero (a 504 for every upstream that does not answer at once), a fallback to memory on a
/// store that is memory, and a Redis server named for a memory store (each instance would
/// count alone while its operator believes the counts shared).
#[test]
fn settings_that_could_only_misbehave_are_refused() {
    let e = errors(
        "[proxy]\nlisten = \"127.0.0.1:7000\"\nupstream = \"http://127.0.0.1:9\"\ntimeout = \"0s\"\n",
    );
    assert!(
        e.len() == 1 && e[0].starts_with("t.toml:4:11: [proxy] field \"timeout\" must be positive"),
        "{e:?}"
    );
    let e = errors("[store]\non_error = \"local\"\n");
    assert!(
        e.len() == 1 && e[0].contains("this store is memory, which never fails"),
        "{e:?}"
    );
    let redis =
        "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\non_error = \"local\"\n";
    assert!(Config::parse("t.toml", redis).is_ok());
    let e = errors("[store]\nurl = \"redis://127.0.0.1:6379\"\n");
    assert!(
        e.len() == 1
            && e[0].starts_with("t.toml:2:7: [store] field \"url\" is for a Redis store")
            && e[0].contains("\"memory\" (the default)")
            && e[0].contains("add kind = \"redis\""),
        "{e:?}"
    );
    let e = errors("[store]\nkind = \"memory\"\nnodes = [\"redis://10.0.0.1:7000\"]\n");
    assert!(
        e.len() == 1 && e[0].starts_with("t.toml:3:10: [store] field \"nodes\" is for a Redis"),
        "{e:?}"
    );
    let e = errors("[store]\ncluster = true\n");
    assert!(
        e.len() == 1 && e[0].starts_with("t.toml:2:11: [store] field \"cluster\""),
        "{e:?}"
    );
    assert!(Config::parse("t.toml", "[store]\nkind = \"memory\"\ncluster = false\n").is_ok());
}
