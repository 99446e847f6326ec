//! A tight accountant: the privacy loss distribution (PLD) of the Poisson-subsampled Gaussian
//! mechanism, discretised pessimistically and composed numerically by FFT (Koskela, Jälkö and
//! Honkela 2020; Meiser and Mohammadi 2018; the method of Google's `dp_accounting` PLD
//! accountant, against whose values `tests/privacy/accountant.rs` checks it).
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
//! the pmf T times (one FFT, an elementwise power by repeated squaring, one inverse FFT),
//! read on a window chosen by Chernoff bounds (`DiscretePld::composed_window`); the mass the
//! window can miss is added to the infinite-loss mass. Each step keeps as much of its
//! Gaussians' tails as the composition needs (`truncation_z`).
//! δ(ε) = Σ_y p(y) (1 − e^{ε − y})₊ + p(∞), and ε(δ) is solved in the grid cell where δ crosses
//! (`DiscretePld::epsilon`). Every answer is checked against bounds computed without the FFT
//! before it is reported, and replaced by the RDP bound where it fails them
//! (`pld_bounds`, `RdpFallback`).
//!
//! Small δ: the FFT's rounding error is about 1e-16 of the largest mass, and
//! dp_accounting's fixed truncation moves 2e-15 to infinite loss, so an untilted composition
//! cannot resolve δ below about 1e-13 (measured: ε 0.7 above the exact Gaussian value at δ 2e-15,
//! ∞ at 1e-15). Here each step's pmf is first exponentially tilted, p_λ(y) = p(y) e^{λy} / M(λ)
//! with λ the Chernoff-optimal order for the requested δ; tilting commutes with convolution, so
//! the FFT composes p_λ, whose mass sits near the ε being sought, and δ(ε) is read back as
//! Σ_y M(λ)^T e^{−λy} p_λ^{*T}(y) (1 − e^{ε − y})₊ in logs. The rounding error is then relative
//! to the terms δ(ε) is made of, and the truncation can drop mass proportional to δ
//! (`TAIL_FRACTION`). Valid from `MIN_PLD_DELTA` (1e-20) up; below it the accountant refuses
//! and names the RDP accountant.
//!
//! Bounded memory: the grid spacing starts at dp_accounting's 1e-4 and doubles until the
//! composed window fits `MAX_FFT_LEN` points (small σ or huge T have loss ranges of thousands,
//! which at 1e-4 would need 10^8 points and gigabytes). Connect-the-dots is an upper bound at any
//! spacing, so a coarser grid only loosens ε (by about the spacing per unit of the composed loss's
//! spread); `epsilon_detailed` returns the spacing used so callers can say when it was coarsened.

use super::history::StepBlock;
use super::pld_bounds;
use super::rdp::log_erfc;
use super::{validate, validate_delta};
use crate::error::{Error, Result};
use realfft::num_complex::Complex;
use realfft::{ComplexToReal, RealFftPlanner, RealToComplex};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Grid spacing of the loss values (dp_accounting's default).
pub const DEFAULT_INTERVAL: f64 = 1e-4;
/// Probability mass each truncation may drop (moved to infinite loss), dp_accounting's 1e-15,
/// and the bound on the aliased mass of a tilted composition's window (relative to the tilted
/// distribution, whose mass is 1).
const TAIL_MASS: f64 = 1e-15;
/// For small δ the untilted mass each truncation may drop is `TAIL_FRACTION` δ instead of
/// `TAIL_MASS` (the steps' truncations and the window's two sides, each moved up in loss or to
/// infinite loss, change δ by at most 3e-6 of itself).
const TAIL_FRACTION: f64 = 1e-6;
/// Smallest δ the PLD accountant answers. Each step keeps at most `Z_TAIL` = 12 standard
/// deviations and sends the rest (Φ(−12) ≈ 2e-33 a step) to infinite loss, which 10^7 steps
/// keep below `TAIL_FRACTION` δ down to δ = 1e-20; `tests/privacy/accountant.rs` checks the tilted composition
/// against the exact Gaussian and one-step values and against RDP to that δ. Below it the
/// accountant refuses (use RDP, which has no such floor).
pub const MIN_PLD_DELTA: f64 = 1e-20;
/// Tilts searched when choosing the Chernoff-optimal λ: 1e-9 to 1e3, to a factor 1.25
/// (`minimise_over_lambda`; λ + 1 is the RDP order, so this covers Opacus's orders 1.1 to 63
/// and beyond; long runs of small σ need λ far below 1e-3: at q 1, σ 0.0134, 429,147 steps
/// the optimum is about 8e-5, and a tilt of 1e-3 moved the mass e^{-1000} away from ε, where
/// it underflowed). Off by a factor 1.25 the tilted mass still sits within a few standard
/// deviations of ε.
const TILT_RANGE: (f64, f64, f64) = (1e-9, 1e3, 1.25);
/// The smallest tilted mass, relative to the largest, that `DiscretePld::resolves` counts as
/// mass: ten thousand times the FFT's relative rounding of about 1e-16.
const RESOLVED_FRACTION: f64 = 1e-12;
/// Largest FFT length a composition may use (2^22 points: about 200 MB at peak in f64 and
/// complex buffers, measured). Grids that would need more are coarsened (see the module docs).
pub const MAX_FFT_LEN: usize = 1 << 22;
/// Most standard deviations of the Gaussian kept on each side of a step's loss range
/// (`truncation_z` keeps fewer where the composition's tail budget allows); Φ(−12) is about
/// 2e-33, so even 10^7 steps leave far less than the smallest δ to the tails, and what lies
/// beyond goes pessimistically to the lowest point or to infinite loss.
const Z_TAIL: f64 = 12.0;

fn normal_cdf(z: f64) -> f64 {
    0.5 * libm::erfc(-z / std::f64::consts::SQRT_2)
}

/// A loss distribution on the grid {k h : k_lo <= k < k_lo + pmf.len()} plus mass at +∞.
///
/// The pmf may be exponentially tilted (see the module docs): the mass at y = k h is
/// `pmf[k − k_lo] · exp(log_scale − tilt · y)`; untilted distributions have `tilt` and
/// `log_scale` 0. `infinity` is always the untilted mass at +∞.
#[derive(Debug, Clone)]
pub struct DiscretePld {
    /// h, the spacing of the loss grid (nats).
    pub interval: f64,
    /// The grid index of `pmf[0]`: its loss value is `k_lo · h`.
    pub k_lo: i64,
    /// The (possibly tilted) mass at each grid point, from `k_lo` up.
    pub pmf: Vec<f64>,
    /// The mass at infinite loss, untilted; it adds to δ at every ε.
    pub infinity: f64,
    /// λ of the exponential tilt (0: untilted).
    pub tilt: f64,
    /// The log of the factor that undoes the tilt's normalisation (0: untilted).
    pub log_scale: f64,
}

/// Which of the two pairs of distributions (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adjacency {
    /// The neighbour lacks the example: P the mixture (1−q) N(0, σ²) + q N(1, σ²) against
    /// Q = N(0, σ²).
    Remove,
    /// The neighbour has one more example: P = N(0, σ²) against Q the mixture.
    Add,
}

