//! Training configuration: every section's defaults (or a task's, given by the program that names
//! the task), overridden by a TOML file, overridden by command-line flags. The resolved
//! configuration is written to `runs/<name>/config.toml` before the first step.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// `--device auto|cpu|cuda`: auto picks CUDA when LibTorch sees a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum DeviceChoice {
    /// CUDA when LibTorch sees a GPU, else the CPU.
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// This process's CUDA device: under torchrun the one LOCAL_RANK names, else the first; an
    /// error when there is none.
    Cuda,
}

/// The GPU of this process among `gpus`: the one `LOCAL_RANK` names (torchrun starts one
/// process per GPU and sets it), wrapped around when a machine runs more processes than it has
/// GPUs (so they share them); the first where it is unset or not a number.
pub fn this_process_gpu(local_rank: Option<&str>, gpus: usize) -> usize {
    match local_rank.and_then(|r| r.trim().parse::<usize>().ok()) {
        Some(rank) if gpus > 0 => rank % gpus,
        _ => 0,
    }
}

impl DeviceChoice {
    /// The device this choice resolves to on this machine; `Cuda` without a GPU is an error
    /// naming `device`. A CUDA device is this process's (`this_process_gpu`).
    pub fn device(self) -> Result<tch::Device> {
        let gpu = || {
            let gpus = tch::Cuda::device_count().max(0) as usize;
            tch::Device::Cuda(this_process_gpu(
                std::env::var("LOCAL_RANK").ok().as_deref(),
                gpus,
            ))
        };
        match self {
            DeviceChoice::Auto if tch::Cuda::is_available() => Ok(gpu()),
            DeviceChoice::Auto => Ok(tch::Device::Cpu),
            DeviceChoice::Cpu => Ok(tch::Device::Cpu),
            DeviceChoice::Cuda if tch::Cuda::is_available() => Ok(gpu()),
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
    /// Each example independently with probability q: what the accountants assume.
    #[default]
    Poisson,
    /// A shuffled partition into fixed-size batches each epoch: the common approximation, not
    /// what ε is computed for (the run's metadata says so).
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

/// A setting's value as `config.toml` writes it (`pld`, `two-pass`).
fn value_name<T: Serialize>(value: &T) -> String {
    match toml::Value::try_from(value) {
        Ok(toml::Value::String(name)) => name,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

/// How per-sample gradients are computed in DP training.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum GradSampleMode {
    /// One backward pass over the recorded tape (`privacy::grad_sample::clipped_sums`): each
    /// layer's per-sample gradient recipe and norms formed inside it by a gradient hook the
    /// moment its output gradient exists, then the clipped sums contracted from the recipes:
    /// fastest, and (ResNet-18) about 1.2x the non-private step's peak memory. Models with an
    /// LSTM or GRU (layers outside autograd) take the backward pass to every recorded output.
    #[default]
    Tape,
    /// Two backward passes (`privacy::grad_sample::clipped_sums`): the per-sample norms taken
    /// inside the first by gradient hooks, then the reweighted loss's (Opacus's fast gradient
    /// clipping): about one more backward pass of time, for no less memory than `tape` since
    /// the graph is kept for the second pass. Per-layer clipping and models with an LSTM or
    /// GRU use one pass.
    #[serde(rename = "two-pass")]
    #[cfg_attr(feature = "cli", value(name = "two-pass"))]
    TwoPass,
    /// Per-example autograd, one example at a time: slow and obviously correct.
    Oracle,
}

/// Defines one section of the training configuration from a list of settings, each written
/// once: its doc comment (also the flag's help), the field's name in the section, its flat key
/// (the flag's name with underscores, and the key of `--config` files, experiment files and the
/// flat `config.toml` of runs made before the sections), its type, its default and clap's
/// attributes. Generated: the section struct (serde, its `Default`), the overrides struct (every
/// setting an `Option`, clap's arguments), `or`, `apply`, and the section's key table.
/// Settings under `optional` are `Option`s in the section too (absent by default).
macro_rules! settings_section {
    (
        $(#[$section_doc:meta])*
        $name:ident, overrides $over:ident, section $section:literal, heading $heading:literal {
            $(
                $(#[$doc:meta])*
                $field:ident / $flat:ident : $ty:ty = $default:expr, arg($($arg:tt)*);
            )*
        }
        optional {
            $(
                $(#[$odoc:meta])*
                $ofield:ident / $oflat:ident : $oty:ty, arg($($oarg:tt)*);
            )*
        }
    ) => {
        $(#[$section_doc])*
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $( $(#[$doc])* pub $field: $ty, )*
            $( $(#[$odoc])* pub $ofield: Option<$oty>, )*
        }

        impl Default for $name {
            fn default() -> Self {
                $name { $( $field: $default, )* $( $ofield: None, )* }
            }
        }

        impl $name {
            /// The section's name in `config.toml` and in dotted field names.
            pub const SECTION: &'static str = $section;
            /// (field in the section, flat key) of every setting, in the section's order.
            pub const KEYS: &'static [(&'static str, &'static str)] = &[
                $( (stringify!($field), stringify!($flat)), )*
                $( (stringify!($ofield), stringify!($oflat)), )*
            ];
        }

        #[doc = concat!("The settings of [`", stringify!($name), "`] a user gave (flags, a `--config` file, an experiment's cell); each `None` keeps the value it replaces. Fields carry the flat keys.")]
        #[derive(Debug, Clone, Default, Deserialize)]
        #[cfg_attr(feature = "cli", derive(clap::Args))]
        #[cfg_attr(feature = "cli", command(next_help_heading = $heading))]
        #[serde(deny_unknown_fields)]
        pub struct $over {
            $( $(#[$doc])* #[cfg_attr(feature = "cli", arg($($arg)*))] pub $flat: Option<$ty>, )*
            $( $(#[$odoc])* #[cfg_attr(feature = "cli", arg($($oarg)*))] pub $oflat: Option<$oty>, )*
        }

        impl $over {
            /// `self` where given, else `base`.
            pub fn or(self, base: Self) -> Self {
                $over {
                    $( $flat: self.$flat.or(base.$flat), )*
                    $( $oflat: self.$oflat.or(base.$oflat), )*
                }
            }

            /// Writes every given setting into `section`.
            pub fn apply(self, section: &mut $name) {
                $( if let Some(v) = self.$flat { section.$field = v; } )*
                $( if self.$oflat.is_some() { section.$ofield = self.$oflat; } )*
            }
        }
    };
}

settings_section! {
    /// What is read and how (`config.toml` section `[data]`).
    DataSettings, overrides DataOverrides, section "data", heading "Data" {
        /// Random crop and horizontal flip on CIFAR training images.
        augment / augment: bool = false, arg(long);
        /// SNLI: longest WordPiece pair kept (longer pairs are truncated).
        max_seq_len / max_seq_len: usize = crate::data::SNLI_DEFAULT_MAX_LEN, arg(long);
        /// Examples per evaluation batch (memory only; results do not depend on it)
        /// [default: 1024; SNLI 128].
        eval_batch_size / eval_batch_size: usize = 1024, arg(long);
    }
    optional {
        /// Train on the first N training examples only (after the deterministic split).
        limit_train / limit_train: usize, arg(long);
        /// Evaluate on the first N test examples only.
        limit_test / limit_test: usize, arg(long);
        /// Data folder (default: $DPCOMP_DATA, else data/).
        data_dir / data_dir: PathBuf, arg(long);
    }
}

/// What a fine-tuning of a pre-trained transformer trains (`[model] fine_tuning`; the library's
/// [`crate::hf::FineTuning`] with its settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum FineTuningKind {
    /// Every weight, embeddings included.
    Full,
    /// The last `tuned_layers` encoder layers, the pooler and the classifier (the paper's, with
    /// one layer).
    #[default]
    LastLayers,
    /// The biases of every layer and the classifier (BiTFiT, Ben Zaken et al. 2022).
    Bitfit,
    /// LoRA adapters (Hu et al. 2021) on the projections `lora_targets` names, and the classifier.
    Lora,
}

settings_section! {
    /// Pretrained weights a model starts from, and what of them trains (`[model]`).
    ModelSettings, overrides ModelOverrides, section "model", heading "Model" {
        /// SNLI: the BERT or RoBERTa folder (config.json, model.safetensors, tokenizer.json or
        /// vocab.txt) [default: models/all-MiniLM-L6-v2, installed by scripts/setup.sh].
        bert_dir / bert_dir: PathBuf = PathBuf::from("models/all-MiniLM-L6-v2"), arg(long);
        /// SNLI: what of the pre-trained encoder trains: the last --tuned-layers layers with the
        /// pooler (last-layers), every weight (full), the biases (bitfit) or LoRA adapters (lora);
        /// the classifier trains in every mode [default: last-layers, the paper's].
        fine_tuning / fine_tuning: FineTuningKind = FineTuningKind::LastLayers, arg(long, value_enum);
        /// With --fine-tuning last-layers: how many encoder layers train, from the last [default: 1].
        tuned_layers / tuned_layers: usize = 1, arg(long);
        /// With --fine-tuning lora: the adapters' rank r [default: 8].
        lora_rank / lora_rank: i64 = 8, arg(long);
        /// With --fine-tuning lora: α; the update is scaled by α / r [default: 16].
        lora_alpha / lora_alpha: f64 = 16.0, arg(long);
        /// With --fine-tuning lora: dropout on the adapters' input, in [0, 1) [default: 0].
        lora_dropout / lora_dropout: f64 = 0.0, arg(long);
        /// With --fine-tuning lora: the adapted modules, comma-separated names or name endings
        /// (PEFT's target_modules) [default: empty, the architecture's: query,value].
        lora_targets / lora_targets: String = String::new(), arg(long);
    }
    optional {}
}

impl ModelSettings {
    /// The fine-tuning these settings describe; a value out of range is an error naming its
    /// setting (`model.lora_rank`, ...).
    pub fn fine_tuning_mode(&self) -> Result<crate::hf::FineTuning> {
        use crate::hf::FineTuning;
        Ok(match self.fine_tuning {
            FineTuningKind::Full => FineTuning::Full,
            FineTuningKind::Bitfit => FineTuning::BitFit,
            FineTuningKind::LastLayers => {
                if self.tuned_layers < 1 {
                    return Err(Error::bad_value(
                        "model.tuned_layers",
                        format!("{}, expected at least 1", self.tuned_layers),
                    ));
                }
                FineTuning::LastLayers {
                    layers: self.tuned_layers,
                }
            }
            FineTuningKind::Lora => {
                let lora = crate::nn::LoraConfig {
                    rank: self.lora_rank,
                    alpha: self.lora_alpha,
                    dropout: self.lora_dropout,
                    target_modules: self
                        .lora_targets
                        .split(',')
                        .map(str::trim)
                        .filter(|t| !t.is_empty())
                        .map(String::from)
                        .collect(),
                };
                lora.check().map_err(|e| match e {
                    Error::BadValue { field, what } => Error::bad_value(
                        field
                            .replace("lora.", "model.lora_")
                            .replace("target_modules", "targets"),
                        what,
                    ),
                    other => other,
                })?;
                FineTuning::Lora(lora)
            }
        })
    }
}

settings_section! {
    /// The optimiser the (under DP: privatised) gradient drives, and its batch (`[optimizer]`).
    OptimizerSettings, overrides OptimizerOverrides, section "optimizer", heading "Optimiser" {
        /// sgd or adam (DP-Adam under --noise-multiplier) [default: sgd].
        kind / optimizer: OptimizerKind = OptimizerKind::Sgd, arg(long, value_enum);
        /// Examples per step; under Poisson sampling the expected batch, q = batch / N [default:
        /// the task's; 64 for `TrainConfig::new`, the papers' tasks Surnames 32, CIFAR-10 128,
        /// CIFAR-100 64, SNLI 32].
        batch_size / batch_size: usize = 64, arg(long);
        /// Learning rate [default: the task's; 0.1 for `TrainConfig::new`, the papers' tasks
        /// Surnames 2.0, CIFAR-10 0.1, CIFAR-100 1.0, SNLI 0.05].
        lr / lr: f64 = 0.1, arg(long);
        /// SGD momentum, 0 <= m < 1 [default: 0, plain SGD as in the papers].
        momentum / momentum: f64 = 0.0, arg(long);
        /// Adam's β1 [default: 0.9].
        adam_beta1 / adam_beta1: f64 = 0.9, arg(long);
        /// Adam's β2 [default: 0.999].
        adam_beta2 / adam_beta2: f64 = 0.999, arg(long);
        /// Adam's ε [default: 1e-8].
        adam_eps / adam_eps: f64 = 1e-8, arg(long);
    }
    optional {}
}

settings_section! {
    /// DP-SGD: clipping, noise, sampling and accounting (`[privacy]`). Without
    /// `noise_multiplier` the run is not private and only `max_grad_norm` applies.
    PrivacySettings, overrides PrivacyOverrides, section "privacy", heading "Privacy" {
        /// Clipping radius C (the global gradient norm is clipped even without privacy; inf
        /// disables that) [default: the task's; 1 for `TrainConfig::new`, the papers' tasks
        /// Surnames 3, CIFAR-10 5, CIFAR-100 1000, SNLI 21].
        max_grad_norm / max_grad_norm: f64 = 1.0, arg(long);
        /// δ of the reported (ε, δ) [default: the task's; 1e-5 for `TrainConfig::new`, the papers'
        /// tasks Surnames 8e-5, CIFAR 1e-5, SNLI 1/N].
        delta / delta: f64 = 1e-5, arg(long);
        /// How batches are drawn: Poisson (each example with probability q, what the accountants
        /// assume) or shuffled fixed-size batches [default: poisson].
        sampling / sampling: Sampling = Sampling::Poisson, arg(long, value_enum);
        /// DP clipping: flat (one radius C), per-layer (C / sqrt(L) per parameter tensor, the
        /// same noise) or adaptive (Andrew et al. 2021) [default: flat].
        clipping / clipping: ClippingMode = ClippingMode::Flat, arg(long, value_enum);
        /// Adaptive clipping: the share of examples the radius should leave unclipped [default: 0.5].
        target_quantile / target_quantile: f64 =
            crate::privacy::engine::AdaptiveClipping::DEFAULT_TARGET_QUANTILE, arg(long);
        /// Adaptive clipping: step size of the radius's geometric update [default: 0.2].
        clip_learning_rate / clip_learning_rate: f64 =
            crate::privacy::engine::AdaptiveClipping::DEFAULT_LEARNING_RATE, arg(long);
        /// The accountant that turns (q, σ, steps) into ε: pld (tight) or rdp [default: pld].
        accountant / accountant: AccountantKind = AccountantKind::Pld, arg(long, value_enum);
        /// Per-sample gradients from the tape in one backward pass (tape, fastest), in two with
        /// the norms taken inside the first (two-pass, no less memory), or from per-example
        /// autograd (oracle) [default: tape].
        grad_sample / grad_sample: GradSampleMode = GradSampleMode::Tape, arg(long, value_enum);
        /// Draw the DP noise from a CSPRNG seeded by the operating system (and the epochs'
        /// Poisson batches from OS-seeded LibTorch), never from --seed: for models released from
        /// sensitive data. Not reproducible. [default: false, seeded noise for reproducible
        /// experiments]
        secure_noise / secure_noise: bool = false,
            arg(long, num_args = 0..=1, default_missing_value = "true");
        /// With W data-parallel workers: every worker adds the full noise N(0, σ²C²) to its own
        /// clipped sum, so each worker's message is DP on its own (a worker need not trust the
        /// others); without it each adds N(0, σ²C²/W) and only their sum is private, which
        /// only the compressors exchanged by summing allow (identity, powersgd, randomk and the
        /// fl sketches; the gathered ones, dgc, denoise and the quantisers and casts, need it). The
        /// reported ε is each worker's (at σ); with those the aggregate's, at σ√W, is in the
        /// summary. [default: false]
        local_noise / local_noise: bool = false,
            arg(long, num_args = 0..=1, default_missing_value = "true");
    }
    optional {
        /// DP-SGD noise multiplier σ (turns on per-sample clipping and noise; 0 clips only, so
        /// private and non-private runs differ only by the noise).
        noise_multiplier / noise_multiplier: f64, arg(long);
        /// Privacy budget ε at δ: without --noise-multiplier, σ is calibrated so that the run's
        /// epochs spend exactly this; with it, training stops before a step that would pass it.
        target_epsilon / target_epsilon: f64, arg(long);
        /// Adaptive clipping: standard deviation of the noise on the unclipped count, in
        /// examples; must exceed sigma / 2 [default: the expected batch / 20].
        count_noise / count_noise: f64, arg(long);
        /// Largest chunk of a logical batch processed at once (memory; the noise is still added
        /// once per logical step).
        physical_batch_size / physical_batch_size: usize, arg(long);
    }
}

/// `[compression]`: the gradient compressor, applied after clipping and noise, as its `kind` and
/// settings side by side (`compress::settings`: `kind = "dgc"`, `rate = 256.0`, `budget =
/// "elements"`), and two settings of the step around it, `clip_noised` and `verify_wire`. Those
/// two are not the compressor's (the compressor is the same with and without them) but belong
/// with it: they are read where its message is formed and checked, and no compressor has a key
/// of their names, so they sit in the same table.
///
/// A run's `config.toml` writes the compressor's settings that differ from their defaults and
/// those the configuration gave (`given`). Tables written before the compressor had its own
/// form give `rate`, `rank` and `options = ["key=value", ...]` for every kind; they read as the
/// same compressor (`from_table`).
///
/// ```
/// use dpcomp::compress::{encoding::Budget, Compressor, Dgc};
/// use dpcomp::config::CompressionSettings;
/// let old: CompressionSettings = toml::from_str(
///     "kind = \"dgc\"\nrate = 256.0\nrank = 1\noptions = [\"budget=elements\"]\nverify_wire = false",
/// )?;
/// let new: CompressionSettings = toml::from_str("kind = \"dgc\"\nrate = 256.0\nbudget = \"elements\"")?;
/// assert_eq!(old, new);
/// assert_eq!(new.compressor, Compressor::Dgc(Dgc { rate: 256.0, budget: Budget::Elements, ..Default::default() }));
/// assert_eq!(new.label(), "dgc x256 (budget=elements)");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct CompressionSettings {
    /// The compressor and its settings [default: identity].
    pub compressor: crate::compress::Compressor,
    /// Clip the (under DP: privatised) update's global L2 norm to this before the compressor,
    /// for every compressor including identity: the compression paper's "second clipping".
    /// Post-processing: ε does not change. One worker only.
    pub clip_noised: Option<f64>,
    /// With one worker, send every step's message through its bytes as a remote worker's would
    /// go (a copy to the host and back), to check the wire format in a real run.
    pub verify_wire: bool,
    /// The compressor's settings as the configuration gave them (`compressor` is what they
    /// read as): the label shows them, and `config.toml` writes them, as given, even where they
    /// equal their defaults ("dgc x256 (budget=bits)"). Not part of the settings' equality: two
    /// tables that give the same compressor are equal. Code that sets `compressor` itself
    /// empties it (`TrainConfig::set_compressor`).
    pub given: crate::compress::settings::Settings,
}

/// Equal when the compressor and the step's two settings are (`given` only shapes labels).
impl PartialEq for CompressionSettings {
    fn eq(&self, other: &Self) -> bool {
        (&self.compressor, self.clip_noised, self.verify_wire)
            == (&other.compressor, other.clip_noised, other.verify_wire)
    }
}

impl CompressionSettings {
    /// The section's name in `config.toml` and in dotted field names.
    pub const SECTION: &'static str = "compression";
    /// (field in the section, flat key) of the section's own keys, in the section's order: the
    /// compressor's `kind`, `rate` and `rank` (which have flags of their own), the older
    /// `options` list, and the step's two settings. The compressor's other settings
    /// (`budget`, `levels`, ...) sit in the section too, under their own keys.
    pub const KEYS: &'static [(&'static str, &'static str)] = &[
        ("kind", "compressor"),
        ("rate", "rate"),
        ("rank", "rank"),
        ("options", "compressor_options"),
        ("verify_wire", "verify_wire"),
        ("clip_noised", "clip_noised"),
    ];

    /// `compressor` with no second clipping and no wire check.
    pub fn new(compressor: crate::compress::Compressor) -> Self {
        CompressionSettings {
            compressor,
            ..Default::default()
        }
    }

    /// The compressor's kind.
    pub fn kind(&self) -> crate::compress::CompressorKind {
        self.compressor.kind()
    }

    /// The compressor's rate (1 for the kinds without one).
    pub fn rate(&self) -> f64 {
        self.compressor.rate()
    }

    /// PowerSGD's rank (1 for the other kinds).
    pub fn rank(&self) -> i64 {
        self.compressor.rank()
    }

    /// The compressor's label (`Compressor::label_given` with `given`): "dgc x256",
    /// "qsgd (levels=16)".
    pub fn label(&self) -> String {
        self.compressor.label_given(&self.given)
    }

    /// The compressor the command line's flags give: `--compressor`, `--rate`, `--rank` and
    /// `--compressor-option` (`CompressionOverrides::apply` on the defaults); errors name the
    /// flag.
    pub fn from_flags(
        kind: crate::compress::CompressorKind,
        rate: Option<f64>,
        rank: Option<i64>,
        options: Vec<crate::compress::Setting>,
    ) -> Result<Self> {
        let mut settings = CompressionSettings::default();
        CompressionOverrides {
            compressor: Some(kind),
            rate,
            rank,
            compressor_options: Some(options),
            ..Default::default()
        }
        .apply(&mut settings)?;
        Ok(settings)
    }

    /// The settings of `[compression]` from its table: `kind` and the compressor's settings,
    /// `clip_noised` and `verify_wire`, or the older form's `rate`, `rank` and `options =
    /// ["key=value"]` (each value read as TOML, `compress::Setting`). The older form wrote
    /// `rate = 1.0` and `rank = 1` for every kind: for a kind without a rate (or a rank) that
    /// value is its absence. Errors name the key, and for an unknown one the kind and the
    /// keys it accepts.
    pub fn from_table(mut table: toml::Table) -> Result<Self> {
        let clip_noised = match table.remove("clip_noised") {
            None => None,
            Some(v) => Some(f64::deserialize(v).map_err(|e| {
                Error::bad_value("compression.clip_noised", e.message().to_string())
            })?),
        };
        let verify_wire = match table.remove("verify_wire") {
            None => false,
            Some(v) => bool::deserialize(v).map_err(|e| {
                Error::bad_value("compression.verify_wire", e.message().to_string())
            })?,
        };
        let kind = match table.remove("kind") {
            None => crate::compress::CompressorKind::Identity,
            Some(kind) => crate::compress::settings::kind_of(&kind)?,
        };
        if let Some(options) = table.remove("options") {
            let toml::Value::Array(options) = options else {
                return Err(Error::bad_value(
                    "compression.options",
                    format!("{options}: expected a list of \"key=value\" strings"),
                ));
            };
            for option in options {
                let setting: crate::compress::Setting = option
                    .as_str()
                    .ok_or_else(|| format!("{option}: expected a \"key=value\" string"))
                    .and_then(str::parse)
                    .map_err(|e| Error::bad_value("compression.options", e))?;
                if table.contains_key(&setting.key) {
                    return Err(Error::bad_value(
                        "compression.options",
                        format!(
                            "`{}` is given twice (in `options` and beside it)",
                            setting.key
                        ),
                    ));
                }
                table.insert(setting.key, setting.value);
            }
        }
        drop_unit_rate_and_rank(kind, &mut table);
        Ok(CompressionSettings {
            compressor: crate::compress::Compressor::from_settings(kind, table.clone())?,
            clip_noised,
            verify_wire,
            given: table,
        })
    }

    /// The table `config.toml` writes: `kind`, the compressor's settings that differ from their
    /// defaults, and those in `given` as given; `clip_noised` when given, `verify_wire`.
    pub fn to_table(&self) -> toml::Table {
        let mut table = toml::Table::new();
        table.insert("kind".into(), self.kind().name().into());
        let changed = self.compressor.changed_settings();
        for (key, value) in self.compressor.settings() {
            if let Some(given) = self.given.get(&key) {
                table.insert(key, given.clone());
            } else if changed.contains_key(&key) {
                table.insert(key, value);
            }
        }
        if let Some(c2) = self.clip_noised {
            table.insert("clip_noised".into(), c2.into());
        }
        table.insert("verify_wire".into(), self.verify_wire.into());
        table
    }
}

/// Removes `rate = 1` from a table whose `kind` has no rate, and `rank = 1` from one whose kind
/// has no rank: the command line's defaults, which the older tables and flags always gave.
fn drop_unit_rate_and_rank(kind: crate::compress::CompressorKind, table: &mut toml::Table) {
    let keys = crate::compress::settings::setting_keys(kind);
    let is_one = |v: Option<&toml::Value>| match v {
        Some(toml::Value::Float(x)) => *x == 1.0,
        Some(toml::Value::Integer(n)) => *n == 1,
        _ => false,
    };
    for key in ["rate", "rank"] {
        if !keys.contains(&key) && is_one(table.get(key)) {
            table.remove(key);
        }
    }
}

/// `kind` first, then the settings (`CompressionSettings::to_table`).
impl Serialize for CompressionSettings {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut table = self.to_table();
        let mut map = s.serialize_map(Some(table.len()))?;
        if let Some(kind) = table.remove("kind") {
            map.serialize_entry("kind", &kind)?;
        }
        let verify_wire = table.remove("verify_wire");
        let clip_noised = table.remove("clip_noised");
        for (key, value) in &table {
            map.serialize_entry(key, value)?;
        }
        if let Some(c2) = clip_noised {
            map.serialize_entry("clip_noised", &c2)?;
        }
        if let Some(v) = verify_wire {
            map.serialize_entry("verify_wire", &v)?;
        }
        map.end()
    }
}

/// `CompressionSettings::from_table`.
impl<'de> Deserialize<'de> for CompressionSettings {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let table = toml::Table::deserialize(d)?;
        CompressionSettings::from_table(table)
            .map_err(|e| <D::Error as serde::de::Error>::custom(e.to_string()))
    }
}

/// The `[compression]` settings a user gave (flags, a `--config` file, an experiment's cell);
/// each `None` keeps the value it replaces. Fields carry the flat keys.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[cfg_attr(feature = "cli", command(next_help_heading = "Compression"))]
#[serde(deny_unknown_fields)]
pub struct CompressionOverrides {
    /// Gradient compressor [default: identity].
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub compressor: Option<crate::compress::CompressorKind>,
    /// DGC/Denoise and the sketches: dense fp32 bits / message bits (the paper: 1, 16, 256)
    /// [default: 1].
    #[cfg_attr(feature = "cli", arg(long))]
    pub rate: Option<f64>,
    /// PowerSGD: rank of the approximation (the paper: 1, 16) [default: 1].
    #[cfg_attr(feature = "cli", arg(long))]
    pub rank: Option<i64>,
    /// Compressor setting key=value, repeatable, the value read as TOML (4 an integer, 3.0 a
    /// float, elements a string); a key the compressor does not read is an error. dgc:
    /// value_bits (9-32), index_bits (32|min), momentum, masking, warmup_epochs, warmup
    /// (paper|reference), topk (auto|sampled|exact), sample_ratio, scope (layer|model), budget
    /// (bits|elements), dense_vectors, error_feedback (true|false), residual_decay (0-1).
    /// powersgd: shape (square|rows), min_rate, epsilon, warm_start, seed, error_feedback,
    /// residual_decay. denoise: beta, decay, scope, value_bits, index_bits, topk, sample_ratio,
    /// clip, budget. fl-rnd: seed, error_feedback. fl-freq: chunks. fl-cs: chunks, rows, seed,
    /// lambda, iterations, error_feedback. qsgd: levels, bucket, encoding (fixed|elias).
    /// randomk: seed, unbiased, error_feedback. threshold: threshold, value_bits, index_bits,
    /// error_feedback. int8: stochastic. The others take none.
    #[cfg_attr(
        feature = "cli",
        arg(long = "compressor-option", value_name = "KEY=VALUE")
    )]
    #[serde(default, deserialize_with = "compressor_options")]
    pub compressor_options: Option<Vec<crate::compress::Setting>>,
    /// With one worker, send every step's message through its bytes as a remote worker's
    /// would go (a copy to the host and back), to check the wire format in a real run.
    /// Off, the receiver decodes the message itself and the bits are the bytes' exact
    /// length computed from the payloads' sizes (`compress::wire::encoded_len`): the same
    /// update bit for bit and the same count, without the copies. [default: false]
    #[cfg_attr(
        feature = "cli",
        arg(long, num_args = 0..=1, default_missing_value = "true")
    )]
    pub verify_wire: Option<bool>,
    /// Clip the (under DP: privatised) update's global L2 norm to this before the
    /// compressor, for every compressor including identity: the compression paper's
    /// "second clipping". Post-processing: ε does not change. One worker only.
    #[cfg_attr(feature = "cli", arg(long))]
    pub clip_noised: Option<f64>,
}

/// `compressor_options` in a file: a list of `"key=value"` strings, as the flag takes them, or
/// a table of the settings (`{ budget = "elements", scope = "model" }`).
fn compressor_options<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<Vec<crate::compress::Setting>>, D::Error> {
    use serde::de::Error as _;
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Given {
        List(Vec<String>),
        Table(toml::Table),
    }
    let settings = match Given::deserialize(d).map_err(|_| {
        D::Error::custom(
            "compressor_options: expected a list of \"key=value\" strings or a table of settings",
        )
    })? {
        Given::List(list) => list
            .iter()
            .map(|s| s.parse())
            .collect::<std::result::Result<Vec<_>, String>>()
            .map_err(|e| D::Error::custom(format!("compressor_options: {e}")))?,
        Given::Table(table) => table
            .into_iter()
            .map(|(key, value)| crate::compress::Setting { key, value })
            .collect(),
    };
    Ok(Some(settings))
}

impl CompressionOverrides {
    /// `self` where given, else `base`.
    pub fn or(self, base: Self) -> Self {
        CompressionOverrides {
            compressor: self.compressor.or(base.compressor),
            rate: self.rate.or(base.rate),
            rank: self.rank.or(base.rank),
            compressor_options: self.compressor_options.or(base.compressor_options),
            verify_wire: self.verify_wire.or(base.verify_wire),
            clip_noised: self.clip_noised.or(base.clip_noised),
        }
    }

    /// Writes every given setting into `section`. The compressor's table is rebuilt: `kind`
    /// (the given one, else the section's), the section's settings of that kind unless
    /// `compressor_options` replaces them, then `rate` and `rank`; an error names the flag
    /// (`--compressor-option`, `--rate`, `--rank`) whose key the kind does not read, or whose
    /// value it cannot take.
    pub fn apply(self, section: &mut CompressionSettings) -> Result<()> {
        if let Some(v) = self.verify_wire {
            section.verify_wire = v;
        }
        if self.clip_noised.is_some() {
            section.clip_noised = self.clip_noised;
        }
        if self.compressor.is_none()
            && self.rate.is_none()
            && self.rank.is_none()
            && self.compressor_options.is_none()
        {
            return Ok(());
        }
        let kind = self.compressor.unwrap_or(section.kind());
        // The section's settings carry over while the kind stays; the given options replace
        // all but the rate and the rank.
        let mut table = if kind == section.kind() {
            let mut kept = section.to_table();
            for key in ["kind", "clip_noised", "verify_wire"] {
                kept.remove(key);
            }
            kept
        } else {
            toml::Table::new()
        };
        let accepted = crate::compress::settings::setting_keys(kind);
        // Errors name the field whose flag gave the key: `compression.options`
        // (--compressor-option), `compression.rate` (--rate), `compression.rank` (--rank).
        let field_of = |key: &str, options: &BTreeSet<String>| match key {
            "rate" if !options.contains(key) => "compression.rate",
            "rank" if !options.contains(key) => "compression.rank",
            _ => "compression.options",
        };
        let refuse =
            |field: &str, key: &str| crate::compress::settings::unknown_setting(field, kind, key);
        let mut from_options = BTreeSet::new();
        if let Some(options) = self.compressor_options {
            table.retain(|key, _| key == "rate" || key == "rank");
            for setting in options {
                if !accepted.contains(&setting.key.as_str()) {
                    return Err(refuse("compression.options", &setting.key));
                }
                from_options.insert(setting.key.clone());
                table.insert(setting.key, setting.value);
            }
        }
        for (key, value) in [
            ("rate", self.rate.map(toml::Value::Float)),
            ("rank", self.rank.map(toml::Value::Integer)),
        ] {
            let Some(value) = value else { continue };
            let mut alone = toml::Table::from_iter([(key.to_string(), value.clone())]);
            drop_unit_rate_and_rank(kind, &mut alone);
            if alone.is_empty() {
                continue;
            }
            if !accepted.contains(&key) {
                return Err(refuse(field_of(key, &BTreeSet::new()), key));
            }
            table.insert(key.to_string(), value);
        }
        section.compressor = crate::compress::Compressor::from_settings(kind, table.clone())
            .map_err(|e| match e {
                Error::BadValue { field, what } => {
                    let key = field
                        .strip_prefix("compression.")
                        .or_else(|| field.strip_prefix("compressor setting "));
                    match key {
                        Some(key) if accepted.contains(&key) => Error::bad_value(
                            field_of(key, &from_options),
                            format!("{key}: {}", what.trim_start_matches(&format!("{key}: "))),
                        ),
                        _ => Error::BadValue { field, what },
                    }
                }
                other => other,
            })?;
        section.given = table;
        Ok(())
    }
}

settings_section! {
    /// Measurements taken during training (`[analysis]`).
    AnalysisSettings, overrides AnalysisOverrides, section "analysis", heading "Analysis" {
        /// Measure the gradient error after these epochs (comma-separated, 1-based, 0 = before
        /// training): clip / noise / compress error against the true mean gradient, bias² and
        /// variance, in grad_error.jsonl.
        grad_error_epochs / grad_error_epochs: Vec<usize> = Vec::new(),
            arg(long, value_delimiter = ',');
        /// Fixed batches per gradient-error measurement [default: 4].
        grad_error_batches / grad_error_batches: usize = 4, arg(long);
        /// Noise draws per batch per gradient-error measurement (bias²/variance split)
        /// [default: 8].
        grad_error_draws / grad_error_draws: usize = 8, arg(long);
    }
    optional {}
}

/// The keys at the top of `config.toml`, outside every section (`parts` is a table of names,
/// written only when a part of one's own trained the run).
pub const TOP_LEVEL_KEYS: [&str; 5] = ["task", "seed", "epochs", "device", "parts"];

/// The parts of one's own a run was built with (`TrainerBuilder::optimizer`,
/// `TrainerBuilder::compressor`), by the names they give themselves: `config.toml`'s `[parts]`,
/// absent when every part came from the settings. A named part replaces its section's recipe
/// (`[optimizer]`'s kind and learning rate, `[compression]`'s compressor), and a resumed run
/// must be given a part of the same name again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OwnParts {
    /// The optimiser's `Optimizer::name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer: Option<String>,
    /// The compressor's `CompressorFactory::name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compressor: Option<String>,
}

impl OwnParts {
    /// Whether every part came from the settings.
    pub fn is_empty(&self) -> bool {
        self.optimizer.is_none() && self.compressor.is_none()
    }
}

settings_section! {
    /// CUDA's math settings, as PyTorch names and defaults them (`[cuda]`). They
    /// take effect on a CUDA device only and are recorded in `config.toml` like every setting.
    CudaSettings, overrides CudaOverrides, section "cuda", heading "CUDA" {
        /// TF32 tensor cores for float32 matrix products (PyTorch's
        /// `torch.backends.cuda.matmul.fp32_precision = "tf32"`, formerly `allow_tf32`): about
        /// 10 mantissa bits instead of 23 [default: false, as PyTorch's].
        tf32_matmul / tf32_matmul: bool = false,
            arg(long, num_args = 0..=1, default_missing_value = "true");
        /// TF32 for cuDNN's float32 convolutions and RNNs (`torch.backends.cudnn.allow_tf32`)
        /// [default: true, as PyTorch's].
        tf32_cudnn / tf32_cudnn: bool = true,
            arg(long, num_args = 0..=1, default_missing_value = "true");
        /// cuDNN's benchmark mode (`torch.backends.cudnn.benchmark`): time the convolution
        /// algorithms for each new input shape and keep the fastest; not bit-reproducible
        /// across runs [default: false, as PyTorch's].
        cudnn_benchmark / cudnn_benchmark: bool = false,
            arg(long, num_args = 0..=1, default_missing_value = "true");
    }
    optional {}
}

/// Every section: (its name, its (field, flat key) table).
const SECTIONS: [(&str, &[(&str, &str)]); 7] = [
    (DataSettings::SECTION, DataSettings::KEYS),
    (ModelSettings::SECTION, ModelSettings::KEYS),
    (OptimizerSettings::SECTION, OptimizerSettings::KEYS),
    (PrivacySettings::SECTION, PrivacySettings::KEYS),
    (CompressionSettings::SECTION, CompressionSettings::KEYS),
    (AnalysisSettings::SECTION, AnalysisSettings::KEYS),
    (CudaSettings::SECTION, CudaSettings::KEYS),
];

/// Flat keys written before they were renamed: (old key, flat key).
const FLAT_ALIASES: [(&str, &str); 1] = [("compressor_option", "compressor_options")];

/// The flat key (a flag's name with underscores) of a dotted field such as
/// `privacy.noise_multiplier` or `optimizer.kind` (`optimizer`); a top-level key is its own.
/// `None` for anything else.
pub fn flat_key(field: &str) -> Option<&'static str> {
    if let Some(top) = TOP_LEVEL_KEYS.iter().find(|k| **k == field) {
        return Some(top);
    }
    let (section, name) = field.split_once('.')?;
    SECTIONS
        .iter()
        .find(|(s, _)| *s == section)?
        .1
        .iter()
        .find(|(f, _)| *f == name)
        .map(|(_, flat)| *flat)
}

/// Every setting of a section: (dotted field such as `privacy.noise_multiplier`, flat key such
/// as `noise_multiplier`), section by section; the top-level keys are not listed.
pub fn section_settings() -> Vec<(String, &'static str)> {
    SECTIONS
        .iter()
        .flat_map(|(section, keys)| {
            keys.iter()
                .map(move |(field, flat)| (format!("{section}.{field}"), *flat))
        })
        .collect()
}

/// Whether the keys of the nested table are the sections' field names (`config.toml`) or
/// their flat keys (the overrides structs' fields).
#[derive(Clone, Copy, PartialEq)]
enum Naming {
    Fields,
    Flat,
}

/// `table` (flat keys, sections, or both) as sections keyed by `naming`. A flat key is moved
/// into its section; a section's key may be its field name or its flat key. An unknown key, or
/// one setting given twice, is an error naming it (`origin` says where the table came from).
fn nest(table: toml::Table, naming: Naming, origin: &str) -> Result<toml::Table> {
    let mut out = toml::Table::new();
    let mut put = |section: Option<&str>, key: &str, value: toml::Value| -> Result<()> {
        let (target, shown) = match section {
            None => (&mut out, key.to_string()),
            Some(s) => {
                let t = out
                    .entry(s)
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()));
                let toml::Value::Table(t) = t else {
                    unreachable!("sections are tables")
                };
                (t, format!("{s}.{key}"))
            }
        };
        if target.insert(key.to_string(), value).is_some() {
            return Err(Error::bad_file(
                origin,
                format!("`{shown}` is given twice (once flat, once in its section?)"),
            ));
        }
        Ok(())
    };
    let name_of = |(field, flat): &(&'static str, &'static str)| match naming {
        Naming::Fields => *field,
        Naming::Flat => *flat,
    };
    for (key, value) in table {
        if TOP_LEVEL_KEYS.contains(&key.as_str()) {
            put(None, &key, value)?;
            continue;
        }
        let section = SECTIONS.iter().find(|(s, _)| *s == key);
        match (section, value) {
            (Some((section, keys)), toml::Value::Table(inner)) => {
                // `[compression]` holds the compressor's settings under their own keys too: in
                // `config.toml` they stay there, in overrides they are `compressor_options`.
                let mut compressor_settings = toml::Table::new();
                for (inner_key, inner_value) in inner {
                    let own = keys
                        .iter()
                        .any(|(field, flat)| *field == inner_key || *flat == inner_key);
                    if *section == CompressionSettings::SECTION && !own {
                        match naming {
                            Naming::Fields => put(Some(section), &inner_key, inner_value)?,
                            Naming::Flat => {
                                compressor_settings.insert(inner_key, inner_value);
                            }
                        }
                        continue;
                    }
                    let found = keys
                        .iter()
                        .find(|(field, flat)| *field == inner_key || *flat == inner_key)
                        .ok_or_else(|| {
                            Error::bad_file(
                                origin,
                                format!(
                                    "unknown setting `{section}.{inner_key}`; the section has {}",
                                    keys.iter().map(|(f, _)| *f).collect::<Vec<_>>().join(", ")
                                ),
                            )
                        })?;
                    put(Some(section), name_of(found), inner_value)?;
                }
                if !compressor_settings.is_empty() {
                    put(
                        Some(section),
                        "compressor_options",
                        toml::Value::Table(compressor_settings),
                    )
                    .map_err(|_| {
                        Error::bad_file(
                            origin,
                            "`[compression]` gives compressor settings both under their keys and in `options`: give them one way",
                        )
                    })?;
                }
            }
            (_, value) => {
                let flat = FLAT_ALIASES
                    .iter()
                    .find(|(old, _)| *old == key)
                    .map_or(key.as_str(), |(_, new)| new);
                let found = SECTIONS.iter().find_map(|(section, keys)| {
                    keys.iter()
                        .find(|(_, f)| *f == flat)
                        .map(|entry| (*section, entry))
                });
                let Some((section, entry)) = found else {
                    return Err(Error::bad_file(
                        origin,
                        format!(
                            "unknown setting `{key}`: expected one of {}, a flag's name with underscores, or a section ({})",
                            TOP_LEVEL_KEYS.join(", "),
                            SECTIONS.map(|(s, _)| s).join(", ")
                        ),
                    ));
                };
                put(Some(section), name_of(entry), value)?;
            }
        }
    }
    Ok(out)
}

/// Everything a training run depends on. Saved as the run's `config.toml`: the run's identity
/// (task, seed, epochs, device) at the top, then one table per section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// The task's name: what the run trains (`task = "my-tabular-mlp"` in `config.toml`). The
    /// model and data come from the program: `TrainerBuilder::model`, or a `TaskSource` that
    /// makes them from this configuration (`TrainerBuilder::tasks`).
    pub task: String,
    /// Seed of the initial weights, the batches and (unless `privacy.secure_noise`) the DP noise.
    pub seed: u64,
    /// Passes over the training set.
    pub epochs: usize,
    /// Where the model and the steps run.
    pub device: DeviceChoice,
    /// `[data]`: where the data is read from, limits, augmentation.
    pub data: DataSettings,
    /// `[model]`: the task model's options.
    pub model: ModelSettings,
    /// `[optimizer]`: the optimiser, learning rate, batch size.
    pub optimizer: OptimizerSettings,
    /// `[privacy]`: σ or a target ε, δ, C, clipping, sampling, the accountant.
    pub privacy: PrivacySettings,
    /// `[compression]`: the compressor and its settings.
    pub compression: CompressionSettings,
    /// `[analysis]`: measurements taken during training.
    pub analysis: AnalysisSettings,
    /// `[cuda]`: TF32 and cuDNN's benchmark mode. Files written without it read PyTorch's defaults.
    #[serde(default)]
    pub cuda: CudaSettings,
    /// `[parts]`: the parts of one's own the run was built with, by name (absent: none).
    #[serde(default, skip_serializing_if = "OwnParts::is_empty")]
    pub parts: OwnParts,
}

