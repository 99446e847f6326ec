//! `FederatedRun::builder()`: a federated run (Kerkouche et al. 2021's Algorithm 1, with
//! Algorithm 3's server for FL-CS) from its settings, in named steps, and the loop over its
//! rounds. Its parts, in the order a run goes through them: `setup` (w₀, the clients' shards,
//! the server's state, the run folder and a resume), `round` (one round), `evaluate` (the
//! global model after it) and `record` (its row, the checkpoint, the summary).
//!
//! ```no_run
//! use dpcomp::fl::data::FlDataset;
//! use dpcomp::fl::{FederatedRun, FlSettings};
//! # fn main() -> dpcomp::Result<()> {
//! let mut settings = FlSettings::defaults(FlDataset::BreastCancer);
//! settings.rounds = 20;
//! let outcome = FederatedRun::builder()
//!     .settings(settings)
//!     .data_dir("data")
//!     .out("runs/fl-cs")
//!     .build()?
//!     .run()?;
//! let summary = outcome.summary.expect("a run without `stop_after` runs to its end");
//! println!("best {} {:.3} at round {}", summary.metric, summary.best, summary.best_round);
//! # Ok(())
//! # }
//! ```

use super::data::FlData;
use super::observer::{RoundObserver, RunStart};
use super::{record, round, setup, FlSettings, FlSummary, RoundMetrics};
use crate::error::{Error, Result};
use crate::privacy::canary::{CanaryScores, CanarySettings};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A federated run, ready to `run` (`FederatedRun::builder`).
pub struct FederatedRun<'d> {
    settings: FlSettings,
    data: Data<'d>,
    out: Option<PathBuf>,
    canaries: Option<CanarySettings>,
    stop_after: Option<usize>,
    observers: Vec<Box<dyn RoundObserver>>,
}

/// The clients' data: given loaded, or loaded by `build`.
enum Data<'d> {
    Given(&'d FlData),
    Loaded(FlData),
}

/// The settings of a `FederatedRun`, by name; only `settings` must be given.
#[derive(Default)]
pub struct FederatedRunBuilder<'d> {
    settings: Option<FlSettings>,
    data: Option<&'d FlData>,
    data_dir: Option<PathBuf>,
    out: Option<PathBuf>,
    canaries: Option<CanarySettings>,
    stop_after: Option<usize>,
    observers: Vec<Box<dyn RoundObserver>>,
}

/// What a federated run returns.
pub struct FlOutcome {
    /// Every round's row of `metrics.jsonl`, a resumed run's earlier rounds included.
    pub rounds: Vec<RoundMetrics>,
    /// The run's summary (`summary.json`); `None` only when `stop_after` stopped the run.
    pub summary: Option<FlSummary>,
    /// The canary clients' scores by both auditors, every round's weights and the final
    /// weights (audited runs, `FederatedRunBuilder::canaries`).
    pub canary_scores: Option<CanaryScores>,
}

impl FederatedRun<'_> {
    /// A run to set up by name: `settings(..)`, then optionally the data, a run folder,
    /// canaries, a round to stop after and observers, and `build()`.
    pub fn builder<'d>() -> FederatedRunBuilder<'d> {
        FederatedRunBuilder::default()
    }
}

impl<'d> FederatedRunBuilder<'d> {
    /// The run's settings (`FlSettings::defaults` with one's changes, or a run folder's
    /// `config_file::read`). Checked by `build`.
    pub fn settings(mut self, settings: FlSettings) -> Self {
        self.settings = Some(settings);
        self
    }

    /// The clients' data, already loaded (`FlData::load` of the settings' dataset), for
    /// several runs on the same data. Without it, `build` loads the settings' dataset from
    /// `data_dir`.
    pub fn data(mut self, data: &'d FlData) -> Self {
        self.data = Some(data);
        self
    }

