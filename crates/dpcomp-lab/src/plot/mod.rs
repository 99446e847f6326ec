//! `dpcomp plot runs/<experiment>/<profile>`: the paper's figures, regenerated from the run logs
//! (`summary.json`, `metrics.jsonl`, `config.toml` of every cell), as PNG and SVG.
//!
//! 1. `accuracy_by_epsilon`: final accuracy grouped by ε (one group per noise multiplier), one bar
//!    per compression setting (the paper's Figures 3.1-3.4 top);
//! 2. `accuracy_by_bandwidth`: grouped by upstream bandwidth in the paper's unit (one group per
//!    compression setting, labelled like the paper's "105.25Gb"), one bar per noise multiplier
//!    (bottom);
//!
//! Cells that differ only in their seed are drawn together: bars are the mean with a ± one
//! standard deviation whisker, curves are the per-epoch mean.
//! 3. `accuracy_per_epoch` and `accuracy_per_epoch_smoothed`: test accuracy per epoch, raw and
//!    smoothed by a mean filter over `smoothing_width(epochs)` epochs without padding at the ends
//!    (the paper's Figures B.1/B.2: width 20 over 100 epochs).
//!
//! 4. `accuracy_vs_upload`: final accuracy against upload in the paper's unit, one panel per σ,
//!    with each panel's Pareto front (`upload`).
//!
//! Colours are fixed per compression setting and per noise multiplier, so the same setting has
//! the same colour in every figure. Text uses the bundled DejaVu Sans (`assets/fonts`).

pub mod analysis;
pub mod convex;
pub mod fl;
pub mod upload;

use crate::analysis::gradient_error::{self, GradientErrorRecord};
use dpcomp::config::TrainConfig;
use dpcomp::error::{Error, Result};
use dpcomp::train::metrics::{read, Summary};
use plotters::prelude::*;
use std::path::{Path, PathBuf};

pub(crate) const FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
const SIZE: (u32, u32) = (900, 540);

/// One finished cell as the figures need it.
#[derive(Debug, Clone)]
pub struct CellLog {
    /// The cell's folder name (axis-value pairs, `grid::Cell::name`).
    pub name: String,
    /// Its `config.toml`.
    pub config: TrainConfig,
    /// Its `summary.json`.
    pub summary: Summary,
    /// Test accuracy after every epoch.
    pub accuracies: Vec<f64>,
    /// Gradient-error measurements (`grad_error.jsonl`; empty when none were taken).
    pub grad_errors: Vec<GradientErrorRecord>,
}

/// Every cell folder below `root` with a `summary.json`, sorted by (σ, compression setting).
pub fn read_cells(root: &Path) -> Result<Vec<CellLog>> {
    let mut cells = Vec::new();
    // A single run's folder is a grid of one.
    let dirs: Vec<std::path::PathBuf> = if root.join("summary.json").is_file() {
        vec![root.to_path_buf()]
    } else {
        std::fs::read_dir(root)
            .map_err(|e| Error::io(root, e))?
            .map(|entry| entry.map(|e| e.path()).map_err(|e| Error::io(root, e)))
            .collect::<Result<_>>()?
    };
    for dir in dirs {
        let summary_path = dir.join("summary.json");
        if !summary_path.is_file() {
            continue;
        }
        let text =
            std::fs::read_to_string(&summary_path).map_err(|e| Error::io(&summary_path, e))?;
        let summary: Summary = serde_json::from_str(&text)
            .map_err(|e| Error::bad_file(&summary_path, e.to_string()))?;
        let config = crate::tasks::config_from_file(&dir.join("config.toml"))?;
        let accuracies = read(&dir.join("metrics.jsonl"))?
            .iter()
            .map(|m| m.test_accuracy)
            .collect();
        cells.push(CellLog {
            name: dir
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
            config,
            summary,
            accuracies,
            grad_errors: gradient_error::read(&dir)?,
        });
    }
    if cells.is_empty() {
        return Err(Error::bad_value(
            "plot",
            format!(
                "{} has no finished runs (folders with summary.json)",
                root.display()
            ),
        ));
    }
    cells.sort_by(|a, b| {
        sigma(a)
            .total_cmp(&sigma(b))
            .then(setting_order(a).total_cmp(&setting_order(b)))
            .then(setting_label(a).cmp(&setting_label(b)))
    });
    Ok(cells)
}