impl TrainConfig {
    /// Settings for the task named `task`: every section's defaults (SGD at learning rate 0.1,
    /// batch size 64, radius C = 1, δ = 1e-5, no privacy until `privacy.noise_multiplier` is
    /// set) and 10 epochs. Every field is public: set what differs.
    pub fn new(task: &str) -> Self {
        TrainConfig {
            task: task.to_string(),
            seed: 0,
            epochs: 10,
            device: DeviceChoice::Auto,
            data: DataSettings::default(),
            model: ModelSettings::default(),
            optimizer: OptimizerSettings::default(),
            privacy: PrivacySettings::default(),
            compression: CompressionSettings::default(),
            analysis: AnalysisSettings::default(),
            cuda: CudaSettings::default(),
            parts: OwnParts::default(),
        }
    }

    /// The compressor, checked (`Compressor::validate`; a sketch's setting its scheme does not
    /// read is refused, as `config.toml` could not hold it).
    pub fn compressor(&self) -> Result<crate::compress::Compressor> {
        let compressor = self.compression.compressor.clone().validated()?;
        if let Some(key) = compressor.unread_setting() {
            return Err(crate::compress::settings::unknown_setting(
                "compression",
                compressor.kind(),
                key,
            ));
        }
        Ok(compressor)
    }

