//! `PrivacyEngine::builder()`: a private training in named settings, as Opacus's
//! `make_private` / `make_private_with_epsilon`. The engine it builds owns everything a step
//! and a report need (σ, q, the expected batch that divides the noised sum, δ, the accountant,
//! the clipping rule, the step budget), so `privatize(&clipped)` and `epsilon()` take nothing
//! the engine already knows.
//!
//! ```
//! use dpcomp::prelude::*;
//! // 10 epochs over 60,000 examples at an expected batch of 256, ε = 3 at δ = 1e-5.
//! let engine = PrivacyEngine::builder()
//!     .target_epsilon(3.0)
//!     .delta(1e-5)
//!     .epochs(10)
//!     .dataset_size(60_000)
//!     .expected_batch_size(256.0)
//!     .max_grad_norm(1.0)
//!     .build(&[tch::Tensor::zeros([4], (tch::Kind::Float, tch::Device::Cpu))])?;
//! assert_eq!(engine.steps_left(), Some(2350)); // 10 x ⌈60,000 / 256⌉
//! assert!(engine.noise_multiplier() > 0.5 && engine.noise_multiplier() < 1.5);
//! # Ok::<(), dpcomp::error::Error>(())
//! ```

use super::calibrate::noise_multiplier_for;
use super::engine::{Clipping, PrivacyEngine};
use super::noise::NoiseSource;
use super::AccountantKind;
use crate::error::{Error, Result};

/// The settings of a `PrivacyEngine`; every one has a name, and the required ones are refused
/// by `build` with the setting named when missing. Required: the noise (`noise_multiplier` or
/// `target_epsilon`), `delta`, the sampling (two of `sample_rate`, `dataset_size`,
/// `expected_batch_size`) and the clipping (`max_grad_norm` or `clipping`). A `target_epsilon`
/// also needs the length of the training (`epochs` or `steps`), which then is the step budget.
#[derive(Default)]
pub struct PrivacyEngineBuilder {
    noise_multiplier: Option<f64>,
    target_epsilon: Option<f64>,
    delta: Option<f64>,
    accountant: AccountantKind,
    sample_rate: Option<f64>,
    dataset_size: Option<u64>,
    expected_batch_size: Option<f64>,
    epochs: Option<u64>,
    steps: Option<u64>,
    clipping: Option<Clipping>,
    noise_source: Option<NoiseSource>,
}

impl PrivacyEngineBuilder {
    /// σ: the noise's standard deviation over the clipping's sensitivity.
    pub fn noise_multiplier(mut self, sigma: f64) -> Self {
        self.noise_multiplier = Some(sigma);
        self
    }

    /// The ε the training may spend at `delta`: σ becomes the smallest that keeps the whole
    /// training (`epochs` or `steps`) within it (`calibrate::noise_multiplier_for`, always on
    /// the safe side).
    pub fn target_epsilon(mut self, epsilon: f64) -> Self {
        self.target_epsilon = Some(epsilon);
        self
    }

    /// δ of the (ε, δ) guarantee `epsilon()` reports (and calibrates at).
    pub fn delta(mut self, delta: f64) -> Self {
        self.delta = Some(delta);
        self
    }

    /// The accountant (default RDP, Opacus's).
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
        let budget = self.budget(sample_rate)?;
        let sigma = match (self.noise_multiplier, self.target_epsilon) {
            (Some(sigma), None) => sigma,
            (None, Some(epsilon)) => {
                let steps = budget.ok_or_else(|| {
                    Error::bad_value(
                        "target_epsilon",
                        "needs the training's length to calibrate sigma over: set epochs or steps",
                    )
                })?;
                noise_multiplier_for(self.accountant, epsilon, sample_rate, steps, delta)?
            }
            (Some(_), Some(_)) => {
                return Err(Error::bad_value(
                    "noise_multiplier",
                    "set together with target_epsilon: give one (sigma, or the epsilon to calibrate sigma for)",
                ))
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
        Ok(engine)
    }

    /// q and E[B] from the two of (q, N, E[B]) given (all three must agree).
    fn sampling(&self) -> Result<(f64, f64)> {
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

/// Steps in an epoch of Poisson sampling at rate q: ⌈1/q⌉ (an epoch is expected to visit every
/// example once), robust to 1/q landing a rounding error above an integer.
pub(crate) fn steps_per_epoch(sample_rate: f64) -> u64 {
    ((1.0 / sample_rate) * (1.0 - 1e-12)).ceil() as u64
}
