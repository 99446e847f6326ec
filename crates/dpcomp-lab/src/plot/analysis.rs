//! The analysis figures (PNG and SVG):
//!
//! 4. `accuracy_vs_gradient_error`: each cell's final accuracy against its gradient error (the
//!    error after compression at the last measured epoch), log x axis (the paper's Figure 3.6);
//! 5. `gradient_error_bias_variance_epoch<e>`, one per measured epoch: per noise multiplier (one panel each) and compression
//!    setting, three stacked bars — after clipping, after noise, after compression — split into
//!    bias² and variance (Figures 3.8-3.9);
//! 6. `clipping_sigma<σ>`: the clipping sweep's measured error and both models against C, log-log,
//!    with the minimisers and the median norm marked (Figures 3.10-3.11).
//!
//! Colours: the compression settings keep the colours of figures 1-3; bias² is orange and
//! variance blue, as in the paper.

use super::{colour, drawing_error as err, group_label, render_with, CellLog, Drawing, FONT};
use crate::analysis::clipping::ClippingSweep;
use crate::analysis::gradient_error::GradientErrorRecord;
use dpcomp::error::Result;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

const BIAS: RGBColor = RGBColor(255, 127, 14);
const VARIANCE: RGBColor = RGBColor(31, 119, 180);
const STAGES: [&str; 3] = ["clip", "noise", "compress"];

type DrawResult = std::result::Result<(), String>;

/// A cell with its last measurement, compression-setting index and noise-level index.
type Measured<'a> = (&'a CellLog, &'a GradientErrorRecord, usize, usize);

/// Figure 4 or 5 over the cells' measurements.
struct MeasuredFigure<'a> {
    /// true: figure 4 (scatter); false: figure 5 (bias/variance bars).
    scatter: bool,
    measured: &'a [Measured<'a>],
    settings: &'a [String],
    sigmas: &'a [f64],
    title: &'a str,
}

impl Drawing for MeasuredFigure<'_> {
    fn draw<DB: DrawingBackend>(
        &self,
        root: DrawingArea<DB, plotters::coord::Shift>,
    ) -> DrawResult {
        let draw = if self.scatter { scatter } else { bias_variance };
        draw(root, self.measured, self.settings, self.sigmas, self.title)
    }
}

struct Clipping<'a>(&'a ClippingSweep);

impl Drawing for Clipping<'_> {
    fn draw<DB: DrawingBackend>(
        &self,
        root: DrawingArea<DB, plotters::coord::Shift>,
    ) -> DrawResult {
        clipping(root, self.0)
    }
}

/// The cell's last gradient-error measurement.
fn last_record(c: &CellLog) -> Option<&GradientErrorRecord> {
    c.grad_errors.iter().max_by_key(|r| r.epoch)
}

/// Figures 4 and 5 for the cells that have gradient-error measurements; none when no cell has.
pub fn gradient_error_figures(
    cells: &[CellLog],
    settings: &[String],
    sigmas: &[f64],
    out: &Path,
    title: &str,
) -> Result<Vec<PathBuf>> {
    let index = |c: &CellLog| {
        let s = settings
            .iter()
            .position(|s| *s == super::setting_label(c))?;
        let j = sigmas.iter().position(|&x| x == super::sigma(c))?;
        Some((s, j))
    };
    let last: Vec<Measured> = cells
        .iter()
        .filter_map(|c| {
            let (s, j) = index(c)?;
            Some((c, last_record(c)?, s, j))
        })
        .collect();
    if last.is_empty() {
        return Ok(Vec::new());
    }
    let mut written = Vec::new();
    written.push(write_table(cells, out)?);
    let mut epochs: Vec<usize> = cells
        .iter()
        .flat_map(|c| c.grad_errors.iter().map(|r| r.epoch))
        .collect();
    epochs.sort_unstable();
    epochs.dedup();
    for ext in ["png", "svg"] {
        let path = out.join(format!("accuracy_vs_gradient_error.{ext}"));
        let figure = MeasuredFigure {
            scatter: true,
            measured: &last,
            settings,
            sigmas,
            title,
        };
        render_with(&path, (900, 540), &figure)?;
        written.push(path);
        for &epoch in &epochs {
            // Bars: one run per (setting, σ), the first seed's (the scatter shows every seed).
            let mut at_epoch: Vec<Measured> = Vec::new();
            for c in cells {
                let Some((s, j)) = index(c) else { continue };
                let Some(r) = c.grad_errors.iter().find(|r| r.epoch == epoch) else {
                    continue;
                };
                if !at_epoch.iter().any(|m| m.2 == s && m.3 == j) {
                    at_epoch.push((c, r, s, j));
                }
            }
            let path = out.join(format!("gradient_error_bias_variance_epoch{epoch}.{ext}"));
            let height = 60 + 280 * sigmas.len() as u32;
            let title = format!("{title}, after epoch {epoch}");
            let figure = MeasuredFigure {
                scatter: false,
                measured: &at_epoch,
                settings,
                sigmas,
                title: &title,
            };
            render_with(&path, (1000, height), &figure)?;
            written.push(path);
        }
    }
    Ok(written)
}

