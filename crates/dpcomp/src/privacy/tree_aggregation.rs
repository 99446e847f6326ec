//! Privacy of DP-FTRL with tree aggregation (Kairouz et al. 2021, "Practical and Private (Deep)
//! Learning without Sampling or Shuffling", Section 4 and Appendix D): the prefix sums of T
//! clipped gradients are released through a binary tree whose every node holds a noisy partial
//! sum, N(0, σ² C² I) per node. An example that takes part once changes one node per level, so
//! the tree is a Gaussian mechanism of sensitivity² ⌈log₂(T + 1)⌉ (C = 1) and its Rényi DP at
//! order α is α ⌈log₂(T + 1)⌉ / (2σ²). A tree restarted every epoch composes over the restarts:
//! each epoch's tree sees each example once.

use super::rdp::{default_orders, epsilon_from_rdp};

/// Levels of the tree over `steps` leaves that one participation touches: ⌈log₂(steps + 1)⌉.
pub fn levels(steps: u64) -> u32 {
    // ⌈log₂(m)⌉ for m = steps + 1 ≥ 1: the bits of m − 1.
    u64::BITS - steps.leading_zeros()
}

/// Rényi DP at each of `orders` of `restarts` trees of `steps` leaves each, every node noised
/// with standard deviation σ times the clipping radius: restarts · α · ⌈log₂(steps + 1)⌉ / (2σ²).
pub fn rdp(orders: &[f64], sigma: f64, steps: u64, restarts: u64) -> Vec<f64> {
    let per_alpha = restarts as f64 * levels(steps) as f64 / (2.0 * sigma * sigma);
    orders.iter().map(|alpha| alpha * per_alpha).collect()
}

/// ε at δ of `restarts` trees of `steps` leaves at noise multiplier σ, over the RDP accountant's
/// default orders (Balle et al. 2020's conversion, as for DP-SGD).
pub fn epsilon(sigma: f64, steps: u64, restarts: u64, delta: f64) -> f64 {
    let orders = default_orders();
    epsilon_from_rdp(&orders, &rdp(&orders, sigma, steps, restarts), delta).0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_the_ceiling_of_log2_of_steps_plus_one() {
        for (steps, want) in [
            (1, 1),
            (2, 2),
            (3, 2),
            (4, 3),
            (7, 3),
            (8, 4),
            (100, 7),
            (1000, 10),
        ] {
            assert_eq!(levels(steps), want, "{steps}");
        }
    }

    #[test]
    fn tree_epsilons_are_dp_accountings() {
        // dp_accounting 0.6.0's RDP accountant on the tree-aggregation event (the same orders).
        let cases = [
            (1.0, 1000, 1, 19.0536),
            (4.0, 1600, 1, 3.81776),
            (2.0, 100, 5, 17.4879),
        ];
        for (sigma, steps, restarts, want) in cases {
            let got = epsilon(sigma, steps, restarts, 1e-5);
            assert!(
                (got - want).abs() < 5e-5 * want,
                "σ {sigma} T {steps}: {got}"
            );
        }
    }
}
