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
//! `tests/grad_sample.rs` checks everything here against per-example autograd.

use crate::error::{Error, Result};
use crate::nn::lstm::gate_gradients;
use crate::nn::{Layer, Record, Tape};
use tch::{Kind, Tensor};

/// Where a layer's activations a [B, T, in] come from.
pub enum Activations {
    /// Held as they are (linear layers, the LSTM's inputs and hidden states).
    Held(Tensor),
    /// A convolution's input: its patches [B, L, C k k] are cut when a norm or a sum needs them
    /// and dropped right after, so that at most one layer's patches exist at a time.
    Patches {
        input: Tensor,
        kernel: i64,
        stride: i64,
        padding: i64,
    },
}

impl Activations {
    /// a, [B, T, in].
    pub fn get(&self) -> Tensor {
        match self {
            Activations::Held(a) => a.shallow_clone(),
            Activations::Patches {
                input,
                kernel,
                stride,
                padding,
            } => patches(input, *kernel, *stride, *padding).transpose(1, 2),
        }
    }

    /// (B, T, in) without cutting patches.
    fn dims(&self) -> (i64, i64, i64) {
        match self {
            Activations::Held(a) => (a.size()[0], a.size()[1], a.size()[2]),
            Activations::Patches {
                input,
                kernel,
                stride,
                padding,
            } => {
                let s = input.size();
                let rows = (s[2] + 2 * padding - kernel) / stride + 1;
                let cols = (s[3] + 2 * padding - kernel) / stride + 1;
                (s[0], rows * cols, s[1] * kernel * kernel)
            }
        }
    }

    /// Elements the book-keeping holds for this layer anyway (the recorded input).
    fn held_elements(&self) -> i64 {
        match self {
            Activations::Held(a) => a.numel() as i64,
            Activations::Patches { input, .. } => input.numel() as i64,
        }
    }
}

/// How one parameter's per-sample gradients are formed.
pub enum PerSample {
    /// g_i = Σ_t b_it a_itᵀ with a [B, T, in], b [B, T, out], viewed as `shape`, kept factored:
    /// ||g_i||² by the ghost identity (`ghost`) or from g_i instantiated for this layer alone and
    /// dropped, Σ_i c_i g_i as one contraction (c b)ᵀ a.
    Outer {
        a: Activations,
        b: Tensor,
        shape: Vec<i64>,
        ghost: bool,
    },
    /// g_i given directly, [B, ...parameter shape].
    Direct(Tensor),
    /// Embedding rows: g_i = Σ_t e_{ids_it} b_itᵀ with ids [B, T], b [B, T, d], `rows` rows.
    Rows { ids: Tensor, b: Tensor, rows: i64 },
}

/// Largest instantiated per-sample gradient tensor (elements) before the ghost norm is used
/// regardless of cost: 2^28 f32 values are 1 GiB.
pub const MAX_INSTANTIATED: i64 = 1 << 28;

/// Instantiated gradients are written once and read twice (norm, weighted sum); each of those
/// B in out memory passes is counted as this many multiply-adds when comparing costs.
pub const MEMORY_WEIGHT: i64 = 24;

/// Whether a layer whose per-sample gradients are g_i = Σ_t b_it a_itᵀ (T steps, `input` x
/// `output` weights, `batch` examples) should use the ghost norm.
///
/// Instantiating costs B T in out multiply-adds plus three passes over the B in out stored
/// gradients (write, norm, weighted sum); the ghost norm costs B T² (in + out) and the clipped
/// sum then needs the full contraction (B T in out). So the ghost norm is cheaper when
/// T² (in + out) < MEMORY_WEIGHT in out: always for T = 1 (||a_i||² ||b_i||²) and for the LSTM's
/// short sequences, not for convolutions' many positions. It is also used when the instantiated
/// tensor would exceed `MAX_INSTANTIATED`.
pub fn ghost_is_cheaper(batch: i64, steps: i64, input: i64, output: i64) -> bool {
    steps * steps * (input + output) < MEMORY_WEIGHT * input * output
        || batch * input * output > MAX_INSTANTIATED
}

/// An instantiated g is kept when it has at most this many times the elements of the input the
/// book-keeping holds for the layer anyway; a larger one is formed twice (norm, then clipped sum
/// by contraction) rather than held.
pub const KEEP_INSTANTIATED_FACTOR: i64 = 8;

