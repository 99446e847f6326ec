//! The privacy engine: the one place where a DP-SGD step's privacy is decided. It holds the
//! noise multiplier σ, the sampling rate q, the clipping rule, the noise source and the
//! accountant, and offers two operations:
//!
//! - `clip`: per-sample gradients -> their clipped sums (and how many examples were clipped);
//! - `privatize`: the clipped sums of one logical batch -> the noised mean gradient, with the
//!   step recorded in the accountant in the same call. There is no other way to draw DP noise
//!   or to count a step, so no step is noised without being counted or counted without being
//!   noised (Abadi et al. 2016, Algorithm 1; the accountant is Opacus's RDP or the PLD).
//!
//! Clipping (`Clipping`): flat (one radius C over all parameters, c_i = min(1, C / (||g_i|| +
//! 1e-6))) or per layer (a radius C_l per parameter tensor, as Opacus's `clipping="per_layer"`
//! takes one max norm per parameter). One example then moves the clipped sum by at most
//! sqrt(Σ_l C_l²) in L2, so that is the sensitivity the noise is scaled by (Opacus's
//! `DPPerLayerOptimizer` uses the same norm of the radii); the trainer's per-layer default
//! C_l = C / sqrt(L) keeps the sensitivity, and hence ε for a given σ, equal to flat clipping's.

use super::accountant::Accountant;
use super::noise::{noisy_mean, NoiseSource};
use crate::config::AccountantKind;
use crate::error::{Error, Result};
use crate::nn::PerSample;
use tch::{Kind, Tensor};

/// How each example's gradient is bounded.
#[derive(Debug, Clone, PartialEq)]
pub enum Clipping {
    /// One radius over all parameters (`f64::INFINITY`: no clipping, norms only).
    Flat { max_norm: f64 },
    /// One radius per parameter tensor, in the order of the parameters.
    PerLayer { max_norms: Vec<f64> },
}

impl Clipping {
    /// Per-layer radii that split `max_norm` evenly over `layers` parameter tensors:
    /// C / sqrt(L) each, so that the sensitivity stays `max_norm`.
    pub fn per_layer_even(max_norm: f64, layers: usize) -> Self {
        Clipping::PerLayer {
            max_norms: vec![max_norm / (layers.max(1) as f64).sqrt(); layers],
        }
    }

    /// The L2 distance one example can move the clipped sum: C, or sqrt(Σ_l C_l²).
    pub fn sensitivity(&self) -> f64 {
        match self {
            Clipping::Flat { max_norm } => *max_norm,
            Clipping::PerLayer { max_norms } => max_norms.iter().map(|c| c * c).sum::<f64>().sqrt(),
        }
    }

    fn validate(&self, parameters: usize) -> Result<()> {
        let radii: Vec<f64> = match self {
            Clipping::Flat { max_norm } => vec![*max_norm],
            Clipping::PerLayer { max_norms } => {
                if max_norms.len() != parameters {
                    return Err(Error::bad_value(
                        "per-layer clipping",
                        format!(
                            "{} radii for {parameters} trainable parameter tensors; give one per tensor",
                            max_norms.len()
                        ),
                    ));
                }
                max_norms.clone()
            }
        };
        match radii.iter().find(|c| c.is_nan() || **c <= 0.0) {
            Some(c) => Err(Error::bad_value(
                "clipping radius",
                format!("{c}: must be positive (infinity: no clipping)"),
            )),
            None => Ok(()),
        }
    }

    /// Each parameter's clip factors [B] from each parameter's per-sample squared norms [B]
    /// (in the order of the parameters), and the per-sample norm over all parameters.
    pub fn factors(&self, squared: &[Tensor]) -> (Vec<Tensor>, Tensor) {
        let total = Tensor::stack(squared, 0)
            .sum_dim_intlist(0, false, squared[0].kind())
            .sqrt();
        let factor = |norm: &Tensor, c: f64| {
            if c.is_finite() {
                (c / (norm + 1e-6)).clamp_max(1.0)
            } else {
                norm.ones_like()
            }
        };
        let factors = match self {
            Clipping::Flat { max_norm } => {
                let f = factor(&total, *max_norm);
                squared.iter().map(|_| f.shallow_clone()).collect()
            }
            Clipping::PerLayer { max_norms } => squared
                .iter()
                .zip(max_norms)
                .map(|(s, c)| factor(&s.sqrt(), *c))
                .collect(),
        };
        (factors, total)
    }
}

/// One (physical) batch's clipped sums.
pub struct Clipped {
    /// Σ_i c_i g_i per parameter, in the order of the parameters.
    pub sums: Vec<Tensor>,
    /// ||g_i|| over all parameters before clipping, [B].
    pub norms: Tensor,
    /// Examples with any factor below 1 (0-d int64 on the device).
    pub clipped: Tensor,
}

pub struct PrivacyEngine {
    noise_multiplier: f64,
    sample_rate: f64,
    clipping: Clipping,
    noise: NoiseSource,
    accountant: Accountant,
}

