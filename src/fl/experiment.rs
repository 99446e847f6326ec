//! The FL-CS experiment (`experiments/fl_cs.toml`, `kind = "fl"`, run by `dpcomp grid`): every
//! dataset × scheme × ratio, without and with client-level DP, as the paper's Tables III-VI: the
//! best accuracy (balanced accuracy and AUROC for the two-class table) over the rounds, the round
//! it was reached, the cost r n 32 Round C, and S and σ of the private runs. Figures: the metric
//! per round for every scheme (one panel a ratio) and the metric against the upstream bits.
//!
//! Runs go to `<out>/<dataset>/<scheme>-r<ratio>[-dp]/` (`config.json`, `metrics.jsonl`,
//! `summary.json`); a cell whose summary exists with the same settings is not run again.

use super::data::{FlData, FlDataset};
use super::{default_clip, read_rows, FlPrivacy, FlSettings, FlSummary, RoundMetrics};
use crate::compress::chunked_dct::DctRows;
use crate::compress::linear_sketch::Scheme;
use crate::config::AccountantKind;
use crate::data::partition::Partition;
use crate::error::{Error, Result};
use crate::plot::{colour, drawing_error as err, render_with, Drawing, FONT};
use plotters::prelude::*;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlExperiment {
    pub name: String,
    /// Always "fl" (what routes the file here).
    pub kind: String,
    #[serde(default)]
    pub description: String,
    pub datasets: Vec<DatasetSettings>,
    pub grid: Grid,
    pub profiles: BTreeMap<String, Profile>,
}

/// One dataset's federated settings (the flags of `dpcomp fl`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetSettings {
    pub dataset: FlDataset,
    pub clients: usize,
    pub fraction: f64,
    pub local_steps: usize,
    pub local_batch: usize,
    pub local_lr: f64,
    pub rounds: usize,
    #[serde(default)]
    pub patience: usize,
    #[serde(default = "iid")]
    pub partition: String,
    /// S₁: the clip radius of a whole update; messages are clipped to `default_clip(S₁, r)`.
    pub full_clip: f64,
    #[serde(default)]
    pub eval_examples: usize,
    #[serde(default = "one")]
    pub server_lr: f64,
    #[serde(default)]
    pub server_momentum: f64,
}

fn iid() -> String {
    "iid".into()
}

fn one() -> f64 {
    1.0
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grid {
    pub schemes: Vec<Scheme>,
    /// Ratios of the compressed schemes (FL-STD runs once, at r = 1).
    pub ratios: Vec<f64>,
    pub dp: Vec<bool>,
    pub target_epsilon: f64,
    pub delta: f64,
    #[serde(default)]
    pub accountant: AccountantKind,
    pub lambda: f64,
    pub owlqn_iterations: usize,
    /// DCT rows of FL-CS: the paper's first ones, random ones, or both (FL-CS runs once each).
    #[serde(default = "first_rows")]
    pub rows: Vec<DctRows>,
    #[serde(default)]
    pub seed: u64,
}

fn first_rows() -> Vec<DctRows> {
    vec![DctRows::First]
}

/// Per-dataset overrides of a profile (a shorter CPU run).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Override {
    pub rounds: Option<usize>,
    pub eval_examples: Option<usize>,
    pub clients: Option<usize>,
    pub fraction: Option<f64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Profile {
    /// Keyed by dataset name (`fashion-mnist`, `breast_cancer`).
    #[serde(flatten)]
    pub datasets: BTreeMap<String, Override>,
}

impl FlExperiment {
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let e: FlExperiment =
            toml::from_str(&text).map_err(|e| Error::bad_file(path, e.to_string()))?;
        if e.kind != "fl" {
            return Err(Error::bad_file(path, "kind: expected \"fl\""));
        }
        for name in e.profiles.values().flat_map(|p| p.datasets.keys()) {
            if !e.datasets.iter().any(|d| d.dataset.name() == name) {
                return Err(Error::bad_file(
                    path,
                    format!("profile override for {name:?}, which is not in [[datasets]]"),
                ));
            }
        }
        Ok(e)
    }

    /// Every cell of `profile`: (dataset folder, cell name, settings), σ calibrated per dataset.
    pub fn cells(&self, profile: &str) -> Result<Vec<(String, String, FlSettings)>> {
        let profile = self.profiles.get(profile).ok_or_else(|| {
            crate::grid::unknown_profile(&self.name, profile, self.profiles.keys())
        })?;
        let mut cells = Vec::new();
        for d in &self.datasets {
            let o = profile
                .datasets
                .get(d.dataset.name())
                .cloned()
                .unwrap_or_default();
            let mut base = FlSettings::defaults(d.dataset);
            base.clients = o.clients.unwrap_or(d.clients);
            base.fraction = o.fraction.unwrap_or(d.fraction);
            base.local.steps = d.local_steps;
            base.local.batch = d.local_batch;
            base.local.learning_rate = d.local_lr;
            base.rounds = o.rounds.unwrap_or(d.rounds);
            base.patience = d.patience;
            base.partition = Partition::parse(&d.partition)?;
            base.eval_examples = o.eval_examples.unwrap_or(d.eval_examples);
            base.server_learning_rate = d.server_lr;
            base.server_momentum = d.server_momentum;
            base.lambda = self.grid.lambda;
            base.owlqn_iterations = self.grid.owlqn_iterations;
            base.seed = self.grid.seed;
            let sigma = if self.grid.dp.contains(&true) {
                crate::privacy::calibrate::noise_multiplier_for(
                    self.grid.accountant,
                    self.grid.target_epsilon,
                    base.fraction,
                    base.rounds as u64,
                    self.grid.delta,
                )?
            } else {
                0.0
            };
            for &dp in &self.grid.dp {
                for &scheme in &self.grid.schemes {
                    let ratios = if scheme == Scheme::Std {
                        vec![1.0]
                    } else {
                        self.grid.ratios.clone()
                    };
                    let rows = if scheme == Scheme::Cs {
                        self.grid.rows.clone()
                    } else {
                        vec![DctRows::First]
                    };
                    for &row_choice in &rows {
                        for &ratio in &ratios {
                            let mut s = base.clone();
                            s.scheme = scheme;
                            s.ratio = ratio;
                            s.rows = row_choice;
                            s.privacy = dp.then(|| FlPrivacy {
                                clip: default_clip(d.full_clip, scheme, ratio),
                                noise_multiplier: sigma,
                                delta: self.grid.delta,
                                accountant: self.grid.accountant,
                            });
                            let name = format!(
                                "{}{}-r{ratio}{}",
                                format!("{scheme:?}").to_lowercase(),
                                if row_choice == DctRows::Random {
                                    "-random"
                                } else {
                                    ""
                                },
                                if dp { "-dp" } else { "" }
                            );
                            cells.push((d.dataset.name().to_string(), name, s));
                        }
                    }
                }
            }
        }
        Ok(cells)
    }
}

