//! The paper's analyses (Lin 2022, the sections after
//! the accuracy figures): how far the gradient the optimiser receives is from the true mean
//! gradient after clipping, noise and compression (`gradient_error`), and which clipping radius
//! minimises that error, measured and modelled (`clipping`).
//!
//! Both are diagnostics: they read training examples outside the privacy accountant (the true
//! mean gradient, the median per-sample norm), so what they print is not differentially private.
//! They never change a run's training: a run's random stream is re-seeded at every epoch start,
//! and the measurements use fresh copies of the compressor's state.
//!
//! Measurements use fixed batches (`fixed_batches`: the same examples for every run of a task,
//! drawn with their own seed) in evaluation mode (dropout off), so the reference gradient is
//! deterministic and every difference between runs is the mechanism's.

pub mod clipping;
pub mod gradient_error;
pub mod probe;

use dpcomp::data::{Batch, Dataset};
use dpcomp::error::Result;
use dpcomp::models::Model;
use dpcomp::privacy::grad_sample::PerSample;
use dpcomp::train::private::per_sample_in_order;
use rand::SeedableRng;
use tch::{Device, Kind, Tensor};

/// Seed of the fixed measurement batches (independent of any run's seed).
pub const FIXED_BATCH_SEED: u64 = 0x6AD_E440;

/// Seed of the noise draws of a measurement.
pub const NOISE_SEED: i64 = 0x5EED;

/// `count` batches of `batch_size` distinct training examples each (sorted indices, CPU int64),
/// the same for every call with the same arguments.
pub fn fixed_batches(train_len: i64, batch_size: usize, count: usize) -> Vec<Tensor> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(FIXED_BATCH_SEED);
    let size = batch_size.min(train_len as usize);
    (0..count)
        .map(|_| {
            let mut picked: Vec<i64> = rand::seq::index::sample(&mut rng, train_len as usize, size)
                .into_iter()
                .map(|i| i as i64)
                .collect();
            picked.sort_unstable();
            Tensor::from_slice(&picked)
        })
        .collect()
}

/// One fixed batch's per-sample gradients, kept factored (`PerSample`) in the order of the
/// trainable parameters, with what every measurement needs from them.
pub struct BatchGradients {
    per_sample: Vec<(Tensor, PerSample)>,
    /// ||g_i|| over all trainable parameters, \[B\].
    pub norms: Tensor,
    /// The true mean gradient ḡ = (1/B) Σ_i g_i (unclipped, noiseless), flattened over all
    /// trainable parameters in order.
    pub mean: Tensor,
    /// B, the batch's examples.
    pub batch_size: i64,
}

impl BatchGradients {
    /// Per-sample gradients of `data[index]` at the model's current weights, dropout off.
    pub fn new(
        model: &dyn Model,
        params: &[(String, Tensor)],
        data: &Dataset,
        index: &Tensor,
        device: Device,
    ) -> Result<Self> {
        let batch: Batch = data.batch(index, device, false);
        let per_sample = per_sample_in_order(model, params, &batch, false)?.per_sample;
        let squares: Vec<Tensor> = per_sample.iter().map(|(_, r)| r.squared_norms()).collect();
        let norms = Tensor::stack(&squares, 0)
            .sum_dim_intlist(0, false, Kind::Float)
            .sqrt();
        let batch_size = batch.len();
        let mut gradients = BatchGradients {
            per_sample,
            norms,
            mean: Tensor::zeros([0], (Kind::Float, device)),
            batch_size,
        };
        gradients.mean =
            gradients.weighted_mean(&Tensor::ones([batch_size], (Kind::Float, device)));
        Ok(gradients)
    }

    /// (1/B) Σ_i w_i g_i, flattened over all trainable parameters in order; `w` is \[B\].
    pub fn weighted_mean(&self, w: &Tensor) -> Tensor {
        tch::no_grad(|| {
            let parts: Vec<Tensor> = self
                .per_sample
                .iter()
                .map(|(_, r)| r.weighted_sum(w).reshape([-1]))
                .collect();
            Tensor::cat(&parts, 0) / self.batch_size as f64
        })
    }

    /// c_i = min(1, C / (||g_i|| + 1e-6)), as the training step clips.
    pub fn clip_factors(&self, max_norm: f64) -> Tensor {
        if max_norm.is_finite() {
            (max_norm / (&self.norms + 1e-6)).clamp_max(1.0)
        } else {
            self.norms.ones_like()
        }
    }

    /// The median of the per-sample norms (the lower middle value for an even B).
    pub fn median_norm(&self) -> f64 {
        dpcomp::host::f64_scalar(&self.norms.median())
    }

    /// m, the number of trainable scalars.
    pub fn parameters(&self) -> i64 {
        self.mean.numel() as i64
    }
}

/// ||x||² in f64.
pub(crate) fn squared_norm(x: &Tensor) -> f64 {
    dpcomp::host::f64_scalar(&x.square().sum(Kind::Double))
}

/// Tensors (one per parameter) flattened into one vector.
pub(crate) fn flatten(tensors: &[Tensor]) -> Tensor {
    let flat: Vec<Tensor> = tensors
        .iter()
        .map(|t| t.to_kind(Kind::Float).reshape([-1]))
        .collect();
    Tensor::cat(&flat, 0)
}

/// A flat vector split back into tensors of `shapes`.
pub(crate) fn unflatten(flat: &Tensor, shapes: &[Vec<i64>]) -> Vec<Tensor> {
    let sizes: Vec<i64> = shapes.iter().map(|s| s.iter().product()).collect();
    flat.split_with_sizes(&sizes, 0)
        .iter()
        .zip(shapes)
        .map(|(t, s)| t.view(s.as_slice()))
        .collect()
}
