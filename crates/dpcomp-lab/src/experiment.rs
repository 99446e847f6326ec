//! One runner for the kinds of experiment file: deep-learning training grids
//! (`grid::Experiment`, no `kind`), convex DP-SGD sweeps (`kind = "convex"`), federated grids
//! (`kind = "fl"`) and audited training grids (`kind = "audit"`, `audit_experiment`). Each kind keeps its own cells and tables; this module is what `dpcomp grid`
//! and a program of one's own call: open the file, list its cells, run what is not finished
//! (each kind resumes or skips finished cells), rewrite the tables, copy them out.
//!
//! Every kind writes under `<runs>/<name>/<profile>/`: cell folders, `results.{csv,md}` and, for
//! the convex and federated kinds, their figures.

use crate::audit_experiment::AuditExperiment;
use crate::cell_observer::CellObserver;
use crate::convex::experiment::ConvexExperiment;
use crate::fl_experiment::FlExperiment;
use crate::grid::{self, CellState};
use dpcomp::error::{Error, Result};
use std::path::{Path, PathBuf};

/// An experiment file of any kind.
pub enum ExperimentFile {
    /// Deep-learning training cells (`dpcomp train` settings), one run folder per cell.
    Training(grid::Experiment),
    /// Convex DP-SGD: every data x loss x algorithm x ε setting over the profile's seeds.
    Convex(ConvexExperiment),
    /// Federated learning: every dataset x scheme x ratio x privacy cell.
    Federated(FlExperiment),
    /// Training cells, each run once with canaries and audited.
    Audit(AuditExperiment),
}

/// One cell as `dpcomp grid --list` shows it.
pub struct CellListing {
    /// The cell's name (its folder under the profile's).
    pub name: String,
    /// "finished", "resumes after epoch 4", "new", "running: pid ...", or the cell's settings.
    pub state: String,
    /// Epochs or rounds, and what the cell will upload where that is known beforehand.
    pub details: String,
}

/// What a run or a table rewrite produced.
pub struct Outcome {
    /// Finished cells (training, federated) or settings (convex) in the table.
    pub finished: usize,
    /// `<runs>/<name>/<profile>/`, which holds `results.md`.
    pub folder: PathBuf,
}

impl ExperimentFile {
    /// Reads `path`, routed by its `kind` (none: training; "convex"; "fl").
    pub fn open(path: &Path) -> Result<Self> {
        match grid::experiment_kind(path)?.as_deref() {
            None => Ok(ExperimentFile::Training(grid::Experiment::from_file(path)?)),
            Some("convex") => Ok(ExperimentFile::Convex(ConvexExperiment::from_file(path)?)),
            Some("fl") => Ok(ExperimentFile::Federated(FlExperiment::from_file(path)?)),
            Some("audit") => Ok(ExperimentFile::Audit(AuditExperiment::from_file(path)?)),
            Some(other) => Err(Error::bad_file(
                path,
                format!(
                    "kind {other:?}: expected \"convex\", \"fl\", \"audit\", or no kind (a training grid)"
                ),
            )),
        }
    }

    /// The file's `name`: its folder under the runs root.
    pub fn name(&self) -> &str {
        match self {
            ExperimentFile::Training(e) => &e.name,
            ExperimentFile::Convex(e) => &e.name,
            ExperimentFile::Federated(e) => &e.name,
            ExperimentFile::Audit(e) => &e.grid.name,
        }
    }

    /// `<runs>/<name>/<profile>/`.
    pub fn folder(&self, runs: &Path, profile: &str) -> PathBuf {
        runs.join(self.name()).join(profile)
    }