/// The per-sample gradient recipe for g_i = Σ_t b_it a_itᵀ (a [B, T, in], b [B, T, out]).
/// The ghost norm is used where `ghost_is_cheaper` says so. Otherwise g is instantiated, and kept
/// (its clipped sum is then one GEMV) when it has at most `KEEP_INSTANTIATED_FACTOR` times the
/// elements of the input the book-keeping holds for this layer anyway; a larger g is formed for
/// the norm, dropped, and the clipped sum taken by contraction (issue 16, memory). ResNet-18's
/// largest instantiated g, layer2's 3x3 128->128 convolution at batch 64, is 4.5x its input, so
/// there every one is kept; the rule bounds what an unusual layer can hold.
pub fn outer(a: Activations, b: Tensor, shape: Vec<i64>) -> PerSample {
    let (batch, steps, input) = a.dims();
    let output = b.size()[2];
    let ghost = ghost_is_cheaper(batch, steps, input, output);
    if !ghost && batch * input * output <= KEEP_INSTANTIATED_FACTOR * a.held_elements() {
        let mut full = vec![batch];
        full.extend(&shape);
        PerSample::Direct(b.transpose(1, 2).bmm(&a.get()).reshape(full.as_slice()))
    } else {
        PerSample::Outer { a, b, shape, ghost }
    }
}

impl PerSample {
    fn batch(&self) -> i64 {
        match self {
            PerSample::Outer { a, .. } => a.dims().0,
            PerSample::Direct(g) => g.size()[0],
            PerSample::Rows { ids, .. } => ids.size()[0],
        }
    }

    /// ||g_i||², [B]; for `Outer` by the ghost identity ||Σ_t b_t a_tᵀ||² = <A Aᵀ, B Bᵀ>
    /// (for T = 1, ||a||² ||b||²).
    pub fn squared_norms(&self) -> Tensor {
        match self {
            PerSample::Outer { a, b, ghost, .. } => {
                let a = a.get();
                if !*ghost {
                    return b
                        .transpose(1, 2)
                        .bmm(&a)
                        .flatten(1, -1)
                        .norm_scalaropt_dim(2.0, [1i64].as_slice(), false)
                        .square();
                }
                let sum12 = |x: &Tensor| x.sum_dim_intlist([1, 2].as_slice(), false, x.kind());
                if a.size()[1] == 1 {
                    sum12(&a.square()) * sum12(&b.square())
                } else {
                    sum12(&(a.bmm(&a.transpose(1, 2)) * b.bmm(&b.transpose(1, 2))))
                }
            }
            // A fused norm reduction: no B x P temporary for the squares.
            PerSample::Direct(g) => g
                .flatten(1, -1)
                .norm_scalaropt_dim(2.0, [1i64].as_slice(), false)
                .square(),
            PerSample::Rows { ids, b, .. } => {
                let same = ids
                    .unsqueeze(2)
                    .eq_tensor(&ids.unsqueeze(1))
                    .to_kind(b.kind());
                let bb = b.bmm(&b.transpose(1, 2));
                (same * bb).sum_dim_intlist([1, 2].as_slice(), false, b.kind())
            }
        }
    }

    /// Σ_i c_i g_i, parameter-shaped; `c` is [B].
    pub fn weighted_sum(&self, c: &Tensor) -> Tensor {
        match self {
            PerSample::Outer { a, b, shape, .. } => {
                let a = a.get();
                let (input, output) = (a.size()[2], b.size()[2]);
                let weighted = b * c.view([-1, 1, 1]);
                weighted
                    .reshape([-1, output])
                    .tr()
                    .mm(&a.reshape([-1, input]))
                    .view(shape.as_slice())
            }
            // One GEMV, c [1, B] x g [B, P]: no B x P temporary.
            PerSample::Direct(g) => {
                let batch = g.size()[0];
                c.to_kind(g.kind())
                    .unsqueeze(0)
                    .mm(&g.reshape([batch, -1]))
                    .view(&g.size()[1..])
            }
            PerSample::Rows { ids, b, rows } => {
                let d = b.size()[2];
                let weighted = (b * c.view([-1, 1, 1])).reshape([-1, d]);
                Tensor::zeros([*rows, d], (b.kind(), b.device())).index_add(
                    0,
                    &ids.reshape([-1]),
                    &weighted,
                )
            }
        }
    }

    /// Every g_i, [B, ...parameter shape] (tests and the oracle; memory-hungry).
    pub fn materialize(&self) -> Tensor {
        match self {
            PerSample::Outer { a, b, shape, .. } => {
                let mut full = vec![self.batch()];
                full.extend(shape);
                b.transpose(1, 2).bmm(&a.get()).reshape(full.as_slice())
            }
            PerSample::Direct(g) => g.shallow_clone(),
            PerSample::Rows { ids, b, rows } => {
                let (batch, d) = (self.batch(), b.size()[2]);
                let offsets =
                    Tensor::arange(batch, (Kind::Int64, ids.device())).view([-1, 1]) * *rows;
                let index = (ids + offsets).reshape([-1]);
                Tensor::zeros([batch * rows, d], (b.kind(), b.device()))
                    .index_add(0, &index, &b.reshape([-1, d]))
                    .view([batch, *rows, d])
            }
        }
    }
}

