//! Unit tests of configuration validation: positions, collected errors, the built-in default.

use super::*;

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
    let text = include_str!("../../examples/tollgate.toml").replace("TOLLGATE_JWT_SECRET", "PATH");
    let c = Config::parse("examples/tollgate.toml", &text);
    assert!(c.is_ok(), "{c:?}");
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
