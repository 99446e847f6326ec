//! Privacy calibration of Algorithm 1 (DP-SGD-Output: SGD, iterate average, then Gaussian noise)
//! after Theorem 7 of Wang et al. 2022: with probability
//! 1 - γ over SGD's index draws, the averages of two runs on neighbouring datasets (one example
//! replaced) are within Δ_SGD(γ), and Gaussian noise calibrated to sensitivity Δ_SGD(δ/2) at
//! (ε, δ/2) makes the output (ε, δ)-DP.
//!
//! Theorem 7 (unbounded domain), as the text states it:
//!
//!   Δ_SGD(γ)² = e ( c²_{α,2} T η^{2/(1-α)}
//!                   + 4 (M + L (C_α T η)^{α/2})² η² (1 + (T/n)(1 + c_{γ,T})) (T/n)(1 + c_{γ,T}) ),
//!   c_{γ,T} = max{ sqrt(3 log(n/γ) / (T/n)), 3 log(n/γ) / (T/n) }.
//!
//! The constants are not in the text; ours, derived here:
//!
//! - c_{α,2}, approximate non-expansiveness of a gradient step: for convex f with (α, L)-Hölder
//!   gradient, ⟨∇f(w) - ∇f(w'), w - w'⟩ >= (2α/(1+α)) L^(-1/α) ||∇f(w) - ∇f(w')||^((1+α)/α)
//!   (the Hölder form of co-coercivity), so with d = ||∇f(w) - ∇f(w')||,
//!   ||w - η∇f(w) - w' + η∇f(w')||² <= ||w - w'||² + max_d (η² d² - (4ηα/(1+α)) L^(-1/α)
//!   d^((1+α)/α)), and the maximum, at d = (η L^(1/α) / 2)^(α/(1-α)), is
//!   c²_{α,2} η^(2/(1-α)) with c²_{α,2} = ((1-α)/(1+α)) (2^(-α) L)^(2/(1-α)). For α = 0 this is L²
//!   (monotonicity alone, d <= L); for α = 1 the step is non-expansive when η <= 2/L and the term
//!   is 0 (we require η <= 2/L there).
//! - C_α, the iterate bound ||w_t||² <= C_α t η of SGD from w_1 = 0 (unbounded domain): by
//!   convexity ⟨w_t, ∇f(w_t)⟩ >= f(w_t) - f(0), so ||w_{t+1}||² <= ||w_t||² + 2η f(0) plus
//!   the bracket (η² ||∇f(w_t)||² - 2η f(w_t)). The self-bounding property of nonnegative convex losses
//!   with Hölder gradients, ||∇f(w)|| <= c_{α,1} f(w)^(α/(1+α)) with
//!   c_{α,1} = (1 + 1/α)^(α/(1+α)) L^(1/(1+α)), bounds the bracket by its maximum over f >= 0,
//!   2η ((1-α)/(2α)) (η c²_{α,1} α/(1+α))^((1+α)/(1-α)) <= η K_α for η <= 1, so
//!   C_α = 2 F_0 + K_α with F_0 = sup_z f(0; z) and
//!   K_α = ((1-α)/α) (c²_{α,1} α/(1+α))^((1+α)/(1-α)). α = 0: the bracket is at most η² G_0²
//!   with G_0 = M + L the bound of a hinge-type subgradient, so K_0 = G_0² (η <= 1); α = 1: the
//!   bracket is <= 0 when η c²_{1,1} = 2 η L <= 2, so K_1 = 0 (η <= 1/L).
//! - Then every gradient on the path is bounded by M + L ||w_t||^α <= M + L (C_α T η)^(α/2).
//!
//! Bounded domain (Theorem 7(b), missing from the text): projection onto B(0, R) is
//! non-expansive, so the same argument holds with the gradient bound M + L R^α in place of
//! M + L (C_α T η)^(α/2).
//!
//! The noise: the Gaussian mechanism with ℓ2 sensitivity Δ at (ε, δ/2), calibrated exactly by
//! the analytic Gaussian mechanism (Balle and Wang 2018): the smallest σ with
//! Φ(Δ/(2σ) - εσ/Δ) - e^ε Φ(-Δ/(2σ) - εσ/Δ) <= δ/2, valid for every ε (the classic
//! sqrt(2 log(1.25/δ)) Δ/ε needs ε < 1).

use super::loss::Loss;
use dpcomp::error::{Error, Result};
pub use dpcomp::privacy::analytic_gaussian::{analytic_gaussian_sigma, gaussian_delta};

