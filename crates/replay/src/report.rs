//! Writes a replay's output folder: `summary.json`, the plots as SVG and PNG, and
//! `report.html`.
