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
//! and their norms and sums are `nn::per_sample`. `tests/layers/grad_sample.rs` checks everything
//! here against per-example autograd.
//!
//! Memory. Where every layer runs in autograd, the backward pass asks only for the
//! gradients of the earliest recorded outputs (`nn::grad_hook::edges_reach_another`) and a
//! gradient hook on every recorded output's autograd node (`nn::grad_hook::on_grad_at`) forms
//! that layer's recipe (and, for clipping, its per-sample squared norms) the moment autograd
//! computes the output's gradient; the record and the gradient go right after unless the recipe
//! keeps them, and autograd frees what it saved for the forward pass as the pass goes, as in a
//! non-private step. No weight gradient is computed. Recipes are computed over chunks of examples
//! (`nn::per_sample::CHUNK_ELEMENTS`), so no temporary outgrows what the pass just freed. The
//! clipped sums are then contracted from the kept recipes (`clipped_sums`,
//! `BackwardPasses::One`, the default `--grad-sample tape`). The recurrent layers run outside
//! autograd and hand their input's gradient back through `LayerGradients::upstream`; a tape
//! with one takes the backward pass to every recorded output at once
//! (`per_sample_to_every_output`), holding all their output gradients until the recipes are
//! made.
//!
//! `BackwardPasses::Two` (`--grad-sample two-pass`) is Opacus's "fast gradient clipping" (Bu
//! et al. 2023, Algorithm 1's two passes): only the norms are taken inside the first pass, which
//! keeps the graph, and the second is one ordinary backward pass of Σ_i c_i loss_i, whose
//! parameter gradients are exactly Σ_i c_i g_i. It needs one factor c_i per example (flat or
//! adaptive clipping).

use super::engine::{Clipped, Clipping, StepClipping};
use crate::error::{Error, Result};
use crate::nn::grad_hook::GradEdge;
use crate::nn::grad_hook::{backward_to, edges_reach_another, on_grad_at, HookStatus};
use crate::nn::{Ctx, LayerGradients, Record, Recorded, Tape};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tch::{Kind, Tensor};

pub use crate::nn::per_sample::{
    ghost_is_cheaper, ghost_is_cheaper_than_dropped, outer, patches, pixel_grams, Activations,
    PerSample, PerSampleGradient, KEEP_INSTANTIATED_FACTOR, MAX_INSTANTIATED, MEMORY_WEIGHT,
};

/// Adds d(root)/d(output) to the gradients of the records in `targets`.
fn accumulate(
    grads: &mut [Option<Tensor>],
    records: &[Record],
    targets: &[usize],
    root: &Tensor,
) -> Result<()> {
    if targets.is_empty() {
        return Ok(());
    }
    let edges: Vec<_> = targets.iter().map(|&k| &records[k].output.edge).collect();
    let found = backward_to(root, &edges, false)?;
    for (&k, g) in targets.iter().zip(found) {
        if g.defined() {
            grads[k] = Some(match grads[k].take() {
                Some(sum) => sum + g,
                None => g,
            });
        }
    }
    Ok(())
}

/// Every trainable parameter on the tape with the recipe for its per-sample gradients, from one
/// backward pass of `loss_sum` (= Σ_i loss_i): formed inside it by gradient hooks when every
/// layer runs in autograd (`in_backward`), otherwise from the output gradients of every record
/// at once (`per_sample_to_every_output`). Errors if a parameter appears twice (a layer used
/// twice in one forward pass would need its per-sample gradients summed first).
pub fn per_sample_gradients(tape: Tape, loss_sum: &Tensor) -> Result<Vec<(Tensor, PerSample)>> {
    if !tape_runs_in_autograd(&tape) {
        return per_sample_to_every_output(tape, loss_sum);
    }
    Ok(in_backward(tape, loss_sum, Keep::Recipes, false)?
        .into_iter()
        .map(|f| (f.parameter, f.recipe.expect("kept")))
        .collect())
}