fn normal_sf(z: f64) -> f64 {
    0.5 * libm::erfc(z / std::f64::consts::SQRT_2)
}

/// L(x) = log(1 − q + q exp((2x − 1) / (2σ²))) without overflow (the exponent reaches the
/// thousands for small σ): log-sum-exp of log(1 − q) and log q + (2x − 1) / (2σ²).
pub(crate) fn remove_loss(q: f64, sigma: f64, x: f64) -> f64 {
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

/// The hockey-stick divergence δ(ε) = P\[L > ε\] − e^ε Q\[L > ε\] of one step's pair.
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
    one_step_truncated(q, sigma, adjacency, interval, Z_TAIL)
}

/// `one_step` keeping `z` standard deviations of each Gaussian (`one_step_range`).
pub fn one_step_truncated(
    q: f64,
    sigma: f64,
    adjacency: Adjacency,
    interval: f64,
    z: f64,
) -> DiscretePld {
    let (y_lo, y_hi) = one_step_range(q, sigma, adjacency, z);
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
        tilt: 0.0,
        log_scale: 0.0,
    }
}

/// The loss values one step's discretisation covers: x within `z` standard deviations of
/// both Gaussians, so the range is finite for every q in (0, 1] (at q = 1 the loss is itself
/// Gaussian and unbounded). Mass below the range goes to its lowest point and mass above it to
/// infinite loss, both pessimistic.
pub fn one_step_range(q: f64, sigma: f64, adjacency: Adjacency, z: f64) -> (f64, f64) {
    let loss = |x: f64| remove_loss(q, sigma, x);
    match adjacency {
        // x ~ (1−q) N(0, σ²) + q N(1, σ²): x in [−zσ, 1 + zσ], L increasing.
        Adjacency::Remove => (loss(-z * sigma), loss(1.0 + z * sigma)),
        // x ~ N(0, σ²): −L(x) decreasing, so x = zσ gives the lowest and x = −zσ the highest.
        Adjacency::Add => (-loss(z * sigma), -loss(-z * sigma)),
    }
}

/// Number of grid points of one step's discretisation at `interval`, keeping `z` standard
/// deviations.
fn one_step_points(q: f64, sigma: f64, adjacency: Adjacency, interval: f64, z: f64) -> f64 {
    let (lo, hi) = one_step_range(q, sigma, adjacency, z);
    (hi - lo) / interval + 3.0
}

/// Standard deviations each step of a `steps`-step composition keeps (`one_step_range`) so that
/// what its truncation moves, Φ(−z) of each Gaussian a step, is at most `tail` over all the
/// steps: the z with T Φ(−z) <= `tail`, at most `Z_TAIL`. Moved mass changes δ by at most its
/// own amount (it goes up in loss or to infinity, so δ only grows). For T 250 and `tail` 1e-15
/// this keeps 8.6 standard deviations, whose loss range is about two thirds of `Z_TAIL`'s.
pub fn truncation_z(steps: u64, tail: f64) -> f64 {
    let per_step = tail / steps.max(1) as f64;
    if normal_sf(Z_TAIL) >= per_step {
        return Z_TAIL;
    }
    // Φ(−z) decreases in z: bisection between 0 and Z_TAIL to 1e-6.
    let (mut low, mut high) = (0.0f64, Z_TAIL);
    while high - low > 1e-6 {
        let mid = 0.5 * (low + high);
        if normal_sf(mid) > per_step {
            low = mid;
        } else {
            high = mid;
        }
    }
    high
}

/// log Σ exp(log p + λ y) over (y, log p) pairs, by log-sum-exp.
fn log_mgf_of(points: &[(f64, f64)], lambda: f64) -> f64 {
    let max = points
        .iter()
        .map(|&(y, log_p)| log_p + lambda * y)
        .fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = points
        .iter()
        .map(|&(y, log_p)| (log_p + lambda * y - max).exp())
        .sum();
    max + sum.ln()
}

/// Where a T-fold composition is read, and the length of the circular FFT that computes it
/// (`DiscretePld::composed_window`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Grid index of the lowest loss read.
    pub k_lo: i64,
    /// Grid index of the highest loss read; the untilted mass above it goes to infinite loss.
    pub k_hi: i64,
    /// Length of the FFT (above `MAX_FFT_LEN` when the grid is too fine to fit).
    pub fft_len: usize,
}

/// The orders λ the Chernoff bounds of a composition's window are minimised over.
const CHERNOFF_RANGE: (f64, f64) = (1e-9, 1e4);

