//! The recipes of `docs/forward-auth.md`: its code blocks whose info string names a file
//! (```` ```nginx file=tollgate.conf ````). The tests run what the documentation says, so the
//! two cannot drift apart.

use std::path::PathBuf;

/// The file-named code blocks of the document, in order.
pub(crate) struct Recipes {
    blocks: Vec<(String, String)>,
}

impl Recipes {
    /// Reads `docs/forward-auth.md` from the workspace.
    pub(crate) fn load() -> Recipes {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/forward-auth.md");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        Recipes {
            blocks: blocks(&text),
        }
    }

    /// The block named `name`.
    pub(crate) fn file(&self, name: &str) -> &str {
        self.blocks
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, body)| body.as_str())
            .unwrap_or_else(|| panic!("docs/forward-auth.md has no code block tagged file={name}"))
    }

    /// Every block whose name starts with `prefix`, as (name, text).
    pub(crate) fn files_under(&self, prefix: &str) -> Vec<(&str, &str)> {
        self.blocks
            .iter()
            .filter(|(n, _)| n.starts_with(prefix))
            .map(|(n, b)| (n.as_str(), b.as_str()))
            .collect()
    }
}

/// The fenced blocks tagged `file=NAME` in `text`.
fn blocks(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        match &mut current {
            Some((_, body)) if line.trim_end() != "```" => {
                body.push_str(line);
                body.push('\n');
            }
            Some(_) => out.extend(current.take()),
            None => {
                if let Some(info) = line.strip_prefix("```")
                    && let Some(name) = info
                        .split_whitespace()
                        .find_map(|w| w.strip_prefix("file="))
                {
                    current = Some((name.to_owned(), String::new()));
                }
            }
        }
    }
    out
}

/// `text` with every `from` replaced by `to`; fails when the recipe no longer holds `from`, so
/// a change to the documentation cannot silently test something else.
pub(crate) fn substitute(text: &str, from: &str, to: &str) -> String {
    assert!(
        text.contains(from),
        "the recipe no longer contains {from:?}, which the test replaces with {to:?}:\n{text}"
    );
    text.replace(from, to)
}

#[test]
fn blocks_are_found_by_their_file_tag() {
    let doc = "intro\n```nginx file=a.conf\nserver {}\n```\n```sh\nno tag\n```\n```go file=x/y.go\npackage y\n\nfunc f() {}\n```\n";
    let b = blocks(doc);
    assert_eq!(
        b,
        vec![
            ("a.conf".to_owned(), "server {}\n".to_owned()),
            ("x/y.go".to_owned(), "package y\n\nfunc f() {}\n".to_owned()),
        ]
    );
}
