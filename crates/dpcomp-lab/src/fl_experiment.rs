//! The FL-CS experiment (`experiments/fl_cs.toml`, `kind = "fl"`, run by `dpcomp grid`): every
//! dataset × scheme × rate, without and with client-level DP, as the paper's Tables III-VI: the
//! best accuracy (balanced accuracy and AUROC for the two-class table) over the rounds, the round
//! it was reached, the cost r n 32 Round C, and S and σ of the private runs. Figures: the metric
//! per round for every scheme (one panel a ratio) and the metric against the upstream bits.
//!
//! The grid gives the sketches' `rates` n / m, as `[compression]` does (older files give the
//! paper's `ratios` r = m / n instead, still read). Cells, tables and figures keep the paper's
//! label r = 1 / rate: runs go to `<out>/<dataset>/<scheme>-r<r>[-dp]/` (`cs-r0.05` is FL-CS at
//! rate 20), holding `config.toml` (or, from before it, `config.json`), `metrics.jsonl` and
//! `summary.json`; a cell whose summary exists with the same settings is not run again.

use crate::cell_observer::{CellEvent, CellObserver};
use crate::results_table::{mean_sd, MarkdownTable};
use dpcomp::compress::chunked_dct::DctRows;
use dpcomp::compress::linear_sketch::Scheme;
use dpcomp::compress::CompressorKind;
use dpcomp::config::{AccountantKind, CompressionSettings};
use dpcomp::data::partition::Partition;
use dpcomp::error::{Error, Result};
use dpcomp::fl::data::{FlData, FlDataset};
use dpcomp::fl::{
    default_clip, read_rows, scheme_compression, FlPrivacy, FlSettings, FlSummary, RoundMetrics,
    FL_CS_ITERATIONS,
};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A federated experiment file (`kind = "fl"`, e.g. `experiments/fl_cs.toml`): its datasets, the
/// grid of cells run on each, and the profiles that shorten them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlExperiment {
    /// The experiment's name: its folder under the runs root (`<runs>/<name>/<profile>/`).
    pub name: String,
    /// Always "fl" (what routes the file here).
    pub kind: String,
    /// Free text on what the experiment is for (optional; not written to its tables).
    #[serde(default)]
    pub description: String,
    /// `[[datasets]]`: each dataset's federated settings; every cell of the grid runs on each.
    pub datasets: Vec<DatasetSettings>,
    /// `[grid]`: the cells' axes and the settings they share.
    pub grid: Grid,
    /// `[profiles.NAME]`: per-dataset overrides of each profile (`--profile`).
    pub profiles: BTreeMap<String, Profile>,
}

/// One dataset's federated settings (the flags of `dpcomp fl`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetSettings {
    /// The data the clients hold.
    pub dataset: FlDataset,
    /// N, the number of clients.
    pub clients: usize,
    /// C, each client's probability of taking part in a round.
    pub fraction: f64,
    /// T_gd, local SGD steps per round.
    pub local_steps: usize,
    /// Examples per local step (0: full-batch gradient descent).
    pub local_batch: usize,
    /// The clients' local SGD step size.
    pub local_lr: f64,
    /// T_cl, the rounds of every cell.
    pub rounds: usize,
    /// Stop after this many rounds without a better held-out metric (0, the default: never).
    #[serde(default)]
    pub patience: usize,
    /// How the training examples are split among the clients: `iid` (the default),
    /// `dirichlet:ALPHA` or `shards:K`.
    #[serde(default = "iid")]
    pub partition: String,
    /// S₁: the clip radius of a whole update; messages are clipped to `default_clip(S₁, r)`.
    pub full_clip: f64,
    /// Test (and validation) examples evaluated after each round (0, the default: all).
    #[serde(default)]
    pub eval_examples: usize,
    /// η, the server's step on the aggregated update (default 1: FedAvg).
    #[serde(default = "one")]
    pub server_lr: f64,
    /// β, the server's momentum (default 0: none); `grid.server_momentum` replaces it.
    #[serde(default)]
    pub server_momentum: f64,
    /// The network (default: the dataset's, `FlData::default_net`).
    #[serde(default)]
    pub model: Option<dpcomp::fl::model::FlNet>,
    /// Share of the training examples held out for validation (`FlSettings::validation`).
    #[serde(default)]
    pub validation: f64,
}

fn iid() -> String {
    "iid".into()
}

fn one() -> f64 {
    1.0
}