/// The minimum over λ in [low, high] of a function that is quasi-convex in λ (it decreases,
/// then increases), found to within a factor `tolerance` of the minimising λ: a scan by factors
/// of 2 from `start` in the direction of descent brackets it, then golden-section search on
/// log λ narrows the bracket. Returns (λ, f(λ)) of the best λ evaluated; NaN counts as +∞.
///
/// Both uses have that shape: a Chernoff bound (T K(λ) + c) / λ with K a log-mgf (convex,
/// K(0) = 0) and c > 0 has derivative (T (λ K'(λ) − K(λ)) − c) / λ², whose numerator grows
/// with λ (its derivative is T λ K''(λ) >= 0), so it changes sign at most once.
fn minimise_over_lambda(
    f: impl Fn(f64) -> f64,
    start: f64,
    (low, high): (f64, f64),
    tolerance: f64,
) -> (f64, f64) {
    let (u_min, u_max) = (low.ln(), high.ln());
    let mut best = (f64::NAN, f64::INFINITY);
    let mut at = |u: f64| {
        let lambda = u.exp();
        let value = f(lambda);
        let value = if value.is_nan() { f64::INFINITY } else { value };
        if value < best.1 || best.0.is_nan() {
            best = (lambda, value);
        }
        value
    };
    let step = std::f64::consts::LN_2;
    let start = if start.is_finite() && start > 0.0 {
        start.clamp(low, high).ln()
    } else {
        0.0f64.clamp(u_min, u_max)
    };
    let at_start = at(start);
    // Bracket [a, b] around the minimum: walk downhill by factors of 2 until f rises.
    let up = (start + step).min(u_max);
    let at_up = at(up);
    let (mut a, mut b) = if at_up < at_start {
        let (mut previous, mut current, mut at_current) = (start, up, at_up);
        loop {
            let next = (current + step).min(u_max);
            if next <= current {
                break (previous, current);
            }
            let at_next = at(next);
            if at_next >= at_current {
                break (previous, next);
            }
            (previous, current, at_current) = (current, next, at_next);
        }
    } else {
        let (mut previous, mut current, mut at_current) = (up, start, at_start);
        loop {
            let next = (current - step).max(u_min);
            if next >= current {
                break (current, previous);
            }
            let at_next = at(next);
            if at_next >= at_current {
                break (next, previous);
            }
            (previous, current, at_current) = (current, next, at_next);
        }
    };
    // Golden-section search on [a, b].
    let ratio = (5f64.sqrt() - 1.0) / 2.0;
    let mut c = b - ratio * (b - a);
    let mut d = a + ratio * (b - a);
    let (mut at_c, mut at_d) = (at(c), at(d));
    while b - a > tolerance.ln() {
        if at_c <= at_d {
            (b, d, at_d) = (d, c, at_c);
            c = b - ratio * (b - a);
            at_c = at(c);
        } else {
            (a, c, at_c) = (c, d, at_d);
            d = a + ratio * (b - a);
            at_d = at(d);
        }
    }
    best
}

/// The FFT plans of every length used so far: an ε evaluation reuses the plans (and their
/// twiddle tables) of the evaluations before it, as calibration evaluates ε at nearby σ. Each
/// length's plans come from a planner of their own: a planner shared across lengths picks a
/// length's algorithm from what it planned before, so ε would differ in its last bits with the
/// lengths a process happened to evaluate first (a run's ε from `dpcomp epsilon`'s).
struct Plans {
    forward: HashMap<usize, Arc<dyn RealToComplex<f64>>>,
    inverse: HashMap<usize, Arc<dyn ComplexToReal<f64>>>,
}

fn plans() -> std::sync::MutexGuard<'static, Plans> {
    static PLANS: OnceLock<Mutex<Plans>> = OnceLock::new();
    PLANS
        .get_or_init(|| {
            Mutex::new(Plans {
                forward: HashMap::new(),
                inverse: HashMap::new(),
            })
        })
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// The real FFT of `values` zero-padded to `n` (n >= values.len()).
fn forward_fft(values: &[f64], n: usize) -> Vec<Complex<f64>> {
    let plan = plans()
        .forward
        .entry(n)
        .or_insert_with(|| RealFftPlanner::new().plan_fft_forward(n))
        .clone();
    let mut input = vec![0.0; n];
    input[..values.len()].copy_from_slice(values);
    let mut spectrum = plan.make_output_vec();
    plan.process(&mut input, &mut spectrum)
        .expect("buffers sized by the plan");
    spectrum
}

/// The inverse of `forward_fft` (normalised by 1/n), of the spectrum of a real sequence: the
/// imaginary parts of the zero and (even n) Nyquist frequencies are exactly 0 in every spectrum
/// formed here (products and powers of real numbers), and are set so.
fn inverse_fft(mut spectrum: Vec<Complex<f64>>, n: usize) -> Vec<f64> {
    let plan = plans()
        .inverse
        .entry(n)
        .or_insert_with(|| RealFftPlanner::new().plan_fft_inverse(n))
        .clone();
    spectrum[0].im = 0.0;
    if n.is_multiple_of(2) {
        spectrum[n / 2].im = 0.0;
    }
    let mut out = plan.make_output_vec();
    plan.process(&mut spectrum, &mut out)
        .expect("buffers sized by the plan");
    let scale = 1.0 / n as f64;
    out.iter_mut().for_each(|v| *v *= scale);
    out
}

/// The T-fold circular self-convolution of `pmf` on n points: FFT, each frequency to the
/// power T (`power_by_squaring`), inverse FFT.
fn fft_power(pmf: &[f64], n: usize, steps: u64) -> Vec<f64> {
    let mut spectrum = forward_fft(pmf, n);
    power_by_squaring(&mut spectrum, steps);
    inverse_fft(spectrum, n)
}

/// The convolution of `a` and `b` on n >= a.len() + b.len() − 1 points (no wrap-around).
fn fft_convolve(a: &[f64], b: &[f64], n: usize) -> Vec<f64> {
    let mut spectrum = forward_fft(a, n);
    let other = forward_fft(b, n);
    spectrum.iter_mut().zip(&other).for_each(|(x, y)| *x *= y);
    inverse_fft(spectrum, n)
}

/// Raises each complex number of `values` to the power `exponent` by repeated squaring: about
/// 2 log2(T) complex products, each with a relative rounding of about 1e-16, where exp(T log z)
/// costs a logarithm, an exponential and a sine and cosine per value and rounds the phase T θ
/// to about T · 1e-16.
fn power_by_squaring(values: &mut [Complex<f64>], exponent: u64) {
    for z in values.iter_mut() {
        let mut base = *z;
        let mut power = Complex::new(1.0, 0.0);
        let mut e = exponent;
        while e > 0 {
            if e & 1 == 1 {
                power *= base;
            }
            e >>= 1;
            if e > 0 {
                base *= base;
            }
        }
        *z = power;
    }
}

