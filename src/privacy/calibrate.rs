//! The noise multiplier σ that reaches a target ε for given (q, steps, δ), by bisection on the
//! chosen accountant (as Opacus's `get_noise_multiplier`, but always on the safe side: the
//! returned σ gives ε <= target).

use super::accountant::Accountant;
use super::history::StepBlock;
use super::pld;
use super::AccountantKind;
use super::{validate, validate_delta};
use crate::error::{Error, Result};

/// The largest σ calibration tries: a target ε that needs more noise is refused.
pub const MAX_NOISE_MULTIPLIER: f64 = 1e6;

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

/// Smallest σ (to 1e-6 relative for RDP, 1e-4 for PLD) with ε(σ) <= target. PLD calibration
/// starts from RDP's σ and searches on a coarse grid before the default one
/// (`pld_noise_multiplier`).
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
    // RDP first: it is cheap, and its σ is a valid start for PLD (the PLD accountant never
    // reports more than RDP, so RDP's σ meets the target under PLD too).
    let rdp = |sigma: f64| epsilon_with(AccountantKind::Rdp, sigma, sample_rate, steps, delta);
    let rdp_sigma = match bracket_and_bisect(rdp, target_epsilon, 1e-6) {
        Ok(sigma) => sigma,
        Err(e) if kind == AccountantKind::Rdp => return Err(e),
        Err(_) => MAX_NOISE_MULTIPLIER,
    };
    match kind {
        AccountantKind::Rdp => Ok(rdp_sigma),
        AccountantKind::Pld => pld_noise_multiplier(
            target_epsilon,
            StepBlock {
                noise_multiplier: rdp_sigma,
                sample_rate,
                steps,
            },
            delta,
        ),
    }
}

/// The grid spacing of PLD calibration's search (ten times `pld::DEFAULT_INTERVAL`, ten times
/// cheaper): an upper bound like the fine grid's, only looser.
const SEARCH_INTERVAL: f64 = 10.0 * pld::DEFAULT_INTERVAL;

/// PLD calibration: a root search on the coarse `SEARCH_INTERVAL` grid from RDP's σ (`start`)
/// down to 1e-3 relative, then on the default grid, below the coarse answer (the fine grid's ε
/// is the smaller, so its σ is too), to 1e-4 relative (`regula_falsi`). Every σ it returns was evaluated on
/// the default grid, checked against its bounds (`pld::epsilon_detailed`), at or below the
/// target.
fn pld_noise_multiplier(target_epsilon: f64, start: StepBlock, delta: f64) -> Result<f64> {
    let epsilon = |sigma: f64, interval: f64| -> Result<f64> {
        let block = StepBlock {
            noise_multiplier: sigma,
            ..start
        };
        Ok(pld::epsilon_on_grid(&[block], delta, interval)?.epsilon)
    };
    let mut high = start.noise_multiplier;
    // The PLD accountant never reports more than RDP, so where RDP's σ met the target its PLD ε
    // is at most RDP's; where RDP could not reach it (σ at the search's end), PLD is asked.
    let rdp_at_start = super::pld_bounds::rdp_upper_bound(&[start], delta);
    let at_start = if rdp_at_start <= target_epsilon {
        rdp_at_start
    } else {
        epsilon(high, pld::DEFAULT_INTERVAL)?
    };
    if at_start > target_epsilon {
        return Err(Error::bad_value(
            "target_epsilon",
            format!("{target_epsilon}: not reachable with any sigma up to {high:e}"),
        ));
    }
    // Coarse: ε(high) <= target holds on the coarse grid only where it is reachable there.
    let coarse = |s: f64| epsilon(s, SEARCH_INTERVAL);
    let mut at_high = coarse(high)?;
    if at_high <= target_epsilon {
        let (mut low, mut at_low) = (0.5 * high, coarse(0.5 * high)?);
        while at_low <= target_epsilon && low > 1e-12 {
            (high, at_high) = (low, at_low);
            low *= 0.5;
            at_low = coarse(low)?;
        }
        if at_low > target_epsilon {
            high = regula_falsi(coarse, target_epsilon, (low, at_low), (high, at_high), 1e-3)?;
        }
    }
    // Fine: a bracket below the coarse answer, widened until its low end misses the target.
    // The fine grid's ε is at most the coarse one's; should a check of the fine answer have put
    // it above (`pld::RdpFallback`), the search starts again from RDP's σ, whose fine ε was
    // evaluated above.
    let fine = |s: f64| epsilon(s, pld::DEFAULT_INTERVAL);
    let mut at_high = fine(high)?;
    if at_high > target_epsilon {
        (high, at_high) = (start.noise_multiplier, at_start);
    }
    let mut width = 0.005;
    let mut low = high * (1.0 - width);
    let mut at_low = fine(low)?;
    while at_low <= target_epsilon {
        (high, at_high) = (low, at_low);
        width = (2.0 * width).min(0.5);
        low = high * (1.0 - width);
        if low < 1e-12 {
            return Ok(high);
        }
        at_low = fine(low)?;
    }
    regula_falsi(fine, target_epsilon, (low, at_low), (high, at_high), 1e-4)
}

