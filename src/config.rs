//! Training configuration: the paper's defaults per task, overridden by a TOML file, overridden
//! by command-line flags. The resolved configuration is written to `runs/<name>/config.toml`
//! before the first step.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The paper's four tasks (`../shared/papers/dp-and-gradient-compression.txt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Task {
    Surnames,
    Cifar10,
    Cifar100,
    Snli,
}

impl Task {
    pub const ALL: [Task; 4] = [Task::Surnames, Task::Cifar10, Task::Cifar100, Task::Snli];

    pub fn name(self) -> &'static str {
        match self {
            Task::Surnames => "surnames",
            Task::Cifar10 => "cifar10",
            Task::Cifar100 => "cifar100",
            Task::Snli => "snli",
        }
    }
}

impl std::fmt::Display for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a run trains: one of the paper's tasks (data and model built by `tasks::prepare`), or a
/// model and data of one's own handed to `Trainer::with_model` under a name of one's choosing.
/// In `config.toml` both are a plain string (`task = "cifar10"`, `task = "my-tabular-mlp"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TaskName {
    Builtin(Task),
    Own(String),
}

impl TaskName {
    /// The built-in task, or an error for a run of one's own (its model and data exist only in
    /// the program that trained it: `Trainer::resume_with_model`).
    pub fn builtin(&self) -> Result<Task> {
        match self {
            TaskName::Builtin(task) => Ok(*task),
            TaskName::Own(name) => Err(Error::bad_value(
                "task",
                format!(
                    "{name:?} is a model of one's own, not one of surnames, cifar10, cifar100, snli: \
                     its model and data come from the program that trains it (`Trainer::with_model`, \
                     `Trainer::resume_with_model`)"
                ),
            )),
        }
    }
}

impl std::fmt::Display for TaskName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TaskName::Builtin(task) => task.fmt(f),
            TaskName::Own(name) => f.write_str(name),
        }
    }
}

impl PartialEq<Task> for TaskName {
    fn eq(&self, other: &Task) -> bool {
        *self == TaskName::Builtin(*other)
    }
}

impl From<Task> for TaskName {
    fn from(task: Task) -> Self {
        TaskName::Builtin(task)
    }
}

/// `--device auto|cpu|cuda`: auto picks CUDA when LibTorch sees a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum DeviceChoice {
    #[default]
    Auto,
    Cpu,
    Cuda,
}

impl DeviceChoice {
    pub fn device(self) -> Result<tch::Device> {
        match self {
            DeviceChoice::Auto => Ok(tch::Device::cuda_if_available()),
            DeviceChoice::Cpu => Ok(tch::Device::Cpu),
            DeviceChoice::Cuda if tch::Cuda::is_available() => Ok(tch::Device::Cuda(0)),
            DeviceChoice::Cuda => Err(Error::bad_value(
                "device",
                "cuda requested but LibTorch finds no CUDA device",
            )),
        }
    }
}

/// How DP training draws its batches. Poisson sampling (each example independently with
/// probability q) is what the accountants assume; shuffled fixed-size batches are offered as the
/// common approximation and are reported as such in the run's metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Sampling {
    #[default]
    Poisson,
    Shuffle,
}

/// The optimiser the (under DP: privatised) gradient drives (`train::optimizer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// SGD with optional heavy-ball momentum (the paper's).
    #[default]
    Sgd,
    /// Adam (torch.optim.Adam): DP-Adam under --noise-multiplier.
    Adam,
}

/// How DP training bounds each example's gradient (`privacy::engine::Clipping`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum ClippingMode {
    /// One radius C (--max-grad-norm) over all parameters (Abadi et al. 2016).
    #[default]
    Flat,
    /// Each parameter tensor clipped to C / sqrt(L) on its own (L tensors), so that the noise's
    /// sensitivity, sqrt(Σ C_l²) = C, and hence ε stay those of flat clipping.
    PerLayer,
    /// One radius that starts at C and tracks the --target-quantile of the per-example norms
    /// (Andrew et al. 2021); its noisy count is paid for inside σ (`privacy::engine`).
    Adaptive,
}