/// Whether an experiment file is a federated one (`kind = "fl"`).
pub fn is_fl(path: &Path) -> Result<bool> {
    Ok(crate::grid::experiment_kind(path)?.as_deref() == Some("fl"))
}

/// A finished cell: its settings, summary and per-round metrics.
#[derive(Debug, Clone)]
pub struct Cell {
    pub dataset: String,
    pub name: String,
    pub settings: FlSettings,
    pub summary: FlSummary,
    pub rounds: Vec<RoundMetrics>,
}

/// Runs every cell of `profile` not yet finished, then writes `results.{csv,md}` and the figures
/// into `out`.
pub fn run(
    experiment: &FlExperiment,
    profile: &str,
    data_dir: &Path,
    out: &Path,
    progress: bool,
) -> Result<Vec<Cell>> {
    let cells = experiment.cells(profile)?;
    let mut loaded: BTreeMap<String, FlData> = BTreeMap::new();
    let total = cells.len();
    for (i, (dataset, name, settings)) in cells.iter().enumerate() {
        let dir = out.join(dataset).join(name);
        if finished(&dir, settings) {
            continue;
        }
        if !loaded.contains_key(dataset) {
            loaded.insert(dataset.clone(), FlData::load(settings.dataset, data_dir)?);
        }
        if progress {
            eprintln!("[{}/{total}] {dataset} {name}", i + 1);
        }
        super::run(settings, &loaded[dataset], Some(&dir), progress)?;
    }
    let finished = read_cells(out)?;
    write_results(&finished, out)?;
    figures(&finished, out)?;
    Ok(finished)
}

/// A cell is finished when its summary exists and its config equals `settings`.
fn finished(dir: &Path, settings: &FlSettings) -> bool {
    let same_config = std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<FlSettings>(&t).ok())
        .is_some_and(|c| &c == settings);
    same_config && dir.join("summary.json").is_file()
}