impl PrivacyEngine {
    /// An engine for `parameters` trainable tensors at noise multiplier σ and sampling rate q,
    /// with an empty accountant.
    pub fn new(
        noise_multiplier: f64,
        sample_rate: f64,
        clipping: Clipping,
        noise: NoiseSource,
        parameters: usize,
    ) -> Result<Self> {
        super::validate(sample_rate, noise_multiplier, 1)?;
        clipping.validate(parameters)?;
        if noise_multiplier > 0.0 && !clipping.sensitivity().is_finite() {
            return Err(Error::bad_value(
                "clipping radius",
                "infinite with noise: a private step needs a finite radius to scale the noise by",
            ));
        }
        Ok(PrivacyEngine {
            noise_multiplier,
            sample_rate,
            clipping,
            noise,
            accountant: Accountant::default(),
        })
    }

    /// Opacus's `make_private_with_epsilon`: the engine whose σ is the smallest that keeps
    /// `steps` steps at sampling rate q within `target_epsilon` at δ on the `kind` accountant
    /// (`calibrate::noise_multiplier_for`, always on the safe side: ε(σ) <= target). For a
    /// training of E epochs at q = 1 / (steps per epoch), `steps` = E / q.
    #[allow(clippy::too_many_arguments)]
    pub fn with_epsilon(
        target_epsilon: f64,
        delta: f64,
        kind: AccountantKind,
        sample_rate: f64,
        steps: u64,
        clipping: Clipping,
        noise: NoiseSource,
        parameters: usize,
    ) -> Result<Self> {
        let sigma = super::calibrate::noise_multiplier_for(
            kind,
            target_epsilon,
            sample_rate,
            steps,
            delta,
        )?;
        Self::new(sigma, sample_rate, clipping, noise, parameters)
    }

    /// Continues from a checkpoint's accountant. Every recorded block must be at this engine's
    /// σ and q (anything else would mix two mechanisms under one ε).
    pub fn resume(&mut self, accountant: Accountant) -> Result<()> {
        for b in &accountant.history {
            if b.noise_multiplier != self.noise_multiplier || b.sample_rate != self.sample_rate {
                return Err(Error::bad_value(
                    "accountant",
                    format!(
                        "the accountant records {} steps at sigma {} and q {}, but this run's are sigma {} and q {}",
                        b.steps, b.noise_multiplier, b.sample_rate, self.noise_multiplier, self.sample_rate
                    ),
                ));
            }
        }
        self.accountant = accountant;
        Ok(())
    }

    pub fn noise_multiplier(&self) -> f64 {
        self.noise_multiplier
    }

    pub fn sample_rate(&self) -> f64 {
        self.sample_rate
    }

    pub fn clipping(&self) -> &Clipping {
        &self.clipping
    }

    /// The standard deviation of the noise added to a clipped sum: σ x sensitivity.
    pub fn noise_std(&self) -> f64 {
        self.noise_multiplier * self.clipping.sensitivity()
    }

    /// "seeded" or "secure".
    pub fn noise_label(&self) -> &'static str {
        self.noise.label()
    }

    pub fn accountant(&self) -> &Accountant {
        &self.accountant
    }

    /// ε after the steps taken so far, at δ.
    pub fn epsilon(&self, kind: AccountantKind, delta: f64) -> Result<f64> {
        Ok(self.accountant.epsilon(kind, delta)?.0)
    }

    /// Clips `per_sample` (in the order of the parameters) and sums each parameter's clipped
    /// gradients. A logical batch in several chunks is clipped chunk by chunk and its sums added
    /// before `privatize`.
    pub fn clip(&self, per_sample: &[(Tensor, PerSample)]) -> Clipped {
        let squared: Vec<Tensor> = per_sample.iter().map(|(_, r)| r.squared_norms()).collect();
        let (factors, norms) = self.clipping.factors(&squared);
        let sums = per_sample
            .iter()
            .zip(&factors)
            .map(|((_, r), c)| r.weighted_sum(c))
            .collect();
        let any = Tensor::stack(&factors.iter().map(|f| f.lt(1.0)).collect::<Vec<_>>(), 0)
            .any_dim(0, false);
        Clipped {
            sums,
            norms,
            clipped: any.sum(Kind::Int64),
        }
    }

    /// The noised mean gradient of one logical batch from its clipped sums: each sum plus
    /// N(0, (σ sensitivity)²) per coordinate, divided by `expected_batch` (q N under Poisson
    /// sampling, never the realised size). The step is counted in the accountant first; if it
    /// cannot be (σ or q invalid), no noise is drawn and nothing is returned.
    pub fn privatize(&mut self, sums: &[Tensor], expected_batch: f64) -> Result<Vec<Tensor>> {
        self.accountant
            .step(self.noise_multiplier, self.sample_rate, 1)?;
        let (sigma, sensitivity) = (self.noise_multiplier, self.clipping.sensitivity());
        Ok(tch::no_grad(|| {
            sums.iter()
                .map(|s| noisy_mean(s, sigma, sensitivity, expected_batch, &mut self.noise))
                .collect()
        }))
    }
}