pub use crate::privacy::AccountantKind;

/// How per-sample gradients are computed in DP training.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum GradSampleMode {
    /// One backward pass over the recorded tape (`privacy::grad_sample`).
    #[default]
    Tape,
    /// Per-example autograd, one example at a time: slow and obviously correct.
    Oracle,
}

/// Everything a training run depends on. Saved as the run's `config.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    pub task: TaskName,
    pub epochs: usize,
    pub batch_size: usize,
    pub lr: f64,
    /// SGD momentum (0 = the paper's plain SGD).
    pub momentum: f64,
    /// SGD or Adam (older configs have none: SGD).
    #[serde(default)]
    pub optimizer: OptimizerKind,
    /// Adam's β1, β2 and ε (torch.optim.Adam's defaults).
    #[serde(default = "adam_beta1")]
    pub adam_beta1: f64,
    #[serde(default = "adam_beta2")]
    pub adam_beta2: f64,
    #[serde(default = "adam_eps")]
    pub adam_eps: f64,
    /// Clipping radius C: the global gradient norm is clipped to C even without privacy.
    pub max_grad_norm: f64,
    pub seed: u64,
    /// Train on the first N examples only (after the deterministic split).
    pub limit_train: Option<usize>,
    /// Evaluate on the first N test examples only.
    pub limit_test: Option<usize>,
    pub data_dir: Option<PathBuf>,
    pub device: DeviceChoice,
    /// Random crop + flip on CIFAR training batches.
    pub augment: bool,
    /// SNLI: maximum tokens of a pair after WordPiece.
    pub max_seq_len: usize,
    /// SNLI: folder with config.json, model.safetensors and tokenizer.json or vocab.txt.
    pub bert_dir: PathBuf,
    pub eval_batch_size: usize,
    /// DP-SGD noise multiplier σ; `None` trains without privacy (global-norm clipping only).
    /// σ = 0 still clips every per-sample gradient, so private and non-private runs differ only
    /// by the noise.
    pub noise_multiplier: Option<f64>,
    /// δ of the reported (ε, δ).
    pub delta: f64,
    /// Stop before a step that would take ε past this.
    pub target_epsilon: Option<f64>,
    pub sampling: Sampling,
    /// Flat or per-layer clipping (older configs have none: flat).
    #[serde(default)]
    pub clipping: ClippingMode,
    /// Adaptive clipping: γ, the share of examples left unclipped (Andrew et al.: 0.5).
    #[serde(default = "default_target_quantile")]
    pub target_quantile: f64,
    /// Adaptive clipping: η of C <- C exp(-η (b̃ - γ)) (Andrew et al.: 0.2).
    #[serde(default = "default_clip_learning_rate")]
    pub clip_learning_rate: f64,
    /// Adaptive clipping: σ_b, the noise on the unclipped count; `None`: E[B] / 20 (Andrew et al.).
    #[serde(default)]
    pub count_noise: Option<f64>,
    pub accountant: AccountantKind,
    /// Split each logical batch into chunks of at most this many examples (memory); the noise is
    /// still added once per logical step.
    pub physical_batch_size: Option<usize>,
    pub grad_sample: GradSampleMode,
    /// Gradient compressor applied after clipping and noise (issue 4).
    #[serde(default)]
    pub compressor: crate::compress::CompressorKind,
    /// Compression rate of the sparsifiers: dense fp32 bits / message bits (1 = dense).
    #[serde(default = "one")]
    pub rate: f64,
    /// PowerSGD's rank.
    #[serde(default = "one_i64")]
    pub rank: i64,
    /// `key=value` settings of the compressor (see `dpcomp train --help`).
    #[serde(default)]
    pub compressor_options: Vec<String>,
    /// Measure the gradient error (`analysis::gradient_error`) at the end of these epochs
    /// (1-based; 0 = before training); written to the run's grad_error.jsonl.
    #[serde(default)]
    pub grad_error_epochs: Vec<usize>,
    /// Fixed batches per gradient-error measurement.
    #[serde(default = "four")]
    pub grad_error_batches: usize,
    /// Noise draws per batch in a gradient-error measurement (bias²/variance split).
    #[serde(default = "eight")]
    pub grad_error_draws: usize,
    /// DP noise (and the epochs' sampling) from the operating system's randomness instead of the
    /// seed: nobody holding the run folder can regenerate it (`privacy::noise`).
    #[serde(default)]
    pub secure_noise: bool,
}

