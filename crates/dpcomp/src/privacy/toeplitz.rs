//! Lower-triangular Toeplitz strategies for correlated noise (the matrix mechanism's
//! factorisation A = B C of the prefix-sum workload A): their coefficients, inverses, errors and
//! sensitivities, in float64.
//!
//! A strategy C is lower-triangular Toeplitz, C\[i, j\] = c_{i−j} (c_k = 0 for k ≥ b when it
//! has b bands). The mechanism releases C g + z and estimates the prefix sums of g as
//! A C⁻¹ (C g + z): the noise added to the i-th prefix sum is row i of A C⁻¹ applied to z, and
//! the noise each step adds to its gradient is x = C⁻¹ z (what a stream generates, one step at a
//! time). C⁻¹ is lower-triangular Toeplitz too, with the coefficients of the power series
//! 1 / c(x), c(x) = Σ_k c_k x^k (`inverse`).
//!
//! - Optimal for the max error among Toeplitz strategies, asymptotically: c(x) = 1 / √(1 − x)
//!   (Fichtenberger, Henzinger and Upadhyay 2023; Henzinger et al. 2024), c_k = C(2k, k) / 4^k
//!   (`max_error_coefficients`).
//! - Per-query error of the prefix-sum workload (Choquette-Choo et al. 2023, "Multi-epoch matrix
//!   factorization mechanisms", eq. 3 with unit noise): ‖row_i(A C⁻¹)‖² = Σ_{m ≤ i} D_m², where
//!   D_m = Σ_{l ≤ m} d_l are the prefix sums of C⁻¹'s coefficients d (`prefix_sum_errors`); the
//!   loss a strategy is optimised for is that error (mean or max over queries) times its
//!   sensitivity² (`mean_loss`, `max_loss`).
//! - Sensitivity under min-separated participation ("(Amplified) Banded Matrix Factorization",
//!   Choquette-Choo et al. 2023): an example that takes part in at most k steps, any two at
//!   least b apart. For non-negative, non-increasing coefficients the worst pattern is k steps
//!   exactly b apart from the first step, whose columns' sum has the largest norm
//!   (`min_separation_sensitivity_squared`; the tests compare it with every pattern).
//! - Buffered linear Toeplitz (BLT) strategies (Dvijotham et al. 2024; McMahan et al. 2024):
//!   c_0 = 1, c_k = Σ_j ω_j θ_j^{k−1}, whose inverse is generated with one buffer per
//!   (ω_j, θ_j) (`Blt`).

/// The first `n` coefficients of 1 / √(1 − x): c_0 = 1, c_k = c_{k−1} (2k − 1) / (2k), i.e.
/// 1, 1/2, 3/8, 5/16, 35/128, ... (jax_privacy's `optimal_max_error_strategy_coefs`).
pub fn max_error_coefficients(n: usize) -> Vec<f64> {
    let mut c = Vec::with_capacity(n);
    let mut value = 1.0;
    for k in 0..n {
        if k > 0 {
            value *= (2 * k - 1) as f64 / (2 * k) as f64;
        }
        c.push(value);
    }
    c
}

/// The first `n` coefficients d of C⁻¹, the power series 1 / c(x): d_0 = 1 / c_0 and
/// d_m = −(Σ_{k=1}^{min(m, b−1)} c_k d_{m−k}) / c_0, which is the noise stream's recurrence
/// x_i = (z_i − Σ_k c_k x_{i−k}) / c_0 applied to a unit impulse. `None` when c is empty or
/// c_0 is not a finite non-zero number (C would not be invertible).
pub fn inverse(c: &[f64], n: usize) -> Option<Vec<f64>> {
    let c0 = *c.first()?;
    if c0 == 0.0 || !c0.is_finite() {
        return None;
    }
    let mut d = Vec::with_capacity(n);
    for m in 0..n {
        let mut acc = if m == 0 { 1.0 } else { 0.0 };
        for (k, ck) in c.iter().enumerate().take(m + 1).skip(1) {
            acc -= ck * d[m - k];
        }
        d.push(acc / c0);
    }
    Some(d)
}

/// Per-query error of the prefix-sum workload under unit noise, for the n = d.len() queries:
/// error_i = Σ_{m ≤ i} D_m² with D_m = d_0 + ... + d_m (`d`: C⁻¹'s coefficients). For the
/// identity strategy (DP-SGD), error_i = i + 1.
pub fn prefix_sum_errors(d: &[f64]) -> Vec<f64> {
    let (mut prefix, mut total) = (0.0, 0.0);
    d.iter()
        .map(|dm| {
            prefix += dm;
            total += prefix * prefix;
            total
        })
        .collect()
}

/// Sensitivity² of a single participation: the largest column norm² of the n x n strategy, its
/// first column's, Σ_{k < n} c_k².
pub fn single_participation_sensitivity_squared(c: &[f64], n: usize) -> f64 {
    c.iter().take(n).map(|v| v * v).sum()
}

