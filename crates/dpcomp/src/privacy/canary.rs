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
    ///
    /// A Dirac canary's gradient is C (as f32) at one coordinate: its squared norm in the
    /// parameter holding that coordinate is C², 0 in the others, taken without forming the
    /// m x P rows (memory O(m + P), not O(m P)). Dense canaries square their rows.
    fn norms_after(&self, clipping: &Clipping) -> Tensor {
        let all: Vec<i64> = (0..self.settings.canaries as i64).collect();
        let squared: Vec<Tensor> = match &self.directions {
            Directions::Dirac(coordinates) => {
                let value = self.norm as f32 as f64;
                let mut squared = vec![vec![0f64; coordinates.len()]; self.numels.len()];
                for (i, &c) in coordinates.iter().enumerate() {
                    let (layer, _) = self.locate(c);
                    squared[layer][i] = value * value;
                }
                squared.iter().map(|s| Tensor::from_slice(s)).collect()
            }
            Directions::Dense(_) => self
                .rows(&all, Device::Cpu)
                .iter()
                .map(|r| {
                    r.to_kind(Kind::Double)
                        .square()
                        .flatten(1, -1)
                        .sum_dim_intlist(1, false, Kind::Double)
                })
                .collect(),
        };
        let (factors, _) = clipping.factors(&squared);
        let mut total = Tensor::zeros([all.len() as i64], (Kind::Double, Device::Cpu));
        for (f, s) in factors.iter().zip(&squared) {
            total += f.square() * s;
        }
        total.sqrt()
    }

    /// The parameter holding flat coordinate `c`, and `c`'s index inside it.
    fn locate(&self, c: i64) -> (usize, i64) {
        let mut offset = 0;
        for (layer, &n) in self.numels.iter().enumerate() {
            if c < offset + n {
                return (layer, c - offset);
            }
            offset += n;
        }
        unreachable!("a Dirac coordinate lies inside the parameters")
    }

    /// The per-sample gradients of the canaries `which` as the engine clips them, one entry
    /// per parameter: dense canaries as their rows [k, ...shape]; Dirac canaries as
    /// `DiracRows`, which never form the k x P rows.
    fn per_sample(&self, which: &[i64], params: &[Tensor]) -> Vec<(Tensor, PerSample)> {
        let device = params.first().map_or(Device::Cpu, Tensor::device);
        match &self.directions {
            Directions::Dense(_) => params
                .iter()
                .zip(self.rows(which, device))
                .map(|(p, rows)| (p.shallow_clone(), PerSample::Direct(rows.to_kind(p.kind()))))
                .collect(),
            Directions::Dirac(coordinates) => {
                let mut owners = vec![Vec::new(); params.len()];
                let mut local = vec![Vec::new(); params.len()];
                for (row, &i) in which.iter().enumerate() {
                    let (layer, at) = self.locate(coordinates[i as usize]);
                    owners[layer].push(row as i64);
                    local[layer].push(at);
                }
                params
                    .iter()
                    .zip(owners.into_iter().zip(local))
                    .map(|(p, (owners, local))| {
                        let rows = DiracRows {
                            rows: which.len() as i64,
                            owners: crate::host::upload(&Tensor::from_slice(&owners), device),
                            local: crate::host::upload(&Tensor::from_slice(&local), device),
                            value: self.norm as f32,
                            shape: p.size(),
                            kind: p.kind(),
                            device,
                        };
                        (p.shallow_clone(), PerSample::Custom(Box::new(rows)))
                    })
                    .collect()
            }
        }
    }

    /// The gradients C u_i of the canaries `which`, split per parameter: [k, ...shape] each
    /// (k x P values: dense canaries, and one Dirac canary's gradient at a time).
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
        logical.add(clipping.into().clip(&self.per_sample(&sampled, params)));
    }

    /// Canary `i`'s gradient C u_i over the parameters concatenated in order, \[P\] on `device`
    /// (a federated canary client's update, `fl::FederatedRunBuilder::canaries`).
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

