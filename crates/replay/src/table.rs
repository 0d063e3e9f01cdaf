//! The summary as text tables, for the terminal.

use std::fmt::Write as _;

use crate::summary::{PolicySummary, RunSummary, Summary};
use crate::sweep::humanize;

/// `1234567` as `1,234,567`.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// How many bad lines the table shows by number (the summary lists more, and counts all).
const BAD_SHOWN: usize = 5;

/// `3 refused before any policy (2 answered 400, 1 answered 414)`: requests answered before
/// any policy counted them, by status, since a 414 (a path too deep) or a 403 (a deny list)
/// is not an unreadable request and one label for all would misname them.
pub(crate) fn refusals(r: &RunSummary) -> String {
    let mut text = format!("{} refused before any policy", thousands(r.refused));
    let statuses: Vec<String> = r
        .refused_by_status
        .iter()
        .map(|(status, n)| format!("{} answered {status}", thousands(*n)))
        .collect();
    if !statuses.is_empty() {
        let _ = write!(text, " ({})", statuses.join(", "));
    }
    text
}

/// `2 lines whose cost is not a whole number (first: access.log:7), replayed and charged the
/// policy's cost`, when there are any: they are requests, not bad lines, and the policies
/// charged by the response charged them their `cost`, as the server does a bad cost.
pub(crate) fn bad_costs(s: &Summary) -> Option<String> {
    let count = s.bad_costs.count;
    let first = s.bad_costs.first.first()?;
    let file = s.logs.get(first.file).map_or("?", |l| l.path.as_str());
    let lines = if count == 1 { "line" } else { "lines" };
    Some(format!(
        "{} {lines} whose cost is not a whole number (first: {file}:{}), replayed and charged \
         the policy's cost",
        thousands(count),
        first.line
    ))
}

fn percent(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

fn window(secs: f64) -> String {
    humanize(std::time::Duration::from_secs_f64(secs))
}

/// Rows of cells, left-aligned first column, the rest right-aligned.
fn grid(out: &mut String, rows: &[Vec<String>]) {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in rows {
        let mut line = String::from("  ");
        for (c, cell) in row.iter().enumerate() {
            let w = widths[c];
            if c == 0 {
                let _ = write!(line, "{cell:<w$}");
            } else {
                let _ = write!(line, "  {cell:>w$}");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

fn policy_rows(run: &RunSummary, only: Option<&str>) -> Vec<Vec<String>> {
    let mut rows = vec![
        [
            "policy", "requests", "denied", "share", "keys", "affected", "peak p50", "p99", "max",
            "per",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for p in run
        .policies
        .iter()
        .filter(|p| only.is_none_or(|n| n == p.name))
    {
        rows.push(vec![
            p.name.clone(),
            thousands(p.requests),
            thousands(p.denied),
            percent(p.denied_share),
            thousands(p.keys),
            thousands(p.keys_affected),
            thousands(p.peak.p50),
            thousands(p.peak.p99),
            thousands(p.peak.max),
            window(p.window_secs),
        ]);
    }
    rows
}

fn top_keys(out: &mut String, p: &PolicySummary) {
    if p.top_keys.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nmost limited keys of {} (peak per {}):",
        p.name,
        window(p.window_secs)
    );
    let mut rows = vec![
        ["key", "requests", "denied", "share", "peak"]
            .map(String::from)
            .to_vec(),
    ];
    for k in &p.top_keys {
        rows.push(vec![
            k.key.clone(),
            thousands(k.requests),
            thousands(k.denied),
            percent(k.denied_share),
            thousands(k.peak),
        ]);
    }
    grid(out, &rows);
}

/// The whole summary as text.
pub fn render(s: &Summary) -> String {
    let mut out = String::new();
    let span = match (&s.first_time, &s.last_time) {
        (Some(a), Some(b)) => format!(", {a} to {b}"),
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "{} lines{span}; {} bad, {} out of order",
        thousands(s.lines),
        thousands(s.bad_lines.count),
        thousands(s.out_of_order.count)
    );
    let shown = s.bad_lines.first.len().min(BAD_SHOWN);
    for b in &s.bad_lines.first[..shown] {
        let file = s.logs.get(b.at.file).map_or("?", |l| l.path.as_str());
        let _ = writeln!(out, "  bad line {file}:{}: {}", b.at.line, b.reason);
    }
    // The rest are counted, not shown: say how many, and where the list goes on (summary.json
    // lists only the first few too, so it is said when even that list stops short).
    let more = s.bad_lines.count.saturating_sub(shown as u64);
    if more > 0 {
        let listed = s.bad_lines.first.len();
        let rest = if listed as u64 >= s.bad_lines.count {
            ", all listed in summary.json (--out)".to_owned()
        } else {
            format!("; summary.json (--out) lists the first {listed}")
        };
        let _ = writeln!(out, "  ... and {} more bad lines{rest}", thousands(more));
    }
    if let Some(costs) = bad_costs(s) {
        let _ = writeln!(out, "  {costs}");
    }
    let r = &s.result;
    let _ = writeln!(
        out,
        "{} requests: {} under no policy, {} answered 429 ({}), {} answered 401, {}, {} delayed\n",
        thousands(r.requests),
        thousands(r.unmatched),
        thousands(r.denied),
        percent(r.denied_share),
        thousands(r.unauthorized),
        refusals(r),
        thousands(r.delayed)
    );
    grid(&mut out, &policy_rows(r, None));
    for p in &r.policies {
        top_keys(&mut out, p);
    }
    if let Some(sweep) = &s.sweep {
        let _ = writeln!(out, "\nsweep of {}:", sweep.policy);
        let mut rows = vec![
            [
                "candidate",
                "quota",
                "denied",
                "share",
                "affected",
                "429s overall",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for c in &sweep.candidates {
            let Some(p) = c.policy(&sweep.policy) else {
                continue;
            };
            rows.push(vec![
                c.label.clone(),
                p.quota.clone(),
                thousands(p.denied),
                percent(p.denied_share),
                thousands(p.keys_affected),
                percent(c.result.denied_share),
            ]);
        }
        grid(&mut out, &rows);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_grouped() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(5_000_000), "5,000,000");
    }
}
