//! `PrivacyEngine::builder()`: a private training in named settings, as Opacus's
//! `make_private` / `make_private_with_epsilon`. The engine it builds owns everything a step
//! and a report need (σ, q, the expected batch that divides the noised sum, δ, the accountant,
//! the clipping rule, the step budget), so `privatize(&clipped)` and `epsilon()` take nothing
//! the engine already knows.
//!
//! ```
//! use dpcomp::prelude::*;
//! // 10 epochs over 60,000 examples in batches of 256, ε = 3 at δ = 1e-5.
//! let engine = PrivacyEngine::builder()
//!     .target_epsilon(3.0)
//!     .delta(1e-5)
//!     .epochs(10)
//!     .dataset_size(60_000)
//!     .batch_size(256)
//!     .max_grad_norm(1.0)
//!     .build(&[tch::Tensor::zeros([4], (tch::Kind::Float, tch::Device::Cpu))])?;
//! assert_eq!(engine.steps_left(), Some(2350)); // 10 x ⌈60,000 / 256⌉
//! assert_eq!(engine.sample_rate(), 1.0 / 235.0); // the Trainer's q for the same settings
//! assert!(engine.noise_multiplier() > 0.5 && engine.noise_multiplier() < 1.5);
//! # Ok::<(), dpcomp::error::Error>(())
//! ```
//!
//! Sampling. `dataset_size(N).batch_size(B)` samples as the `Trainer` does for
//! `optimizer.batch_size` B, and as Opacus's `make_private` does for a data loader of batch size
//! B: ⌈N / B⌉ steps an epoch at q = 1 / ⌈N / B⌉ (Opacus's `1 / len(data_loader)`), dividing by
//! E\[B\] = qN, so the same N and B give the same q, and the same σ for a target ε, in both.
//! `expected_batch_size(E)` instead sets q = E / N exactly; the two agree exactly when B divides
//! N (q = 1/⌈N/B⌉ is otherwise slightly below B / N: 60,000 and 256 give 1/235 against 1/234.375).

use super::calibrate::{noise_multiplier_for, steps_within_epsilon};
use super::engine::LossReduction;
use super::engine::{Clipping, PrivacyEngine};
use super::history::StepBlock;
use super::noise::NoiseSource;
use super::AccountantKind;
use crate::error::{Error, Result};

/// The settings of a `PrivacyEngine`; every one has a name, and the required ones are refused
/// by `build` with the setting named when missing. Required: the noise (`noise_multiplier` or
/// `target_epsilon`), `delta`, the sampling (`dataset_size` with `batch_size`, or two of
/// `sample_rate`, `dataset_size`, `expected_batch_size`) and the clipping (`max_grad_norm` or
/// `clipping`). Optional: `accountant`, `noise_source`, `loss_reduction`. A `target_epsilon`
/// also needs the length of the training (`epochs` or `steps`), which then is the step budget;
/// given together with `noise_multiplier`, the target shortens that budget to the steps it
/// allows.
#[derive(Default)]
pub struct PrivacyEngineBuilder {
    pub(crate) noise_multiplier: Option<f64>,
    pub(crate) target_epsilon: Option<f64>,
    pub(crate) delta: Option<f64>,
    pub(crate) accountant: AccountantKind,
    pub(crate) sample_rate: Option<f64>,
    pub(crate) dataset_size: Option<u64>,
    pub(crate) expected_batch_size: Option<f64>,
    pub(crate) batch_size: Option<u64>,
    pub(crate) epochs: Option<u64>,
    pub(crate) steps: Option<u64>,
    pub(crate) clipping: Option<Clipping>,
    pub(crate) noise_source: Option<NoiseSource>,
    pub(crate) loss_reduction: LossReduction,
}

impl PrivacyEngineBuilder {
    /// σ: the noise's standard deviation over the clipping's sensitivity.
    pub fn noise_multiplier(mut self, sigma: f64) -> Self {
        self.noise_multiplier = Some(sigma);
        self
    }

