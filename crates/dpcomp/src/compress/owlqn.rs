//! Basis Pursuit Denoising, min_s ½‖A s − y‖² + λ‖s‖₁ (eq. (4) of
//! Kerkouche, Ács, Castelluccia, Genevès, "Compression Boosts Differentially Private Federated Learning", 2021), solved for many independent problems at once:
//! the rows of s [P, L] are FL-CS's chunks, each with its own measurements y [P, M] and λ [P, 1].
//! Every scalar of the solvers (dot products, step sizes, line-search acceptance) is per row, so
//! the rows are solved independently, only batched on the tensors' device.
//!
//! `owlqn` is the Orthant-Wise Limited-memory Quasi-Newton method of Andrew and Gao (2007,
//! "Scalable training of L1-regularized log-linear models", Algorithm 1): the L1 term's
//! pseudo-gradient, the L-BFGS two-loop recursion on the smooth part's curvature pairs, the
//! direction constrained to the pseudo-gradient's orthant, a backtracking line search whose
//! points are projected onto the orthant of the current point, and curvature pairs from the
//! smooth gradients only. `fista` (Beck and Teboulle 2009) is the simple reference it is tested
//! against.
//!
//! Host reads: `owlqn` is the one part of a training step that reads from the device,
//! by design. Each iteration's line search gathers the rows still searching and the rows that
//! accepted a point (`host::nonzero`, twice per backtrack), and the iteration loop stops when
//! every row has stalled twice (`host::i64_scalar`): about 2 + 2 x backtracks reads per
//! iteration, a few hundred per FL-CS decode. Running it sync-free would mean a fixed number of
//! iterations and backtracks with masked updates, which changes the solver's results; FL-CS
//! (`--compressor fl-cs`) is therefore the exception to a step without host reads. FISTA reads
//! nothing.

use crate::host;
use std::collections::VecDeque;
use tch::{Kind, Tensor};

/// A linear measurement operator applied row by row: s [P, L] -> A s [P, M], and its adjoint.
/// The same A for every row, so it applies to any subset of the rows (`owlqn`'s line search
/// measures only the rows still searching).
pub trait Measurement {
    /// A s: signals [P, L] to their measurements [P, M], row by row.
    fn apply(&self, s: &Tensor) -> Tensor;
    /// Aᵀ r: measurement-space vectors [P, M] back to signal space [P, L], row by row.
    fn adjoint(&self, r: &Tensor) -> Tensor;
}

/// Stopping rule and memory of `owlqn`. `Default`: memory 10, 100 iterations, tolerance 1e-6.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OwlqnSettings {
    /// Curvature pairs kept (L-BFGS memory).
    pub memory: usize,
    /// Most iterations run (each one quasi-Newton direction and its line search).
    pub max_iterations: usize,
    /// Stop when every row's objective decreased by less than this fraction in one iteration.
    pub tolerance: f64,
}

impl Default for OwlqnSettings {
    fn default() -> Self {
        OwlqnSettings {
            memory: 10,
            max_iterations: 100,
            tolerance: 1e-6,
        }
    }
}

/// What `owlqn` and `fista` return: the minimiser of every row and what it cost.
#[derive(Debug)]
pub struct Solution {
    /// s [P, L].
    pub s: Tensor,
    /// Objective of each row \[P\].
    pub objective: Tensor,
    /// Iterations run (at most `OwlqnSettings::max_iterations`; FISTA's, as asked).
    pub iterations: usize,
    /// Objective evaluations (each one application of A, to every row at the start and to the
    /// rows still searching in a line-search trial).
    pub evaluations: usize,
}

/// `a` where `condition` holds, else `b` (elementwise, broadcasting).
fn select(condition: &Tensor, a: &Tensor, b: &Tensor) -> Tensor {
    a.where_self(condition, b)
}

/// aᵀb per row, [P, 1] (one fused pass over both, no product tensor).
fn row_dot(a: &Tensor, b: &Tensor) -> Tensor {
    Tensor::linalg_vecdot(a, b, 1).unsqueeze(1)
}

/// The residual A s − y [P, M] and the objective [P, 1] of s.
fn residual_and_objective(
    op: &dyn Measurement,
    s: &Tensor,
    y: &Tensor,
    lambda: &Tensor,
) -> (Tensor, Tensor) {
    let residual = op.apply(s) - y;
    let objective = row_dot(&residual, &residual) * 0.5
        + lambda * s.abs().sum_dim_intlist([1i64].as_slice(), true, s.kind());
    (residual, objective)
}

