//! `Trainer::builder(run_dir)`: every way to start a `Trainer` in one place, instead
//! of a constructor per combination. `Trainer::new(config, run_dir)` and
//! `Trainer::resume(run_dir, epochs)` stay as the one-line forms of the common cases.
//!
//! ```no_run
//! use dpcomp::prelude::*;
//! /// A private run of one's own model, then its continuation to 20 epochs in a later process.
//! fn train(
//!     make_model: impl Fn() -> Box<dyn Model>,
//!     data: impl Fn() -> TaskData,
//! ) -> Result<()> {
//!     let mut config = TrainConfig::own("my-task");
//!     config.privacy.target_epsilon = Some(3.0); // σ calibrated over the run's epochs
//!     let mut trainer = Trainer::builder("runs/mine")
//!         .config(config)
//!         .model(make_model(), data())
//!         .observer(Box::new(dpcomp::train::observer::ProgressBars::default()))
//!         .build()?;
//!     trainer.run()?;
//!     let overrides = TrainOverrides { epochs: Some(20), ..TrainOverrides::default() };
//!     let mut trainer = Trainer::builder("runs/mine")
//!         .resume(overrides)
//!         .model(make_model(), data())
//!         .build()?;
//!     trainer.run()?;
//!     Ok(())
//! }
//! ```

use super::observer::Observer;
use super::{DataEdit, OwnTask, Trainer};
use crate::comm::Communicator;
use crate::config::{TrainConfig, TrainOverrides};
use crate::data::TaskData;
use crate::error::{Error, Result};
use crate::models::Model;
use std::path::{Path, PathBuf};

/// A fresh run's configuration, or the settings a continued run is given again.
enum Start {
    Fresh(TrainConfig),
    Continue(TrainOverrides),
}

/// The settings of a `Trainer`, by name (`Trainer::builder`).
pub struct TrainerBuilder {
    run_dir: PathBuf,
    start: Option<Start>,
    conflicting_start: bool,
    own: Option<OwnTask>,
    edit: Option<DataEdit>,
    comm: Option<Box<dyn Communicator>>,
    observers: Vec<Box<dyn Observer>>,
}

impl Trainer {
    /// A trainer whose run folder is `run_dir`; then `config(..)` for a fresh run or
    /// `resume(..)` to continue the one there, and `build()`. `run_dir` is any path-like value
    /// (`&str`, `&Path`, `PathBuf`).
    pub fn builder(run_dir: impl AsRef<Path>) -> TrainerBuilder {
        TrainerBuilder {
            run_dir: run_dir.as_ref().to_path_buf(),
            start: None,
            conflicting_start: false,
            own: None,
            edit: None,
            comm: None,
            observers: Vec::new(),
        }
    }
}

impl TrainerBuilder {
    /// A fresh run with `config`. The folder must be new, empty or a dpcomp run folder without
    /// a checkpoint; `config.toml` is written before anything else.
    pub fn config(mut self, config: TrainConfig) -> Self {
        self.conflicting_start |= self.start.is_some();
        self.start = Some(Start::Fresh(config));
        self
    }

    /// Continues the run in the folder from its last checkpoint, with the settings passed
    /// again in `overrides`: only `config::RESUME_MAY_CHANGE` (epochs, data folder, device) may
    /// differ from the run's `config.toml`; any other setting that differs is an error naming
    /// both values, because the checkpoint and the accountant's history were made with the
    /// saved ones. The checkpoint is verified against its manifest, the accountant's history
    /// against the steps done and the run's σ and q, the logs against the epochs done.
    pub fn resume(mut self, overrides: TrainOverrides) -> Self {
        self.conflicting_start |= self.start.is_some();
        self.start = Some(Start::Continue(overrides));
        self
    }

    /// A model and data of one's own (the config's task is `TaskName::Own`, e.g. from
    /// `TrainConfig::own`): everything a built-in task gets (Poisson sampling, the privacy
    /// engine and its accountant, compressors, checkpoints, metrics, resume). The model's
    /// forward takes the batches `data` gives (`Features::Rows` for tensors of one's own);
    /// seed LibTorch (`tch::manual_seed`) before building it for a reproducible start. A
    /// resumed run is given the model built as at the start (its weights are then read from
    /// the checkpoint) and the same data.
    pub fn model(mut self, model: Box<dyn Model>, data: TaskData) -> Self {
        self.own = Some(OwnTask { model, data });
        self
    }

    /// A fresh run of a built-in task whose loaded data `edit` changes first (on the host,
    /// before the privacy engine takes q from the training split's size): how `dpcomp audit`
    /// plants black-box canaries (`train::input_canaries::InputCanaries`). One process.
    pub fn edit_data(mut self, edit: DataEdit) -> Self {
        self.edit = Some(edit);
        self
    }

    /// Training by the W data-parallel workers of `comm` (`docs/guide/distributed.md`):
    /// every rank builds its trainer with the same settings and run folder. Each rank holds the
    /// examples i ≡ rank (mod W) and Poisson-samples them at the global rate, clips its own,
    /// adds its share N(0, σ²C²/W) of the noise (the sum over ranks has the single-process σC,
    /// and the accountant is unchanged), encodes with its own compressor state and exchanges
    /// real messages (`train::exchange`); every rank applies the mean of the W decoded updates.
    /// Rank 0 alone writes the run folder. Before training, every rank checks that all share
    /// the configuration, the data and the initial weights; a resumed run must have been saved
    /// by as many workers.
    pub fn communicator(mut self, comm: Box<dyn Communicator>) -> Self {
        self.comm = Some(comm);
        self
    }

    /// Who hears of the run's progress and sees the trainer between epochs
    /// (`Trainer::observe`); several may be given, each hears every call in the order given;
    /// nobody by default.
    pub fn observer(mut self, observer: Box<dyn Observer>) -> Self {
        self.observers.push(observer);
        self
    }

    /// The trainer, ready to `run`.
    pub fn build(self) -> Result<Trainer> {
        if self.conflicting_start {
            return Err(Error::bad_value(
                "trainer",
                "given both config (a fresh run) and resume (a continued one): give one",
            ));
        }
        let mut trainer = match self.start {
            Some(Start::Fresh(config)) => {
                Trainer::start(config, &self.run_dir, self.own, self.edit, self.comm)?
            }
            Some(Start::Continue(overrides)) => {
                if self.edit.is_some() {
                    return Err(Error::bad_value(
                        "edit_data",
                        "applies to a fresh run: a continued run trains on the data its checkpoint was made with",
                    ));
                }
                Trainer::continue_run(&self.run_dir, overrides, self.own, self.comm)?
            }
            None => {
                return Err(Error::bad_value(
                    "trainer",
                    "neither config (a fresh run) nor resume (continue the run in the folder) was given",
                ))
            }
        };
        for observer in self.observers {
            trainer.observe(observer);
        }
        Ok(trainer)
    }
}
