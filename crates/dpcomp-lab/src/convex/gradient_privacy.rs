//! Privacy calibration of Algorithm 2 (DP-SGD-Gradient: projected SGD on B(0, R), one example
//! drawn uniformly per step, N(0, σ² I) added to its gradient), after Theorem 11 of
//! Wang et al. 2022, with the constants as reconstructed here (the paper leaves some implicit):
//!
//! - On B(0, R) every gradient is bounded by G = M + L R^α, so replacing one example changes a
//!   step's gradient by at most Δ = 2 G (ℓ2 sensitivity).
//! - Lemma 3 (subsampled Gaussian RDP, sampling rate p = 1/n; Wang, Balle and Kasiviswanathan
//!   2019): if σ² >= 0.67 Δ² (condition 32) and
//!   λ - 1 <= (2/3) (σ²/Δ²) log(1 / (p λ (1 + σ²/Δ²))) (condition 33), a step is
//!   (λ, 3.5 p² λ Δ² / σ²)-RDP.
//! - Theorem 11: for β in (0, 1) take λ = log(1/δ) / ((1 - β) ε) + 1 and
//!   σ² = 14 G² T λ / (β n² ε). Then each step is (λ, β ε / T)-RDP
//!   (3.5 λ 4 G² / (n² σ²) = β ε / T), T steps compose to (λ, β ε), and Lemma 5 turns that into
//!   (β ε + log(1/δ) / (λ - 1), δ) = (ε, δ)-DP.
//! - β: every β in (0, 1) for which (32) and (33) hold is feasible; the paper takes the feasible
//!   β closest to 1/2 (the noise σ² ∝ λ / β is smallest near there). Lemma 3 is stated for
//!   integer orders, so (33) is also checked at ⌈λ⌉. The search scans a fine grid
//!   (log-spaced near 0, where feasible β usually lie for realistic n and ε, and linear up to 1).
//! - Lemma 13: for T = n and δ = 1/n², n >= 18, ε >= (7 (n^(1/3) - 1) + 4 log(n) n + 7) /
//!   (2 n (n^(1/3) - 1)) is sufficient for a feasible β to exist (`lemma13_sufficient`).
//!
//! The calibration is checked independently with the project's RDP accountant
//! (`privacy::calibrate::epsilon_for` with sampling rate 1/n, T steps and noise multiplier
//! σ / Δ): it must report ε at most the target. That accountant analyses Poisson subsampling under
//! add/remove neighbours with sensitivity 1 per example; noise multiplier σ / Δ with Δ the
//! replace-one sensitivity 2 G is the conservative mapping (an add/remove change moves the sum by
//! at most G <= Δ).

use dpcomp::error::{Error, Result};

/// The inputs of Theorem 11.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradientPrivacyProblem {
    /// n, training examples.
    pub examples: usize,
    /// T, SGD steps.
    pub steps: u64,
    /// Target ε of the training, > 0.
    pub epsilon: f64,
    /// Target δ of the training, in (0, 1).
    pub delta: f64,
    /// G = M + L R^α, the bound of every gradient on B(0, R).
    pub gradient_bound: f64,
}

/// A feasible calibration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradientCalibration {
    /// β in (0, 1): the share of ε spent by the T RDP steps (the rest converts RDP to (ε, δ)).
    pub beta: f64,
    /// λ, the Rényi order.
    pub lambda: f64,
    /// σ, the standard deviation of the noise added to every gradient coordinate.
    pub sigma: f64,
    /// Δ = 2 G.
    pub sensitivity: f64,
}

impl GradientPrivacyProblem {
    fn check(&self) -> Result<()> {
        if self.examples < 2 || self.steps == 0 {
            return Err(Error::bad_value(
                "gradient perturbation",
                format!(
                    "needs n >= 2 examples and T >= 1 steps (n {}, T {})",
                    self.examples, self.steps
                ),
            ));
        }
        if !(self.epsilon > 0.0 && self.delta > 0.0 && self.delta < 1.0) {
            return Err(Error::bad_value(
                "epsilon/delta",
                format!(
                    "epsilon {} and delta {}: expected epsilon > 0 and 0 < delta < 1",
                    self.epsilon, self.delta
                ),
            ));
        }
        if !(self.gradient_bound > 0.0 && self.gradient_bound.is_finite()) {
            return Err(Error::bad_value(
                "gradient bound",
                format!("{}: expected a positive number", self.gradient_bound),
            ));
        }
        Ok(())
    }

    /// λ(β) = log(1/δ) / ((1 - β) ε) + 1.
    pub fn lambda(&self, beta: f64) -> f64 {
        (1.0 / self.delta).ln() / ((1.0 - beta) * self.epsilon) + 1.0
    }

