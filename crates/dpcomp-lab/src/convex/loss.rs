//! Convex losses of a linear model w on examples (x, y), y in {-1, +1}, with their gradients
//! (a subgradient at kinks) and the constants the paper's calibrations need
//! (Wang et al. 2022, section 2):
//!
//! - α and L of α-Hölder continuous gradients, ||∇f(w; z) - ∇f(w'; z)|| <= L ||w - w'||^α for
//!   all w, w' and every example z of the data;
//! - M = sup_z ||∇f(0; z)||, so that on B(0, R) every gradient is bounded by M + L R^α.
//!
//! With m = y wᵀx the margin and X = max_i ||x_i|| over the data:
//!
//! | loss | f | ∇f | α | L | M |
//! |---|---|---|---|---|---|
//! | hinge | (1 - m)₊ | -y x 1\[m < 1\] | 0 | X | X |
//! | q-norm hinge, q in (1, 2] | (1 - m)₊^q | -q y x (1 - m)₊^(q-1) | q - 1 | q X^q | q X |
//! | logistic | log(1 + e^(-m)) | -y x / (1 + e^m) | 1 | X² / 4 | X / 2 |
//! | least squares | ½ (wᵀx - y)² | (wᵀx - y) x | 1 | X² | X (|y| = 1) |
//!
//! Derivations. Hinge: two subgradients at the same x are 0 or -y x, so they differ by at most
//! ||x|| (α = 0 means a bounded difference). q-hinge: t ↦ t₊^α is α-Hölder with constant 1 for
//! α in (0, 1], so q ||x|| |(1 - m)₊^α - (1 - m')₊^α| <= q ||x|| |m - m'|^α <= q ||x|| (||x||
//! ||w - w'||)^α = q ||x||^(1+α) ||w - w'||^α. Logistic: the Hessian is σ(m)(1 - σ(m)) x xᵀ with
//! σ(1 - σ) <= 1/4. Least squares: the Hessian is x xᵀ. At w = 0 the margins are 0: hinge and
//! q-hinge are on their sloped part ((1 - 0)₊^(q-1) = 1), logistic's slope is 1/2, least squares'
//! residual is -y.

use dpcomp::error::{Error, Result};
use tch::Tensor;

/// A convex loss of the margin y wᵀx (or of the residual wᵀx - y), with the constants of the
/// table above.
///
/// ```
/// use dpcomp_lab::convex::loss::Loss;
/// let loss = Loss::parse("qhinge:1.5")?;
/// assert_eq!(loss.name(), "qhinge:1.5");
/// // α = q - 1 and L = q X^q: for features in the unit ball, L = 1.5.
/// assert_eq!((loss.alpha(), loss.holder_constant(1.0)), (0.5, 1.5));
/// assert!(Loss::parse("qhinge:3").is_err());
/// # Ok::<(), dpcomp::error::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Loss {
    /// (1 - y wᵀx)₊: α = 0 (subgradients only).
    Hinge,
    /// (1 - y wᵀx)₊^q, q in (1, 2].
    QHinge(f64),
    /// log(1 + e^(-y wᵀx)): α = 1.
    Logistic,
    /// ½ (wᵀx - y)²: α = 1.
    LeastSquares,
}

impl Loss {
    /// `hinge`, `qhinge:Q` (1 < Q <= 2), `logistic` or `least_squares`.
    pub fn parse(text: &str) -> Result<Loss> {
        match text {
            "hinge" => Ok(Loss::Hinge),
            "logistic" => Ok(Loss::Logistic),
            "least_squares" | "least-squares" => Ok(Loss::LeastSquares),
            _ => {
                let q: Option<f64> = text.strip_prefix("qhinge:").and_then(|q| q.parse().ok());
                match q {
                    Some(q) if q > 1.0 && q <= 2.0 => Ok(Loss::QHinge(q)),
                    _ => Err(Error::bad_value(
                        "loss",
                        format!(
                            "{text:?}: expected hinge, qhinge:Q with 1 < Q <= 2, logistic or least_squares"
                        ),
                    )),
                }
            }
        }
    }

