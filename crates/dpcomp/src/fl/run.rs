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
use super::setup::Source;
use super::task::OwnParts;
use super::{record, round, setup, FlSettings, FlSummary, RoundMetrics};
use crate::data::Dataset;
use crate::error::{Error, Result};
use crate::models::Model;
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

/// The clients' data: given loaded, or loaded by `build`, or a model and data of one's own.
enum Data<'d> {
    Given(&'d FlData),
    Loaded(FlData),
    Own(OwnParts),
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
    model: Option<Box<dyn Model>>,
    clients: Option<(Vec<Dataset>, Dataset)>,
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
    /// The model of one's own (`FederatedRunBuilder::model`) holding the final global weights;
    /// `None` for dpcomp's networks.
    pub model: Option<Box<dyn Model>>,
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

    /// A model of one's own instead of dpcomp's network for the settings' dataset, given with
    /// the clients' data (`clients`). The run sends the updates of its trainable variables
    /// (`Model::trainable_variables`, sorted by name, as one float32 vector \[n\]): frozen
    /// weights stay as they are (LoRA: only the adapters and the head are federated). It starts
    /// from the weights it holds, trains and is evaluated on the device it lives on (the
    /// settings' `device` is not read), and comes back with the final global weights in
    /// `FlOutcome::model`. Such a run has no folder (`out` is refused: its checkpoint would not
    /// know how to rebuild the model; the summary's `dataset` is `own`). Of the settings,
    /// `dataset` only named the defaults (`FlSettings::defaults`), `model` must be unset,
    /// `validation` 0, and `partition` is not read (the clients' data comes split).
    pub fn model(mut self, model: Box<dyn Model>) -> Self {
        self.model = Some(model);
        self
    }

    /// The clients' data for a model of one's own (`model`): one `Dataset` per client (the
    /// settings' `clients` of them, none empty), in client order, and the test examples the
    /// global model is evaluated on after every round (the first `eval_examples` of them, 0:
    /// all). Features of any kind the model reads (token sequences, text pairs, rows). A
    /// client's local step is `LocalTraining`'s SGD on the batch's `Model::mean_loss`; the
    /// evaluation reports the test examples' mean `Model::mean_loss` and mean `Model::correct`
    /// as the accuracy (the summary's metric; balanced accuracy reports the same, AUROC none).
    pub fn clients(mut self, clients: Vec<Dataset>, test: Dataset) -> Self {
        self.clients = Some((clients, test));
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
        let data = match (self.model, self.clients) {
            (None, None) => data_for(&settings, self.data, self.data_dir)?,
            (Some(model), Some((clients, test))) => {
                let given = (self.data.is_some(), self.data_dir.is_some());
                own_data(&settings, given, self.out.is_some())?;
                let parts = OwnParts {
                    model,
                    clients,
                    test,
                };
                parts.check(settings.clients)?;
                Data::Own(parts)
            }
            (Some(_), None) => {
                return Err(Error::bad_value(
                    "clients",
                    "not given: a model of one's own (`model`) trains on the clients' data given with `clients`",
                ))
            }
            (None, Some(_)) => {
                return Err(Error::bad_value(
                    "model",
                    "not given: the clients' own data (`clients`) needs the model of one's own it trains (`model`)",
                ))
            }
        };
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

/// A model of one's own goes with its clients' data only (not `data` or `data_dir`), in a run
/// without a folder, with settings that leave dpcomp's network and validation split unset.
/// `given`: whether `data` and `data_dir` were given.
fn own_data(settings: &FlSettings, given: (bool, bool), out: bool) -> Result<()> {
    let (data, data_dir) = given;
    let refused = if data {
        Some((
            "data",
            "the clients' data of a model of one's own is given with `clients`",
        ))
    } else if data_dir {
        Some((
            "data_dir",
            "the clients' data of a model of one's own is given with `clients`",
        ))
    } else if out {
        Some(("out", "a run of a model of one's own is not written to a folder (no checkpoint could rebuild the model); read its `FlOutcome`"))
    } else if settings.model.is_some() {
        Some(("model", "the settings name one of dpcomp's networks, but a model of one's own is given; leave `FlSettings::model` unset"))
    } else if settings.validation != 0.0 {
        Some(("validation", "a validation split is held out of dpcomp's datasets; a model of one's own is evaluated on its test examples, so set it to 0"))
    } else {
        None
    };
    match refused {
        Some((field, why)) => Err(Error::bad_value(field, why)),
        None => Ok(()),
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
        let own = matches!(data, Data::Own(_));
        let source = match data {
            Data::Given(data) => Source::Fl(data),
            Data::Loaded(ref data) => Source::Fl(data),
            Data::Own(parts) => Source::Own(parts),
        };
        let mut run = setup::start(&settings, source, out.as_deref(), canaries)?;
        let earlier_seconds = run.history.wall_seconds();
        let wall = || earlier_seconds + start.elapsed().as_secs_f64();
        observers.tell(&|o| {
            o.started(&RunStart {
                rounds: settings.rounds,
                rounds_done: run.rounds_done,
                metric: run.task.metric().name(),
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
                        model: None,
                    });
                }
            }
        }
        let mut summary = run
            .history
            .summary(&settings, &run.server, stopped_early, wall())?;
        if own {
            summary.dataset = "own".to_string();
        }
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
        model: run.task.into_model(),
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

/// Round `round` (`round::run_round`), the global model evaluated after it, and its row of
/// metrics; `wall` reads the run's seconds so far.
fn one_round(
    settings: &FlSettings,
    run: &mut setup::Started,
    round: usize,
    wall: &dyn Fn() -> f64,
) -> Result<RoundMetrics> {
    let report = round::run_round(settings, &mut run.task, &mut run.server, round)?;
    let evaluated = run.task.evaluate(&run.server.w)?;
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