    /// Trains with `compressor`'s typed settings (checked as `compressor` does); the label then
    /// shows the settings that differ from their defaults. `clip_noised` stays.
    ///
    /// ```
    /// use dpcomp::prelude::*;
    /// let mut config = TrainConfig::new("mine");
    /// config.set_compressor(&Compressor::Dgc(Dgc { rate: 256.0, ..Default::default() }))?;
    /// assert_eq!(config.compression_label()?, "dgc x256");
    /// config.compression.clip_noised = Some(5.0);
    /// assert_eq!(config.compression_label()?, "dgc x256, clip_noised 5");
    /// # Ok::<(), dpcomp::error::Error>(())
    /// ```
    pub fn set_compressor(&mut self, compressor: &crate::compress::Compressor) -> Result<()> {
        let previous = std::mem::replace(&mut self.compression.compressor, compressor.clone());
        if let Err(e) = self.compressor() {
            self.compression.compressor = previous;
            return Err(e);
        }
        self.compression.given.clear();
        Ok(())
    }

    /// The compressor's label for tables and summaries (`CompressionSettings::label`), with the
    /// second clipping when there is one: "identity, clip_noised 5".
    pub fn compression_label(&self) -> Result<String> {
        let label = self.compressor()?.label_given(&self.compression.given);
        Ok(match self.compression.clip_noised {
            Some(c2) => format!("{label}, clip_noised {c2}"),
            None => label,
        })
    }