/// The smallest even n >= `len` whose only prime factors are 2, 3 and 5, which FFT libraries
/// transform about as fast as a power of two.
fn next_fast_len(len: usize) -> usize {
    let len = len.max(2);
    let mut best = len.next_power_of_two();
    let mut p5 = 1usize;
    while p5 < best {
        let mut p35 = p5;
        while p35 < best {
            // The smallest p35 · 2^k >= len with k >= 1.
            let mut n = 2 * p35;
            while n < len {
                n *= 2;
            }
            best = best.min(n);
            p35 *= 3;
        }
        p5 *= 5;
    }
    best
}

impl DiscretePld {
    /// (y, log p) of the positive masses, so that each log-mgf costs one exp a point.
    fn log_masses(&self) -> Vec<(f64, f64)> {
        self.pmf
            .iter()
            .enumerate()
            .filter(|(_, &p)| p > 0.0)
            .map(|(i, &p)| ((self.k_lo + i as i64) as f64 * self.interval, p.ln()))
            .collect()
    }

    /// log E[exp(λ Y)] over the finite part.
    fn log_mgf(&self, lambda: f64) -> f64 {
        log_mgf_of(&self.log_masses(), lambda)
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

    /// The same distribution with its pmf tilted by a further `lambda`: pmf · e^{λy}, normalised
    /// (a pmf of mass 1 for the FFT), with the normaliser kept in `log_scale`.
    pub fn tilted(&self, lambda: f64) -> DiscretePld {
        let log_norm = self.log_mgf(lambda);
        let pmf = self
            .pmf
            .iter()
            .enumerate()
            .map(|(i, &p)| {
                if p > 0.0 {
                    let y = (self.k_lo + i as i64) as f64 * self.interval;
                    (p.ln() + lambda * y - log_norm).exp()
                } else {
                    0.0
                }
            })
            .collect();
        DiscretePld {
            interval: self.interval,
            k_lo: self.k_lo,
            pmf,
            infinity: self.infinity,
            tilt: self.tilt + lambda,
            log_scale: self.log_scale + log_norm,
        }
    }

    /// The Chernoff bound (in loss units) on one tail of the T-fold sum of a distribution with
    /// log-mgf `log_mgf`: above `sign` = 1's bound, or below the negative of `sign` = −1's,
    /// lies at most `tail` (P(±S >= s) <= exp(T log M(±λ) − λ s)), minimised over λ
    /// (`minimise_over_lambda`; any λ gives a valid bound, the search only tightens it). The
    /// search starts at the Gaussian optimum λ* = sqrt(2 log(1/tail) / (T Var)).
    /// `variance` is the distribution's (`finite_variance`, computed once per window).
    fn chernoff_bound(
        steps: u64,
        variance: f64,
        tail: f64,
        sign: f64,
        log_mgf: impl Fn(f64) -> f64,
    ) -> f64 {
        let t = steps as f64;
        let start = if variance > 0.0 {
            (2.0 * -tail.ln() / (t * variance)).sqrt()
        } else {
            1.0
        };
        let bound = |l: f64| (t * log_mgf(sign * l) - tail.ln()) / l;
        let (_, best) = minimise_over_lambda(bound, start, CHERNOFF_RANGE, 1.5);
        sign * best
    }

    /// Where the T-fold composition is read and how long its FFT is.
    ///
    /// - Read: [k_lo, k_hi] in grid units. Above k_hi lies at most `tail` of the untilted mass
    ///   (it goes to infinite loss). Below k_lo lies at most `tail` too, unless `read_from` is
    ///   given: then the window starts one grid point below `read_from`, since what lies below
    ///   a loss no ε asks about changes no δ (ε >= 0, so a single block's composition is read
    ///   from 0).
    /// - FFT length n: the circular convolution adds the mass k ± n, k ± 2n, ... to the value
    ///   at k (extra mass: δ only grows). n reaches from k_lo past the tilted mass's own upper
    ///   tail and from k_hi below its lower tail, where at most `TAIL_MASS` of it lies, so what
    ///   folds into the window is below the FFT's rounding relative to the tilted masses δ is
    ///   read from. n is the smallest even 5-smooth length that holds that and the step's pmf.
    pub fn composed_window(&self, steps: u64, tail: f64, read_from: Option<f64>) -> Window {
        let t = steps as f64;
        let h = self.interval;
        let points = self.log_masses();
        let variance = self.finite_variance();
        let tilted = |l: f64| log_mgf_of(&points, l);
        // log E[exp(ν Y)] of the untilted distribution's finite part.
        let untilted = |nu: f64| self.log_scale + log_mgf_of(&points, nu - self.tilt);
        let min_k = self.k_lo as f64 * t;
        let max_k = (self.k_lo + self.pmf.len() as i64 - 1) as f64 * t;
        let grid_up = |y: f64| (y / h).ceil().clamp(min_k, max_k);
        let grid_down = |y: f64| (y / h).floor().clamp(min_k, max_k);
        let k_hi = grid_up(Self::chernoff_bound(steps, variance, tail, 1.0, untilted));
        // Below `read_from` nothing is read, so its tail bound is not needed (a window that
        // starts lower than the mass does only costs length).
        let lowest = match read_from {
            Some(y) => y - h,
            None => Self::chernoff_bound(steps, variance, tail, -1.0, untilted),
        };
        let k_lo = grid_down(lowest).min(k_hi);
        let tilted_hi = grid_up(Self::chernoff_bound(
            steps, variance, TAIL_MASS, 1.0, tilted,
        ));
        let mut reach = (tilted_hi - k_lo).max(k_hi - k_lo);
        // The lower tail folds into the window only if n is shorter than k_hi minus the
        // support's lowest point; its bound is needed only then.
        if k_hi - min_k > reach {
            let tilted_lo = grid_down(Self::chernoff_bound(
                steps, variance, TAIL_MASS, -1.0, tilted,
            ));
            reach = reach.max(k_hi - tilted_lo);
        }
        let reach = reach + 1.0;
        let needed = reach.max(self.pmf.len() as f64);
        let fft_len = if needed > MAX_FFT_LEN as f64 {
            // Past the cap: reported as such, never allocated (`epsilon_at` coarsens the grid).
            needed.min(usize::MAX as f64 / 2.0) as usize
        } else {
            next_fast_len(needed as usize)
        };
        Window {
            k_lo: k_lo as i64,
            k_hi: k_hi as i64,
            fft_len,
        }
    }

    /// The T-fold composition read on the whole untilted window (at most `MAX_FFT_LEN` points:
    /// check `composed_window(..).fft_len` first), with the pmf in the same tilt as `self`;
    /// `tail` is the untilted mass the window may drop on each side, moved to infinite loss.
    pub fn compose(&self, steps: u64, tail: f64) -> DiscretePld {
        self.compose_on(steps, tail, self.composed_window(steps, tail, None))
    }

    /// `compose` on a window already computed by `composed_window(steps, tail, ..)` (it costs a
    /// few dozen moment generating functions over the pmf, so it is computed once).
    pub fn compose_on(&self, steps: u64, tail: f64, window: Window) -> DiscretePld {
        let t = steps as f64;
        let h = self.interval;
        let Window {
            k_lo,
            k_hi,
            fft_len,
        } = window;
        let width = (k_hi - k_lo + 1) as usize;
        assert!(
            fft_len <= MAX_FFT_LEN && fft_len >= self.pmf.len() && fft_len >= width,
            "PLD composition of {fft_len} points: outside 1..=MAX_FFT_LEN or shorter than its pmf"
        );
        let n = fft_len as i64;
        // Circular convolution: entry j of the per-step pmf sits at index j; the composed value
        // T k_lo + j sits at index j mod n.
        let composed = fft_power(&self.pmf, fft_len, steps);
        let offset = self.k_lo * steps as i64;
        let mut out = Vec::with_capacity(width);
        for k in k_lo..=k_hi {
            let index = (k - offset).rem_euclid(n) as usize;
            out.push(composed[index].max(0.0));
        }
        // 1 − (1 − p∞)^T without rounding p∞ ≈ 1e-33 away.
        let infinite_in_some_step = -(t * (-self.infinity).ln_1p()).exp_m1();
        DiscretePld {
            interval: h,
            k_lo,
            pmf: out,
            // Infinite loss in any step, plus what the window may have dropped on both sides.
            infinity: (infinite_in_some_step + 2.0 * tail).min(1.0),
            tilt: self.tilt,
            log_scale: self.log_scale * t,
        }
    }

    /// The PLD of running `self` and then `other` (same grid spacing and tilt): their
    /// convolution.
    pub fn convolve(&self, other: &DiscretePld) -> DiscretePld {
        assert!(
            self.interval == other.interval && self.tilt == other.tilt,
            "convolving PLDs of different grids or tilts"
        );
        let len = self.pmf.len() + other.pmf.len() - 1;
        let mut pmf = fft_convolve(&self.pmf, &other.pmf, next_fast_len(len));
        pmf.truncate(len);
        DiscretePld {
            interval: self.interval,
            k_lo: self.k_lo + other.k_lo,
            pmf: pmf.into_iter().map(|p| p.max(0.0)).collect(),
            // 1 − (1 − a)(1 − b), written so that masses below 1e-16 (a millionth of a small δ)
            // are not rounded away.
            infinity: self.infinity + other.infinity - self.infinity * other.infinity,
            tilt: self.tilt,
            log_scale: self.log_scale + other.log_scale,
        }
    }

    /// The untilted mass at grid point i: pmf(y) exp(log_scale − tilt y), formed in logs (it is
    /// far below f64's smallest normal number where the tilted pmf is not).
    fn mass(&self, i: usize, y: f64) -> f64 {
        let p = self.pmf[i];
        if p <= 0.0 {
            0.0
        } else if self.tilt == 0.0 && self.log_scale == 0.0 {
            p
        } else {
            (p.ln() + self.log_scale - self.tilt * y).exp()
        }
    }

    fn loss_at(&self, i: usize) -> f64 {
        (self.k_lo + i as i64) as f64 * self.interval
    }

    /// Whether δ near `epsilon` was read from masses above the FFT's rounding: where the
    /// tilted pmf holds mass above ε at all (above `RESOLVED_FRACTION` of its largest value),
    /// it must hold such mass within 5 / λ of ε (two grid points at least), since δ(ε) is made
    /// of the untilted masses just above ε, the tilted ones times e^{−λy}. A tilt that put the
    /// bulk of the mass far above ε leaves zeros or rounding noise there, and the ε read from
    /// them is far too small (q 1, σ 0.0134, 429,147 steps with λ 1e-3: 6.6e4 below the exact
    /// value).
    pub fn resolves(&self, epsilon: f64) -> bool {
        if !epsilon.is_finite() || epsilon <= 0.0 {
            return true;
        }
        let largest = self.pmf.iter().copied().fold(0.0f64, f64::max);
        let floor = RESOLVED_FRACTION * largest;
        let reach = if self.tilt > 0.0 {
            epsilon + (5.0 / self.tilt).max(2.0 * self.interval)
        } else {
            f64::INFINITY
        };
        let (mut near, mut beyond) = (false, false);
        for (i, &p) in self.pmf.iter().enumerate() {
            let y = self.loss_at(i);
            if y > epsilon && p > floor {
                if y <= reach {
                    near = true;
                } else {
                    beyond = true;
                }
            }
        }
        near || !beyond
    }

    /// δ(ε) = Σ_y p(y) (1 − e^{ε − y})₊ + p(∞), term by term over the untilted masses.
    pub fn delta(&self, epsilon: f64) -> f64 {
        let mut delta = self.infinity;
        for i in 0..self.pmf.len() {
            let y = self.loss_at(i);
            if y > epsilon {
                delta += self.mass(i, y) * -(epsilon - y).exp_m1();
            }
        }
        delta
    }

    /// The smallest ε >= 0 with δ(ε) <= `delta`; ∞ if even the largest finite loss leaves more
    /// than δ.
    ///
    /// Between two grid points y_i < ε <= y_{i+1} the points above ε are fixed, so
    /// δ(ε) = p(∞) + S_i − e^{ε − y_i} U_i with S_i = Σ_{j>i} p_j and
    /// U_i = Σ_{j>i} p_j e^{y_i − y_j}, both summed from the top down in one pass
    /// (U_i = e^{−h} (U_{i+1} + p_{i+1})). That pass finds the cell where δ crosses `delta`,
    /// and there ε = y_i + log((p(∞) + S_i − δ) / U_i). The answer is then checked term by
    /// term, and where rounding put it a hair low, bisection inside the cell moves it up: the
    /// ε returned always has δ(ε) <= `delta` by the term-by-term sum.
    pub fn epsilon(&self, delta: f64) -> f64 {
        if self.infinity > delta {
            return f64::INFINITY;
        }
        let top = (self.k_lo + self.pmf.len() as i64) as f64 * self.interval;
        if self.delta(top) > delta {
            return f64::INFINITY;
        }
        if self.delta(0.0) <= delta {
            return 0.0;
        }
        let decay = (-self.interval).exp();
        let n = self.pmf.len();
        // (lower end of the cell, its upper end, the solution in it); the lowest cell starts at
        // 0 when every grid point is above it.
        let (mut s, mut u) = (0.0f64, 0.0f64);
        let mut found = None;
        for i in (0..n).rev() {
            let y = self.loss_at(i);
            if self.infinity + s - u > delta {
                let upper = self.loss_at(i + 1);
                let solved = y + ((self.infinity + s - delta) / u).ln();
                found = Some((y.max(0.0), upper, solved));
                break;
            }
            let m = self.mass(i, y);
            s += m;
            u = decay * (u + m);
            if y <= 0.0 {
                break;
            }
        }
        let (lower, upper, solved) = match found {
            Some(cell) => cell,
            // δ at every grid point >= 0 is at most `delta` but δ(0) is not: the cell is
            // (0, y_0] with every point above ε, where ε = log((p(∞) + S − δ) / B),
            // B = Σ_j p_j e^{−y_j}.
            None => {
                let y0 = self.loss_at(0).max(0.0);
                let (mut a, mut b) = (0.0, 0.0);
                for i in 0..n {
                    let y = self.loss_at(i);
                    let m = self.mass(i, y);
                    a += m;
                    b += m * (y0 - y).exp();
                }
                (0.0, y0, y0 + ((self.infinity + a - delta) / b).ln())
            }
        };
        let candidate = if solved.is_finite() {
            solved.clamp(lower, upper)
        } else {
            upper
        };
        if self.delta(candidate) <= delta {
            return candidate;
        }
        // Rounding: bisect between the candidate and the first point known to satisfy δ.
        let mut lo = candidate;
        let mut hi = if self.delta(upper) <= delta {
            upper
        } else {
            top
        };
        while hi - lo > 1e-9 * hi.max(1.0) {
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

/// ε and how it was obtained: the grid spacing of the PLD composition (`DEFAULT_INTERVAL`
/// unless the loss range needed a coarser grid to fit `MAX_FFT_LEN`; a coarser grid gives a
/// looser, still valid, bound), and whether the RDP bound replaced the PLD answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PldEpsilon {
    /// ε at the δ asked for, an upper bound.
    pub epsilon: f64,
    /// h, the loss grid spacing the PLD composition used (`DEFAULT_INTERVAL` when it did not
    /// run).
    pub interval: f64,
    /// `Some` when `epsilon` is the RDP bound instead of the PLD answer, and why.
    pub fallback: Option<RdpFallback>,
}

impl PldEpsilon {
    /// Whether the grid was coarser than `DEFAULT_INTERVAL` to fit `MAX_FFT_LEN` (ε is then
    /// looser than dp_accounting's by about the spacing, still an upper bound).
    pub fn coarsened(&self) -> bool {
        self.interval > DEFAULT_INTERVAL
    }
}

/// Why the PLD accountant reported the RDP bound (an upper bound at every input) instead of
/// its own composition. In none of these cases is a PLD number below the RDP one reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdpFallback {
    /// A block has more than `MAX_PLD_STEPS` steps: the FFT composition's rounding error grows
    /// with the number of compositions and is not shown to stay negligible past it.
    TooManySteps,
    /// No grid spacing fits the composition in `MAX_FFT_LEN` points.
    NoGridFits,
    /// The composition's numerics lost the mass that makes δ: its tilted pmf held no mass near
    /// ε (`DiscretePld::resolves`), or its answer was not finite, or it fell below a lower
    /// bound on the true ε (`pld_bounds::lower_bound`).
    LostPrecision,
    /// The composition's answer was above the RDP bound (a coarsened grid): both are upper
    /// bounds, and the smaller one is reported.
    RdpTighter,
}

impl std::fmt::Display for RdpFallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RdpFallback::TooManySteps => {
                "more steps than the PLD composition is validated for (10^7 a block)"
            }
            RdpFallback::NoGridFits => "the loss range does not fit the PLD grid",
            RdpFallback::LostPrecision => {
                "the PLD composition lost precision (too little mass near its answer, or an \
                 answer below a lower bound on the true epsilon)"
            }
            RdpFallback::RdpTighter => "the RDP bound is tighter here (a coarsened PLD grid)",
        })
    }
}

