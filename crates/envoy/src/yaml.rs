//! envoyproxy/ratelimit's YAML configuration files, read unchanged: `domain`, `descriptors`
//! with `key`, `value` (`*` wildcards anywhere; empty means none), `rate_limit` (`unit`,
//! `requests_per_unit`, `unlimited`, `name`, `replaces`), `shadow_mode`, `quota_mode`,
//! `share_threshold` and nested `descriptors`; `detailed_metric`, `value_to_metric` and
//! `metadata` are accepted and unused (they shape the peer's statistics and dynamic metadata).
//! Tollgate adds two optional `rate_limit` fields: `algorithm` (`fixed_window`, the default, as
//! envoyproxy/ratelimit counts; `sliding_window_counter`, `sliding_window_log`, `token_bucket`,
//! `leaky_bucket`) and `burst` (token bucket capacity, leaky bucket queue).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use tollgate::AlgorithmKind;

use crate::config::{ConfigError, Descriptor, Domain, RateLimit, Unit};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileYaml {
    domain: Option<String>,
    #[serde(default)]
    descriptors: Option<Vec<DescriptorYaml>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DescriptorYaml {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    rate_limit: Option<RateLimitYaml>,
    #[serde(default)]
    descriptors: Option<Vec<DescriptorYaml>>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    quota_mode: bool,
    #[serde(default)]
    share_threshold: bool,
    // Accepted for compatibility: they shape the peer's statistics and dynamic metadata.
    #[serde(default, rename = "detailed_metric")]
    _detailed_metric: Option<bool>,
    #[serde(default, rename = "value_to_metric")]
    _value_to_metric: Option<bool>,
    #[serde(default, rename = "metadata")]
    _metadata: Option<serde_norway::Mapping>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitYaml {
    #[serde(default)]
    unit: Option<String>,
    #[serde(default)]
    requests_per_unit: Option<u32>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    replaces: Option<Vec<ReplacesYaml>>,
    #[serde(default)]
    algorithm: Option<String>,
    #[serde(default)]
    burst: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplacesYaml {
    #[serde(default)]
    name: Option<String>,
}

/// Reads one envoyproxy/ratelimit YAML document; `source` names it in errors. Refuses what
/// envoyproxy/ratelimit refuses when it loads a file (unknown fields, an empty domain, a
/// rate limit without a valid unit, `unlimited` with a `unit`), naming `source` and the
/// descriptor; the rest (duplicates, `replaces`, `share_threshold`) is checked when the
/// configuration is compiled ([`Config::validate`](crate::Config::validate)).
pub fn parse_envoy_config(source: &str, text: &str) -> Result<Domain, ConfigError> {
    let file: FileYaml =
        serde_norway::from_str(text).map_err(|e| ConfigError::new(source, e.to_string()))?;
    let name = file.domain.unwrap_or_default();
    if name.is_empty() {
        return Err(ConfigError::new(
            source,
            "the file has no domain: write `domain: <name>` at its top",
        ));
    }
    let mut domain = Domain::new(name.clone()).with_source(source.to_owned());
    let mut path = name;
    for d in file.descriptors.unwrap_or_default() {
        domain = domain.descriptor(convert(d, source, &mut path)?);
    }
    Ok(domain)
}

/// The configuration files of `dir`, as envoyproxy/ratelimit finds them under its runtime
/// directory: every `*.yaml` and `*.yml` file of `dir` and of its subdirectories, in path
/// order. Names starting with `.` are skipped, files and folders alike (editor swap files,
/// and the `..data` and `..2024_...` entries of a mounted Kubernetes ConfigMap, whose files
/// the top-level links already name); links to files are followed.
pub fn envoy_config_files(dir: impl AsRef<Path>) -> Result<Vec<PathBuf>, ConfigError> {
    let dir = dir.as_ref();
    let shown = dir.display().to_string();
    if !dir.is_dir() {
        return Err(ConfigError::new(
            shown,
            "cannot read the directory: no such directory",
        ));
    }
    let walk = walkdir::WalkDir::new(dir)
        .min_depth(1)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|e| !e.file_name().to_string_lossy().starts_with('.'));
    let mut files = Vec::new();
    for entry in walk {
        let entry = entry
            .map_err(|e| ConfigError::new(&shown, format!("cannot read the directory: {e}")))?;
        let path = entry.path();
        let is_yaml = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e == "yaml" || e == "yml");
        // `is_file` follows links: a link to a file counts, a link to a folder does not.
        if is_yaml && path.is_file() {
            files.push(path.to_path_buf());
        }
    }
    Ok(files)
}

/// Reads every configuration file of `dir` ([`envoy_config_files`]), one domain per file, as
/// envoyproxy/ratelimit does. Errors name the file and the reason.
pub fn load_envoy_config_dir(dir: impl AsRef<Path>) -> Result<Vec<Domain>, ConfigError> {
    let files = envoy_config_files(dir)?;
    let mut domains = Vec::with_capacity(files.len());
    for path in files {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(&path)
            .map_err(|e| ConfigError::new(&shown, format!("cannot read the file: {e}")))?;
        domains.push(parse_envoy_config(&shown, &text)?);
    }
    Ok(domains)
}

fn convert(d: DescriptorYaml, source: &str, path: &mut String) -> Result<Descriptor, ConfigError> {
    let saved = path.len();
    path.push('.');
    path.push_str(&d.key);
    if let Some(v) = d.value.as_deref().filter(|v| !v.is_empty()) {
        path.push('_');
        path.push_str(v);
    }
    let here = format!("{source}: descriptor {path}");
    let mut out = Descriptor::new(d.key)
        .shadow_mode(d.shadow_mode)
        .quota_mode(d.quota_mode)
        .share_threshold(d.share_threshold);
    if let Some(v) = d.value {
        out = out.value(v);
    }
    if let Some(rl) = d.rate_limit {
        out = out.rate_limit(rate_limit(rl, &here)?);
    }
    for child in d.descriptors.unwrap_or_default() {
        out = out.descriptor(convert(child, source, path)?);
    }
    path.truncate(saved);
    Ok(out)
}

fn rate_limit(rl: RateLimitYaml, here: &str) -> Result<RateLimit, ConfigError> {
    let unit = rl.unit.as_deref().filter(|u| !u.is_empty());
    let mut limit = if rl.unlimited {
        if let Some(unit) = unit {
            return Err(ConfigError::new(
                here,
                format!(
                    "an unlimited rate_limit takes no unit (found {:?}): remove the unit, or \
                     `unlimited: true`",
                    unit.chars().take(40).collect::<String>()
                ),
            ));
        }
        RateLimit::unlimited()
    } else {
        let unit = unit
            .ok_or_else(|| {
                ConfigError::new(
                    here,
                    "rate_limit needs a unit (second, minute, hour, day, week, month or year), \
                     or `unlimited: true`",
                )
            })?
            .parse::<Unit>()
            .map_err(|e| ConfigError::new(here, e))?;
        // A missing requests_per_unit is 0, which denies every request, as in the peer.
        let mut limit = RateLimit::per(rl.requests_per_unit.unwrap_or(0), unit);
        if let Some(a) = rl.algorithm.as_deref() {
            let kind = a
                .parse::<AlgorithmKind>()
                .map_err(|e| ConfigError::new(here, e.to_string()))?;
            if kind == AlgorithmKind::Concurrency {
                return Err(ConfigError::new(here, crate::config::NO_RELEASE));
            }
            limit = limit.algorithm(kind);
        }
        if let Some(b) = rl.burst {
            limit = limit.burst(b);
        }
        limit
    };
    if let Some(name) = rl.name {
        limit = limit.named(name);
    }
    for replaced in rl.replaces.unwrap_or_default() {
        limit = limit.replaces(replaced.name.unwrap_or_default());
    }
    Ok(limit)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::parse_envoy_config;

    #[test]
    fn scalar_values_read_as_text_as_the_peer_reads_them() {
        // yaml.v2 reads a plain scalar into a string field whatever it looks like.
        let yaml = "domain: d\ndescriptors:\n  - key: status\n    value: 200\n  - key: on\n    value: true\n  - key: ratio\n    value: 0.5\n";
        let domain = parse_envoy_config("scalars.yaml", yaml).unwrap();
        let values: Vec<Option<&str>> = domain
            .descriptors
            .iter()
            .map(|d| d.value.as_deref())
            .collect();
        assert_eq!(values, [Some("200"), Some("true"), Some("0.5")]);
    }
}
