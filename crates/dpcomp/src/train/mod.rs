//! The training loop: one readable pass from configuration to metrics and checkpoints.
//!
//! Per step: forward -> mean cross-entropy -> one backward -> the global gradient norm clipped to
//! C (the paper clips even without privacy) -> SGD. After every epoch: test accuracy, one line in
//! `metrics.jsonl`, a checkpoint. The figure a run reports is the mean test accuracy of its last
//! 10 epochs (Lin 2022, "we measure the test accuracy
//! ... at the end of every epoch and use an average of the last 10 epochs").
//!
//! The `Trainer` is this file: its state and accessors. What it does lives beside it, a file per
//! concern: `start` (a fresh run or a resumed one, and building its parts), `batches` (which
//! examples each step sees), `step` (the non-private step; the private one is `private`),
//! `epoch_loop` (`run`), `evaluate`, and `budget` (the steps a target ε allows). Measurements
//! during training are observers (`observer::Observer::between_epochs`; the gradient-error
//! probe is `analysis::probe`), so the trainer depends on no analysis.

pub mod adam;
pub mod audit;
mod batches;
mod budget;
pub mod builder;
pub mod checkpoint;
pub mod distributed;
mod epoch_loop;
mod evaluate;
pub mod exchange;
pub mod input_canaries;
pub mod metrics;
pub mod observer;
pub mod optimizer;
pub mod parts;
pub mod private;
pub mod sgd;
mod start;
mod step;
pub mod traffic;
pub mod update;
pub mod upload;

pub use evaluate::{evaluate, evaluation_sums};
pub use start::{check_data, hold_on_device, DEVICE_DATA_LIMIT_BYTES};
pub use step::{epoch_seed, train_step};

use crate::config::TrainConfig;
use crate::data::TaskData;
use crate::error::Result;
use crate::models::Model;
use crate::privacy::accountant::Accountant;
use crate::privacy::builder::steps_per_epoch_of_batches;
use crate::privacy::engine::PrivacyEngine;
use crate::run_lock::RunLock;
use checkpoint::TrainState;
use exchange::Exchange;
use metrics::EpochMetrics;
use std::path::{Path, PathBuf};
use tch::{Device, Tensor};
use update::Updater;

/// How `TrainState::stopped` starts when a run stopped because its loss became non-finite.
pub const DIVERGED: &str = "diverged";

/// The settings `dpcomp train --resume` may change: more epochs, a moved data folder, another
/// device (and `--quiet`, which is not a setting). Every other flag must match the run.
pub const RESUME_MAY_CHANGE: [&str; 3] = ["epochs", "data.data_dir", "device"];

/// A model and data of one's own (`TrainerBuilder::model`).
pub(crate) struct OwnTask {
    model: Box<dyn Model>,
    data: TaskData,
}

pub use crate::data::DataEdit;

/// A model, its data and optimiser, and where the run writes. Built by `Trainer::builder`
/// (a fresh run or a resumed one); its parts are read through accessors, so the
/// engine's invariants (no noise without an accountant step, the run folder's one writer)
/// cannot be bypassed.
///
/// A private run of a model of one's own: logistic regression on 1,000 synthetic rows,
/// batches of expected size 50 (q = 1/20, 20 steps an epoch), σ 1, 3 epochs. The run's ε is
/// the accountant's for those 60 steps, and the folder holds the run's records.
///
/// ```
/// use dpcomp::prelude::*;
/// use dpcomp::privacy::accountant::Accountant;
/// use tch::{nn, Device, Kind, Tensor};
///
/// struct Logistic {
///     vs: nn::VarStore,
///     linear: Linear,
/// }
///
/// impl Model for Logistic {
///     fn forward(&self, features: &Features, ctx: &mut Ctx) -> Result<Tensor> {
///         let Features::Rows(x) = features else {
///             return Err(Error::bad_value("features", "expected rows [B, 4]"));
///         };
///         self.linear.forward(x, ctx)
///     }
///     fn var_store(&self) -> &nn::VarStore {
///         &self.vs
///     }
/// }
///
/// /// `n` rows of 4 N(0, 1) features, labelled by the sign of the first.
/// fn rows(n: i64) -> Dataset {
///     let x = Tensor::randn([n, 4], (Kind::Float, Device::Cpu));
///     let y = x.select(1, 0).gt(0.0).to_kind(Kind::Int64);
///     Dataset::new(Features::Rows(x), y, None)
/// }
///
/// tch::manual_seed(0);
/// let vs = nn::VarStore::new(Device::Cpu);
/// let linear = Linear::new(&(vs.root() / "linear"), 4, 2, LinearConfig::default())?;
/// let data = TaskData {
///     train: rows(1000),
///     test: rows(500),
///     classes: vec!["negative".into(), "positive".into()],
/// };
/// let mut config = TrainConfig::new("logistic");
/// config.epochs = 3;
/// config.device = DeviceChoice::Cpu;
/// config.optimizer.batch_size = 50;
/// config.optimizer.lr = 0.5;
/// config.privacy.noise_multiplier = Some(1.0);
/// config.privacy.max_grad_norm = 1.0;
///
/// let run = tempfile::tempdir().unwrap();
/// let mut trainer = Trainer::builder(run.path())
///     .config(config)
///     .model(Box::new(Logistic { vs, linear }), data)
///     .build()?;
/// let summary = trainer.run()?;
/// assert_eq!((summary.epochs, trainer.history().len()), (3, 3));
/// assert_eq!(trainer.steps_per_epoch(), 20);
/// let mut accountant = Accountant::default();
/// accountant.step(1.0, 0.05, 60)?;
/// let (epsilon, _) = accountant.epsilon(AccountantKind::Pld, 1e-5)?; // the default accountant
/// assert_eq!((summary.epsilon, summary.delta), (Some(epsilon), Some(1e-5)));
/// assert!(summary.last_test_accuracy > 0.8, "{}", summary.last_test_accuracy);
/// for record in ["config.toml", "metrics.jsonl", "summary.json"] {
///     assert!(run.path().join(record).is_file(), "{record}");
/// }
/// # Ok::<(), dpcomp::Error>(())
/// ```
pub struct Trainer {
    pub(crate) config: TrainConfig,
    pub(crate) device: Device,
    pub(crate) data: TaskData,
    pub(crate) model: Box<dyn Model>,
    /// Compressor and optimiser: what happens to each step's final gradient.
    pub(crate) updater: Updater,
    /// Trainable variables, sorted by name.
    pub(crate) params: Vec<(String, Tensor)>,
    pub(crate) run_dir: PathBuf,
    pub(crate) state: TrainState,
    pub(crate) history: Vec<EpochMetrics>,
    /// Who hears of the run's progress and measures between epochs (`observe`), in the order
    /// installed; nobody by default: the library writes nothing to stderr on its own.
    observers: Vec<Box<dyn observer::Observer>>,
    /// Under DP: σ, q, clipping, the noise source (seeded, or a CSPRNG with `--secure-noise`)
    /// and the accountant, which only the engine advances (`PrivacyEngine::privatize`).
    pub(crate) privacy: Option<PrivacyEngine>,
    /// An audit's white-box canaries (`privacy::canary`, `dpcomp audit`), set after `new`.
    pub(crate) canaries: Option<crate::privacy::canary::GradientCanaries>,
    /// This process's exclusive hold on `run_dir` (see `run_lock`); `None` on the ranks other
    /// than 0 of a data-parallel run, which write nothing there.
    _lock: Option<RunLock>,
}