/// The convolution's input patches, [B, C k k, L] in `im2col`'s layout (channel, kernel row,
/// kernel column; output positions row-major): a strided view of the zero-padded input copied
/// once. LibTorch's `im2col` gives the same values but runs about twice as long on CPU.
pub fn patches(input: &Tensor, kernel: i64, stride: i64, padding: i64) -> Tensor {
    let padded = input.constant_pad_nd([padding, padding, padding, padding]);
    let size = padded.size();
    let (batch, channels, height, width) = (size[0], size[1], size[2], size[3]);
    let rows = (height - kernel) / stride + 1;
    let cols = (width - kernel) / stride + 1;
    let s = padded.stride();
    padded
        .as_strided(
            [batch, channels, kernel, kernel, rows, cols],
            [s[0], s[1], s[2], s[3], s[2] * stride, s[3] * stride],
            None,
        )
        .reshape([batch, channels * kernel * kernel, rows * cols])
}

/// Sums over every dimension but 0 and `keep`.
fn sum_except(x: &Tensor, keep: i64) -> Tensor {
    let dims: Vec<i64> = (1..x.dim() as i64).filter(|&d| d != keep).collect();
    if dims.is_empty() {
        x.shallow_clone()
    } else {
        x.sum_dim_intlist(dims.as_slice(), false, x.kind())
    }
}

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
        let batch = grad.size()[0];
        match &record.layer {
            Layer::Linear {
                weight,
                bias,
                input,
            } => {
                let (input_dim, output_dim) = (weight.size()[1], weight.size()[0]);
                let a = Activations::Held(input.reshape([batch, -1, input_dim]));
                let b = grad.reshape([batch, -1, output_dim]);
                if let Some(bias) = bias {
                    out.push((
                        bias.shallow_clone(),
                        PerSample::Direct(b.sum_dim_intlist(1, false, b.kind())),
                    ));
                }
                out.push((weight.shallow_clone(), outer(a, b, weight.size())));
            }
            Layer::Conv2d {
                weight,
                bias,
                input,
                stride,
                padding,
            } => {
                let size = weight.size();
                let (out_channels, kernel) = (size[0], size[2]);
                let a = Activations::Patches {
                    input: input.shallow_clone(),
                    kernel,
                    stride: *stride,
                    padding: *padding,
                };
                let b = grad.reshape([batch, out_channels, -1]).transpose(1, 2);
                if let Some(bias) = bias {
                    out.push((
                        bias.shallow_clone(),
                        PerSample::Direct(b.sum_dim_intlist(1, false, b.kind())),
                    ));
                }
                out.push((weight.shallow_clone(), outer(a, b, size)));
            }
            Layer::Embedding { weight, ids } => {
                let (rows, d) = (weight.size()[0], weight.size()[1]);
                let recipe = PerSample::Rows {
                    ids: ids.reshape([batch, -1]),
                    b: grad.reshape([batch, -1, d]),
                    rows,
                };
                out.push((weight.shallow_clone(), recipe));
            }
            Layer::Affine {
                weight,
                bias,
                input,
                normalization,
                channel_dim,
            } => {
                // x̂ for this layer only, freed with the recipe's temporaries.
                let normalized = tch::no_grad(|| normalization.apply(input));
                out.push((
                    bias.shallow_clone(),
                    PerSample::Direct(sum_except(&grad, *channel_dim)),
                ));
                out.push((
                    weight.shallow_clone(),
                    PerSample::Direct(sum_except(&(&normalized * &grad), *channel_dim)),
                ));
            }
            Layer::Lstm {
                w_ih,
                w_hh,
                b_ih,
                b_hh,
                cache,
                input,
            } => {
                let da = tch::no_grad(|| gate_gradients(cache, w_hh, &grad)); // [T, B, 4H]
                let da_b = da.transpose(0, 1); // [B, T, 4H]
                let bias_grad = da_b.sum_dim_intlist(1, false, da.kind());
                out.push((
                    b_ih.shallow_clone(),
                    PerSample::Direct(bias_grad.shallow_clone()),
                ));
                out.push((b_hh.shallow_clone(), PerSample::Direct(bias_grad)));
                out.push((
                    w_ih.shallow_clone(),
                    outer(
                        Activations::Held(cache.xs.transpose(0, 1)),
                        da_b.shallow_clone(),
                        w_ih.size(),
                    ),
                ));
                out.push((
                    w_hh.shallow_clone(),
                    outer(
                        Activations::Held(cache.h_prev().transpose(0, 1)),
                        da_b,
                        w_hh.size(),
                    ),
                ));
                if input.requires_grad() {
                    let d_input = tch::no_grad(|| da.matmul(w_ih).transpose(0, 1));
                    let root = (input * d_input).sum(input.kind());
                    let earlier: Vec<usize> = attached.iter().copied().filter(|&j| j < k).collect();
                    accumulate(&mut grads, &records, &earlier, &root);
                }
            }
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
    let norms = Tensor::stack(&squared, 0)
        .sum_dim_intlist(0, false, squared[0].kind())
        .sqrt();
    let factors = if max_norm.is_finite() {
        (max_norm / (&norms + 1e-6)).clamp_max(1.0)
    } else {
        norms.ones_like()
    };
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
