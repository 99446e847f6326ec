//! Experiments as data: `experiments/<name>.toml` describes a grid of training runs (one figure
//! group of Lin 2022), and `dpcomp grid` runs every
//! cell, skipping finished ones and resuming interrupted ones, then writes the results table.
//!
//! ```toml
//! name = "surnames_dgc"
//! description = "Surnames x DGC: accuracy vs epsilon vs upstream bandwidth"
//! [base]                       # settings of every cell (any `dpcomp train` setting)
//! task = "surnames"
//! compressor = "dgc"
//! [grid]                       # axes: every combination is one cell
//! noise_multiplier = [0.0, 0.4, 0.8]
//! rate = [1.0, 16.0, 256.0]
//! [profiles.full]              # the paper's settings (a GPU)
//! epochs = 100
//! [profiles.cpu]               # what fits a 2-core CPU in 30 minutes, same code path
//! epochs = 10
//! ```
//!
//! A profile may add or replace axes in its own `grid` table (`[profiles.full.grid]` with
//! `seed = [0, 1, 2]`: three seeds in the paper-scale runs only); a `seed` axis makes the
//! results table report mean ± standard deviation over the seeds.
//!
//! An axis value may also be a table of settings with a `label` (e.g. `variant = [{ label =
//! "dgc", compressor = "dgc" }, { label = "denoise", compressor = "denoise" }]`): its settings
//! apply together and the label names the cell.
//!
//! A cell's settings are `base`, then the profile, then its grid values (later wins), resolved
//! like `dpcomp train --config` (paper defaults first). Runs go to
//! `<runs>/<name>/<profile>/<cell>/`, the table to `<runs>/<name>/<profile>/results.{csv,md}`.
//! A cell that finishes has its logs packed (`metrics.jsonl.gz`, `grad_error.jsonl.gz`:
//! `run_log`), which every reader of the cell reads as before.

use crate::cell_observer::{CellEvent, CellObserver};
pub use crate::results_table::mean_sd;
use crate::results_table::MarkdownTable;
use dpcomp::config::{TrainConfig, TrainOverrides};
use dpcomp::error::{Error, Result};
use dpcomp::train::checkpoint;
use dpcomp::train::metrics::Summary;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// A training grid file (`experiments/<name>.toml` without a `kind`), as in the example above.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    /// The experiment's name: its folder under the runs root (one plain path component).
    pub name: String,
    /// One line under the results table's title (optional).
    #[serde(default)]
    pub description: String,
    /// `[base]`: `dpcomp train` settings every cell shares.
    #[serde(default)]
    pub base: toml::Table,
    /// Axis name -> values; cells are the cartesian product, in file order of axes.
    #[serde(default)]
    pub grid: toml::Table,
    /// `[profiles.NAME]`: settings each profile adds over `base` (its own `grid` table adds or
    /// replaces axes).
    #[serde(default)]
    pub profiles: BTreeMap<String, toml::Table>,
}

/// One run of a grid: its name (axis=value pairs), its values and its resolved configuration.
#[derive(Debug, Clone)]
pub struct Cell {
    /// `axis-value` pairs joined by `_` ("noise_multiplier-0.8_rate-16"): its folder name.
    pub name: String,
    /// The cell's value of every axis, in the grid's axis order.
    pub values: Vec<(String, toml::Value)>,
    /// The cell's full training configuration (base, then profile, then its values).
    pub config: TrainConfig,
}

/// What a finished cell reports (one row of the results table).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    /// The cell's name.
    pub cell: String,
    /// The task trained (`surnames`, `cifar10`, ...).
    pub task: String,
    /// σ (0 without noise).
    pub noise_multiplier: f64,
    /// ε at the configuration's δ; `None` = ∞ (σ = 0).
    pub epsilon: Option<f64>,
    /// δ of the configuration.
    pub delta: f64,
    /// The compression label (`TrainConfig::compression_label`: "dgc x256", "powersgd r1", ...).
    pub compressor: String,
    /// The compression rate setting (1 for compressors that take none).
    pub rate: f64,
    /// PowerSGD's rank setting (1 for the other compressors).
    pub rank: i64,
    /// The cell's training seed.
    pub seed: u64,
    /// Exact wire bits / 10^9.
    pub upstream_gigabits: f64,
    /// The paper's unit: 64 bits per transmitted element / 8 / 2^30 (its "Gb").
    pub upstream_paper_gib: f64,
    /// Mean test accuracy in [0, 1] of the last min(10, epochs) epochs (`Summary::final_accuracy`).
    pub final_accuracy: f64,
    /// Epochs trained.
    pub epochs: usize,
    /// Wall-clock seconds of the training.
    pub wall_seconds: f64,
    /// The first epoch whose training loss was not finite (the run diverged), if any.
    pub diverged_at: Option<usize>,
}

