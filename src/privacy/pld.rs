//! A tight accountant: the privacy loss distribution (PLD) of the Poisson-subsampled Gaussian
//! mechanism, discretised pessimistically and composed numerically by FFT (Koskela, Jälkö and
//! Honkela 2020; Meiser and Mohammadi 2018; the method of Google's `dp_accounting` PLD
//! accountant, against whose values `tests/accountant.rs` checks it).
//!
//! For one step with sampling rate q and noise σ (sensitivity 1), under add-or-remove adjacency
//! there are two pairs of distributions; ε is the larger of the two:
//!
//! - remove: P = (1−q) N(0, σ²) + q N(1, σ²) against Q = N(0, σ²); loss
//!   L(x) = log(1 − q + q exp((2x − 1) / (2σ²))), x ~ P, increasing in x.
//! - add: P = N(0, σ²) against Q = (1−q) N(0, σ²) + q N(1, σ²); loss −L(x), x ~ N(0, σ²).
//!
//! Pessimistic discretisation ("connect the dots", see `one_step`): the discrete PLD dominates
//! the true one, so every δ(ε) computed from it is an upper bound. T steps compose by convolving
//! the pmf T times (one FFT, an elementwise power, one inverse FFT) on a window chosen by
//! Chernoff bounds; the mass the window can miss is added to the infinite-loss mass.
//! δ(ε) = Σ_y p(y) (1 − e^{ε − y})₊ + p(∞), and ε(δ) is found by bisection.

use super::accountant::StepBlock;
use super::{validate, validate_delta};
use crate::error::Result;
use tch::{Kind, Tensor};

/// Grid spacing of the loss values (dp_accounting's default).
pub const DEFAULT_INTERVAL: f64 = 1e-4;
/// Probability mass each truncation may drop (moved to infinite loss).
const TAIL_MASS: f64 = 1e-15;

fn normal_cdf(z: f64) -> f64 {
    0.5 * libm::erfc(-z / std::f64::consts::SQRT_2)
}

/// A loss distribution on the grid {k h : k_lo <= k < k_lo + pmf.len()} plus mass at +∞.
#[derive(Debug, Clone)]
pub struct DiscretePld {
    pub interval: f64,
    pub k_lo: i64,
    pub pmf: Vec<f64>,
    pub infinity: f64,
}

/// Which of the two pairs of distributions (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adjacency {
    Remove,
    Add,
}

fn normal_sf(z: f64) -> f64 {
    0.5 * libm::erfc(z / std::f64::consts::SQRT_2)
}

/// The hockey-stick divergence δ(ε) = P[L > ε] − e^ε Q[L > ε] of one step's pair.
pub fn one_step_delta(q: f64, sigma: f64, adjacency: Adjacency, epsilon: f64) -> f64 {
    let s2 = sigma * sigma;
    let x_of = |y: f64| s2 * ((y.exp() - (1.0 - q)) / q).ln() + 0.5;
    match adjacency {
        Adjacency::Remove => {
            if epsilon <= (1.0 - q).ln() {
                return 1.0 - epsilon.exp();
            }
            // L > ε  <=>  x > x(ε).
            let x = x_of(epsilon);
            let p = (1.0 - q) * normal_sf(x / sigma) + q * normal_sf((x - 1.0) / sigma);
            (p - epsilon.exp() * normal_sf(x / sigma)).max(0.0)
        }
        Adjacency::Add => {
            if epsilon >= -(1.0 - q).ln() {
                return 0.0;
            }
            // −L(x) > ε  <=>  x < x(−ε); P = N(0, σ²), Q the mixture.
            let x = x_of(-epsilon);
            let p = normal_cdf(x / sigma);
            let qm = (1.0 - q) * normal_cdf(x / sigma) + q * normal_cdf((x - 1.0) / sigma);
            (p - epsilon.exp() * qm).max(0.0)
        }
    }
}

