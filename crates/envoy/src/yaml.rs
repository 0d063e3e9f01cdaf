//! envoyproxy/ratelimit's YAML configuration files, read unchanged: `domain`, `descriptors`
//! with `key`, `value`, `rate_limit` (`unit`, `requests_per_unit`, `unlimited`, `name`),
//! `shadow_mode` and nested `descriptors`. `detailed_metric`, `value_to_metric`,
//! `share_threshold`, `quota_mode` and `replaces` are accepted and ignored. Tollgate adds two
//! optional `rate_limit` fields: `algorithm` (`fixed_window`, the default, as
//! envoyproxy/ratelimit counts; `sliding_window_counter`, `sliding_window_log`, `token_bucket`,
//! `leaky_bucket`) and `burst` (token bucket capacity, leaky bucket queue).

use std::path::Path;

use serde::Deserialize;
use tollgate::AlgorithmKind;

use crate::config::{ConfigError, Descriptor, Domain, RateLimit, Unit};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileYaml {
    domain: String,
    #[serde(default)]
    descriptors: Vec<DescriptorYaml>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DescriptorYaml {
    key: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    rate_limit: Option<RateLimitYaml>,
    #[serde(default)]
    descriptors: Vec<DescriptorYaml>,
    #[serde(default)]
    shadow_mode: bool,
    // Accepted for compatibility, not used.
    #[serde(default, rename = "detailed_metric")]
    _detailed_metric: Option<serde::de::IgnoredAny>,
    #[serde(default, rename = "value_to_metric")]
    _value_to_metric: Option<serde::de::IgnoredAny>,
    #[serde(default, rename = "share_threshold")]
    _share_threshold: Option<serde::de::IgnoredAny>,
    #[serde(default, rename = "quota_mode")]
    _quota_mode: Option<serde::de::IgnoredAny>,
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
    algorithm: Option<String>,
    #[serde(default)]
    burst: Option<u32>,
    #[serde(default, rename = "replaces")]
    _replaces: Option<serde::de::IgnoredAny>,
}

/// Reads one envoyproxy/ratelimit YAML document; `source` names it in errors.
pub fn parse_envoy_config(source: &str, text: &str) -> Result<Domain, ConfigError> {
    let file: FileYaml =
        serde_norway::from_str(text).map_err(|e| ConfigError::new(source, e.to_string()))?;
    let mut domain = Domain::new(file.domain.clone()).with_source(source.to_owned());
    let mut path = file.domain.clone();
    for d in file.descriptors {
        domain = domain.descriptor(convert(d, source, &mut path)?);
    }
    Ok(domain)
}

/// Reads every `*.yaml` and `*.yml` file of `dir` (not its subdirectories), in name order, one
/// domain per file, as envoyproxy/ratelimit does. Errors name the file and the reason.
pub fn load_envoy_config_dir(dir: impl AsRef<Path>) -> Result<Vec<Domain>, ConfigError> {
    let dir = dir.as_ref();
    let shown = dir.display().to_string();
    let entries = std::fs::read_dir(dir)
        .map_err(|e| ConfigError::new(&shown, format!("cannot read the directory: {e}")))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry
            .map_err(|e| ConfigError::new(&shown, format!("cannot read the directory: {e}")))?;
        let path = entry.path();
        let is_yaml = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e == "yaml" || e == "yml");
        if is_yaml && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
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
    if let Some(v) = &d.value {
        path.push('_');
        path.push_str(v);
    }
    let here = || format!("{source}: descriptor {path}");
    let mut out = Descriptor::new(d.key).shadow_mode(d.shadow_mode);
    if let Some(v) = d.value {
        out = out.value(v);
    }
    if let Some(rl) = d.rate_limit {
        let limit = if rl.unlimited {
            RateLimit::unlimited()
        } else {
            let unit = rl
                .unit
                .as_deref()
                .ok_or_else(|| ConfigError::new(here(), "rate_limit needs a unit"))?
                .parse::<Unit>()
                .map_err(|e| ConfigError::new(here(), e))?;
            let rpu = rl
                .requests_per_unit
                .ok_or_else(|| ConfigError::new(here(), "rate_limit needs requests_per_unit"))?;
            let mut limit = RateLimit::per(rpu, unit);
            if let Some(a) = rl.algorithm.as_deref() {
                let kind = a
                    .parse::<AlgorithmKind>()
                    .map_err(|e| ConfigError::new(here(), e.to_string()))?;
                limit = limit.algorithm(kind);
            }
            if let Some(b) = rl.burst {
                limit = limit.burst(b);
            }
            limit
        };
        out = out.rate_limit(match rl.name {
            Some(n) => limit.named(n),
            None => limit,
        });
    }
    for child in d.descriptors {
        out = out.descriptor(convert(child, source, path)?);
    }
    path.truncate(saved);
    Ok(out)
}