pub(crate) fn sigma(c: &CellLog) -> f64 {
    c.config.privacy.noise_multiplier.unwrap_or(0.0)
}

/// Compression settings ordered from none to most: identity/rate 1 first, then rising rates;
/// PowerSGD by falling rank.
fn setting_order(c: &CellLog) -> f64 {
    use dpcomp::compress::CompressorKind as K;
    match c.config.compression.kind() {
        K::Identity => 0.0,
        K::Dgc | K::Denoise | K::FlRnd | K::FlFreq | K::FlCs => c.config.compression.rate(),
        K::Powersgd => 1e6 / c.config.compression.rank() as f64,
        // The quantisers by their bits per element against fp32's 32.
        K::Fp16 | K::Bf16 => 2.0,
        K::Natural => 32.0 / 9.0,
        K::Int8 => 4.0,
        K::Qsgd => {
            let levels = match &c.config.compression.compressor {
                dpcomp::compress::Compressor::Qsgd(q) => q.levels,
                _ => dpcomp::compress::Qsgd::default().levels,
            };
            32.0 / (1 + dpcomp::compress::qsgd::level_bits(levels)) as f64
        }
        K::Terngrad => 16.0,
        K::Signsgd | K::EfSignsgd => 32.0,
        K::Randomk => c.config.compression.rate(),
        K::Threshold => 1e5,
    }
}

/// The compression setting (with the second clipping, `clip_noised`, when there is one), and
/// the fine-tuning mode, clipping radius and learning rate when they are not the task's paper
/// defaults (the clipping experiment's C* cells are their own bars, not seeds of the C = 3 ones;
/// an ablation's learning-rate control is not the run at the paper's rate; SNLI's LoRA cells are
/// not seeds of its last-layer ones).
pub(crate) fn setting_label(c: &CellLog) -> String {
    let mut label = c
        .config
        .compression_label()
        .unwrap_or_else(|_| c.summary.compressor.clone());
    let defaults = crate::tasks::Task::from_name(&c.config.task).map(crate::tasks::paper_defaults);
    let mode = |m: &dpcomp::config::ModelSettings| m.fine_tuning_mode().ok().map(|f| f.label());
    if let Some(tuned) = mode(&c.config.model) {
        if defaults.as_ref().and_then(|d| mode(&d.model)) != Some(tuned.clone()) {
            label = format!("{tuned}, {label}");
        }
    }
    let (clip, lr) = (c.config.privacy.max_grad_norm, c.config.optimizer.lr);
    if defaults.as_ref().map(|d| d.privacy.max_grad_norm) != Some(clip) {
        label = format!("{label}, C {clip}");
    }
    if defaults.as_ref().map(|d| d.optimizer.lr) != Some(lr) {
        label = format!("{label}, lr {lr}");
    }
    label
}

/// Width of the mean filter for `epochs` epochs: the paper's 20, or a quarter of the epochs when
/// there are fewer than 80 (so that short CPU runs still show a curve), at least 1.
pub(crate) fn smoothing_width(epochs: usize) -> usize {
    if epochs >= 80 {
        20
    } else {
        (epochs / 4).max(1)
    }
}

/// Mean filter of `width` without padding: element i is the mean of values[i .. i + width].
pub(crate) fn mean_filter(values: &[f64], width: usize) -> Vec<f64> {
    if width == 0 || values.len() < width {
        return Vec::new();
    }
    values
        .windows(width)
        .map(|w| w.iter().sum::<f64>() / width as f64)
        .collect()
}

/// A fixed colour per position in a fixed ordering (compression settings, noise levels).
pub(crate) fn colour(i: usize) -> RGBColor {
    const COLOURS: [RGBColor; 12] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
        RGBColor(0, 0, 0),
        RGBColor(174, 199, 232),
    ];
    COLOURS[i % COLOURS.len()]
}

/// The tick label at x of grouped bars (group i spans [i, i + 1)): its name at the centre, none
/// elsewhere.
pub(crate) fn group_label(labels: &[String], x: f64) -> String {
    let i = x.floor();
    if (x - i - 0.5).abs() < 1e-6 && (i as usize) < labels.len() {
        labels[i as usize].clone()
    } else {
        String::new()
    }
}

fn unique<T: PartialEq + Clone>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

