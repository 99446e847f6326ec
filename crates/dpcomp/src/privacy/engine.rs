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
//!
//! Adaptive clipping (Andrew et al. 2021, "Differentially private learning with adaptive
//! clipping", Algorithm 1 with the geometric update): flat clipping at a radius C_t that tracks
//! the γ-quantile of the per-example norms. After each step the engine releases the fraction of
//! examples that were not clipped, b̃_t = (Σ_i (b_i - 1/2) + N(0, σ_b²)) / E\[B\] + 1/2 with
//! b_i = 1{||g_i|| <= C_t} (centring makes the count's sensitivity 1/2), and sets
//! C_{t+1} = C_t exp(-η (b̃_t - γ)). The two releases of a step compose to one Gaussian
//! mechanism at the configured σ when the gradient is noised at σ_Δ = (σ^-2 - (2σ_b)^-2)^-1/2
//! (their Theorem 1), so the accountant records the step at σ, exactly as for flat clipping,
//! and the gradient noise is slightly larger (σ_Δ > σ; needs 2σ_b > σ). The count, the radius
//! and its update stay on the device (no host read in the step): C_t is a 0-d f64 tensor that scales the clip
//! factors and the noise (`StepClipping`), read on the host only with the epoch's results
//! (`clip_radius`: each epoch's metrics and checkpoint). The update's arithmetic is the host
//! formula's, operation for operation, except that LibTorch's exp may differ from the C
//! library's in the last bit.

use super::accountant::Accountant;
use super::noise::{noisy_mean, noisy_mean_at, NoiseSource};
use super::AccountantKind;
use crate::error::{Error, Result};
use crate::nn::PerSample;
use tch::{Device, Kind, Tensor};

/// How each example's gradient is bounded.
#[derive(Debug, Clone, PartialEq)]
pub enum Clipping {
    /// One radius over all parameters (`f64::INFINITY`: no clipping, norms only).
    Flat {
        /// C: the largest L2 norm an example's gradient keeps, over all parameters.
        max_norm: f64,
    },
    /// One radius per parameter tensor, in the order of the parameters.
    PerLayer {
        /// C_l for parameter tensor l; the sensitivity is sqrt(Σ_l C_l²).
        max_norms: Vec<f64>,
    },
    /// One radius over all parameters that follows a quantile of the norms (see the module docs).
    Adaptive(AdaptiveClipping),
}

/// How the loss handed to `per_sample_of` combines a batch's per-example losses: Opacus's
/// `loss_reduction`. The reduction changes what the per-sample gradients of that loss are, not
/// what is clipped: under `Mean` each example's gradient of the mean, g_i / B, is multiplied by
/// the batch's B before clipping (Opacus's `GradSampleModule` multiplies the backpropagated
/// gradients by the batch's size for `loss_reduction="mean"`), so both reductions clip the
/// same per-example gradients g_i at the same radius, report the same norms, and `privatize`
/// returns the same update: the noised clipped sum divided by the expected batch E\[B\] (what
/// Opacus's optimiser returns under `"mean"`; under `"sum"` Opacus leaves the noised sum
/// undivided, an update E\[B\] times larger).
///
/// ```
/// use dpcomp::prelude::*;
/// let params = [tch::Tensor::zeros([2], (tch::Kind::Float, tch::Device::Cpu))];
/// let engine = PrivacyEngine::builder()
///     .noise_multiplier(1.0).delta(1e-5).dataset_size(1_000).batch_size(32).max_grad_norm(1.0)
///     .loss_reduction(LossReduction::Mean) // the loss is `Reduction::Mean` of the batch's losses
///     .build(&params)?;
/// assert_eq!(engine.loss_reduction(), LossReduction::Mean);
/// # Ok::<(), dpcomp::error::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LossReduction {
    /// Σ_i loss_i (the default, as dpcomp's guides write their losses): the per-sample
    /// gradients are the examples' own.
    #[default]
    Sum,
    /// (1 / B) Σ_i loss_i over the B examples of the batch the loss was computed on (a physical
    /// batch, when a logical batch is clipped in chunks): `clip` multiplies each per-sample
    /// gradient by that B before clipping.
    Mean,
}

impl LossReduction {
    /// "sum" or "mean", Opacus's names.
    pub fn label(&self) -> &'static str {
        match self {
            LossReduction::Sum => "sum",
            LossReduction::Mean => "mean",
        }
    }
}

/// Andrew et al. 2021's quantile-tracking radius: its current value and how it moves.
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveClipping {
    /// C_t, the radius the next step clips at (the initial radius before the first step).
    pub radius: f64,
    /// γ: the share of examples that should end up unclipped (the paper's default 0.5).
    pub target_quantile: f64,
    /// η of the geometric update C <- C exp(-η (b̃ - γ)) (the paper's default 0.2).
    pub learning_rate: f64,
    /// σ_b: the standard deviation of the noise on the unclipped count, in examples (the
    /// paper's suggestion: E\[B\] / 20). Must exceed σ / 2 under noise.
    pub count_noise: f64,
}