/// Most steps one block may have for the PLD composition to run; longer histories get the RDP
/// bound (`RdpFallback::TooManySteps`). `tests/privacy/accountant.rs` checks the composition against
/// RDP and the lower bounds up to here.
pub const MAX_PLD_STEPS: u64 = 10_000_000;

/// Checks δ for the PLD accountant: 0 < δ < 1 and at least `MIN_PLD_DELTA`, below which its
/// truncations are not shown to stay negligible (the error names the RDP accountant, which
/// answers any δ).
pub fn validate_pld_delta(delta: f64) -> Result<()> {
    validate_delta(delta)?;
    if delta < MIN_PLD_DELTA {
        return Err(Error::bad_value(
            "delta",
            format!(
                "{delta:e}: the PLD accountant is accurate for delta >= {MIN_PLD_DELTA:e} \
                 (each step's loss is truncated at 12 standard deviations); use `accountant` \
                 rdp for a smaller delta"
            ),
        ));
    }
    Ok(())
}

/// The tilt λ for composing `steps` at δ: the λ of the smallest Chernoff bound
/// (Σ_b T_b log M_b(λ) − log δ) / λ on ε, tried on `TILT_RANGE`. The tilted composition's mass
/// then sits near the ε being sought (for a Gaussian sum exactly at the Chernoff bound, a few
/// standard deviations above ε), where its rounding error is relative.
fn chernoff_tilt(steps: &[(DiscretePld, u64)], delta: f64) -> f64 {
    let (low, high, factor) = TILT_RANGE;
    let log_masses: Vec<(Vec<(f64, f64)>, f64)> = steps
        .iter()
        .map(|(s, t)| (s.log_masses(), *t as f64))
        .collect();
    let bound = |lambda: f64| {
        let total: f64 = log_masses
            .iter()
            .map(|(points, t)| t * log_mgf_of(points, lambda))
            .sum();
        (total - delta.ln()) / lambda
    };
    // Start at the Gaussian optimum sqrt(2 log(1/δ) / Σ T Var) (the bound is quasi-convex in λ,
    // see `minimise_over_lambda`; each try costs one pass over each pmf).
    let variance: f64 = steps
        .iter()
        .map(|(s, t)| *t as f64 * s.finite_variance())
        .sum();
    let start = (2.0 * -delta.ln() / variance).sqrt();
    minimise_over_lambda(bound, start, (low, high), factor).0
}