/// Grouped bars: `groups` (label under each group), each with one bar per series; `value(g, s)`
/// is (mean, spread) in percent, `None` for a missing cell; a positive spread (the sample
/// standard deviation over seeds) is drawn as a ± whisker.
struct Bars<'a> {
    title: &'a str,
    x_desc: &'a str,
    groups: &'a [String],
    series: &'a [(String, RGBColor)],
    value: &'a dyn Fn(usize, usize) -> Option<(f64, f64)>,
}

/// A named, coloured line of (epoch, accuracy %) points.
type Line = (String, RGBColor, Vec<(f64, f64)>);

/// Lines of (epoch, accuracy %) per series.
struct Lines<'a> {
    title: &'a str,
    series: &'a [Line],
    epochs: usize,
}

enum Figure<'a> {
    Bars(Bars<'a>),
    Lines(Lines<'a>),
}

/// Something that draws itself on any plotters backend.
/// A plotters error as the message a figure's drawing returns.
pub(crate) fn drawing_error<E: std::fmt::Debug>(e: E) -> String {
    format!("{e:?}")
}

/// The legend every figure draws: a framed, slightly transparent white box at `position`.
pub(crate) fn draw_legend<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
    font_size: u32,
) -> std::result::Result<(), String> {
    chart
        .configure_series_labels()
        .position(position)
        .label_font(("sans-serif", font_size))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(drawing_error)
}

pub(crate) trait Drawing {
    fn draw<DB: DrawingBackend>(
        &self,
        root: DrawingArea<DB, plotters::coord::Shift>,
    ) -> std::result::Result<(), String>;
}

impl Drawing for Figure<'_> {
    fn draw<DB: DrawingBackend>(
        &self,
        root: DrawingArea<DB, plotters::coord::Shift>,
    ) -> std::result::Result<(), String> {
        draw(root, self)
    }
}

/// Draws `figure` to `path` at `size` pixels: SVG for `.svg`, PNG otherwise.
pub(crate) fn render_with(path: &Path, size: (u32, u32), figure: &impl Drawing) -> Result<()> {
    let result = if path.extension().is_some_and(|e| e == "svg") {
        figure.draw(SVGBackend::new(path, size).into_drawing_area())
    } else {
        figure.draw(BitMapBackend::new(path, size).into_drawing_area())
    };
    result.map_err(|e| Error::bad_file(path, format!("drawing the figure: {e}")))
}

fn render(path: &Path, figure: &Figure) -> Result<()> {
    render_with(path, figure_size(figure), figure)
}

/// Pixels a figure needs: `SIZE`, widened for a long title, and for grouped bars whose labels
/// do not fit side by side (they are then drawn upright, `bar_label_area`) made taller by them.
fn figure_size(figure: &Figure) -> (u32, u32) {
    let title = match figure {
        Figure::Bars(f) => f.title,
        Figure::Lines(f) => f.title,
    };
    // About 10 pixels a character at the title's 22-pixel font.
    let width = SIZE.0.max(10 * title.chars().count() as u32 + 40);
    let (width, height) = match figure {
        Figure::Bars(f) => (
            width,
            SIZE.1 + bar_label_area(f, width).1.saturating_sub(45),
        ),
        Figure::Lines(f) => {
            let rows = SIDE_LEGEND_ROW as u32 * f.series.len() as u32 + 80;
            match side_legend_width(f) {
                0 => (width, SIZE.1),
                legend => (width.max(SIZE.0 + legend), SIZE.1.max(rows)),
            }
        }
    };
    (width, height)
}

/// Pixels between the rows of a side legend.
const SIDE_LEGEND_ROW: i32 = 15;

/// Width of the legend column beside a lines figure of more than 8 lines (0: the legend fits
/// inside the chart).
fn side_legend_width(f: &Lines) -> u32 {
    if f.series.len() <= 8 {
        return 0;
    }
    // About 6.5 pixels a character at the legend's 12-pixel font.
    let widest = f
        .series
        .iter()
        .map(|(l, ..)| l.chars().count())
        .max()
        .unwrap_or(0) as u32;
    widest * 13 / 2 + 40
}