/// The loss a Toeplitz strategy is optimised for over n steps with a single participation:
/// mean per-query error times sensitivity² (invariant to scaling c). `None` when C is not
/// invertible.
pub fn mean_loss(c: &[f64], n: usize) -> Option<f64> {
    let errors = prefix_sum_errors(&inverse(c, n)?);
    let mean = errors.iter().sum::<f64>() / n as f64;
    Some(mean * single_participation_sensitivity_squared(c, n))
}

/// The max per-query error (the last query's) times sensitivity² over n steps with a single
/// participation. `None` when C is not invertible.
pub fn max_loss(c: &[f64], n: usize) -> Option<f64> {
    let errors = prefix_sum_errors(&inverse(c, n)?);
    let last = errors.last().copied().unwrap_or(0.0);
    Some(last * single_participation_sensitivity_squared(c, n))
}

/// Sensitivity² of the n x n Toeplitz strategy with coefficients `c` when an example takes
/// part in at most `participations` steps (all ⌈n / separation⌉ it can, when `None`), any two
/// at least `separation` apart: ‖Σ_{j<k} C[:, j·separation]‖², the worst pattern for
/// non-negative, non-increasing coefficients. `separation` 0 is taken as 1.
pub fn min_separation_sensitivity_squared(
    c: &[f64],
    n: usize,
    separation: usize,
    participations: Option<usize>,
) -> f64 {
    let separation = separation.max(1);
    let most = n.div_ceil(separation);
    let k = participations.map_or(most, |p| p.min(most));
    let mut column_sum = vec![0.0; n];
    for j in 0..k {
        let start = j * separation;
        for (i, ck) in c.iter().enumerate() {
            if start + i >= n {
                break;
            }
            column_sum[start + i] += ck;
        }
    }
    column_sum.iter().map(|v| v * v).sum()
}

/// A buffered linear Toeplitz strategy: c_0 = 1, c_k = Σ_j ω_j θ_j^{k−1} for k ≥ 1, with one
/// buffer per (ω_j, θ_j). The noise x = C⁻¹ z is generated as x_i = z_i − Σ_j ω_j buf_j, then
/// buf_j ← θ_j buf_j + x_i, since Σ_{k≥1} c_k x_{i−k} = Σ_j ω_j buf_j.
#[derive(Debug, Clone, PartialEq)]
pub struct Blt {
    /// ω, the buffers' output weights.
    pub omega: Vec<f64>,
    /// θ, the buffers' decays.
    pub theta: Vec<f64>,
}

impl Blt {
    /// The first `n` Toeplitz coefficients of C.
    pub fn coefficients(&self, n: usize) -> Vec<f64> {
        (0..n)
            .map(|k| {
                if k == 0 {
                    1.0
                } else {
                    self.omega
                        .iter()
                        .zip(&self.theta)
                        .map(|(w, t)| w * t.powi(k as i32 - 1))
                        .sum()
                }
            })
            .collect()
    }

    /// The first `n` coefficients of C⁻¹: the noise stream's response to a unit impulse, in
    /// O(n · buffers).
    pub fn inverse_coefficients(&self, n: usize) -> Vec<f64> {
        let mut buffers = vec![0.0; self.omega.len()];
        (0..n)
            .map(|i| {
                let z = if i == 0 { 1.0 } else { 0.0 };
                let x = z - self
                    .omega
                    .iter()
                    .zip(&buffers)
                    .map(|(w, b)| w * b)
                    .sum::<f64>();
                for (b, t) in buffers.iter_mut().zip(&self.theta) {
                    *b = t * *b + x;
                }
                x
            })
            .collect()
    }

    /// Sensitivity² of a single participation over n steps, Σ_{k<n} c_k², in closed form:
    /// 1 + Σ_{i,j} ω_i ω_j (1 − (θ_i θ_j)^{n−1}) / (1 − θ_i θ_j).
    pub fn sensitivity_squared(&self, n: usize) -> f64 {
        if n == 0 {
            return 0.0;
        }
        let mut total = 1.0;
        for (wi, ti) in self.omega.iter().zip(&self.theta) {
            for (wj, tj) in self.omega.iter().zip(&self.theta) {
                let r = ti * tj;
                let terms = (n - 1) as f64;
                let geometric = if (1.0 - r).abs() < 1e-15 {
                    terms
                } else {
                    (1.0 - r.powf(terms)) / (1.0 - r)
                };
                total += wi * wj * geometric;
            }
        }
        total
    }

