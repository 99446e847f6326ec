//! Rényi-DP accountant for the Poisson-subsampled Gaussian mechanism, numerically identical to
//! Opacus's `RDPAccountant` (its `analysis/rdp.py`, from TensorFlow Privacy): Mironov, Talwar and
//! Zhang 2019, "Rényi Differential Privacy of the Sampled Gaussian Mechanism", Section 3.3 for
//! integer orders and 3.2 for fractional orders; RDP composes additively over steps
//! (Wang et al. 2022, RDP composition), and is converted to
//! (ε, δ) with Balle et al. 2020, "Hypothesis testing interpretations and Rényi differential
//! privacy", Theorem 21:
//!
//!   ε = min_α  RDP(α) + log((α − 1)/α) − (log δ + log α)/(α − 1).

/// Opacus's default orders: 1.1, 1.2, ..., 10.9, then 12, 13, ..., 63.
pub fn default_orders() -> Vec<f64> {
    let mut orders: Vec<f64> = (1..100).map(|x| 1.0 + x as f64 / 10.0).collect();
    orders.extend((12..64).map(|x| x as f64));
    orders
}

/// log(exp(a) + exp(b)) without overflow.
fn log_add(a: f64, b: f64) -> f64 {
    let (hi, lo) = if a > b { (a, b) } else { (b, a) };
    if lo == f64::NEG_INFINITY {
        return hi;
    }
    hi + (lo - hi).exp().ln_1p()
}

/// log(exp(a) − exp(b)) for a >= b.
fn log_sub(a: f64, b: f64) -> f64 {
    if b == f64::NEG_INFINITY {
        return a;
    }
    if a == b {
        return f64::NEG_INFINITY;
    }
    let d = (a - b).exp_m1();
    if d.is_infinite() {
        a
    } else {
        d.ln() + b
    }
}

/// log(erfc(x)), accurate where erfc underflows (asymptotic series past x = 26).
pub fn log_erfc(x: f64) -> f64 {
    if x < 26.0 {
        return libm::erfc(x).ln();
    }
    // erfc(x) = exp(-x^2) / (x sqrt(pi)) (1 - 1/(2x^2) + 3/(4x^4) - 15/(8x^6) + 105/(16x^8) ...)
    let r = 1.0 / (x * x);
    let series =
        1.0 - r / 2.0 + 3.0 * r * r / 4.0 - 15.0 * r.powi(3) / 8.0 + 105.0 * r.powi(4) / 16.0;
    -x * x - (x * std::f64::consts::PI.sqrt()).ln() + series.ln()
}

fn log_binomial_int(n: u64, k: u64) -> f64 {
    libm::lgamma(n as f64 + 1.0) - libm::lgamma(k as f64 + 1.0) - libm::lgamma((n - k) as f64 + 1.0)
}

/// log A_α for integer α (Mironov et al. 2019, Section 3.3):
/// A_α = Σ_{i=0}^{α} C(α, i) q^i (1 − q)^{α−i} exp((i² − i) / (2σ²)).
fn log_a_integer(q: f64, sigma: f64, alpha: u64) -> f64 {
    let mut log_a = f64::NEG_INFINITY;
    for i in 0..=alpha {
        let log_coef =
            log_binomial_int(alpha, i) + i as f64 * q.ln() + (alpha - i) as f64 * (-q).ln_1p();
        let s = log_coef + (i * i - i) as f64 / (2.0 * sigma * sigma);
        log_a = log_add(log_a, s);
    }
    log_a
}

/// log A_α for fractional α (Mironov et al. 2019, Section 3.2), the two series summed until
/// their terms fall below e^-30, as Opacus does.
fn log_a_fractional(q: f64, sigma: f64, alpha: f64) -> f64 {
    let (mut log_a0, mut log_a1) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
    let z0 = sigma * sigma * (1.0 / q - 1.0).ln() + 0.5;
    let (log_q, log_1mq) = (q.ln(), (-q).ln_1p());
    // C(α, i) = Π_{k<i} (α − k)/(k + 1), kept as log-magnitude and sign.
    let (mut log_coef, mut positive) = (0.0f64, true);
    let mut i = 0u64;
    loop {
        let (fi, j) = (i as f64, alpha - i as f64);
        let log_t0 = log_coef + fi * log_q + j * log_1mq;
        let log_t1 = log_coef + j * log_q + fi * log_1mq;
        let log_e0 = 0.5f64.ln() + log_erfc((fi - z0) / (std::f64::consts::SQRT_2 * sigma));
        let log_e1 = 0.5f64.ln() + log_erfc((z0 - j) / (std::f64::consts::SQRT_2 * sigma));
        let log_s0 = log_t0 + (fi * fi - fi) / (2.0 * sigma * sigma) + log_e0;
        let log_s1 = log_t1 + (j * j - j) / (2.0 * sigma * sigma) + log_e1;
        if positive {
            log_a0 = log_add(log_a0, log_s0);
            log_a1 = log_add(log_a1, log_s1);
        } else {
            log_a0 = log_sub(log_a0, log_s0);
            log_a1 = log_sub(log_a1, log_s1);
        }
        if log_s0.max(log_s1) < -30.0 {
            break;
        }
        let factor = (alpha - fi) / (fi + 1.0);
        positive = positive == (factor > 0.0);
        log_coef += factor.abs().ln();
        i += 1;
    }
    log_add(log_a0, log_a1)
}

/// RDP of one step of the sampled Gaussian mechanism at order α.
pub fn rdp_one_step(q: f64, sigma: f64, alpha: f64) -> f64 {
    if q == 0.0 {
        return 0.0;
    }
    if sigma == 0.0 {
        return f64::INFINITY;
    }
    if q == 1.0 {
        return alpha / (2.0 * sigma * sigma);
    }
    if alpha.is_infinite() {
        return f64::INFINITY;
    }
    let log_a = if alpha.fract() == 0.0 {
        log_a_integer(q, sigma, alpha as u64)
    } else {
        log_a_fractional(q, sigma, alpha)
    };
    log_a / (alpha - 1.0)
}

/// (ε, optimal α) from RDP values at `orders` (Balle et al. 2020, Theorem 21).
pub fn epsilon_from_rdp(orders: &[f64], rdp: &[f64], delta: f64) -> (f64, f64) {
    let mut best = (f64::INFINITY, f64::NAN);
    for (&alpha, &r) in orders.iter().zip(rdp) {
        let eps = r - (delta.ln() + alpha.ln()) / (alpha - 1.0) + ((alpha - 1.0) / alpha).ln();
        if eps < best.0 {
            best = (eps, alpha);
        }
    }
    // The conversion can go below zero for a large δ and little RDP (σ 100, one step, δ 0.1
    // gives −0.105); ε is a bound on a log-likelihood ratio's tail and never negative.
    (best.0.max(0.0), best.1)
}
