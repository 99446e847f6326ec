//! The convex experiment (`experiments/convex.toml`, `kind = "convex"`, run by `dpcomp grid`):
//! excess empirical risk and test accuracy against ε for every data set x loss x algorithm, over
//! many seeds (mean and standard deviation), as a results table and one figure per data set.
//! The paper (Wang et al. 2022) has no experiments: these are ours.
//!
//! Non-private SGD does not depend on ε: it is run once per (data, loss) and drawn as a flat
//! reference. A setting whose calibration fails (Theorem 11 without a feasible β) is a row
//! marked infeasible, not a number.

use super::{run_seeds, Algorithm, Calibration, ConvexReport, ConvexSettings};
use crate::cell_observer::{CellEvent, CellObserver};
use crate::results_table::MarkdownTable;
use dpcomp::data::preprocess::{self, Preprocess, Scaling};
use dpcomp::error::{Error, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// A convex experiment file (`experiments/convex.toml`): settings every cell shares, the axes
/// of the grid, and the profiles (seed counts) it can run at.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConvexExperiment {
    /// The experiment's name: its results folder (`runs/<name>/<profile>`) and table title.
    pub name: String,
    /// Always "convex" (what routes the file here).
    pub kind: String,
    /// One line under the results table's title (optional).
    #[serde(default)]
    pub description: String,
    /// `[base]`: the settings every cell shares.
    pub base: Base,
    /// `[grid]`: the axes, every combination a cell.
    pub grid: Grid,
    /// `[profiles.NAME]`: how many seeds each profile runs.
    pub profiles: BTreeMap<String, Profile>,
}

/// A convex experiment's `[base]` settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Base {
    /// R of the domain B(0, R) (`ConvexSettings::radius`).
    pub radius: f64,
    /// δ of every private cell; absent: 1/n².
    #[serde(default)]
    pub delta: Option<f64>,
    /// T of every cell; absent: the paper's schedule.
    #[serde(default)]
    pub steps: Option<u64>,
    /// η of every cell; absent: the paper's schedule.
    #[serde(default)]
    pub step_size: Option<f64>,
    /// How tabular features are scaled (`convex::preprocess`): `private` (default; its share of
    /// ε and δ charged to each cell), `public` or `train-statistics` (not private).
    #[serde(default = "default_preprocess")]
    pub preprocess: Preprocess,
    /// The share of each cell's ε and δ a `private` scaling spends (default `DEFAULT_SHARE`).
    #[serde(default = "default_share")]
    pub preprocess_share: f64,
    /// B, the row clip of a `private` scaling's mean (default `DEFAULT_CLIP`).
    #[serde(default = "default_clip")]
    pub preprocess_clip: f64,
}

fn default_preprocess() -> Preprocess {
    Preprocess::Private
}
fn default_share() -> f64 {
    preprocess::DEFAULT_SHARE
}
fn default_clip() -> f64 {
    preprocess::DEFAULT_CLIP
}

impl Base {
    /// The scaling of a cell at target `epsilon` (`None`: non-private SGD, which has no budget
    /// to charge: it scales by the training statistics, as any non-private baseline would).
    pub fn scaling(&self, epsilon: Option<f64>) -> Scaling {
        scaling(
            self.preprocess,
            self.preprocess_share,
            self.preprocess_clip,
            epsilon,
            self.delta,
        )
    }
}

/// The `Scaling` a run with this preprocessing and budget loads its data with; `epsilon`
/// `None` (non-private) turns `private` into `train-statistics` (nothing to charge it to).
pub fn scaling(
    preprocess: Preprocess,
    share: f64,
    clip: f64,
    epsilon: Option<f64>,
    delta: Option<f64>,
) -> Scaling {
    match (preprocess, epsilon) {
        (Preprocess::Public, _) => Scaling::Public,
        (Preprocess::TrainStatistics, _) | (Preprocess::Private, None) => Scaling::TrainStatistics,
        (Preprocess::Private, Some(epsilon)) => Scaling::Private {
            share,
            clip,
            epsilon,
            delta,
            seed: 0,
        },
    }
}

