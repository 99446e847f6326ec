//! The parts a `Trainer` is built from when they are not the settings' own: a model and its
//! data (or a `TaskSource` that makes them from the settings), an optimiser, a compressor
//! (`TrainerBuilder::model`, `tasks`, `optimizer`, `compressor`), and the privacy engine's
//! settings (`TrainerBuilder::privacy`). Each part of one's own is recorded in
//! `config.toml` by its name (`config::OwnParts`), keeps its state in every checkpoint, and is
//! given again to resume.

use super::optimizer::Optimizer;
use super::{DataEdit, OwnTask};
use crate::compress::{Decoder, Encoder, Link};
use crate::config::{ClippingMode, OwnParts, PrivacySettings, TrainConfig};
use crate::data::TaskData;
use crate::error::{Error, Result};
use crate::models::Model;
use crate::privacy::builder::PrivacyEngineBuilder;
use crate::privacy::engine::{Clipping, LossReduction};
use crate::privacy::noise::NoiseSource;
use tch::Device;

/// A compressor of one's own for the `Trainer` (`TrainerBuilder::compressor`): it makes the
/// worker's `Encoder` and a receiver's `Decoder` for the trainable parameters' shapes, on their
/// device. One process uses one of each; with W data-parallel workers every rank makes its
/// encoder and W decoders, one per sender. Each side's `state` is saved in every checkpoint
/// (`compressor.safetensors`, `encoder.*` and `decoder.*`) and loaded back on resume. Its
/// messages are gathered and decoded one by one (like the sparsifiers'), so a private
/// data-parallel run needs `privacy.local_noise`.
///
/// ```
/// use dpcomp::compress::{Decoder, Encoder, Message, Unpack, DenseEncoder};
/// use dpcomp::train::parts::CompressorFactory;
///
/// /// Dense fp32 messages under a name of one's own.
/// struct Dense;
///
/// impl CompressorFactory for Dense {
///     fn name(&self) -> String {
///         "dense".into()
///     }
///     fn encoder(&self, _shapes: &[Vec<i64>], _device: tch::Device) -> dpcomp::Result<Box<dyn Encoder>> {
///         Ok(Box::new(DenseEncoder))
///     }
///     fn decoder(&self, _shapes: &[Vec<i64>], _device: tch::Device) -> dpcomp::Result<Box<dyn Decoder>> {
///         Ok(Box::new(Unpack::per_parameter()))
///     }
/// }
/// assert_eq!(Dense.name(), "dense");
/// ```
pub trait CompressorFactory {
    /// How `config.toml` (`[parts] compressor`), summaries and tables name the compressor; a
    /// resumed run must be given one of the same name. By default the type's path.
    fn name(&self) -> String {
        std::any::type_name::<Self>().to_string()
    }

    /// The worker's side, with fresh state.
    fn encoder(&self, shapes: &[Vec<i64>], device: Device) -> Result<Box<dyn Encoder>>;

    /// A receiver's side, with fresh state.
    fn decoder(&self, shapes: &[Vec<i64>], device: Device) -> Result<Box<dyn Decoder>>;
}

/// Makes the model and data a configuration's `task` names, for a trainer given no model of
/// its own (`TrainerBuilder::tasks`): a program with several named tasks (the papers' lab, a
/// benchmark suite) hands the trainer one source, and a fresh run, a resume and every
/// data-parallel worker make the task's model and data from the run's `config.toml` alone.
pub trait TaskSource: Send + Sync {
    /// The model (fresh weights, built on `config.device`, seeded from `config.seed` if the
    /// source wants a reproducible start) and the data, on the host, with `config.data`'s
    /// limits (`TaskData::limited`) and then `edit` applied. An error names the task when the
    /// source does not make it.
    fn prepare(
        &self,
        config: &TrainConfig,
        edit: Option<DataEdit>,
    ) -> Result<(Box<dyn Model>, TaskData)>;

    /// Where the task's data was read from, for an error about empty data (by default
    /// nothing more than the task's name).
    fn data_source(&self, config: &TrainConfig) -> String {
        format!("{}'s data", config.task)
    }
}