/// Objective [P, 1] and the smooth part's gradient Aᵀ(A s − y) [P, L].
fn evaluate(op: &dyn Measurement, s: &Tensor, y: &Tensor, lambda: &Tensor) -> (Tensor, Tensor) {
    let (residual, objective) = residual_and_objective(op, s, y, lambda);
    (objective, op.adjoint(&residual))
}

/// The objective of every row \[P\] (for reports and tests).
pub fn objective(op: &dyn Measurement, s: &Tensor, y: &Tensor, lambda: &Tensor) -> Tensor {
    evaluate(op, s, y, lambda).0.squeeze_dim(1)
}

/// The pseudo-gradient of f + λ‖·‖₁ (Andrew and Gao, eq. (4)): the gradient of the smooth part
/// plus λ sign(s) where s ≠ 0; at s = 0 the one-sided derivative that decreases f, or 0 when
/// neither side does (0 is then optimal in that coordinate).
fn pseudo_gradient(s: &Tensor, grad: &Tensor, lambda: &Tensor) -> Tensor {
    let right = grad + lambda;
    let left = grad - lambda;
    let at_zero = select(
        &right.lt(0.0),
        &right,
        &select(&left.gt(0.0), &left, &grad.zeros_like()),
    );
    select(&s.ne(0.0), &(grad + lambda * s.sign()), &at_zero)
}

/// -H g by the L-BFGS two-loop recursion, per row. Pairs with ρ = 0 (no positive curvature in
/// that row) contribute nothing; the initial scaling is sᵀy / yᵀy of the newest pair.
fn two_loop(g: &Tensor, pairs: &VecDeque<(Tensor, Tensor, Tensor)>) -> Tensor {
    // A copy: the updates below are in place and `g` must stay the pseudo-gradient.
    let mut q = g.copy();
    let mut alphas = Vec::with_capacity(pairs.len());
    for (s, y, rho) in pairs.iter().rev() {
        let alpha = rho * row_dot(s, &q);
        // q -= α y, in place without a temporary (addcmul_: q += t₁ t₂).
        let _ = q.addcmul_(&(-&alpha), y);
        alphas.push(alpha);
    }
    if let Some((s, y, rho)) = pairs.back() {
        let yy = row_dot(y, y);
        let gamma = select(
            &rho.gt(0.0),
            &(row_dot(s, y) / yy.clamp_min(1e-300)),
            &yy.ones_like(),
        );
        q *= gamma;
    }
    for ((s, y, rho), alpha) in pairs.iter().zip(alphas.into_iter().rev()) {
        let beta = rho * row_dot(y, &q);
        let _ = q.addcmul_(&(alpha - beta), s);
    }
    -q
}

