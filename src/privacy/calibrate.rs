//! The noise multiplier σ that reaches a target ε for given (q, steps, δ), by bisection on the
//! chosen accountant (as Opacus's `get_noise_multiplier`, but always on the safe side: the
//! returned σ gives ε <= target).

use super::accountant::Accountant;
use super::AccountantKind;
use super::{validate, validate_delta};
use crate::error::{Error, Result};

/// ε of `steps` steps at (σ, q) and δ with the RDP accountant (Opacus's).
pub fn epsilon_for(noise_multiplier: f64, sample_rate: f64, steps: u64, delta: f64) -> Result<f64> {
    epsilon_with(
        AccountantKind::Rdp,
        noise_multiplier,
        sample_rate,
        steps,
        delta,
    )
}

/// ε of `steps` steps at (σ, q) and δ with the chosen accountant.
pub fn epsilon_with(
    kind: AccountantKind,
    noise_multiplier: f64,
    sample_rate: f64,
    steps: u64,
    delta: f64,
) -> Result<f64> {
    let mut accountant = Accountant::default();
    accountant.step(noise_multiplier, sample_rate, steps)?;
    Ok(accountant.epsilon(kind, delta)?.0)
}

/// Smallest σ (to 1e-6 relative for RDP, 1e-4 for the slower PLD) with ε(σ) <= target.
pub fn noise_multiplier_for(
    kind: AccountantKind,
    target_epsilon: f64,
    sample_rate: f64,
    steps: u64,
    delta: f64,
) -> Result<f64> {
    validate(sample_rate, 1.0, steps)?;
    match kind {
        AccountantKind::Rdp => validate_delta(delta)?,
        AccountantKind::Pld => super::pld::validate_pld_delta(delta)?,
    }
    if !(target_epsilon > 0.0 && target_epsilon.is_finite()) {
        return Err(Error::bad_value(
            "target_epsilon",
            format!("{target_epsilon}: expected a positive, finite epsilon"),
        ));
    }
    let eps = |sigma: f64| epsilon_with(kind, sigma, sample_rate, steps, delta);
    let mut high = 1.0;
    while eps(high)? > target_epsilon {
        high *= 2.0;
        if high > 1e6 {
            return Err(Error::bad_value(
                "target_epsilon",
                format!("{target_epsilon}: not reachable with any sigma below 1e6"),
            ));
        }
    }
    let precision = match kind {
        AccountantKind::Rdp => 1e-6,
        AccountantKind::Pld => 1e-4,
    };
    let mut low = 0.0;
    while high - low > precision * high {
        let mid = 0.5 * (low + high);
        if eps(mid)? > target_epsilon {
            low = mid;
        } else {
            high = mid;
        }
    }
    Ok(high)
}