    /// σ²(β) = 14 G² T λ / (β n² ε).
    pub fn sigma2(&self, beta: f64) -> f64 {
        let n = self.examples as f64;
        14.0 * self.gradient_bound.powi(2) * self.steps as f64 * self.lambda(beta)
            / (beta * n * n * self.epsilon)
    }

    /// Conditions (32) and (33) of Theorem 11 at β, (33) also at ⌈λ⌉.
    pub fn feasible(&self, beta: f64) -> bool {
        if !(beta > 0.0 && beta < 1.0) {
            return false;
        }
        let delta2 = (2.0 * self.gradient_bound).powi(2);
        let ratio = self.sigma2(beta) / delta2; // σ² / Δ²
        let n = self.examples as f64;
        let condition_33 = |lambda: f64| {
            let log_term = (n / (lambda * (1.0 + ratio))).ln();
            lambda - 1.0 <= (2.0 / 3.0) * ratio * log_term
        };
        let lambda = self.lambda(beta);
        ratio >= 0.67 && condition_33(lambda) && condition_33(lambda.ceil())
    }

    /// The feasible β closest to 1/2 (on the search grid), with its λ and σ; an error naming the
    /// problem when no β in (0, 1) is feasible.
    pub fn calibrate(&self) -> Result<GradientCalibration> {
        self.check()?;
        let best = beta_grid()
            .into_iter()
            .filter(|&b| self.feasible(b))
            .min_by(|a, b| (a - 0.5).abs().total_cmp(&(b - 0.5).abs()));
        match best {
            Some(beta) => Ok(GradientCalibration {
                beta,
                lambda: self.lambda(beta),
                sigma: self.sigma2(beta).sqrt(),
                sensitivity: 2.0 * self.gradient_bound,
            }),
            None => Err(Error::bad_value(
                "epsilon",
                format!(
                    "no feasible beta in (0, 1) for n {}, T {}, epsilon {}, delta {:e}: Theorem 11's conditions (32)-(33) fail everywhere (raise epsilon, n or delta)",
                    self.examples, self.steps, self.epsilon, self.delta
                ),
            )),
        }
    }
}

impl GradientPrivacyProblem {
    /// Whether some β of the search grid is feasible (what `calibrate` needs).
    pub fn has_feasible_beta(&self) -> bool {
        self.check().is_ok() && beta_grid().into_iter().any(|b| self.feasible(b))
    }

    /// The smallest ε above this problem's, at most `up_to`, for which a β is feasible at the
    /// same n, T and δ, rounded up to three significant digits (what to ask for when
    /// `calibrate` finds none); `None` when there is none up to `up_to`. Scans ε upwards by
    /// factors of 10^(1/40), then bisects between the last infeasible and first feasible ε.
    pub fn smallest_feasible_epsilon(&self, up_to: f64) -> Option<f64> {
        let at = |epsilon: f64| GradientPrivacyProblem { epsilon, ..*self };
        if !(self.epsilon > 0.0 && self.epsilon.is_finite()) {
            return None;
        }
        let step = 10f64.powf(1.0 / 40.0);
        let (mut low, mut high) = (self.epsilon, self.epsilon);
        while !at(high).has_feasible_beta() {
            low = high;
            high *= step;
            if high > up_to {
                return None;
            }
        }
        if high == self.epsilon {
            return Some(high);
        }
        for _ in 0..40 {
            let mid = 0.5 * (low + high);
            if at(mid).has_feasible_beta() {
                high = mid;
            } else {
                low = mid;
            }
        }
        let scale = 10f64.powf(high.log10().floor() - 2.0);
        let rounded = (high / scale).ceil() * scale;
        Some(if at(rounded).has_feasible_beta() {
            rounded
        } else {
            high
        })
    }
}

/// β candidates: 2000 log-spaced in [1e-8, 1e-2] and 1000 linear in (0.01, 1).
fn beta_grid() -> Vec<f64> {
    let log: Vec<f64> = (0..2000)
        .map(|i| 10f64.powf(-8.0 + 6.0 * i as f64 / 1999.0))
        .collect();
    let linear = (1..1000).map(|i| 0.01 + 0.99 * i as f64 / 1000.0);
    log.into_iter().chain(linear).collect()
}

/// Lemma 13's sufficient condition for T = n and δ = 1/n² (n >= 18).
pub fn lemma13_sufficient(n: usize, epsilon: f64) -> bool {
    let nf = n as f64;
    let c = nf.cbrt() - 1.0;
    n >= 18 && epsilon >= (7.0 * c + 4.0 * nf.ln() * nf + 7.0) / (2.0 * nf * c)
}