impl Experiment {
    /// Reads a training grid file; an error names the file and what is wrong (unknown keys, a
    /// name or profile that is not one folder name, an empty axis, an axis table without
    /// `label`).
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let table: toml::Table =
            toml::from_str(&text).map_err(|e| Error::bad_file(path, e.to_string()))?;
        Self::from_table(table, path)
    }

    /// The grid of an experiment file already parsed (`path` names it in errors): what kinds
    /// built on training cells (`audit_experiment`) call with their own keys taken out.
    pub(crate) fn from_table(table: toml::Table, path: &Path) -> Result<Self> {
        let experiment: Experiment = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| Error::bad_file(path, e.to_string()))?;
        // Names become folders under --runs: each must be one plain path component.
        path_component(&experiment.name)
            .map_err(|what| Error::bad_file(path, format!("name {:?}: {what}", experiment.name)))?;
        for profile in experiment.profiles.keys() {
            path_component(profile)
                .map_err(|what| Error::bad_file(path, format!("profile {profile:?}: {what}")))?;
        }
        for (axis, values) in &experiment.grid {
            let Some(values) = values.as_array().filter(|a| !a.is_empty()) else {
                return Err(Error::bad_file(
                    path,
                    format!("grid.{axis}: expected a non-empty array of values"),
                ));
            };
            let unlabelled = values
                .iter()
                .any(|v| v.as_table().is_some_and(|t| !t.contains_key("label")));
            if unlabelled {
                return Err(Error::bad_file(
                    path,
                    format!("grid.{axis}: a table of settings needs a label (its cells' name)"),
                ));
            }
            for label in values.iter().filter_map(|v| v.get("label")) {
                let text = label.as_str().unwrap_or_default();
                path_component(text).map_err(|what| {
                    Error::bad_file(path, format!("grid.{axis}: label {label}: {what}"))
                })?;
            }
        }
        Ok(experiment)
    }

    /// Every cell of `profile`, in order, with `only` (axis, value) filters applied.
    pub fn cells(&self, profile: &str, only: &[(String, String)]) -> Result<Vec<Cell>> {
        let overrides = self
            .profiles
            .get(profile)
            .ok_or_else(|| unknown_profile(&self.name, profile, self.profiles.keys()))?;
        let profile_axes = overrides.get("grid").and_then(|g| g.as_table());
        for (axis, _) in only {
            if !self.grid.contains_key(axis) && !profile_axes.is_some_and(|g| g.contains_key(axis))
            {
                return Err(Error::bad_value(
                    "only",
                    format!(
                        "{axis} is not an axis of {}; axes: {}",
                        self.name,
                        self.grid.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
        }
        // A profile may add axes or replace an axis's values (`[profiles.full.grid]`, e.g.
        // seeds only in the full profile); its other keys are settings.
        let mut overrides = overrides.clone();
        let mut grid = self.grid.clone();
        if let Some(extra) = overrides.remove("grid") {
            let Some(extra) = extra.as_table().filter(|t| {
                t.values()
                    .all(|v| v.as_array().is_some_and(|a| !a.is_empty()))
            }) else {
                return Err(Error::bad_value(
                    format!("{} profile {profile}", self.name),
                    "grid: expected a table of non-empty arrays (axis = [values])",
                ));
            };
            for (axis, values) in extra {
                grid.insert(axis.clone(), values.clone());
            }
        }
        // A value no cell has would select nothing and "finish" with 0 cells: an error
        // listing the axis's values.
        for (axis, wanted) in only {
            let values = grid[axis].as_array().expect("checked in from_file");
            if !values.iter().any(|v| same_value(v, wanted)) {
                let shown: Vec<String> = values
                    .iter()
                    .map(|v| match v {
                        toml::Value::Table(t) => t
                            .get("label")
                            .and_then(|l| l.as_str())
                            .unwrap_or("?")
                            .to_string(),
                        toml::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    })
                    .collect();
                return Err(Error::bad_value(
                    "only",
                    format!(
                        "{axis}={wanted}: no cell of {} profile {profile} has it; {axis} takes {}",
                        self.name,
                        shown.join(", ")
                    ),
                ));
            }
        }
        let mut combos: Vec<Vec<(String, toml::Value)>> = vec![Vec::new()];
        for (axis, values) in &grid {
            let values = values.as_array().expect("checked in from_file");
            combos = combos
                .into_iter()
                .flat_map(|prefix| {
                    values.iter().map(move |v| {
                        let mut next = prefix.clone();
                        next.push((axis.clone(), v.clone()));
                        next
                    })
                })
                .collect();
        }
        let mut cells = Vec::new();
        // Names already taken (a set: a grid of a million cells checks each in O(1)).
        let mut names = std::collections::HashSet::new();
        for values in combos {
            let keep = only.iter().all(|(axis, wanted)| {
                values
                    .iter()
                    .any(|(a, v)| a == axis && same_value(v, wanted))
            });
            if !keep {
                continue;
            }
            let mut table = self.base.clone();
            table.extend(overrides.clone());
            for (axis, value) in &values {
                match value {
                    // A table is a bundle of settings named by its `label`.
                    toml::Value::Table(bundle) => table.extend(
                        bundle
                            .iter()
                            .filter(|(k, _)| k.as_str() != "label")
                            .map(|(k, v)| (k.clone(), v.clone())),
                    ),
                    v => {
                        table.insert(axis.clone(), v.clone());
                    }
                }
            }
            let name = cell_name(&values);
            let settings =
                TrainOverrides::from_table(table, &format!("{} cell {name}", self.name))?;
            let config = crate::tasks::resolve(settings).map_err(|e| {
                Error::bad_value(format!("{} cell {name}", self.name), e.to_string())
            })?;
            path_component(&name)
                .map_err(|what| Error::bad_value(format!("{} cell {name:?}", self.name), what))?;
            if !names.insert(name.clone()) {
                return Err(Error::bad_value(
                    format!("{} profile {profile}", self.name),
                    format!("cell {name} appears twice (a value repeated on an axis?): each cell must be distinct"),
                ));
            }
            cells.push(Cell {
                name,
                values,
                config,
            });
        }
        Ok(cells)
    }
}

/// Checks that `name` can be a folder name on its own: not empty, not `.` or `..`, without path
/// separators or control characters (so `name = "../../x"` cannot write outside `--runs`).
pub(crate) fn path_component(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() || name == "." || name == ".." {
        return Err("expected a non-empty folder name other than . and ..".into());
    }
    if name
        .chars()
        .any(|c| c == '/' || c == '\\' || c.is_control())
    {
        return Err("expected a single folder name, without / or \\ or control characters".into());
    }
    Ok(())
}

/// Whether a grid value equals the text given to `--only` (numbers compare numerically).
fn same_value(value: &toml::Value, text: &str) -> bool {
    match value {
        toml::Value::Float(f) => text.parse::<f64>().is_ok_and(|t| t == *f),
        toml::Value::Integer(i) => text.parse::<f64>().is_ok_and(|t| t == *i as f64),
        toml::Value::String(s) => s == text,
        toml::Value::Table(t) => t.get("label").and_then(|l| l.as_str()) == Some(text),
        other => other.to_string() == text,
    }
}

/// "noise_multiplier-0.8_rate-16": axis-value pairs, safe as a folder name.
pub(crate) fn cell_name(values: &[(String, toml::Value)]) -> String {
    if values.is_empty() {
        return "single".to_string();
    }
    values
        .iter()
        .map(|(axis, v)| {
            let text = match v {
                toml::Value::Float(f) => format!("{f}"),
                toml::Value::Table(t) => t
                    .get("label")
                    .and_then(|l| l.as_str())
                    .unwrap_or("unlabelled")
                    .to_string(),
                toml::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let text: String = text
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            format!("{axis}-{text}")
        })
        .collect::<Vec<_>>()
        .join("_")
}

/// Where a finished, interrupted or new cell stands.
#[derive(Debug, PartialEq)]
pub enum CellState {
    /// Trained to its epochs, or stopped early by the run (`Summary::stopped`): skipped.
    Finished,
    /// A checkpoint short of its epochs: resumed.
    Interrupted {
        /// Epochs the checkpoint holds.
        epochs_done: usize,
    },
    /// No run in its folder yet: started.
    New,
}

/// Where the cell in `dir` stands. A finished cell may have been committed without its
/// checkpoint (`experiments/runs/` keeps `config.toml`, `summary.json` and the packed logs
/// `metrics.jsonl.gz` and `grad_error.jsonl.gz` of finished cells, so grids resume across
/// machines): a summary that covers every epoch of a matching configuration is finished too.
pub fn cell_state(dir: &Path, config: &TrainConfig) -> Result<CellState> {
    let found = checkpoint::find(dir);
    if found.is_none() && !dir.join("summary.json").is_file() {
        return Ok(CellState::New);
    }
    let saved = crate::tasks::config_from_file(&dir.join("config.toml"))?;
    let mut comparable = saved.clone();
    comparable.epochs = config.epochs;
    // A run records the data folder it resolved; where the data lives is not a setting.
    comparable.data.data_dir = config.data.data_dir.clone();
    // A target ε is met by the σ the run calibrated and recorded beside it.
    if config.privacy.target_epsilon.is_some() && config.privacy.noise_multiplier.is_none() {
        comparable.privacy.noise_multiplier = None;
    }
    if &comparable != config {
        return Err(Error::bad_value(
            "grid",
            format!(
                "{} holds a run with other settings than this cell's (experiment file changed?); move it away to rerun",
                dir.display()
            ),
        ));
    }
    let Some(found) = found else {
        let path = dir.join("summary.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let summary: Summary =
            serde_json::from_str(&text).map_err(|e| Error::bad_file(&path, e.to_string()))?;
        if summary.epochs >= config.epochs || summary.stopped.is_some() {
            return Ok(CellState::Finished);
        }
        return Err(Error::bad_value(
            "grid",
            format!(
                "{} has a summary of {} epochs but no checkpoint to continue to {}; move it away to rerun",
                dir.display(),
                summary.epochs,
                config.epochs
            ),
        ));
    };
    let state = checkpoint::read_state(&found)?;
    let trained = state.epochs_done >= config.epochs || state.stopped.is_some();
    if trained && dir.join("summary.json").is_file() {
        return Ok(CellState::Finished);
    }
    Ok(CellState::Interrupted {
        epochs_done: state.epochs_done,
    })
}

/// Runs every cell (skipping finished ones, resuming interrupted ones), then writes the results
/// table. `observer` hears of each cell and gives its trainer's observers. Returns the rows of
/// all finished cells.
pub fn run(
    experiment: &Experiment,
    profile: &str,
    only: &[(String, String)],
    runs_root: &Path,
    observer: &mut dyn CellObserver,
) -> Result<Vec<Row>> {
    let cells = experiment.cells(profile, only)?;
    let root = runs_root.join(&experiment.name).join(profile);
    std::fs::create_dir_all(&root).map_err(|e| Error::io(&root, e))?;
    for (i, cell) in cells.iter().enumerate() {
        let dir = root.join(&cell.name);
        let state = cell_state(&dir, &cell.config)?;
        let mut tell = |event: CellEvent<'_>| {
            observer.cell(&experiment.name, i, cells.len(), &cell.name, event)
        };
        let trainer = match state {
            CellState::Finished => {
                tell(CellEvent::Skipped);
                continue;
            }
            CellState::Interrupted { epochs_done } => {
                tell(CellEvent::Resuming { epochs_done });
                crate::tasks::resume(&dir, Some(cell.config.epochs))
            }
            CellState::New => {
                tell(CellEvent::Starting);
                crate::tasks::start(cell.config.clone(), &dir)
            }
        };
        // Another worker is training this cell: leave it to them (workers may share a grid).
        let mut trainer = match trainer {
            Err(Error::RunInUse { owner, .. }) => {
                tell(CellEvent::InUse { owner: &owner });
                continue;
            }
            other => other?,
        };
        for o in observer.trainer_observers() {
            trainer.observe(o);
        }
        crate::analysis::probe::GradientErrorProbe::install(&mut trainer);
        trainer.run()?;
        // The finished cell's logs are packed once its lock is released with the trainer.
        drop(trainer);
        dpcomp::run_log::pack_run(&dir)?;
        observer.cell(
            &experiment.name,
            i,
            cells.len(),
            &cell.name,
            CellEvent::Finished { result: None },
        );
    }
    write_results(experiment, profile, runs_root)?;
    collect(&root, &cells)
}

/// Writes `results.{csv,md}` of every finished cell of the profile (not only those a `--only`
/// run selected: workers running disjoint parts of one grid each leave the whole table), and
/// returns its rows. Trains nothing.
pub fn write_results(experiment: &Experiment, profile: &str, runs_root: &Path) -> Result<Vec<Row>> {
    let root = runs_root.join(&experiment.name).join(profile);
    std::fs::create_dir_all(&root).map_err(|e| Error::io(&root, e))?;
    let rows = collect(&root, &experiment.cells(profile, &[])?)?;
    write_tables(&root, experiment, profile, &rows)?;
    Ok(rows)
}

/// The rows of the cells that have finished.
pub(crate) fn collect(root: &Path, cells: &[Cell]) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for cell in cells {
        let path = root.join(&cell.name).join("summary.json");
        if !path.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let summary: Summary =
            serde_json::from_str(&text).map_err(|e| Error::bad_file(&path, e.to_string()))?;
        let c = &cell.config;
        rows.push(Row {
            cell: cell.name.clone(),
            task: c.task.to_string(),
            // The σ the run used: a target ε's calibrated one, which the cell does not name.
            noise_multiplier: summary
                .noise_multiplier
                .or(c.privacy.noise_multiplier)
                .unwrap_or(0.0),
            epsilon: summary.epsilon.filter(|e| e.is_finite()),
            delta: c.privacy.delta,
            compressor: c.compression_label()?,
            rate: c.compression.rate(),
            rank: c.compression.rank(),
            seed: c.seed,
            upstream_gigabits: summary.upstream_gigabits,
            upstream_paper_gib: summary.upstream_paper_gib,
            final_accuracy: summary.final_accuracy,
            epochs: summary.epochs,
            wall_seconds: summary.wall_seconds,
            diverged_at: dpcomp::train::metrics::read(
                &root.join(&cell.name).join("metrics.jsonl"),
            )?
            .iter()
            .find(|m| !m.train_loss.is_finite())
            .map(|m| m.epoch),
        });
    }
    Ok(rows)
}

fn write_tables(root: &Path, experiment: &Experiment, profile: &str, rows: &[Row]) -> Result<()> {
    let header = [
        "cell",
        "task",
        "noise_multiplier",
        "epsilon",
        "delta",
        "compressor",
        "rate",
        "rank",
        "seed",
        "upstream_gigabits",
        "upstream_paper_gib",
        "final_accuracy",
        "epochs",
        "wall_seconds",
    ];
    let csv_rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.cell.clone(),
                r.task.clone(),
                r.noise_multiplier.to_string(),
                r.epsilon.map_or("inf".to_string(), |e| e.to_string()),
                r.delta.to_string(),
                r.compressor.clone(),
                r.rate.to_string(),
                r.rank.to_string(),
                r.seed.to_string(),
                r.upstream_gigabits.to_string(),
                r.upstream_paper_gib.to_string(),
                r.final_accuracy.to_string(),
                r.epochs.to_string(),
                r.wall_seconds.to_string(),
            ]
        })
        .collect();
    crate::csv_table::write(&root.join("results.csv"), &header, &csv_rows)?;
    let mut table = MarkdownTable::new(&[
        "cell",
        "task",
        "σ",
        "ε",
        "compressor",
        "upstream Gb",
        "paper's Gb",
        "final accuracy",
        "seeds",
        "diverged",
        "epochs",
        "wall per run",
    ]);
    for group in seed_groups(rows) {
        let r = group[0];
        let accuracy = mean_sd(&group.iter().map(|r| r.final_accuracy).collect::<Vec<_>>());
        let wall = group.iter().map(|r| r.wall_seconds).sum::<f64>() / group.len() as f64;
        let diverged: Vec<String> = group
            .iter()
            .filter_map(|r| {
                r.diverged_at
                    .map(|e| format!("seed {} (epoch {e})", r.seed))
            })
            .collect();
        table.row(vec![
            without_seed(&r.cell),
            r.task.clone(),
            r.noise_multiplier.to_string(),
            r.epsilon.map_or("∞".to_string(), |e| format!("{e:.2}")),
            r.compressor.clone(),
            format!("{:.4}", r.upstream_gigabits),
            format!("{:.4}", r.upstream_paper_gib),
            match accuracy.1 {
                Some(sd) => format!("{:.2} ± {:.2}%", 100.0 * accuracy.0, 100.0 * sd),
                None => format!("{:.2}%", 100.0 * accuracy.0),
            },
            group.len().to_string(),
            if diverged.is_empty() {
                "-".to_string()
            } else {
                diverged.join(", ")
            },
            r.epochs.to_string(),
            format!("{wall:.0} s"),
        ]);
    }
    let md = format!(
        "# {} ({profile} profile)\n\n{}\n\nFinal accuracy = mean test accuracy of the last min(10, epochs) epochs; with several seeds, their mean ± sample standard deviation (n seeds). Upstream = what one worker sent over the run: exact wire bits / 10^9 (Gb), and the paper's unit (64 bits per transmitted element / 8 / 2^30, its \"Gb\"). Diverged = seeds whose training loss became NaN (epoch), included in the mean.\n\n{}",
        experiment.name,
        experiment.description,
        table.render()
    );
    let path = root.join("results.md");
    std::fs::write(&path, md).map_err(|e| Error::io(&path, e))
}