    /// The data folder `build` loads the settings' dataset from (default: dpcomp's data
    /// folder, `$DPCOMP_DATA` or `data`, `data::data_dir`).
    pub fn data_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.data_dir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// The run folder: `config.toml`, then each round's row of `metrics.jsonl` and checkpoint,
    /// and `summary.json` at the end. A folder holding an interrupted run of the same settings
    /// continues it (`checkpoint`); a finished run's is refused. Without one, nothing is
    /// written.
    pub fn out(mut self, dir: impl AsRef<Path>) -> Self {
        self.out = Some(dir.as_ref().to_path_buf());
        self
    }

    /// White-box canary clients (`privacy::canary`), for a private run: m canary clients, each
    /// included with probability ½ and then Poisson-sampled every round at the clients' rate
    /// C. A sampled canary sends the update C₀ u_i (u_i one model coordinate, or a dense
    /// direction) through the round's encoder like any client, and its message is clipped to S
    /// with the others before the noise: in the sent domain it has norm S unless the encoding
    /// drops it (C₀ = 10³ S, so clipping always binds). The canaries' messages are not counted
    /// as traffic; their scores are `FlOutcome::canary_scores`. An audited run is not
    /// checkpointed.
    pub fn canaries(mut self, canaries: CanarySettings) -> Self {
        self.canaries = Some(canaries);
        self
    }

    /// Stops after round `round` as a killed run would: checkpoint saved, no summary. A run of
    /// the same settings into the same folder continues after it. Needs `out`; `round` is
    /// before the run's last.
    pub fn stop_after(mut self, round: usize) -> Self {
        self.stop_after = Some(round);
        self
    }

    /// Who hears of the run's rounds (`observer`); several may be given, each hears every call
    /// in the order given; nobody by default.
    pub fn observer(mut self, observer: Box<dyn RoundObserver>) -> Self {
        self.observers.push(observer);
        self
    }

    /// The run, its settings checked and its data loaded.
    pub fn build(self) -> Result<FederatedRun<'d>> {
        let settings = self.settings.ok_or_else(|| {
            Error::bad_value(
                "settings",
                "not given: a federated run needs its FlSettings",
            )
        })?;
        settings.validate()?;
        if self.canaries.is_some() && settings.privacy.is_none() {
            return Err(Error::bad_value(
                "canaries",
                "canary clients audit client-level DP: the run needs privacy (`--dp`)",
            ));
        }
        if let Some(round) = self.stop_after {
            check_stop_after(
                round,
                &settings,
                self.out.is_some(),
                self.canaries.is_some(),
            )?;
        }
        let data = data_for(&settings, self.data, self.data_dir)?;
        Ok(FederatedRun {
            settings,
            data,
            out: self.out,
            canaries: self.canaries,
            stop_after: self.stop_after,
            observers: self.observers,
        })
    }
}

/// The clients' data: given loaded (then it must be the settings' dataset), or loaded from
/// `data_dir` (dpcomp's data folder when not given); not both.
fn data_for<'d>(
    settings: &FlSettings,
    data: Option<&'d FlData>,
    data_dir: Option<PathBuf>,
) -> Result<Data<'d>> {
    match (data, data_dir) {
        (Some(_), Some(dir)) => Err(Error::bad_value(
            "data_dir",
            format!(
                "{}: the data was given loaded; give one of data and data_dir",
                dir.display()
            ),
        )),
        (Some(data), None) if data.dataset != settings.dataset => Err(Error::bad_value(
            "data",
            format!(
                "{}: the settings' dataset is {}",
                data.dataset.name(),
                settings.dataset.name()
            ),
        )),
        (Some(data), None) => Ok(Data::Given(data)),
        (None, dir) => Ok(Data::Loaded(FlData::load(
            settings.dataset,
            &crate::data::data_dir(dir.as_deref()),
        )?)),
    }
}

/// A round to stop after is one before the run's last, in a run with a folder to save its
/// checkpoint in and no canaries (which are not checkpointed).
fn check_stop_after(round: usize, settings: &FlSettings, out: bool, audited: bool) -> Result<()> {
    if round == 0 || round >= settings.rounds {
        return Err(Error::bad_value(
            "stop_after",
            format!(
                "{round}: expected a round from 1 to {} (before the run's last)",
                settings.rounds - 1
            ),
        ));
    }
    if !out || audited {
        return Err(Error::bad_value(
            "stop_after",
            format!("{round}: a stopped run continues from its checkpoint, which needs a run folder (`out`) and no canaries"),
        ));
    }
    Ok(())
}

