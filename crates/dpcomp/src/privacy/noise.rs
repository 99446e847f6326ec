//! The Gaussian mechanism on the clipped sum (Abadi et al. 2016, Algorithm 1, "add noise"):
//! g̃ = (Σ_i c_i g_i + N(0, σ² C² I)) / E\[B\], drawn on the gradients' device once per logical
//! step. E\[B\] = qN under Poisson sampling (Opacus's expected batch size), the batch size under
//! shuffling.
//!
//! Where the noise comes from (`NoiseSource`):
//! - `Seeded` (the default): LibTorch's generator, reseeded every epoch from the run's seed, so
//!   a run is exactly reproducible and resumable. Anyone holding the run folder (its
//!   `config.toml` names the seed) can regenerate the noise and subtract it: fine for
//!   experiments, not for releasing a model trained on sensitive data.
//! - `Secure` (`--secure-noise`, Opacus's "secure mode"): the normals come from a ChaCha12
//!   stream (`rand`'s `StdRng`, a CSPRNG) seeded from the operating system's generator when the
//!   run starts; that seed is never written anywhere. The run also seeds LibTorch's generator
//!   from the operating system every epoch, so the Poisson batches (whose secrecy the
//!   accountant's amplification by subsampling assumes) cannot be regenerated either. Such a run
//!   is not reproducible, and a resumed one continues with fresh randomness.
//!
//! Cost: the secure normals are drawn on the CPU and copied to the gradients' device
//! (`dpcomp bench dp --secure-noise` measures the step with it against the seeded one).

use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};
use tch::Tensor;

/// Which generator draws the noise (see the module docs).
pub enum NoiseSource {
    /// LibTorch's global generator: reproducible from the run's seed, not for releasing a model.
    Seeded,
    /// A ChaCha12 CSPRNG seeded from the operating system (build it with [`NoiseSource::secure`]).
    Secure(Box<rand::rngs::StdRng>),
}

impl NoiseSource {
    /// A secure source: a ChaCha12 stream seeded from the operating system.
    pub fn secure() -> NoiseSource {
        NoiseSource::Secure(Box::new(rand::rngs::StdRng::from_os_rng()))
    }

    /// How summaries and metrics name it.
    pub fn label(&self) -> &'static str {
        match self {
            NoiseSource::Seeded => "seeded",
            NoiseSource::Secure(_) => "secure",
        }
    }

    /// Standard normal noise shaped, typed and placed like `like`.
    pub fn standard_normal_like(&mut self, like: &Tensor) -> Tensor {
        match self {
            NoiseSource::Seeded => like.randn_like(),
            NoiseSource::Secure(rng) => {
                let values: Vec<f32> = (0..like.numel())
                    .map(|_| StandardNormal.sample(rng.as_mut()))
                    .collect();
                // Sent without waiting for the device (`host::upload`).
                crate::host::upload(
                    &Tensor::from_slice(&values).view(like.size().as_slice()),
                    like.device(),
                )
                .to_kind(like.kind())
            }
        }
    }
}

/// An operating-system random seed for LibTorch's generator (secure runs' epochs).
pub(crate) fn os_seed() -> i64 {
    use rand::TryRngCore;
    (rand::rngs::OsRng
        .try_next_u64()
        .expect("the operating system's generator")
        >> 1) as i64
}

/// The Gaussian mechanism on one clipped sum: (sum + N(0, σ² C² I)) / `E[B]`, where σ is
/// `noise_multiplier`, C `max_norm` (the sensitivity) and `E[B]` is `expected_batch`; shaped like
/// `clipped_sum`. σ = 0 adds no noise. This draws noise without counting a step: a training
/// step goes through [`PrivacyEngine::privatize`](super::engine::PrivacyEngine::privatize),
/// which calls this and records the step in its accountant.
pub fn noisy_mean(
    clipped_sum: &Tensor,
    noise_multiplier: f64,
    max_norm: f64,
    expected_batch: f64,
    source: &mut NoiseSource,
) -> Tensor {
    let noisy = if noise_multiplier > 0.0 {
        clipped_sum + source.standard_normal_like(clipped_sum) * (noise_multiplier * max_norm)
    } else {
        clipped_sum.shallow_clone()
    };
    noisy / expected_batch
}

/// `noisy_mean` with the sensitivity C a 0-d f64 tensor (adaptive clipping's radius, kept on the
/// device): the noise scale σ C is formed where C lives, so nothing is read to the host. The
/// same arithmetic as `noisy_mean`, value for value.
pub(crate) fn noisy_mean_at(
    clipped_sum: &Tensor,
    noise_multiplier: f64,
    max_norm: &Tensor,
    expected_batch: f64,
    source: &mut NoiseSource,
) -> Tensor {
    let noisy = if noise_multiplier > 0.0 {
        clipped_sum + source.standard_normal_like(clipped_sum) * (max_norm * noise_multiplier)
    } else {
        clipped_sum.shallow_clone()
    };
    noisy / expected_batch
}