    /// Whether this run trains with DP-SGD.
    /// DP training: σ given, or a target ε that the trainer calibrates σ for.
    pub fn private(&self) -> bool {
        self.privacy.noise_multiplier.is_some() || self.privacy.target_epsilon.is_some()
    }

    /// Checks every setting and their combinations before anything is written or trained;
    /// each error names the dotted field (`privacy.delta`) and what it takes.
    pub fn validate(&self) -> Result<()> {
        self.check_paths()?;
        // Every integer setting must fit the signed 64 bits TOML holds (`config.toml` is written
        // before the first step), and the tensors' i64 sizes.
        let (d, o, p, a) = (&self.data, &self.optimizer, &self.privacy, &self.analysis);
        let integers = [
            ("seed", Some(self.seed)),
            ("epochs", Some(self.epochs as u64)),
            ("data.max_seq_len", Some(d.max_seq_len as u64)),
            ("data.eval_batch_size", Some(d.eval_batch_size as u64)),
            ("data.limit_train", d.limit_train.map(|v| v as u64)),
            ("data.limit_test", d.limit_test.map(|v| v as u64)),
            ("optimizer.batch_size", Some(o.batch_size as u64)),
            (
                "privacy.physical_batch_size",
                p.physical_batch_size.map(|v| v as u64),
            ),
            (
                "analysis.grad_error_batches",
                Some(a.grad_error_batches as u64),
            ),
            ("analysis.grad_error_draws", Some(a.grad_error_draws as u64)),
            (
                "analysis.grad_error_epochs",
                a.grad_error_epochs.iter().map(|&e| e as u64).max(),
            ),
        ];
        for (field, value) in integers {
            if let Some(v) = value.filter(|&v| v > i64::MAX as u64) {
                return Err(Error::bad_value(
                    field,
                    format!("{v}: expected at most {} (2^63 - 1)", i64::MAX),
                ));
            }
        }
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
        if self.task.trim().is_empty() {
            return Err(Error::bad_value(
                "task",
                format!("{:?}: expected a non-empty name", self.task),
            ));
        }
        let (data, opt, privacy) = (&self.data, &self.optimizer, &self.privacy);
        positive("epochs", self.epochs as f64)?;
        positive("optimizer.batch_size", opt.batch_size as f64)?;
        positive("data.eval_batch_size", data.eval_batch_size as f64)?;
        positive("optimizer.lr", opt.lr)?;
        if privacy.max_grad_norm.is_nan() || privacy.max_grad_norm <= 0.0 {
            return Err(Error::bad_value(
                "privacy.max_grad_norm",
                format!(
                    "{}: expected a positive number (inf disables clipping)",
                    privacy.max_grad_norm
                ),
            ));
        }
        if !(0.0..1.0).contains(&opt.momentum) {
            return Err(Error::bad_value(
                "optimizer.momentum",
                format!("{}: expected 0 <= momentum < 1", opt.momentum),
            ));
        }
        positive("data.max_seq_len", data.max_seq_len as f64)?;
        positive(
            "analysis.grad_error_batches",
            self.analysis.grad_error_batches as f64,
        )?;
        positive(
            "analysis.grad_error_draws",
            self.analysis.grad_error_draws as f64,
        )?;
        if let Some(sigma) = privacy.noise_multiplier {
            if !(sigma >= 0.0 && sigma.is_finite()) {
                return Err(Error::bad_value(
                    "privacy.noise_multiplier",
                    format!("{sigma}: expected a finite sigma >= 0"),
                ));
            }
            if sigma > 0.0 && !privacy.max_grad_norm.is_finite() {
                return Err(Error::bad_value(
                    "privacy.max_grad_norm",
                    "inf: DP noise needs a finite clipping radius",
                ));
            }
            // The noise N(0, σ²C²) is drawn in the parameters' f32: its standard deviation
            // must be a finite f32, or every weight becomes non-finite at the first step.
            let std = sigma * privacy.max_grad_norm;
            if sigma > 0.0 && (std.is_nan() || std >= f32::MAX as f64 / 1e6) {
                return Err(Error::bad_value(
                    "privacy.noise_multiplier",
                    format!(
                        "{sigma}: times privacy.max_grad_norm {} it gives a noise standard deviation of {std:e}, beyond what the f32 parameters hold (expected sigma * C below {:e})",
                        privacy.max_grad_norm,
                        f32::MAX as f64 / 1e6
                    ),
                ));
            }
            crate::privacy::validate_delta(privacy.delta).map_err(|_| {
                Error::bad_value(
                    "privacy.delta",
                    format!("{}: expected 0 < delta < 1", privacy.delta),
                )
            })?;
            // The PLD accountant's floor, checked here so that a run refuses at its start
            // instead of at its first ε.
            if privacy.accountant == AccountantKind::Pld
                && privacy.delta < crate::privacy::pld::MIN_PLD_DELTA
            {
                return Err(Error::bad_value(
                    "privacy.delta",
                    format!(
                        "{:e}: the PLD accountant is accurate for delta >= {:e}; use \
                         `privacy.accountant` rdp for a smaller delta",
                        privacy.delta,
                        crate::privacy::pld::MIN_PLD_DELTA
                    ),
                ));
            }
        }
        // With σ, a target ε is a budget the run stops at; without, the trainer calibrates σ
        // to it over the run's epochs.
        if let Some(e) = privacy.target_epsilon {
            positive("privacy.target_epsilon", e)?;
        }
        if privacy.physical_batch_size.is_some() && !self.private() {
            return Err(Error::bad_value(
                "privacy.physical_batch_size",
                "applies to DP training (`privacy.noise_multiplier`), whose per-sample gradients it computes in chunks; a non-private step takes its whole batch at once",
            ));
        }
        if opt.kind == OptimizerKind::Adam {
            if opt.momentum != 0.0 {
                return Err(Error::bad_value(
                    "optimizer.momentum",
                    format!(
                        "{}: SGD's momentum; Adam's is `optimizer.adam_beta1`",
                        opt.momentum
                    ),
                ));
            }
            for (field, beta) in [
                ("optimizer.adam_beta1", opt.adam_beta1),
                ("optimizer.adam_beta2", opt.adam_beta2),
            ] {
                if !(0.0..1.0).contains(&beta) {
                    return Err(Error::bad_value(
                        field,
                        format!("{beta}: expected 0 <= beta < 1"),
                    ));
                }
            }
            positive("optimizer.adam_eps", opt.adam_eps)?;
        }
        if !self.private() {
            if let Some((field, value)) = self.private_only_settings_given().first() {
                return Err(Error::bad_value(
                    *field,
                    format!("{value}: applies to DP training only, which needs `privacy.noise_multiplier` or `privacy.target_epsilon`; without either the run is not private and this setting would have no effect"),
                ));
            }
        }
        if privacy.clipping != ClippingMode::Flat && !self.private() {
            return Err(Error::bad_value(
                "privacy.clipping",
                "applies to DP training (`privacy.noise_multiplier`); a non-private step clips its mean gradient with `privacy.max_grad_norm`",
            ));
        }
        if let Some(field) = self.adaptive_settings_given().first() {
            if privacy.clipping != ClippingMode::Adaptive {
                return Err(Error::bad_value(
                    *field,
                    "applies to adaptive clipping only (`privacy.clipping` adaptive)",
                ));
            }
        }
        if privacy.physical_batch_size == Some(0) {
            return Err(Error::bad_value(
                "privacy.physical_batch_size",
                "0: expected at least 1",
            ));
        }
        if let Some(c2) = self.compression.clip_noised {
            // NaN fails every comparison: `!(c2 > 0.0)` refuses it too.
            if c2.is_nan() || c2 <= 0.0 || c2.is_infinite() {
                return Err(Error::bad_value(
                    "compression.clip_noised",
                    format!("{c2}: expected a positive, finite radius for the update's norm (leave it out for none)"),
                ));
            }
        }
        if let crate::compress::Compressor::Dgc(dgc) = self.compressor()? {
            if dgc.momentum > 0.0 && opt.momentum > 0.0 {
                return Err(Error::bad_value(
                "optimizer.momentum",
                "DGC's momentum correction applies the momentum before compression; set the optimiser's `optimizer.momentum` to 0",
            ));
            }
        }
        if data.limit_train == Some(0) || data.limit_test == Some(0) {
            return Err(Error::bad_value(
                "data.limit_train/data.limit_test",
                "0: expected at least 1 example",
            ));
        }
        Ok(())
    }

