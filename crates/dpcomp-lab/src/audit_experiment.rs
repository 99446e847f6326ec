//! Audit grids (`kind = "audit"`): the cells of a training grid (`grid::Experiment`:
//! `[base]`, `[grid]`, `[profiles.*]`), each trained once with the canaries of the file's
//! `[audit]` section (`train::audit::audit_training`), and a table of the accounted ε beside
//! the audited lower bound. A cell is finished when its `audit.json` exists; an unfinished
//! cell starts over (an audited run is not resumable), unless another process holds it.
//!
//! ```toml
//! kind = "audit"
//! name = "audit_surnames"
//! [audit]
//! canaries = 1000       # m
//! canary = "white-box"  # or "black-box"
//! observe = "every-step" # or "final" (white box)
//! dense = false
//! guesses = 100         # "included" guesses (the highest scores)
//! excluded_guesses = 0  # "excluded" guesses (the lowest)
//! confidence = 0.95
//! seed = 19
//! ```

use crate::cell_observer::{CellEvent, CellObserver};
use crate::grid::Experiment;
use crate::results_table::MarkdownTable;
use dpcomp::error::{Error, Result};
use dpcomp::privacy::audit::{AuditOutcome, Guesses};
use dpcomp::privacy::canary::{CanarySettings, Observe};
use dpcomp::train::audit::{audit_training, AuditReport, AuditSettings, CanaryKind};
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuditSection {
    canaries: usize,
    #[serde(default = "white_box")]
    canary: CanaryKind,
    #[serde(default = "every_step")]
    observe: Observe,
    #[serde(default)]
    dense: bool,
    guesses: usize,
    #[serde(default)]
    excluded_guesses: usize,
    #[serde(default = "default_confidence")]
    confidence: f64,
    #[serde(default = "default_seed")]
    seed: u64,
}

fn white_box() -> CanaryKind {
    CanaryKind::WhiteBox
}
fn every_step() -> Observe {
    Observe::EveryStep
}
fn default_confidence() -> f64 {
    0.95
}
fn default_seed() -> u64 {
    19
}

pub struct AuditExperiment {
    pub grid: Experiment,
    pub settings: AuditSettings,
}

/// A finished cell: its name and report.
pub struct AuditRow {
    pub cell: String,
    pub report: AuditReport,
}