    /// The ε the training may spend at `delta`. Without `noise_multiplier`, σ becomes the
    /// smallest that keeps the whole training (`epochs` or `steps`) within it
    /// (`calibrate::noise_multiplier_for`, always on the safe side). With `noise_multiplier`, σ
    /// stays as given and the target stops the training early: the step budget (`steps_left`)
    /// becomes the most steps of the training's length whose ε stays within the target
    /// (`calibrate::steps_within_epsilon`).
    pub fn target_epsilon(mut self, epsilon: f64) -> Self {
        self.target_epsilon = Some(epsilon);
        self
    }

    /// δ of the (ε, δ) guarantee `epsilon()` reports (and calibrates at).
    pub fn delta(mut self, delta: f64) -> Self {
        self.delta = Some(delta);
        self
    }

    /// The accountant (default PLD, the tight one; `AccountantKind::Rdp` for Opacus's RDP).
    pub fn accountant(mut self, kind: AccountantKind) -> Self {
        self.accountant = kind;
        self
    }

    /// q, each example's chance of being in a batch (Poisson sampling).
    pub fn sample_rate(mut self, q: f64) -> Self {
        self.sample_rate = Some(q);
        self
    }

    /// N, the number of examples (or of clients, under client-level DP).
    pub fn dataset_size(mut self, examples: u64) -> Self {
        self.dataset_size = Some(examples);
        self
    }

    /// E\[B\] = qN, what the noised clipped sum is divided by (never the realised batch size,
    /// which would leak who was sampled).
    pub fn expected_batch_size(mut self, examples: f64) -> Self {
        self.expected_batch_size = Some(examples);
        self
    }

    /// B, the batch size of a data loader (with `dataset_size` N, instead of
    /// `expected_batch_size`): q = 1 / ⌈N / B⌉ and E\[B\] = qN, the `Trainer`'s rule for its
    /// `optimizer.batch_size` and Opacus's for a data loader (module docs). A B larger than N is
    /// refused.
    pub fn batch_size(mut self, examples: u64) -> Self {
        self.batch_size = Some(examples);
        self
    }

    /// How the loss handed to `per_sample_of` was reduced over the batch: `LossReduction::Sum`
    /// (the default) or `LossReduction::Mean` (Opacus's `loss_reduction="mean"`), which `clip`
    /// undoes by multiplying each per-sample gradient by the batch's size before clipping.
    pub fn loss_reduction(mut self, reduction: LossReduction) -> Self {
        self.loss_reduction = reduction;
        self
    }

    /// The training's length in epochs of ⌈1/q⌉ steps (the `Trainer`'s steps per epoch): the
    /// step budget, and what `target_epsilon` calibrates over.
    pub fn epochs(mut self, epochs: u64) -> Self {
        self.epochs = Some(epochs);
        self
    }

    /// The training's length in steps (instead of `epochs`).
    pub fn steps(mut self, steps: u64) -> Self {
        self.steps = Some(steps);
        self
    }

    /// Flat clipping at radius C (Abadi et al. 2016).
    pub fn max_grad_norm(mut self, max_norm: f64) -> Self {
        self.clipping = Some(Clipping::Flat { max_norm });
        self
    }

    /// Any clipping rule: per layer or adaptive (instead of `max_grad_norm`).
    pub fn clipping(mut self, clipping: Clipping) -> Self {
        self.clipping = Some(clipping);
        self
    }

    /// Where the noise comes from (default `NoiseSource::Seeded`, reproducible; use
    /// `NoiseSource::secure()` for a release).
    pub fn noise_source(mut self, source: NoiseSource) -> Self {
        self.noise_source = Some(source);
        self
    }