impl AdaptiveClipping {
    /// Andrew et al.'s γ.
    pub const DEFAULT_TARGET_QUANTILE: f64 = 0.5;
    /// Andrew et al.'s η.
    pub const DEFAULT_LEARNING_RATE: f64 = 0.2;

    /// Andrew et al.'s σ_b for an expected batch E\[B\]: E\[B\] / 20.
    pub fn default_count_noise(expected_batch: f64) -> f64 {
        expected_batch / 20.0
    }

    /// The paper's defaults around a starting radius: γ = 0.5, η = 0.2, σ_b = E\[B\] / 20.
    pub fn new(initial: f64, expected_batch: f64) -> Self {
        AdaptiveClipping {
            radius: initial,
            target_quantile: Self::DEFAULT_TARGET_QUANTILE,
            learning_rate: Self::DEFAULT_LEARNING_RATE,
            count_noise: Self::default_count_noise(expected_batch),
        }
    }

    /// The largest η accepted: one step then moves the radius by at most e^{η max(γ, 1 − γ)}
    /// (e^10 = 22,000x at η 20 and γ 0.5); beyond it a single step can collapse the radius or
    /// blow it up, and the run diverges for a reason that is not the learning rate's.
    pub const MAX_LEARNING_RATE: f64 = 20.0;
    /// The radius never leaves [`MIN_RADIUS`, `MAX_RADIUS`] (post-processing of the released
    /// count, so the bound costs no privacy): a radius of 0 would stop training silently and an
    /// infinite one would scale the noise to infinity.
    pub const MIN_RADIUS: f64 = 1e-12;
    /// See `MIN_RADIUS`.
    pub const MAX_RADIUS: f64 = 1e12;

    /// One geometric update from the released unclipped fraction b̃, kept within
    /// [`MIN_RADIUS`, `MAX_RADIUS`].
    pub fn update(&mut self, unclipped_fraction: f64) {
        let factor = (-self.learning_rate * (unclipped_fraction - self.target_quantile)).exp();
        self.radius = (self.radius * factor).clamp(Self::MIN_RADIUS, Self::MAX_RADIUS);
    }

    /// `update` on tensors: the radius after `radius` (0-d f64) given the released fraction
    /// (0-d f64), computed where they are, so that a step reads nothing to the host. The same
    /// operations in the same order as `update`.
    pub fn updated(&self, radius: &Tensor, unclipped_fraction: &Tensor) -> Tensor {
        let factor = ((unclipped_fraction - self.target_quantile) * -self.learning_rate).exp();
        (radius * factor).clamp(Self::MIN_RADIUS, Self::MAX_RADIUS)
    }

    fn validate(&self, noise_multiplier: f64) -> Result<()> {
        if !(self.target_quantile > 0.0 && self.target_quantile < 1.0) {
            return Err(Error::bad_value(
                "target_quantile",
                format!("{}: expected 0 < gamma < 1", self.target_quantile),
            ));
        }
        if !(self.learning_rate >= 0.0 && self.learning_rate <= Self::MAX_LEARNING_RATE) {
            return Err(Error::bad_value(
                "clip_learning_rate",
                format!(
                    "{}: expected 0 <= eta <= {} (Andrew et al.'s default is {}; a larger eta moves the radius by up to e^(eta/2) a step)",
                    self.learning_rate,
                    Self::MAX_LEARNING_RATE,
                    Self::DEFAULT_LEARNING_RATE
                ),
            ));
        }
        if !(self.radius >= Self::MIN_RADIUS && self.radius <= Self::MAX_RADIUS) {
            return Err(Error::bad_value(
                "clipping radius",
                format!(
                    "{}: adaptive clipping starts from a radius in [{:e}, {:e}]",
                    self.radius,
                    Self::MIN_RADIUS,
                    Self::MAX_RADIUS
                ),
            ));
        }
        if !(self.count_noise.is_finite() && self.count_noise >= 0.0) {
            return Err(Error::bad_value(
                "count_noise",
                format!("{}: expected a finite sigma_b >= 0", self.count_noise),
            ));
        }
        if noise_multiplier > 0.0 && 2.0 * self.count_noise <= noise_multiplier {
            return Err(Error::bad_value(
                "count_noise",
                format!(
                    "{}: the unclipped count must be noised with sigma_b > sigma / 2 = {} so that the step still costs sigma {noise_multiplier} (Andrew et al. 2021, Theorem 1); E[B] / 20 is the paper's choice",
                    self.count_noise,
                    noise_multiplier / 2.0
                ),
            ));
        }
        Ok(())
    }
}

impl Clipping {
    /// Per-layer radii that split `max_norm` evenly over `layers` parameter tensors:
    /// C / sqrt(L) each, so that the sensitivity stays `max_norm`.
    pub fn per_layer_even(max_norm: f64, layers: usize) -> Self {
        Clipping::PerLayer {
            max_norms: vec![max_norm / (layers.max(1) as f64).sqrt(); layers],
        }
    }

