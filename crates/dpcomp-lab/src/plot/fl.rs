//! The federated figures (`kind = "fl"` experiment files, `dpcomp plot` on their runs): the
//! metric per round, one panel a ratio, every scheme (FL-STD in each as the reference), and
//! the metric against the cumulative upstream megabytes, without and with DP. Panels and
//! legends give the paper's r = m / n = 1 / rate (`FlSettings::paper_ratio`).

use super::{colour, drawing_error as err, render_with, Drawing, FONT};
use crate::fl_experiment::Cell;
use dpcomp::compress::chunked_dct::DctRows;
use dpcomp::compress::linear_sketch::Scheme;
use dpcomp::compress::Compressor;
use dpcomp::error::{Error, Result};
use dpcomp::fl::{FlSettings, RoundMetrics};
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// Redraws the figures of the cells under `out` (for `dpcomp plot`).
pub fn figures(cells: &[Cell], out: &Path) -> Result<Vec<PathBuf>> {
    let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let mut written = Vec::new();
    let mut datasets: Vec<String> = cells.iter().map(|c| c.dataset.clone()).collect();
    datasets.dedup();
    for dataset in &datasets {
        let mine: Vec<&Cell> = cells.iter().filter(|c| &c.dataset == dataset).collect();
        for dp in [false, true] {
            let group: Vec<&Cell> = mine
                .iter()
                .copied()
                .filter(|c| c.settings.privacy.is_some() == dp)
                .collect();
            if group.is_empty() {
                continue;
            }
            let suffix = if dp { "_dp" } else { "" };
            let figure = RoundsFigure {
                dataset,
                dp,
                cells: &group,
            };
            for ext in ["png", "svg"] {
                let path = out.join(format!("fl_{}_rounds{suffix}.{ext}", stem(dataset)));
                render_with(&path, (1350, 450), &figure)?;
                written.push(path);
            }
        }
        let figure = CostFigure {
            dataset,
            cells: &mine,
        };
        for ext in ["png", "svg"] {
            let path = out.join(format!("fl_{}_cost.{ext}", stem(dataset)));
            render_with(&path, (1200, 480), &figure)?;
            written.push(path);
        }
    }
    Ok(written)
}

fn stem(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

fn metric_of(cell: &Cell, row: &RoundMetrics) -> f64 {
    if cell.summary.auroc_at_best.is_some() {
        row.balanced_accuracy
    } else {
        row.accuracy
    }
}

fn scheme_colour(settings: &FlSettings) -> RGBColor {
    match settings.compressor() {
        Ok(Compressor::Identity) => colour(7),
        Ok(Compressor::Sketch(s)) => match s.scheme {
            Scheme::Std => colour(7),
            Scheme::Rnd => colour(0),
            Scheme::Freq => colour(1),
            Scheme::Cs if s.rows == DctRows::Random => colour(4),
            Scheme::Cs => colour(3),
        },
        _ => colour(5),
    }
}

/// The metric per round, one panel a ratio, every scheme (FL-STD in each as the reference).
struct RoundsFigure<'a> {
    dataset: &'a str,
    dp: bool,
    cells: &'a [&'a Cell],
}