    /// The engine for `parameters` (the trainable tensors, in the order the per-sample
    /// gradients come in; only their number is used).
    pub fn build<T>(self, parameters: &[T]) -> Result<PrivacyEngine> {
        let delta = self.delta.ok_or_else(|| {
            Error::bad_value(
                "delta",
                "not set: expected the delta of the (epsilon, delta) guarantee, e.g. 1e-5 (below 1 / dataset size)",
            )
        })?;
        match self.accountant {
            AccountantKind::Rdp => super::validate_delta(delta)?,
            AccountantKind::Pld => super::pld::validate_pld_delta(delta)?,
        }
        let (sample_rate, expected_batch) = self.sampling()?;
        if let Some(n) = self
            .dataset_size
            .filter(|&n| n > 0 && delta >= 1.0 / n as f64)
        {
            log::warn!("{}", weak_delta(delta, n));
        }
        let length = self.budget(sample_rate)?;
        let (sigma, budget) = match (self.noise_multiplier, self.target_epsilon) {
            (Some(sigma), None) => (sigma, length),
            (None, Some(epsilon)) => {
                let steps = length.ok_or_else(|| {
                    Error::bad_value(
                        "target_epsilon",
                        "needs the training's length to calibrate sigma over: set epochs or steps",
                    )
                })?;
                let sigma =
                    noise_multiplier_for(self.accountant, epsilon, sample_rate, steps, delta)?;
                (sigma, length)
            }
            (Some(sigma), Some(epsilon)) => {
                let steps = length.ok_or_else(|| {
                    Error::bad_value(
                        "target_epsilon",
                        "with noise_multiplier it is a budget that stops the training early, which needs the training's length: set epochs or steps",
                    )
                })?;
                let within = steps_within_epsilon(
                    StepBlock {
                        noise_multiplier: sigma,
                        sample_rate,
                        steps,
                    },
                    self.accountant,
                    epsilon,
                    delta,
                )?;
                (sigma, Some(within))
            }
            (None, None) => {
                return Err(Error::bad_value(
                    "noise_multiplier",
                    "not set: expected noise_multiplier (sigma) or target_epsilon",
                ))
            }
        };
        let clipping = self.clipping.ok_or_else(|| {
            Error::bad_value(
                "max_grad_norm",
                "not set: expected the clipping radius C (max_grad_norm) or a clipping rule (clipping)",
            )
        })?;
        let noise = self.noise_source.unwrap_or(NoiseSource::Seeded);
        let mut engine = PrivacyEngine::new(sigma, sample_rate, clipping, noise, parameters.len())?;
        engine.set_reporting(self.accountant, delta, expected_batch, budget);
        engine.set_epsilon_budget(self.target_epsilon);
        engine.set_loss_reduction(self.loss_reduction);
        Ok(engine)
    }

    /// q and E[B]: from N and a batch size B (`BatchSampling`), or from the two of (q, N, E[B])
    /// given (all three must agree).
    fn sampling(&self) -> Result<(f64, f64)> {
        if let Some(b) = self.batch_size {
            let n = match (self.dataset_size, self.sample_rate, self.expected_batch_size) {
                (Some(n), None, None) => n,
                _ => {
                    return Err(Error::bad_value(
                        "batch_size",
                        format!("{b}: give it with dataset_size alone (q = 1 / ceil(dataset_size / batch_size)), not with sample_rate or expected_batch_size"),
                    ))
                }
            };
            let sampling = BatchSampling::new(n, b)?;
            return Ok((sampling.sample_rate, sampling.expected_batch));
        }
        if let (Some(n), Some(b)) = (self.dataset_size, self.expected_batch_size) {
            if self.sample_rate.is_none() && b > n as f64 {
                return Err(Error::bad_value(
                    "expected_batch_size",
                    format!("{b}: larger than dataset_size {n}; a batch samples each example with probability expected_batch_size / dataset_size, which cannot exceed 1"),
                ));
            }
        }
        let n = self.dataset_size.map(|n| n as f64);
        let (q, batch) = match (self.sample_rate, n, self.expected_batch_size) {
            (Some(q), Some(n), None) => (q, q * n),
            (None, Some(n), Some(b)) => (b / n, b),
            (Some(q), None, Some(b)) => (q, b),
            (Some(q), Some(n), Some(b)) => {
                if (q * n - b).abs() > 1e-9 * b.abs().max(1.0) {
                    return Err(Error::bad_value(
                        "expected_batch_size",
                        format!("{b}: differs from sample_rate {q} x dataset_size {n} = {}; give two of the three", q * n),
                    ));
                }
                (q, b)
            }
            _ => {
                return Err(Error::bad_value(
                    "sample_rate",
                    "not enough sampling settings: expected two of sample_rate, dataset_size and expected_batch_size",
                ))
            }
        };
        if !(batch > 0.0 && batch.is_finite()) {
            return Err(Error::bad_value(
                "expected_batch_size",
                format!("{batch}: expected a positive number of examples"),
            ));
        }
        super::validate(q, 0.0, 1)?;
        Ok((q, batch))
    }