/// The cells' axes and the settings they share.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grid {
    /// The paper's schemes: std (`identity`), rnd, freq and cs (`fl-rnd`, `fl-freq`, `fl-cs`).
    pub schemes: Vec<Scheme>,
    /// Rates n / m of the compressed schemes, as `[compression]`'s `rate` (FL-STD runs once,
    /// uncompressed). Cells are named by the paper's r = 1 / rate: rate 20 is `-r0.05`.
    #[serde(default)]
    pub rates: Vec<f64>,
    /// Files written before `rates`: the paper's r = m / n of the compressed schemes, read as
    /// rates 1 / r (give `rates` or `ratios`, not both).
    #[serde(default)]
    pub ratios: Vec<f64>,
    /// Whether the cells run without (false) and with (true) client-level DP.
    pub dp: Vec<bool>,
    /// ε after the rounds at noise scale 1: σ is calibrated for it.
    pub target_epsilon: f64,
    /// δ of the private cells.
    pub delta: f64,
    /// The accountant of the private cells.
    #[serde(default)]
    pub accountant: AccountantKind,
    /// FL-CS's `lambda` option (default 0.01).
    #[serde(default = "default_lambda")]
    pub lambda: f64,
    /// FL-CS's `iterations` option (default `FL_CS_ITERATIONS`).
    #[serde(default = "default_iterations")]
    pub owlqn_iterations: usize,
    /// DCT rows of FL-CS: the paper's first ones, random ones, or both (FL-CS runs once each).
    #[serde(default = "first_rows")]
    pub rows: Vec<DctRows>,
    /// Cells beside the schemes with a compressor of whole updates, in `[compression]`'s form
    /// (unset fields its defaults), e.g. `compressors = [{ kind = "dgc", rate = 16.0 }, { kind
    /// = "powersgd", rank = 1 }]`: named `dgc-x16`, `powersgd-r1`.
    #[serde(default, deserialize_with = "compressions")]
    pub compressors: Vec<CompressionSettings>,
    /// The seed of every cell when `seeds` is empty.
    #[serde(default)]
    pub seed: u64,
    /// Seeds of every cell (cells named `-s{seed}`); empty: `seed` alone, names unchanged.
    #[serde(default)]
    pub seeds: Vec<u64>,
    /// Server momentum β of every cell (cells named `-m{β}`; FL-CS keeps it in the compressed
    /// domain, Algorithm 3); empty: the dataset's `server_momentum`, names unchanged.
    #[serde(default)]
    pub server_momentum: Vec<f64>,
    /// Noise of the DP cells as multiples of the σ calibrated for `target_epsilon`: each DP cell
    /// once per scale (named `-ns{scale}`, σ = scale · σ(ε)); empty: σ(ε) alone, names unchanged.
    /// With C N clients a round the noise on the average is σ S / (C N), so scale 1/k is the
    /// noise ε would need with k times the clients a round (same C, k times the population); the
    /// cell's own ε (reported) is that of the run as made, far above `target_epsilon` for k > 1.
    #[serde(default)]
    pub noise_scales: Vec<f64>,
}

fn first_rows() -> Vec<DctRows> {
    vec![DctRows::First]
}

fn default_lambda() -> f64 {
    0.01
}

fn default_iterations() -> usize {
    FL_CS_ITERATIONS
}

/// `compressors`: each table over `CompressionSettings::default()`, its unknown keys refused.
fn compressions<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<Vec<CompressionSettings>, D::Error> {
    use serde::de::Error as _;
    let tables = Vec::<toml::Table>::deserialize(deserializer)?;
    tables
        .into_iter()
        .map(|table| {
            let Ok(toml::Value::Table(mut full)) =
                toml::Value::try_from(CompressionSettings::default())
            else {
                unreachable!("CompressionSettings serialises to a table")
            };
            full.extend(table);
            toml::Value::Table(full)
                .try_into()
                .map_err(|e| D::Error::custom(format!("compressors: {e}")))
        })
        .collect()
}