/// The root of ε(σ) = target between `low` (ε above the target) and `high` (ε at or below it),
/// each given with its ε, by the Illinois variant of regula falsi (ε is smooth in σ, so this takes
/// a few evaluations where bisection takes a dozen). Stops when the bracket is `precision` of
/// σ wide or ε(high) is within `precision` of the target; returns `high`, whose ε meets the
/// target (it was evaluated).
fn regula_falsi(
    epsilon: impl Fn(f64) -> Result<f64>,
    target_epsilon: f64,
    (mut low, at_low): (f64, f64),
    (mut high, mut at_high): (f64, f64),
    precision: f64,
) -> Result<f64> {
    // The values the interpolation uses: Illinois halves the one at the end kept twice.
    let (mut f_low, mut f_high) = (at_low - target_epsilon, at_high - target_epsilon);
    let mut kept_low = 0u32;
    let mut kept_high = 0u32;
    for _ in 0..100 {
        if high - low <= precision * high || at_high >= target_epsilon * (1.0 - precision) {
            break;
        }
        let mut mid = low + (high - low) * f_low / (f_low - f_high);
        if !(mid > low && mid < high) {
            mid = 0.5 * (low + high);
        }
        let at_mid = epsilon(mid)?;
        if at_mid > target_epsilon {
            (low, f_low) = (mid, at_mid - target_epsilon);
            kept_high += 1;
            kept_low = 0;
            if kept_high > 1 {
                f_high *= 0.5;
            }
        } else {
            (high, at_high, f_high) = (mid, at_mid, at_mid - target_epsilon);
            kept_low += 1;
            kept_high = 0;
            if kept_low > 1 {
                f_low *= 0.5;
            }
        }
    }
    Ok(high)
}

/// The smallest σ found with ε(σ) <= target, to `precision` relative, doubling from 1 up to
/// `MAX_NOISE_MULTIPLIER` for the upper end.
fn bracket_and_bisect(
    epsilon: impl Fn(f64) -> Result<f64>,
    target_epsilon: f64,
    precision: f64,
) -> Result<f64> {
    let mut high = 1.0;
    while epsilon(high)? > target_epsilon {
        if high >= MAX_NOISE_MULTIPLIER {
            return Err(Error::bad_value(
                "target_epsilon",
                format!(
                    "{target_epsilon}: not reachable with any sigma up to \
                     {MAX_NOISE_MULTIPLIER:e} (epsilon {:.4} there)",
                    epsilon(high)?
                ),
            ));
        }
        high = (2.0 * high).min(MAX_NOISE_MULTIPLIER);
    }
    bisect(epsilon, target_epsilon, 0.0, high, precision)
}

/// Bisection on σ between `low` (ε above the target, or 0) and `high` (ε at or below it) to
/// `precision` relative; returns the upper end, whose ε meets the target.
fn bisect(
    epsilon: impl Fn(f64) -> Result<f64>,
    target_epsilon: f64,
    mut low: f64,
    mut high: f64,
    precision: f64,
) -> Result<f64> {
    while high - low > precision * high {
        let mid = 0.5 * (low + high);
        if epsilon(mid)? > target_epsilon {
            low = mid;
        } else {
            high = mid;
        }
    }
    Ok(high)
}