    /// The step budget: `steps`, or `epochs` x ⌈1/q⌉; `None` when neither is set.
    fn budget(&self, sample_rate: f64) -> Result<Option<u64>> {
        match (self.steps, self.epochs) {
            (Some(_), Some(_)) => Err(Error::bad_value(
                "steps",
                "set together with epochs: give one length of the training",
            )),
            (Some(0), None) | (None, Some(0)) => Err(Error::bad_value(
                if self.steps.is_some() {
                    "steps"
                } else {
                    "epochs"
                },
                "0: expected a training of at least one step",
            )),
            (Some(steps), None) => Ok(Some(steps)),
            (None, Some(epochs)) => {
                let per_epoch = steps_per_epoch(sample_rate);
                epochs.checked_mul(per_epoch).map(Some).ok_or_else(|| {
                    Error::bad_value(
                        "epochs",
                        format!("{epochs}: at {per_epoch} steps an epoch, more steps than can be counted"),
                    )
                })
            }
            (None, None) => Ok(None),
        }
    }
}

/// The warning for a δ of at least 1/N: a mechanism that publishes one example in the clear
/// meets (0, 1/N)-DP, so such a δ promises little.
pub(crate) fn weak_delta(delta: f64, examples: u64) -> String {
    format!(
        "delta {delta} is at least 1 / {examples} (1 / the number of examples): an (epsilon, delta) guarantee with delta >= 1/N allows publishing an example in the clear; choose delta well below 1/N (1e-5 for N up to about 100,000)"
    )
}

/// An epoch of Poisson sampling for a batch size B over N examples: the one rule of the
/// `Trainer` (for `optimizer.batch_size`) and of the builder's `batch_size`, Opacus's
/// `make_private` for a data loader: ⌈N / B⌉ steps at q = 1 / ⌈N / B⌉, dividing by E\[B\] = qN.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BatchSampling {
    /// ⌈N / B⌉.
    pub steps_per_epoch: u64,
    /// 1 / ⌈N / B⌉.
    pub sample_rate: f64,
    /// N / ⌈N / B⌉.
    pub expected_batch: f64,
}

impl BatchSampling {
    /// The sampling of `examples` N in batches of `batch_size` B; a B of 0 or above N is refused
    /// (`batch_size`, naming both: q would exceed 1 and Poisson sampling could not give a
    /// batch that large).
    pub(crate) fn new(examples: u64, batch_size: u64) -> Result<Self> {
        if batch_size == 0 || batch_size > examples {
            return Err(Error::bad_value(
                "batch_size",
                format!("{batch_size}: expected 1 to the data set's size, {examples} examples (a batch samples each example with probability 1 / ceil(examples / batch_size), at most 1)"),
            ));
        }
        let steps = steps_per_epoch_of_batches(examples, batch_size);
        Ok(BatchSampling {
            steps_per_epoch: steps,
            sample_rate: 1.0 / steps as f64,
            expected_batch: examples as f64 / steps as f64,
        })
    }
}

/// Steps in an epoch of `examples` N in batches of `batch_size` B: ⌈N / B⌉ (0 for no examples; a
/// B of 0 counts as 1). The one rule for an epoch's steps: the `Trainer`'s with or without DP,
/// and under DP 1 / q (`BatchSampling`).
pub fn steps_per_epoch_of_batches(examples: u64, batch_size: u64) -> u64 {
    examples.div_ceil(batch_size.max(1))
}

/// Steps in an epoch of Poisson sampling at rate q: ⌈1/q⌉ (an epoch is expected to visit every
/// example once), robust to 1/q landing a rounding error above an integer.
pub(crate) fn steps_per_epoch(sample_rate: f64) -> u64 {
    ((1.0 / sample_rate) * (1.0 - 1e-12)).ceil() as u64
}