/// The parts given to a `TrainerBuilder` besides the settings.
#[derive(Default)]
pub(crate) struct Parts {
    /// A model and data of one's own (`TrainerBuilder::model`).
    pub task: Option<OwnTask>,
    /// What makes the model and data from the settings when no model is given
    /// (`TrainerBuilder::tasks`).
    pub tasks: Option<std::sync::Arc<dyn TaskSource>>,
    /// An optimiser of one's own, instead of `[optimizer]`'s kind.
    pub optimizer: Option<Box<dyn Optimizer>>,
    /// A compressor of one's own, instead of `[compression]`'s.
    pub compressor: Option<Box<dyn CompressorFactory>>,
    /// The privacy engine's settings (`write_privacy_settings` has written them into the
    /// run's `[privacy]`; kept to check a per-layer rule against the model's tensors).
    pub privacy: Option<PrivacyEngineBuilder>,
}

impl Parts {
    /// The names `config.toml` records for the parts of one's own.
    pub fn names(&self) -> OwnParts {
        OwnParts {
            optimizer: self.optimizer.as_ref().map(|o| o.name()),
            compressor: self.compressor.as_ref().map(|c| c.name()),
        }
    }

    /// Refuses a run whose recorded parts (`recorded`, from its `config.toml`) are not the ones
    /// given: a part of one's own must be given again, under the same name, and none may be
    /// given to a run that trained without it.
    pub fn check_against(&self, recorded: &OwnParts) -> Result<()> {
        let given = self.names();
        for (part, method, recorded, given) in [
            (
                "optimizer",
                "TrainerBuilder::optimizer",
                &recorded.optimizer,
                &given.optimizer,
            ),
            (
                "compressor",
                "TrainerBuilder::compressor",
                &recorded.compressor,
                &given.compressor,
            ),
        ] {
            match (recorded, given) {
                (Some(r), Some(g)) if r != g => {
                    return Err(Error::bad_value(
                        format!("parts.{part}"),
                        format!("the run was trained with the {part} {r:?}, but {g:?} was given: give the same {part} again"),
                    ))
                }
                (Some(r), None) => {
                    return Err(Error::bad_value(
                        format!("parts.{part}"),
                        format!("the run was trained with the {part} of one's own {r:?}: give it again ({method}); its state is in the checkpoint"),
                    ))
                }
                (None, Some(g)) => {
                    return Err(Error::bad_value(
                        format!("parts.{part}"),
                        format!("{g:?} was given, but the run's settings make its {part} (config.toml has no [parts] {part}): a run keeps the parts it started with"),
                    ))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The compressor of one's own as a worker's encoder and a receiver's decoder, `None` when
    /// the settings make it.
    pub fn link(&self, shapes: &[Vec<i64>], device: Device) -> Result<Option<Link>> {
        let Some(factory) = &self.compressor else {
            return Ok(None);
        };
        Ok(Some(Link {
            encoder: factory.encoder(shapes, device)?,
            decoder: factory.decoder(shapes, device)?,
        }))
    }
}

/// Writes a privacy engine's settings into `[privacy]` (`TrainerBuilder::privacy`): the noise
/// (σ or a target ε), δ, the accountant, the clipping rule and the noise source. The trainer
/// supplies what it knows itself, so the builder must leave it unset: the sampling (its
/// training split's N and `optimizer.batch_size` give q = 1 / ⌈N / B⌉), the length (its
/// epochs) and the loss's reduction (its per-sample losses are summed). A setting the builder
/// leaves unset keeps the run's own (δ, the clipping radius); a per-layer rule must be even
/// (`Clipping::per_layer_even`), and `check_per_layer` checks its count of tensors once the model
/// is built. `keep_sigma` keeps a σ already
/// recorded when the builder gives a target ε alone: a resumed run's σ was calibrated at its
/// start and is not calibrated again.
pub(crate) fn write_privacy_settings(
    builder: &PrivacyEngineBuilder,
    privacy: &mut PrivacySettings,
    keep_sigma: bool,
) -> Result<()> {
    let settings = builder;
    for (name, set) in [
        ("dataset_size", settings.dataset_size.is_some()),
        ("batch_size", settings.batch_size.is_some()),
        ("sample_rate", settings.sample_rate.is_some()),
        (
            "expected_batch_size",
            settings.expected_batch_size.is_some(),
        ),
    ] {
        if set {
            return Err(Error::bad_value(
                format!("privacy.{name}"),
                "set on the engine given to the trainer, which samples its own training split: leave it unset (q = 1 / ceil(N / B) from the split's N and optimizer.batch_size B)",
            ));
        }
    }
    for (name, set) in [
        ("epochs", settings.epochs.is_some()),
        ("steps", settings.steps.is_some()),
    ] {
        if set {
            return Err(Error::bad_value(
                format!("privacy.{name}"),
                "set on the engine given to the trainer, whose epochs are the training's length: leave it unset and set the run's epochs",
            ));
        }
    }
    if settings.loss_reduction != LossReduction::Sum {
        return Err(Error::bad_value(
            "privacy.loss_reduction",
            "mean on the engine given to the trainer, whose per-sample losses are summed: leave it at sum",
        ));
    }
    match (settings.noise_multiplier, settings.target_epsilon) {
        (None, None) => {
            return Err(Error::bad_value(
                "privacy.noise_multiplier",
                "not set on the engine given to the trainer: expected noise_multiplier (sigma) or target_epsilon",
            ))
        }
        (None, Some(_)) if keep_sigma && privacy.noise_multiplier.is_some() => {}
        (sigma, _) => privacy.noise_multiplier = sigma,
    }
    privacy.target_epsilon = settings.target_epsilon;
    if let Some(delta) = settings.delta {
        privacy.delta = delta;
    }
    privacy.accountant = settings.accountant;
    if let Some(source) = &settings.noise_source {
        privacy.secure_noise = !matches!(source, NoiseSource::Seeded);
    }
    match &settings.clipping {
        None => {}
        Some(Clipping::Flat { max_norm }) => {
            privacy.clipping = ClippingMode::Flat;
            privacy.max_grad_norm = *max_norm;
        }
        Some(Clipping::PerLayer { max_norms }) => {
            let layers = max_norms.len();
            let even = max_norms.first().copied().unwrap_or(f64::NAN);
            if max_norms.iter().any(|&c| c != even) {
                return Err(Error::bad_value(
                    "privacy.clipping",
                    format!("per-layer radii {max_norms:?} on the engine given to the trainer: the trainer clips every one of its parameter tensors at C / sqrt(L); give Clipping::per_layer_even(C, L) for its L tensors"),
                ));
            }
            privacy.clipping = ClippingMode::PerLayer;
            privacy.max_grad_norm = even * (layers as f64).sqrt();
        }
        Some(Clipping::Adaptive(a)) => {
            privacy.clipping = ClippingMode::Adaptive;
            privacy.max_grad_norm = a.radius;
            privacy.target_quantile = a.target_quantile;
            privacy.clip_learning_rate = a.learning_rate;
            privacy.count_noise = Some(a.count_noise);
        }
    }
    Ok(())
}

/// A per-layer rule given to the trainer must have one radius per trainable tensor of the
/// model (`Clipping::per_layer_even(C, L)` for its L tensors).
pub(crate) fn check_per_layer(builder: &PrivacyEngineBuilder, parameters: usize) -> Result<()> {
    match &builder.clipping {
        Some(Clipping::PerLayer { max_norms }) if max_norms.len() != parameters => {
            Err(Error::bad_value(
                "privacy.clipping",
                format!("{} per-layer radii on the engine given to the trainer, but the model has {parameters} trainable tensors: give Clipping::per_layer_even(C, {parameters})", max_norms.len()),
            ))
        }
        _ => Ok(()),
    }
}

/// Whether the run's data-parallel exchange sums the workers' messages (dense, PowerSGD,
/// shared-seed random-k), which lets the workers share the noise; a compressor of one's own is
/// gathered and decoded message by message.
pub(crate) fn exchanged_by_sum(config: &TrainConfig) -> bool {
    config.parts.compressor.is_none() && config.compression.kind().exchanged_by_sum()
}

/// How summaries and tables name the run's compressor: its own name, or the settings' label.
pub(crate) fn compressor_label(config: &TrainConfig) -> Result<String> {
    match &config.parts.compressor {
        Some(name) => Ok(name.clone()),
        None => config.compression_label(),
    }
}