/// ε of a history of step blocks: the PLD composition on the finest grid (1e-4 doubled as often
/// as needed) that fits `MAX_FFT_LEN` points, checked against the bounds of `pld_bounds`.
/// Where the composition cannot run or its answer fails a check, ε is the RDP bound and
/// `fallback` says why; the result is never below the smaller of the two upper bounds.
pub fn epsilon_detailed(blocks: &[StepBlock], delta: f64) -> Result<PldEpsilon> {
    epsilon_on_grid(blocks, delta, DEFAULT_INTERVAL)
}

/// `epsilon_detailed` with the grid spacing starting at `interval` instead of
/// `DEFAULT_INTERVAL`. Connect-the-dots on a coarser grid is still an upper bound, only a
/// looser one: calibration searches σ on a coarse grid, ten times cheaper, before it refines
/// on the default one.
pub fn epsilon_on_grid(blocks: &[StepBlock], delta: f64, interval: f64) -> Result<PldEpsilon> {
    validate_pld_delta(delta)?;
    if !(interval > 0.0 && interval.is_finite()) {
        return Err(Error::bad_value(
            "interval",
            format!("{interval}: expected a positive, finite grid spacing"),
        ));
    }
    for b in blocks {
        validate(b.sample_rate, b.noise_multiplier, b.steps)?;
    }
    if blocks.iter().any(|b| b.noise_multiplier == 0.0) {
        return Ok(PldEpsilon {
            epsilon: f64::INFINITY,
            interval,
            fallback: None,
        });
    }
    let rdp = pld_bounds::rdp_upper_bound(blocks, delta);
    let with_rdp = |interval: f64, reason: RdpFallback| PldEpsilon {
        epsilon: rdp,
        interval,
        fallback: Some(reason),
    };
    if blocks.iter().any(|b| b.steps > MAX_PLD_STEPS) {
        return Ok(with_rdp(interval, RdpFallback::TooManySteps));
    }
    let Some((pld, interval)) = composed_epsilon(blocks, delta, interval) else {
        return Ok(with_rdp(interval, RdpFallback::NoGridFits));
    };
    let lower = pld_bounds::lower_bound(blocks, delta);
    // The lower bound is found to 1e-9 relative (a bisection); a pessimistic composition is at
    // or above the truth, so an answer below it is a numerical failure.
    if !(pld.is_finite() || rdp.is_infinite()) || pld < lower - 1e-9 * lower.max(1.0) {
        return Ok(with_rdp(interval, RdpFallback::LostPrecision));
    }
    if pld > rdp {
        return Ok(with_rdp(interval, RdpFallback::RdpTighter));
    }
    Ok(PldEpsilon {
        epsilon: pld,
        interval,
        fallback: None,
    })
}

