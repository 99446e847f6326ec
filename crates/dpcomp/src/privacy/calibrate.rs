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

/// The most steps, up to `block.steps`, that `block`'s (σ, q) can take with ε at δ within
/// `target_epsilon` on the `kind` accountant: the budget of a training whose σ is given and whose
/// target ε stops it early (`PrivacyEngineBuilder` with both). ε grows with the steps, so one
/// bisection, after a first check that the whole length fits (the usual case, one evaluation).
/// 0 when not even one step fits (σ = 0 among them: its ε is infinite).
pub fn steps_within_epsilon(
    block: StepBlock,
    kind: AccountantKind,
    target_epsilon: f64,
    delta: f64,
) -> Result<u64> {
    if !(target_epsilon > 0.0 && target_epsilon.is_finite()) {
        return Err(Error::bad_value(
            "target_epsilon",
            format!("{target_epsilon}: expected a positive, finite epsilon"),
        ));
    }
    let fits = |steps: u64| -> Result<bool> {
        if steps == 0 {
            return Ok(true);
        }
        let epsilon = epsilon_with(
            kind,
            block.noise_multiplier,
            block.sample_rate,
            steps,
            delta,
        )?;
        Ok(epsilon <= target_epsilon)
    };
    if fits(block.steps)? {
        return Ok(block.steps);
    }
    let (mut lo, mut hi) = (0u64, block.steps); // fits(lo), !fits(hi)
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
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

/// PLD calibration: a descent on the coarse `SEARCH_INTERVAL` grid from RDP's σ (`start`) to
/// 1e-3 relative, then on the default grid from the coarse answer (the fine grid's ε is the
/// smaller, so its σ is too) to 1e-4 relative, reusing the coarse slope (`descend`). Every σ it
/// returns was evaluated on the default grid, checked against its bounds
/// (`pld::epsilon_detailed`), at or below the target.
fn pld_noise_multiplier(target_epsilon: f64, start: StepBlock, delta: f64) -> Result<f64> {
    let epsilon = |sigma: f64, interval: f64| -> Result<f64> {
        let block = StepBlock {
            noise_multiplier: sigma,
            ..start
        };
        Ok(pld::epsilon_on_grid(&[block], delta, interval)?.epsilon)
    };
    let high = start.noise_multiplier;
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
    let mut found = Descent {
        sigma: high,
        epsilon: coarse(high)?,
        slope: None,
    };
    if found.epsilon <= target_epsilon {
        found = descend(coarse, target_epsilon, found, 1e-3)?;
    }
    // Fine: from the coarse answer, whose fine ε is at most its coarse one. Should a check of
    // the fine answer have put it above (`pld::RdpFallback`), the descent starts again from
    // RDP's σ, whose ε was evaluated above.
    let fine = |s: f64| epsilon(s, pld::DEFAULT_INTERVAL);
    let at_found = fine(found.sigma)?;
    let from = if at_found <= target_epsilon {
        Descent {
            epsilon: at_found,
            ..found
        }
    } else {
        Descent {
            sigma: start.noise_multiplier,
            epsilon: at_start,
            slope: None,
        }
    };
    Ok(descend(fine, target_epsilon, from, 1e-4)?.sigma)
}

/// A σ whose ε was evaluated at or below the target, and the log-log slope d log ε / d log σ
/// where it is known.
#[derive(Debug, Clone, Copy)]
struct Descent {
    sigma: f64,
    epsilon: f64,
    slope: Option<f64>,
}

/// From `from` (ε at or below the target) down to the smallest σ with ε(σ) <= target, to
/// `precision`: done when ε is within `precision` of the target or the bracket is `precision`
/// of σ wide. Secant steps on log ε against log σ (nearly a line: ε falls about as σ^-2.5 to
/// σ^-3 in the cases of `benches/calibration_vs_opacus.py`) aim just below the target, starting
/// from `from.slope` (the coarse grid's, in the fine search) or a slope of −3; a step that
/// overshoots brackets the root, and `regula_falsi` finishes. With the coarse slope the fine
/// search usually ends after one evaluation.
fn descend(
    epsilon: impl Fn(f64) -> Result<f64>,
    target_epsilon: f64,
    from: Descent,
    precision: f64,
) -> Result<Descent> {
    let aim = target_epsilon * (1.0 - precision / 2.0);
    let log_slope = |a: &Descent, b_sigma: f64, b_epsilon: f64| {
        (b_epsilon.ln() - a.epsilon.ln()) / (b_sigma.ln() - a.sigma.ln())
    };
    let mut at = from;
    for _ in 0..8 {
        if at.epsilon >= target_epsilon * (1.0 - precision) {
            return Ok(at);
        }
        let slope = match at.slope {
            Some(slope) if slope < 0.0 && slope.is_finite() => slope,
            _ => -3.0,
        };
        let guess = at.sigma * ((aim.ln() - at.epsilon.max(f64::MIN_POSITIVE).ln()) / slope).exp();
        // At least a quarter of the precision below σ and at most halving it per step.
        let next = guess.clamp(0.5 * at.sigma, at.sigma * (1.0 - precision / 4.0));
        let at_next = epsilon(next)?;
        if at_next > target_epsilon {
            return regula_falsi(epsilon, target_epsilon, (next, at_next), at, precision);
        }
        at = Descent {
            sigma: next,
            epsilon: at_next,
            slope: Some(log_slope(&at, next, at_next)),
        };
        if next < 1e-12 {
            return Ok(at);
        }
    }
    // Not converging by secant steps: halve σ until it misses the target, then bracket.
    loop {
        let next = 0.5 * at.sigma;
        if next < 1e-12 {
            return Ok(at);
        }
        let at_next = epsilon(next)?;
        if at_next > target_epsilon {
            return regula_falsi(epsilon, target_epsilon, (next, at_next), at, precision);
        }
        at = Descent {
            sigma: next,
            epsilon: at_next,
            slope: Some(log_slope(&at, next, at_next)),
        };
    }
}

/// The root of ε(σ) = target between `low` (ε above the target) and `high` (ε at or below it),
/// each given with its ε, by the Illinois variant of regula falsi (ε is smooth in σ, so this takes
/// a few evaluations where bisection takes a dozen). Stops when the bracket is `precision` of
/// σ wide or ε(high) is within `precision` of the target; returns `high`, whose ε meets the
/// target (it was evaluated), with the bracket's slope.
fn regula_falsi(
    epsilon: impl Fn(f64) -> Result<f64>,
    target_epsilon: f64,
    (mut low, mut at_low): (f64, f64),
    high: Descent,
    precision: f64,
) -> Result<Descent> {
    let (mut high, mut at_high) = (high.sigma, high.epsilon);
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
            (low, at_low, f_low) = (mid, at_mid, at_mid - target_epsilon);
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
    Ok(Descent {
        sigma: high,
        epsilon: at_high,
        slope: Some((at_high.ln() - at_low.ln()) / (high.ln() - low.ln())),
    })
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