    /// The settings that only DP training reads and that differ from their defaults, as
    /// (dotted field, value): a non-private run refuses them rather than ignore them.
    fn private_only_settings_given(&self) -> Vec<(&'static str, String)> {
        let (p, default) = (&self.privacy, PrivacySettings::default());
        let mut given = Vec::new();
        if p.local_noise != default.local_noise {
            given.push(("privacy.local_noise", p.local_noise.to_string()));
        }
        if p.secure_noise != default.secure_noise {
            given.push(("privacy.secure_noise", p.secure_noise.to_string()));
        }
        if p.accountant != default.accountant {
            given.push(("privacy.accountant", value_name(&p.accountant)));
        }
        if p.grad_sample != default.grad_sample {
            given.push(("privacy.grad_sample", value_name(&p.grad_sample)));
        }
        given
    }

    /// The adaptive-clipping settings that differ from their defaults, as dotted fields.
    fn adaptive_settings_given(&self) -> Vec<&'static str> {
        let (p, default) = (&self.privacy, PrivacySettings::default());
        [
            (
                "privacy.target_quantile",
                p.target_quantile != default.target_quantile,
            ),
            (
                "privacy.clip_learning_rate",
                p.clip_learning_rate != default.clip_learning_rate,
            ),
            ("privacy.count_noise", p.count_noise.is_some()),
        ]
        .into_iter()
        .filter(|(_, given)| *given)
        .map(|(field, _)| field)
        .collect()
    }

    /// Settings that are valid but will have no effect in this run, in words for the user
    /// (the trainer reports them through `log::warn!` when it starts or resumes).
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        let beyond: Vec<usize> = (self.analysis.grad_error_epochs.iter())
            .copied()
            .filter(|&e| e > self.epochs)
            .collect();
        if !beyond.is_empty() {
            warnings.push(format!(
                "`analysis.grad_error_epochs` {beyond:?} lie beyond the run's {} epochs and will not be measured (resume the run with more `epochs`)",
                self.epochs
            ));
        }
        let (opt, default) = (&self.optimizer, OptimizerSettings::default());
        let adam_changed = opt.adam_beta1 != default.adam_beta1
            || opt.adam_beta2 != default.adam_beta2
            || opt.adam_eps != default.adam_eps;
        if opt.kind == OptimizerKind::Sgd && adam_changed {
            warnings.push(
                "`optimizer.adam_beta1`/`optimizer.adam_beta2`/`optimizer.adam_eps` are set but the optimizer is SGD: they have no effect (set `optimizer.kind` to adam)".to_string(),
            );
        }
        if opt.kind == OptimizerKind::Adam && opt.momentum != 0.0 {
            warnings.push(format!(
                "`optimizer.momentum` {} has no effect with Adam (its first moment is `optimizer.adam_beta1`)",
                opt.momentum
            ));
        }
        if self.privacy.clipping != ClippingMode::Adaptive
            && !self.adaptive_settings_given().is_empty()
        {
            warnings.push(
                "`privacy.target_quantile`/`privacy.clip_learning_rate`/`privacy.count_noise` are set but clipping is not adaptive: they have no effect (set `privacy.clipping` to adaptive)".to_string(),
            );
        }
        warnings
    }

    /// The settings that differ between `self` and `other`, as (dotted field, self's value,
    /// other's value) in TOML notation; a setting absent from one side shows as "none".
    pub fn differences(&self, other: &TrainConfig) -> Vec<(String, String, String)> {
        let (a, b) = (self.dotted(), other.dotted());
        let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
        keys.sort();
        keys.dedup();
        let show = |v: Option<&toml::Value>| v.map_or("none".to_string(), |v| v.to_string());
        keys.into_iter()
            .filter(|k| a.get(*k) != b.get(*k))
            .map(|k| (k.clone(), show(a.get(k)), show(b.get(k))))
            .collect()
    }

    /// Every setting under its dotted name (`privacy.noise_multiplier`), absent ones left out.
    fn dotted(&self) -> std::collections::BTreeMap<String, toml::Value> {
        let Ok(toml::Value::Table(table)) = toml::Value::try_from(self) else {
            unreachable!("TrainConfig serialises to a table")
        };
        let mut out = std::collections::BTreeMap::new();
        for (key, value) in table {
            match value {
                toml::Value::Table(section) => {
                    for (field, v) in section {
                        out.insert(format!("{key}.{field}"), v);
                    }
                }
                v => {
                    out.insert(key, v);
                }
            }
        }
        out
    }

    /// The paths among the settings must be valid UTF-8, as `config.toml` (TOML text) can hold
    /// nothing else: an error naming the setting otherwise, before a run writes anything.
    pub fn check_paths(&self) -> Result<()> {
        let paths = [
            ("data.data_dir", self.data.data_dir.as_deref()),
            ("model.bert_dir", Some(self.model.bert_dir.as_path())),
        ];
        for (field, path) in paths {
            if let Some(path) = path.filter(|p| p.to_str().is_none()) {
                return Err(Error::bad_value(
                    field,
                    format!(
                        "{}: not valid UTF-8; a run records its folders in config.toml, which holds text only: rename the folder or link to it from a UTF-8 path",
                        path.display()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The settings as a run's `config.toml` writes them: every section, every setting.
    /// Settings that passed `validate` (`check_paths`: UTF-8 paths) always serialise.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("validated settings serialise (check_paths)")
    }

    /// Reads a run's `config.toml`: the sections, or the flat file of a run made before them
    /// (each key moved into its section). A setting the file lacks (a run older than it) takes
    /// its task's default, as the reading did before the sections.
    pub fn from_toml_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let origin = path.display().to_string();
        let table: toml::Table =
            toml::from_str(&text).map_err(|e| Error::bad_file(path, e.to_string()))?;
        TrainConfig::from_table(table, &origin)
    }

    /// `from_toml_file` on a table; `origin` names it in errors. A setting the table leaves out
    /// takes `TrainConfig::new`'s default.
    pub fn from_table(table: toml::Table, origin: &str) -> Result<Self> {
        Self::from_table_over(table, origin, TrainConfig::new)
    }

    /// `from_table` with the defaults of the task the table names from `defaults` (a program
    /// whose tasks have defaults of their own reads its files so).
    pub fn from_table_over(
        table: toml::Table,
        origin: &str,
        defaults: impl FnOnce(&str) -> TrainConfig,
    ) -> Result<Self> {
        let mut nested = nest(table, Naming::Fields, origin)?;
        let task: String = nested
            .get("task")
            .cloned()
            .ok_or_else(|| Error::bad_file(origin, "missing `task`"))?
            .try_into()
            .map_err(|e: toml::de::Error| Error::bad_file(origin, format!("task: {e}")))?;
        let Ok(toml::Value::Table(defaults)) = toml::Value::try_from(defaults(&task)) else {
            unreachable!("TrainConfig serialises to a table")
        };
        for (key, default) in defaults {
            match (nested.get_mut(&key), default) {
                (None, default) => {
                    nested.insert(key, default);
                }
                (Some(toml::Value::Table(section)), toml::Value::Table(default)) => {
                    for (field, v) in default {
                        section.entry(field).or_insert(v);
                    }
                }
                _ => {}
            }
        }
        toml::Value::Table(nested)
            .try_into()
            .map_err(|e: toml::de::Error| Error::bad_file(origin, e.to_string()))
    }
}

/// Optional settings, from a `--config` TOML file, an experiment's cell or flags; each given one
/// replaces the default. Files may use the flat keys (`noise_multiplier = 1`, the flags' names
/// with underscores), the sections (`[privacy] noise_multiplier = 1`) or both; an unknown key
/// is an error naming the file and the key.
#[derive(Debug, Clone, Default)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct TrainOverrides {
    /// Task (a config file may set it instead).
    #[cfg_attr(feature = "cli", arg(long))]
    pub task: Option<String>,
    /// Seed of the initial weights, the batches and (unless --secure-noise) the DP noise
    /// [default: 0].
    #[cfg_attr(feature = "cli", arg(long))]
    pub seed: Option<u64>,
    /// Passes over the training set [default: the task's; 10 for `TrainConfig::new`, the papers'
    /// tasks 100, SNLI 1].
    #[cfg_attr(feature = "cli", arg(long))]
    pub epochs: Option<usize>,
    /// auto picks CUDA when LibTorch sees a GPU [default: auto].
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub device: Option<DeviceChoice>,
    /// The `[data]` settings given.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub data: DataOverrides,
    /// The `[model]` settings given.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub model: ModelOverrides,
    /// The `[optimizer]` settings given.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub optimizer: OptimizerOverrides,
    /// The `[privacy]` settings given.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub privacy: PrivacyOverrides,
    /// The `[compression]` settings given.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub compression: CompressionOverrides,
    /// The `[analysis]` settings given.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub analysis: AnalysisOverrides,
    /// The `[cuda]` settings given.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub cuda: CudaOverrides,
}

/// The top-level part of `TrainOverrides`, as serde reads it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TopLevelOverrides {
    task: Option<String>,
    seed: Option<u64>,
    epochs: Option<usize>,
    device: Option<DeviceChoice>,
}

impl TrainOverrides {
    /// The settings a TOML file gives (flat keys, sections, or both); errors name the file.
    pub fn from_toml_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_toml_str(&text, &path.display().to_string())
    }

    /// Settings from TOML text (flat keys, sections, or both); `origin` names it in errors.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self> {
        let table: toml::Table =
            toml::from_str(text).map_err(|e| Error::bad_file(origin, e.to_string()))?;
        Self::from_table(table, origin)
    }

    /// Settings from a TOML table (flat keys, sections, or both); `origin` names it in errors.
    pub fn from_table(table: toml::Table, origin: &str) -> Result<Self> {
        let mut nested = nest(table, Naming::Flat, origin)?;
        fn section<T: serde::de::DeserializeOwned + Default>(
            nested: &mut toml::Table,
            name: &str,
            origin: &str,
        ) -> Result<T> {
            match nested.remove(name) {
                None => Ok(T::default()),
                Some(v) => v.try_into().map_err(|e: toml::de::Error| {
                    Error::bad_file(origin, format!("[{name}]: {e}"))
                }),
            }
        }
        let data = section(&mut nested, DataSettings::SECTION, origin)?;
        let model = section(&mut nested, ModelSettings::SECTION, origin)?;
        let optimizer = section(&mut nested, OptimizerSettings::SECTION, origin)?;
        let privacy = section(&mut nested, PrivacySettings::SECTION, origin)?;
        let compression = section(&mut nested, CompressionSettings::SECTION, origin)?;
        let analysis = section(&mut nested, AnalysisSettings::SECTION, origin)?;
        let cuda = section(&mut nested, CudaSettings::SECTION, origin)?;
        let top: TopLevelOverrides = toml::Value::Table(nested)
            .try_into()
            .map_err(|e: toml::de::Error| Error::bad_file(origin, e.to_string()))?;
        Ok(TrainOverrides {
            task: top.task,
            seed: top.seed,
            epochs: top.epochs,
            device: top.device,
            data,
            model,
            optimizer,
            privacy,
            compression,
            analysis,
            cuda,
        })
    }

    /// `self` where given, else `base`.
    pub fn or(self, base: TrainOverrides) -> TrainOverrides {
        TrainOverrides {
            task: self.task.or(base.task),
            seed: self.seed.or(base.seed),
            epochs: self.epochs.or(base.epochs),
            device: self.device.or(base.device),
            data: self.data.or(base.data),
            model: self.model.or(base.model),
            optimizer: self.optimizer.or(base.optimizer),
            privacy: self.privacy.or(base.privacy),
            compression: self.compression.or(base.compression),
            analysis: self.analysis.or(base.analysis),
            cuda: self.cuda.or(base.cuda),
        }
    }

    /// Writes every given setting into `config`; an error names a compressor setting the
    /// chosen compressor does not read or cannot take (`CompressionOverrides::apply`).
    pub fn apply(self, config: &mut TrainConfig) -> Result<()> {
        if let Some(task) = self.task {
            config.task = task;
        }
        if let Some(seed) = self.seed {
            config.seed = seed;
        }
        if let Some(epochs) = self.epochs {
            config.epochs = epochs;
        }
        if let Some(device) = self.device {
            config.device = device;
        }
        self.data.apply(&mut config.data);
        self.model.apply(&mut config.model);
        self.optimizer.apply(&mut config.optimizer);
        self.privacy.apply(&mut config.privacy);
        self.analysis.apply(&mut config.analysis);
        self.cuda.apply(&mut config.cuda);
        self.compression.apply(&mut config.compression)
    }

    /// `TrainConfig::new`'s defaults for the task, then these settings. Errors when no task is
    /// given.
    pub fn resolve(self) -> Result<TrainConfig> {
        self.resolve_over(|task| Ok(TrainConfig::new(task)))
    }

    /// The defaults `defaults` gives the task (or its error, for a name the program does not
    /// know), then these settings. Errors when no task is given.
    pub fn resolve_over(
        self,
        defaults: impl FnOnce(&str) -> Result<TrainConfig>,
    ) -> Result<TrainConfig> {
        let task = self
            .task
            .as_deref()
            .ok_or_else(|| Error::bad_value("task", "missing: every run names its task"))?;
        let mut config = defaults(task)?;
        self.apply(&mut config)?;
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_process_takes_the_gpu_its_local_rank_names() {
        assert_eq!(this_process_gpu(None, 4), 0);
        assert_eq!(this_process_gpu(Some("3"), 4), 3);
        // More processes than GPUs share them; a malformed rank or no GPU: the first.
        assert_eq!(this_process_gpu(Some("5"), 4), 1);
        assert_eq!(this_process_gpu(Some("x"), 4), 0);
        assert_eq!(this_process_gpu(Some("2"), 0), 0);
    }

    #[test]
    fn flat_keys_name_their_sections_fields() {
        assert_eq!(flat_key("optimizer.kind"), Some("optimizer"));
        assert_eq!(flat_key("compression.options"), Some("compressor_options"));
        assert_eq!(
            flat_key("privacy.noise_multiplier"),
            Some("noise_multiplier")
        );
        assert_eq!(flat_key("epochs"), Some("epochs"));
        assert_eq!(flat_key("privacy.clip"), None);
        assert_eq!(flat_key("noise_multiplier"), None);
        // Every flat key belongs to one setting only.
        let mut flat: Vec<&str> = SECTIONS
            .iter()
            .flat_map(|(_, k)| k.iter().map(|(_, f)| *f))
            .collect();
        flat.extend(TOP_LEVEL_KEYS);
        let n = flat.len();
        flat.sort();
        flat.dedup();
        assert_eq!(flat.len(), n, "a flat key used twice");
    }

    /// A `--config` file gives the compressor as `[compression]`'s table, as flat keys with
    /// `compressor_options` (a list or a table), or as the older `options` list: the same
    /// compressor; a key the kind does not read is refused naming it, the kind and its keys.
    #[test]
    fn a_files_compressor_reads_in_every_form() {
        let resolve = |text: &str| {
            TrainOverrides::from_toml_str(&format!("task = \"surnames\"\n{text}"), "f.toml")
                .and_then(TrainOverrides::resolve)
        };
        let forms = [
            "[compression]\nkind = \"dgc\"\nrate = 256.0\nbudget = \"elements\"\n",
            "compressor = \"dgc\"\nrate = 256\ncompressor_options = [\"budget=elements\"]\n",
            "compressor = \"dgc\"\nrate = 256\ncompressor_options = { budget = \"elements\" }\n",
            "[compression]\nkind = \"dgc\"\nrate = 256.0\noptions = [\"budget=elements\"]\n",
        ];
        for text in forms {
            let config = resolve(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(
                config.compression_label().unwrap(),
                "dgc x256 (budget=elements)",
                "{text}"
            );
            let written = config.to_toml();
            assert!(
                written.contains(
                    "[compression]\nkind = \"dgc\"\nbudget = \"elements\"\nrate = 256.0\n"
                ),
                "{written}"
            );
        }
        let err = resolve("[compression]\nkind = \"dgc\"\nlevels = 4\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("compression.options: `levels` is not a setting of dgc; it accepts: rate, value_bits"),
            "{err}"
        );
        let err = resolve("[compression]\nkind = \"dcg\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown variant `dcg`, expected one of `identity`, `dgc`"),
            "{err}"
        );
    }

    #[test]
    fn flat_and_sectioned_files_give_the_same_overrides() {
        let flat = TrainOverrides::from_toml_str(
            "task = \"surnames\"\noptimizer = \"adam\"\nnoise_multiplier = 0.5\ncompressor = \"dgc\"\ncompressor_option = [\"momentum=0\"]\n",
            "flat",
        )
        .unwrap()
        .resolve()
        .unwrap();
        let nested = TrainOverrides::from_toml_str(
            "task = \"surnames\"\n[optimizer]\nkind = \"adam\"\n[privacy]\nnoise_multiplier = 0.5\n[compression]\nkind = \"dgc\"\noptions = [\"momentum=0\"]\n",
            "nested",
        )
        .unwrap()
        .resolve()
        .unwrap();
        assert_eq!(flat, nested);
        assert_eq!(flat.optimizer.kind, OptimizerKind::Adam);
        assert_eq!(flat.privacy.noise_multiplier, Some(0.5));
        assert_eq!(flat.compression.given.to_string(), "momentum = 0\n");
        assert_eq!(flat.compression_label().unwrap(), "dgc x1 (momentum=0)");
        let twice = TrainOverrides::from_toml_str("lr = 1\n[optimizer]\nlr = 2\n", "twice")
            .unwrap_err()
            .to_string();
        assert!(twice.contains("`optimizer.lr` is given twice"), "{twice}");
        let unknown = TrainOverrides::from_toml_str("[privacy]\nsigma = 2\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(
            unknown.contains("f.toml") && unknown.contains("`privacy.sigma`"),
            "{unknown}"
        );
    }
}