/// What Theorem 7 needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutputPrivacyProblem {
    /// The loss SGD minimises (its α enters the constants).
    pub loss: Loss,
    /// n, training examples.
    pub examples: usize,
    /// T, SGD steps.
    pub steps: u64,
    /// η, SGD's step size; `sensitivity` refuses η > 1, or η > min(1, 1/L) when α = 1.
    pub step_size: f64,
    /// L, the Hölder constant for the data's feature bound.
    pub holder_constant: f64,
    /// M = sup_z ||∇f(0; z)|| for the data's feature bound.
    pub gradient_bound_at_zero: f64,
    /// F_0 = sup_z f(0; z).
    pub loss_at_zero: f64,
    /// `Some(R)`: projected SGD on B(0, R) (Theorem 7(b)); `None`: unconstrained.
    pub radius: Option<f64>,
}

impl OutputPrivacyProblem {
    fn alpha(&self) -> f64 {
        self.loss.alpha()
    }

    /// c²_{α,2}: the approximate non-expansiveness constant (0 for α = 1).
    pub fn expansiveness2(&self) -> f64 {
        let (a, l) = (self.alpha(), self.holder_constant);
        if a >= 1.0 {
            0.0
        } else {
            (1.0 - a) / (1.0 + a) * (2f64.powf(-a) * l).powf(2.0 / (1.0 - a))
        }
    }

    /// C_α of the iterate bound ||w_t||² <= C_α t η (unbounded domain, η within the limits
    /// `check` enforces).
    pub fn iterate_constant(&self) -> f64 {
        let (a, l, m) = (
            self.alpha(),
            self.holder_constant,
            self.gradient_bound_at_zero,
        );
        let k = if a <= 0.0 {
            (m + l).powi(2)
        } else if a >= 1.0 {
            0.0
        } else {
            let c1_sq = ((1.0 + 1.0 / a).powf(a / (1.0 + a)) * l.powf(1.0 / (1.0 + a))).powi(2);
            (1.0 - a) / a * (c1_sq * a / (1.0 + a)).powf((1.0 + a) / (1.0 - a))
        };
        2.0 * self.loss_at_zero + k
    }

    /// The bound of every gradient SGD evaluates.
    pub fn path_gradient_bound(&self) -> f64 {
        let (a, l, m) = (
            self.alpha(),
            self.holder_constant,
            self.gradient_bound_at_zero,
        );
        let reach = match self.radius {
            Some(r) => r,
            None => (self.iterate_constant() * self.steps as f64 * self.step_size).sqrt(),
        };
        m + l * reach.powf(a)
    }

    fn check(&self) -> Result<()> {
        if self.examples < 2 || self.steps == 0 || self.step_size.is_nan() || self.step_size <= 0.0
        {
            return Err(Error::bad_value(
                "output perturbation",
                format!(
                    "needs n >= 2, T >= 1 and eta > 0 (n {}, T {}, eta {})",
                    self.examples, self.steps, self.step_size
                ),
            ));
        }
        let a = self.alpha();
        let limit = if a >= 1.0 {
            // Non-expansive steps (η <= 2/L) and the iterate bound (η <= 1/L).
            (1.0 / self.holder_constant).min(1.0)
        } else {
            1.0
        };
        if self.step_size > limit {
            return Err(Error::bad_value(
                "step_size",
                format!(
                    "{}: Theorem 7's constants as derived here need eta <= {limit:.4} for this loss",
                    self.step_size
                ),
            ));
        }
        Ok(())
    }

    /// Δ_SGD(γ) of Theorem 7.
    pub fn sensitivity(&self, gamma: f64) -> Result<f64> {
        self.check()?;
        let n = self.examples as f64;
        let t = self.steps as f64;
        let eta = self.step_size;
        let passes = t / n;
        let log_term = 3.0 * (n / gamma).ln() / passes;
        let c = log_term.sqrt().max(log_term);
        let a = self.alpha();
        let drift = if a >= 1.0 {
            0.0
        } else {
            self.expansiveness2() * t * eta.powf(2.0 / (1.0 - a))
        };
        let g = self.path_gradient_bound();
        let replaced = 4.0 * g * g * eta * eta * (1.0 + passes * (1.0 + c)) * passes * (1.0 + c);
        Ok((std::f64::consts::E * (drift + replaced)).sqrt())
    }
}
