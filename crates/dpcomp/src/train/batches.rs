//! Which examples each step of an epoch sees: Poisson-sampled or shuffled batches, seeded per
//! epoch, each worker's share of them, and the divisor of a private step.

use super::private::DpSettings;
use super::step::epoch_seed;
use super::{distributed, Trainer};
use crate::config::Sampling;
use crate::data::sampler;
use crate::error::Result;
use tch::Tensor;

impl Trainer {
    /// The DP-SGD settings of a step on `batch_len` examples; `None` without privacy. Under
    /// Poisson sampling the clipped sum is divided by the expected batch q N, never by the
    /// realised size: dividing by a size that depends on who was sampled would leak it (Opacus's
    /// `expected_batch_size`). Under shuffling the batch size is fixed, so it is the divisor.
    ///
    /// With W workers `batch_len` is the logical batch over all of them and the divisor is E\[B\]
    /// / W: each worker's gradient W (its clipped sum + its noise) / E\[B\] is an unbiased estimate
    /// of the whole noisy gradient, and the mean of the W is exactly (Σ clipped + Σ noise) / E\[B\].
    pub fn dp_settings(&self, batch_len: i64) -> Option<DpSettings> {
        self.privacy.as_ref()?;
        let expected_batch = match self.config.privacy.sampling {
            Sampling::Poisson => self.sample_rate() * self.data.train.len() as f64,
            Sampling::Shuffle => batch_len as f64,
        };
        Some(DpSettings {
            expected_batch: expected_batch / self.workers() as f64,
            physical_batch: self.config.privacy.physical_batch_size.map(|p| p as i64),
            mode: self.config.privacy.grad_sample,
        })
    }

    /// Epoch `epoch`'s batches: Poisson-sampled under DP (unless --sampling shuffle), else
    /// shuffled. Seeds LibTorch's generator first, which the epoch's augmentation and dropout
    /// then continue: from `seed` and the epoch (reproducible, and a resumed run draws what the
    /// uninterrupted one drew), or with `--secure-noise` from the operating system, because
    /// amplification by subsampling assumes no one can regenerate the batches.
    ///
    /// With W workers these are this rank's batches (rank 0 of one worker draws exactly the
    /// above): Poisson over its shard (examples ≡ rank mod W) at the global rate, from a stream
    /// of its own (`distributed::worker_seed`); shuffled, every rank draws the same permutation
    /// (from the run's seed, or under `--secure-noise` from `shuffle_seed`, rank 0's draw) and
    /// takes every W-th example of each batch from position `rank`, then reseeds its own stream.
    pub fn epoch_batches(&self, epoch: usize) -> Vec<Tensor> {
        self.worker_batches(epoch, None)
    }

    pub(super) fn worker_batches(&self, epoch: usize, shuffle_seed: Option<i64>) -> Vec<Tensor> {
        let (rank, workers) = (self.rank(), self.workers());
        let seed_of = |rank: usize| {
            if self.config.privacy.secure_noise {
                crate::privacy::noise::os_seed()
            } else {
                epoch_seed(distributed::worker_seed(self.config.seed, rank), epoch)
            }
        };
        let n = self.data.train.len();
        if self.config.private() && self.config.privacy.sampling == Sampling::Poisson {
            tch::manual_seed(seed_of(rank));
            let steps = self.steps_per_epoch() as usize;
            return sampler::shard_poisson_batches(
                n,
                rank as i64,
                workers as i64,
                self.sample_rate(),
                steps,
            );
        }
        tch::manual_seed(shuffle_seed.unwrap_or_else(|| seed_of(0)));
        let batches = sampler::shuffled_batches(n, self.config.optimizer.batch_size as i64);
        if workers == 1 {
            return batches;
        }
        tch::manual_seed(seed_of(rank));
        batches
            .iter()
            .map(|b| b.slice(0, rank as i64, None, workers as i64).contiguous())
            .collect()
    }

    /// The size of step `step`'s logical batch over all workers under shuffling (the last batch
    /// of an epoch is shorter).
    pub(super) fn shuffled_batch_len(&self, step: usize) -> i64 {
        let (n, b) = (
            self.data.train.len(),
            self.config.optimizer.batch_size as i64,
        );
        b.min(n - step as i64 * b)
    }

    /// Rank 0's OS-drawn seed for the epoch's shared permutation, when W > 1 workers shuffle
    /// under `--secure-noise` (each would otherwise draw another permutation).
    pub(super) fn shared_shuffle_seed(&mut self) -> Result<Option<i64>> {
        let shuffled =
            !(self.config.private() && self.config.privacy.sampling == Sampling::Poisson);
        let (secure, writes) = (self.config.privacy.secure_noise, self.writes());
        let Some(exchange) = self
            .updater
            .exchange
            .as_mut()
            .filter(|_| shuffled && secure)
        else {
            return Ok(None);
        };
        let mut seed = if writes {
            crate::privacy::noise::os_seed().to_le_bytes().to_vec()
        } else {
            Vec::new()
        };
        exchange.comm.broadcast(0, &mut seed)?;
        let bytes: [u8; 8] = seed.try_into().map_err(|_| {
            exchange
                .comm
                .error("the shuffle seed from rank 0 is not 8 bytes".into())
        })?;
        Ok(Some(i64::from_le_bytes(bytes)))
    }
}