    /// The name `parse` reads back: `hinge`, `qhinge:Q`, `logistic` or `least_squares`.
    pub fn name(&self) -> String {
        match self {
            Loss::Hinge => "hinge".into(),
            Loss::QHinge(q) => format!("qhinge:{q}"),
            Loss::Logistic => "logistic".into(),
            Loss::LeastSquares => "least_squares".into(),
        }
    }

    /// α of the Hölder continuity of the gradient.
    pub fn alpha(&self) -> f64 {
        match self {
            Loss::Hinge => 0.0,
            Loss::QHinge(q) => q - 1.0,
            Loss::Logistic | Loss::LeastSquares => 1.0,
        }
    }

    /// The Hölder constant L for features of norm at most `max_norm` (X).
    pub fn holder_constant(&self, max_norm: f64) -> f64 {
        match self {
            Loss::Hinge => max_norm,
            Loss::QHinge(q) => q * max_norm.powf(*q),
            Loss::Logistic => max_norm * max_norm / 4.0,
            Loss::LeastSquares => max_norm * max_norm,
        }
    }

    /// M = sup_z ||∇f(0; z)|| for features of norm at most X and labels ±1.
    pub fn gradient_bound_at_zero(&self, max_norm: f64) -> f64 {
        match self {
            Loss::Hinge | Loss::LeastSquares => max_norm,
            Loss::QHinge(q) => q * max_norm,
            Loss::Logistic => max_norm / 2.0,
        }
    }

    /// F_0 = sup_z f(0; z): every margin is 0 at w = 0 (least squares: ½ y² = ½).
    pub fn value_at_zero(&self) -> f64 {
        match self {
            Loss::Hinge | Loss::QHinge(_) => 1.0,
            Loss::Logistic => std::f64::consts::LN_2,
            Loss::LeastSquares => 0.5,
        }
    }

    /// Per-example losses f(w; x_i, y_i), \[n\]; `x` [n, d], `y` \[n\] of ±1, `w` \[d\].
    pub fn values(&self, w: &Tensor, x: &Tensor, y: &Tensor) -> Tensor {
        let scores = x.mv(w);
        let margins = &scores * y;
        match self {
            Loss::Hinge => (margins.neg() + 1.0).clamp_min(0.0),
            Loss::QHinge(q) => (margins.neg() + 1.0).clamp_min(0.0).pow_tensor_scalar(*q),
            // log(1 + e^(-m)) = softplus(-m), stable for large |m|.
            Loss::Logistic => margins.neg().softplus(),
            Loss::LeastSquares => (scores - y).square() * 0.5,
        }
    }

    /// Per-example gradients ∇f(w; x_i, y_i), [n, d] (the subgradient 0 at the hinge's kink).
    pub fn gradients(&self, w: &Tensor, x: &Tensor, y: &Tensor) -> Tensor {
        x * self.slopes(w, x, y).unsqueeze(1)
    }

    /// The mean gradient (1/n) Σ_i ∇f(w; x_i, y_i), \[d\].
    pub fn mean_gradient(&self, w: &Tensor, x: &Tensor, y: &Tensor) -> Tensor {
        x.tr().mv(&self.slopes(w, x, y)) / x.size()[0] as f64
    }

    /// s_i with ∇f(w; x_i, y_i) = s_i x_i: every loss here is a function of wᵀx.
    fn slopes(&self, w: &Tensor, x: &Tensor, y: &Tensor) -> Tensor {
        self.slopes_from_scores(&x.mv(w), y)
    }

    /// The slopes s_i from the scores wᵀx_i (rows may come from different w, as in SGD run for
    /// several seeds at once).
    pub fn slopes_from_scores(&self, scores: &Tensor, y: &Tensor) -> Tensor {
        let margins = scores * y;
        match self {
            Loss::Hinge => -(margins.lt(1.0).to_kind(scores.kind())) * y,
            Loss::QHinge(q) => {
                -(margins.neg() + 1.0)
                    .clamp_min(0.0)
                    .pow_tensor_scalar(q - 1.0)
                    * *q
                    * y
            }
            Loss::Logistic => -(margins.neg().sigmoid()) * y,
            Loss::LeastSquares => scores - y,
        }
    }
}