impl Grid {
    /// The compressed schemes' (paper's r naming the cells, rate n / m): `rates` as
    /// (1 / rate, rate), or an older file's `ratios` as (r, 1 / r).
    pub fn sketch_rates(&self) -> Result<Vec<(f64, f64)>> {
        match (self.rates.is_empty(), self.ratios.is_empty()) {
            (false, false) => Err(Error::bad_value(
                "grid.ratios",
                "the older form of `grid.rates` (r = 1 / rate): give one of the two",
            )),
            (false, true) => self
                .rates
                .iter()
                .map(|&rate| {
                    if rate.is_finite() && rate >= 1.0 {
                        Ok((1.0 / rate, rate))
                    } else {
                        Err(Error::bad_value(
                            "grid.rates",
                            format!("{rate}: expected a compression rate n / m >= 1"),
                        ))
                    }
                })
                .collect(),
            (true, false) => self
                .ratios
                .iter()
                .map(|&r| {
                    if r > 0.0 && r <= 1.0 {
                        Ok((r, 1.0 / r))
                    } else {
                        Err(Error::bad_value(
                            "grid.ratios",
                            format!("{r}: expected 0 < r <= 1 (or give `grid.rates`)"),
                        ))
                    }
                })
                .collect(),
            (true, true) if self.schemes.iter().any(|s| *s != Scheme::Std) => {
                Err(Error::bad_value(
                    "grid.rates",
                    "missing: the compressed schemes need their rates n / m",
                ))
            }
            (true, true) => Ok(Vec::new()),
        }
    }
}

/// Per-dataset overrides of a profile (a shorter CPU run).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Override {
    /// Replaces the dataset's `model`.
    pub model: Option<dpcomp::fl::model::FlNet>,
    /// Replaces the dataset's `rounds` (T_cl).
    pub rounds: Option<usize>,
    /// Replaces the dataset's `eval_examples`.
    pub eval_examples: Option<usize>,
    /// Replaces the dataset's `clients` (N).
    pub clients: Option<usize>,
    /// Replaces the dataset's `fraction` (C).
    pub fraction: Option<f64>,
    /// Replaces the grid's `noise_scales` for this dataset in this profile (for example one
    /// real run with more clients beside the scaled-noise cells of the cheap profile).
    pub noise_scales: Option<Vec<f64>>,
}

/// One `[profiles.NAME]` table: the overrides it applies to each dataset (none: the dataset's
/// settings as given).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Profile {
    /// Keyed by dataset name (`fashion-mnist`, `breast_cancer`).
    #[serde(flatten)]
    pub datasets: BTreeMap<String, Override>,
}

impl FlExperiment {
    /// Reads a `kind = "fl"` file; an error names the file and what is wrong (unknown keys,
    /// another kind, a profile overriding a dataset that is not in `[[datasets]]`).
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
            base.model = o.model.or(d.model);
            base.validation = d.validation;
            base.seed = self.grid.seed;
            let sketch_rates = self.grid.sketch_rates()?;
            let sigma = if self.grid.dp.contains(&true) {
                dpcomp::privacy::calibrate::noise_multiplier_for(
                    self.grid.accountant,
                    self.grid.target_epsilon,
                    base.fraction,
                    base.rounds as u64,
                    self.grid.delta,
                )?
            } else {
                0.0
            };
            let seeds = if self.grid.seeds.is_empty() {
                vec![None]
            } else {
                self.grid.seeds.iter().map(|&s| Some(s)).collect()
            };
            let momenta = if self.grid.server_momentum.is_empty() {
                vec![None]
            } else {
                self.grid.server_momentum.iter().map(|&m| Some(m)).collect()
            };
            let scales = o
                .noise_scales
                .clone()
                .unwrap_or_else(|| self.grid.noise_scales.clone());
            if let Some(bad) = scales.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
                return Err(Error::bad_value(
                    "noise_scales",
                    format!("{bad}: expected positive multiples of the calibrated sigma"),
                ));
            }
            // DP cells once per scale; the non-private ones once.
            let scales_of = |dp: bool| -> Vec<Option<f64>> {
                if dp && !scales.is_empty() {
                    scales.iter().map(|&s| Some(s)).collect()
                } else {
                    vec![None]
                }
            };
            let privacy = |dp: bool, clip: f64, scale: Option<f64>| {
                dp.then(|| FlPrivacy {
                    clip,
                    noise_multiplier: sigma * scale.unwrap_or(1.0),
                    delta: self.grid.delta,
                    accountant: self.grid.accountant,
                })
            };
            let scale_suffix =
                |scale: Option<f64>| scale.map_or(String::new(), |s| format!("-ns{s}"));
            let start = cells.len();
            for &dp in &self.grid.dp {
                for &scheme in &self.grid.schemes {
                    // (the paper's r naming the cell, the rate n / m).
                    let rates = if scheme == Scheme::Std {
                        vec![(1.0, 1.0)]
                    } else {
                        sketch_rates.clone()
                    };
                    let rows = if scheme == Scheme::Cs {
                        self.grid.rows.clone()
                    } else {
                        vec![DctRows::First]
                    };
                    for &row_choice in &rows {
                        for &(ratio, rate) in &rates {
                            for scale in scales_of(dp) {
                                let mut s = base.clone();
                                s.compression = scheme_compression(
                                    scheme,
                                    rate,
                                    None,
                                    row_choice,
                                    self.grid.lambda,
                                    self.grid.owlqn_iterations,
                                )?;
                                s.privacy =
                                    privacy(dp, default_clip(d.full_clip, scheme, rate), scale);
                                let name = format!(
                                    "{}{}-r{ratio}{}{}",
                                    format!("{scheme:?}").to_lowercase(),
                                    if row_choice == DctRows::Random {
                                        "-random"
                                    } else {
                                        ""
                                    },
                                    if dp { "-dp" } else { "" },
                                    scale_suffix(scale)
                                );
                                cells.push((d.dataset.name().to_string(), name, s));
                            }
                        }
                    }
                }
                for compressor in &self.grid.compressors {
                    for scale in scales_of(dp) {
                        let mut s = base.clone();
                        s.compression = compressor.clone();
                        s.privacy = privacy(
                            dp,
                            default_clip(d.full_clip, s.scheme(), compressor.rate()),
                            scale,
                        );
                        let setting = match compressor.kind() {
                            CompressorKind::Powersgd => format!("r{}", compressor.rank()),
                            _ => format!("x{}", compressor.rate()),
                        };
                        let name = format!(
                            "{}-{setting}{}{}",
                            compressor.kind(),
                            if dp { "-dp" } else { "" },
                            scale_suffix(scale)
                        );
                        cells.push((d.dataset.name().to_string(), name, s));
                    }
                }
            }
            // Every cell once per momentum and seed of the grid's axes.
            let plain: Vec<(String, String, FlSettings)> = cells.drain(start..).collect();
            for seed in &seeds {
                for momentum in &momenta {
                    for (dataset, name, settings) in &plain {
                        let mut s = settings.clone();
                        let mut name = name.clone();
                        if let Some(m) = momentum {
                            s.server_momentum = *m;
                            name.push_str(&format!("-m{m}"));
                        }
                        if let Some(seed) = seed {
                            s.seed = *seed;
                            name.push_str(&format!("-s{seed}"));
                        }
                        cells.push((dataset.clone(), name, s));
                    }
                }
            }
        }
        Ok(cells)
    }
}