    /// How errors and summaries name the rule.
    pub fn label(&self) -> &'static str {
        match self {
            Clipping::Flat { .. } => "flat",
            Clipping::PerLayer { .. } => "per-layer",
            Clipping::Adaptive(_) => "adaptive",
        }
    }

    /// The L2 distance one example can move the clipped sum: C, sqrt(Σ_l C_l²), or C_t.
    pub fn sensitivity(&self) -> f64 {
        match self {
            Clipping::Flat { max_norm } => *max_norm,
            Clipping::PerLayer { max_norms } => max_norms.iter().map(|c| c * c).sum::<f64>().sqrt(),
            Clipping::Adaptive(a) => a.radius,
        }
    }

    fn validate(&self, parameters: usize, noise_multiplier: f64) -> Result<()> {
        let radii: Vec<f64> = match self {
            Clipping::Flat { max_norm } => vec![*max_norm],
            Clipping::Adaptive(a) => {
                a.validate(noise_multiplier)?;
                if !a.radius.is_finite() {
                    return Err(Error::bad_value(
                        "clipping radius",
                        "infinite: adaptive clipping starts from a finite radius",
                    ));
                }
                vec![a.radius]
            }
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

    /// Clips `per_sample` (in the order of the parameters) by this rule and sums each
    /// parameter's clipped gradients (`PrivacyEngine::clip`).
    pub fn clip(&self, per_sample: &[(Tensor, PerSample)]) -> Clipped {
        StepClipping::from(self).clip(per_sample)
    }

    /// `clip` with each parameter's ||g_i||² \[B\] already known (taken inside the backward pass,
    /// `privacy::grad_sample::clipped_sums`), in the order of `per_sample`.
    pub fn clip_with_squared_norms(
        &self,
        per_sample: &[(Tensor, PerSample)],
        squared: &[Tensor],
    ) -> Clipped {
        StepClipping::from(self).clip_with_squared_norms(per_sample, squared)
    }

    /// Each parameter's clip factors \[B\] from each parameter's per-sample squared norms \[B\]
    /// (in the order of the parameters), and the per-sample norm over all parameters.
    pub fn factors(&self, squared: &[Tensor]) -> (Vec<Tensor>, Tensor) {
        StepClipping::from(self).factors(squared)
    }
}

/// A clipping rule as a step applies it (`PrivacyEngine::clipping`): the rule and, under
/// adaptive clipping, the radius C_t the engine keeps as a 0-d f64 tensor (on the gradients'
/// device after the first step), so that clipping at it reads nothing to the host. A
/// `&Clipping` converts into one that clips at the rule's own radii (an adaptive rule at its
/// `AdaptiveClipping::radius`).
#[derive(Debug, Clone, Copy)]
pub struct StepClipping<'a> {
    rule: &'a Clipping,
    radius: Option<&'a Tensor>,
}

impl<'a> From<&'a Clipping> for StepClipping<'a> {
    fn from(rule: &'a Clipping) -> Self {
        StepClipping { rule, radius: None }
    }
}

