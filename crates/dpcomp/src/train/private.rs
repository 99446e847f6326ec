//! One DP-SGD step (Abadi et al. 2016, Algorithm 1) as the paper runs it through Opacus:
//! per-sample gradients -> each clipped to norm C -> summed -> N(0, σ²C²) added once -> divided
//! by the expected batch size -> compress -> decompress -> SGD (`Updater`). A logical batch larger than `physical_batch` examples is
//! processed in chunks whose clipped sums accumulate before the single noise draw.

use super::update::Updater;
use crate::config::GradSampleMode;
use crate::data::{Batch, Dataset};
use crate::error::Result;
use crate::models::Model;
use crate::nn::Ctx;
use crate::nn::PerSample;
use crate::privacy::canary::GradientCanaries;
use crate::privacy::engine::{Clipped, PrivacyEngine};
use crate::privacy::grad_sample::{clipped_sums, per_sample_of, BackwardPasses};
use tch::{Device, Kind, Tensor};

/// How a logical batch is processed (σ, q and the clipping rule are the engine's).
#[derive(Debug, Clone, Copy)]
pub struct DpSettings {
    /// E\[B\]: qN under Poisson sampling, the batch size under shuffling.
    pub expected_batch: f64,
    /// At most this many examples per forward and backward pass (their clipped sums add up
    /// before the one noise draw); `None`: the whole logical batch at once. Memory, not ε.
    pub physical_batch: Option<i64>,
    /// How the per-sample gradients are clipped: recorded tape (one or two backward passes)
    /// or per-example autograd (the slow reference).
    pub mode: GradSampleMode,
}

/// Sums a step reports, as device tensors (no host sync).
pub struct StepTotals {
    /// Σ_i of the examples' cross-entropy, a 0-d float tensor.
    pub loss_sum: Tensor,
    /// How many examples the logits classified right, a 0-d int64 tensor.
    pub correct: Tensor,
    /// Examples whose gradient norm exceeded C.
    pub clipped: Tensor,
}

/// Clipped gradient sums in the order of `params`, plus (loss sum, correct), from the recorded
/// tape of one private forward pass (`privacy::grad_sample::clipped_sums`): in one backward pass
/// (`--grad-sample tape`) or, where the clipping and the layers allow, two (`two-pass`).
fn clipped_sums_recorded(
    model: &dyn Model,
    params: &[(String, Tensor)],
    batch: &Batch,
    engine: &PrivacyEngine,
    passes: BackwardPasses,
) -> Result<(Clipped, [Tensor; 2])> {
    let mut ctx = Ctx::private();
    let logits = model.forward(&batch.features, &mut ctx)?;
    let losses = model.example_losses(&logits, &batch.features, &batch.labels);
    let clipped = clipped_sums(&mut ctx, params, &losses, engine.clipping(), passes)?;
    let loss_sum = losses.detach().sum(losses.kind());
    let correct = model.correct(&logits, &batch.features, &batch.labels);
    Ok((clipped, [loss_sum, correct]))
}

/// The same from per-example autograd, one example at a time (`--grad-sample oracle`).
fn clipped_sums_oracle(
    model: &dyn Model,
    params: &[(String, Tensor)],
    batch: &Batch,
    engine: &PrivacyEngine,
) -> Result<(Clipped, [Tensor; 2])> {
    let device = batch.labels.device();
    let mut sums: Vec<Tensor> = params
        .iter()
        .map(|(_, p)| p.zeros_like().detach())
        .collect();
    let mut loss_sum = Tensor::zeros([], (Kind::Float, device));
    let mut correct = Tensor::zeros([], (Kind::Double, device));
    let mut over = Tensor::zeros([], (Kind::Int64, device));
    let mut norms = Vec::with_capacity(batch.len() as usize);
    for i in 0..batch.len() {
        let index = crate::host::upload(&Tensor::from_slice(&[i]), device);
        let features = batch.features.select_trimmed(&index, None);
        let label = batch.labels.index_select(0, &index);
        for (_, p) in params {
            p.shallow_clone().zero_grad();
        }
        let mut ctx = Ctx::train();
        let logits = model.forward(&features, &mut ctx)?;
        let loss = model
            .example_losses(&logits, &features, &label)
            .sum(Kind::Float);
        ctx.backward(&loss);
        let grads: Vec<Tensor> = params
            .iter()
            .map(|(_, p)| {
                let g = p.grad();
                if g.defined() {
                    g.copy()
                } else {
                    p.zeros_like().detach()
                }
            })
            .collect();
        let squares: Vec<Tensor> = grads.iter().map(|g| g.square().sum(g.kind())).collect();
        let (factors, norm) = engine.clipping().factors(&squares);
        norms.push(norm.reshape([1]));
        for ((sum, g), f) in sums.iter_mut().zip(&grads).zip(&factors) {
            *sum += g * f;
        }
        let any = Tensor::stack(&factors.iter().map(|f| f.lt(1.0)).collect::<Vec<_>>(), 0).any();
        loss_sum += loss.detach().to_kind(Kind::Float);
        correct += model.correct(&logits, &features, &label);
        over += any.to_kind(Kind::Int64);
    }
    let clipped = Clipped {
        sums,
        norms: Tensor::cat(&norms, 0),
        clipped: over,
    };
    Ok((clipped, [loss_sum, correct]))
}

