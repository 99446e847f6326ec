//! The Gaussian mechanism on the clipped sum (Abadi et al. 2016, Algorithm 1, "add noise"):
//! g̃ = (Σ_i c_i g_i + N(0, σ² C² I)) / E[B], drawn on the gradients' device once per logical
//! step. E[B] = qN under Poisson sampling (Opacus's expected batch size), the batch size under
//! shuffling.

use tch::Tensor;

pub fn noisy_mean(
    clipped_sum: &Tensor,
    noise_multiplier: f64,
    max_norm: f64,
    expected_batch: f64,
) -> Tensor {
    let noisy = if noise_multiplier > 0.0 {
        clipped_sum + clipped_sum.randn_like() * (noise_multiplier * max_norm)
    } else {
        clipped_sum.shallow_clone()
    };
    noisy / expected_batch
}