/// Dense canaries keep [m, P] floats: at most this many (2 GiB of f32). Dirac canaries keep
/// one coordinate each and have no such limit (memory O(m + P)).
pub const DENSE_LIMIT: i64 = 1 << 29;

/// The per-sample gradients of k Dirac canaries in one parameter: row r is `value` (C) at
/// local coordinate `local[j]` for `owners[j] = r`, zero elsewhere (and all zero for a canary
/// whose coordinate lies in another parameter). Its norms and weighted sum are computed from
/// those coordinates alone, with the arithmetic `PerSample::Direct` applies to the dense rows
/// (an f32 norm of each row, then c_r C at each canary's coordinate), so the clipped sum is
/// the one the dense rows give, value for value, in O(k + P) memory rather than O(k P).
struct DiracRows {
    /// k, the canaries.
    rows: i64,
    /// The rows whose coordinate lies in this parameter, [j] i64.
    owners: Tensor,
    /// Their coordinates inside the flattened parameter, [j] i64.
    local: Tensor,
    value: f32,
    shape: Vec<i64>,
    kind: Kind,
    device: Device,
}

impl crate::nn::PerSampleGradient for DiracRows {
    fn squared_norms(&self) -> Tensor {
        // Each row's one value (0 for the canaries of other parameters), normed as a row.
        let values = Tensor::zeros([self.rows, 1], (self.kind, self.device)).index_fill(
            0,
            &self.owners,
            self.value as f64,
        );
        values
            .norm_scalaropt_dim(2.0, [1i64].as_slice(), false)
            .square()
    }

    fn weighted_sum(&self, c: &Tensor) -> Tensor {
        let numel: i64 = self.shape.iter().product();
        let weighted = c.to_kind(self.kind).index_select(0, &self.owners) * self.value as f64;
        Tensor::zeros([numel], (self.kind, self.device))
            .index_copy(0, &self.local, &weighted)
            .view(self.shape.as_slice())
    }