/// One logical DP-SGD step on the examples `index` of `data`: clipped by the engine, noised
/// and counted by it, then sent through the updater. `canaries`: an audit's white-box canaries,
/// sampled into the clipped sum and shown the weights after the step.
#[allow(clippy::too_many_arguments)]
pub fn dp_step(
    model: &dyn Model,
    params: &[(String, Tensor)],
    updater: &mut Updater,
    data: &Dataset,
    index: &Tensor,
    device: Device,
    settings: &DpSettings,
    engine: &mut PrivacyEngine,
    mut canaries: Option<&mut GradientCanaries>,
) -> Result<StepTotals> {
    let n = index.size()[0];
    let tensors: Vec<Tensor> = params.iter().map(|(_, p)| p.shallow_clone()).collect();
    // The first chunk's sums become the logical batch's (no zero parameter-sized buffer held
    // through the forward and backward passes); later chunks add to them.
    let mut logical: Option<Clipped> = None;
    let mut totals = [
        Tensor::zeros([], (Kind::Float, device)),
        Tensor::zeros([], (Kind::Int64, device)),
    ];
    let chunk = settings.physical_batch.unwrap_or(n).max(1);
    let mut start = 0;
    while start < n {
        let batch = data.batch(&index.narrow(0, start, chunk.min(n - start)), device, true);
        let (part, chunk_totals) = match settings.mode {
            GradSampleMode::Tape => {
                clipped_sums_recorded(model, params, &batch, engine, BackwardPasses::One)?
            }
            GradSampleMode::TwoPass => {
                clipped_sums_recorded(model, params, &batch, engine, BackwardPasses::Two)?
            }
            GradSampleMode::Oracle => clipped_sums_oracle(model, params, &batch, engine)?,
        };
        match logical.as_mut() {
            Some(sums) => sums.add(part),
            None => {
                let mut part = part;
                part.norms = part.norms.to_kind(Kind::Float);
                logical = Some(part);
            }
        }
        for (total, part) in totals.iter_mut().zip(chunk_totals) {
            *total += part.to_kind(total.kind());
        }
        start += chunk;
    }
    let mut logical = logical.unwrap_or_else(|| Clipped::empty(&tensors));
    // An audit's gradient canaries join the clipped sum like examples (`privacy::canary`).
    if let Some(canaries) = canaries.as_deref_mut() {
        canaries.inject(&mut logical, &tensors, engine.clipping());
    }
    // Noise and the accountant's step, together (`PrivacyEngine::privatize`).
    let grads = engine.privatize_dividing_by(&logical, settings.expected_batch)?;
    updater.step(&tensors, &grads)?;
    if let Some(canaries) = canaries {
        canaries.observe_step(&tensors, settings.expected_batch);
    }
    let [loss_sum, correct] = totals;
    Ok(StepTotals {
        loss_sum,
        correct,
        clipped: logical.clipped,
    })
}

/// One private forward and backward pass over a batch.
pub struct PerSampleBatch {
    /// (parameter, its per-sample gradient recipe), in the order of the trainable parameters.
    pub per_sample: Vec<(Tensor, PerSample)>,
    /// The model's output, [B, classes].
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
    let mut ctx = if dropout {
        Ctx::private()
    } else {
        Ctx::private().without_dropout()
    };
    let logits = model.forward(&batch.features, &mut ctx)?;
    let losses = model.example_losses(&logits, &batch.features, &batch.labels);
    let loss_sum = losses.sum(losses.kind());
    let ordered = per_sample_of(&mut ctx, params, &loss_sum)?;
    Ok(PerSampleBatch {
        per_sample: ordered,
        logits,
        loss_sum,
    })
}
