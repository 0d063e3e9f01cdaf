//! Writes a replay's output folder: `summary.json` (every figure, for scripts), the plots as
//! SVG and PNG, and `report.html`, one self-contained page (styles and plots inline, no
//! scripts, nothing fetched) with the tables and the plots.

mod html;
mod plots;

use std::path::{Path, PathBuf};

use crate::summary::{PolicySummary, Summary};
use plots::Plot;

/// Why the report could not be written.
///
/// As with [`ReplayError`](crate::ReplayError), each message includes its cause, which is
/// therefore not also the error's `source` (a chain printed whole would repeat it).
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A file could not be written.
    #[error("{path}: cannot write the report: {error}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A plot could not be drawn.
    #[error("cannot draw {plot}: {reason}")]
    Plot {
        /// Which.
        plot: String,
        /// Why.
        reason: String,
    },
}

/// One plot on the page.
#[derive(Debug)]
pub(crate) struct Figure {
    /// The file name without extension (`timeline-1-api`).
    pub(crate) stem: String,
    /// What it shows.
    pub(crate) caption: String,
    /// The SVG, inlined into the page.
    pub(crate) svg: String,
}

/// Writes `summary.json`, the plots and `report.html` into `dir` (created if needed); returns
/// the files written.
pub fn write(summary: &Summary, dir: &Path) -> Result<Vec<PathBuf>, ReportError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |error| ReportError::Write { path, error }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut written = Vec::new();
    let json_path = dir.join("summary.json");
    let json = serde_json::to_vec_pretty(summary).map_err(|e| ReportError::Write {
        path: json_path.clone(),
        error: e.into(),
    })?;
    std::fs::write(&json_path, json).map_err(io(&json_path))?;
    written.push(json_path);
    let figures = figures(summary, dir)?;
    for f in &figures {
        written.push(dir.join(format!("{}.svg", f.stem)));
        written.push(dir.join(format!("{}.png", f.stem)));
    }
    let html_path = dir.join("report.html");
    std::fs::write(&html_path, html::page(summary, &figures)).map_err(io(&html_path))?;
    written.push(html_path);
    Ok(written)
}

fn figures(summary: &Summary, dir: &Path) -> Result<Vec<Figure>, ReportError> {
    let mut out = Vec::new();
    let mut draw = |plot: Plot<'_>, stem: String, caption: String| {
        let svg = plots::render(plot, dir, &stem).map_err(|reason| ReportError::Plot {
            plot: stem.clone(),
            reason,
        })?;
        out.push(Figure { stem, caption, svg });
        Ok::<(), ReportError>(())
    };
    for (i, p) in summary.result.policies.iter().enumerate() {
        let slug = slug(i, &p.name);
        draw(
            Plot::Timeline(p),
            format!("timeline-{slug}"),
            format!(
                "{}: requests it decided over time, admitted and denied.",
                p.name
            ),
        )?;
        let limits = limits(summary, p);
        draw(
            Plot::Peaks(p, &limits),
            format!("peaks-{slug}"),
            format!(
                "{}: how many keys peaked at each demand (cost within one window), with the \
                 configured limit and the sweep's candidates drawn on it; a key right of a line \
                 is denied some of the time at that limit.",
                p.name
            ),
        )?;
    }
    if let Some(sweep) = &summary.sweep {
        draw(
            Plot::Sweep(sweep),
            "sweep".to_owned(),
            format!(
                "{}: the share of its requests each candidate would deny.",
                sweep.policy
            ),
        )?;
    }
    Ok(out)
}

/// The limits drawn on a policy's peak plot: its own, then the sweep's candidates of the same
/// window (a peak is measured over the policy's window, so other windows do not compare).
fn limits(summary: &Summary, p: &PolicySummary) -> Vec<(u32, String)> {
    let mut out = vec![(p.limit, format!("limit {} (configured)", p.limit))];
    let Some(sweep) = summary.sweep.as_ref().filter(|s| s.policy == p.name) else {
        return out;
    };
    for c in &sweep.candidates {
        let same_window = (c.window_secs - p.window_secs).abs() < 1e-9;
        if same_window && !out.iter().any(|(l, _)| *l == c.limit) {
            out.push((c.limit, format!("limit {} (candidate)", c.limit)));
        }
    }
    out
}

/// `3-api-v2`: a file name for policy `index` named `name`, unique and safe anywhere.
fn slug(index: usize, name: &str) -> String {
    let mut out = format!("{}-", index + 1);
    for c in name.chars() {
        out.push(if c.is_ascii_alphanumeric() {
            c.to_ascii_lowercase()
        } else {
            '-'
        });
    }
    out
}
