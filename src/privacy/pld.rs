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
//!
//! Bounded memory: the grid spacing starts at dp_accounting's 1e-4 and doubles until the
//! composed window fits `MAX_FFT_LEN` points (small σ or huge T have loss ranges of thousands,
//! which at 1e-4 would need 10^8 points and gigabytes). Connect-the-dots is an upper bound at any
//! spacing, so a coarser grid only loosens ε (by about the spacing per unit of the composed loss's
//! spread); `epsilon_detailed` returns the spacing used so callers can say when it was coarsened.

use super::history::StepBlock;
use super::rdp::log_erfc;
use super::{validate, validate_delta};
use crate::error::{Error, Result};
use tch::{Kind, Tensor};

/// Grid spacing of the loss values (dp_accounting's default).
pub const DEFAULT_INTERVAL: f64 = 1e-4;
/// Probability mass each truncation may drop (moved to infinite loss).
const TAIL_MASS: f64 = 1e-15;
/// Largest FFT length a composition may use (2^22 points: about 200 MB at peak in f64 and
/// complex buffers, measured). Grids that would need more are coarsened (see the module docs).
pub const MAX_FFT_LEN: usize = 1 << 22;
/// Standard deviations of the Gaussian kept on each side of a step's loss range; Φ(−12) is about
/// 2e-33, so even 10^7 steps leave far less than the smallest δ (1e-12) to the tails, and what
/// lies beyond goes pessimistically to the lowest point or to infinite loss.
const Z_TAIL: f64 = 12.0;

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

/// L(x) = log(1 − q + q exp((2x − 1) / (2σ²))) without overflow (the exponent reaches the
/// thousands for small σ): log-sum-exp of log(1 − q) and log q + (2x − 1) / (2σ²).
fn remove_loss(q: f64, sigma: f64, x: f64) -> f64 {
    log_add_exp(
        (1.0 - q).ln(),
        q.ln() + (2.0 * x - 1.0) / (2.0 * sigma * sigma),
    )
}

/// log(e^a + e^b) without overflow.
fn log_add_exp(a: f64, b: f64) -> f64 {
    let (hi, lo) = if a > b { (a, b) } else { (b, a) };
    if lo == f64::NEG_INFINITY {
        return hi;
    }
    hi + (lo - hi).exp().ln_1p()
}

/// log P[N(0, 1) > z], accurate far into the tail (where the survival function underflows).
fn log_normal_sf(z: f64) -> f64 {
    0.5f64.ln() + log_erfc(z / std::f64::consts::SQRT_2)
}

/// The x with L(x) = y: σ² log((e^y − (1 − q)) / q) + 1/2, computed as
/// σ² (y + log(1 − (1 − q) e^{−y}) − log q) + 1/2 so that large y does not overflow.
fn remove_loss_inverse(q: f64, sigma: f64, y: f64) -> f64 {
    sigma * sigma * (y + (-(1.0 - q) * (-y).exp()).ln_1p() - q.ln()) + 0.5
}