/// The cell name without its `seed-N` part: cells that differ only in their seed share it.
pub fn without_seed(cell: &str) -> String {
    cell.split('_')
        .filter(|part| !part.starts_with("seed-"))
        .collect::<Vec<_>>()
        .join("_")
}

/// Rows grouped by `without_seed` of their cell, groups in the order of their first row.
pub(crate) fn seed_groups(rows: &[Row]) -> Vec<Vec<&Row>> {
    let mut groups: Vec<(String, Vec<&Row>)> = Vec::new();
    for r in rows {
        let key = without_seed(&r.cell);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, g)) => g.push(r),
            None => groups.push((key, vec![r])),
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

/// What each cell will upload (`train::upload::estimate`), loading each task's data and model once.
pub fn upload_estimates(cells: &[Cell]) -> Vec<Result<dpcomp::train::upload::Upload>> {
    use std::collections::HashMap;
    // The data and model of each task (and data subset), loaded once; and each estimate, made
    // once for the settings it depends on: cells that differ in a seed or another setting the
    // upload does not depend on share it (a grid of a million cells encodes a few updates).
    let mut known: HashMap<String, (i64, Vec<Vec<i64>>)> = HashMap::new();
    let mut estimated: HashMap<String, dpcomp::train::upload::Upload> = HashMap::new();
    cells
        .iter()
        .map(|cell| {
            let c = &cell.config;
            let key = format!("{}|{:?}|{:?}", c.task, c.data.limit_train, c.data.data_dir);
            let settings = format!(
                "{key}|{:?}|{}|{}",
                c.compression, c.optimizer.batch_size, c.epochs
            );
            if let Some(upload) = estimated.get(&settings) {
                return Ok(*upload);
            }
            if !known.contains_key(&key) {
                let data = crate::tasks::load_data(c)?;
                let model = crate::tasks::build_model(
                    crate::tasks::Task::of(c)?,
                    data.classes.len() as i64,
                    tch::Device::Cpu,
                    &c.model.bert_dir,
                    &c.model.fine_tuning_mode()?,
                )?;
                let shapes = model
                    .trainable_variables()
                    .iter()
                    .map(|(_, t)| t.size())
                    .collect();
                known.insert(key.clone(), (data.train.len(), shapes));
            }
            let (n, shapes) = &known[&key];
            let upload = dpcomp::train::upload::estimate(c, *n, shapes)?;
            estimated.insert(settings, upload);
            Ok(upload)
        })
        .collect()
}

