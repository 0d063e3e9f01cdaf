//! `report.html`: one page, styles and plots inline, no script, nothing to fetch.

use std::fmt::Write as _;

use super::Figure;
use crate::summary::{PolicySummary, RunSummary, Summary};
use crate::sweep::humanize;

/// Text made safe for HTML.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,Ubuntu,sans-serif;\
margin:2rem auto;max-width:980px;padding:0 1rem;color:#222;line-height:1.45}\
h1{margin-bottom:.2rem}h2{margin-top:2.5rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}\
.meta{color:#555}table{border-collapse:collapse;margin:1rem 0;font-size:.92rem}\
th,td{padding:.3rem .7rem;border-bottom:1px solid #eee;text-align:right}\
th:first-child,td:first-child{text-align:left}th{background:#f6f6f6}\
code{font-size:.88rem}figure{margin:1.5rem 0}figure svg{max-width:100%;height:auto;display:block}\
figcaption{color:#555;font-size:.9rem}.bad{color:#a33}";

fn number(n: u64) -> String {
    crate::table::thousands(n)
}

fn percent(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

fn window(secs: f64) -> String {
    humanize(std::time::Duration::from_secs_f64(secs))
}

fn table(out: &mut String, head: &[&str], rows: &[Vec<String>]) {
    out.push_str("<table><thead><tr>");
    for h in head {
        let _ = write!(out, "<th>{}</th>", escape(h));
    }
    out.push_str("</tr></thead><tbody>");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>\n");
}

fn policy_row(p: &PolicySummary) -> Vec<String> {
    vec![
        format!(
            "<b>{}</b><br><code>{}</code>",
            escape(&p.name),
            escape(&p.quota)
        ),
        escape(&p.action),
        number(p.requests),
        number(p.denied),
        percent(p.denied_share),
        number(p.keys),
        number(p.keys_affected),
        format!(
            "{} / {} / {}",
            number(p.peak.p50),
            number(p.peak.p99),
            number(p.peak.max)
        ),
    ]
}

const POLICY_HEAD: [&str; 8] = [
    "policy",
    "action",
    "requests",
    "denied",
    "share",
    "keys",
    "keys affected",
    "peak p50 / p99 / max",
];

fn header(out: &mut String, s: &Summary) {
    out.push_str("<h1>Tollgate replay</h1>\n<p class=\"meta\">");
    if let Some(c) = &s.config {
        let _ = write!(out, "Configuration <code>{}</code>; ", escape(c));
    }
    let logs: Vec<String> = s
        .logs
        .iter()
        .map(|l| {
            format!(
                "<code>{}</code> ({}, {} lines)",
                escape(&l.path),
                l.format,
                number(l.lines)
            )
        })
        .collect();
    let _ = write!(out, "logs {}.", logs.join(", "));
    if let (Some(a), Some(b)) = (&s.first_time, &s.last_time) {
        let _ = write!(
            out,
            " From {} to {} ({}).",
            escape(a),
            escape(b),
            window(s.duration_secs.round())
        );
    }
    out.push_str("</p>\n");
}

fn totals(out: &mut String, s: &Summary, r: &RunSummary) {
    let _ = writeln!(
        out,
        "<p>{} lines: {} requests, {} bad lines, {} out of order. {} requests fell under no \
         policy; <b>{} would have been answered 429</b> ({}), {} answered 401, {}, {} \
         delayed.</p>",
        number(s.lines),
        number(r.requests),
        number(s.bad_lines.count),
        number(s.out_of_order.count),
        number(r.unmatched),
        number(r.denied),
        percent(r.denied_share),
        number(r.unauthorized),
        crate::table::refusals(r),
        number(r.delayed)
    );
    if !s.bad_lines.first.is_empty() {
        out.push_str("<ul class=\"bad\">");
        for b in &s.bad_lines.first {
            let file = s.logs.get(b.at.file).map_or("?", |l| l.path.as_str());
            let _ = write!(
                out,
                "<li><code>{}:{}</code>: {}</li>",
                escape(file),
                b.at.line,
                escape(&b.reason)
            );
        }
        let more = s
            .bad_lines
            .count
            .saturating_sub(s.bad_lines.first.len() as u64);
        if more > 0 {
            let _ = write!(out, "<li>… and {} more</li>", number(more));
        }
        out.push_str("</ul>\n");
    }
    if let Some(costs) = crate::table::bad_costs(s) {
        let _ = writeln!(out, "<p>{}.</p>", escape(&costs));
    }
    if s.out_of_order.count > 0 {
        let _ = writeln!(
            out,
            "<p>{} lines were earlier than a line before them (by up to {:.3} s): each was \
             decided at the replay's time of then, as the clock never goes back.</p>",
            number(s.out_of_order.count),
            s.out_of_order.max_lag_secs
        );
    }
}

fn figure(out: &mut String, f: &Figure) {
    // The SVG document's own XML declaration does not belong inside HTML.
    let svg = f.svg.find("<svg").map_or(f.svg.as_str(), |i| &f.svg[i..]);
    let _ = writeln!(
        out,
        "<figure class=\"plot\" id=\"{stem}\">{svg}<figcaption>{caption} \
         <a href=\"{stem}.png\">PNG</a> · <a href=\"{stem}.svg\">SVG</a></figcaption></figure>",
        stem = escape(&f.stem),
        caption = escape(&f.caption),
    );
}

fn policy_section(out: &mut String, p: &PolicySummary, figures: &[Figure], index: usize) {
    let _ = writeln!(out, "<h2>{}</h2>", escape(&p.name));
    let _ = writeln!(
        out,
        "<p><code>{}</code>, action {}: {} of {} requests denied ({}), {} of {} keys affected. \
         Peak demand is the most cost one key asked for within one {} window.</p>",
        escape(&p.quota),
        escape(&p.action),
        number(p.denied),
        number(p.requests),
        percent(p.denied_share),
        number(p.keys_affected),
        number(p.keys),
        window(p.window_secs)
    );
    if !p.top_keys.is_empty() {
        let rows: Vec<Vec<String>> = p
            .top_keys
            .iter()
            .map(|k| {
                vec![
                    format!("<code>{}</code>", escape(&k.key)),
                    number(k.requests),
                    number(k.denied),
                    percent(k.denied_share),
                    number(k.peak),
                ]
            })
            .collect();
        table(
            out,
            &[
                "most limited keys (as the store holds them)",
                "requests",
                "denied",
                "share",
                "peak",
            ],
            &rows,
        );
    }
    let slug = super::slug(index, &p.name);
    for kind in ["timeline", "peaks"] {
        let stem = format!("{kind}-{slug}");
        for f in figures.iter().filter(|f| f.stem == stem) {
            figure(out, f);
        }
    }
}

/// The page.
pub(crate) fn page(s: &Summary, figures: &[Figure]) -> String {
    let mut out =
        String::with_capacity(64 * 1024 + figures.iter().map(|f| f.svg.len()).sum::<usize>());
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>Tollgate replay</title><style>{STYLE}</style></head><body>\n"
    );
    header(&mut out, s);
    let r = &s.result;
    totals(&mut out, s, r);
    let rows: Vec<Vec<String>> = r.policies.iter().map(policy_row).collect();
    table(&mut out, &POLICY_HEAD, &rows);
    for (i, p) in r.policies.iter().enumerate() {
        policy_section(&mut out, p, figures, i);
    }
    if let Some(sweep) = &s.sweep {
        let _ = writeln!(out, "<h2>Sweep of {}</h2>", escape(&sweep.policy));
        let rows: Vec<Vec<String>> = sweep
            .candidates
            .iter()
            .filter_map(|c| {
                let p = c.policy(&sweep.policy)?;
                let mut row = policy_row(p);
                row[0] = format!(
                    "<b>{}</b><br><code>{}</code>",
                    escape(&c.label),
                    escape(&p.quota)
                );
                row.push(percent(c.result.denied_share));
                Some(row)
            })
            .collect();
        let mut head = POLICY_HEAD.to_vec();
        head[0] = "candidate";
        head.push("429s overall");
        table(&mut out, &head, &rows);
        for f in figures.iter().filter(|f| f.stem == "sweep") {
            figure(&mut out, f);
        }
    }
    out.push_str("<p class=\"meta\">The same figures are in <code>summary.json</code>.</p>\n</body></html>\n");
    out
}