/// The recipes from one backward pass asking for every recorded output's gradient; the only way
/// through a layer that ran outside autograd (the LSTM's and the GRU's recurrences hand their
/// input's gradient back through `LayerGradients::upstream`, a second backward pass).
pub fn per_sample_to_every_output(
    tape: Tape,
    loss_sum: &Tensor,
) -> Result<Vec<(Tensor, PerSample)>> {
    let mut records = tape.records;
    let mut grads: Vec<Option<Tensor>> = (0..records.len()).map(|_| None).collect();
    let attached: Vec<usize> = (0..records.len())
        .filter(|&k| records[k].output.requires_grad)
        .collect();
    accumulate(&mut grads, &records, &attached, loss_sum)?;
    let mut out = Vec::new();
    // Last layer first; each record is dropped once its recipe is made, so the layer's output
    // and any input the recipe does not keep are freed as the loop goes (an LSTM's second
    // backward only reaches earlier records, which are still there).
    while let Some(record) = records.pop() {
        let k = records.len();
        let grad = grads[k].take().unwrap_or_else(|| record.output.zeros());
        let LayerGradients {
            parameters,
            upstream,
        } = record.layer.per_sample(&grad);
        out.extend(parameters);
        if let Some(root) = upstream {
            // The layer ran outside autograd: its input's gradient reaches the earlier records
            // through this scalar (an LSTM over an embedding).
            let earlier: Vec<usize> = attached.iter().copied().filter(|&j| j < k).collect();
            accumulate(&mut grads, &records, &earlier, &root)?;
        }
    }
    each_parameter_once(out.iter().map(|(p, _)| p))?;
    Ok(out)
}

/// An error if a parameter appears twice (a layer used twice in one forward pass would need its
/// per-sample gradients summed first).
fn each_parameter_once<'a>(found: impl IntoIterator<Item = &'a Tensor>) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for param in found {
        if !seen.insert(param.data_ptr() as usize) {
            return Err(Error::bad_value(
                "model",
                format!("a parameter of shape {:?} is used twice in one forward pass; per-sample gradients need each layer once", param.size()),
            ));
        }
    }
    Ok(())
}

/// The context's tape (it records nothing afterwards); an error if the forward pass did not run
/// under `Ctx::private`.
fn recorded_tape(ctx: &mut Ctx) -> Result<Tape> {
    ctx.take_tape().ok_or_else(|| {
        Error::bad_value(
            "context",
            "no tape: run the forward pass under Ctx::private to get per-sample gradients",
        )
    })
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
    let tape = recorded_tape(ctx)?;
    in_parameter_order(per_sample_gradients(tape, loss_sum)?, params)
}

/// Whether the two-pass clipping can serve this tape: every record's output is on the autograd
/// graph (none is a leaf that a layer run outside autograd made, as the LSTM's and the GRU's
/// are).
pub fn tape_runs_in_autograd(tape: &Tape) -> bool {
    tape.records
        .iter()
        .all(|r| !r.output.requires_grad || !r.output.is_leaf)
}

/// What the hooks keep of each parameter's per-sample gradients.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// ||g_i||² only (the first of two passes).
    Norms,
    /// The recipe only (`per_sample_gradients`).
    Recipes,
    /// Both (the one-pass clipping).
    Both,
}

/// A parameter's per-sample gradients as the hooks left them.
struct Found {
    parameter: Tensor,
    recipe: Option<PerSample>,
    squared_norms: Option<Tensor>,
}

/// The records' layers still waiting for their output gradient, and what the hooks made of
/// those done; shared with the hooks.
struct Pending {
    layers: Vec<Option<Box<dyn Recorded>>>,
    found: Vec<Found>,
    /// A record handed back an `upstream` (it ran outside autograd): the caller's check failed.
    upstream: bool,
    keep: Keep,
}

/// `Pending` behind a lock the hooks can hold. SAFETY of `Send`: the tensors and layers inside
/// are only touched by the thread that runs the backward pass (the caller's on the CPU,
/// autograd's device thread on CUDA) while the caller waits in `run_backward`, or by the
/// caller before and after it; the mutex orders those accesses.
struct SharedPending(Mutex<Pending>);
unsafe impl Send for SharedPending {}
unsafe impl Sync for SharedPending {}

impl SharedPending {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forms record `k`'s recipes from its output gradient, keeps what `keep` asks for and drops
    /// the record (its input goes with it unless a recipe holds it); a record already done is
    /// skipped.
    fn take(&self, k: usize, output_grad: &Tensor) {
        let (layer, keep) = {
            let mut pending = self.lock();
            (pending.layers[k].take(), pending.keep)
        };
        if let Some(layer) = layer {
            let LayerGradients {
                parameters,
                upstream,
            } = layer.per_sample(output_grad);
            drop(layer);
            let found: Vec<Found> = parameters
                .into_iter()
                .map(|(parameter, recipe)| {
                    let squared_norms = (keep != Keep::Recipes).then(|| recipe.squared_norms());
                    Found {
                        parameter,
                        recipe: (keep != Keep::Norms).then_some(recipe),
                        squared_norms,
                    }
                })
                .collect();
            let mut pending = self.lock();
            pending.found.extend(found);
            pending.upstream |= upstream.is_some();
        }
    }
}