/// One step's PLD discretised by "connect the dots" (Doroshenko, Ghazi, Kamath, Kumar and
/// Manurangsi 2022): the masses on the grid {k h} are chosen so that the discrete δ(ε) equals
/// the true one at every grid point. A discrete PLD's δ is linear in e^ε between grid points
/// and the true δ is convex in e^ε, so the discrete pair dominates the true one (its δ is an
/// upper bound everywhere) without the per-step rounding bias of rounding losses up, which
/// would add up to T h / 2 over T compositions.
///
/// With δ_i at y_i = k_i h: on [y_i, y_{i+1}] the discrete δ is A_i − B_i e^ε with
/// B_i = Σ_{j>i} p_j e^{−y_j} = (δ_i − δ_{i+1}) / (e^{y_{i+1}} − e^{y_i}), so
/// p_{i+1} = e^{y_{i+1}} (B_i − B_{i+1}) with B_m = 0 above the last point, p(∞) = δ_m, and the
/// lowest point takes the remaining mass.
pub fn one_step(q: f64, sigma: f64, adjacency: Adjacency, interval: f64) -> DiscretePld {
    let loss = |x: f64| (1.0 - q + q * ((2.0 * x - 1.0) / (2.0 * sigma * sigma)).exp()).ln();
    let z_tail = 8.5; // Φ(−8.5) ≈ 1e-17
    let (y_lo, y_hi) = match adjacency {
        Adjacency::Remove => ((1.0 - q).ln(), loss(1.0 + z_tail * sigma)),
        Adjacency::Add => (-loss(z_tail * sigma), -(1.0 - q).ln()),
    };
    let k_lo = (y_lo / interval).floor() as i64 - 1;
    let k_hi = (y_hi / interval).ceil() as i64 + 1;
    let ys: Vec<f64> = (k_lo..=k_hi).map(|k| k as f64 * interval).collect();
    let deltas: Vec<f64> = ys
        .iter()
        .map(|&y| one_step_delta(q, sigma, adjacency, y))
        .collect();
    let m = ys.len() - 1;
    // B_i for the segment [y_i, y_{i+1}], i = 0..m−1, and B_m = 0.
    let mut slopes: Vec<f64> = (0..m)
        .map(|i| ((deltas[i] - deltas[i + 1]) / (ys[i + 1].exp() - ys[i].exp())).max(0.0))
        .collect();
    slopes.push(0.0);
    let mut pmf = vec![0.0; m + 1];
    for i in 0..m {
        pmf[i + 1] = (ys[i + 1].exp() * (slopes[i] - slopes[i + 1])).max(0.0);
    }
    let infinity = deltas[m];
    let rest: f64 = pmf[1..].iter().sum::<f64>() + infinity;
    pmf[0] = (1.0 - rest).max(0.0);
    DiscretePld {
        interval,
        k_lo,
        pmf,
        infinity,
    }
}

impl DiscretePld {
    /// log E[exp(λ Y)] over the finite part.
    fn log_mgf(&self, lambda: f64) -> f64 {
        let mut max = f64::NEG_INFINITY;
        for (i, &p) in self.pmf.iter().enumerate() {
            if p > 0.0 {
                max = max.max(p.ln() + lambda * (self.k_lo + i as i64) as f64 * self.interval);
            }
        }
        let sum: f64 = self
            .pmf
            .iter()
            .enumerate()
            .filter(|(_, &p)| p > 0.0)
            .map(|(i, &p)| {
                (p.ln() + lambda * (self.k_lo + i as i64) as f64 * self.interval - max).exp()
            })
            .sum();
        max + sum.ln()
    }

    /// The T-fold composition.
    pub fn compose(&self, steps: u64) -> DiscretePld {
        let t = steps as f64;
        let h = self.interval;
        // Window [lo, hi] of the composed loss outside which at most TAIL_MASS lies on each
        // side (Chernoff: P(S >= s) <= exp(T log M(λ) − λ s)).
        let lambdas = [0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0];
        let bound = |sign: f64| {
            lambdas
                .iter()
                .map(|&l| (t * self.log_mgf(sign * l) - TAIL_MASS.ln()) / l)
                .fold(f64::INFINITY, f64::min)
        };
        let min_k = self.k_lo as f64 * t;
        let max_k = (self.k_lo + self.pmf.len() as i64 - 1) as f64 * t;
        let k_hi = ((bound(1.0) / h).ceil()).min(max_k) as i64;
        let k_lo = ((-bound(-1.0) / h).floor()).max(min_k) as i64;
        let width = (k_hi - k_lo + 1) as usize;
        let n = (width.max(self.pmf.len()) * 2).next_power_of_two() as i64;
        // Circular convolution: entry j of the per-step pmf sits at index j; the composed value
        // T k_lo + j sits at index j mod n.
        let pmf = Tensor::from_slice(&self.pmf);
        let spectrum = pmf.fft_rfft(n, 0, "backward");
        let composed = spectrum.pow_tensor_scalar(t).fft_irfft(n, 0, "backward");
        let composed: Vec<f64> =
            Vec::try_from(&composed.to_kind(Kind::Double)).expect("f64 tensor");
        let offset = self.k_lo * steps as i64;
        let mut out = Vec::with_capacity(width);
        for k in k_lo..=k_hi {
            let index = (k - offset).rem_euclid(n) as usize;
            out.push(composed[index].max(0.0));
        }
        let finite_survives = (1.0 - self.infinity).powf(t);
        DiscretePld {
            interval: h,
            k_lo,
            pmf: out,
            // Infinite loss in any step, plus what the window may have dropped on both sides.
            infinity: (1.0 - finite_survives + 2.0 * TAIL_MASS).min(1.0),
        }
    }