/// Whether the group labels of `f` are drawn upright (they would overlap side by side on a
/// figure `width` pixels wide), and the height of the label area under the axis.
fn bar_label_area(f: &Bars, width: u32) -> (bool, u32) {
    // About 8 pixels a character at the labels' 15-pixel font.
    let widest = f
        .groups
        .iter()
        .map(|g| g.chars().count())
        .max()
        .unwrap_or(0) as u32;
    let per_group = (width.saturating_sub(100)) / (f.groups.len().max(1) as u32);
    if 8 * widest + 10 <= per_group {
        (false, 45)
    } else {
        (true, 8 * widest + 20)
    }
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    figure: &Figure,
) -> std::result::Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| format!("{e:?}");
    root.fill(&WHITE).map_err(e)?;
    match figure {
        Figure::Bars(f) => {
            let n = f.groups.len();
            let (upright, label_area) = bar_label_area(f, root.dim_in_pixel().0);
            let mut chart = ChartBuilder::on(&root)
                .caption(f.title, ("sans-serif", 22))
                .margin(12)
                .x_label_area_size(label_area)
                .y_label_area_size(60)
                .build_cartesian_2d(0f64..n as f64, 0f64..100f64)
                .map_err(e)?;
            // Upright labels are drawn below (plotters centres a rotated label on its tick).
            let labels = if upright {
                vec![String::new(); n]
            } else {
                f.groups.to_vec()
            };
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(2 * n + 1)
                .x_label_formatter(&move |x| group_label(&labels, *x))
                .y_label_formatter(&|y| format!("{y:.0}"))
                .x_desc(f.x_desc)
                .y_desc("test accuracy (%)")
                .label_style(("sans-serif", 15))
                .axis_desc_style(("sans-serif", 17))
                .draw()
                .map_err(e)?;
            if upright {
                let style = ("sans-serif", 15)
                    .into_font()
                    .transform(FontTransform::Rotate90)
                    .color(&BLACK)
                    .pos(plotters::style::text_anchor::Pos::new(
                        plotters::style::text_anchor::HPos::Left,
                        plotters::style::text_anchor::VPos::Center,
                    ));
                for (g, label) in f.groups.iter().enumerate() {
                    let (x, y) = chart.backend_coord(&(g as f64 + 0.5, 0.0));
                    root.draw(&Text::new(label.clone(), (x, y + 8), style.clone()))
                        .map_err(e)?;
                }
            }
            let width = 0.8 / f.series.len() as f64;
            for (s, (label, colour)) in f.series.iter().enumerate() {
                let colour = *colour;
                let x0 = |g: usize| g as f64 + 0.1 + s as f64 * width;
                let bars: Vec<Rectangle<(f64, f64)>> = (0..n)
                    .filter_map(|g| {
                        (f.value)(g, s).map(|(v, _)| {
                            Rectangle::new(
                                [(x0(g), 0.0), (x0(g) + width * 0.92, v)],
                                colour.filled(),
                            )
                        })
                    })
                    .collect();
                chart
                    .draw_series(bars)
                    .map_err(e)?
                    .label(label.clone())
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 6), (x + 14, y + 6)], colour.filled())
                    });
                let whiskers: Vec<PathElement<(f64, f64)>> = (0..n)
                    .filter_map(|g| {
                        (f.value)(g, s).filter(|(_, sd)| *sd > 0.0).map(|(v, sd)| {
                            let x = x0(g) + width * 0.46;
                            PathElement::new(
                                vec![(x, (v - sd).max(0.0)), (x, (v + sd).min(100.0))],
                                BLACK.stroke_width(2),
                            )
                        })
                    })
                    .collect();
                chart.draw_series(whiskers).map_err(e)?;
            }
            draw_legend(&mut chart, SeriesLabelPosition::UpperRight, 15)?;
        }
        Figure::Lines(f) => {
            // More than 8 lines: the legend gets a column of its own on the right (inside the
            // chart it would cover the lines); otherwise it sits in the chart's lower right.
            let legend_width = side_legend_width(f);
            let (chart_area, legend_area) = if legend_width > 0 {
                let area = root.titled(f.title, ("sans-serif", 22)).map_err(e)?;
                let (left, right) = area.split_horizontally(area.dim_in_pixel().0 - legend_width);
                (left, Some(right))
            } else {
                (root.clone(), None)
            };
            let mut builder = ChartBuilder::on(&chart_area);
            if legend_area.is_none() {
                builder.caption(f.title, ("sans-serif", 22));
            }
            let mut chart = builder
                .margin(12)
                .x_label_area_size(45)
                .y_label_area_size(60)
                .build_cartesian_2d(1f64..f.epochs.max(2) as f64, 0f64..100f64)
                .map_err(e)?;
            chart
                .configure_mesh()
                .x_label_formatter(&|x| format!("{x:.0}"))
                .y_label_formatter(&|y| format!("{y:.0}"))
                .x_desc("epoch")
                .y_desc("test accuracy (%)")
                .label_style(("sans-serif", 15))
                .axis_desc_style(("sans-serif", 17))
                .draw()
                .map_err(e)?;
            for (i, (label, colour, points)) in f.series.iter().enumerate() {
                let colour = *colour;
                let series = chart
                    .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))
                    .map_err(e)?;
                let Some(column) = &legend_area else {
                    series.label(label.clone()).legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 16, y)], colour.stroke_width(2))
                    });
                    continue;
                };
                let y = 14 + SIDE_LEGEND_ROW * i as i32;
                column
                    .draw(&PathElement::new(
                        vec![(4, y), (22, y)],
                        colour.stroke_width(2),
                    ))
                    .map_err(e)?;
                let font = ("sans-serif", 12).into_font().color(&BLACK);
                column
                    .draw(&Text::new(label.clone(), (28, y - 7), font))
                    .map_err(e)?;
            }
            if legend_area.is_none() {
                draw_legend(&mut chart, SeriesLabelPosition::LowerRight, 13)?;
            }
        }
    }
    root.present().map_err(e)?;
    Ok(())
}