fn adam_beta1() -> f64 {
    0.9
}

fn adam_beta2() -> f64 {
    0.999
}

fn adam_eps() -> f64 {
    1e-8
}

fn default_target_quantile() -> f64 {
    crate::privacy::engine::AdaptiveClipping::DEFAULT_TARGET_QUANTILE
}

fn default_clip_learning_rate() -> f64 {
    crate::privacy::engine::AdaptiveClipping::DEFAULT_LEARNING_RATE
}

fn four() -> usize {
    4
}

fn eight() -> usize {
    8
}

fn one() -> f64 {
    1.0
}

fn one_i64() -> i64 {
    1
}

impl TrainConfig {
    /// Settings for a model of one's own named `name` (`Trainer::with_model`): SGD at learning
    /// rate 0.1, batch size 64, 10 epochs, radius C = 1, δ = 1e-5, no privacy until
    /// `noise_multiplier` is set. Every field is public: set what differs.
    pub fn own(name: &str) -> Self {
        TrainConfig {
            task: TaskName::Own(name.to_string()),
            lr: 0.1,
            batch_size: 64,
            epochs: 10,
            max_grad_norm: 1.0,
            delta: 1e-5,
            eval_batch_size: 1024,
            ..TrainConfig::paper_defaults(Task::Cifar10)
        }
    }

    /// The paper's settings for `task`: learning rate, batch size, epochs and clipping radius.
    pub fn paper_defaults(task: Task) -> Self {
        let (lr, batch_size, epochs, max_grad_norm) = match task {
            Task::Surnames => (2.0, 32, 100, 3.0),
            Task::Cifar10 => (0.1, 128, 100, 5.0),
            Task::Snli => (0.05, 32, 1, 21.0),
            Task::Cifar100 => (1.0, 64, 100, 1000.0),
        };
        TrainConfig {
            task: TaskName::Builtin(task),
            epochs,
            batch_size,
            lr,
            momentum: 0.0,
            optimizer: OptimizerKind::Sgd,
            adam_beta1: adam_beta1(),
            adam_beta2: adam_beta2(),
            adam_eps: adam_eps(),
            max_grad_norm,
            seed: 0,
            limit_train: None,
            limit_test: None,
            data_dir: None,
            device: DeviceChoice::Auto,
            augment: false,
            max_seq_len: crate::data::snli::DEFAULT_MAX_LEN,
            bert_dir: PathBuf::from("models/all-MiniLM-L6-v2"),
            eval_batch_size: if task == Task::Snli { 128 } else { 1024 },
            noise_multiplier: None,
            delta: match task {
                Task::Surnames => 8e-5,
                Task::Cifar10 | Task::Cifar100 => 1e-5,
                Task::Snli => 1.0 / 549_361.0,
            },
            target_epsilon: None,
            sampling: Sampling::Poisson,
            clipping: ClippingMode::Flat,
            target_quantile: default_target_quantile(),
            clip_learning_rate: default_clip_learning_rate(),
            count_noise: None,
            accountant: AccountantKind::Rdp,
            physical_batch_size: None,
            grad_sample: GradSampleMode::Tape,
            compressor: crate::compress::CompressorKind::Identity,
            rate: 1.0,
            rank: 1,
            compressor_options: Vec::new(),
            grad_error_epochs: Vec::new(),
            grad_error_batches: four(),
            grad_error_draws: eight(),
            secure_noise: false,
        }
    }

