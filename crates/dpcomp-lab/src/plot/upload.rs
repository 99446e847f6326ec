//! `accuracy_vs_upload`: final test accuracy against the upload a run sent, in the paper's unit
//! (log scale), one panel per noise multiplier σ, one point per compression setting (mean over
//! its seeds, with a ± one standard deviation whisker), and the Pareto front of each panel: the
//! settings no other setting beats on both axes (as little upload, at least the accuracy).
//! The comparison of compressor families (`docs/results/compressor-families.md`) reads its
//! answer from it: which family is best at each privacy level for its upload.

use super::{
    colour, draw_legend, drawing_error, render_with, setting_label, sigma, CellLog, Drawing,
};
use dpcomp::error::Result;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// The indices of the Pareto-optimal points of `(upload, accuracy)` pairs: those that no other
/// point dominates (no more upload and no less accuracy, better in one), sorted by upload.
pub fn pareto_front(points: &[(f64, f64)]) -> Vec<usize> {
    let mut front: Vec<usize> = (0..points.len())
        .filter(|&i| {
            let (u, a) = points[i];
            !points
                .iter()
                .enumerate()
                .any(|(j, &(v, b))| j != i && v <= u && b >= a && (v < u || b > a))
        })
        .collect();
    front.sort_by(|&i, &j| points[i].0.total_cmp(&points[j].0));
    front
}

/// One setting's point in one panel: upload (the paper's Gb), mean accuracy (%), its sd.
struct Point {
    setting: usize,
    upload: f64,
    accuracy: f64,
    sd: f64,
}

struct UploadFigure<'a> {
    title: &'a str,
    settings: &'a [String],
    panels: Vec<(f64, Vec<Point>)>,
}

impl Drawing for UploadFigure<'_> {
    fn draw<DB: DrawingBackend>(
        &self,
        root: DrawingArea<DB, plotters::coord::Shift>,
    ) -> std::result::Result<(), String> {
        root.fill(&WHITE).map_err(drawing_error)?;
        let root = root
            .titled(self.title, ("sans-serif", 22))
            .map_err(drawing_error)?;
        let uploads = self
            .panels
            .iter()
            .flat_map(|(_, p)| p.iter().map(|q| q.upload));
        let (low, high) = uploads.fold((f64::INFINITY, 0f64), |(l, h), u| (l.min(u), h.max(u)));
        let (low, high) = if low.is_finite() && low > 0.0 {
            (low / 1.5, high * 1.5)
        } else {
            (0.01, 100.0)
        };
        let areas = root.split_evenly((1, self.panels.len().max(1)));
        for (k, ((s, points), area)) in self.panels.iter().zip(&areas).enumerate() {
            let mut chart = ChartBuilder::on(area)
                .caption(format!("σ = {s}"), ("sans-serif", 18))
                .margin(8)
                .x_label_area_size(45)
                .y_label_area_size(if k == 0 { 55 } else { 35 })
                .build_cartesian_2d((low..high).log_scale(), 0f64..100f64)
                .map_err(drawing_error)?;
            chart
                .configure_mesh()
                .x_labels(5)
                .x_label_formatter(&|x| format!("{x:.2}"))
                .y_label_formatter(&|y| format!("{y:.0}"))
                .x_desc("upload (paper's Gb, log)")
                .y_desc(if k == 0 { "test accuracy (%)" } else { "" })
                .label_style(("sans-serif", 13))
                .axis_desc_style(("sans-serif", 14))
                .draw()
                .map_err(drawing_error)?;
            let xy: Vec<(f64, f64)> = points.iter().map(|p| (p.upload, p.accuracy)).collect();
            let front: Vec<(f64, f64)> = pareto_front(&xy).into_iter().map(|i| xy[i]).collect();
            chart
                .draw_series(LineSeries::new(front, BLACK.stroke_width(1)))
                .map_err(drawing_error)?
                .label("Pareto front")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLACK));
            for p in points {
                let c = colour(p.setting);
                let series = chart
                    .draw_series([Circle::new((p.upload, p.accuracy), 5, c.filled())])
                    .map_err(drawing_error)?;
                if k == 0 {
                    series
                        .label(self.settings[p.setting].clone())
                        .legend(move |(x, y)| Circle::new((x + 7, y), 5, c.filled()));
                }
                if p.sd > 0.0 {
                    chart
                        .draw_series([PathElement::new(
                            vec![
                                (p.upload, (p.accuracy - p.sd).max(0.0)),
                                (p.upload, (p.accuracy + p.sd).min(100.0)),
                            ],
                            c.stroke_width(2),
                        )])
                        .map_err(drawing_error)?;
                }
            }
            if k == 0 {
                // The legend names every setting of the figure, also those without a point in
                // this panel (a family run only at some σ), so every colour can be read.
                for (i, label) in self.settings.iter().enumerate() {
                    if points.iter().any(|p| p.setting == i) {
                        continue;
                    }
                    let c = colour(i);
                    chart
                        .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())
                        .map_err(drawing_error)?
                        .label(label.clone())
                        .legend(move |(x, y)| Circle::new((x + 7, y), 5, c.filled()));
                }
                draw_legend(&mut chart, SeriesLabelPosition::LowerRight, 11)?;
            }
        }
        root.present().map_err(drawing_error)
    }
}

/// Draws `accuracy_vs_upload.{png,svg}` of `cells` into `out`; `settings` and `sigmas` in the
/// order (and so the colours) of the other figures.
pub(crate) fn upload_figures(
    cells: &[CellLog],
    settings: &[String],
    sigmas: &[f64],
    out: &Path,
    title: &str,
) -> Result<Vec<PathBuf>> {
    let panels: Vec<(f64, Vec<Point>)> = sigmas
        .iter()
        .map(|&s| {
            let points = settings
                .iter()
                .enumerate()
                .filter_map(|(i, setting)| {
                    let runs: Vec<&CellLog> = cells
                        .iter()
                        .filter(|c| sigma(c) == s && setting_label(c) == *setting)
                        .collect();
                    if runs.is_empty() {
                        return None;
                    }
                    let accuracies: Vec<f64> = runs
                        .iter()
                        .map(|c| 100.0 * c.summary.final_accuracy)
                        .collect();
                    let (accuracy, sd) = crate::results_table::mean_sd(&accuracies);
                    Some(Point {
                        setting: i,
                        upload: runs[0].summary.upstream_paper_gib,
                        accuracy,
                        sd: sd.unwrap_or(0.0),
                    })
                })
                .collect();
            (s, points)
        })
        .collect();
    let figure = UploadFigure {
        title: &format!("{title}: accuracy against upload, Pareto front per σ"),
        settings,
        panels,
    };
    let mut written = Vec::new();
    for ext in ["png", "svg"] {
        let path = out.join(format!("accuracy_vs_upload.{ext}"));
        render_with(
            &path,
            (300 + 420 * sigmas.len().max(1) as u32, 560),
            &figure,
        )?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::pareto_front;

    #[test]
    fn the_front_keeps_what_nothing_beats_on_both_axes() {
        // (upload, accuracy): 1 beats 3 (less upload, more accuracy); 2 ties 0 on upload with
        // less accuracy; 4 costs most but is best.
        let points = [
            (1.0, 50.0),
            (2.0, 60.0),
            (1.0, 40.0),
            (3.0, 55.0),
            (5.0, 70.0),
        ];
        assert_eq!(pareto_front(&points), vec![0, 1, 4]);
        assert_eq!(pareto_front(&[]), Vec::<usize>::new());
    }
}