impl<'a> StepClipping<'a> {
    /// The rule (under adaptive clipping its starting, or resumed, radius).
    pub fn rule(&self) -> &'a Clipping {
        self.rule
    }

    /// Clips `per_sample` (in the order of the parameters) and sums each parameter's clipped
    /// gradients (`PrivacyEngine::clip`).
    pub fn clip(&self, per_sample: &[(Tensor, PerSample)]) -> Clipped {
        let squared: Vec<Tensor> = per_sample.iter().map(|(_, r)| r.squared_norms()).collect();
        self.clip_with_squared_norms(per_sample, &squared)
    }

    /// `clip` with each parameter's ||g_i||² \[B\] already known (taken inside the backward pass,
    /// `privacy::grad_sample::clipped_sums`), in the order of `per_sample`.
    pub fn clip_with_squared_norms(
        &self,
        per_sample: &[(Tensor, PerSample)],
        squared: &[Tensor],
    ) -> Clipped {
        self.clip_scaled(per_sample, squared, None)
    }

    /// `clip` of per-sample gradients given as 1 / `scale` of the examples' own (the gradients
    /// of a mean loss, `LossReduction::Mean`, with `scale` the batch's B): each is multiplied by
    /// `scale` before clipping, so the norms, factors and sums are those of the examples' own
    /// gradients.
    pub(crate) fn clip_scaled(
        &self,
        per_sample: &[(Tensor, PerSample)],
        squared: &[Tensor],
        scale: Option<f64>,
    ) -> Clipped {
        self.clip_each(per_sample.iter().map(|(_, r)| r), squared, scale)
    }

    /// `clip_with_squared_norms` that takes the recipes and lets each go as soon as its clipped
    /// sum is formed, so that the sums do not accumulate beside every layer's recipe (its
    /// activations, output gradients and any instantiated per-sample gradients).
    pub(crate) fn clip_consuming(
        &self,
        per_sample: Vec<(Tensor, PerSample)>,
        squared: &[Tensor],
    ) -> Clipped {
        self.clip_each(per_sample.into_iter().map(|(_, r)| r), squared, None)
    }

    fn clip_each<R: std::borrow::Borrow<PerSample>>(
        &self,
        per_sample: impl Iterator<Item = R>,
        squared: &[Tensor],
        scale: Option<f64>,
    ) -> Clipped {
        let scaled: Vec<Tensor>;
        let squared = match scale {
            Some(b) => {
                scaled = squared.iter().map(|s| s * (b * b)).collect();
                &scaled[..]
            }
            None => squared,
        };
        let (factors, norms) = self.factors(squared);
        let sums = per_sample
            .zip(&factors)
            .map(|(r, c)| match scale {
                Some(b) => r.borrow().weighted_sum(&(c * b)),
                None => r.borrow().weighted_sum(c),
            })
            .collect();
        let any = Tensor::stack(&factors.iter().map(|f| f.lt(1.0)).collect::<Vec<_>>(), 0)
            .any_dim(0, false);
        Clipped {
            sums,
            norms,
            clipped: any.sum(Kind::Int64),
        }
    }

    /// Each parameter's clip factors \[B\] from each parameter's per-sample squared norms \[B\]
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
        let factors = match (self.rule, self.radius) {
            (Clipping::Adaptive(_), Some(radius)) => {
                // `factor`'s min(1, C / (norm + 1e-6)) with C a tensor: tch forms c / x as
                // (x / c)^-1, so this is the same arithmetic, value for value.
                let f = ((&total + 1e-6) / radius)
                    .pow_tensor_scalar(-1)
                    .clamp_max(1.0);
                squared.iter().map(|_| f.shallow_clone()).collect()
            }
            (Clipping::Flat { max_norm: c }, _)
            | (Clipping::Adaptive(AdaptiveClipping { radius: c, .. }), None) => {
                let f = factor(&total, *c);
                squared.iter().map(|_| f.shallow_clone()).collect()
            }
            (Clipping::PerLayer { max_norms }, _) => squared
                .iter()
                .zip(max_norms)
                .map(|(s, c)| factor(&s.sqrt(), *c))
                .collect(),
        };
        (factors, total)
    }
}

/// A batch's clipped sums: one physical batch from `clip`, or a whole logical batch after
/// `add`ing its chunks, which is what `privatize` takes.
pub struct Clipped {
    /// Σ_i c_i g_i per parameter, in the order of the parameters.
    pub sums: Vec<Tensor>,
    /// ||g_i|| over all parameters before clipping, \[B\] (concatenated over chunks).
    pub norms: Tensor,
    /// Examples with any factor below 1 (0-d int64 on the device).
    pub clipped: Tensor,
}

impl Clipped {
    /// Nothing summed yet: zero sums shaped like `parameters`.
    pub fn empty(parameters: &[Tensor]) -> Self {
        let device = parameters.first().map_or(tch::Device::Cpu, |p| p.device());
        Clipped {
            sums: parameters.iter().map(|p| p.zeros_like().detach()).collect(),
            norms: Tensor::zeros([0], (Kind::Float, device)),
            clipped: Tensor::zeros([], (Kind::Int64, device)),
        }
    }

    /// B, the examples summed (one norm each).
    pub fn examples(&self) -> i64 {
        self.norms.size()[0]
    }

    /// Adds another chunk of the same logical batch.
    pub fn add(&mut self, chunk: Clipped) {
        for (sum, part) in self.sums.iter_mut().zip(chunk.sums) {
            *sum += part;
        }
        self.norms = Tensor::cat(&[&self.norms, &chunk.norms.to_kind(self.norms.kind())], 0);
        self.clipped += chunk.clipped;
    }
}