/// `gradient_error.csv`: every measurement of every cell, one row per stage, next to the
/// figures (the numbers behind figures 4 and 5).
fn write_table(cells: &[CellLog], out: &Path) -> Result<PathBuf> {
    let header = [
        "cell",
        "noise_multiplier",
        "compressor",
        "final_accuracy",
        "epoch",
        "stage",
        "error",
        "bias2",
        "variance",
        "median_norm",
        "mean_gradient_norm",
        "max_norm",
        "batch_size",
        "batches",
        "draws",
    ];
    let mut rows = Vec::new();
    for c in cells {
        for r in &c.grad_errors {
            for s in &r.stages {
                rows.push(vec![
                    c.name.clone(),
                    r.noise_multiplier.to_string(),
                    r.compressor.clone(),
                    c.summary.final_accuracy.to_string(),
                    r.epoch.to_string(),
                    s.stage.clone(),
                    s.error.to_string(),
                    s.bias2.to_string(),
                    s.variance.to_string(),
                    r.median_norm.to_string(),
                    r.mean_gradient_norm.to_string(),
                    r.max_norm.to_string(),
                    r.batch_size.to_string(),
                    r.batches.to_string(),
                    r.draws.to_string(),
                ]);
            }
        }
    }
    let path = out.join("gradient_error.csv");
    crate::csv_table::write(&path, &header, &rows)?;
    Ok(path)
}

fn compress_error(r: &GradientErrorRecord) -> f64 {
    r.stage("compress").map_or(f64::NAN, |s| s.error)
}

fn scatter<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    measured: &[Measured],
    settings: &[String],
    sigmas: &[f64],
    title: &str,
) -> DrawResult {
    root.fill(&WHITE).map_err(err)?;
    let errors: Vec<f64> = measured
        .iter()
        .map(|m| compress_error(m.1))
        .filter(|e| e.is_finite() && *e > 0.0)
        .collect();
    let lo = errors.iter().copied().fold(f64::INFINITY, f64::min) / 2.0;
    let hi = errors.iter().copied().fold(0.0, f64::max) * 2.0;
    let (lo, hi) = if lo.is_finite() && hi > lo {
        (lo, hi)
    } else {
        (1e-6, 1.0)
    };
    let epoch = measured.iter().map(|m| m.1.epoch).max().unwrap_or(0);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{title}: accuracy vs gradient error (epoch {epoch})"),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..100f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_label_formatter(&|x| format!("{x:.0e}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .x_desc("gradient error E||ĝ − ḡ||² after compression (squared gradient units, log)")
        .y_desc("final test accuracy (%)")
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()
        .map_err(err)?;
    for (s, label) in settings.iter().enumerate() {
        let c = colour(s);
        let points: Vec<(f64, f64, usize)> = measured
            .iter()
            .filter(|m| m.2 == s)
            .map(|m| (compress_error(m.1), 100.0 * m.0.summary.final_accuracy, m.3))
            .filter(|p| p.0.is_finite() && p.0 > 0.0)
            .collect();
        chart
            .draw_series(points.iter().map(|&(x, y, j)| marker((x, y), 6, j, c)))
            .map_err(err)?
            .label(label.clone())
            .legend(move |(x, y)| Circle::new((x + 7, y), 5, c.filled()));
    }
    for (j, s) in sigmas.iter().enumerate() {
        let grey = RGBColor(90, 90, 90);
        chart
            .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())
            .map_err(err)?
            .label(format!("σ = {s}"))
            .legend(move |(x, y)| marker((x + 7, y), 5, j, grey));
    }
    crate::plot::draw_legend(&mut chart, SeriesLabelPosition::UpperRight, 14)?;
    root.present().map_err(err)
}