/// The PLD composition's ε and the grid spacing it used, or `None` when no spacing fits.
fn composed_epsilon(blocks: &[StepBlock], delta: f64, interval: f64) -> Option<(f64, f64)> {
    let mut interval = interval;
    // Each failed try names the factor by which the grid was too fine, so this converges in a
    // few tries; 64 doublings take the spacing from 1e-4 past any f64 loss range.
    for _ in 0..64 {
        match epsilon_at(blocks, delta, interval) {
            Ok(epsilon) => return Some((epsilon, interval)),
            Err(too_fine) => interval *= too_fine.next_power_of_two() as f64,
        }
    }
    None
}

/// ε at one grid spacing, or Err(factor) when the grid would need about `factor` times more than
/// `MAX_FFT_LEN` points (checked before anything that large is allocated).
fn epsilon_at(blocks: &[StepBlock], delta: f64, interval: f64) -> std::result::Result<f64, usize> {
    let cap = MAX_FFT_LEN as f64;
    let mut epsilon = 0.0f64;
    // The untilted mass a truncation may drop: dp_accounting's 1e-15, or a millionth of a
    // smaller δ (see the module docs).
    let tail = TAIL_MASS.min(TAIL_FRACTION * delta);
    for adjacency in [Adjacency::Remove, Adjacency::Add] {
        let z_of = |b: &StepBlock| truncation_z(b.steps, tail);
        for b in blocks {
            let (q, sigma) = (b.sample_rate, b.noise_multiplier);
            let points = one_step_points(q, sigma, adjacency, interval, z_of(b));
            if 2.0 * points > cap {
                return Err((2.0 * points / cap).ceil() as usize);
            }
        }
        let steps: Vec<(DiscretePld, u64)> = blocks
            .iter()
            .map(|b| {
                let (q, sigma) = (b.sample_rate, b.noise_multiplier);
                let step = one_step_truncated(q, sigma, adjacency, interval, z_of(b));
                (step, b.steps)
            })
            .collect();
        // The tilted window reaches further up than the untilted one (to the tilted mass's own
        // tail), so where λ* does not fit `MAX_FFT_LEN` a smaller tilt is tried before a coarser
        // grid: at λ*/4 the tilted mass at ε is still about e^{-26} of its peak at δ 1e-20
        // (Gaussian estimate), far above the FFT's 1e-16 rounding.
        let optimum = chernoff_tilt(&steps, delta);
        // A single block is read from ε = 0 up (what lies below changes no δ); blocks that are
        // convolved afterwards keep their lower tails.
        let read_from = (blocks.len() == 1).then_some(0.0);
        let mut tilted = Vec::new();
        for lambda in [optimum, optimum / 2.0, optimum / 4.0] {
            tilted = steps
                .iter()
                .map(|(step, t)| {
                    let step = step.tilted(lambda);
                    let window = step.composed_window(*t, tail, read_from);
                    (step, *t, window)
                })
                .collect::<Vec<_>>();
            if tilted.iter().all(|(_, _, w)| w.fft_len <= MAX_FFT_LEN) {
                break;
            }
        }
        let mut composed: Option<DiscretePld> = None;
        let mut total = 0usize;
        for (step, t, window) in &tilted {
            if window.fft_len > MAX_FFT_LEN {
                return Err(window.fft_len.div_ceil(MAX_FFT_LEN));
            }
            let block = step.compose_on(*t, tail, *window);
            total += block.pmf.len();
            if 2 * total > MAX_FFT_LEN {
                return Err((2 * total).div_ceil(MAX_FFT_LEN));
            }
            composed = Some(match composed {
                None => block,
                Some(c) => c.convolve(&block),
            });
        }
        let Some(composed) = composed else { continue };
        let answer = composed.epsilon(delta);
        if !composed.resolves(answer) {
            // NaN: the caller reports the RDP bound (`RdpFallback::LostPrecision`).
            return Ok(f64::NAN);
        }
        epsilon = epsilon.max(answer);
    }
    Ok(epsilon)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The FFT length is the smallest even 2^a 3^b 5^c at or above the length asked for
    /// (checked against a search of every number).
    #[test]
    fn next_fast_len_is_the_smallest_even_five_smooth_length() {
        let smooth = |mut n: usize| {
            for p in [2, 3, 5] {
                while n.is_multiple_of(p) {
                    n /= p;
                }
            }
            n == 1
        };
        for len in 0..3000 {
            let expected = (len.max(2)..).find(|&n| n % 2 == 0 && smooth(n)).unwrap();
            assert_eq!(next_fast_len(len), expected, "len {len}");
        }
        assert_eq!(next_fast_len(839_000), 839_808);
    }

    /// Repeated squaring equals exp(T log z) to the rounding of the latter (about T · 1e-16 in
    /// the phase): unit-modulus and shrinking values, T from 1 to 10^7.
    #[test]
    fn power_by_squaring_matches_the_polar_power() {
        for (re, im) in [(0.6, 0.8), (0.3, -0.2), (-0.9, 0.1), (1.0, 0.0)] {
            for exponent in [1u64, 2, 3, 250, 39_100, 10_000_000] {
                let mut values = [Complex::new(re, im)];
                power_by_squaring(&mut values, exponent);
                let values = [values[0].re, values[0].im];
                let t = exponent as f64;
                let (r, theta) = (f64::hypot(re, im).ln(), f64::atan2(im, re));
                let modulus = (t * r).exp();
                let (expected_re, expected_im) =
                    (modulus * (t * theta).cos(), modulus * (t * theta).sin());
                let tolerance = 1e-15 * t * modulus + 1e-300;
                assert!(
                    (values[0] - expected_re).abs() <= tolerance.max(4.0 * f64::EPSILON * modulus)
                        && (values[1] - expected_im).abs()
                            <= tolerance.max(4.0 * f64::EPSILON * modulus),
                    "({re}, {im})^{exponent}: {values:?} against ({expected_re}, {expected_im})"
                );
            }
        }
    }

    /// The λ search finds the minimum of a Chernoff-shaped function, (T K(λ) + c) / λ with K
    /// the Gaussian log-mgf (minimum at sqrt(2c / (T v)), value T μ + sqrt(2 c T v)), from
    /// starts far on either side.
    #[test]
    fn minimise_over_lambda_finds_a_chernoff_bound_minimum() {
        let (t, mu, v, c) = (250.0, 0.01, 0.3, 11.5);
        let f = |l: f64| (t * (mu * l + 0.5 * v * l * l) + c) / l;
        let optimum = (2.0 * c / (t * v)).sqrt();
        let minimum = t * mu + (2.0 * c * t * v).sqrt();
        for start in [1e-8, 1e-3, optimum, 50.0, 1e3] {
            let (lambda, value) = minimise_over_lambda(f, start, (1e-9, 1e4), 1.25);
            assert!(
                lambda / optimum < 1.25 && optimum / lambda < 1.25,
                "start {start}: λ {lambda}, optimum {optimum}"
            );
            assert!(
                value >= minimum && value < minimum * 1.01,
                "{value} vs {minimum}"
            );
        }
        // A minimum past the range's end is found at the end.
        let (lambda, _) = minimise_over_lambda(|l: f64| 1.0 / l, 1.0, (1e-9, 1e4), 1.25);
        assert!(lambda > 1e4 / 1.25, "{lambda}");
    }

    /// Each step keeps the z with T Φ(−z) <= the tail budget, and at most 12.
    #[test]
    fn truncation_z_spends_the_tail_budget_over_the_steps() {
        for (steps, tail) in [(1u64, 1e-15), (250, 1e-15), (10_000_000, 1e-20)] {
            let z = truncation_z(steps, tail);
            assert!(steps as f64 * normal_sf(z) <= tail, "T {steps}: z {z}");
            assert!(steps as f64 * normal_sf(z - 1e-3) > tail || z == Z_TAIL);
        }
        assert!((truncation_z(250, 1e-15) - 8.6).abs() < 0.05);
        assert_eq!(truncation_z(10_000_000, 1e-40), Z_TAIL);
    }
}