/// The DP-SGD engine (module docs). Built by `PrivacyEngine::builder()`, in named settings.
///
/// Two examples' gradients of one parameter, of norms 5 and 0.5, clipped at C = 1 and averaged
/// over the expected batch of 2. Without noise (σ 0) the result is the arithmetic alone:
/// ((3, 4) / 5 + (0.3, 0.4)) / 2 = (0.45, 0.6). At σ 1 the engine counts each step in its
/// accountant, and its ε is the accountant's for those steps.
///
/// ```
/// use dpcomp::prelude::*;
/// use dpcomp::privacy::{accountant::Accountant, AccountantKind};
/// use tch::{Device, Kind, Tensor};
/// let params = [Tensor::zeros([2], (Kind::Float, Device::Cpu))];
/// let gradients = || Tensor::from_slice(&[3.0f32, 4.0, 0.3, 0.4]).view([2, 2]); // [B, 2]
/// let per_sample = || [(params[0].shallow_clone(), PerSample::Direct(gradients()))];
/// let engine = |sigma: f64| {
///     PrivacyEngine::builder()
///         .noise_multiplier(sigma)
///         .max_grad_norm(1.0)
///         .dataset_size(100)
///         .expected_batch_size(2.0)
///         .delta(1e-5)
///         .build(&params)
/// };
///
/// let mut exact = engine(0.0)?;
/// let clipped = exact.clip(&per_sample());
/// assert_eq!(clipped.examples(), 2);
/// assert_eq!(dpcomp::host::i64_scalar(&clipped.clipped), 1); // the first example only
/// let mean = exact.privatize(&clipped)?;
/// assert!(mean[0].allclose(&Tensor::from_slice(&[0.45f32, 0.6]), 1e-5, 1e-6, false));
///
/// let mut private = engine(1.0)?;
/// for _ in 0..50 {
///     let clipped = private.clip(&per_sample());
///     private.privatize(&clipped)?;
/// }
/// let mut accountant = Accountant::default();
/// accountant.step(1.0, 0.02, 50)?; // q = 2 / 100
/// // The engine's accountant is the default one, PLD (the tight one).
/// assert_eq!(private.epsilon()?, accountant.epsilon(AccountantKind::Pld, 1e-5)?.0);
/// # Ok::<(), dpcomp::error::Error>(())
/// ```
pub struct PrivacyEngine {
    noise_multiplier: f64,
    sample_rate: f64,
    clipping: Clipping,
    /// Under adaptive clipping, C_t as a 0-d f64 tensor: on the CPU until the first step, then
    /// on the gradients' device, where each step updates it without a host read.
    /// `clipping`'s own radius stays the starting (or resumed) one; `clip_radius` reads this.
    adaptive_radius: Option<Tensor>,
    noise: NoiseSource,
    accountant: Accountant,
    /// The share of each step's noise variance this engine draws: 1 in one process; 1/W on
    /// each of W workers whose noised sums are added (`share_noise_among`).
    noise_share: f64,
    /// The accountant and δ `epsilon()` reports with.
    accountant_kind: AccountantKind,
    delta: f64,
    /// E[B] = qN, what `privatize` divides the noised sum by (in one process).
    expected_batch: f64,
    /// How many steps the engine may take (`None`: no limit set): the training's length, or
    /// fewer when a target ε given with σ stops it early.
    step_budget: Option<u64>,
    /// The target ε the budget was set from (`None`: a budget by length alone, or none).
    epsilon_budget: Option<f64>,
    /// How the losses `clip`'s per-sample gradients come from were reduced.
    loss_reduction: LossReduction,
}

impl PrivacyEngine {
    /// The settings of an engine, each by name (`PrivacyEngineBuilder`).
    ///
    /// ```
    /// use dpcomp::prelude::*;
    /// let params = [tch::Tensor::zeros([3, 2], (tch::Kind::Float, tch::Device::Cpu))];
    /// let mut engine = PrivacyEngine::builder()
    ///     .noise_multiplier(1.0)
    ///     .delta(1e-5)
    ///     .dataset_size(1_000)
    ///     .expected_batch_size(10.0)
    ///     .max_grad_norm(1.0)
    ///     .steps(1)
    ///     .build(&params)?;
    /// let clipped = Clipped::empty(&params);
    /// engine.privatize(&clipped)?; // noise, and one step counted
    /// assert_eq!(engine.steps_left(), Some(0));
    /// assert!(engine.privatize(&clipped).is_err()); // past the budget: refused, no noise drawn
    /// assert!(engine.epsilon()? > 0.0);
    /// # Ok::<(), dpcomp::error::Error>(())
    /// ```
    pub fn builder() -> super::builder::PrivacyEngineBuilder {
        super::builder::PrivacyEngineBuilder::default()
    }

    /// An engine for `parameters` trainable tensors at noise multiplier σ and sampling rate q,
    /// with an empty accountant; `set_reporting` completes it (the builder does both).
    pub(super) fn new(
        noise_multiplier: f64,
        sample_rate: f64,
        clipping: Clipping,
        noise: NoiseSource,
        parameters: usize,
    ) -> Result<Self> {
        super::validate(sample_rate, noise_multiplier, 1)?;
        if parameters == 0 {
            return Err(Error::bad_value(
                "parameters",
                "0: the model has no trainable variable, so there is nothing to clip or noise (build its layers on the VarStore the model trains, with gradients enabled)",
            ));
        }
        clipping.validate(parameters, noise_multiplier)?;
        if noise_multiplier > 0.0 && !clipping.sensitivity().is_finite() {
            return Err(Error::bad_value(
                "clipping radius",
                "infinite with noise: a private step needs a finite radius to scale the noise by",
            ));
        }
        let adaptive_radius = match &clipping {
            Clipping::Adaptive(a) => Some(Tensor::from(a.radius)),
            _ => None,
        };
        Ok(PrivacyEngine {
            noise_multiplier,
            sample_rate,
            clipping,
            adaptive_radius,
            noise,
            accountant: Accountant::default(),
            noise_share: 1.0,
            accountant_kind: AccountantKind::default(),
            delta: f64::NAN,
            expected_batch: f64::NAN,
            step_budget: None,
            epsilon_budget: None,
            loss_reduction: LossReduction::Sum,
        })
    }

