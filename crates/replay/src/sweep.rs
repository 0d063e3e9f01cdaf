//! `--sweep limit=50,100,200` (and `window=`, `algorithm=`, `calendar=`): candidate
//! configurations, each the original with one policy's quota changed, replayed side by side over
//! the same log.
//!
//! Every quota is seen as the `(q, w)` pair that `RateLimit-Policy` advertises: a limit
//! per window, a token bucket's capacity and the time it takes to refill, a leaky bucket's
//! burst (`queue + 1`) and the time it takes to drain. A candidate replaces one or more of
//! algorithm, `q` and `w` and keeps the others, so `algorithm=token_bucket` on a policy of 100
//! a minute tries a bucket of 100 refilled at 100 a minute.
//!
//! A fixed window by the calendar keeps its calendar (and its time zone) through `limit=`;
//! `calendar=day,month` tries fixed windows by those periods, in the policy's zone (UTC when it
//! has none), and `window=` or another algorithm replaces the calendar.

use std::sync::Arc;
use std::time::Duration;

use tollgate::{AlgorithmKind, Calendar, CalendarUnit, Policy, Quota, Rate};
use tollgate_config::Config;
use tollgate_config::PolicyConfig;

/// The most candidates one replay runs (each keeps its own counters for every key).
pub const MAX_CANDIDATES: usize = 64;

/// One `--sweep` dimension: a quota field and the values to try.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dimension {
    /// `limit=50,100,200`: `q`.
    Limit(Vec<u32>),
    /// `window=30s,1m,5m`: `w`.
    Window(Vec<Duration>),
    /// `algorithm=sliding_window_counter,token_bucket`.
    Algorithm(Vec<AlgorithmKind>),
    /// `calendar=day,week,month`: fixed windows by the calendar.
    Calendar(Vec<CalendarUnit>),
}

impl std::str::FromStr for Dimension {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (field, values) = text.split_once('=').ok_or_else(|| {
            format!("--sweep {text:?}: write FIELD=V1,V2,..., like limit=50,100,200")
        })?;
        let values: Vec<&str> = values.split(',').map(str::trim).collect();
        if values.iter().any(|v| v.is_empty()) {
            return Err(format!("--sweep {text:?}: an empty value"));
        }
        let each = |what: &str, e: String| format!("--sweep {field}={what}: {e}");
        match field.trim() {
            "limit" => values
                .iter()
                .map(|v| match v.parse::<u32>() {
                    Ok(n) if n > 0 => Ok(n),
                    _ => Err(each(v, "a limit is a whole number from 1".to_owned())),
                })
                .collect::<Result<_, _>>()
                .map(Dimension::Limit),
            "window" => values
                .iter()
                .map(|v| tollgate::parse_duration(v).map_err(|e| each(v, e.to_string())))
                .collect::<Result<_, _>>()
                .map(Dimension::Window),
            "algorithm" => values
                .iter()
                .map(|v| {
                    v.parse::<AlgorithmKind>()
                        .map_err(|e| each(v, e.to_string()))
                })
                .collect::<Result<_, _>>()
                .map(Dimension::Algorithm),
            "calendar" => values
                .iter()
                .map(|v| {
                    v.parse::<CalendarUnit>()
                        .map_err(|e| each(v, e.to_string()))
                })
                .collect::<Result<_, _>>()
                .map(Dimension::Calendar),
            other => Err(format!(
                "--sweep {other}=...: sweep limit=, window=, algorithm= or calendar="
            )),
        }
    }
}

/// What to sweep: one policy, one or more dimensions (several make a grid).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sweep {
    /// The policy whose quota changes; may be left out when the configuration has one.
    pub policy: Option<String>,
    /// The dimensions.
    pub dimensions: Vec<Dimension>,
}

/// One configuration to try.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// `limit=50 window=1m`.
    pub label: String,
    /// The policy's algorithm in this candidate.
    pub algorithm: AlgorithmKind,
    /// Its `q`.
    pub limit: u32,
    /// Its `w`.
    pub window: Duration,
    /// The configuration with the policy changed.
    pub config: Config,
}