/// A marker of `size` pixels at `at`: circle, triangle or cross by noise level `j`.
fn marker<DB: DrawingBackend, C: Clone + 'static>(
    at: C,
    size: i32,
    j: usize,
    c: RGBColor,
) -> DynElement<'static, DB, C> {
    match j % 3 {
        0 => Circle::new(at, size, c.filled()).into_dyn(),
        1 => TriangleMarker::new(at, size + 1, c.filled()).into_dyn(),
        _ => Cross::new(at, size, c.stroke_width(3)).into_dyn(),
    }
}

fn bias_variance<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    measured: &[Measured],
    settings: &[String],
    sigmas: &[f64],
    title: &str,
) -> DrawResult {
    root.fill(&WHITE).map_err(err)?;
    let root = root
        .titled(
            &format!("{title}: gradient error split into bias² and variance"),
            ("sans-serif", 22),
        )
        .map_err(err)?;
    let panels = root.split_evenly((sigmas.len(), 1));
    let n = settings.len();
    for (j, (panel, sigma)) in panels.iter().zip(sigmas).enumerate() {
        let in_panel: Vec<_> = measured.iter().filter(|m| m.3 == j).collect();
        let top = in_panel
            .iter()
            .flat_map(|m| m.1.stages.iter().map(|s| s.bias2.max(0.0) + s.variance))
            .fold(0.0, f64::max)
            .max(1e-12)
            * 1.1;
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!("σ = {sigma}: bars per setting = after clip | noise | compress"),
                ("sans-serif", 16),
            )
            .margin(8)
            .x_label_area_size(35)
            .y_label_area_size(80)
            .build_cartesian_2d(0f64..n as f64, 0f64..top)
            .map_err(err)?;
        let labels = settings.to_vec();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(2 * n + 1)
            .x_label_formatter(&move |x| group_label(&labels, *x))
            .y_label_formatter(&|y| format!("{y:.2e}"))
            .y_desc("squared error")
            .label_style(("sans-serif", if n > 4 { 10 } else { 13 }))
            .axis_desc_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        let width = 0.8 / 3.0;
        let mut bias_bars = Vec::new();
        let mut variance_bars = Vec::new();
        for m in &in_panel {
            for (k, stage) in STAGES.iter().enumerate() {
                let Some(s) = m.1.stage(stage).filter(|s| s.error.is_finite()) else {
                    continue; // a diverged run has no error to draw
                };
                let x0 = m.2 as f64 + 0.1 + k as f64 * width;
                let x1 = x0 + width * 0.9;
                // A bias² estimate below zero (bias far under the noise) is drawn as none.
                let bias2 = s.bias2.max(0.0);
                bias_bars.push(Rectangle::new([(x0, 0.0), (x1, bias2)], BIAS.filled()));
                variance_bars.push(Rectangle::new(
                    [(x0, bias2), (x1, bias2 + s.variance)],
                    VARIANCE.filled(),
                ));
            }
        }
        chart
            .draw_series(bias_bars)
            .map_err(err)?
            .label("bias²")
            .legend(|(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], BIAS.filled()));
        chart
            .draw_series(variance_bars)
            .map_err(err)?
            .label("variance")
            .legend(|(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], VARIANCE.filled()));
        crate::plot::draw_legend(&mut chart, SeriesLabelPosition::UpperRight, 13)?;
    }
    root.present().map_err(err)
}

