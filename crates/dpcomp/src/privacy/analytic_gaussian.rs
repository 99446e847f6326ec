//! The analytic Gaussian mechanism (Balle and Wang 2018): the exact δ of a Gaussian mechanism
//! at ε, and the smallest σ that makes it (ε, δ)-DP. Used for one-shot releases (output
//! perturbation of a trained model, a private mean of the features).

use crate::error::{Error, Result};
use crate::privacy::rdp::log_erfc;

/// log Φ(x), Φ the standard normal distribution function (stable far in the lower tail).
fn log_normal_cdf(x: f64) -> f64 {
    0.5f64.ln() + log_erfc(-x / std::f64::consts::SQRT_2)
}

/// δ of the Gaussian mechanism with sensitivity `delta_f` and noise σ at ε (Balle and Wang 2018,
/// Theorem 8): Φ(Δ/(2σ) - εσ/Δ) - e^ε Φ(-Δ/(2σ) - εσ/Δ).
pub fn gaussian_delta(epsilon: f64, sigma: f64, delta_f: f64) -> f64 {
    let (a, b) = (delta_f / (2.0 * sigma), epsilon * sigma / delta_f);
    // e^ε Φ(-a - b) in log space: e^ε alone overflows for large ε.
    log_normal_cdf(a - b).exp() - (epsilon + log_normal_cdf(-a - b)).exp()
}

/// The smallest σ (to 1e-9 relative) whose Gaussian mechanism with sensitivity `delta_f` is
/// (ε, δ)-DP.
pub fn analytic_gaussian_sigma(epsilon: f64, delta: f64, delta_f: f64) -> Result<f64> {
    if !(epsilon > 0.0 && delta > 0.0 && delta < 1.0 && delta_f > 0.0) {
        return Err(Error::bad_value(
            "epsilon/delta",
            format!("epsilon {epsilon}, delta {delta}, sensitivity {delta_f}: expected positive values and delta < 1"),
        ));
    }
    let mut high = delta_f;
    while gaussian_delta(epsilon, high, delta_f) > delta {
        high *= 2.0;
    }
    let mut low = 0.0;
    while high - low > 1e-9 * high {
        let mid = 0.5 * (low + high);
        if gaussian_delta(epsilon, mid, delta_f) > delta {
            low = mid;
        } else {
            high = mid;
        }
    }
    Ok(high)
}