    /// The compressor settings, checked.
    pub fn compressor_spec(&self) -> Result<crate::compress::CompressorSpec> {
        crate::compress::CompressorSpec::new(
            self.compressor,
            self.rate,
            self.rank,
            &self.compressor_options,
        )
    }

    /// Whether this run trains with DP-SGD.
    pub fn private(&self) -> bool {
        self.noise_multiplier.is_some()
    }

    pub fn validate(&self) -> Result<()> {
        let positive = |field: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(Error::bad_value(
                    field,
                    format!("{v}: expected a positive number"),
                ))
            }
        };
        if let TaskName::Own(name) = &self.task {
            if name.trim().is_empty() || Task::ALL.iter().any(|t| t.name() == name) {
                return Err(Error::bad_value(
                    "task",
                    format!("{name:?}: a model of one's own needs a non-empty name that is not a built-in task's"),
                ));
            }
        }
        positive("epochs", self.epochs as f64)?;
        positive("batch_size", self.batch_size as f64)?;
        positive("eval_batch_size", self.eval_batch_size as f64)?;
        positive("lr", self.lr)?;
        if self.max_grad_norm.is_nan() || self.max_grad_norm <= 0.0 {
            return Err(Error::bad_value(
                "max_grad_norm",
                format!(
                    "{}: expected a positive number (inf disables clipping)",
                    self.max_grad_norm
                ),
            ));
        }
        if !(0.0..1.0).contains(&self.momentum) {
            return Err(Error::bad_value(
                "momentum",
                format!("{}: expected 0 <= momentum < 1", self.momentum),
            ));
        }
        positive("max_seq_len", self.max_seq_len as f64)?;
        positive("grad_error_batches", self.grad_error_batches as f64)?;
        positive("grad_error_draws", self.grad_error_draws as f64)?;
        if let Some(sigma) = self.noise_multiplier {
            if !(sigma >= 0.0 && sigma.is_finite()) {
                return Err(Error::bad_value(
                    "noise_multiplier",
                    format!("{sigma}: expected a finite sigma >= 0"),
                ));
            }
            if sigma > 0.0 && !self.max_grad_norm.is_finite() {
                return Err(Error::bad_value(
                    "max_grad_norm",
                    "inf: DP noise needs a finite clipping radius",
                ));
            }
            crate::privacy::validate_delta(self.delta).map_err(|_| {
                Error::bad_value("delta", format!("{}: expected 0 < delta < 1", self.delta))
            })?;
        }
        if let Some(e) = self.target_epsilon {
            if !self.private() {
                return Err(Error::bad_value(
                    "target_epsilon",
                    "needs `noise_multiplier` (DP training)",
                ));
            }
            positive("target_epsilon", e)?;
        }
        if self.physical_batch_size.is_some() && !self.private() {
            return Err(Error::bad_value(
                "physical_batch_size",
                "applies to DP training (`noise_multiplier`), whose per-sample gradients it computes in chunks; a non-private step takes its whole batch at once",
            ));
        }
        if self.optimizer == OptimizerKind::Adam {
            if self.momentum != 0.0 {
                return Err(Error::bad_value(
                    "momentum",
                    format!("{}: SGD's momentum; Adam's is `adam_beta1`", self.momentum),
                ));
            }
            for (field, beta) in [
                ("adam_beta1", self.adam_beta1),
                ("adam_beta2", self.adam_beta2),
            ] {
                if !(0.0..1.0).contains(&beta) {
                    return Err(Error::bad_value(
                        field,
                        format!("{beta}: expected 0 <= beta < 1"),
                    ));
                }
            }
            positive("adam_eps", self.adam_eps)?;
        }
        if self.clipping != ClippingMode::Flat && !self.private() {
            return Err(Error::bad_value(
                "clipping",
                "applies to DP training (`noise_multiplier`); a non-private step clips its mean gradient with `max_grad_norm`",
            ));
        }
        let adaptive_settings = [
            (
                "target_quantile",
                self.target_quantile != default_target_quantile(),
            ),
            (
                "clip_learning_rate",
                self.clip_learning_rate != default_clip_learning_rate(),
            ),
            ("count_noise", self.count_noise.is_some()),
        ];
        if let Some((field, _)) = adaptive_settings.iter().find(|(_, given)| *given) {
            if self.clipping != ClippingMode::Adaptive {
                return Err(Error::bad_value(
                    *field,
                    "applies to adaptive clipping only (`clipping` adaptive)",
                ));
            }
        }
        if self.physical_batch_size == Some(0) {
            return Err(Error::bad_value(
                "physical_batch_size",
                "0: expected at least 1",
            ));
        }
        let spec = self.compressor_spec()?;
        if spec.kind == crate::compress::CompressorKind::Dgc
            && spec.dgc_options()?.momentum > 0.0
            && self.momentum > 0.0
        {
            return Err(Error::bad_value(
                "momentum",
                "DGC's momentum correction applies the momentum before compression; set the optimiser's `momentum` to 0",
            ));
        }
        if self.limit_train == Some(0) || self.limit_test == Some(0) {
            return Err(Error::bad_value(
                "limit_train/limit_test",
                "0: expected at least 1 example",
            ));
        }
        Ok(())
    }

    /// Settings that are valid but will have no effect in this run, in words for the user
    /// (the trainer reports them through `log::warn!` when it starts or resumes).
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        let beyond: Vec<usize> = (self.grad_error_epochs.iter())
            .copied()
            .filter(|&e| e > self.epochs)
            .collect();
        if !beyond.is_empty() {
            warnings.push(format!(
                "grad_error_epochs {beyond:?} lie beyond the run's {} epochs and will not be measured (resume the run with more `epochs`)",
                self.epochs
            ));
        }
        let adam_changed = self.adam_beta1 != adam_beta1()
            || self.adam_beta2 != adam_beta2()
            || self.adam_eps != adam_eps();
        if self.optimizer == OptimizerKind::Sgd && adam_changed {
            warnings.push(
                "adam_beta1/adam_beta2/adam_eps are set but the optimizer is SGD: they have no effect (set `optimizer` to adam)".to_string(),
            );
        }
        if self.optimizer == OptimizerKind::Adam && self.momentum != 0.0 {
            warnings.push(format!(
                "momentum {} has no effect with Adam (its first moment is adam_beta1)",
                self.momentum
            ));
        }
        let adaptive_changed = self.target_quantile != default_target_quantile()
            || self.clip_learning_rate != default_clip_learning_rate()
            || self.count_noise.is_some();
        if self.clipping != ClippingMode::Adaptive && adaptive_changed {
            warnings.push(
                "target_quantile/clip_learning_rate/count_noise are set but clipping is not adaptive: they have no effect (set `clipping` to adaptive)".to_string(),
            );
        }
        warnings
    }

    /// The settings that differ between `self` and `other`, as (field, self's value, other's
    /// value) in TOML notation; a setting absent from one side shows as "none".
    pub fn differences(&self, other: &TrainConfig) -> Vec<(String, String, String)> {
        let table = |c: &TrainConfig| match toml::Value::try_from(c) {
            Ok(toml::Value::Table(t)) => t,
            _ => unreachable!("TrainConfig serialises to a table"),
        };
        let (a, b) = (table(self), table(other));
        let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
        keys.sort();
        keys.dedup();
        let show = |v: Option<&toml::Value>| v.map_or("none".to_string(), |v| v.to_string());
        keys.into_iter()
            .filter(|k| a.get(*k) != b.get(*k))
            .map(|k| (k.clone(), show(a.get(k)), show(b.get(k))))
            .collect()
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("TrainConfig always serialises")
    }

    pub fn from_toml_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        toml::from_str(&text).map_err(|e| Error::bad_file(path, e.to_string()))
    }
}