/// The axes `dpcomp grid --only AXIS=VALUE` selects federated cells by (`ratio` the paper's
/// r = 1 / rate, as cells are named; `rate` the compressor's).
pub const ONLY_AXES: [&str; 8] = [
    "dataset",
    "scheme",
    "ratio",
    "rate",
    "dp",
    "server_momentum",
    "seed",
    "noise_scale",
];

/// A cell's value on `axis` (one of `ONLY_AXES`), as text: the noise scale is read from the
/// cell's name (`-ns{scale}`, 1 without it), which `FlExperiment::cells` writes.
fn axis_value(dataset: &str, name: &str, settings: &FlSettings, axis: &str) -> String {
    match axis {
        "dataset" => dataset.to_string(),
        "scheme" => format!("{:?}", settings.scheme()).to_lowercase(),
        "ratio" => settings.paper_ratio().to_string(),
        "rate" => settings.compression.rate().to_string(),
        "dp" => settings.privacy.is_some().to_string(),
        "server_momentum" => settings.server_momentum.to_string(),
        "seed" => settings.seed.to_string(),
        "noise_scale" => name
            .split('-')
            .find_map(|part| part.strip_prefix("ns"))
            .unwrap_or("1")
            .to_string(),
        other => unreachable!("{other} is checked against ONLY_AXES"),
    }
}