/// Every parameter on the tape with what `keep` asks for of its per-sample gradients, formed
/// inside one backward pass of `loss_sum` by a hook on each recorded output the moment autograd
/// computes that output's gradient: the record (its input) and the gradient go right after, so
/// no two layers' output gradients need to live at once, and autograd frees what it saved for
/// the forward pass as it goes (unless `keep_graph`, which the two-pass clipping needs). The
/// backward pass asks only for the gradients of the earliest recorded outputs
/// (`nn::grad_hook::edges_reach_another`), so no weight gradient is computed and every other
/// record's node is passed through; a record no gradient reaches gets zero. Every record's
/// output must be on the autograd graph (`tape_runs_in_autograd`).
fn in_backward(tape: Tape, loss_sum: &Tensor, keep: Keep, keep_graph: bool) -> Result<Vec<Found>> {
    if !tape_runs_in_autograd(&tape) {
        return Err(Error::bad_value(
            "model",
            "a layer ran outside autograd (an LSTM or GRU): its per-sample gradients need the backward pass to every recorded output",
        ));
    }
    let count = tape.records.len();
    let mut outputs = Vec::with_capacity(count);
    let mut layers = Vec::with_capacity(count);
    for record in tape.records {
        outputs.push(record.output);
        layers.push(Some(record.layer));
    }
    let shared = Arc::new(SharedPending(Mutex::new(Pending {
        layers,
        found: Vec::new(),
        upstream: false,
        keep,
    })));
    let edges: Vec<&GradEdge> = outputs.iter().map(|o| &o.edge).collect();
    let reaches = edges_reach_another(&edges)?;
    let mut statuses: Vec<HookStatus> = Vec::new();
    let mut earliest: Vec<usize> = Vec::new();
    for (k, output) in outputs.iter().enumerate() {
        if !output.requires_grad {
            continue;
        }
        let hook_shared = shared.clone();
        statuses.push(on_grad_at(&output.edge, move |grad| {
            hook_shared.take(k, &grad)
        })?);
        // Only the earliest outputs are the backward pass's targets; it runs through the others'
        // nodes, where their hooks fire.
        if !reaches[k] {
            earliest.push(k);
        }
    }
    if !earliest.is_empty() {
        let targets: Vec<&GradEdge> = earliest.iter().map(|&k| &outputs[k].edge).collect();
        let found = backward_to(loss_sum, &targets, keep_graph)?;
        // A hook on an output asked for may not run; its gradient is the one returned.
        for (k, grad) in earliest.into_iter().zip(found) {
            if grad.defined() {
                shared.take(k, &grad);
            }
        }
    }
    for status in &statuses {
        if let Some(what) = status.panicked() {
            return Err(Error::bad_value(
                "model",
                format!("a layer's per-sample gradients failed inside the backward pass: {what}"),
            ));
        }
    }
    for (k, output) in outputs.iter().enumerate() {
        if shared.lock().layers[k].is_some() {
            shared.take(k, &output.zeros());
        }
    }
    let mut pending = shared.lock();
    if pending.upstream {
        return Err(Error::bad_value(
            "model",
            "a layer handed back an upstream gradient (it ran outside autograd): use the backward pass to every recorded output",
        ));
    }
    let found = std::mem::take(&mut pending.found);
    each_parameter_once(found.iter().map(|f| &f.parameter))?;
    Ok(found)
}

/// Pass 1 of the two-pass clipping: every parameter on the tape with its per-sample squared
/// norms \[B\], taken inside one backward pass of `loss_sum` that keeps the graph for pass 2
/// (`in_backward`).
pub fn squared_norms_in_backward(tape: Tape, loss_sum: &Tensor) -> Result<Vec<(Tensor, Tensor)>> {
    Ok(in_backward(tape, loss_sum, Keep::Norms, true)?
        .into_iter()
        .map(|f| (f.parameter, f.squared_norms.expect("kept")))
        .collect())
}

/// How many backward passes the clipping takes (`clipped_sums`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackwardPasses {
    /// Recipes and norms formed inside one pass, the clipped sums contracted from the recipes.
    One,
    /// Norms inside the first pass, the clipped sums from a second, reweighted one.
    Two,
}