    /// The accountant and δ of `epsilon()`, the divisor of `privatize` and the step budget.
    pub(super) fn set_reporting(
        &mut self,
        kind: AccountantKind,
        delta: f64,
        expected_batch: f64,
        step_budget: Option<u64>,
    ) {
        self.accountant_kind = kind;
        self.delta = delta;
        self.expected_batch = expected_batch;
        self.step_budget = step_budget;
    }

    /// The target ε the engine was built with (the builder's `target_epsilon`).
    pub(super) fn set_epsilon_budget(&mut self, target: Option<f64>) {
        self.epsilon_budget = target;
    }

    /// How the loss whose per-sample gradients `clip` takes was reduced (the builder's
    /// `loss_reduction`).
    pub(super) fn set_loss_reduction(&mut self, reduction: LossReduction) {
        self.loss_reduction = reduction;
    }

    /// How the loss whose per-sample gradients `clip` takes was reduced over the batch: `Sum`
    /// (the default) or `Mean` (see `LossReduction`).
    pub fn loss_reduction(&self) -> LossReduction {
        self.loss_reduction
    }

    /// Data-parallel training over `workers` ranks whose noised clipped sums are added: this
    /// engine draws N(0, σ²C²/W) per coordinate, independent of the other ranks' draws
    /// (each rank's own stream), so the sum of the W has exactly the single-process N(0, σ²C²)
    /// and the accountant, which counts every step at σ, is unchanged. A single rank's noised
    /// sum is then not private on its own (the README's threat model). Adaptive clipping is
    /// refused for W > 1: its noisy count and radius update would need the ranks' counts added
    /// first.
    pub fn share_noise_among(&mut self, workers: usize) -> Result<()> {
        if workers == 0 {
            return Err(Error::bad_value("workers", "0: expected at least one"));
        }
        if workers > 1 && matches!(self.clipping, Clipping::Adaptive(_)) {
            return Err(Error::bad_value(
                "privacy.clipping",
                format!("adaptive with {workers} workers: its noisy unclipped count would need every rank's count added first, which is not supported; use flat or per-layer clipping"),
            ));
        }
        self.noise_share = 1.0 / workers as f64;
        Ok(())
    }

    /// Continues from a checkpoint's accountant and, under adaptive clipping, its radius C_t.
    /// Every recorded block must be at this engine's σ and q (anything else would mix two
    /// mechanisms under one ε), and an adaptive run that has taken steps must have its radius.
    pub fn resume(&mut self, accountant: Accountant, clip_radius: Option<f64>) -> Result<()> {
        match (&mut self.clipping, clip_radius) {
            (Clipping::Adaptive(a), Some(r)) if r.is_finite() && r > 0.0 => {
                a.radius = r;
                self.adaptive_radius = Some(Tensor::from(r));
            }
            (Clipping::Adaptive(_), None) if accountant.steps() == 0 => {}
            (Clipping::Adaptive(_), r) => {
                return Err(Error::bad_value(
                    "clip_radius",
                    format!("{r:?}: an adaptive-clipping run that has taken {} steps needs its current positive radius to continue", accountant.steps()),
                ))
            }
            (_, Some(r)) => {
                return Err(Error::bad_value(
                    "clip_radius",
                    format!("{r}: the checkpoint has an adaptive radius but this run clips {}", self.clipping.label()),
                ))
            }
            (_, None) => {}
        }
        if let Some(budget) = self.step_budget.filter(|&b| accountant.steps() > b) {
            return Err(Error::bad_value(
                "accountant",
                format!(
                    "the checkpoint's accountant has taken {} steps, more than this engine's budget of {budget}",
                    accountant.steps()
                ),
            ));
        }
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

    /// σ, the noise multiplier the accountant records each step at (given, or calibrated from
    /// a target ε by the builder).
    pub fn noise_multiplier(&self) -> f64 {
        self.noise_multiplier
    }

    /// q, the probability that an example is in a step's batch (`E[B]` / N under Poisson
    /// sampling).
    pub fn sample_rate(&self) -> f64 {
        self.sample_rate
    }

    /// The steps of one epoch at this engine's q, ⌈1/q⌉: what `epochs(e)` budgets e times, and
    /// the count a loop of one's own draws Poisson batches for
    /// (`poisson_batches(n, engine.sample_rate(), engine.steps_per_epoch())`).
    pub fn steps_per_epoch(&self) -> u64 {
        super::builder::steps_per_epoch(self.sample_rate)
    }

    /// The clipping rule as the next step applies it: with the adaptive radius as it stands
    /// now, a tensor that clipping reads without a host read (`StepClipping::rule` is the rule
    /// as configured).
    pub fn clipping(&self) -> StepClipping<'_> {
        StepClipping {
            rule: &self.clipping,
            radius: self.adaptive_radius.as_ref(),
        }
    }