/// Every finished cell under `out/<dataset>/<cell>/`.
pub fn read_cells(out: &Path) -> Result<Vec<Cell>> {
    let mut cells = Vec::new();
    let mut datasets: Vec<PathBuf> = std::fs::read_dir(out)
        .map_err(|e| Error::io(out, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    datasets.sort();
    for dataset_dir in datasets {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(&dataset_dir)
            .map_err(|e| Error::io(&dataset_dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("summary.json").is_file())
            .collect();
        dirs.sort();
        for dir in dirs {
            let read = |name: &str| -> Result<String> {
                std::fs::read_to_string(dir.join(name)).map_err(|e| Error::io(dir.join(name), e))
            };
            let settings: FlSettings = serde_json::from_str(&read("config.json")?)
                .map_err(|e| Error::bad_file(dir.join("config.json"), e.to_string()))?;
            let summary: FlSummary = serde_json::from_str(&read("summary.json")?)
                .map_err(|e| Error::bad_file(dir.join("summary.json"), e.to_string()))?;
            cells.push(Cell {
                dataset: dataset_dir
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned(),
                name: dir
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned(),
                rounds: read_rows(&dir.join("metrics.jsonl"))?,
                settings,
                summary,
            });
        }
    }
    cells.sort_by_key(order_key);
    Ok(cells)
}

/// Table order: dataset, no DP before DP, scheme as in the paper (FL-CS with random rows last),
/// ratio.
fn order_key(c: &Cell) -> (String, bool, usize, u64) {
    let scheme = [Scheme::Std, Scheme::Rnd, Scheme::Freq, Scheme::Cs]
        .iter()
        .position(|s| *s == c.settings.scheme)
        .unwrap_or(9)
        + usize::from(c.settings.rows == DctRows::Random && c.settings.scheme == Scheme::Cs);
    (
        c.dataset.clone(),
        c.settings.privacy.is_some(),
        scheme,
        (c.settings.ratio * 1e6) as u64,
    )
}

fn write_results(cells: &[Cell], out: &Path) -> Result<()> {
    let mut csv = String::from(
        "dataset,scheme,ratio,dp,clip,sigma,epsilon,delta,metric,best,round,accuracy,balanced_accuracy,auroc,cost_kb,upstream_kb,rounds_run,parameters,message_length,server_s,client_s\n",
    );
    let opt = |v: Option<f64>, digits: usize| v.map_or(String::new(), |v| format!("{v:.digits$}"));
    for c in cells {
        let s = &c.summary;
        csv.push_str(&format!(
            "{},{},{:.4},{},{},{},{},{},{},{:.4},{},{:.4},{:.4},{},{:.4},{:.4},{},{},{},{:.4},{:.4}\n",
            c.dataset,
            s.scheme,
            s.ratio,
            c.settings.privacy.is_some(),
            opt(s.clip, 4),
            opt(s.noise_multiplier, 4),
            opt(s.epsilon, 3),
            opt(s.delta, 7),
            s.metric,
            s.best,
            s.best_round,
            s.accuracy_at_best,
            s.balanced_accuracy_at_best,
            opt(s.auroc_at_best, 4),
            s.cost_bits / 8e3,
            s.upstream_bits_at_best as f64 / 8e3,
            s.rounds_run,
            s.parameters,
            s.message_length,
            s.mean_server_seconds,
            s.mean_client_seconds,
        ));
    }
    std::fs::write(out.join("results.csv"), csv)
        .map_err(|e| Error::io(out.join("results.csv"), e))?;
    let mut md = String::new();
    let mut current = String::new();
    for c in cells {
        let s = &c.summary;
        let binary = s.auroc_at_best.is_some();
        let header = format!(
            "{} {}",
            c.dataset,
            if c.settings.privacy.is_some() {
                "with client-level DP"
            } else {
                "without DP"
            }
        );
        if header != current {
            current = header.clone();
            md.push_str(&format!("\n### {header}\n\n"));
            if binary {
                md.push_str("| scheme | r | best balanced accuracy | AUROC | round | cost (kB) | S | σ | ε |\n|---|---|---|---|---|---|---|---|---|\n");
            } else {
                md.push_str("| scheme | r | best accuracy | round | cost (kB) | S | σ | ε |\n|---|---|---|---|---|---|---|---|\n");
            }
        }
        let dp = |v: Option<f64>, d: usize| v.map_or("-".to_string(), |v| format!("{v:.d$}"));
        let auroc = if binary {
            format!(" {} |", dp(s.auroc_at_best, 3))
        } else {
            String::new()
        };
        md.push_str(&format!(
            "| {} | {:.2} | {:.4} |{auroc} {} | {:.2} | {} | {} | {} |\n",
            s.scheme,
            s.ratio,
            s.best,
            s.best_round,
            s.cost_bits / 8e3,
            dp(s.clip, 4),
            dp(s.noise_multiplier, 3),
            dp(s.epsilon, 3),
        ));
    }
    std::fs::write(out.join("results.md"), md.trim_start())
        .map_err(|e| Error::io(out.join("results.md"), e))
}

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
    match settings.scheme {
        Scheme::Std => colour(7),
        Scheme::Rnd => colour(0),
        Scheme::Freq => colour(1),
        Scheme::Cs if settings.rows == DctRows::Random => colour(4),
        Scheme::Cs => colour(3),
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
            .filter(|c| c.settings.scheme != Scheme::Std)
            .map(|c| c.settings.ratio)
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
                c.settings.scheme == Scheme::Std || (c.settings.ratio - ratio).abs() < 1e-12
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
                let width = match cell.settings.ratio {
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
                    .label(format!("{} r {}", cell.summary.scheme, cell.settings.ratio))
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 14, y)], c.stroke_width(width))
                    });
            }
            crate::plot::draw_legend(&mut chart, SeriesLabelPosition::LowerRight, 10)?;
        }
        root.present().map_err(err)
    }
}
