//! `Trainer::builder(run_dir)`: every way to start a `Trainer` in one place, instead
//! of a constructor per combination.
//!
//! ```no_run
//! use dpcomp::prelude::*;
//! /// A private run of one's own model, then its continuation to 20 epochs in a later process.
//! fn train(
//!     make_model: impl Fn() -> Box<dyn Model>,
//!     data: impl Fn() -> TaskData,
//! ) -> Result<()> {
//!     let mut config = TrainConfig::new("my-task");
//!     config.privacy.target_epsilon = Some(3.0); // σ calibrated over the run's epochs
//!     let mut trainer = Trainer::builder("runs/mine")
//!         .config(config)
//!         .model(make_model(), data())
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
use super::optimizer::Optimizer;
use super::parts::{CompressorFactory, Parts, TaskSource};
use super::{DataEdit, OwnTask, Trainer};
use crate::comm::Communicator;
use crate::config::{TrainConfig, TrainOverrides};
use crate::data::TaskData;
use crate::error::{Error, Result};
use crate::models::Model;
use crate::privacy::builder::PrivacyEngineBuilder;
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
    parts: Parts,
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
            parts: Parts::default(),
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

    /// A model and data of one's own (the config's task names them, e.g. `TrainConfig::new`):
    /// everything a task of a `TaskSource` gets (Poisson sampling, the privacy
    /// engine and its accountant, compressors, checkpoints, metrics, resume). The model's
    /// forward takes the batches `data` gives (`Features::Rows` for tensors of one's own);
    /// seed LibTorch (`tch::manual_seed`) before building it for a reproducible start. A
    /// resumed run is given the model built as at the start (its weights are then read from
    /// the checkpoint) and the same data.
    pub fn model(mut self, model: Box<dyn Model>, data: TaskData) -> Self {
        self.parts.task = Some(OwnTask { model, data });
        self
    }

    /// What makes the model and data from the settings' `task` when `model` is not given: a
    /// fresh run, a resume and every data-parallel worker make them from the run's
    /// `config.toml` alone (the `dpcomp` command line hands the papers' tasks so).
    pub fn tasks(mut self, source: std::sync::Arc<dyn TaskSource>) -> Self {
        self.parts.tasks = Some(source);
        self
    }

    /// An optimiser of one's own instead of `[optimizer]`'s kind (whose learning rate and
    /// momentum it then ignores; the batch size still sets the sampling). Its `Optimizer::state`
    /// is saved in every checkpoint (`optimizer.safetensors`) and handed back to `load_state` on
    /// resume; `config.toml` records its `Optimizer::name` (`[parts] optimizer`), and a resumed
    /// run must be given one of the same name. Under DP it receives the privatised gradient, so
    /// whatever it does costs no ε.
    pub fn optimizer(mut self, optimizer: Box<dyn Optimizer>) -> Self {
        self.parts.optimizer = Some(optimizer);
        self
    }

    /// A compressor of one's own (any `Encoder`/`Decoder` pair, made for the model's shapes by
    /// `factory`) instead of `[compression]`'s. Every message still goes through the wire
    /// format and is counted in bits; both sides' state is saved in every checkpoint and loaded
    /// back on resume; `config.toml` records its `CompressorFactory::name`
    /// (`[parts] compressor`). Compression follows the noise, so it costs no ε.
    pub fn compressor(mut self, factory: Box<dyn CompressorFactory>) -> Self {
        self.parts.compressor = Some(factory);
        self
    }

    /// The privacy engine's settings, from `PrivacyEngine::builder()`: the noise
    /// (`noise_multiplier`, or `target_epsilon` to calibrate σ over the run's epochs, or both to
    /// stop the run when the target is reached), `delta`, `accountant`, `max_grad_norm` or
    /// `clipping`, `noise_source`. The trainer supplies what it knows, which the builder must
    /// leave unset: the sampling (q = 1 / ⌈N / B⌉ from its training split and
    /// `optimizer.batch_size`) and the length (its epochs). They become the run's `[privacy]`
    /// settings (`config.toml`), from which the trainer builds its engine, so the run's record,
    /// its ε and a resume without this call agree; the engine's accountant is saved in every
    /// checkpoint. Given to a resumed run, they must be the run's.
    pub fn privacy(mut self, engine: PrivacyEngineBuilder) -> Self {
        self.parts.privacy = Some(engine);
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
                Trainer::start(config, &self.run_dir, self.parts, self.edit, self.comm)?
            }
            Some(Start::Continue(overrides)) => {
                if self.edit.is_some() {
                    return Err(Error::bad_value(
                        "edit_data",
                        "applies to a fresh run: a continued run trains on the data its checkpoint was made with",
                    ));
                }
                Trainer::continue_run(&self.run_dir, overrides, self.parts, self.comm)?
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