    /// The multiplier of the gradient's noise: σ, or under adaptive clipping σ_Δ =
    /// (σ^-2 - (2σ_b)^-2)^-1/2, which with the count's noise composes to σ (Andrew et al. 2021,
    /// Theorem 1).
    pub fn gradient_noise_multiplier(&self) -> f64 {
        let sigma = self.noise_multiplier;
        match &self.clipping {
            Clipping::Adaptive(a) if sigma > 0.0 => {
                (sigma.powi(-2) - (2.0 * a.count_noise).powi(-2)).powf(-0.5)
            }
            _ => sigma,
        }
    }

    /// The standard deviation of the noise this engine adds to a clipped sum: σ (σ_Δ under
    /// adaptive clipping) x sensitivity, x sqrt(1/W) on each of W workers
    /// (`share_noise_among`).
    pub fn noise_std(&self) -> f64 {
        let sensitivity = self
            .clip_radius()
            .unwrap_or_else(|| self.clipping.sensitivity());
        self.gradient_noise_multiplier() * sensitivity * self.noise_share.sqrt()
    }

    /// The adaptive radius C_t the next step clips at (`None` for fixed radii): a host read of
    /// the radius the steps keep on the device, for the epoch's results and checkpoints.
    pub fn clip_radius(&self) -> Option<f64> {
        self.adaptive_radius.as_ref().map(crate::host::f64_scalar)
    }

