//! The plots, drawn once per backend (SVG for the page, PNG for slides and chats): requests
//! over time per policy, the distribution of per-key peak demand with the limits on it, and the
//! denied share per sweep candidate.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use time::OffsetDateTime;
use time::macros::format_description;

use crate::summary::{PolicySummary, SweepSummary};
use crate::sweep::humanize;

/// Pixels of every plot.
pub(crate) const SIZE: (u32, u32) = (900, 380);

/// A plot to draw.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Plot<'a> {
    /// Admitted and denied over time.
    Timeline(&'a PolicySummary),
    /// Keys per peak demand, with the current limit and the candidates'.
    Peaks(&'a PolicySummary, &'a [(u32, String)]),
    /// Denied share per candidate.
    Sweep(&'a SweepSummary),
}

/// The SVG text of `plot`, also written to `dir/stem.svg`, and `dir/stem.png`.
pub(crate) fn render(plot: Plot<'_>, dir: &Path, stem: &str) -> Result<String, String> {
    fonts()?;
    let mut svg = String::new();
    {
        let area = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        plot.draw(&area)?;
        area.present().map_err(err)?;
    }
    let svg_path = dir.join(format!("{stem}.svg"));
    std::fs::write(&svg_path, &svg).map_err(|e| format!("{}: {e}", svg_path.display()))?;
    let png_path = dir.join(format!("{stem}.png"));
    let area = BitMapBackend::new(&png_path, SIZE).into_drawing_area();
    plot.draw(&area)?;
    area.present()
        .map_err(|e| format!("{}: {e}", png_path.display()))?;
    Ok(svg)
}

/// Text is drawn with a font compiled into the binary: no system font library or font file
/// is needed, and every machine draws the same picture.
fn fonts() -> Result<(), String> {
    static REGISTER: Once = Once::new();
    let mut result = Ok(());
    REGISTER.call_once(|| {
        result = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            epaint_default_fonts::UBUNTU_LIGHT,
        )
        .map_err(|_| "the built-in font cannot be read".to_owned());
    });
    result
}

fn err<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> String {
    e.to_string()
}

const FONT: &str = "sans-serif";

/// Line colours, distinct in print and for the common colour blindnesses (Okabe-Ito).
const PALETTE: [RGBColor; 7] = [
    RGBColor(0, 114, 178),
    RGBColor(230, 159, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(213, 94, 0),
    RGBColor(0, 0, 0),
];

impl Plot<'_> {
    fn draw<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<(), String> {
        area.fill(&WHITE).map_err(err)?;
        match *self {
            Plot::Timeline(p) => timeline(area, p),
            Plot::Peaks(p, limits) => peaks(area, p, limits),
            Plot::Sweep(s) => sweep(area, s),
        }
    }
}

/// `HH:MM:SS`, `HH:MM` or `MM-DD HH:MM` (UTC), by the span shown.
fn clock_label(unix: f64, span: f64) -> String {
    let Ok(t) = OffsetDateTime::from_unix_timestamp(unix as i64) else {
        return String::new();
    };
    let text = if span <= 3_600.0 {
        t.format(format_description!("[hour]:[minute]:[second]"))
    } else if span <= 2.0 * 86_400.0 {
        t.format(format_description!("[hour]:[minute]"))
    } else {
        t.format(format_description!("[month]-[day] [hour]:[minute]"))
    };
    text.unwrap_or_default()
}

fn timeline<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &PolicySummary,
) -> Result<(), String> {
    let t = &p.timeline;
    let n = t.admitted.len().max(1);
    let start = t.start_unix;
    let end = start + t.bucket_secs.max(1.0) * n as f64;
    let top = t
        .admitted
        .iter()
        .zip(&t.denied)
        .map(|(a, d)| a + d)
        .max()
        .unwrap_or(0)
        .max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{}: admitted and denied over time (UTC)", p.name),
            (FONT, 20),
        )
        .margin(14)
        .x_label_area_size(34)
        .y_label_area_size(64)
        .build_cartesian_2d(start..end, 0f64..top as f64 * 1.15)
        .map_err(err)?;
    let span = end - start;
    chart
        .configure_mesh()
        .x_labels(8)
        .x_label_formatter(&|x| clock_label(*x, span))
        .y_desc(format!(
            "requests per {}",
            humanize(std::time::Duration::from_secs_f64(t.bucket_secs.max(0.001)))
        ))
        .y_label_formatter(&|y| format!("{}", y.round() as u64))
        .label_style((FONT, 13))
        .light_line_style(RGBColor(238, 238, 238))
        .draw()
        .map_err(err)?;
    // Steps: each bucket is flat over its width.
    let steps = |value: &dyn Fn(usize) -> u64| -> Vec<(f64, f64)> {
        (0..t.admitted.len())
            .flat_map(|i| {
                let x = start + t.bucket_secs * i as f64;
                let y = value(i) as f64;
                [(x, y), (x + t.bucket_secs, y)]
            })
            .collect()
    };
    // Opaque fills: the admitted area covers the lower part of the total, so the red band
    // left above it is exactly the denied requests.
    let red = RGBColor(214, 69, 65);
    let green = RGBColor(46, 139, 87);
    let (red_fill, green_fill) = (RGBColor(240, 170, 165), RGBColor(160, 214, 180));
    let total = steps(&|i| t.admitted[i] + t.denied[i]);
    chart
        .draw_series(AreaSeries::new(total, 0.0, red_fill).border_style(red))
        .map_err(err)?
        .label("denied")
        .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], red_fill.filled()));
    let admitted = steps(&|i| t.admitted[i]);
    chart
        .draw_series(AreaSeries::new(admitted, 0.0, green_fill).border_style(green))
        .map_err(err)?
        .label("admitted")
        .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], green_fill.filled()));
    chart
        .configure_series_labels()
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .draw()
        .map_err(err)
}

