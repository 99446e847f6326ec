//! The noise multiplier σ that reaches a target ε for given (q, steps, δ), by bisection on the
//! accountant (as Opacus's `get_noise_multiplier`, but to a relative precision of 1e-6 on σ and
//! always on the safe side: the returned σ gives ε <= target).

use super::rdp::RdpAccountant;
use super::{validate, validate_delta};
use crate::error::{Error, Result};

/// ε of `steps` steps at (σ, q) and δ, for the chosen accountant.
pub fn epsilon_for(noise_multiplier: f64, sample_rate: f64, steps: u64, delta: f64) -> Result<f64> {
    let mut accountant = RdpAccountant::default();
    accountant.step(noise_multiplier, sample_rate, steps)?;
    Ok(accountant.epsilon(delta)?.0)
}

/// Smallest σ (to 1e-6 relative) with ε(σ) <= `target_epsilon`.
pub fn noise_multiplier_for(
    target_epsilon: f64,
    sample_rate: f64,
    steps: u64,
    delta: f64,
) -> Result<f64> {
    validate(sample_rate, 1.0, steps)?;
    validate_delta(delta)?;
    if !(target_epsilon > 0.0 && target_epsilon.is_finite()) {
        return Err(Error::bad_value(
            "--target-epsilon",
            format!("{target_epsilon}: expected a positive, finite epsilon"),
        ));
    }
    let mut high = 1.0;
    while epsilon_for(high, sample_rate, steps, delta)? > target_epsilon {
        high *= 2.0;
        if high > 1e6 {
            return Err(Error::bad_value(
                "--target-epsilon",
                format!("{target_epsilon}: not reachable with any sigma below 1e6"),
            ));
        }
    }
    let mut low = 0.0;
    while high - low > 1e-6 * high {
        let mid = 0.5 * (low + high);
        if epsilon_for(mid, sample_rate, steps, delta)? > target_epsilon {
            low = mid;
        } else {
            high = mid;
        }
    }
    Ok(high)
}