    /// The max per-query error over n steps times the single-participation sensitivity².
    pub fn max_loss(&self, n: usize) -> f64 {
        let errors = prefix_sum_errors(&self.inverse_coefficients(n));
        errors.last().copied().unwrap_or(0.0) * self.sensitivity_squared(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, rtol: f64) -> bool {
        (a - b).abs() <= rtol * b.abs().max(1e-300)
    }

    #[test]
    fn the_max_error_strategy_and_its_inverse_are_jax_privacys() {
        // jax_privacy 2.0.0: optimal_max_error_strategy_coefs(6) and its noising coefficients.
        let c = max_error_coefficients(6);
        assert_eq!(c, [1.0, 0.5, 0.375, 0.3125, 0.2734375, 0.24609375]);
        let d = inverse(&c, 6).unwrap();
        let want = [1.0, -0.5, -0.125, -0.0625, -0.0390625, -0.02734375];
        for (got, want) in d.iter().zip(want) {
            assert!((got - want).abs() < 1e-15, "{d:?}");
        }
    }

    #[test]
    fn the_identity_strategy_has_dp_sgds_errors() {
        assert_eq!(
            prefix_sum_errors(&inverse(&[1.0], 4).unwrap()),
            [1.0, 2.0, 3.0, 4.0]
        );
        assert_eq!(inverse(&[0.0, 1.0], 3), None);
        assert_eq!(inverse(&[], 3), None);
    }

    #[test]
    fn the_optimised_banded_strategy_has_jax_privacys_losses() {
        // jax_privacy 2.0.0, banded Toeplitz optimised for n = 64 with 4 bands (the loss, not
        // the coefficients, is what the optimisers agree on; the coefficients are given to ten
        // digits, and the loss is stationary there).
        let c = [0.7080607705, 0.4745528092, 0.3977448833, 0.3394828190];
        assert!(close(mean_loss(&c, 64).unwrap(), 10.501446861, 1e-8));
        assert!(close(max_loss(&c, 64).unwrap(), 19.057533798, 1e-8));
        // Its sensitivity under min-separated participation: b = 4 (columns apart, k = 16) and
        // b = 2 (overlapping), and 16 fixed-order epochs of 4 steps (sensitivity 4).
        assert!(close(
            min_separation_sensitivity_squared(&c, 64, 4, None),
            16.0,
            1e-9
        ));
        assert!(close(
            min_separation_sensitivity_squared(&c, 64, 2, None),
            59.17581500838928,
            1e-8
        ));
        assert!(close(
            min_separation_sensitivity_squared(&c, 64, 4, Some(16)).sqrt(),
            4.0,
            1e-9
        ));
    }

    /// Every participation pattern of at most `k` steps among `n`, any two at least `b` apart.
    fn patterns(n: usize, b: usize, k: usize) -> Vec<Vec<usize>> {
        fn extend(
            from: usize,
            n: usize,
            b: usize,
            k: usize,
            now: &mut Vec<usize>,
            all: &mut Vec<Vec<usize>>,
        ) {
            all.push(now.clone());
            if now.len() == k {
                return;
            }
            for next in from..n {
                now.push(next);
                extend(next + b, n, b, k, now, all);
                now.pop();
            }
        }
        let mut all = Vec::new();
        extend(0, n, b, k, &mut Vec::new(), &mut all);
        all
    }

    #[test]
    fn the_min_separation_sensitivity_is_the_worst_participation_pattern() {
        // Non-negative, non-increasing coefficients: the 1/√(1−x) ones cut to 3 bands, and the
        // full ones; every pattern of up to k participations b apart, columns summed.
        for c in [max_error_coefficients(3), max_error_coefficients(9)] {
            for (n, b, k) in [(9, 2, 5), (9, 3, 3), (8, 1, 8), (9, 4, 2)] {
                let mut worst: f64 = 0.0;
                for pattern in patterns(n, b, k) {
                    let mut sum = vec![0.0; n];
                    for &start in &pattern {
                        for (i, ck) in c.iter().enumerate() {
                            if start + i < n {
                                sum[start + i] += ck;
                            }
                        }
                    }
                    worst = worst.max(sum.iter().map(|v| v * v).sum());
                }
                let routine = min_separation_sensitivity_squared(&c, n, b, Some(k));
                assert!(
                    close(routine, worst, 1e-12),
                    "n {n} b {b} k {k}: {routine} vs {worst}"
                );
            }
        }
    }

    #[test]
    fn blt_coefficients_sensitivity_and_loss_are_jax_privacys() {
        // jax_privacy 2.0.0: the BLT optimised for a single participation, n = 10⁵, 2 buffers
        // (parameters to rtol 1e-5, so the checks are at that tolerance).
        let blt = Blt {
            omega: vec![0.0122853238, 0.1878393665],
            theta: vec![0.9999528892, 0.9857068667],
        };
        let c = blt.coefficients(5);
        let want = [1.0, 0.2001247461, 0.1974393521, 0.1947923326, 0.1921831391];
        for (got, want) in c.iter().zip(want) {
            assert!(close(*got, want, 1e-6), "{c:?}");
        }
        let n = 100_000;
        assert!(close(blt.sensitivity_squared(n), 4.166794523, 1e-5));
        // The closed form equals the sum of the coefficients' squares.
        let direct = single_participation_sensitivity_squared(&blt.coefficients(n), n);
        assert!(close(blt.sensitivity_squared(n), direct, 1e-10));
        assert!(close(blt.max_loss(n), 28.05553, 1e-5));
        // The generated inverse is the power-series inverse of the coefficients.
        let d = blt.inverse_coefficients(50);
        let series = inverse(&blt.coefficients(50), 50).unwrap();
        for (a, b) in d.iter().zip(&series) {
            assert!((a - b).abs() < 1e-14);
        }
    }
}
