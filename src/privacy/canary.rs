//! Canaries for the one-run audit (`privacy::audit`, Steinke, Nasr and Jagielski 2023) inside a
//! real training run: m canaries, each included independently with probability ½ (from a
//! generator of the audit's own, never LibTorch's), and after training a score per canary that
//! the auditor ranks to guess which were included.
//!
//! - `GradientCanaries` (white box): canary i is a gradient C u_i, u_i a unit vector over all the
//!   model's parameters (Dirac: one random coordinate; dense: a random Gaussian direction). In
//!   every step each included canary is Poisson-sampled at the run's rate q, like an example,
//!   and its gradient goes through the engine's clipping into the clipped sum before the noise
//!   (`dp_step`). Scored from the weights, as an auditor who sees them (`Observe`).
//! - Black-box canaries (mislabelled training examples, scored by the final model's loss) need a
//!   dataset and a model, so they live with the trainer: `train::input_canaries`.
//!
//! Any score gives a valid lower bound (the bound holds for every guessing rule fixed before
//! the run); a better score only makes the bound tighter.

use super::engine::{Clipped, Clipping, StepClipping};
use crate::error::{Error, Result};
use crate::nn::PerSample;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tch::{Device, Kind, Tensor};

/// What the auditor sees of a white-box run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum Observe {
    /// The weights after every step: each step's update is projected on every canary's
    /// direction (SGD momentum inverted, as an auditor who knows μ can), normalised so that a
    /// sampled canary adds 1, and the steps are combined by the log-likelihood ratio of "sampled
    /// at rate q" against "never", Σ_t ln(1 − q + q exp((y_t − ½) / s_t²)), where s_t is a
    /// robust estimate of that step's spread (1.4826 × the median absolute deviation of y_t
    /// over the canaries, most of which were not sampled in step t).
    EveryStep,
    /// The final weights only: the score is ⟨w_0 − w_T, u_i⟩.
    Final,
}

/// Settings of the canaries, fixed before the run (so the guesses they lead to are valid).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CanarySettings {
    /// m, the number of canaries (each included with probability ½).
    pub canaries: usize,
    /// Dense random directions instead of Dirac ones (white box).
    pub dense: bool,
    /// Which auditor's outcome an audit run reports (`dpcomp audit --observe`); the scores of
    /// both are kept.
    pub observe: Observe,
    /// Seeds the canaries' inclusion, directions and sampling (a generator of the audit's own).
    pub seed: u64,
}

/// Canary i's inclusion, drawn first from the audit's generator.
pub(crate) fn draw_included(rng: &mut StdRng, m: usize) -> Vec<bool> {
    (0..m).map(|_| rng.random::<bool>()).collect()
}

/// Where canary i lives in the model's parameters.
enum Directions {
    /// Flat coordinate of each canary in the parameters concatenated in order.
    Dirac(Vec<i64>),
    /// Unit rows [m, P] on the parameters' device.
    Dense(Tensor),
}

/// White-box gradient canaries in a model's training (see the module docs).
pub struct GradientCanaries {
    settings: CanarySettings,
    /// Whether canary i was drawn into the run, fixed at construction.
    pub included: Vec<bool>,
    directions: Directions,
    /// Numels of the parameters, in order (the flat layout).
    numels: Vec<i64>,
    shapes: Vec<Vec<i64>>,
    /// C: every canary gradient has this norm before clipping.
    norm: f64,
    /// Each canary's norm after the engine's clipping (its radius at the start), [m] f64.
    clipped_norms: Tensor,
    sample_rate: f64,
    rng: StdRng,
    /// ⟨w_0, u_i⟩.
    start: Tensor,
    /// Every step: ⟨w_t, u_i⟩ after the last step, the last step's recovered velocity, and the
    /// running log-likelihood-ratio scores.
    last: Tensor,
    velocity: Tensor,
    scores: Tensor,
    /// (lr, SGD momentum μ) of the optimiser, to turn weight moves into gradients: lr > 0 when
    /// the weights move against the gradient (SGD, w -= lr g), lr < 0 when the update is added
    /// (a federated server, w += η Δ: lr = −η).
    lr: f64,
    momentum: f64,
    /// How many of the canaries each step sampled, summed (a sanity figure for the report).
    pub samples: u64,
}