/// `key=value` → (key, value).
pub fn parse_only(items: &[String]) -> Result<Vec<(String, String)>> {
    items
        .iter()
        .map(|item| {
            item.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .ok_or_else(|| Error::bad_value("only", format!("{item:?}: expected axis=value")))
        })
        .collect()
}

/// The error for a profile that experiment `name` does not have, listing the ones it has.
pub(crate) fn unknown_profile<'a>(
    name: &str,
    profile: &str,
    known: impl Iterator<Item = &'a String>,
) -> Error {
    let known: Vec<&str> = known.map(String::as_str).collect();
    Error::bad_value(
        "profile",
        format!(
            "{profile}: experiment {name} has profiles {}",
            known.join(", ")
        ),
    )
}

/// The `kind` of an experiment file (`"convex"`, `"fl"`), `None` for the deep-learning grids.
pub(crate) fn experiment_kind(path: &Path) -> Result<Option<String>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let table: toml::Table =
        toml::from_str(&text).map_err(|e| Error::bad_file(path, e.to_string()))?;
    Ok(table
        .get("kind")
        .and_then(|k| k.as_str())
        .map(str::to_string))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cell: &str, seed: u64, accuracy: f64) -> Row {
        Row {
            cell: cell.to_string(),
            task: "surnames".into(),
            noise_multiplier: 0.4,
            epsilon: Some(50.9),
            delta: 8e-5,
            compressor: "dgc x16".into(),
            rate: 16.0,
            rank: 1,
            seed,
            upstream_gigabits: 23.7,
            upstream_paper_gib: 2.76,
            final_accuracy: accuracy,
            epochs: 100,
            wall_seconds: 300.0,
            diverged_at: None,
        }
    }

    #[test]
    fn seeds_of_a_cell_are_one_row_with_mean_and_sample_sd() {
        let rows = vec![
            row("noise_multiplier-0.4_rate-16_seed-0", 0, 0.50),
            row("noise_multiplier-0.4_rate-16_seed-1", 1, 0.52),
            Row {
                diverged_at: Some(12),
                ..row("noise_multiplier-0.4_rate-256_seed-0", 0, 0.40)
            },
            row("noise_multiplier-0.4_rate-16_seed-2", 2, 0.54),
        ];
        let groups = seed_groups(&rows);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].len(), 3);
        assert_eq!(groups[1].len(), 1);
        let (mean, sd) = mean_sd(&[0.50, 0.52, 0.54]);
        assert!((mean - 0.52).abs() < 1e-12);
        assert!((sd.unwrap() - 0.02).abs() < 1e-12);
        assert_eq!(mean_sd(&[0.4]), (0.4, None));

        let dir = tempfile::tempdir().unwrap();
        let experiment: Experiment = toml::from_str("name = \"x\"\ndescription = \"d\"\n").unwrap();
        write_tables(dir.path(), &experiment, "full", &rows).unwrap();
        let md = std::fs::read_to_string(dir.path().join("results.md")).unwrap();
        assert!(md.contains("| 52.00 ± 2.00% | 3 | - |"), "{md}");
        assert!(md.contains("| 40.00% | 1 | seed 0 (epoch 12) |"), "{md}");
        assert!(md.contains("| 23.7000 | 2.7600 |"), "{md}");
        assert!(
            md.contains("| noise_multiplier-0.4_rate-16 | surnames |"),
            "{md}"
        );
        let csv = std::fs::read_to_string(dir.path().join("results.csv")).unwrap();
        assert_eq!(csv.lines().count(), 5, "every seed keeps its own csv row");
        assert!(csv
            .lines()
            .next()
            .unwrap()
            .contains("seed,upstream_gigabits,upstream_paper_gib"));
    }
}