impl Drawing for RoundsFigure<'_> {
    fn draw<DB: DrawingBackend>(
        &self,
        root: DrawingArea<DB, plotters::coord::Shift>,
    ) -> std::result::Result<(), String> {
        root.fill(&WHITE).map_err(err)?;
        let title = format!(
            "{}: {} per round{}",
            self.dataset,
            self.cells[0].summary.metric.replace('_', " "),
            if self.dp {
                ", client-level DP"
            } else {
                ", no DP"
            }
        );
        let root = root.titled(&title, ("sans-serif", 18)).map_err(err)?;
        let mut ratios: Vec<f64> = self
            .cells
            .iter()
            .filter(|c| c.settings.scheme() != Scheme::Std)
            .map(|c| c.settings.paper_ratio())
            .collect();
        ratios.sort_by(f64::total_cmp);
        ratios.dedup();
        if ratios.is_empty() {
            ratios.push(1.0);
        }
        let panels = root.split_evenly((1, ratios.len()));
        let max_round = self.cells.iter().map(|c| c.rounds.len()).max().unwrap_or(1) as f64;
        for (panel, &ratio) in panels.iter().zip(&ratios) {
            let mut chart = ChartBuilder::on(panel)
                .caption(format!("r = {ratio}"), ("sans-serif", 15))
                .margin(8)
                .x_label_area_size(35)
                .y_label_area_size(50)
                .build_cartesian_2d(0.0..max_round, 0.0..1.0)
                .map_err(err)?;
            chart
                .configure_mesh()
                .x_desc("round")
                .x_label_formatter(&|x| format!("{x:.0}"))
                .y_label_formatter(&|y| format!("{:.0}%", 100.0 * y))
                .label_style(("sans-serif", 11))
                .axis_desc_style(("sans-serif", 12))
                .draw()
                .map_err(err)?;
            for cell in self.cells.iter().filter(|c| {
                c.settings.scheme() == Scheme::Std
                    || (c.settings.paper_ratio() - ratio).abs() < 1e-12
            }) {
                let c = scheme_colour(&cell.settings);
                let points: Vec<(f64, f64)> = cell
                    .rounds
                    .iter()
                    .map(|r| (r.round as f64, metric_of(cell, r)))
                    .collect();
                chart
                    .draw_series(LineSeries::new(points, c.stroke_width(2)))
                    .map_err(err)?
                    .label(cell.summary.scheme.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 14, y)], c.stroke_width(2))
                    });
            }
            crate::plot::draw_legend(&mut chart, SeriesLabelPosition::LowerRight, 11)?;
        }
        root.present().map_err(err)
    }
}

/// The metric against the cumulative upstream megabytes (log), without and with DP.
struct CostFigure<'a> {
    dataset: &'a str,
    cells: &'a [&'a Cell],
}

impl Drawing for CostFigure<'_> {
    fn draw<DB: DrawingBackend>(
        &self,
        root: DrawingArea<DB, plotters::coord::Shift>,
    ) -> std::result::Result<(), String> {
        root.fill(&WHITE).map_err(err)?;
        let title = format!(
            "{}: {} against upstream traffic",
            self.dataset,
            self.cells[0].summary.metric.replace('_', " ")
        );
        let root = root.titled(&title, ("sans-serif", 18)).map_err(err)?;
        let megabytes = |r: &RoundMetrics| (r.upstream_bits_total as f64 / 8e6).max(1e-6);
        let all: Vec<f64> = self
            .cells
            .iter()
            .flat_map(|c| c.rounds.iter().map(megabytes))
            .collect();
        let lo = all.iter().copied().fold(f64::INFINITY, f64::min).max(1e-6);
        let hi = all.iter().copied().fold(0.0, f64::max).max(lo * 10.0);
        let panels = root.split_evenly((1, 2));
        for (panel, dp) in panels.iter().zip([false, true]) {
            let mine: Vec<&&Cell> = self
                .cells
                .iter()
                .filter(|c| c.settings.privacy.is_some() == dp)
                .collect();
            let mut chart = ChartBuilder::on(panel)
                .caption(
                    if dp { "client-level DP" } else { "no DP" },
                    ("sans-serif", 15),
                )
                .margin(8)
                .x_label_area_size(35)
                .y_label_area_size(50)
                .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)
                .map_err(err)?;
            chart
                .configure_mesh()
                .x_desc("upstream MB, all clients (log)")
                .x_label_formatter(&|x| format!("{x:.0e}"))
                .y_label_formatter(&|y| format!("{:.0}%", 100.0 * y))
                .label_style(("sans-serif", 11))
                .axis_desc_style(("sans-serif", 12))
                .draw()
                .map_err(err)?;
            for cell in mine {
                let c = scheme_colour(&cell.settings);
                // Thinner lines for larger ratios within a scheme.
                let width = match cell.settings.paper_ratio() {
                    r if r <= 0.05 => 3,
                    r if r <= 0.1 => 2,
                    _ => 1,
                };
                let points: Vec<(f64, f64)> = cell
                    .rounds
                    .iter()
                    .map(|r| (megabytes(r), metric_of(cell, r)))
                    .collect();
                chart
                    .draw_series(LineSeries::new(points, c.stroke_width(width)))
                    .map_err(err)?
                    .label(format!(
                        "{} r {}",
                        cell.summary.scheme,
                        cell.settings.paper_ratio()
                    ))
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 14, y)], c.stroke_width(width))
                    });
            }
            crate::plot::draw_legend(&mut chart, SeriesLabelPosition::LowerRight, 10)?;
        }
        root.present().map_err(err)
    }
}