/// The swept policy's name and the candidates, in the order of the values given.
pub fn candidates(config: &Config, sweep: &Sweep) -> Result<(String, Vec<Candidate>), String> {
    let index = match &sweep.policy {
        Some(name) => config
            .policies
            .iter()
            .position(|p| p.name() == name)
            .ok_or_else(|| format!("--policy {name:?}: the configuration has no such policy"))?,
        None if config.policies.len() == 1 => 0,
        None => {
            return Err(
                "--sweep: the configuration has several policies; name one with --policy".into(),
            );
        }
    };
    let base = &config.policies[index];
    let quota = base.policy.quota();
    let calendar = match quota {
        Quota::FixedWindow(a) => a.calendar().map(Calendar::unit),
        _ => None,
    };
    let zone = match quota {
        Quota::FixedWindow(a) => a.calendar().map(|c| c.zone_name().to_owned()),
        _ => None,
    };
    let mut grid = vec![(
        quota.kind(),
        quota.limit(),
        quota.window(),
        calendar,
        String::new(),
    )];
    for dimension in &sweep.dimensions {
        grid = expand(grid, dimension);
    }
    if grid.len() > MAX_CANDIDATES {
        return Err(format!(
            "--sweep: {} candidates; at most {MAX_CANDIDATES}",
            grid.len()
        ));
    }
    let name = base.name().to_owned();
    let out = grid
        .into_iter()
        .map(|(algorithm, limit, window, calendar, label)| {
            let label = label.trim().to_owned();
            concurrency_matches(quota, algorithm, &name)
                .map_err(|reason| format!("--sweep {label}: {reason}"))?;
            let quota = match calendar {
                Some(unit) => Calendar::new(unit, zone.as_deref().unwrap_or("UTC"))
                    .and_then(|c| Quota::fixed_calendar(limit, c)),
                None => quota_of(algorithm, limit, window),
            }
            .map_err(|e| format!("--sweep {label}: {e}"))?;
            let policy = Policy::new(&name, quota).map_err(|e| format!("--sweep {label}: {e}"))?;
            let mut policies: Vec<PolicyConfig> = config.policies.to_vec();
            let mut changed = base.clone();
            changed.policy = policy;
            policies[index] = changed;
            let mut config = config.clone();
            config.policies = Arc::from(policies);
            Ok(Candidate {
                label,
                algorithm,
                limit,
                window,
                config,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    refuse_duplicates(&out, &name)?;
    Ok((name, out))
}

/// A concurrency limit and a rate are different measures: requests in flight, against requests
/// per window. Neither can stand in for the other, so a candidate that would swap one for the
/// other is refused; `quota_of` would otherwise make one silently, with the window as a
/// concurrency limit's `lease_ttl` or the other way round.
fn concurrency_matches(base: &Quota, candidate: AlgorithmKind, name: &str) -> Result<(), String> {
    let concurrency = AlgorithmKind::Concurrency;
    match (base.kind() == concurrency, candidate == concurrency) {
        (false, true) => Err(format!(
            "a concurrency limit caps the requests in flight and has no window, so it cannot \
             stand in for {name:?}'s {base}; sweep limit= on a concurrency policy to try other \
             caps"
        )),
        (true, false) => Err(format!(
            "{name:?} is a concurrency limit (requests in flight), and {candidate} counts \
             requests per window: one cannot stand in for the other; sweep its limit= (the cap) \
             or window= (its lease_ttl)"
        )),
        _ => Ok(()),
    }
}

/// Two candidates with the same quota would replay alike and show the same row twice (a value
/// given twice, `window=60s,1m`, or a grid whose last dimension overrides an earlier one): the
/// sweep is refused, naming both, so the mistake is seen rather than printed as two results.
fn refuse_duplicates(candidates: &[Candidate], name: &str) -> Result<(), String> {
    let quotas: Vec<String> = candidates
        .iter()
        .map(|c| {
            c.config
                .policies
                .iter()
                .find(|p| p.name() == name)
                .map_or_else(String::new, |p| p.policy.quota().to_string())
        })
        .collect();
    for (i, quota) in quotas.iter().enumerate() {
        if let Some(j) = quotas[..i].iter().position(|q| q == quota) {
            return Err(format!(
                "--sweep: {} and {} are the same quota ({quota}); each candidate must differ",
                candidates[j].label, candidates[i].label
            ));
        }
    }
    Ok(())
}

/// One candidate quota: algorithm, `q`, `w`, the calendar of a fixed window by one, label.
type Point = (AlgorithmKind, u32, Duration, Option<CalendarUnit>, String);

fn expand(grid: Vec<Point>, dimension: &Dimension) -> Vec<Point> {
    let mut out = Vec::new();
    for (kind, limit, window, calendar, label) in grid {
        match dimension {
            Dimension::Limit(values) => out.extend(
                values
                    .iter()
                    .map(|&v| (kind, v, window, calendar, format!("{label} limit={v}"))),
            ),
            Dimension::Window(values) => out.extend(values.iter().map(|&v| {
                let text = humanize(v);
                (kind, limit, v, None, format!("{label} window={text}"))
            })),
            Dimension::Algorithm(values) => out.extend(values.iter().map(|&v| {
                // A calendar stays only on a fixed window.
                let calendar = calendar.filter(|_| v == AlgorithmKind::FixedWindow);
                (v, limit, window, calendar, format!("{label} algorithm={v}"))
            })),
            Dimension::Calendar(values) => out.extend(values.iter().map(|&v| {
                let w = Duration::from_secs(v.nominal_secs());
                let fixed = AlgorithmKind::FixedWindow;
                (fixed, limit, w, Some(v), format!("{label} calendar={v}"))
            })),
        }
    }
    out
}

/// The quota of `algorithm` with `q = limit` and `w = window` (for a concurrency limit, the
/// permits' lifetime).
pub fn quota_of(
    algorithm: AlgorithmKind,
    limit: u32,
    window: Duration,
) -> Result<Quota, tollgate::QuotaError> {
    match algorithm {
        AlgorithmKind::FixedWindow => Quota::fixed_window(limit, window),
        AlgorithmKind::SlidingWindowLog => Quota::sliding_window_log(limit, window),
        AlgorithmKind::SlidingWindowCounter => Quota::sliding_window_counter(limit, window),
        AlgorithmKind::TokenBucket => Quota::token_bucket(limit, Rate::new(limit, window)?),
        AlgorithmKind::LeakyBucket => {
            Quota::leaky_bucket(Rate::new(limit, window)?, limit.saturating_sub(1))
        }
        // Requests in flight have no window: `window` is how long a permit lives.
        AlgorithmKind::Concurrency => Quota::concurrency(limit, window),
    }
}

/// `90s` as `1m30s`: the configuration's own notation.
pub fn humanize(d: Duration) -> String {
    let mut ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    for (size, unit) in [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
        (1, "ms"),
    ] {
        if ms >= size {
            out.push_str(&format!("{}{unit}", ms / size));
            ms %= size;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Result<Config, String> {
        Config::parse(
            "t.toml",
            "[[policy]]\nname = \"api\"\nalgorithm = \"sliding_window_counter\"\nlimit = 100\nwindow = \"1m\"\nkey = [\"ip\"]\n",
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn a_grid_of_limits_and_algorithms() -> Result<(), String> {
        let sweep = Sweep {
            policy: None,
            dimensions: vec![
                "limit=50,200".parse()?,
                "algorithm=token_bucket,leaky_bucket".parse()?,
            ],
        };
        let (name, c) = candidates(&config()?, &sweep)?;
        assert_eq!(name, "api");
        let labels: Vec<&str> = c.iter().map(|c| c.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "limit=50 algorithm=token_bucket",
                "limit=50 algorithm=leaky_bucket",
                "limit=200 algorithm=token_bucket",
                "limit=200 algorithm=leaky_bucket"
            ]
        );
        let q = c[1].config.policies[0].policy.quota();
        assert_eq!(
            (q.kind(), q.limit(), q.window()),
            (AlgorithmKind::LeakyBucket, 50, Duration::from_secs(60))
        );
        let q = c[2].config.policies[0].policy.quota();
        assert_eq!(q.to_string(), "token_bucket capacity=200 refill=200/1m");
        Ok(())
    }

    fn sweep(dimensions: &[&str]) -> Result<Sweep, String> {
        Ok(Sweep {
            policy: None,
            dimensions: dimensions
                .iter()
                .map(|d| d.parse())
                .collect::<Result<_, _>>()?,
        })
    }

    /// The same quota twice would replay twice and print the same row twice.
    #[test]
    fn duplicate_candidates_are_refused() -> Result<(), String> {
        for (dimensions, needle) in [
            (&["limit=3,3"][..], "limit=3 and limit=3 are the same quota"),
            (
                &["window=60s,1m"],
                "window=1m and window=1m are the same quota",
            ),
            (
                &["window=1m,2m", "calendar=day"],
                "window=1m calendar=day and window=2m calendar=day are the same quota",
            ),
        ] {
            let err = candidates(&config()?, &sweep(dimensions)?)
                .err()
                .unwrap_or_default();
            assert!(err.contains(needle), "{dimensions:?}: {err}");
        }
        let (_, c) = candidates(&config()?, &sweep(&["limit=3,4", "window=1m,2m"])?)?;
        assert_eq!(c.len(), 4);
        Ok(())
    }

    /// Requests in flight and requests per window are different measures: a sweep never swaps
    /// one for the other (it used to make a concurrency limit whose lease_ttl was the window).
    #[test]
    fn concurrency_and_rates_do_not_stand_in_for_each_other() -> Result<(), String> {
        let err = candidates(&config()?, &sweep(&["algorithm=token_bucket,concurrency"])?)
            .err()
            .unwrap_or_default();
        assert!(
            err.contains("algorithm=concurrency: a concurrency limit caps the requests in flight"),
            "{err}"
        );
        let concurrency = Config::parse(
            "t.toml",
            "[[policy]]\nname = \"exports\"\nalgorithm = \"concurrency\"\nlimit = 2\nkey = [\"ip\"]\n",
        )
        .map_err(|e| e.to_string())?;
        for dimension in ["algorithm=fixed_window", "calendar=day"] {
            let err = candidates(&concurrency, &sweep(&[dimension])?)
                .err()
                .unwrap_or_default();
            assert!(err.contains("is a concurrency limit"), "{dimension}: {err}");
        }
        // Its cap and its lease_ttl are swept as such.
        let (_, c) = candidates(&concurrency, &sweep(&["limit=1,4", "window=10m"])?)?;
        let quotas: Vec<String> = c
            .iter()
            .map(|c| c.config.policies[0].policy.quota().to_string())
            .collect();
        assert_eq!(
            quotas,
            [
                "concurrency limit=1 lease_ttl=10m",
                "concurrency limit=4 lease_ttl=10m"
            ]
        );
        Ok(())
    }

    #[test]
    fn bad_sweeps_say_why() -> Result<(), String> {
        for (text, needle) in [
            ("limit", "FIELD="),
            ("limit=0", "whole number"),
            ("limit=5,,6", "empty"),
            ("window=5y", "unknown unit"),
            ("algorithm=gcra", "unknown algorithm"),
            ("burst=5", "sweep limit="),
        ] {
            let err = text.parse::<Dimension>().err().unwrap_or_default();
            assert!(err.contains(needle), "{text}: {err}");
        }
        let sweep = Sweep {
            policy: Some("nope".into()),
            dimensions: vec![],
        };
        assert!(
            candidates(&config()?, &sweep)
                .err()
                .unwrap_or_default()
                .contains("no such policy")
        );
        Ok(())
    }
}