/// Figure 6, one file pair per sweep (noise multiplier).
pub fn clipping_figures(sweeps: &[ClippingSweep], out: &Path) -> Result<Vec<PathBuf>> {
    let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    std::fs::create_dir_all(out).map_err(|e| dpcomp::error::Error::io(out, e))?;
    let mut written = Vec::new();
    for sweep in sweeps {
        for ext in ["png", "svg"] {
            let path = out.join(format!(
                "clipping_sigma{}.{ext}",
                sweep.model.noise_multiplier
            ));
            render_with(&path, (900, 560), &Clipping(sweep))?;
            written.push(path);
        }
    }
    Ok(written)
}

fn clipping<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    sweep: &ClippingSweep,
) -> DrawResult {
    root.fill(&WHITE).map_err(err)?;
    let xs: Vec<f64> = sweep.points.iter().map(|p| p.max_norm).collect();
    let ys: Vec<f64> = sweep
        .points
        .iter()
        .flat_map(|p| [p.measured, p.model_median, p.model_mean])
        .filter(|v| *v > 0.0 && v.is_finite())
        .collect();
    let (x_lo, x_hi) = (xs[0], xs[xs.len() - 1]);
    let y_lo = ys.iter().copied().fold(f64::INFINITY, f64::min) / 2.0;
    let y_hi = ys.iter().copied().fold(0.0, f64::max) * 2.0;
    let m = &sweep.model;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{}: gradient error vs clipping radius (σ = {}, B = {}, m = {}, epoch {})",
                sweep.task, m.noise_multiplier, m.batch_size, m.parameters, sweep.epoch
            ),
            ("sans-serif", 19),
        )
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d((x_lo..x_hi).log_scale(), (y_lo..y_hi).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_label_formatter(&|x| format!("{x:.1e}"))
        .y_label_formatter(&|y| format!("{y:.0e}"))
        .x_desc("clipping radius C (gradient norm units, log)")
        .y_desc("E||ĝ(C) − ḡ||² (log)")
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(err)?;
    // The models first, the measurement on top with a marker per radius (the mean-informed
    // model often lies right on it).
    type Curve = fn(&crate::analysis::clipping::ClippingPoint) -> f64;
    let curves: [(&str, RGBColor, Curve); 3] = [
        ("model, median norm only", colour(1), |p| p.model_median),
        ("model, median + mean-gradient norm", colour(2), |p| {
            p.model_mean
        }),
        ("measured", colour(0), |p| p.measured),
    ];
    for (label, c, value) in curves {
        let points: Vec<(f64, f64)> = sweep
            .points
            .iter()
            .map(|p| (p.max_norm, value(p)))
            .filter(|p| p.1 > 0.0)
            .collect();
        let measured = label == "measured";
        let width = if measured { 1 } else { 3 };
        chart
            .draw_series(LineSeries::new(points.clone(), c.stroke_width(width)))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(width))
            });
        if measured {
            chart
                .draw_series(
                    points
                        .iter()
                        .map(|&(x, y)| Circle::new((x, y), 3, c.filled())),
                )
                .map_err(err)?;
        }
    }
    let marks = [
        ("measured minimum", colour(0), sweep.measured_minimiser),
        ("model (median) C*", colour(1), sweep.model_median_minimiser),
        ("model (mean) C*", colour(2), sweep.model_mean_minimiser),
        ("median norm G", RGBColor(90, 90, 90), m.median_norm),
    ];
    for (label, c, x) in marks {
        chart
            .draw_series(DashedLineSeries::new(
                vec![(x, y_lo), (x, y_hi)],
                6,
                4,
                c.stroke_width(1),
            ))
            .map_err(err)?
            .label(format!("{label} = {x:.3}"))
            .legend(move |(px, py)| {
                PathElement::new(vec![(px, py), (px + 16, py)], c.stroke_width(1))
            });
    }
    crate::plot::draw_legend(&mut chart, SeriesLabelPosition::UpperLeft, 13)?;
    root.present().map_err(err)
}
