//! The convex figures (`kind = "convex"` experiment files, `dpcomp plot` on their runs): per
//! data set, excess empirical risk and test accuracy against ε for every algorithm and loss.

use super::{colour, render_with, Drawing, FONT};
use crate::convex::experiment::Row;
use crate::convex::Algorithm;
use dpcomp::error::{Error, Result};
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// One figure per data set: columns = losses; top row excess empirical risk (log), bottom row
/// test accuracy; a line per algorithm against ε (log), error bars ± one standard deviation,
/// non-private SGD as a dashed level.
struct ConvexFigure<'a> {
    data: &'a str,
    losses: &'a [String],
    rows: Vec<&'a Row>,
}

impl Drawing for ConvexFigure<'_> {
    fn draw<DB: DrawingBackend>(
        &self,
        root: DrawingArea<DB, plotters::coord::Shift>,
    ) -> std::result::Result<(), String> {
        let err = |e: DrawingAreaErrorKind<DB::ErrorType>| format!("{e:?}");
        root.fill(&WHITE).map_err(err)?;
        let root = root
            .titled(
                &format!(
                    "{}: DP-SGD for convex losses, mean ± sd over seeds",
                    self.data
                ),
                ("sans-serif", 20),
            )
            .map_err(err)?;
        let panels = root.split_evenly((2, self.losses.len()));
        let epsilons: Vec<f64> = self.rows.iter().filter_map(|r| r.epsilon).collect();
        let (e_lo, e_hi) = (
            epsilons.iter().copied().fold(f64::INFINITY, f64::min) / 1.5,
            epsilons.iter().copied().fold(0.0, f64::max) * 1.5,
        );
        for (j, loss) in self.losses.iter().enumerate() {
            let mine: Vec<&&Row> = self
                .rows
                .iter()
                .filter(|r| &r.loss == loss && r.infeasible.is_none())
                .collect();
            for (top, panel) in [(true, &panels[j]), (false, &panels[self.losses.len() + j])] {
                let value = |r: &Row| if top { r.excess_risk } else { r.test_accuracy };
                // Both rows on log axes (one chart type); accuracies span a narrow range.
                let (y_lo, y_hi) = if top {
                    let hi = mine
                        .iter()
                        .map(|r| value(r).0 + value(r).1)
                        .fold(0.0, f64::max)
                        .max(1e-3)
                        * 1.3;
                    let lo = mine
                        .iter()
                        .map(|r| value(r).0)
                        .filter(|v| *v > 0.0)
                        .fold(f64::INFINITY, f64::min)
                        .min(hi / 10.0)
                        / 2.0;
                    (lo, hi)
                } else {
                    let lo = mine
                        .iter()
                        .map(|r| value(r).0 - value(r).1)
                        .fold(1.0, f64::min)
                        .max(0.05)
                        * 0.9;
                    (lo, 1.0)
                };
                let caption = if top {
                    format!("{loss}: excess empirical risk")
                } else {
                    format!("{loss}: test accuracy")
                };
                let mut chart = ChartBuilder::on(panel)
                    .caption(caption, ("sans-serif", 15))
                    .margin(8)
                    .x_label_area_size(35)
                    .y_label_area_size(55)
                    .build_cartesian_2d(
                        (e_lo..e_hi).log_scale(),
                        (y_lo..y_hi)
                            .log_scale()
                            .with_key_points(ticks(y_lo, y_hi, top)),
                    )
                    .map_err(err)?;
                chart
                    .configure_mesh()
                    .x_desc("privacy budget ε (log)")
                    .x_label_formatter(&|x| format!("{x}"))
                    .y_label_formatter(&|y| {
                        if top {
                            format!("{y:.0e}")
                        } else {
                            format!("{:.0}%", 100.0 * y)
                        }
                    })
                    .label_style(("sans-serif", 11))
                    .axis_desc_style(("sans-serif", 12))
                    .draw()
                    .map_err(err)?;
                for (k, algorithm) in [
                    Algorithm::Output,
                    Algorithm::Gradient,
                    Algorithm::Nonprivate,
                ]
                .into_iter()
                .enumerate()
                {
                    let c = colour(k);
                    let series: Vec<&&&Row> =
                        mine.iter().filter(|r| r.algorithm == algorithm).collect();
                    if series.is_empty() {
                        continue;
                    }
                    let label = format!("{algorithm:?}").to_lowercase();
                    if algorithm == Algorithm::Nonprivate {
                        let level = value(series[0]).0.max(y_lo);
                        chart
                            .draw_series(DashedLineSeries::new(
                                vec![(e_lo, level), (e_hi, level)],
                                6,
                                4,
                                c.stroke_width(2),
                            ))
                            .map_err(err)?
                            .label(label)
                            .legend(move |(x, y)| {
                                PathElement::new(vec![(x, y), (x + 14, y)], c.stroke_width(2))
                            });
                        continue;
                    }
                    let points: Vec<(f64, f64)> = series
                        .iter()
                        .map(|r| (r.epsilon.unwrap_or(1.0), value(r).0.max(y_lo)))
                        .collect();
                    chart
                        .draw_series(LineSeries::new(points.clone(), c.stroke_width(2)))
                        .map_err(err)?
                        .label(label)
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 14, y)], c.stroke_width(2))
                        });
                    chart
                        // Error bars: ± one standard deviation.
                        .draw_series(series.iter().map(|r| {
                            let (m, sd) = value(r);
                            let x = r.epsilon.unwrap_or(1.0);
                            PathElement::new(
                                vec![(x, (m - sd).max(y_lo)), (x, (m + sd).max(y_lo))],
                                c.stroke_width(2),
                            )
                        }))
                        .map_err(err)?;
                }
                if j == 0 {
                    crate::plot::draw_legend(&mut chart, SeriesLabelPosition::LowerLeft, 11)?;
                }
            }
        }
        root.present().map_err(err)
    }
}

