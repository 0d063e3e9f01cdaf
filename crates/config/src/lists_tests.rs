//! `[[list]]` and a policy's `ban`: what they become, and every bad value reported at its
//! position.

use crate::{Config, ConfigError};
use tollgate_http::{ListAction, ListEntry};

fn errors(text: &str) -> Vec<String> {
    match Config::parse("t.toml", text) {
        Ok(_) => Vec::new(),
        Err(ConfigError::Invalid(d)) => d.0.iter().map(ToString::to_string).collect(),
        Err(e) => vec![e.to_string()],
    }
}

const POLICY: &str =
    "[[policy]]\nname = \"login\"\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1m\"\n";

#[test]
fn lists_and_a_ban_are_read() {
    let text = format!(
        "{POLICY}ban = {{ after = 5, within = \"10m\", for = \"1h\" }}\n\n\
         [[list]]\nname = \"partners\"\naction = \"allow\"\nips = [\"203.0.113.0/24\", \"2001:db8::/32\"]\n\
         keys = [\"header:x-api-key:0123456789abcdef0123456789abcdef\"]\n\n\
         [[list]]\nname = \"blocked\"\naction = \"deny\"\nips = [\"198.51.100.0/24\", \"192.0.2.7\"]\n"
    );
    let c = Config::parse("t.toml", &text).unwrap_or_else(|e| panic!("{e}"));
    let ban = c.policies[0].policy.ban().copied();
    let ban = ban.unwrap_or_else(|| panic!("no ban"));
    assert_eq!(ban.after(), 5);
    assert_eq!(ban.within().as_secs(), 600);
    assert_eq!(ban.duration().as_secs(), 3600);
    assert_eq!(c.lists.len(), 2);
    assert_eq!(c.lists[0].action, ListAction::Allow);
    assert_eq!(c.lists[0].entries.len(), 3);
    assert!(matches!(c.lists[1].entries[1], ListEntry::Ip(_)));
}

#[test]
fn an_ip_key_entry_must_be_one_a_request_can_have() {
    let e = errors(
        "[[list]]\nname = \"a\"\naction = \"deny\"\nkeys = [\"ip:2001:db8:1::/48\", \"ip:10.0.0.0/8\"]\n",
    );
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(
        e[0].starts_with("t.toml:4:9: list \"a\": field \"keys\": \"ip:2001:db8:1::/48\"")
            && e[0].contains("/64 network"),
        "{e:?}"
    );
    assert!(
        e[1].starts_with("t.toml:4:31: list \"a\": field \"keys\": \"ip:10.0.0.0/8\"")
            && e[1].contains("without ip:"),
        "{e:?}"
    );
    // At the configured length, the network key is what requests have.
    let c = Config::parse(
        "t.toml",
        "[server]\nipv6_prefix = 48\n[[list]]\nname = \"a\"\naction = \"deny\"\nkeys = [\"ip:2001:db8:1::/48\"]\n",
    );
    assert!(c.is_ok(), "{:?}", c.err().map(|e| e.to_string()));
}

#[test]
fn bad_lists_are_reported_at_their_values() {
    let e = errors(concat!(
        "[[list]]\nname = \"a\"\naction = \"block\"\nips = [\"10.0.0.0/8\", \"10.0.0.0/40\"]\n",
        "keys = [\"header:x-api-key:raw-secret\"]\n\n",
        "[[list]]\nname = \"a\"\naction = \"deny\"\nips = [\"not-an-ip\"]\n\n",
        "[[list]]\nname = \"b\"\naction = \"deny\"\n\n",
        "[[list]]\nname = \"b\"\naction = \"allow\"\n",
    ));
    assert!(
        e.iter()
            .any(|m| m.starts_with("t.toml:3:10: list \"a\": field \"action\": \"block\"")),
        "{e:?}"
    );
    assert!(
        e.iter()
            .any(|m| m.starts_with("t.toml:4:22: list \"a\": field \"ips\": \"10.0.0.0/40\"")),
        "{e:?}"
    );
    assert!(
        e.iter()
            .any(|m| m.starts_with("t.toml:5:9: list \"a\": field \"keys\"") && m.contains("hash")),
        "{e:?}"
    );
    assert!(
        e.iter()
            .any(|m| m.starts_with("t.toml:10:8: list \"a\": field \"ips\": \"not-an-ip\"")),
        "{e:?}"
    );
    assert!(
        e.iter()
            .any(|m| m.starts_with("t.toml:8:8: list \"a\" is defined twice")),
        "{e:?}"
    );
    assert!(
        e.iter()
            .any(|m| m.starts_with("t.toml:17:8: list \"b\" is defined twice")),
        "{e:?}"
    );
}

#[test]
fn bad_bans_are_reported_at_their_values() {
    let e = errors(&format!(
        "{POLICY}ban = {{ after = 0, within = \"soon\", for = \"1h\" }}\n"
    ));
    assert!(
        e.iter().any(|m| m
            .starts_with("t.toml:6:17: policy \"login\": field \"ban.after\" must be between 1")),
        "{e:?}"
    );
    assert!(
        e.iter()
            .any(|m| m.starts_with("t.toml:6:29: policy \"login\": field \"ban.within\"")),
        "{e:?}"
    );
    let e = errors(&format!("{POLICY}ban = {{ after = 3, within = \"1m\" }}\n"));
    assert!(
        e.iter()
            .any(|m| m.starts_with("t.toml:6:7: policy \"login\": field \"ban\" needs \"for\"")),
        "{e:?}"
    );
    let e = errors(&format!(
        "{POLICY}ban = {{ after = 3, within = \"1m\", for = \"1h\", forever = true }}\n"
    ));
    assert!(
        e.iter()
            .any(|m| m.starts_with("t.toml:6:47: unknown field \"forever\"")),
        "{e:?}"
    );
    let e = errors(
        "[[policy]]\nname = \"c\"\nalgorithm = \"concurrency\"\nlimit = 2\nban = { after = 1, within = \"1m\", for = \"1h\" }\n",
    );
    assert!(
        e.iter().any(|m| m.starts_with(
            "t.toml:5:7: policy \"c\": field \"ban\": a concurrency limit cannot ban"
        )),
        "{e:?}"
    );
}