impl FlExperiment {
    /// `cells`, keeping those whose value on every `only` axis equals the one given (numbers
    /// compare numerically: `ratio=0.05`, `server_momentum=0`).
    pub fn cells_only(
        &self,
        profile: &str,
        only: &[(String, String)],
    ) -> Result<Vec<(String, String, FlSettings)>> {
        for (axis, _) in only {
            if !ONLY_AXES.contains(&axis.as_str()) {
                return Err(Error::bad_value(
                    "only",
                    format!(
                        "{axis} is not an axis of the federated experiment {}; axes: {}",
                        self.name,
                        ONLY_AXES.join(", ")
                    ),
                ));
            }
        }
        let same = |value: &str, wanted: &str| match (value.parse::<f64>(), wanted.parse::<f64>()) {
            (Ok(v), Ok(w)) => v == w,
            _ => value == wanted,
        };
        let cells = self.cells(profile)?;
        // A value no cell has would select nothing and "finish" with 0 cells: an error listing
        // the axis's values (as `grid::Experiment` does for training grids).
        for (axis, wanted) in only {
            let mut values: Vec<String> = cells
                .iter()
                .map(|(dataset, name, settings)| axis_value(dataset, name, settings, axis))
                .collect();
            if !values.iter().any(|v| same(v, wanted)) {
                values.sort();
                values.dedup();
                return Err(Error::bad_value(
                    "only",
                    format!(
                        "{axis}={wanted}: no cell of {} profile {profile} has it; {axis} takes {}",
                        self.name,
                        values.join(", ")
                    ),
                ));
            }
        }
        Ok(cells
            .into_iter()
            .filter(|(dataset, name, settings)| {
                only.iter()
                    .all(|(axis, wanted)| same(&axis_value(dataset, name, settings, axis), wanted))
            })
            .collect())
    }
}

/// A finished cell: its settings, summary and per-round metrics.
#[derive(Debug, Clone)]
pub struct Cell {
    /// The dataset's folder name (`FlDataset::name`).
    pub dataset: String,
    /// The cell's folder name, e.g. `cs-r0.05-dp` (scheme, the paper's r, and its other axes).
    pub name: String,
    /// Its `config.toml`.
    pub settings: FlSettings,
    /// Its `summary.json`.
    pub summary: FlSummary,
    /// Its `metrics.jsonl`, one row per round run.
    pub rounds: Vec<RoundMetrics>,
}

/// Runs every cell of `profile` not yet finished, then writes `results.{csv,md}` into `out`
/// (`experiment::ExperimentFile::run` then draws the figures). `observer` hears of each cell and
/// gives its rounds' observers.
pub fn run(
    experiment: &FlExperiment,
    profile: &str,
    only: &[(String, String)],
    data_dir: &Path,
    out: &Path,
    observer: &mut dyn CellObserver,
) -> Result<Vec<Cell>> {
    let cells = experiment.cells_only(profile, only)?;
    let mut loaded: BTreeMap<String, FlData> = BTreeMap::new();
    let total = cells.len();
    for (i, (dataset, name, settings)) in cells.iter().enumerate() {
        let dir = out.join(dataset).join(name);
        let shown = format!("{dataset} {name}");
        if finished(&dir, settings) {
            observer.cell(&experiment.name, i, total, &shown, CellEvent::Skipped);
            continue;
        }
        if !loaded.contains_key(dataset) {
            loaded.insert(dataset.clone(), FlData::load(settings.dataset, data_dir)?);
        }
        observer.cell(&experiment.name, i, total, &shown, CellEvent::Starting);
        let mut cell = dpcomp::fl::FederatedRun::builder()
            .settings(settings.clone())
            .data(&loaded[dataset])
            .out(&dir);
        for o in observer.round_observers() {
            cell = cell.observer(o);
        }
        match cell.build().and_then(|cell| cell.run()) {
            // Another worker runs this cell: leave it to them (workers may share a grid).
            Err(Error::RunInUse { owner, .. }) => {
                let event = CellEvent::InUse { owner: &owner };
                observer.cell(&experiment.name, i, total, &shown, event);
            }
            other => {
                other?;
                let event = CellEvent::Finished { result: None };
                observer.cell(&experiment.name, i, total, &shown, event);
            }
        }
    }
    let finished = read_cells(out)?;
    write_results(&finished, out)?;
    Ok(finished)
}