    /// The cells of `profile` and where each stands, without running anything. `only` selects
    /// cells by axis value.
    pub fn list(
        &self,
        profile: &str,
        only: &[(String, String)],
        runs: &Path,
    ) -> Result<Vec<CellListing>> {
        self.check_only(only)?;
        let root = self.folder(runs, profile);
        match self {
            ExperimentFile::Training(e) => {
                let cells = e.cells(profile, only)?;
                let uploads = grid::upload_estimates(&cells);
                cells
                    .iter()
                    .zip(uploads)
                    .map(|(cell, upload)| {
                        let dir = root.join(&cell.name);
                        let state = match dpcomp::run_lock::holder(&dir) {
                            Some(owner) => format!("running: {owner}"),
                            None => match grid::cell_state(&dir, &cell.config)? {
                                CellState::Finished => "finished".to_string(),
                                CellState::Interrupted { epochs_done } => {
                                    format!("resumes after epoch {epochs_done}")
                                }
                                CellState::New => "new".to_string(),
                            },
                        };
                        let upload = match upload {
                            Ok(u) => format!(
                                "upload {} steps, {:.4} Gb on the wire, {:.2} in the paper's unit",
                                u.steps,
                                u.gigabits(),
                                u.paper_gib()
                            ),
                            Err(e) => format!("upload not estimated ({e})"),
                        };
                        Ok(CellListing {
                            name: cell.name.clone(),
                            state,
                            details: format!("epochs {}  {upload}", cell.config.epochs),
                        })
                    })
                    .collect()
            }
            ExperimentFile::Federated(e) => Ok(e
                .cells_only(profile, only)?
                .into_iter()
                .map(|(dataset, name, settings)| {
                    let noise = settings.privacy.map_or(String::new(), |p| {
                        format!("  S {:.4} sigma {:.4}", p.clip, p.noise_multiplier)
                    });
                    let dir = root.join(&dataset).join(&name);
                    let state = if crate::fl_experiment::finished(&dir, &settings) {
                        "finished".to_string()
                    } else {
                        dpcomp::fl::checkpoint::saved_round(&dir, &settings)
                            .map_or("new".to_string(), |k| format!("resumes after round {k}"))
                    };
                    CellListing {
                        name: format!("{dataset}/{name}"),
                        state,
                        details: format!("rounds {}{noise}", settings.rounds),
                    }
                })
                .collect()),
            ExperimentFile::Audit(e) => Ok(e
                .grid
                .cells(profile, only)?
                .into_iter()
                .map(|cell| {
                    let dir = root.join(&cell.name);
                    let state = match dpcomp::run_lock::holder(&dir) {
                        Some(owner) => format!("running: {owner}"),
                        None if dir.join("audit.json").is_file() => "finished".to_string(),
                        None => "new".to_string(),
                    };
                    CellListing {
                        name: cell.name,
                        state,
                        details: format!("epochs {}", cell.config.epochs),
                    }
                })
                .collect()),
            ExperimentFile::Convex(_) => Err(Error::bad_value(
                "list",
                "not supported for convex experiments: they run as one sweep of seconds",
            )),
        }
    }

    /// Runs every cell of `profile` that has not finished (training cells resume from their
    /// checkpoints; a cell another process holds is left to it), then writes the tables (and
    /// figures) of everything finished. `data_dir` is where the convex and federated kinds
    /// read their data (`None`: `DPCOMP_DATA` or `data/`); training cells name theirs.
    /// `observer` hears of each cell and gives the observers of its training (`()`: nobody).
    pub fn run(
        &self,
        profile: &str,
        only: &[(String, String)],
        runs: &Path,
        data_dir: Option<&Path>,
        observer: &mut dyn CellObserver,
    ) -> Result<Outcome> {
        self.check_only(only)?;
        let folder = self.folder(runs, profile);
        let finished = match self {
            ExperimentFile::Training(e) => grid::run(e, profile, only, runs, observer)?.len(),
            ExperimentFile::Convex(e) => {
                let rows = crate::convex::experiment::run(e, profile, data_dir, &folder, observer)?;
                #[cfg(feature = "plot")]
                crate::plot::convex::draw_figures(&e.grid.data, &e.grid.loss, &rows, &folder)?;
                no_figures_without_plot(&folder);
                rows.len()
            }
            ExperimentFile::Federated(e) => {
                let data_dir = dpcomp::data::data_dir(data_dir);
                let cells =
                    crate::fl_experiment::run(e, profile, only, &data_dir, &folder, observer)?;
                #[cfg(feature = "plot")]
                crate::plot::fl::figures(&cells, &folder)?;
                no_figures_without_plot(&folder);
                cells.len()
            }
            ExperimentFile::Audit(e) => e.run(profile, only, runs, observer)?.len(),
        };
        Ok(Outcome { finished, folder })
    }