    fn materialize(&self) -> Tensor {
        let numel: i64 = self.shape.iter().product();
        let flat = &self.owners * numel + &self.local;
        let mut full = vec![self.rows];
        full.extend(&self.shape);
        Tensor::zeros([self.rows * numel], (self.kind, self.device))
            .index_fill(0, &flat, self.value as f64)
            .view(full.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three parameters of 12, 4 and 12 values (28 coordinates).
    fn params() -> Vec<Tensor> {
        [vec![3i64, 4], vec![4], vec![2, 3, 2]]
            .iter()
            .enumerate()
            .map(|(l, shape)| {
                let n: i64 = shape.iter().product();
                (Tensor::arange(n, (Kind::Float, Device::Cpu)) * 0.1 + l as f64)
                    .view(shape.as_slice())
            })
            .collect()
    }

    fn dirac(m: usize, params: &[Tensor], clipping: &Clipping, norm: f64) -> GradientCanaries {
        let settings = CanarySettings {
            canaries: m,
            dense: false,
            observe: Observe::EveryStep,
            seed: 7,
        };
        GradientCanaries::new(settings, params, clipping, norm, 0.5, (0.1, 0.0)).unwrap()
    }

    /// The oracle: Dirac canaries `which` as dense rows, [k, ...shape] f32 per parameter, C at
    /// the canary's coordinate: `rows`, what the audit formed before it gathered coordinates
    /// (still the path of one canary's `flat_gradient`).
    fn dense_rows(c: &GradientCanaries, which: &[i64]) -> Vec<Tensor> {
        assert!(
            matches!(c.directions, Directions::Dirac(_)),
            "Dirac canaries"
        );
        c.rows(which, Device::Cpu)
    }

    /// The oracle of `norms_after`: the dense rows squared in f64, clipped by the engine's
    /// factors.
    fn dense_norms_after(c: &GradientCanaries, clipping: &Clipping) -> Tensor {
        let all: Vec<i64> = (0..c.settings.canaries as i64).collect();
        let squared: Vec<Tensor> = dense_rows(c, &all)
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

    fn clippings() -> Vec<Clipping> {
        vec![
            Clipping::Flat { max_norm: 0.7 },
            Clipping::Flat { max_norm: 5.0 },
            Clipping::Flat {
                max_norm: f64::INFINITY,
            },
            Clipping::PerLayer {
                max_norms: vec![0.3, 2.5, 0.05],
            },
        ]
    }

    #[test]
    fn dirac_norms_after_clipping_equal_the_dense_rows_bit_for_bit() {
        let params = params();
        for clipping in clippings() {
            for norm in [2.0, 0.1, 1.0 / 3.0] {
                let c = dirac(20, &params, &clipping, norm);
                let want = dense_norms_after(&c, &clipping);
                assert!(
                    crate::host::equal(&c.clipped_norms, &want),
                    "{clipping:?} C {norm}: {:?} against {:?}",
                    crate::host::to_vec_f64(&c.clipped_norms),
                    crate::host::to_vec_f64(&want)
                );
            }
        }
    }

    #[test]
    fn dirac_clipped_sums_equal_the_dense_rows_bit_for_bit() {
        let params = params();
        for clipping in clippings() {
            for norm in [2.0, 0.1, 1.0 / 3.0] {
                let c = dirac(20, &params, &clipping, norm);
                for which in [
                    (0..20).collect::<Vec<i64>>(),
                    vec![3],
                    vec![0, 5, 11, 19],
                    vec![19, 2, 7],
                ] {
                    let got = clipping.clip(&c.per_sample(&which, &params));
                    let dense: Vec<(Tensor, PerSample)> = params
                        .iter()
                        .zip(dense_rows(&c, &which))
                        .map(|(p, r)| (p.shallow_clone(), PerSample::Direct(r)))
                        .collect();
                    let want = clipping.clip(&dense);
                    for (g, w) in got.sums.iter().zip(&want.sums) {
                        assert_eq!(g.size(), w.size());
                        assert!(crate::host::equal(g, w), "{clipping:?} C {norm} {which:?}");
                    }
                    assert!(crate::host::equal(&got.norms, &want.norms));
                    assert!(crate::host::equal(&got.clipped, &want.clipped));
                    // The rows themselves, for the oracles that materialise them.
                    for ((_, r), w) in c
                        .per_sample(&which, &params)
                        .iter()
                        .zip(dense_rows(&c, &which))
                    {
                        assert!(crate::host::equal(&r.materialize(), &w));
                    }
                }
            }
        }
    }

    /// 100,000 Dirac canaries over a million parameters: the dense rows would hold 10^11
    /// floats; gathered coordinates take a few megabytes, and every sampled canary lands at
    /// its coordinate clipped to the radius.
    #[test]
    fn many_dirac_canaries_over_many_parameters_form_no_dense_rows() {
        let params = vec![
            Tensor::zeros([600, 1000], (Kind::Float, Device::Cpu)),
            Tensor::zeros([400_000], (Kind::Float, Device::Cpu)),
        ];
        let clipping = Clipping::Flat { max_norm: 1.0 };
        let m = 100_000;
        let c = dirac(m, &params, &clipping, 2.0);
        let norms = crate::host::to_vec_f64(&c.clipped_norms).unwrap();
        assert!(
            norms.iter().all(|&n| (n - 1.0).abs() < 1e-5),
            "{:?}",
            &norms[..3]
        );
        let all: Vec<i64> = (0..m as i64).collect();
        let clipped = clipping.clip(&c.per_sample(&all, &params));
        let total: f64 = clipped
            .sums
            .iter()
            .map(|s| crate::host::f64_scalar(&s.sum(Kind::Double)))
            .sum();
        assert!((total - m as f64).abs() < 1.0, "{total}");
        let nonzero: i64 = clipped
            .sums
            .iter()
            .map(|s| crate::host::i64_scalar(&s.ne(0.0).sum(Kind::Int64)))
            .sum();
        assert_eq!(nonzero, m as i64);
        assert_eq!(crate::host::i64_scalar(&clipped.clipped), m as i64);
    }
}
