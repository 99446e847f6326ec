//! Per-sample gradients from one backward pass, their norms, and the clipped sum, in the
//! book-keeping style of fastDP (Bu et al. 2023): the forward pass records each trainable layer's
//! input (`nn::Tape`), one backward pass of the summed per-example loss with respect to the
//! recorded outputs gives every example's output gradient (examples do not interact: there is no
//! BatchNorm), and each parameter's per-sample gradient is a contraction of the two.
//!
//! Per layer, ||g_i||² comes either from the ghost-norm identity (Li et al. 2022; Opacus's
//! ghost clipping) — for g_i = Σ_t b_it a_it^T, ||g_i||² = <A_i A_iᵀ, B_i B_iᵀ> — or from the
//! instantiated g_i, whichever costs fewer operations for the layer's shapes. The clipped sum
//! Σ_i c_i g_i with c_i = min(1, C / (||g_i|| + 1e-6)) (||g_i|| over all trainable parameters,
//! Abadi et al. 2016, Algorithm 1) is one weighted contraction per parameter.
//!
//! What each layer kind contributes is its record's `nn::Recorded::per_sample`; the recipes
//! and their norms and sums are `nn::per_sample`. `tests/grad_sample.rs` checks everything
//! here against per-example autograd.

use super::engine::Clipping;
use crate::data::Batch;
use crate::error::{Error, Result};
use crate::models::Model;
use crate::nn::{Ctx, LayerGradients, Record, Tape};
use std::collections::HashMap;
use tch::{Reduction, Tensor};

pub use crate::nn::per_sample::{
    ghost_is_cheaper, outer, patches, Activations, PerSample, PerSampleGradient,
    KEEP_INSTANTIATED_FACTOR, MAX_INSTANTIATED, MEMORY_WEIGHT,
};

/// Adds d(root)/d(output) to the gradients of the records in `targets`.
fn accumulate(grads: &mut [Option<Tensor>], records: &[Record], targets: &[usize], root: &Tensor) {
    if targets.is_empty() {
        return;
    }
    let outputs: Vec<&Tensor> = targets.iter().map(|&k| &records[k].output).collect();
    let found = Tensor::run_backward(&[root], &outputs, false, false);
    for (&k, g) in targets.iter().zip(found) {
        if g.defined() {
            grads[k] = Some(match grads[k].take() {
                Some(sum) => sum + g,
                None => g,
            });
        }
    }
}

/// Every trainable parameter on the tape with the recipe for its per-sample gradients, from one
/// backward pass of `loss_sum` (= Σ_i loss_i). Errors if a parameter appears twice (a layer used
/// twice in one forward pass would need its per-sample gradients summed first).
pub fn per_sample_gradients(tape: Tape, loss_sum: &Tensor) -> Result<Vec<(Tensor, PerSample)>> {
    let mut records = tape.records;
    let mut grads: Vec<Option<Tensor>> = (0..records.len()).map(|_| None).collect();
    let attached: Vec<usize> = (0..records.len())
        .filter(|&k| records[k].output.requires_grad())
        .collect();
    accumulate(&mut grads, &records, &attached, loss_sum);
    let mut out = Vec::new();
    // Last layer first; each record is dropped once its recipe is made, so the layer's output
    // and any input the recipe does not keep are freed as the loop goes (an LSTM's second
    // backward only reaches earlier records, which are still there).
    while let Some(record) = records.pop() {
        let k = records.len();
        let grad = grads[k]
            .take()
            .unwrap_or_else(|| record.output.detach().zeros_like());
        let LayerGradients {
            parameters,
            upstream,
        } = record.layer.per_sample(&grad);
        out.extend(parameters);
        if let Some(root) = upstream {
            // The layer ran outside autograd: its input's gradient reaches the earlier records
            // through this scalar (an LSTM over an embedding).
            let earlier: Vec<usize> = attached.iter().copied().filter(|&j| j < k).collect();
            accumulate(&mut grads, &records, &earlier, &root);
        }
    }
    let mut seen = std::collections::HashSet::new();
    for (param, _) in &out {
        if !seen.insert(param.data_ptr() as usize) {
            return Err(Error::bad_value(
                "model",
                format!("a parameter of shape {:?} is used twice in one forward pass; per-sample gradients need each layer once", param.size()),
            ));
        }
    }
    Ok(out)
}