/// Tick positions on a log axis: 1, 2, 5 x 10^k within [lo, hi] for the risk, every 10% for
/// the accuracy (whose range is under a decade, where plotters would label only 100%).
fn ticks(lo: f64, hi: f64, risk: bool) -> Vec<f64> {
    if !risk {
        return (1..=10)
            .map(|k| k as f64 / 10.0)
            .filter(|t| *t >= lo && *t <= hi)
            .collect();
    }
    let mut ticks = Vec::new();
    let mut decade = 10f64.powf(lo.log10().floor());
    while decade <= hi {
        for m in [1.0, 2.0, 5.0] {
            let t = m * decade;
            if t >= lo && t <= hi {
                ticks.push(t);
            }
        }
        decade *= 10.0;
    }
    ticks
}

/// One figure per data set of `rows`, in the order the data first appear.
pub fn figures_of(rows: &[Row], out: &Path) -> Result<Vec<PathBuf>> {
    let mut data: Vec<String> = Vec::new();
    let mut losses: Vec<String> = Vec::new();
    for r in rows {
        if !data.contains(&r.data) {
            data.push(r.data.clone());
        }
        if !losses.contains(&r.loss) {
            losses.push(r.loss.clone());
        }
    }
    draw_figures(&data, &losses, rows, out)
}

/// One figure per data set of `data_sets`, columns `losses`.
pub fn draw_figures(
    data_sets: &[String],
    losses: &[String],
    rows: &[Row],
    out: &Path,
) -> Result<Vec<PathBuf>> {
    let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let mut written = Vec::new();
    for data in data_sets {
        let figure = ConvexFigure {
            data,
            losses,
            rows: rows.iter().filter(|r| &r.data == data).collect(),
        };
        let stem: String = data
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        for ext in ["png", "svg"] {
            let path = out.join(format!("convex_{stem}.{ext}"));
            render_with(&path, (1200, 720), &figure)?;
            written.push(path);
        }
    }
    Ok(written)
}