#[cfg(test)]
mod fine_tuning_settings_tests {
    use super::*;
    use crate::hf::FineTuning;

    #[test]
    fn the_settings_make_the_mode_and_bad_values_name_their_setting() {
        let mut model = ModelSettings::default();
        assert_eq!(
            model.fine_tuning_mode().unwrap(),
            FineTuning::LastLayers { layers: 1 }
        );
        model.fine_tuning = FineTuningKind::Lora;
        model.lora_targets = " query, value ,".into();
        let FineTuning::Lora(lora) = model.fine_tuning_mode().unwrap() else {
            panic!("lora expected")
        };
        assert_eq!(lora.target_modules, ["query", "value"]);
        assert_eq!((lora.rank, lora.alpha), (8, 16.0));
        model.lora_rank = 0;
        assert_eq!(
            model.fine_tuning_mode().unwrap_err().to_string(),
            "model.lora_rank: 0, expected at least 1"
        );
        model.lora_rank = 4;
        model.lora_dropout = 1.5;
        assert!(model
            .fine_tuning_mode()
            .unwrap_err()
            .to_string()
            .starts_with("model.lora_dropout: 1.5"));
        model.fine_tuning = FineTuningKind::LastLayers;
        model.tuned_layers = 0;
        assert!(model
            .fine_tuning_mode()
            .unwrap_err()
            .to_string()
            .starts_with("model.tuned_layers: 0"));
    }
}