impl GradientCanaries {
    /// `m` canaries over `params` (the trainer's, in order) at norm `norm` (the clip radius),
    /// sampled at `sample_rate` each step; `lr` and `momentum` are the optimiser's (`lr`
    /// negative where updates are added to the weights, see the field).
    pub fn new(
        settings: CanarySettings,
        params: &[Tensor],
        clipping: &Clipping,
        norm: f64,
        sample_rate: f64,
        (lr, momentum): (f64, f64),
    ) -> Result<Self> {
        let m = settings.canaries;
        let numels: Vec<i64> = params.iter().map(|p| p.numel() as i64).collect();
        let total: i64 = numels.iter().sum();
        if m == 0 || (!settings.dense && m as i64 > total) {
            return Err(Error::bad_value(
                "canaries",
                format!("{m} for a model of {total} parameters: expected 0 < canaries <= parameters (one coordinate per Dirac canary)"),
            ));
        }
        if settings.dense && (m as i64).saturating_mul(total) > DENSE_LIMIT {
            return Err(Error::bad_value(
                "canaries",
                format!("{m} dense canaries over {total} parameters hold {} floats, above the {DENSE_LIMIT} this audit keeps in memory: use Dirac canaries or fewer", m as i64 * total),
            ));
        }
        if !(lr.is_finite() && lr != 0.0) {
            return Err(Error::bad_value(
                "lr",
                format!("{lr}: the audit turns weight moves into gradients by a finite, non-zero step size"),
            ));
        }
        if !(norm.is_finite() && norm > 0.0) {
            return Err(Error::bad_value(
                "max_grad_norm",
                format!("{norm}: a canary is a gradient of the clip norm C, which must be finite"),
            ));
        }
        let device = params.first().map_or(Device::Cpu, Tensor::device);
        let mut rng = StdRng::seed_from_u64(settings.seed);
        let included = draw_included(&mut rng, m);
        let directions = if settings.dense {
            let values: Vec<f32> = (0..m as i64 * total)
                .map(|_| rng.sample::<f32, _>(rand_distr::StandardNormal))
                .collect();
            let raw = Tensor::from_slice(&values).view([m as i64, total]);
            let unit = &raw / raw.norm_scalaropt_dim(2.0, [1i64].as_slice(), true);
            Directions::Dense(unit.to_device(device))
        } else {
            let chosen = rand::seq::index::sample(&mut rng, total as usize, m);
            Directions::Dirac(chosen.into_iter().map(|i| i as i64).collect())
        };
        let shapes = params.iter().map(Tensor::size).collect();
        let mut canaries = GradientCanaries {
            settings,
            included,
            directions,
            numels,
            shapes,
            norm,
            clipped_norms: Tensor::zeros([m as i64], (Kind::Double, Device::Cpu)),
            sample_rate,
            rng,
            start: Tensor::zeros([m as i64], (Kind::Double, device)),
            last: Tensor::zeros([m as i64], (Kind::Double, device)),
            velocity: Tensor::zeros([m as i64], (Kind::Double, device)),
            scores: Tensor::zeros([m as i64], (Kind::Double, device)),
            lr,
            momentum,
            samples: 0,
        };
        canaries.clipped_norms = canaries.norms_after(clipping).to_device(device);
        canaries.start = canaries.project(params);
        canaries.last = canaries.start.copy();
        Ok(canaries)
    }

