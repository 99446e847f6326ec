//! One non-private step (forward, mean cross-entropy, backward, the global clip, the updater), and
//! each epoch's seed. The private step is `private::dp_step`.

use super::sgd::clip_global_norm;
use super::update::Updater;
use crate::data::Batch;
use crate::error::Result;
use crate::models::Model;
use crate::nn::Ctx;
use tch::{Device, Kind, Tensor};

/// The LibTorch seed of epoch `epoch` (0-based) of a run seeded with `seed`: every epoch starts
/// from its own seed, so resuming at an epoch boundary replays the same random draws.
pub fn epoch_seed(seed: u64, epoch: usize) -> i64 {
    // SplitMix64 finaliser of (seed, epoch): distinct, well-mixed seeds per epoch.
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(epoch as u64 + 1);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 1) as i64
}

/// One non-private SGD step: forward -> mean cross-entropy -> backward -> global gradient norm
/// clipped to `max_grad_norm` -> compress -> decompress -> SGD update (`updater`). Returns
/// (summed loss, correct predictions) as tensors on the model's device, without a host sync.
pub fn train_step(
    model: &dyn Model,
    params: &[(String, Tensor)],
    updater: &mut Updater,
    batch: &Batch,
    max_grad_norm: f64,
) -> Result<(Tensor, Tensor)> {
    train_step_share(model, params, updater, batch, max_grad_norm, 1.0)
}

/// `train_step` on one worker's share of a logical batch: its mean loss weighted by
/// `share_weight` = W · share / logical batch, so that the mean of the W workers' updates is the
/// logical batch's mean gradient whatever the shares' sizes (1.0 with one worker, and exactly
/// 1.0 with equal shares). An empty share (the last shuffled batch of an epoch can have fewer
/// examples than there are workers) runs no forward pass and sends a zero gradient, so that the
/// other workers' collectives still meet it; its loss and count are zero.
pub(super) fn train_step_share(
    model: &dyn Model,
    params: &[(String, Tensor)],
    updater: &mut Updater,
    batch: &Batch,
    max_grad_norm: f64,
    share_weight: f64,
) -> Result<(Tensor, Tensor)> {
    if batch.is_empty() {
        return empty_share_step(params, updater, batch.labels.device());
    }
    let tensors: Vec<Tensor> = params.iter().map(|(_, p)| p.shallow_clone()).collect();
    let mut ctx = Ctx::train();
    let logits = model.forward(&batch.features, &mut ctx)?;
    let loss = model.mean_loss(&logits, &batch.features, &batch.labels);
    for (_, p) in params {
        p.shallow_clone().zero_grad();
    }
    if share_weight == 1.0 {
        ctx.backward(&loss);
    } else {
        ctx.backward(&(&loss * share_weight));
    }
    let grads: Vec<Tensor> = params.iter().map(|(_, p)| p.grad()).collect();
    let _ = clip_global_norm(&grads, max_grad_norm);
    updater.step(&tensors, &grads)?;
    // The gradients go once applied (PyTorch's zero_grad(set_to_none=True)): the next forward
    // pass does not hold a parameter-sized buffer it does not use.
    drop(grads);
    for t in &tensors {
        crate::nn::grad_hook::clear_grad(t)?;
    }
    let correct = model.correct(&logits, &batch.features, &batch.labels);
    Ok((loss.detach() * batch.len() as f64, correct))
}

/// The step of a worker whose share of the logical batch is empty: a zero gradient through the
/// updater (so that the exchange with the other workers happens), zero loss and zero correct.
pub(super) fn empty_share_step(
    params: &[(String, Tensor)],
    updater: &mut Updater,
    device: Device,
) -> Result<(Tensor, Tensor)> {
    let tensors: Vec<Tensor> = params.iter().map(|(_, p)| p.shallow_clone()).collect();
    let zeros: Vec<Tensor> = tensors.iter().map(Tensor::zeros_like).collect();
    updater.step(&tensors, &zeros)?;
    Ok((
        Tensor::zeros([], (Kind::Float, device)),
        Tensor::zeros([], (Kind::Double, device)),
    ))
}