    /// The PLD of running `self` and then `other` (same grid spacing): their convolution.
    pub fn convolve(&self, other: &DiscretePld) -> DiscretePld {
        let len = self.pmf.len() + other.pmf.len() - 1;
        let n = len.next_power_of_two() as i64;
        let a = Tensor::from_slice(&self.pmf).fft_rfft(n, 0, "backward");
        let b = Tensor::from_slice(&other.pmf).fft_rfft(n, 0, "backward");
        let c = (a * b).fft_irfft(n, 0, "backward").narrow(0, 0, len as i64);
        let pmf: Vec<f64> = Vec::try_from(&c.to_kind(Kind::Double)).expect("f64 tensor");
        DiscretePld {
            interval: self.interval,
            k_lo: self.k_lo + other.k_lo,
            pmf: pmf.into_iter().map(|p| p.max(0.0)).collect(),
            infinity: 1.0 - (1.0 - self.infinity) * (1.0 - other.infinity),
        }
    }

    /// δ(ε) = Σ_y p(y) (1 − e^{ε − y})₊ + p(∞).
    pub fn delta(&self, epsilon: f64) -> f64 {
        let mut delta = self.infinity;
        for (i, &p) in self.pmf.iter().enumerate() {
            let y = (self.k_lo + i as i64) as f64 * self.interval;
            if y > epsilon {
                delta += p * (1.0 - (epsilon - y).exp());
            }
        }
        delta
    }

    /// The smallest ε >= 0 (to 1e-7) with δ(ε) <= `delta`; ∞ if even the largest finite loss
    /// leaves more than δ.
    pub fn epsilon(&self, delta: f64) -> f64 {
        if self.infinity > delta {
            return f64::INFINITY;
        }
        let mut hi = (self.k_lo + self.pmf.len() as i64) as f64 * self.interval;
        if self.delta(hi) > delta {
            return f64::INFINITY;
        }
        let mut lo = 0.0;
        if self.delta(0.0) <= delta {
            return 0.0;
        }
        while hi - lo > 1e-7 {
            let mid = 0.5 * (lo + hi);
            if self.delta(mid) > delta {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        hi
    }
}

/// ε of `steps` steps of the Poisson-subsampled Gaussian mechanism at δ, add-or-remove
/// adjacency: the larger of the two directions.
pub fn epsilon(sample_rate: f64, noise_multiplier: f64, steps: u64, delta: f64) -> Result<f64> {
    let block = StepBlock {
        noise_multiplier,
        sample_rate,
        steps,
    };
    epsilon_for_blocks(&[block], delta)
}

/// ε of a history of step blocks (each block self-composed, then the blocks convolved).
pub fn epsilon_for_blocks(blocks: &[StepBlock], delta: f64) -> Result<f64> {
    validate_delta(delta)?;
    for b in blocks {
        validate(b.sample_rate, b.noise_multiplier, b.steps)?;
        if b.noise_multiplier == 0.0 {
            return Ok(f64::INFINITY);
        }
    }
    let eps = [Adjacency::Remove, Adjacency::Add]
        .into_iter()
        .map(|a| {
            let mut composed: Option<DiscretePld> = None;
            for b in blocks {
                let block = one_step(b.sample_rate, b.noise_multiplier, a, DEFAULT_INTERVAL)
                    .compose(b.steps);
                composed = Some(match composed {
                    None => block,
                    Some(c) => c.convolve(&block),
                });
            }
            composed.map_or(0.0, |c| c.epsilon(delta))
        })
        .fold(0.0, f64::max);
    Ok(eps)
}