    /// Each canary's norm after `clipping` (per-layer clipping cuts a Dirac canary to its
    /// layer's radius): √(Σ_l f_l² ||g_l||²) with the engine's own factors.
    fn norms_after(&self, clipping: &Clipping) -> Tensor {
        let all: Vec<i64> = (0..self.settings.canaries as i64).collect();
        let squared: Vec<Tensor> = self
            .rows(&all, Device::Cpu)
            .iter()
            .map(|r| {
                r.to_kind(Kind::Double)
                    .square()
                    .flatten(1, -1)
                    .sum_dim_intlist(1, false, Kind::Double)
            })
            .collect();
        let (factors, _) = clipping.factors(&squared);
        let mut total = Tensor::zeros([all.len() as i64], (Kind::Double, Device::Cpu));
        for (f, s) in factors.iter().zip(&squared) {
            total += f.square() * s;
        }
        total.sqrt()
    }

    /// The gradients C u_i of the canaries `which`, split per parameter: [k, ...shape] each.
    fn rows(&self, which: &[i64], device: Device) -> Vec<Tensor> {
        let k = which.len() as i64;
        match &self.directions {
            Directions::Dense(unit) => {
                let chosen = unit
                    .index_select(0, &Tensor::from_slice(which).to_device(unit.device()))
                    * self.norm;
                let mut offset = 0;
                self.numels
                    .iter()
                    .zip(&self.shapes)
                    .map(|(&n, shape)| {
                        let part = chosen.narrow(1, offset, n);
                        offset += n;
                        let mut full = vec![k];
                        full.extend(shape);
                        part.reshape(full.as_slice()).to_device(device)
                    })
                    .collect()
            }
            Directions::Dirac(coordinates) => {
                let mut offset = 0;
                self.numels
                    .iter()
                    .zip(&self.shapes)
                    .map(|(&n, shape)| {
                        let mut values = vec![0f32; (k * n) as usize];
                        for (row, &i) in which.iter().enumerate() {
                            let c = coordinates[i as usize];
                            if (offset..offset + n).contains(&c) {
                                values[row * n as usize + (c - offset) as usize] = self.norm as f32;
                            }
                        }
                        offset += n;
                        let mut full = vec![k];
                        full.extend(shape);
                        Tensor::from_slice(&values)
                            .reshape(full.as_slice())
                            .to_device(device)
                    })
                    .collect()
            }
        }
    }

    /// One step's (or round's) Poisson draw: the included canaries sampled at rate q.
    pub fn sample(&mut self) -> Vec<i64> {
        let sampled: Vec<i64> = (0..self.settings.canaries)
            .filter(|&i| self.included[i] && self.rng.random::<f64>() < self.sample_rate)
            .map(|i| i as i64)
            .collect();
        self.samples += sampled.len() as u64;
        sampled
    }