/// A cell is finished when its summary exists and its settings (`config.toml`, or an older
/// cell's `config.json` migrated, `config_file::read`) equal `settings`.
pub fn finished(dir: &Path, settings: &FlSettings) -> bool {
    let same_config = dpcomp::fl::config_file::read(dir)
        .ok()
        .flatten()
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
            let settings = dpcomp::fl::config_file::read(&dir)?.ok_or_else(|| {
                Error::bad_file(
                    dir.join(dpcomp::fl::config_file::CONFIG_FILE),
                    "missing beside summary.json: the cell's settings",
                )
            })?;
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
/// the paper's r.
fn order_key(c: &Cell) -> (String, bool, usize, u64, u64, u64) {
    let random_rows = matches!(
        c.settings.compressor(),
        Ok(dpcomp::compress::Compressor::Sketch(s)) if s.rows == DctRows::Random
    );
    let scheme = [Scheme::Std, Scheme::Rnd, Scheme::Freq, Scheme::Cs]
        .iter()
        .position(|s| *s == c.settings.scheme())
        .unwrap_or(9)
        + usize::from(random_rows && c.settings.scheme() == Scheme::Cs);
    // Compressor cells after the sketches, DGC by rate, PowerSGD by rank.
    let k = &c.settings.compression;
    let (scheme, size) = match k.kind() {
        CompressorKind::Powersgd => (11, k.rank() as u64),
        CompressorKind::Identity => (scheme, 1_000_000),
        kind if kind.is_sketch() => (scheme, (c.settings.paper_ratio() * 1e6) as u64),
        _ => (10, (k.rate() * 1e6) as u64),
    };
    (
        c.dataset.clone(),
        c.settings.privacy.is_some(),
        scheme,
        size,
        (c.settings.server_momentum * 1e6) as u64,
        c.settings.seed,
    )
}

/// Writes the table of `cells` into `out`: `results.csv` (one row per cell, every summary
/// column) and `results.md` (the paper's tables, one per dataset and privacy, after the mean
/// ± standard deviation over seeds when cells differ only by seed).
pub fn write_results(cells: &[Cell], out: &Path) -> Result<()> {
    let header = [
        "dataset",
        "scheme",
        "ratio",
        "dp",
        "clip",
        "sigma",
        "epsilon",
        "delta",
        "metric",
        "best",
        "round",
        "accuracy",
        "balanced_accuracy",
        "auroc",
        "cost_kb",
        "upstream_kb",
        "rounds_run",
        "parameters",
        "message_length",
        "server_s",
        "client_s",
        "server_momentum",
        "seed",
        "epsilon_at_best",
        "validation_round",
        "test_at_validation_round",
        "epsilon_at_validation_round",
    ];
    let opt = |v: Option<f64>, digits: usize| v.map_or(String::new(), |v| format!("{v:.digits$}"));
    let rows: Vec<Vec<String>> = cells
        .iter()
        .map(|c| {
            let s = &c.summary;
            vec![
                c.dataset.clone(),
                s.scheme.clone(),
                format!("{:.4}", s.ratio),
                c.settings.privacy.is_some().to_string(),
                opt(s.clip, 4),
                opt(s.noise_multiplier, 4),
                opt(s.epsilon, 3),
                opt(s.delta, 7),
                s.metric.clone(),
                format!("{:.4}", s.best),
                s.best_round.to_string(),
                format!("{:.4}", s.accuracy_at_best),
                format!("{:.4}", s.balanced_accuracy_at_best),
                opt(s.auroc_at_best, 4),
                format!("{:.4}", s.cost_bits / 8e3),
                format!("{:.4}", s.upstream_bits_at_best as f64 / 8e3),
                s.rounds_run.to_string(),
                s.parameters.to_string(),
                s.message_length.to_string(),
                format!("{:.4}", s.mean_server_seconds),
                format!("{:.4}", s.mean_client_seconds),
                c.settings.server_momentum.to_string(),
                c.settings.seed.to_string(),
                opt(s.epsilon_at_best, 3),
                s.validation_round.map_or(String::new(), |r| r.to_string()),
                opt(s.test_at_validation_round, 4),
                opt(s.epsilon_at_validation_round, 3),
            ]
        })
        .collect();
    crate::csv_table::write(&out.join("results.csv"), &header, &rows)?;
    // One table per dataset and privacy, in the order of their first cell; a binary task's
    // table (its first cell's) has an AUROC column.
    let mut sections: Vec<(String, MarkdownTable)> = Vec::new();
    for c in cells {
        let s = &c.summary;
        let binary = s.auroc_at_best.is_some();
        let heading = format!(
            "{} {}",
            c.dataset,
            if c.settings.privacy.is_some() {
                "with client-level DP"
            } else {
                "without DP"
            }
        );
        if sections.last().map(|(h, _)| h) != Some(&heading) {
            let best = if binary {
                &["best balanced accuracy", "AUROC"][..]
            } else {
                &["best accuracy"][..]
            };
            let columns: Vec<&str> = ["scheme", "r", "β", "seed"]
                .into_iter()
                .chain(best.iter().copied())
                .chain([
                    "round",
                    "ε there",
                    "chosen on validation: round, test, ε",
                    "cost (kB)",
                    "S",
                    "σ",
                    "ε",
                ])
                .collect();
            sections.push((heading, MarkdownTable::new(&columns)));
        }
        let dp = |v: Option<f64>, d: usize| v.map_or("-".to_string(), |v| format!("{v:.d$}"));
        let chosen = match (s.validation_round, s.test_at_validation_round) {
            (Some(r), Some(t)) => format!("{r}, {t:.4}, {}", dp(s.epsilon_at_validation_round, 3)),
            _ => "-".to_string(),
        };
        let mut row = vec![
            s.scheme.clone(),
            format!("{:.2}", s.ratio),
            c.settings.server_momentum.to_string(),
            c.settings.seed.to_string(),
            format!("{:.4}", s.best),
        ];
        if binary {
            row.push(dp(s.auroc_at_best, 3));
        }
        row.extend([
            s.best_round.to_string(),
            dp(s.epsilon_at_best, 3),
            chosen,
            format!("{:.2}", s.cost_bits / 8e3),
            dp(s.clip, 4),
            dp(s.noise_multiplier, 3),
            dp(s.epsilon, 3),
        ]);
        if let Some((_, table)) = sections.last_mut() {
            table.row(row);
        }
    }
    let md: String = sections
        .iter()
        .map(|(heading, table)| format!("\n### {heading}\n\n{}", table.render()))
        .collect();
    let md = format!("{}{}", seed_summary(cells), md);
    std::fs::write(out.join("results.md"), md.trim_start())
        .map_err(|e| Error::io(out.join("results.md"), e))
}

/// The cells that differ only by seed, as one row each: mean ± sample standard deviation of the
/// best metric over rounds and of the validation-chosen round's test metric, and the seeds
/// (`n`). σ is part of the setting (a grid with `noise_scales` runs one scheme at several σ).
/// Empty when no setting ran more than one seed.
fn seed_summary(cells: &[Cell]) -> String {
    let key = |c: &Cell| {
        (
            c.dataset.clone(),
            c.settings.privacy.is_some(),
            c.summary.scheme.clone(),
            format!("{:.4}", c.summary.ratio),
            c.settings.server_momentum.to_string(),
            c.summary
                .noise_multiplier
                .map_or("-".to_string(), |sigma| format!("{sigma:.3}")),
        )
    };
    let mut groups: Vec<(_, Vec<&Cell>)> = Vec::new();
    for c in cells {
        match groups.iter_mut().find(|(k, _)| *k == key(c)) {
            Some((_, members)) => members.push(c),
            None => groups.push((key(c), vec![c])),
        }
    }
    if groups.iter().all(|(_, members)| members.len() < 2) {
        return String::new();
    }
    let shown = |values: Vec<f64>| match mean_sd(&values) {
        (mean, Some(sd)) => format!("{mean:.4} ± {sd:.4}"),
        (mean, None) => format!("{mean:.4}"),
    };
    let mut table = MarkdownTable::new(&[
        "dataset",
        "DP",
        "scheme",
        "r",
        "β",
        "σ",
        "seeds",
        "best over rounds",
        "chosen on validation: test",
    ]);
    for ((dataset, dp, scheme, ratio, beta, sigma), members) in groups {
        let chosen: Vec<f64> = members
            .iter()
            .filter_map(|c| c.summary.test_at_validation_round)
            .collect();
        table.row(vec![
            dataset,
            if dp { "yes" } else { "no" }.to_string(),
            scheme,
            ratio,
            beta,
            sigma,
            members.len().to_string(),
            shown(members.iter().map(|c| c.summary.best).collect()),
            if chosen.len() == members.len() {
                shown(chosen)
            } else {
                "-".to_string()
            },
        ]);
    }
    format!(
        "\n### Over seeds (mean ± sample standard deviation)\n\n{}",
        table.render()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seeds and momentum axes multiply every cell, name it, and set its settings; the
    /// committed `experiments/fl_scale.toml` parses into its 120 cpu cells.
    #[test]
    fn seeds_and_momentum_axes_multiply_the_cells() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("axes.toml");
        std::fs::write(
            &path,
            r#"
name = "axes"
kind = "fl"
[[datasets]]
dataset = "breast_cancer"
clients = 10
fraction = 0.5
local_steps = 1
local_batch = 0
local_lr = 0.5
rounds = 3
full_clip = 0.5
[grid]
schemes = ["std", "cs"]
ratios = [0.1]
dp = [false]
target_epsilon = 1.0
delta = 1e-5
lambda = 0.01
owlqn_iterations = 5
seeds = [4, 7]
server_momentum = [0.0, 0.9]
[profiles.cpu]
"#,
        )
        .unwrap();
        let cells = FlExperiment::from_file(&path)
            .unwrap()
            .cells("cpu")
            .unwrap();
        let names: Vec<&str> = cells.iter().map(|(_, n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "std-r1-m0-s4",
                "cs-r0.1-m0-s4",
                "std-r1-m0.9-s4",
                "cs-r0.1-m0.9-s4",
                "std-r1-m0-s7",
                "cs-r0.1-m0-s7",
                "std-r1-m0.9-s7",
                "cs-r0.1-m0.9-s7"
            ]
        );
        for (_, name, s) in &cells {
            assert_eq!(s.seed, if name.ends_with("s4") { 4 } else { 7 }, "{name}");
            let beta = if name.contains("-m0.9") { 0.9 } else { 0.0 };
            assert_eq!(s.server_momentum, beta, "{name}");
        }
        let committed =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments/fl_scale.toml");
        let scale = FlExperiment::from_file(&committed).unwrap();
        let cells = scale.cells("cpu").unwrap();
        assert_eq!(cells.len(), 240);
        let fashion: Vec<_> = cells
            .iter()
            .filter(|(d, _, _)| d == "fashion-mnist")
            .collect();
        assert_eq!(fashion.len(), 120);
        assert!(fashion.iter().all(|(_, _, s)| s.model
            == Some(dpcomp::fl::model::FlNet::FedavgCnn)
            && s.validation == 0.1
            && s.rounds == 50));
    }

    /// `rates` (n / m, as `[compression]`) and an older file's `ratios` (the paper's r) give the
    /// same cells, named by r; `compressors` take `[compression]`'s form with its defaults.
    #[test]
    fn rates_and_the_older_ratios_give_the_same_cells() {
        let dir = tempfile::tempdir().unwrap();
        let file = |axis: &str| {
            let path = dir.path().join("grid.toml");
            std::fs::write(
                &path,
                format!(
                    r#"
name = "rates"
kind = "fl"
[[datasets]]
dataset = "breast_cancer"
clients = 10
fraction = 0.5
local_steps = 1
local_batch = 0
local_lr = 0.5
rounds = 3
full_clip = 0.5
[grid]
schemes = ["std", "rnd", "cs"]
{axis}
dp = [false, true]
target_epsilon = 1.0
delta = 1e-5
rows = ["first", "random"]
compressors = [{{ kind = "dgc", rate = 16.0 }}, {{ kind = "powersgd", rank = 2 }}]
[profiles.cpu]
"#
                ),
            )
            .unwrap();
            FlExperiment::from_file(&path)
        };
        let by_rate = file("rates = [20.0, 10.0]").unwrap().cells("cpu").unwrap();
        let by_ratio = file("ratios = [0.05, 0.1]").unwrap().cells("cpu").unwrap();
        assert_eq!(by_rate, by_ratio);
        let names: Vec<&str> = by_rate.iter().map(|(_, n, _)| n.as_str()).collect();
        assert_eq!(
            &names[..9],
            [
                "std-r1",
                "rnd-r0.05",
                "rnd-r0.1",
                "cs-r0.05",
                "cs-r0.1",
                "cs-random-r0.05",
                "cs-random-r0.1",
                "dgc-x16",
                "powersgd-r2"
            ]
        );
        let (_, _, cs) = &by_rate[3];
        assert_eq!(cs.compression.kind(), CompressorKind::FlCs);
        assert_eq!(cs.compression.rate(), 20.0);
        assert_eq!(cs.compression.given.to_string(), "rate = 20.0\n");
        assert_eq!(
            by_rate[5].2.compression.given.to_string(),
            "rate = 20.0\nrows = \"random\"\n"
        );
        // S = S₁ √r of the private sketches.
        let (_, name, private) = &by_rate[12];
        assert_eq!(name, "cs-r0.05-dp");
        assert_eq!(private.privacy.unwrap().clip, 0.5 * 0.05f64.sqrt());
        let powersgd = &by_rate[8].2.compression;
        assert_eq!(
            (powersgd.kind(), powersgd.rank(), powersgd.rate()),
            (CompressorKind::Powersgd, 2, 1.0)
        );
        let err = file("rates = [20.0]\nratios = [0.05]")
            .unwrap()
            .cells("cpu")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("grid.ratios:"), "{err}");
        let err = file("rates = [0.5]")
            .unwrap()
            .cells("cpu")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("grid.rates: 0.5"), "{err}");
        let err = file("").unwrap().cells("cpu").unwrap_err().to_string();
        assert!(err.starts_with("grid.rates: missing"), "{err}");
    }
}