/// The clipped sums of one private forward pass (`Ctx::private`, whose tape this takes) over a
/// batch with per-example losses `losses` \[B\], for `params` in their order. When every layer
/// runs in autograd: in one backward pass with the recipes and norms formed inside it
/// (`BackwardPasses::One`), or, under flat or adaptive clipping, in two (`BackwardPasses::Two`,
/// module docs). Otherwise from the output gradients of every record at once. A trainable
/// parameter that no record covers is an error: it would escape clipping. `clipping`: a rule
/// (`&Clipping`) or the engine's as a step applies it (`PrivacyEngine::clipping`).
pub fn clipped_sums<'a>(
    ctx: &mut Ctx,
    params: &[(String, Tensor)],
    losses: &Tensor,
    clipping: impl Into<StepClipping<'a>>,
    passes: BackwardPasses,
) -> Result<Clipped> {
    let clipping = clipping.into();
    let loss_sum = losses.sum(losses.kind());
    let tape = recorded_tape(ctx)?;
    if losses.size().first() == Some(&0) {
        // No example (an empty Poisson batch): nothing to clip, nothing to sum.
        return Ok(Clipped {
            sums: params
                .iter()
                .map(|(_, p)| p.zeros_like().detach())
                .collect(),
            norms: losses.detach().zeros_like(),
            clipped: Tensor::zeros([], (Kind::Int64, losses.device())),
        });
    }
    if !tape_runs_in_autograd(&tape) {
        let per_sample = in_parameter_order(per_sample_to_every_output(tape, &loss_sum)?, params)?;
        return Ok(clipping.clip(&per_sample));
    }
    let one_factor = matches!(
        clipping.rule(),
        Clipping::Flat { .. } | Clipping::Adaptive(_)
    );
    if passes == BackwardPasses::One || !one_factor {
        let found: Vec<(Tensor, (PerSample, Tensor))> =
            in_backward(tape, &loss_sum, Keep::Both, false)?
                .into_iter()
                .map(|f| {
                    let kept = (f.recipe.expect("kept"), f.squared_norms.expect("kept"));
                    (f.parameter, kept)
                })
                .collect();
        let (recipes, squared): (Vec<(Tensor, PerSample)>, Vec<Tensor>) =
            in_parameter_order(found, params)?
                .into_iter()
                .map(|(p, (recipe, squares))| ((p, recipe), squares))
                .unzip();
        return Ok(clipping.clip_consuming(recipes, &squared));
    }
    let tensors: Vec<Tensor> = params.iter().map(|(_, p)| p.shallow_clone()).collect();
    let squared = in_parameter_order(squared_norms_in_backward(tape, &loss_sum)?, params)?;
    let squared: Vec<Tensor> = squared.into_iter().map(|(_, s)| s).collect();
    let (mut factors, norms) = clipping.factors(&squared);
    let factor = factors.swap_remove(0).detach();
    // Pass 2: d(Σ_i c_i loss_i)/dθ = Σ_i c_i g_i.
    let weighted = (losses * factor.to_kind(losses.kind())).sum(losses.kind());
    let refs: Vec<&Tensor> = tensors.iter().collect();
    let sums = Tensor::run_backward(&[&weighted], &refs, false, false)
        .into_iter()
        .zip(&tensors)
        .map(|(g, p)| {
            if g.defined() {
                g
            } else {
                p.zeros_like().detach()
            }
        })
        .collect();
    Ok(Clipped {
        sums,
        norms,
        clipped: factor.lt(1.0).sum(Kind::Int64),
    })
}

/// `found` (parameter, anything) reordered as `params`; a parameter missing from `found` is an
/// error naming it (it would escape clipping).
fn in_parameter_order<T>(
    found: Vec<(Tensor, T)>,
    params: &[(String, Tensor)],
) -> Result<Vec<(Tensor, T)>> {
    let mut by_ptr: HashMap<usize, (Tensor, T)> = found
        .into_iter()
        .map(|(p, r)| (p.data_ptr() as usize, (p, r)))
        .collect();
    params
        .iter()
        .map(|(name, p)| {
            by_ptr.remove(&(p.data_ptr() as usize)).ok_or_else(|| {
                Error::bad_value(
                    "model",
                    format!("trainable parameter {name} is not on the per-sample tape: it would escape clipping (build every trainable layer from dpcomp's layers, e.g. dpcomp::nn::Linear rather than tch::nn::Linear, which record what per-sample gradients need in a private forward pass, or from a layer of one's own that implements nn::Recorded)"),
                )
            })
        })
        .collect()
}

/// Per-sample norms over all parameters and the clipped sum of each parameter's gradients.
pub struct ClippedSum {
    /// ||g_i|| over every trainable parameter, \[B\].
    pub norms: Tensor,
    /// c_i = min(1, C / (||g_i|| + 1e-6)), \[B\].
    pub factors: Tensor,
    /// (parameter, Σ_i c_i g_i).
    pub grads: Vec<(Tensor, Tensor)>,
}

/// Flat clipping at radius C = `max_norm` of `(parameter, per-sample gradient)` pairs:
/// each example's norm over all the parameters, its factor c_i, and each parameter's clipped
/// sum Σ_i c_i g_i (`f64::INFINITY`: norms and plain sums). For checking layers' per-sample
/// gradients; training clips through [`PrivacyEngine::clip`](super::engine::PrivacyEngine::clip).
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