fn peaks<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &PolicySummary,
    limits: &[(u32, String)],
) -> Result<(), String> {
    let bins: Vec<_> = p.peak_histogram.iter().filter(|b| b.from > 0).collect();
    let log2 = |v: f64| v.max(1.0).log2();
    let right = bins
        .iter()
        .map(|b| log2(b.to as f64))
        .chain(limits.iter().map(|(l, _)| log2(f64::from(*l)) + 0.5))
        .fold(1.0, f64::max)
        .ceil();
    let most = bins.iter().map(|b| b.keys).max().unwrap_or(1).max(1) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!(
                "{}: keys by peak demand per {}",
                p.name,
                humanize(std::time::Duration::from_secs_f64(p.window_secs))
            ),
            (FONT, 20),
        )
        .margin(14)
        .x_label_area_size(34)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..right, (0.7f64..most * 3.0).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_labels(right as usize + 1)
        .x_label_formatter(&|x| format!("{}", 2f64.powf(*x).round()))
        .x_desc("peak demand (cost per window; log scale)")
        .y_desc("keys (log scale)")
        .y_label_formatter(&|y| format!("{}", y.round() as u64))
        .label_style((FONT, 13))
        .light_line_style(RGBColor(238, 238, 238))
        .draw()
        .map_err(err)?;
    let blue = RGBColor(66, 112, 184);
    chart
        .draw_series(bins.iter().map(|b| {
            let x = log2(b.from as f64);
            Rectangle::new(
                [(x + 0.04, 0.7), (x + 0.96, b.keys as f64)],
                blue.mix(0.7).filled(),
            )
        }))
        .map_err(err)?;
    for (i, (limit, label)) in limits.iter().enumerate() {
        let x = log2(f64::from(*limit));
        let color = if i == 0 {
            RGBColor(214, 69, 65)
        } else {
            PALETTE[i % PALETTE.len()]
        };
        let label = label.clone();
        chart
            .draw_series(LineSeries::new(
                [(x, 0.7), (x, most * 3.0)],
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .draw()
        .map_err(err)
}

/// One line of the sweep plot: its label and its points.
type Series = BTreeMap<String, Vec<(f64, f64)>>;

/// The sweep's points, and the x axis they use: the limit when candidates differ in it, else
/// the window, else the candidate's position.
fn sweep_points(s: &SweepSummary) -> (Series, &'static str, Vec<String>) {
    let distinct = |f: &dyn Fn(&crate::summary::CandidateSummary) -> String| {
        let mut v: Vec<String> = s.candidates.iter().map(f).collect();
        v.sort();
        v.dedup();
        v.len() > 1
    };
    let by_limit = distinct(&|c| c.limit.to_string());
    let by_window = !by_limit && distinct(&|c| c.window_secs.to_string());
    let mut series = Series::new();
    let mut names = Vec::new();
    for (i, c) in s.candidates.iter().enumerate() {
        let Some(p) = c.policy(&s.policy) else {
            continue;
        };
        let window = humanize(std::time::Duration::from_secs_f64(c.window_secs));
        let (key, x) = if by_limit {
            (format!("{} per {window}", c.algorithm), f64::from(c.limit))
        } else if by_window {
            (c.algorithm.clone(), c.window_secs)
        } else {
            ("candidates".to_owned(), i as f64)
        };
        names.push(c.label.clone());
        series
            .entry(key)
            .or_default()
            .push((x, p.denied_share * 100.0));
    }
    let axis = if by_limit {
        "candidate limit"
    } else if by_window {
        "candidate window (seconds)"
    } else {
        "candidate"
    };
    (series, axis, names)
}

fn sweep<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    s: &SweepSummary,
) -> Result<(), String> {
    let (series, axis, names) = sweep_points(s);
    let xs = series.values().flatten().map(|(x, _)| *x);
    let (lo, hi) = xs.fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let (lo, hi) = if lo > hi { (0.0, 1.0) } else { (lo, hi) };
    let pad = ((hi - lo) * 0.08).max(0.5);
    let top = series
        .values()
        .flatten()
        .map(|(_, y)| *y)
        .fold(1.0, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{}: denied share per candidate", s.policy),
            (FONT, 20),
        )
        .margin(14)
        .x_label_area_size(34)
        .y_label_area_size(64)
        .build_cartesian_2d((lo - pad)..(hi + pad), 0f64..top)
        .map_err(err)?;
    let categorical = axis == "candidate";
    chart
        .configure_mesh()
        .x_desc(axis)
        .y_desc("denied (% of the policy's requests)")
        .x_label_formatter(&|x| {
            if categorical {
                names
                    .get(x.round() as usize)
                    .filter(|_| (x - x.round()).abs() < 1e-6)
                    .cloned()
                    .unwrap_or_default()
            } else {
                format!("{}", (x * 100.0).round() / 100.0)
            }
        })
        .label_style((FONT, 13))
        .light_line_style(RGBColor(238, 238, 238))
        .draw()
        .map_err(err)?;
    for (i, (label, mut points)) in series.into_iter().enumerate() {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let color = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 4, color.filled())),
            )
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .draw()
        .map_err(err)
}