/// OWL-QN from s = 0 on every row (Andrew and Gao 2007, Algorithm 1). Reads from the device
/// in every iteration (module docs: FL-CS is the exception to a step without host reads).
pub fn owlqn(
    op: &dyn Measurement,
    y: &Tensor,
    lambda: &Tensor,
    length: i64,
    settings: &OwlqnSettings,
) -> Solution {
    let rows = y.size()[0];
    let (kind, device) = (y.kind(), y.device());
    let mut s = Tensor::zeros([rows, length], (kind, device));
    let (mut residual, mut f) = residual_and_objective(op, &s, y, lambda);
    let mut grad = op.adjoint(&residual);
    let mut pairs: VecDeque<(Tensor, Tensor, Tensor)> = VecDeque::new();
    let mut iterations = 0;
    let mut stalled_before = false;
    let mut evaluations = 1;
    const ARMIJO: f64 = 1e-4;
    const BACKTRACKS: i32 = 30;
    while iterations < settings.max_iterations {
        iterations += 1;
        let pg = pseudo_gradient(&s, &grad, lambda);
        // Quasi-Newton direction, zeroed where it does not descend along -pg.
        let direction = two_loop(&pg, &pairs);
        let direction = select(
            &(&direction * &pg).lt(0.0),
            &direction,
            &direction.zeros_like(),
        );
        // The orthant to stay in: the sign of s, or of -pg where s is 0.
        let orthant = select(&s.ne(0.0), &s.sign(), &(-&pg).sign());
        // Backtracking, per row: accept the first step 1, ½, ¼, ... whose projected point
        // satisfies Armijo's condition on the pseudo-gradient; rows that never do keep their
        // point. A row whose predicted decrease -pgᵀd is below the objective's rounding error
        // cannot pass the test in floating point: it is accepted where it is (no backtracking).
        // Every row still searching has the same step, so each trial measures only those rows
        // (A is the same for every row), and the accepted point's residual gives its gradient
        // with one adjoint: per iteration one application of A to the rows still searching per
        // trial, and one Aᵀ.
        let rounding = if kind == Kind::Double { 1e-14 } else { 1e-6 };
        let predicted = -row_dot(&pg, &direction);
        let mut searching = predicted.gt_tensor(&(f.abs() * rounding)).squeeze_dim(1);
        let mut s_next = s.copy();
        let mut residual_next = residual.copy();
        let mut f_next = f.copy();
        for backtrack in 0..BACKTRACKS {
            let rows_searching = host::nonzero(&searching).squeeze_dim(1);
            if rows_searching.numel() == 0 {
                break;
            }
            let step = 0.5f64.powi(backtrack);
            let every_row = rows_searching.numel() as i64 == rows;
            let at = |t: &Tensor| {
                if every_row {
                    t.shallow_clone()
                } else {
                    t.index_select(0, &rows_searching)
                }
            };
            let (s_rows, pg_rows, f_rows) = (at(&s), at(&pg), at(&f));
            let trial = &s_rows + at(&direction) * step;
            let trial = select(
                &(trial.sign() * at(&orthant)).gt(0.0),
                &trial,
                &trial.zeros_like(),
            );
            let (r_trial, f_trial) = residual_and_objective(op, &trial, &at(y), &at(lambda));
            evaluations += 1;
            let ok = f_trial
                .le_tensor(&(&f_rows + row_dot(&pg_rows, &(&trial - &s_rows)) * ARMIJO))
                .squeeze_dim(1);
            let ok_rows = host::nonzero(&ok).squeeze_dim(1);
            if ok_rows.numel() > 0 {
                let index = rows_searching.index_select(0, &ok_rows);
                let pick = |t: &Tensor| t.index_select(0, &ok_rows);
                let _ = s_next.index_copy_(0, &index, &pick(&trial));
                let _ = residual_next.index_copy_(0, &index, &pick(&r_trial));
                let _ = f_next.index_copy_(0, &index, &pick(&f_trial));
                let _ = searching.index_fill_(0, &index, 0);
            }
        }
        let grad_next = op.adjoint(&residual_next);
        let ds = &s_next - &s;
        let dg = &grad_next - &grad;
        let curvature = row_dot(&ds, &dg);
        let rho = select(
            &curvature.gt(1e-300),
            &(1.0 / curvature.clamp_min(1e-300)),
            &curvature.zeros_like(),
        );
        pairs.push_back((ds, dg, rho));
        if pairs.len() > settings.memory {
            pairs.pop_front();
        }
        let decrease = (&f - &f_next) / f.abs().clamp_min(1e-300);
        s = s_next;
        residual = residual_next;
        grad = grad_next;
        f = f_next;
        // A row that made (almost) no progress may be stalled by a stale quasi-Newton model (the
        // orthant constraint can zero the directions it needs): its memory is dropped (ρ = 0 in
        // every pair), so its next direction is the steepest-descent one. When every row made
        // no progress two iterations running, the second without memory, the rows have converged.
        let stalled = decrease.lt(settings.tolerance);
        if host::i64_scalar(&stalled.all()) == 1 {
            if stalled_before {
                break;
            }
            stalled_before = true;
        } else {
            stalled_before = false;
        }
        let keep = stalled.logical_not().to_kind(kind);
        for pair in pairs.iter_mut() {
            pair.2 = &pair.2 * &keep;
        }
    }
    Solution {
        s,
        objective: f.squeeze_dim(1),
        iterations,
        evaluations,
    }
}

/// Soft thresholding: sign(v) max(|v| − τ, 0).
pub(crate) fn soft_threshold(v: &Tensor, tau: &Tensor) -> Tensor {
    v.sign() * (v.abs() - tau).clamp_min(0.0)
}

/// FISTA from s = 0 with step 1 / `lipschitz` (an upper bound on ‖AᵀA‖; 1 when A has
/// orthonormal rows, as a partial DCT does).
pub fn fista(
    op: &dyn Measurement,
    y: &Tensor,
    lambda: &Tensor,
    length: i64,
    lipschitz: f64,
    iterations: usize,
) -> Solution {
    let rows = y.size()[0];
    let mut s = Tensor::zeros([rows, length], (y.kind(), y.device()));
    let mut z = s.shallow_clone();
    let mut t = 1.0f64;
    for _ in 0..iterations {
        let grad = op.adjoint(&(op.apply(&z) - y));
        let s_next = soft_threshold(&(&z - grad / lipschitz), &(lambda / lipschitz));
        let t_next = (1.0 + (1.0 + 4.0 * t * t).sqrt()) / 2.0;
        z = &s_next + (&s_next - &s) * ((t - 1.0) / t_next);
        s = s_next;
        t = t_next;
    }
    let objective = objective(op, &s, y, lambda);
    Solution {
        s,
        objective,
        iterations,
        evaluations: iterations,
    }
}