    /// Rewrites the tables (and figures) from the cells that have finished, training nothing:
    /// for grids whose cells other processes are running.
    pub fn write_tables(&self, profile: &str, runs: &Path) -> Result<Outcome> {
        let folder = self.folder(runs, profile);
        let finished = match self {
            ExperimentFile::Training(e) => grid::write_results(e, profile, runs)?.len(),
            ExperimentFile::Audit(e) => e.write_tables(profile, runs)?.len(),
            ExperimentFile::Federated(_) => {
                let cells = crate::fl_experiment::read_cells(&folder)?;
                crate::fl_experiment::write_results(&cells, &folder)?;
                #[cfg(feature = "plot")]
                crate::plot::fl::figures(&cells, &folder)?;
                no_figures_without_plot(&folder);
                cells.len()
            }
            ExperimentFile::Convex(_) => {
                return Err(Error::bad_value(
                    "tables_only",
                    "not supported for convex experiments: their tables are written by the sweep itself",
                ))
            }
        };
        Ok(Outcome { finished, folder })
    }

    /// Copies `results.{csv,md}` to `<dir>/<name>.<profile>.{csv,md}` and the figures' PNG files
    /// to `<dir>/<name>/`. Their SVG twins stay in the run folder: a results folder holds each
    /// figure once, in the format a browser shows (`experiments/results/`).
    pub fn copy_results(&self, profile: &str, runs: &Path, dir: &Path) -> Result<()> {
        let from = self.folder(runs, profile);
        let name = self.name();
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        // The cpu profile's figures in `{name}/`, another profile's in `{name}-{profile}/`, so
        // that one profile's tables-only run does not overwrite another's figures.
        let figures = match profile {
            "cpu" => dir.join(name),
            _ => dir.join(format!("{name}-{profile}")),
        };
        let entries = std::fs::read_dir(&from).map_err(|e| Error::io(&from, e))?;
        for entry in entries {
            let path = entry.map_err(|e| Error::io(&from, e))?.path();
            if !path.is_file() {
                continue;
            }
            let file = path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            let to = match file.as_str() {
                "results.csv" | "results.md" => {
                    dir.join(format!("{name}.{profile}.{}", &file["results.".len()..]))
                }
                _ if file.ends_with(".png") => {
                    std::fs::create_dir_all(&figures).map_err(|e| Error::io(&figures, e))?;
                    figures.join(&file)
                }
                _ => continue,
            };
            std::fs::copy(&path, &to).map_err(|e| Error::io(&to, e))?;
        }
        Ok(())
    }

    /// `only` selects cells by the axes of a training, audit or federated grid (the federated
    /// axes: `fl::experiment::ONLY_AXES`); a convex sweep has none.
    fn check_only(&self, only: &[(String, String)]) -> Result<()> {
        match self {
            ExperimentFile::Convex(_) if !only.is_empty() => Err(Error::bad_value(
                "only",
                "not supported for convex experiments (one sweep of seconds, not an axis product)",
            )),
            _ => Ok(()),
        }
    }
}

/// Built without the `plot` feature, an experiment writes its tables and says that its figures
/// were not drawn (`dpcomp plot` draws them later from the same folder).
fn no_figures_without_plot(folder: &Path) {
    #[cfg(not(feature = "plot"))]
    log::info!(
        "{}: tables written; figures need dpcomp's `plot` feature (then `dpcomp plot`)",
        folder.display()
    );
    #[cfg(feature = "plot")]
    let _ = folder;
}