/// Draws every figure of the cells below `root` into `out` (PNG and SVG); returns the files.
pub fn plot(root: &Path, out: &Path, title: &str) -> Result<Vec<PathBuf>> {
    plot_beside(root, &[], out, title)
}

/// `plot` of `root`'s cells together with the cells of the grids in `beside`: an ablation's
/// arms drawn next to the grid they vary (the compression paper's groups with and without
/// error feedback, `dpcomp plot runs/surnames_ablation/full --beside runs/surnames_dgc/full`).
/// Cells are told apart by their compression setting, so the arms must differ in it.
pub fn plot_beside(
    root: &Path,
    beside: &[PathBuf],
    out: &Path,
    title: &str,
) -> Result<Vec<PathBuf>> {
    let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let mut cells = read_cells(root)?;
    for other in beside {
        cells.extend(read_cells(other)?);
    }
    cells.sort_by(|a, b| {
        sigma(a)
            .total_cmp(&sigma(b))
            .then(setting_order(a).total_cmp(&setting_order(b)))
            .then(setting_label(a).cmp(&setting_label(b)))
    });
    let sigmas = unique(cells.iter().map(sigma).map(f64::to_bits));
    let sigmas: Vec<f64> = sigmas.into_iter().map(f64::from_bits).collect();
    let settings = unique(cells.iter().map(setting_label));
    // Cells that differ only in their seed are one bar (mean ± sd) and one curve (mean).
    let matching = |g_sigma: f64, setting: &str| -> Vec<&CellLog> {
        cells
            .iter()
            .filter(|c| sigma(c) == g_sigma && setting_label(c) == setting)
            .collect()
    };
    let accuracy = |g_sigma: f64, setting: &str| -> Option<(f64, f64)> {
        let found = matching(g_sigma, setting);
        if found.is_empty() {
            return None;
        }
        let values: Vec<f64> = found.iter().map(|c| c.summary.final_accuracy).collect();
        let (mean, sd) = crate::results_table::mean_sd(&values);
        Some((100.0 * mean, 100.0 * sd.unwrap_or(0.0)))
    };
    let setting_colours: Vec<(String, RGBColor)> = settings
        .iter()
        .enumerate()
        .map(|(i, s)| (s.clone(), colour(i)))
        .collect();
    let sigma_colours: Vec<(String, RGBColor)> = sigmas
        .iter()
        .enumerate()
        .map(|(i, s)| (format!("σ = {s}"), colour(4 + i)))
        .collect();
    let epsilon_label = |s: f64| {
        let eps = cells
            .iter()
            .find(|c| sigma(c) == s)
            .and_then(|c| c.summary.epsilon)
            .filter(|e| e.is_finite());
        match eps {
            Some(e) => format!("ε = {e:.2} (σ = {s})"),
            None => format!("ε = ∞ (σ = {s})"),
        }
    };
    // Groups named as the paper names them: "bandwidth = 105.25Gb", in its unit (64 bits per
    // sent element / 8 / 2^30); the exact wire gigabits are in results.md.
    let bandwidth_label = |setting: &str| {
        let gib = cells
            .iter()
            .find(|c| setting_label(c) == setting)
            .map_or(f64::NAN, |c| c.summary.upstream_paper_gib);
        // Two decimals as the paper prints them; more for the cut-down cpu profiles' tiny groups.
        if gib >= 0.1 {
            format!("{gib:.2} Gb: {setting}")
        } else {
            format!("{gib:.4} Gb: {setting}")
        }
    };
    let seeds = cells.len() / (sigmas.len() * settings.len()).max(1);
    let seeds_note = if seeds > 1 {
        format!(" (mean ± sd of {seeds} seeds)")
    } else {
        String::new()
    };
    let mut written = Vec::new();
    for ext in ["png", "svg"] {
        let path = out.join(format!("accuracy_by_epsilon.{ext}"));
        let groups: Vec<String> = sigmas.iter().map(|&s| epsilon_label(s)).collect();
        render(
            &path,
            &Figure::Bars(Bars {
                title: &format!("{title}: accuracy by privacy budget{seeds_note}"),
                x_desc: "privacy budget ε (δ of the task), grouped by noise multiplier σ",
                groups: &groups,
                series: &setting_colours,
                value: &|g, s| accuracy(sigmas[g], &settings[s]),
            }),
        )?;
        written.push(path);

        let path = out.join(format!("accuracy_by_bandwidth.{ext}"));
        let groups: Vec<String> = settings.iter().map(|s| bandwidth_label(s)).collect();
        render(
            &path,
            &Figure::Bars(Bars {
                title: &format!("{title}: accuracy by upstream bandwidth{seeds_note}"),
                x_desc: "upstream per worker over the run in the paper's Gb (64 bits per sent element / 8 / 2^30)",
                groups: &groups,
                series: &sigma_colours,
                value: &|g, s| accuracy(sigmas[s], &settings[g]),
            }),
        )?;
        written.push(path);

        let epochs = cells.iter().map(|c| c.accuracies.len()).max().unwrap_or(1);
        let width = smoothing_width(epochs);
        for smoothed in [false, true] {
            // One curve per (setting, σ): the per-epoch mean over its seeds.
            let mut curves: Vec<(&CellLog, Vec<f64>)> = Vec::new();
            for c in &cells {
                if curves
                    .iter()
                    .any(|(k, _)| sigma(k) == sigma(c) && setting_label(k) == setting_label(c))
                {
                    continue;
                }
                let runs = matching(sigma(c), &setting_label(c));
                let len = runs.iter().map(|r| r.accuracies.len()).min().unwrap_or(0);
                let mean = (0..len)
                    .map(|e| runs.iter().map(|r| r.accuracies[e]).sum::<f64>() / runs.len() as f64)
                    .collect();
                curves.push((c, mean));
            }
            let series: Vec<Line> = curves
                .iter()
                .map(|(c, accuracies)| {
                    let c = *c;
                    let i = settings
                        .iter()
                        .position(|s| *s == setting_label(c))
                        .unwrap_or(0);
                    let j = sigmas.iter().position(|&s| s == sigma(c)).unwrap_or(0);
                    // Hue by compression setting, lighter for more noise.
                    let base = colour(i);
                    let mix = 1.0 - 0.3 * j as f64;
                    let colour = RGBColor(
                        (base.0 as f64 * mix + 255.0 * (1.0 - mix)) as u8,
                        (base.1 as f64 * mix + 255.0 * (1.0 - mix)) as u8,
                        (base.2 as f64 * mix + 255.0 * (1.0 - mix)) as u8,
                    );
                    let values = if smoothed {
                        mean_filter(accuracies, width)
                    } else {
                        accuracies.clone()
                    };
                    // A smoothed point is placed at the centre of its window.
                    let offset = if smoothed {
                        (width as f64 - 1.0) / 2.0
                    } else {
                        0.0
                    };
                    let points = values
                        .iter()
                        .enumerate()
                        .map(|(e, a)| (e as f64 + 1.0 + offset, 100.0 * a))
                        .collect();
                    (
                        format!("{}, σ = {}", setting_label(c), sigma(c)),
                        colour,
                        points,
                    )
                })
                .collect();
            let (name, what) = if smoothed {
                (
                    "accuracy_per_epoch_smoothed",
                    format!("mean filter of {width} epochs"),
                )
            } else {
                ("accuracy_per_epoch", "raw".to_string())
            };
            let path = out.join(format!("{name}.{ext}"));
            render(
                &path,
                &Figure::Lines(Lines {
                    title: &format!("{title}: test accuracy per epoch ({what}){seeds_note}"),
                    series: &series,
                    epochs,
                }),
            )?;
            written.push(path);
        }
    }
    written.extend(upload::upload_figures(
        &cells, &settings, &sigmas, out, title,
    )?);
    written.extend(analysis::gradient_error_figures(
        &cells, &settings, &sigmas, out, title,
    )?);
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_name_a_learning_rate_or_radius_off_the_papers() {
        // The committed CIFAR-10 ablation: its learning-rate control runs at η' = 0.0199, the
        // other arms at the paper's 0.1 and C 5.
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../experiments/runs/cifar10_ablation/full");
        let cells = read_cells(&root).unwrap();
        let labels: Vec<String> = cells.iter().map(setting_label).collect();
        let control: Vec<&String> = labels.iter().filter(|l| l.contains("lr")).collect();
        assert_eq!(control, [&"identity, lr 0.0199".to_string()], "{labels:?}");
        assert!(labels.iter().all(|l| !l.contains(", C ")), "{labels:?}");
        assert!(labels.len() >= 6, "{labels:?}");
    }

    #[test]
    fn mean_filter_has_no_padding() {
        assert_eq!(mean_filter(&[1.0, 2.0, 3.0, 4.0], 2), vec![1.5, 2.5, 3.5]);
        assert_eq!(mean_filter(&[1.0, 2.0], 3), Vec::<f64>::new());
        assert_eq!(smoothing_width(100), 20);
        assert_eq!(smoothing_width(15), 3);
        assert_eq!(smoothing_width(2), 1);
    }

    #[test]
    fn long_labels_stand_upright_and_many_lines_get_a_legend_column() {
        let value = |_: usize, _: usize| None;
        let series = [("σ = 0".to_string(), RED)];
        let bars = |groups: &'static [&'static str]| -> (bool, u32, (u32, u32)) {
            let groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
            let f = Bars {
                title: "t",
                x_desc: "",
                groups: &groups,
                series: &series,
                value: &value,
            };
            let (upright, area) = bar_label_area(&f, SIZE.0);
            (upright, area, figure_size(&Figure::Bars(f)))
        };
        // Three short labels fit side by side: flat, the standard size.
        assert_eq!(bars(&["x1", "x16", "x256"]), (false, 45, SIZE));
        // Ten 60-character labels do not: upright, the figure taller by the longest.
        const LONG: &str = "44.15 Gb: dgc x256 (budget=elements, error_feedback=false) 0";
        let (upright, area, size) = bars(&[LONG; 10]);
        assert_eq!((upright, area), (true, 8 * 60 + 20));
        assert_eq!(size, (SIZE.0, SIZE.1 + 8 * 60 + 20 - 45));

        let lines = |n: usize| -> Vec<Line> {
            (0..n)
                .map(|i| (format!("line {i}"), RED, vec![(1.0, 1.0)]))
                .collect()
        };
        let (few, many) = (lines(8), lines(9));
        // A title longer than the figure widens it.
        let title = "y".repeat(120);
        let long_title = Lines {
            title: &title,
            series: &few,
            epochs: 2,
        };
        assert_eq!(side_legend_width(&long_title), 0);
        assert_eq!(
            figure_size(&Figure::Lines(long_title)),
            (10 * 120 + 40, SIZE.1)
        );
        // More than 8 lines: a legend column beside the chart.
        let crowded = Lines {
            title: "t",
            series: &many,
            epochs: 2,
        };
        let width = side_legend_width(&crowded);
        assert_eq!(width, 6 * 13 / 2 + 40);
        assert_eq!(
            figure_size(&Figure::Lines(crowded)),
            (SIZE.0 + width, SIZE.1)
        );
    }
}