/// A convex experiment's `[grid]`: every data x loss x algorithm x ε is a cell (non-private
/// SGD once per data and loss).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grid {
    /// `breast_cancer`, `csv:PATH`, `synthetic:N:D`.
    pub data: Vec<String>,
    /// Losses as `Loss::parse` reads them (`hinge`, `qhinge:1.5`, `logistic`, `least_squares`).
    pub loss: Vec<String>,
    /// `output`, `gradient`, `nonprivate`.
    pub algorithm: Vec<Algorithm>,
    /// The target ε of the private cells.
    pub epsilon: Vec<f64>,
}

/// A convex experiment's `[profiles.NAME]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Seeds 0..seeds run per cell (mean and standard deviation over them).
    pub seeds: u64,
}

/// One row: a setting's mean and spread over the seeds.
#[derive(Debug, Clone)]
pub struct Row {
    /// The grid's data entry.
    pub data: String,
    /// The grid's loss entry.
    pub loss: String,
    /// The cell's algorithm.
    pub algorithm: Algorithm,
    /// `None` for non-private SGD.
    pub epsilon: Option<f64>,
    /// Seeds averaged (0 when infeasible).
    pub seeds: usize,
    /// Why there is no result (an infeasible calibration).
    pub infeasible: Option<String>,
    /// Excess empirical risk, (mean, sample standard deviation) over the seeds (NaN when
    /// infeasible).
    pub excess_risk: (f64, f64),
    /// Test accuracy in [0, 1], (mean, sample standard deviation) over the seeds.
    pub test_accuracy: (f64, f64),
    /// σ of the cell's noise (`ConvexReport::sigma`).
    pub sigma: Option<f64>,
    /// T, the SGD steps of each seed's run.
    pub steps: u64,
}

impl ConvexExperiment {
    /// Reads a `kind = "convex"` file; an error names the file and what is wrong (unknown keys,
    /// another kind).
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let e: ConvexExperiment =
            toml::from_str(&text).map_err(|e| Error::bad_file(path, e.to_string()))?;
        if e.kind != "convex" {
            return Err(Error::bad_file(path, "kind: expected \"convex\""));
        }
        Ok(e)
    }
}

/// Runs every setting of `profile`, writes `results.{csv,md}` under `out_dir`, and returns the
/// rows (`experiment::ExperimentFile::run` then draws the figures). `data_dir` is where
/// `breast_cancer` is read from; `observer` hears of each setting as it finishes, with its
/// result line.
pub fn run(
    experiment: &ConvexExperiment,
    profile: &str,
    data_dir: Option<&Path>,
    out_dir: &Path,
    observer: &mut dyn CellObserver,
) -> Result<Vec<Row>> {
    let profile_settings = experiment.profiles.get(profile).ok_or_else(|| {
        crate::grid::unknown_profile(&experiment.name, profile, experiment.profiles.keys())
    })?;
    // One writer per results folder (see `run_lock`), held until the tables are written.
    let _lock = dpcomp::run_lock::RunLock::acquire(out_dir)?;
    let seeds: Vec<u64> = (0..profile_settings.seeds).collect();
    let settings_count = settings_count(experiment);
    let mut rows = Vec::new();
    for data_spec in &experiment.grid.data {
        for loss_spec in &experiment.grid.loss {
            let loss = super::loss::Loss::parse(loss_spec)?;
            for &algorithm in &experiment.grid.algorithm {
                let epsilons: Vec<Option<f64>> = if algorithm == Algorithm::Nonprivate {
                    vec![None]
                } else {
                    experiment.grid.epsilon.iter().map(|&e| Some(e)).collect()
                };
                for epsilon in epsilons {
                    // Scaled per cell: a private scaling spends a share of this cell's ε.
                    let data = dpcomp::data::tabular::named(
                        data_spec,
                        data_dir,
                        &experiment
                            .base
                            .scaling(epsilon.filter(|_| algorithm != Algorithm::Nonprivate)),
                    )
                    .map_err(|e| Error::bad_value("grid.data", e.to_string()))?;
                    let settings = ConvexSettings {
                        loss,
                        algorithm,
                        calibration: Calibration::Theorem11,
                        epsilon: epsilon.unwrap_or(1.0),
                        delta: experiment.base.delta,
                        radius: experiment.base.radius,
                        unbounded: false,
                        steps: experiment.base.steps,
                        step_size: experiment.base.step_size,
                        seed: 0,
                    };
                    let row = match run_seeds(&data, &settings, &seeds) {
                        Ok(reports) => summarise(data_spec, loss_spec, epsilon, &reports),
                        Err(e) => Row {
                            data: data_spec.clone(),
                            loss: loss_spec.clone(),
                            algorithm,
                            epsilon,
                            seeds: 0,
                            infeasible: Some(e.to_string()),
                            excess_risk: (f64::NAN, f64::NAN),
                            test_accuracy: (f64::NAN, f64::NAN),
                            sigma: None,
                            steps: 0,
                        },
                    };
                    let name = format!(
                        "{} {} {:?} epsilon {}",
                        row.data,
                        row.loss,
                        row.algorithm,
                        row.epsilon.map_or("-".into(), |e| e.to_string()),
                    );
                    let result = format!(
                        "excess risk {:.4} ± {:.4}, test accuracy {:.2}% ± {:.2}{}",
                        row.excess_risk.0,
                        row.excess_risk.1,
                        100.0 * row.test_accuracy.0,
                        100.0 * row.test_accuracy.1,
                        row.infeasible
                            .as_ref()
                            .map_or(String::new(), |_| " (infeasible)".into())
                    );
                    observer.cell(
                        &experiment.name,
                        rows.len(),
                        settings_count,
                        &name,
                        CellEvent::Finished {
                            result: Some(&result),
                        },
                    );
                    rows.push(row);
                }
            }
        }
    }
    std::fs::create_dir_all(out_dir).map_err(|e| Error::io(out_dir, e))?;
    write_tables(experiment, profile, &rows, out_dir)?;
    Ok(rows)
}