/// The per-sample gradient recipes of a private forward pass (`Ctx::private`) for `params`, in
/// their order, from the summed per-example loss: what a training loop over a model of one's
/// own hands to `PrivacyEngine::clip`. The model's input can be anything; only its layers'
/// records matter. A trainable parameter that no record covers is an error: it would escape
/// clipping. Takes the context's tape (the context records nothing afterwards).
pub fn per_sample_of(
    ctx: &mut Ctx,
    params: &[(String, Tensor)],
    loss_sum: &Tensor,
) -> Result<Vec<(Tensor, PerSample)>> {
    let tape = ctx.take_tape().ok_or_else(|| {
        Error::bad_value(
            "context",
            "no tape: run the forward pass under Ctx::private to get per-sample gradients",
        )
    })?;
    let mut by_ptr: HashMap<usize, (Tensor, PerSample)> = per_sample_gradients(tape, loss_sum)?
        .into_iter()
        .map(|(p, r)| (p.data_ptr() as usize, (p, r)))
        .collect();
    params
        .iter()
        .map(|(name, p)| {
            by_ptr.remove(&(p.data_ptr() as usize)).ok_or_else(|| {
                Error::bad_value(
                    "model",
                    format!("trainable parameter {name} is not on the per-sample tape: it would escape clipping"),
                )
            })
        })
        .collect()
}

/// One private forward and backward pass over a batch.
pub struct PerSampleBatch {
    /// (parameter, its per-sample gradient recipe), in the order of the trainable parameters.
    pub per_sample: Vec<(Tensor, PerSample)>,
    pub logits: Tensor,
    /// Σ_i loss_i.
    pub loss_sum: Tensor,
}

/// The per-sample gradient recipes of `batch` in the order of `params`, from one private forward
/// pass (`dropout` on in training, off for measurements), with the logits and the summed loss.
/// A trainable parameter missing from the tape is an error: it would escape clipping.
pub fn per_sample_in_order(
    model: &dyn Model,
    params: &[(String, Tensor)],
    batch: &Batch,
    dropout: bool,
) -> Result<PerSampleBatch> {
    let mut ctx = Ctx::private(dropout);
    let logits = model.forward(&batch.features, &mut ctx)?;
    let losses =
        logits.cross_entropy_loss::<Tensor>(&batch.labels, None, Reduction::None, -100, 0.0);
    let loss_sum = losses.sum(losses.kind());
    let ordered = per_sample_of(&mut ctx, params, &loss_sum)?;
    Ok(PerSampleBatch {
        per_sample: ordered,
        logits,
        loss_sum,
    })
}

/// Per-sample norms over all parameters and the clipped sum of each parameter's gradients.
pub struct ClippedSum {
    /// ||g_i|| over every trainable parameter, [B].
    pub norms: Tensor,
    /// c_i = min(1, C / (||g_i|| + 1e-6)), [B].
    pub factors: Tensor,
    /// (parameter, Σ_i c_i g_i).
    pub grads: Vec<(Tensor, Tensor)>,
}

pub fn clip_and_sum(per_sample: &[(Tensor, PerSample)], max_norm: f64) -> ClippedSum {
    let squared: Vec<Tensor> = per_sample.iter().map(|(_, r)| r.squared_norms()).collect();
    let (mut factors, norms) = Clipping::Flat { max_norm }.factors(&squared);
    // Flat clipping: every parameter shares the one factor per example.
    let factors = factors.swap_remove(0);
    let grads = per_sample
        .iter()
        .map(|(p, r)| (p.shallow_clone(), r.weighted_sum(&factors)))
        .collect();
    ClippedSum {
        norms,
        factors,
        grads,
    }
}