/// Optional settings, from a `--config` TOML file or from flags; each given one replaces the
/// default. Unknown keys in the file are errors that name the file and the key.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct TrainOverrides {
    /// Task (a config file may set it instead).
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub task: Option<Task>,
    /// Passes over the training set [default: the paper's, 100; SNLI 1].
    #[cfg_attr(feature = "cli", arg(long))]
    pub epochs: Option<usize>,
    /// Examples per step; under Poisson sampling the expected batch, q = batch / N [default: the
    /// paper's: Surnames 32, CIFAR-10 128, CIFAR-100 64, SNLI 32].
    #[cfg_attr(feature = "cli", arg(long))]
    pub batch_size: Option<usize>,
    /// SGD learning rate [default: the paper's: Surnames 2.0, CIFAR-10 0.1, CIFAR-100 1.0, SNLI 0.05].
    #[cfg_attr(feature = "cli", arg(long))]
    pub lr: Option<f64>,
    /// SGD momentum, 0 <= m < 1 [default: 0, the paper's plain SGD].
    #[cfg_attr(feature = "cli", arg(long))]
    pub momentum: Option<f64>,
    /// sgd or adam (DP-Adam under --noise-multiplier) [default: sgd].
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub optimizer: Option<OptimizerKind>,
    /// Adam's β1 [default: 0.9].
    #[cfg_attr(feature = "cli", arg(long))]
    pub adam_beta1: Option<f64>,
    /// Adam's β2 [default: 0.999].
    #[cfg_attr(feature = "cli", arg(long))]
    pub adam_beta2: Option<f64>,
    /// Adam's ε [default: 1e-8].
    #[cfg_attr(feature = "cli", arg(long))]
    pub adam_eps: Option<f64>,
    /// Clipping radius C (the global gradient norm is clipped even without privacy).
    #[cfg_attr(feature = "cli", arg(long))]
    pub max_grad_norm: Option<f64>,
    /// Seed of the initial weights, the batches and (unless --secure-noise) the DP noise
    /// [default: 0].
    #[cfg_attr(feature = "cli", arg(long))]
    pub seed: Option<u64>,
    /// Train on the first N training examples only.
    #[cfg_attr(feature = "cli", arg(long))]
    pub limit_train: Option<usize>,
    /// Evaluate on the first N test examples only.
    #[cfg_attr(feature = "cli", arg(long))]
    pub limit_test: Option<usize>,
    /// Data folder (default: $DPCOMP_DATA, else data/).
    #[cfg_attr(feature = "cli", arg(long))]
    pub data_dir: Option<PathBuf>,
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub device: Option<DeviceChoice>,
    /// Random crop and horizontal flip on CIFAR training images.
    #[cfg_attr(feature = "cli", arg(long))]
    pub augment: Option<bool>,
    /// SNLI: longest WordPiece pair kept (longer pairs are truncated).
    #[cfg_attr(feature = "cli", arg(long))]
    pub max_seq_len: Option<usize>,
    /// SNLI: the BERT folder (config.json, model.safetensors, tokenizer.json or vocab.txt)
    /// [default: models/all-MiniLM-L6-v2, installed by scripts/setup.sh].
    #[cfg_attr(feature = "cli", arg(long))]
    pub bert_dir: Option<PathBuf>,
    /// Examples per evaluation batch (memory only; results do not depend on it).
    #[cfg_attr(feature = "cli", arg(long))]
    pub eval_batch_size: Option<usize>,
    /// DP-SGD noise multiplier sigma (turns on per-sample clipping and noise; 0 clips only).
    #[cfg_attr(feature = "cli", arg(long))]
    pub noise_multiplier: Option<f64>,
    /// δ of the reported (ε, δ) [default: the paper's: Surnames 8e-5, CIFAR 1e-5, SNLI 1/N].
    #[cfg_attr(feature = "cli", arg(long))]
    pub delta: Option<f64>,
    /// Stop before a step that would exceed this epsilon.
    #[cfg_attr(feature = "cli", arg(long))]
    pub target_epsilon: Option<f64>,
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub sampling: Option<Sampling>,
    /// DP clipping: flat (one radius C) or per-layer (C / sqrt(L) per parameter tensor, the
    /// same noise) [default: flat].
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub clipping: Option<ClippingMode>,
    /// Adaptive clipping: the share of examples the radius should leave unclipped [default: 0.5].
    #[cfg_attr(feature = "cli", arg(long))]
    pub target_quantile: Option<f64>,
    /// Adaptive clipping: step size of the radius's geometric update [default: 0.2].
    #[cfg_attr(feature = "cli", arg(long))]
    pub clip_learning_rate: Option<f64>,
    /// Adaptive clipping: standard deviation of the noise on the unclipped count, in examples;
    /// must exceed sigma / 2 [default: the expected batch / 20].
    #[cfg_attr(feature = "cli", arg(long))]
    pub count_noise: Option<f64>,
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub accountant: Option<AccountantKind>,
    /// Largest chunk of a logical batch processed at once.
    #[cfg_attr(feature = "cli", arg(long))]
    pub physical_batch_size: Option<usize>,
    /// Per-sample gradients from the tape (fast) or per-example autograd (oracle).
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub grad_sample: Option<GradSampleMode>,
    /// Gradient compressor, applied after clipping and noise [default: identity].
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub compressor: Option<crate::compress::CompressorKind>,
    /// DGC/Denoise: dense fp32 bits / message bits (the paper: 1, 16, 256) [default: 1].
    #[cfg_attr(feature = "cli", arg(long))]
    pub rate: Option<f64>,
    /// PowerSGD: rank of the approximation (the paper: 1, 16) [default: 1].
    #[cfg_attr(feature = "cli", arg(long))]
    pub rank: Option<i64>,
    /// Compressor setting key=value, repeatable. dgc: value_bits (9-32), index_bits (32|min),
    /// momentum, masking, warmup_epochs, topk (sampled|exact), sample_ratio. powersgd: shape
    /// (square|rows), min_rate, epsilon, warm_start, seed. denoise: beta, decay, scope
    /// (layer|model), value_bits, index_bits, topk, sample_ratio, clip.
    #[cfg_attr(
        feature = "cli",
        arg(long = "compressor-option", value_name = "KEY=VALUE")
    )]
    #[serde(alias = "compressor_option")]
    pub compressor_options: Option<Vec<String>>,
    /// Measure the gradient error after these epochs (comma-separated, 0 = before training):
    /// clip / noise / compress error against the true mean gradient, bias² and variance, in
    /// grad_error.jsonl.
    #[cfg_attr(feature = "cli", arg(long, value_delimiter = ','))]
    pub grad_error_epochs: Option<Vec<usize>>,
    /// Fixed batches per gradient-error measurement [default: 4].
    #[cfg_attr(feature = "cli", arg(long))]
    pub grad_error_batches: Option<usize>,
    /// Noise draws per batch per gradient-error measurement [default: 8].
    #[cfg_attr(feature = "cli", arg(long))]
    pub grad_error_draws: Option<usize>,
    /// Draw the DP noise from a CSPRNG seeded by the operating system (and the epochs' Poisson
    /// batches from OS-seeded LibTorch), never from --seed: for models released from sensitive
    /// data. Not reproducible. [default: false, seeded noise for reproducible experiments]
    #[cfg_attr(feature = "cli", arg(long, num_args = 0..=1, default_missing_value = "true"))]
    pub secure_noise: Option<bool>,
}