/// How many settings (rows) `run` makes: every data x loss x algorithm, each private algorithm
/// at every ε, the non-private one once.
fn settings_count(experiment: &ConvexExperiment) -> usize {
    let per_loss: usize = experiment
        .grid
        .algorithm
        .iter()
        .map(|&a| {
            if a == Algorithm::Nonprivate {
                1
            } else {
                experiment.grid.epsilon.len()
            }
        })
        .sum();
    experiment.grid.data.len() * experiment.grid.loss.len() * per_loss
}

/// The mean and sample standard deviation, the deviation 0 for a single seed.
fn mean_and_sd(values: &[f64]) -> (f64, f64) {
    let (mean, sd) = crate::results_table::mean_sd(values);
    (mean, sd.unwrap_or(0.0))
}

fn summarise(data: &str, loss: &str, epsilon: Option<f64>, reports: &[ConvexReport]) -> Row {
    let excess: Vec<f64> = reports.iter().map(|r| r.excess_empirical_risk).collect();
    let accuracy: Vec<f64> = reports.iter().map(|r| r.test_accuracy).collect();
    Row {
        data: data.to_string(),
        loss: loss.to_string(),
        algorithm: reports[0].algorithm,
        epsilon,
        seeds: reports.len(),
        infeasible: None,
        excess_risk: mean_and_sd(&excess),
        test_accuracy: mean_and_sd(&accuracy),
        sigma: reports[0].sigma,
        steps: reports[0].steps,
    }
}

