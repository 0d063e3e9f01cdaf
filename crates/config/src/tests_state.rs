//! `[store] path` and `snapshot_every`: accepted with the memory store, refused elsewhere.

use std::time::Duration;

use super::*;

fn errors(text: &str) -> Vec<String> {
    match Config::parse("t.toml", text) {
        Ok(_) => Vec::new(),
        Err(ConfigError::Invalid(d)) => d.0.iter().map(ToString::to_string).collect(),
        Err(e) => vec![e.to_string()],
    }
}

#[test]
fn a_memory_store_takes_a_path() {
    let text = "[store]\nkind = \"memory\"\npath = \"/var/lib/tollgate/state\"\nsnapshot_every = \"30s\"\n";
    let c = Config::parse("t.toml", text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.store.path.as_deref(),
        Some(std::path::Path::new("/var/lib/tollgate/state"))
    );
    assert_eq!(c.store.snapshot_every, Duration::from_secs(30));
    let c =
        Config::parse("t.toml", "[store]\npath = \"state\"\n").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.store.snapshot_every, Duration::from_secs(10));
    // A relative path is the configuration folder's, as the other paths a file names.
    let c = Config::parse("/etc/tollgate/tollgate.toml", "[store]\npath = \"state\"\n")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.store.path.as_deref(),
        Some(std::path::Path::new("/etc/tollgate/state"))
    );
    assert_eq!(Config::builtin().store.path, None);
}

#[test]
fn refusals_name_the_field() {
    let cases = [
        (
            "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\npath = \"/tmp/s\"\n",
            "t.toml:4:8",
            "applies only to kind = \"memory\"",
        ),
        (
            "[store]\nsnapshot_every = \"10s\"\n",
            "t.toml:2:18",
            "needs path",
        ),
        (
            "[store]\npath = \"/tmp/s\"\nsnapshot_every = \"10ms\"\n",
            "t.toml:3:18",
            "at least 1s",
        ),
        ("[store]\npath = \"/tmp/\"\n", "t.toml:2:8", "not a folder"),
        // A folder that is there already, named without its slash.
        (
            "[store]\npath = \"/tmp\"\n",
            "t.toml:2:8",
            "/tmp is a folder",
        ),
    ];
    for (text, at, says) in cases {
        let e = errors(text);
        assert_eq!(e.len(), 1, "{text}: {e:?}");
        assert!(e[0].starts_with(at) && e[0].contains(says), "{text}: {e:?}");
    }
}