    /// One step's canaries: each included canary is sampled at rate q, and the sampled ones'
    /// gradients are clipped by `clipping` (the engine's) and added to `logical`, the step's
    /// clipped sum, before the engine noises it.
    pub fn inject<'a>(
        &mut self,
        logical: &mut Clipped,
        params: &[Tensor],
        clipping: impl Into<StepClipping<'a>>,
    ) {
        let sampled = self.sample();
        if sampled.is_empty() {
            return;
        }
        let device = params.first().map_or(Device::Cpu, Tensor::device);
        let per_sample: Vec<(Tensor, PerSample)> = params
            .iter()
            .zip(self.rows(&sampled, device))
            .map(|(p, rows)| (p.shallow_clone(), PerSample::Direct(rows.to_kind(p.kind()))))
            .collect();
        logical.add(clipping.into().clip(&per_sample));
    }

    /// Canary `i`'s gradient C u_i over the parameters concatenated in order, \[P\] on `device`
    /// (a federated canary client's update, `fl::run_with_canaries`).
    pub fn flat_gradient(&self, i: i64, device: Device) -> Tensor {
        Tensor::cat(
            &self
                .rows(&[i], device)
                .iter()
                .map(|r| r.reshape([-1]))
                .collect::<Vec<_>>(),
            0,
        )
    }

    /// ⟨w, u_i⟩ for every canary, [m] f64 on the weights' device.
    fn project(&self, params: &[Tensor]) -> Tensor {
        tch::no_grad(|| {
            let flat = Tensor::cat(
                &params
                    .iter()
                    .map(|p| p.detach().reshape([-1]).to_kind(Kind::Double))
                    .collect::<Vec<_>>(),
                0,
            );
            match &self.directions {
                Directions::Dirac(coordinates) => {
                    flat.index_select(0, &Tensor::from_slice(coordinates).to_device(flat.device()))
                }
                // The [m, P] directions stay f32 (no copy of them per step).
                Directions::Dense(unit) => {
                    unit.mv(&flat.to_kind(unit.kind())).to_kind(Kind::Double)
                }
            }
        })
    }

    /// After each step: scores the step's move of the weights for the every-step observation
    /// (kept whatever `settings.observe` says, so a run reports both), with `expected_batch`
    /// the divisor of the step's clipped sum.
    pub fn observe_step(&mut self, params: &[Tensor], expected_batch: f64) {
        let now = self.project(params);
        // v_t = (w_{t-1} - w_t) / lr; the gradient of the step g_t = v_t - μ v_{t-1}.
        let velocity = (&self.last - &now) / self.lr;
        let gradient = &velocity - &self.velocity * self.momentum;
        self.last = now;
        self.velocity = velocity;
        // In units of one sampled canary's contribution c_i / E[B].
        let y = gradient * expected_batch / &self.clipped_norms;
        let median = y.median();
        // On the weights' device throughout: no host read per step.
        let spread = ((&y - &median).abs().median() * 1.4826).clamp_min(1e-12);
        let q = self.sample_rate;
        let log_ratio = ((&y - 0.5) / spread.square() + q.ln()).logaddexp(&Tensor::full(
            [1],
            (1.0 - q).ln(),
            (Kind::Double, y.device()),
        ));
        self.scores += log_ratio;
    }

    /// Each canary's score as an auditor who sees `observe` scores it (`params`: the final
    /// weights): higher means "more likely included".
    pub fn scores(&self, observe: Observe, params: &[Tensor]) -> Vec<f64> {
        let scores = match observe {
            Observe::EveryStep => self.scores.copy(),
            Observe::Final => (&self.start - self.project(params)) * self.lr.signum(),
        };
        crate::host::to_vec_f64(&scores.to_device(Device::Cpu))
            .expect("canary scores are a 1-d f64 tensor")
    }

    /// The settings the canaries were drawn with.
    pub fn settings(&self) -> &CanarySettings {
        &self.settings
    }

    /// Both observations' scores from the final weights `params`, with what they are judged
    /// against.
    pub fn finish(&self, params: &[Tensor]) -> CanaryScores {
        CanaryScores {
            included: self.included.clone(),
            every_step: self.scores(Observe::EveryStep, params),
            final_weights: self.scores(Observe::Final, params),
            samples: self.samples,
        }
    }
}

/// A white-box run's canaries after training: which were included, each auditor's scores, and
/// how many times a canary was sampled.
#[derive(Debug, Clone)]
pub struct CanaryScores {
    /// Whether canary i was included (what the guesses are judged against).
    pub included: Vec<bool>,
    /// Canary i's score by the every-step auditor (higher: more likely included).
    pub every_step: Vec<f64>,
    /// Canary i's score by the final-weights auditor, ⟨w_0 − w_T, u_i⟩.
    pub final_weights: Vec<f64>,
    /// Canary gradients that joined a step, summed over the steps (one canary sampled in three
    /// steps counts three).
    pub samples: u64,
}

/// Dense canaries keep [m, P] floats: at most this many (2 GiB of f32).
pub const DENSE_LIMIT: i64 = 1 << 29;