    /// "seeded" or "secure".
    pub fn noise_label(&self) -> &'static str {
        self.noise.label()
    }

    /// The steps recorded so far: what a checkpoint saves and [`resume`](Self::resume) takes
    /// back.
    pub fn accountant(&self) -> &Accountant {
        &self.accountant
    }

    /// ε after the steps taken so far, with the engine's accountant at its δ.
    pub fn epsilon(&self) -> Result<f64> {
        self.epsilon_at(self.accountant_kind, self.delta)
    }

    /// ε after the steps taken so far with another accountant or at another δ.
    pub fn epsilon_at(&self, kind: AccountantKind, delta: f64) -> Result<f64> {
        Ok(self.accountant.epsilon(kind, delta)?.0)
    }

    /// δ of the guarantee `epsilon()` reports.
    pub fn delta(&self) -> f64 {
        self.delta
    }

    /// The accountant `epsilon()` reports with.
    pub fn accountant_kind(&self) -> AccountantKind {
        self.accountant_kind
    }

    /// E\[B\] = qN, what `privatize` divides the noised sum by.
    pub fn expected_batch_size(&self) -> f64 {
        self.expected_batch
    }

    /// Steps the budget still allows (`None` when the engine was built without `epochs` or
    /// `steps`): the training's length less the steps taken, or, when the engine was built with
    /// both σ and a target ε, the most steps whose ε stays within the target (a loop of one's own
    /// stops when it reaches 0; `privatize` refuses a step beyond it).
    pub fn steps_left(&self) -> Option<u64> {
        self.step_budget
            .map(|b| b.saturating_sub(self.accountant.steps()))
    }

    /// The target ε the engine was built with (`None` without one).
    pub fn target_epsilon(&self) -> Option<f64> {
        self.epsilon_budget
    }

    /// ε after one more step at this engine's σ and q: what a training stopped by its target ε
    /// would have spent (`Trainer`'s stop message says it).
    pub fn epsilon_after_next_step(&self) -> Result<f64> {
        let mut next = self.accountant.clone();
        next.step(self.noise_multiplier, self.sample_rate, 1)?;
        Ok(next.epsilon(self.accountant_kind, self.delta)?.0)
    }

    /// Clips `per_sample` (in the order of the parameters) and sums each parameter's clipped
    /// gradients. A logical batch in several chunks is clipped chunk by chunk and its sums added
    /// before `privatize`. Under `LossReduction::Mean` the per-sample gradients are those of the
    /// batch's mean loss, and each is multiplied by the batch's B (the rows of its recipes)
    /// before clipping, so the result is the same as for the summed loss.
    pub fn clip(&self, per_sample: &[(Tensor, PerSample)]) -> Clipped {
        match self.loss_reduction {
            LossReduction::Sum => self.clipping().clip(per_sample),
            LossReduction::Mean => {
                let squared: Vec<Tensor> =
                    per_sample.iter().map(|(_, r)| r.squared_norms()).collect();
                let examples = squared.first().map_or(0, |s| s.size()[0]);
                self.clipping()
                    .clip_scaled(per_sample, &squared, Some(examples as f64))
            }
        }
    }

    /// Clips one example's whole update, a single tensor of any shape (a federated client's
    /// message under client-level DP: the "example" is a client): `clip` on one example. An
    /// update with any non-finite value (a diverged client) contributes zeros and counts as
    /// clipped, so it can neither poison the sum nor exceed the radius. No host read.
    pub fn clip_update(&self, update: &Tensor) -> Clipped {
        let finite = update.isfinite().all();
        let safe = update.where_self(&finite, &update.zeros_like());
        let direct = PerSample::Direct(safe.unsqueeze(0));
        let mut clipped = self.clipping().clip(&[(safe, direct)]);
        clipped.norms = update.norm().reshape([1]).to_kind(clipped.norms.kind());
        clipped.clipped += finite.logical_not().to_kind(Kind::Int64);
        clipped
    }

    /// Draws and drops the noise of `steps` past `privatize` calls on sums shaped like `like`,
    /// so a `Seeded` source (LibTorch's generator, whose state tch cannot save) stands where it
    /// stood after them: how a resumed federated run continues the uninterrupted run's noise
    /// (`fl::checkpoint`). Each call draws what `privatize` draws: one normal per sum while σ is
    /// positive, one more for an adaptive radius's noisy count. A `Secure` source is left as it
    /// is: its stream is never replayed, by design. Nothing is counted in the accountant.
    pub fn replay_noise(&mut self, like: &[Tensor], steps: u64) {
        if matches!(self.noise, NoiseSource::Secure(_)) {
            return;
        }
        let sigma = self.gradient_noise_multiplier() * self.noise_share.sqrt();
        let count_noise = match &self.clipping {
            Clipping::Adaptive(a) => a.count_noise,
            _ => 0.0,
        };
        tch::no_grad(|| {
            for _ in 0..steps {
                if sigma > 0.0 {
                    for t in like {
                        let _ = self.noise.standard_normal_like(t);
                    }
                }
                if count_noise > 0.0 {
                    let _ = self.noise.standard_normal_like(&Tensor::zeros(
                        [1],
                        (Kind::Double, tch::Device::Cpu),
                    ));
                }
            }
        });
    }

    /// The noised mean gradient of one logical batch from its clipped sums: each sum plus
    /// N(0, (σ sensitivity)²) per coordinate, divided by the expected batch E\[B\] = qN (never
    /// the realised size; E\[B\]/W on each of W workers, whose results are averaged). The step is
    /// counted in the accountant first; if it cannot be (past the step budget, σ or q invalid),
    /// no noise is drawn and nothing is returned. Under adaptive clipping the gradient is noised
    /// at σ_Δ, and the noisy unclipped fraction then moves the radius for the next step (module
    /// docs).
    pub fn privatize(&mut self, batch: &Clipped) -> Result<Vec<Tensor>> {
        let divisor = self.expected_batch * self.noise_share;
        self.privatize_dividing_by(batch, divisor)
    }

    /// `privatize` with another divisor: the trainer's shuffled batches divide by their fixed
    /// size, which is public.
    pub(crate) fn privatize_dividing_by(
        &mut self,
        batch: &Clipped,
        expected_batch: f64,
    ) -> Result<Vec<Tensor>> {
        if let Some(budget) = self.step_budget.filter(|&b| self.accountant.steps() >= b) {
            return Err(Error::bad_value(
                "privatize",
                format!(
                    "the engine's budget of {budget} steps is spent (epsilon {:.4} at delta {}); build an engine with more epochs or steps",
                    self.epsilon().unwrap_or(f64::NAN),
                    self.delta
                ),
            ));
        }
        self.accountant
            .step(self.noise_multiplier, self.sample_rate, 1)?;
        let (sigma, sensitivity) = (
            self.gradient_noise_multiplier() * self.noise_share.sqrt(),
            self.clipping.sensitivity(),
        );
        let radius = self.adaptive_radius.as_ref();
        let grads = tch::no_grad(|| {
            batch
                .sums
                .iter()
                .map(|s| match radius {
                    // C_t scales the noise where it lives (no host read).
                    Some(c) => noisy_mean_at(s, sigma, c, expected_batch, &mut self.noise),
                    None => noisy_mean(s, sigma, sensitivity, expected_batch, &mut self.noise),
                })
                .collect()
        });
        if let (Clipping::Adaptive(a), Some(radius)) = (&self.clipping, &self.adaptive_radius) {
            // b̃ = (unclipped - B/2 + N(0, σ_b²)) / E[B] + 1/2 and the geometric update, on the
            // device: the count stays where the step made it (module docs).
            let next = tch::no_grad(|| {
                let examples = batch.examples() as f64;
                let unclipped = examples - batch.clipped.to_kind(Kind::Double);
                let centred = unclipped - examples / 2.0;
                let noised = if a.count_noise > 0.0 {
                    // Drawn on the CPU as before; a 0-d CPU tensor joins device arithmetic as
                    // a scalar, without a copy or a wait.
                    let z = self
                        .noise
                        .standard_normal_like(&Tensor::zeros([1], (Kind::Double, Device::Cpu)));
                    centred + z.reshape([]) * a.count_noise
                } else {
                    centred
                };
                a.updated(radius, &(noised / expected_batch + 0.5))
            });
            self.adaptive_radius = Some(next);
        }
        Ok(grads)
    }
}
