//! Bounds that check an answer of the PLD accountant (`pld.rs`) before it is reported.
//!
//! The PLD accountant composes a discretised loss distribution numerically (FFT, exponential
//! tilts, a grid coarsened to fit memory). Its discretisation is pessimistic, so wherever the
//! numerics hold its ε is an upper bound; where they do not (losses in the 10^17 for σ 10^-9,
//! 10^12 compositions) they can silently lose the mass that makes δ, and ε comes out far too
//! small, even 0. A privacy accountant must never do that, so every PLD answer is checked
//! against two bounds computed without the FFT:
//!
//! - **lower bounds** the true ε can never be under: the exact ε of the first step alone
//!   (running more steps after it only adds to what an observer sees), and a moment bound on
//!   the composed loss (Cantelli's inequality, `moment_lower_bound`), which for long runs is
//!   within a few standard deviations of the truth;
//! - the **RDP bound** (Mironov 2017; Balle et al. 2020, Theorem 21), an upper bound at every
//!   input.
//!
//! An answer below a lower bound is a numerical failure and is replaced by the RDP bound; an
//! answer above the RDP bound (a coarsened grid) is replaced by it too, since both are upper
//! bounds and the smaller one holds.

use super::history::StepBlock;
use super::pld::{one_step_delta, remove_loss, Adjacency};
use super::rdp;

/// Standard deviations of each Gaussian the moment quadrature covers (the mass beyond,
/// Φ(−12) ≈ 2e-33, is far below the tolerances used).
const QUADRATURE_Z: f64 = 12.0;
/// Points of the quadrature over [−`QUADRATURE_Z`, `QUADRATURE_Z`] (spacing 0.002 standard
/// deviations: the loss's steepest bend, about σ wide in these units, is resolved for σ ≥ 0.01,
/// and for smaller σ the loss is linear over the range).
const QUADRATURE_POINTS: usize = 12_001;

/// E[f(μ + σZ)] for Z ~ N(0, 1), by the trapezoid rule on a uniform grid (which converges
/// faster than any power of the spacing for smooth integrands under a Gaussian weight).
fn gaussian_expectation(mu: f64, sigma: f64, f: impl Fn(f64) -> f64) -> f64 {
    let step = 2.0 * QUADRATURE_Z / (QUADRATURE_POINTS - 1) as f64;
    let norm = step / (2.0 * std::f64::consts::PI).sqrt();
    (0..QUADRATURE_POINTS)
        .map(|i| {
            let z = -QUADRATURE_Z + i as f64 * step;
            let weight = if i == 0 || i == QUADRATURE_POINTS - 1 {
                0.5
            } else {
                1.0
            };
            weight * norm * (-0.5 * z * z).exp() * f(mu + sigma * z)
        })
        .sum()
}

/// Mean and variance of one step's privacy loss under P (the distribution the loss is drawn
/// from; see `pld.rs`): X ~ (1 − q) N(0, σ²) + q N(1, σ²) and loss L(X) for `Remove`,
/// X ~ N(0, σ²) and loss −L(X) for `Add`. The mean is the KL divergence of the pair (≥ 0).
pub fn loss_moments(q: f64, sigma: f64, adjacency: Adjacency) -> (f64, f64) {
    let loss = |x: f64| match adjacency {
        Adjacency::Remove => remove_loss(q, sigma, x),
        Adjacency::Add => -remove_loss(q, sigma, x),
    };
    let expectation = |f: &dyn Fn(f64) -> f64| match adjacency {
        Adjacency::Remove => {
            (1.0 - q) * gaussian_expectation(0.0, sigma, f)
                + q * gaussian_expectation(1.0, sigma, f)
        }
        Adjacency::Add => gaussian_expectation(0.0, sigma, f),
    };
    let mean = expectation(&loss);
    // Two passes: E[(L − m)²] keeps the variance exact where it is tiny next to m².
    let variance = expectation(&|x: f64| (loss(x) - mean).powi(2));
    (mean, variance)
}

/// A lower bound on ε(δ) of a history from the composed loss's moments: with S the total loss
/// (mean m, variance s²), Cantelli's inequality gives P[S > m − a] ≥ a² / (s² + a²), and
/// δ(ε) = E[(1 − e^{ε − S})₊] ≥ (1 − e^{−b}) P[S > ε + b]. With b = ln 2 and a chosen so that
/// a² / (s² + a²) = 2δ, δ(m − a − ln 2) ≥ δ, so the true ε is at least m − a − ln 2. For long
/// runs m grows like T and a like √T: the bound is then close to the truth. The quadrature's
/// moments are given a relative margin of 1e-6 (mean) and 1e-3 (variance) on the safe side.
pub fn moment_lower_bound(blocks: &[StepBlock], adjacency: Adjacency, delta: f64) -> f64 {
    let target = 2.0 * delta * (1.0 + 1e-9);
    if target >= 1.0 {
        return 0.0;
    }
    let (mut mean, mut variance) = (0.0, 0.0);
    for b in blocks {
        let (m, v) = loss_moments(b.sample_rate, b.noise_multiplier, adjacency);
        let t = b.steps as f64;
        mean += t * (m - 1e-6 * m.abs());
        variance += t * v * (1.0 + 1e-3);
    }
    let a = variance.sqrt() * (target / (1.0 - target)).sqrt();
    (mean - a - std::f64::consts::LN_2).max(0.0)
}

/// A lower bound on the exact ε(δ) of one step at (q, σ): the largest ε found with
/// δ(ε) > `delta` (to 1e-9 relative), from the exact hockey-stick divergence of the pair.
pub fn one_step_lower_bound(q: f64, sigma: f64, adjacency: Adjacency, delta: f64) -> f64 {
    let over = |e: f64| one_step_delta(q, sigma, adjacency, e) > delta;
    if !over(0.0) {
        return 0.0;
    }
    let mut hi = 1.0;
    while over(hi) {
        hi *= 2.0;
        if !hi.is_finite() {
            return f64::MAX;
        }
    }
    let mut lo = 0.0; // over(lo), !over(hi)
    while hi - lo > 1e-9 * hi.max(1.0) {
        let mid = 0.5 * (lo + hi);
        if over(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The largest lower bound on the true ε(δ) of `blocks` (add-or-remove adjacency): every
/// block's first step alone and the moment bound, in both directions. σ > 0 in every block.
pub fn lower_bound(blocks: &[StepBlock], delta: f64) -> f64 {
    let mut best = 0.0f64;
    for adjacency in [Adjacency::Remove, Adjacency::Add] {
        best = best.max(moment_lower_bound(blocks, adjacency, delta));
        for b in blocks {
            best = best.max(one_step_lower_bound(
                b.sample_rate,
                b.noise_multiplier,
                adjacency,
                delta,
            ));
        }
    }
    best
}

/// The RDP accountant's ε(δ) of `blocks` at Opacus's orders: an upper bound at every input.
pub fn rdp_upper_bound(blocks: &[StepBlock], delta: f64) -> f64 {
    let orders = rdp::default_orders();
    let total: Vec<f64> = orders
        .iter()
        .map(|&alpha| {
            blocks
                .iter()
                .map(|b| {
                    b.steps as f64 * rdp::rdp_one_step(b.sample_rate, b.noise_multiplier, alpha)
                })
                .sum()
        })
        .collect();
    rdp::epsilon_from_rdp(&orders, &total, delta).0
}