impl Trainer {
    /// This worker's rank (0 without workers).
    pub fn rank(&self) -> usize {
        self.updater.exchange.as_ref().map_or(0, |x| x.comm.rank())
    }

    /// W, the number of data-parallel workers (1 without).
    pub fn workers(&self) -> usize {
        self.updater.exchange.as_ref().map_or(1, Exchange::workers)
    }

    /// Whether this process writes the run folder (rank 0).
    fn writes(&self) -> bool {
        self.rank() == 0
    }

    /// The accountant of a private run (`None` without privacy).
    pub fn accountant(&self) -> Option<&Accountant> {
        self.privacy.as_ref().map(PrivacyEngine::accountant)
    }

    /// "seeded" or "secure" under DP.
    pub fn noise_label(&self) -> Option<String> {
        self.privacy.as_ref().map(|e| e.noise_label().to_string())
    }

    /// Sampling rate q of one DP step: 1 / (steps per epoch), as Opacus sets it (the privacy
    /// engine's q under DP).
    pub fn sample_rate(&self) -> f64 {
        1.0 / self.steps_per_epoch() as f64
    }

    /// Steps in an epoch: ⌈N / B⌉ for the N examples of the whole training split (with W
    /// workers too) and the batch size B (`privacy::builder::steps_per_epoch_of_batches`, the
    /// rule the privacy engine's q = 1 / ⌈N / B⌉ comes from).
    pub fn steps_per_epoch(&self) -> i64 {
        steps_per_epoch_of_batches(
            self.data.train.len().max(0) as u64,
            self.config.optimizer.batch_size as u64,
        ) as i64
    }

    /// The run's settings (with a σ calibrated from a target ε filled in).
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// Where the model and the steps run.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The training and test splits, on the device.
    pub fn data(&self) -> &TaskData {
        &self.data
    }

    /// The model being trained.
    pub fn model(&self) -> &dyn Model {
        self.model.as_ref()
    }

    /// The trainable variables, sorted by name (what the optimiser updates).
    pub fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }

    /// The run folder.
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// Epochs and steps done, traffic so far, why the run stopped (what a checkpoint holds).
    pub fn state(&self) -> &TrainState {
        &self.state
    }

    /// Every epoch's metrics row so far (`metrics.jsonl`), a resumed run's earlier ones first.
    pub fn history(&self) -> &[EpochMetrics] {
        &self.history
    }

    /// The privacy engine (σ, q, clipping, the accountant); `None` without DP.
    pub fn privacy(&self) -> Option<&PrivacyEngine> {
        self.privacy.as_ref()
    }

    /// The compressor and optimiser each step's gradient goes through.
    pub fn updater(&self) -> &Updater {
        &self.updater
    }

    /// Installs `observer`: it hears of every epoch's start and end, every step, the running
    /// totals every `Observer::interval` steps, why a run stopped early, and it sees the trainer
    /// between epochs. Observers installed before stay; each hears every call, in the order
    /// installed. None by default (a silent run).
    pub fn observe(&mut self, observer: Box<dyn observer::Observer>) {
        self.observers.push(observer);
    }

    /// Removes every observer, so the run is silent again.
    pub fn silence(&mut self) {
        self.observers.clear();
    }

    /// ε spent so far with the configured accountant; `None` without privacy.
    pub fn epsilon(&self) -> Result<Option<f64>> {
        match &self.privacy {
            Some(engine) => Ok(Some(engine.epsilon()?)),
            None => Ok(None),
        }
    }
}