impl TrainOverrides {
    pub fn from_toml_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        toml::from_str(&text).map_err(|e| Error::bad_file(path, e.to_string()))
    }

    /// `self` where given, else `base`.
    pub fn or(self, base: TrainOverrides) -> TrainOverrides {
        TrainOverrides {
            task: self.task.or(base.task),
            epochs: self.epochs.or(base.epochs),
            batch_size: self.batch_size.or(base.batch_size),
            lr: self.lr.or(base.lr),
            momentum: self.momentum.or(base.momentum),
            optimizer: self.optimizer.or(base.optimizer),
            adam_beta1: self.adam_beta1.or(base.adam_beta1),
            adam_beta2: self.adam_beta2.or(base.adam_beta2),
            adam_eps: self.adam_eps.or(base.adam_eps),
            max_grad_norm: self.max_grad_norm.or(base.max_grad_norm),
            seed: self.seed.or(base.seed),
            limit_train: self.limit_train.or(base.limit_train),
            limit_test: self.limit_test.or(base.limit_test),
            data_dir: self.data_dir.or(base.data_dir),
            device: self.device.or(base.device),
            augment: self.augment.or(base.augment),
            max_seq_len: self.max_seq_len.or(base.max_seq_len),
            bert_dir: self.bert_dir.or(base.bert_dir),
            eval_batch_size: self.eval_batch_size.or(base.eval_batch_size),
            noise_multiplier: self.noise_multiplier.or(base.noise_multiplier),
            delta: self.delta.or(base.delta),
            target_epsilon: self.target_epsilon.or(base.target_epsilon),
            sampling: self.sampling.or(base.sampling),
            clipping: self.clipping.or(base.clipping),
            target_quantile: self.target_quantile.or(base.target_quantile),
            clip_learning_rate: self.clip_learning_rate.or(base.clip_learning_rate),
            count_noise: self.count_noise.or(base.count_noise),
            accountant: self.accountant.or(base.accountant),
            physical_batch_size: self.physical_batch_size.or(base.physical_batch_size),
            grad_sample: self.grad_sample.or(base.grad_sample),
            compressor: self.compressor.or(base.compressor),
            rate: self.rate.or(base.rate),
            rank: self.rank.or(base.rank),
            compressor_options: self.compressor_options.or(base.compressor_options),
            grad_error_epochs: self.grad_error_epochs.or(base.grad_error_epochs),
            grad_error_batches: self.grad_error_batches.or(base.grad_error_batches),
            grad_error_draws: self.grad_error_draws.or(base.grad_error_draws),
            secure_noise: self.secure_noise.or(base.secure_noise),
        }
    }

    /// Writes every given setting into `config`.
    pub fn apply(self, config: &mut TrainConfig) {
        macro_rules! set {
            ($($field:ident),* $(,)?) => { $( if let Some(v) = self.$field { config.$field = v; } )* };
        }
        macro_rules! set_optional {
            ($($field:ident),* $(,)?) => { $( if self.$field.is_some() { config.$field = self.$field; } )* };
        }
        if let Some(task) = self.task {
            config.task = TaskName::Builtin(task);
        }
        set!(
            epochs,
            batch_size,
            lr,
            momentum,
            optimizer,
            adam_beta1,
            adam_beta2,
            adam_eps,
            max_grad_norm,
            seed,
            device,
            augment,
            max_seq_len,
            bert_dir,
            eval_batch_size,
            delta,
            sampling,
            clipping,
            target_quantile,
            clip_learning_rate,
            accountant,
            grad_sample,
            compressor,
            rate,
            rank,
            compressor_options,
            grad_error_epochs,
            grad_error_batches,
            grad_error_draws,
            secure_noise,
        );
        set_optional!(
            limit_train,
            limit_test,
            data_dir,
            noise_multiplier,
            target_epsilon,
            physical_batch_size,
            count_noise
        );
    }

    /// Paper defaults for the task, then these settings. Errors when no task is given.
    pub fn resolve(self) -> Result<TrainConfig> {
        let task = self
            .task
            .ok_or_else(|| Error::bad_value("task", "missing: every run names its task"))?;
        let mut config = TrainConfig::paper_defaults(task);
        self.apply(&mut config);
        config.validate()?;
        Ok(config)
    }
}
