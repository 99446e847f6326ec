//! SGD for the convex losses as the paper runs it (Wang et al. 2022,
//! Algorithms 1 and 2): w_1 = 0; at step t an index i_t drawn uniformly from \[n\] with
//! replacement; w_{t+1} = Π(w_t - η (∇f(w_t; z_{i_t}) + b_t)) with Π the projection onto B(0, R)
//! when a radius is given (identity otherwise) and b_t ~ N(0, σ² I) under gradient perturbation
//! (zero otherwise); the output is the average of the iterates w_1..w_T.
//!
//! Algorithm 1 (output perturbation) adds its noise to that average once; Algorithm 2 (gradient
//! perturbation) adds it to every step's gradient; non-private SGD adds none. Every draw (indices
//! and noise) comes from one seeded generator, so a run is reproducible from its seed.

use super::loss::Loss;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};
use tch::{Kind, Tensor};

/// What SGD runs with.
#[derive(Debug, Clone, Copy)]
pub struct SgdSettings {
    /// T, the steps (one example drawn uniformly with replacement each).
    pub steps: u64,
    /// η, the constant step size.
    pub step_size: f64,
    /// R of the projection onto B(0, R); `None`: unconstrained.
    pub radius: Option<f64>,
    /// σ of the noise added to every step's gradient (0: none).
    pub gradient_noise: f64,
    /// Seed of the generator of the index and noise draws.
    pub seed: u64,
}

/// Runs SGD on (x [n, d], y \[n\]) and returns the average iterate (1/T) Σ_{t=1..T} w_t.
pub fn average_iterate(loss: Loss, x: &Tensor, y: &Tensor, settings: &SgdSettings) -> Tensor {
    average_iterates(loss, x, y, settings, &[settings.seed]).get(0)
}

/// SGD for several seeds at once, one row of a [S, d] weight matrix per seed (each seed's index
/// and noise draws come from its own generator, in the same order as a single run, so row s
/// equals `average_iterate` with seed s). Returns the average iterates, [S, d]; a row is NaN
/// where an iterate's norm overflowed f64 (a step size far too large), never a silent 0.
pub fn average_iterates(
    loss: Loss,
    x: &Tensor,
    y: &Tensor,
    settings: &SgdSettings,
    seeds: &[u64],
) -> Tensor {
    let n = x.size()[0] as usize;
    let d = x.size()[1];
    let s = seeds.len() as i64;
    let mut rngs: Vec<rand::rngs::StdRng> = seeds
        .iter()
        .map(|&seed| rand::rngs::StdRng::seed_from_u64(seed))
        .collect();
    let normal = Normal::new(0.0, 1.0).expect("unit normal");
    let mut w = Tensor::zeros([s, d], (Kind::Double, x.device()));
    let mut sum = w.zeros_like();
    let mut index = vec![0i64; seeds.len()];
    let mut noise = vec![0.0f64; seeds.len() * d as usize];
    for _ in 0..settings.steps {
        sum += &w;
        for (k, rng) in rngs.iter_mut().enumerate() {
            index[k] = rng.random_range(0..n) as i64;
            if settings.gradient_noise > 0.0 {
                for v in noise[k * d as usize..(k + 1) * d as usize].iter_mut() {
                    *v = normal.sample(rng) * settings.gradient_noise;
                }
            }
        }
        let rows = Tensor::from_slice(&index).to_device(x.device());
        let (xi, yi) = (x.index_select(0, &rows), y.index_select(0, &rows));
        let scores = (&xi * &w).sum_dim_intlist(1, false, Kind::Double);
        let mut g = xi * loss.slopes_from_scores(&scores, &yi).unsqueeze(1);
        if settings.gradient_noise > 0.0 {
            g += Tensor::from_slice(&noise)
                .view([s, d])
                .to_device(x.device());
        }
        w = &w - g * settings.step_size;
        if let Some(r) = settings.radius {
            let norms = w.norm_scalaropt_dim(2.0, [1i64].as_slice(), true);
            let factor = (r / norms.clamp_min(1e-300)).clamp_max(1.0);
            // A norm that overflowed (a step size too large for f64) would scale the iterate
            // to 0 and pass for a model: it becomes NaN instead, which the caller refuses.
            let factor = factor.where_self(&norms.isfinite(), &factor.full_like(f64::NAN));
            w = &w * factor;
        }
    }
    sum / settings.steps.max(1) as f64
}

/// Π onto B(0, r): w scaled down to norm r when it is longer.
pub fn project(w: &Tensor, r: f64) -> Tensor {
    let norm = dpcomp::host::f64_scalar(&w.norm());
    if norm > r {
        w * (r / norm)
    } else {
        w.shallow_clone()
    }
}

/// `w` plus N(0, σ² I) drawn from the generator seeded with `seed` (output perturbation).
pub fn perturb(w: &Tensor, sigma: f64, seed: u64) -> Tensor {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let normal = Normal::new(0.0, sigma.max(0.0)).expect("finite sigma");
    let noise: Vec<f64> = (0..w.numel()).map(|_| normal.sample(&mut rng)).collect();
    w + Tensor::from_slice(&noise).to_device(w.device())
}

/// min over B(0, R) (or R^d) of the empirical risk, approximately: full-batch (projected)
/// subgradient descent with step size `scale / sqrt(k)` for `iterations`, from 0 and from the
/// best of `starts` (projected onto the ball), keeping the best iterate. The reference the
/// excess risk is measured against, so it must be at least as good as every feasible model being
/// measured: starting from them guarantees that. The step scale is `step` capped at ten times the
/// largest start's norm (at least 1): with R = 1e30 a step of R / sqrt(k) jumps to risks of 1e30
/// and the "minimiser" stayed at 0, above the private models' risk (a negative excess risk).
pub fn empirical_minimiser(
    loss: Loss,
    x: &Tensor,
    y: &Tensor,
    radius: Option<f64>,
    iterations: usize,
    step: f64,
    starts: &[Tensor],
) -> (Tensor, f64) {
    let d = x.size()[1];
    let risk = |w: &Tensor| dpcomp::host::f64_scalar(&loss.values(w, x, y).mean(Kind::Double));
    let feasible = |w: &Tensor| match radius {
        Some(r) => project(&w.to_kind(Kind::Double), r),
        None => w.to_kind(Kind::Double),
    };
    let zero = Tensor::zeros([d], (Kind::Double, x.device()));
    let mut candidates = vec![zero];
    if let Some(best_start) = starts
        .iter()
        .map(feasible)
        .filter(|w| risk(w).is_finite())
        .min_by(|a, b| risk(a).total_cmp(&risk(b)))
    {
        candidates.push(best_start);
    }
    let largest = starts
        .iter()
        .map(|w| dpcomp::host::f64_scalar(&w.norm()))
        .filter(|n| n.is_finite())
        .fold(1.0f64, f64::max);
    let scale = step.min(10.0 * largest);
    let (mut best, mut best_risk) = (candidates[0].copy(), f64::INFINITY);
    for start in candidates {
        let mut w = start;
        let r = risk(&w);
        if r < best_risk {
            best = w.copy();
            best_risk = r;
        }
        for k in 1..=iterations {
            let g = loss.mean_gradient(&w, x, y);
            w = &w - g * (scale / (k as f64).sqrt());
            if let Some(r) = radius {
                w = project(&w, r);
            }
            let r = risk(&w);
            if r < best_risk {
                best = w.copy();
                best_risk = r;
            }
        }
    }
    (best, best_risk)
}