/// The hockey-stick divergence δ(ε) = P[L > ε] − e^ε Q[L > ε] of one step's pair.
pub fn one_step_delta(q: f64, sigma: f64, adjacency: Adjacency, epsilon: f64) -> f64 {
    let x_of = |y: f64| remove_loss_inverse(q, sigma, y);
    match adjacency {
        Adjacency::Remove => {
            if epsilon <= (1.0 - q).ln() {
                return 1.0 - epsilon.exp();
            }
            // L > ε  <=>  x > x(ε).
            let x = x_of(epsilon);
            let p = (1.0 - q) * normal_sf(x / sigma) + q * normal_sf((x - 1.0) / sigma);
            // e^ε Q[L > ε] in logs: e^ε alone overflows past ε = 709 while the product is tiny.
            (p - (epsilon + log_normal_sf(x / sigma)).exp()).max(0.0)
        }
        Adjacency::Add => {
            if epsilon >= -(1.0 - q).ln() {
                return 0.0;
            }
            // −L(x) > ε  <=>  x < x(−ε); P = N(0, σ²), Q the mixture.
            let x = x_of(-epsilon);
            let p = normal_cdf(x / sigma);
            let log_qm = log_add_exp(
                (1.0 - q).ln() + log_normal_sf(-x / sigma),
                q.ln() + log_normal_sf((1.0 - x) / sigma),
            );
            (p - (epsilon + log_qm).exp()).max(0.0)
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
/// lowest point takes the remaining mass. On the uniform grid, with d_i = δ_i − δ_{i+1}, this is
/// p_{i+1} = (d_i − e^{−h} d_{i+1}) / (1 − e^{−h}) (d_m = 0), which never forms e^{y} (it
/// overflows for the losses in the thousands that small σ gives).
pub fn one_step(q: f64, sigma: f64, adjacency: Adjacency, interval: f64) -> DiscretePld {
    let (y_lo, y_hi) = one_step_range(q, sigma, adjacency);
    let k_lo = (y_lo / interval).floor() as i64 - 1;
    let k_hi = (y_hi / interval).ceil() as i64 + 1;
    let ys: Vec<f64> = (k_lo..=k_hi).map(|k| k as f64 * interval).collect();
    let deltas: Vec<f64> = ys
        .iter()
        .map(|&y| one_step_delta(q, sigma, adjacency, y))
        .collect();
    let m = ys.len() - 1;
    let d = |i: usize| {
        if i < m {
            (deltas[i] - deltas[i + 1]).max(0.0)
        } else {
            0.0
        }
    };
    let decay = (-interval).exp();
    let mut pmf = vec![0.0; m + 1];
    for i in 0..m {
        pmf[i + 1] = ((d(i) - decay * d(i + 1)) / (1.0 - decay)).max(0.0);
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

/// The loss values one step's discretisation covers: x within `Z_TAIL` standard deviations of
/// both Gaussians, so the range is finite for every q in (0, 1] (at q = 1 the loss is itself
/// Gaussian and unbounded). Mass below the range goes to its lowest point and mass above it to
/// infinite loss, both pessimistic.
pub fn one_step_range(q: f64, sigma: f64, adjacency: Adjacency) -> (f64, f64) {
    let loss = |x: f64| remove_loss(q, sigma, x);
    match adjacency {
        // x ~ (1−q) N(0, σ²) + q N(1, σ²): x in [−zσ, 1 + zσ], L increasing.
        Adjacency::Remove => (loss(-Z_TAIL * sigma), loss(1.0 + Z_TAIL * sigma)),
        // x ~ N(0, σ²): −L(x) decreasing, so x = zσ gives the lowest and x = −zσ the highest.
        Adjacency::Add => (-loss(Z_TAIL * sigma), -loss(-Z_TAIL * sigma)),
    }
}

/// Number of grid points of one step's discretisation at `interval`.
fn one_step_points(q: f64, sigma: f64, adjacency: Adjacency, interval: f64) -> f64 {
    let (lo, hi) = one_step_range(q, sigma, adjacency);
    (hi - lo) / interval + 3.0
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

    /// Variance of the loss over the finite part of the distribution (normalised).
    fn finite_variance(&self) -> f64 {
        let (mut mass, mut first, mut second) = (0.0, 0.0, 0.0);
        for (i, &p) in self.pmf.iter().enumerate() {
            let y = (self.k_lo + i as i64) as f64 * self.interval;
            mass += p;
            first += p * y;
            second += p * y * y;
        }
        if mass <= 0.0 {
            return 0.0;
        }
        let mean = first / mass;
        (second / mass - mean * mean).max(0.0)
    }

    /// The window [k_lo, k_hi] (in grid units) of the T-fold composition outside which at most
    /// `TAIL_MASS` lies on each side (Chernoff: P(S >= s) <= exp(T log M(λ) − λ s)).
    pub fn composed_window(&self, steps: u64) -> (i64, i64) {
        let t = steps as f64;
        let h = self.interval;
        // Fixed orders, and orders around the Gaussian optimum λ* = sqrt(2 log(1/tail) / (T Var))
        // (for T in the millions λ* is far below the fixed ones, whose windows would then be
        // orders of magnitude too wide).
        let mut lambdas = vec![0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0];
        let variance = self.finite_variance();
        if variance > 0.0 {
            let optimum = (2.0 * -TAIL_MASS.ln() / (t * variance)).sqrt();
            lambdas.extend([0.25, 0.5, 1.0, 2.0, 4.0].iter().map(|f| f * optimum));
        }
        let bound = |sign: f64| {
            lambdas
                .iter()
                .map(|&l| (t * self.log_mgf(sign * l) - TAIL_MASS.ln()) / l)
                .fold(f64::INFINITY, f64::min)
        };
        let min_k = self.k_lo as f64 * t;
        let max_k = (self.k_lo + self.pmf.len() as i64 - 1) as f64 * t;
        let k_hi = (bound(1.0) / h).ceil().min(max_k).max(min_k);
        let k_lo = (-bound(-1.0) / h).floor().max(min_k).min(k_hi);
        (k_lo as i64, k_hi as i64)
    }

    /// FFT length `compose(steps)` would use.
    pub fn compose_len(&self, steps: u64) -> usize {
        self.fft_len(self.composed_window(steps))
    }

    fn fft_len(&self, (k_lo, k_hi): (i64, i64)) -> usize {
        let width = (k_hi - k_lo + 1) as usize;
        (width.max(self.pmf.len()) * 2).next_power_of_two()
    }

    /// The T-fold composition (at most `MAX_FFT_LEN` points: check `compose_len` first).
    pub fn compose(&self, steps: u64) -> DiscretePld {
        let t = steps as f64;
        let h = self.interval;
        let (k_lo, k_hi) = self.composed_window(steps);
        let width = (k_hi - k_lo + 1) as usize;
        let n = self.fft_len((k_lo, k_hi));
        assert!(
            n <= MAX_FFT_LEN,
            "PLD composition of {n} points exceeds MAX_FFT_LEN: coarsen the interval"
        );
        let n = n as i64;
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

    /// The smallest ε >= 0 (to 1e-7, relative above 1) with δ(ε) <= `delta`; ∞ if even the largest finite loss
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
        // Relative tolerance: at ε in the thousands an absolute 1e-7 is below f64 resolution.
        while hi - lo > 1e-7 * hi.max(1.0) {
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
    Ok(epsilon_detailed(blocks, delta)?.epsilon)
}

/// ε and the grid spacing it was computed at (`DEFAULT_INTERVAL` unless the loss range needed
/// a coarser grid to fit `MAX_FFT_LEN`; a coarser grid gives a looser, still valid, bound).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PldEpsilon {
    pub epsilon: f64,
    pub interval: f64,
}

impl PldEpsilon {
    pub fn coarsened(&self) -> bool {
        self.interval > DEFAULT_INTERVAL
    }
}

/// ε of a history of step blocks, on the finest grid (1e-4 doubled as often as needed) whose
/// composition fits `MAX_FFT_LEN` points.
pub fn epsilon_detailed(blocks: &[StepBlock], delta: f64) -> Result<PldEpsilon> {
    validate_delta(delta)?;
    for b in blocks {
        validate(b.sample_rate, b.noise_multiplier, b.steps)?;
    }
    if blocks.iter().any(|b| b.noise_multiplier == 0.0) {
        return Ok(PldEpsilon {
            epsilon: f64::INFINITY,
            interval: DEFAULT_INTERVAL,
        });
    }
    let mut interval = DEFAULT_INTERVAL;
    // Each failed try names the factor by which the grid was too fine, so this converges in a
    // few tries; 64 doublings take the spacing from 1e-4 past any f64 loss range.
    for _ in 0..64 {
        match epsilon_at(blocks, delta, interval) {
            Ok(epsilon) => return Ok(PldEpsilon { epsilon, interval }),
            Err(too_fine) => interval *= too_fine.next_power_of_two() as f64,
        }
    }
    Err(Error::bad_value(
        "accountant",
        format!(
            "no grid spacing up to {interval:e} fits the composition of {blocks:?} in \
             {MAX_FFT_LEN} points; use the `accountant` rdp"
        ),
    ))
}

/// ε at one grid spacing, or Err(factor) when the grid would need about `factor` times more than
/// `MAX_FFT_LEN` points (checked before anything that large is allocated).
fn epsilon_at(blocks: &[StepBlock], delta: f64, interval: f64) -> std::result::Result<f64, usize> {
    let cap = MAX_FFT_LEN as f64;
    let mut epsilon = 0.0f64;
    for adjacency in [Adjacency::Remove, Adjacency::Add] {
        for b in blocks {
            let points = one_step_points(b.sample_rate, b.noise_multiplier, adjacency, interval);
            if 2.0 * points > cap {
                return Err((2.0 * points / cap).ceil() as usize);
            }
        }
        let mut composed: Option<DiscretePld> = None;
        let mut total = 0usize;
        for b in blocks {
            let step = one_step(b.sample_rate, b.noise_multiplier, adjacency, interval);
            let len = step.compose_len(b.steps);
            if len > MAX_FFT_LEN {
                return Err(len.div_ceil(MAX_FFT_LEN));
            }
            let block = step.compose(b.steps);
            total += block.pmf.len();
            if 2 * total > MAX_FFT_LEN {
                return Err((2 * total).div_ceil(MAX_FFT_LEN));
            }
            composed = Some(match composed {
                None => block,
                Some(c) => c.convolve(&block),
            });
        }
        epsilon = epsilon.max(composed.map_or(0.0, |c| c.epsilon(delta)));
    }
    Ok(epsilon)
}