impl FederatedRun<'_> {
    /// Runs the rounds (after a resumed run's last) and returns the rows and the summary.
    pub fn run(self) -> Result<FlOutcome> {
        let start = Instant::now();
        let FederatedRun {
            settings,
            data,
            out,
            canaries,
            stop_after,
            observers,
        } = self;
        let mut observers = Observers(observers);
        let audited = canaries.is_some();
        let mut run = setup::start(&settings, data.get(), out.as_deref(), canaries)?;
        let earlier_seconds = run.history.wall_seconds();
        let wall = || earlier_seconds + start.elapsed().as_secs_f64();
        observers.tell(&|o| {
            o.started(&RunStart {
                rounds: settings.rounds,
                rounds_done: run.rounds_done,
                metric: run.evaluator.metric.name(),
                folder: out.clone(),
            })
        });
        let mut stopped_early = false;
        for round in run.rounds_done + 1..=settings.rounds {
            observers.tell(&|o| o.round_started(round));
            let row = one_round(&settings, &mut run, round, &wall)?;
            record::log_round(out.as_deref(), &row)?;
            observers.tell(&|o| o.round_finished(&row));
            run.history.push(row);
            if run.history.out_of_patience(settings.patience, round) {
                stopped_early = round < settings.rounds;
                break;
            }
            // Every round but the last is checkpointed (audited runs never are).
            if let (Some(dir), false) = (&out, round == settings.rounds || audited) {
                record::save_checkpoint(dir, round, &run.server)?;
                if stop_after == Some(round) {
                    observers.tell(&|o| o.stopped(round));
                    return Ok(FlOutcome {
                        rounds: run.history.rows,
                        summary: None,
                        canary_scores: None,
                    });
                }
            }
        }
        let summary = run
            .history
            .summary(&settings, &run.server, stopped_early, wall())?;
        finish(run, summary, out.as_deref(), &mut observers)
    }
}

/// A finished run's outcome: `summary.json` written (runs with a folder), the observers told,
/// the canaries scored on the final weights.
fn finish(
    mut run: setup::Started,
    summary: FlSummary,
    out: Option<&Path>,
    observers: &mut Observers,
) -> Result<FlOutcome> {
    if let Some(dir) = out {
        record::write_summary(dir, &summary)?;
    }
    observers.tell(&|o| o.finished(&summary));
    let w = std::slice::from_ref(&run.server.w);
    Ok(FlOutcome {
        canary_scores: run.server.canaries.take().map(|c| c.finish(w)),
        rounds: run.history.rows,
        summary: Some(summary),
    })
}

/// The run's observers, told every call in the order given.
struct Observers(Vec<Box<dyn RoundObserver>>);

impl Observers {
    fn tell(&mut self, call: &dyn Fn(&mut dyn RoundObserver)) {
        for observer in &mut self.0 {
            call(observer.as_mut());
        }
    }
}

impl Data<'_> {
    fn get(&self) -> &FlData {
        match self {
            Data::Given(data) => data,
            Data::Loaded(data) => data,
        }
    }
}

/// Round `round` (`round::run_round`), the global model evaluated after it, and its row of
/// metrics; `wall` reads the run's seconds so far.
fn one_round(
    settings: &FlSettings,
    run: &mut setup::Started,
    round: usize,
    wall: &dyn Fn() -> f64,
) -> Result<RoundMetrics> {
    let report = round::run_round(settings, &mut run.clients, &mut run.server, round)?;
    let evaluated = run.evaluator.evaluate(&run.server.w)?;
    let epsilon = run.server.epsilon()?;
    let upstream_before = run.history.upstream_bits_total();
    Ok(record::round_row(
        round,
        &report,
        &evaluated,
        epsilon,
        upstream_before,
        wall(),
    ))
}