impl AuditExperiment {
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let mut table: toml::Table =
            toml::from_str(&text).map_err(|e| Error::bad_file(path, e.to_string()))?;
        table.remove("kind");
        let section = table.remove("audit").ok_or_else(|| {
            Error::bad_file(
                path,
                "no [audit] section: an audit grid needs canaries and guesses",
            )
        })?;
        let a: AuditSection = section
            .try_into()
            .map_err(|e: toml::de::Error| Error::bad_file(path, format!("[audit]: {e}")))?;
        if !(a.confidence > 0.0 && a.confidence < 1.0) {
            return Err(Error::bad_file(
                path,
                format!(
                    "[audit] confidence {}: expected a probability strictly between 0 and 1",
                    a.confidence
                ),
            ));
        }
        let settings = AuditSettings {
            kind: a.canary,
            canaries: CanarySettings {
                canaries: a.canaries,
                dense: a.dense,
                observe: a.observe,
                seed: a.seed,
            },
            guesses: Guesses {
                included: a.guesses,
                excluded: a.excluded_guesses,
            },
            beta: 1.0 - a.confidence,
        };
        Ok(AuditExperiment {
            grid: Experiment::from_table(table, path)?,
            settings,
        })
    }

    fn folder(&self, runs: &Path, profile: &str) -> PathBuf {
        runs.join(&self.grid.name).join(profile)
    }

    /// Audits every unfinished cell of `profile` (`only` as for training grids), then writes
    /// the table of every finished one. `observer` hears of each cell and gives its trainer's
    /// observers.
    pub fn run(
        &self,
        profile: &str,
        only: &[(String, String)],
        runs: &Path,
        observer: &mut dyn CellObserver,
    ) -> Result<Vec<AuditRow>> {
        let cells = self.grid.cells(profile, only)?;
        let root = self.folder(runs, profile);
        std::fs::create_dir_all(&root).map_err(|e| Error::io(&root, e))?;
        for (i, cell) in cells.iter().enumerate() {
            let dir = root.join(&cell.name);
            let mut tell = |event: CellEvent<'_>| {
                observer.cell(&self.grid.name, i, cells.len(), &cell.name, event)
            };
            if dir.join("audit.json").is_file() {
                tell(CellEvent::Skipped);
                continue;
            }
            if let Some(owner) = dpcomp::run_lock::holder(&dir) {
                tell(CellEvent::InUse { owner: &owner });
                continue;
            }
            tell(CellEvent::Starting);
            // An audited run does not resume: what an interrupted one left starts over.
            // Only dpcomp's own files go (`run_folder::clear` refuses a folder that is not a
            // dpcomp run folder).
            if dir.exists() {
                dpcomp::run_folder::clear(&dir)?;
            }
            let observers = observer.trainer_observers();
            audit_training(
                crate::tasks::trainer(&dir),
                cell.config.clone(),
                &self.settings,
                observers,
            )?;
            observer.cell(
                &self.grid.name,
                i,
                cells.len(),
                &cell.name,
                CellEvent::Finished { result: None },
            );
        }
        self.write_tables(profile, runs)
    }

    /// The finished cells' rows, and `results.{csv,md}` written from them.
    pub fn write_tables(&self, profile: &str, runs: &Path) -> Result<Vec<AuditRow>> {
        let root = self.folder(runs, profile);
        std::fs::create_dir_all(&root).map_err(|e| Error::io(&root, e))?;
        let mut rows = Vec::new();
        for cell in self.grid.cells(profile, &[])? {
            let path = root.join(&cell.name).join("audit.json");
            if !path.is_file() {
                continue;
            }
            let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
            let report: AuditReport =
                serde_json::from_str(&text).map_err(|e| Error::bad_file(&path, e.to_string()))?;
            rows.push(AuditRow {
                cell: cell.name,
                report,
            });
        }
        let s = &self.settings;
        let observed = match (s.kind, s.canaries.observe) {
            (CanaryKind::BlackBox, _) => "black box: mislabelled training examples, scored by minus their loss under the final model".to_string(),
            (CanaryKind::WhiteBox, observe) => format!(
                "white box: {} gradient canaries of norm C added to the clipped sum, observed {}",
                if s.canaries.dense { "dense" } else { "Dirac" },
                match observe {
                    Observe::EveryStep => "after every step (log-likelihood ratio of the steps' projections)",
                    Observe::Final => "at the end (projection of w_0 - w_T)",
                }
            ),
        };
        let header = [
            "cell",
            "task",
            "compressor",
            "noise_multiplier",
            "sample_rate",
            "steps",
            "accounted_epsilon",
            "audited_epsilon",
            "correct",
            "guesses",
            "canaries",
            "every_step_epsilon",
            "every_step_correct",
            "final_weights_epsilon",
            "final_weights_correct",
            "max_bound",
            "test_accuracy",
            "flagged",
        ];
        let mut csv_rows = Vec::new();
        let intro = format!(
            "# {} ({profile} profile)\n\n{}\n\nCanaries: {} ({observed}), each included with probability 1/2 (seed {}); {} \"included\" and {} \"excluded\" guesses; lower bound at {:.0}% confidence (Steinke, Nasr and Jagielski 2023) and the run's δ. \"At most\" is the bound had every guess been right: the audit's power. White box: the same run audited by an auditor who sees the weights after every step and by one who sees only the final weights (right guesses in brackets).\n\n",
            self.grid.name,
            self.grid.description,
            s.canaries.canaries,
            s.canaries.seed,
            s.guesses.included,
            s.guesses.excluded,
            100.0 * (1.0 - s.beta),
        );
        let mut table = MarkdownTable::new(&[
            "cell",
            "compressor",
            "σ",
            "steps",
            "accounted ε",
            "audited ε (lower bound)",
            "every step",
            "final weights",
            "at most",
            "test accuracy",
            "flagged",
        ]);
        for row in &rows {
            let r = &row.report;
            let o = &r.outcome;
            let (every, last) = (r.every_step.as_ref(), r.final_weights.as_ref());
            let number = |o: Option<&AuditOutcome>, f: fn(&AuditOutcome) -> String| {
                o.map_or(String::new(), f)
            };
            let cell = |o: Option<&AuditOutcome>| {
                o.map_or("–".to_string(), |o| {
                    format!("{:.3} ({}/{})", o.epsilon_lower_bound, o.correct, o.guesses)
                })
            };
            csv_rows.push(vec![
                row.cell.clone(),
                r.task.clone(),
                r.compressor.clone(),
                r.noise_multiplier.to_string(),
                r.sample_rate.to_string(),
                r.steps.to_string(),
                r.accounted_epsilon.to_string(),
                o.epsilon_lower_bound.to_string(),
                o.correct.to_string(),
                o.guesses.to_string(),
                o.canaries.to_string(),
                number(every, |o| o.epsilon_lower_bound.to_string()),
                number(every, |o| o.correct.to_string()),
                number(last, |o| o.epsilon_lower_bound.to_string()),
                number(last, |o| o.correct.to_string()),
                r.max_bound.to_string(),
                r.test_accuracy.to_string(),
                r.flagged.to_string(),
            ]);
            table.row(vec![
                row.cell.clone(),
                r.compressor.clone(),
                r.noise_multiplier.to_string(),
                r.steps.to_string(),
                if r.accounted_epsilon.is_finite() {
                    format!("{:.3}", r.accounted_epsilon)
                } else {
                    "∞".to_string()
                },
                cell(Some(o)),
                cell(every),
                cell(last),
                format!("{:.3}", r.max_bound),
                format!("{:.2}%", 100.0 * r.test_accuracy),
                if r.flagged { "**yes**" } else { "no" }.to_string(),
            ]);
        }
        crate::csv_table::write(&root.join("results.csv"), &header, &csv_rows)?;
        let path = root.join("results.md");
        std::fs::write(&path, intro + &table.render()).map_err(|e| Error::io(&path, e))?;
        Ok(rows)
    }
}