/// Writes `results.{csv,md}` of `rows` under `out` (as `run` does; `read_rows` reads the CSV
/// back, so the tables can be rewritten from a committed `results.csv`).
pub fn write_tables(
    experiment: &ConvexExperiment,
    profile: &str,
    rows: &[Row],
    out: &Path,
) -> Result<()> {
    let mut csv_rows = Vec::new();
    let base = &experiment.base;
    let preprocessing = match base.preprocess {
        Preprocess::Private => format!(
            "private: ln(max(x, 10⁻³)) per feature, centred by a Gaussian-mechanism mean (rows clipped to {}) that spends {} of each cell's ε and δ, included in the cell's ε; one noise draw shared by a cell's seeds; non-private SGD centres and scales by the training statistics",
            base.preprocess_clip, base.preprocess_share
        ),
        Preprocess::Public => "public: ln(max(x, 10⁻³)) per feature, no statistics, no privacy cost".to_string(),
        Preprocess::TrainStatistics => "train-statistics: standardised by the training rows' own mean and deviation, NOT covered by ε".to_string(),
    };
    let mut table = MarkdownTable::new(&[
        "data",
        "loss",
        "algorithm",
        "ε",
        "T",
        "σ",
        "excess empirical risk",
        "test accuracy",
    ]);
    for r in rows {
        let eps = r.epsilon.map_or("-".to_string(), |e| e.to_string());
        let sigma = r.sigma.map_or(String::new(), |s| format!("{s:.4e}"));
        csv_rows.push(vec![
            r.data.clone(),
            r.loss.clone(),
            format!("{:?}", r.algorithm),
            eps.clone(),
            r.seeds.to_string(),
            r.steps.to_string(),
            sigma.clone(),
            r.excess_risk.0.to_string(),
            r.excess_risk.1.to_string(),
            r.test_accuracy.0.to_string(),
            r.test_accuracy.1.to_string(),
            r.infeasible.is_some().to_string(),
        ]);
        let (risk, acc) = if r.infeasible.is_some() {
            ("no feasible β".to_string(), String::new())
        } else {
            (
                format!("{:.4} ± {:.4}", r.excess_risk.0, r.excess_risk.1),
                format!(
                    "{:.2}% ± {:.2}",
                    100.0 * r.test_accuracy.0,
                    100.0 * r.test_accuracy.1
                ),
            )
        };
        table.row(vec![
            r.data.clone(),
            r.loss.clone(),
            format!("{:?}", r.algorithm),
            eps,
            r.steps.to_string(),
            sigma,
            risk,
            acc,
        ]);
    }
    crate::csv_table::write(&out.join("results.csv"), &HEADER, &csv_rows)?;
    let md = format!(
        "# {} ({profile} profile)\n\n{}\n\nPreprocessing of tabular data (generated data is not scaled): {preprocessing}.\n\nMean ± standard deviation over seeds; excess empirical risk against a 3,000-step full-batch solve on the same domain.\n\n{}",
        experiment.name,
        experiment.description,
        table.render()
    );
    let path = out.join("results.md");
    std::fs::write(&path, md).map_err(|e| Error::io(&path, e))
}

/// The columns of a convex `results.csv`.
const HEADER: [&str; 12] = [
    "data",
    "loss",
    "algorithm",
    "epsilon",
    "seeds",
    "steps",
    "sigma",
    "excess_risk_mean",
    "excess_risk_sd",
    "test_accuracy_mean",
    "test_accuracy_sd",
    "infeasible",
];

/// The rows of a `results.csv` this module wrote (to redraw the figures without re-running).
pub fn read_rows(path: &Path) -> Result<Vec<Row>> {
    let (header, records) = crate::csv_table::read(path)?;
    if header != HEADER {
        return Err(Error::bad_file(
            path,
            format!("header {header:?}: expected {HEADER:?}"),
        ));
    }
    let mut rows = Vec::new();
    for (i, f) in records.iter().enumerate() {
        // Line i + 2: the header is line 1 (no field of this table holds a line break).
        let bad = |what: &str| Error::bad_file(path, format!("line {}: {what}", i + 2));
        let num = |s: &str| s.parse::<f64>().map_err(|_| bad("expected a number"));
        let algorithm = match f[2].as_str() {
            "Output" => Algorithm::Output,
            "Gradient" => Algorithm::Gradient,
            "Nonprivate" => Algorithm::Nonprivate,
            other => return Err(bad(&format!("unknown algorithm {other}"))),
        };
        rows.push(Row {
            data: f[0].clone(),
            loss: f[1].clone(),
            algorithm,
            epsilon: if f[3] == "-" { None } else { Some(num(&f[3])?) },
            seeds: f[4].parse().map_err(|_| bad("seeds"))?,
            steps: f[5].parse().map_err(|_| bad("steps"))?,
            sigma: if f[6].is_empty() {
                None
            } else {
                Some(num(&f[6])?)
            },
            excess_risk: (num(&f[7])?, num(&f[8])?),
            test_accuracy: (num(&f[9])?, num(&f[10])?),
            infeasible: (f[11] == "true").then(|| "infeasible".to_string()),
        });
    }
    Ok(rows)
}
