//! Per-sample gradient recipes: how one parameter's per-sample gradients g_i are formed from
//! what its layer recorded, and the three things DP-SGD needs of them: ||g_i||² for every
//! example, the clipped sum Σ_i c_i g_i, and (tests, oracles) every g_i. Built-in layers use the
//! `PerSample` forms; a user's layer whose gradients fit none of them implements
//! `PerSampleGradient` and returns `PerSample::Custom` (`examples/`).
//!
//! Per layer, ||g_i||² comes either from the ghost-norm identity (Li et al. 2022; Opacus's
//! ghost clipping) — for g_i = Σ_t b_it a_it^T, ||g_i||² = <A_i A_iᵀ, B_i B_iᵀ> — or from the
//! instantiated g_i, whichever costs fewer operations for the layer's shapes
//! (`ghost_is_cheaper`).

use tch::{Kind, Tensor};

/// A parameter's per-sample gradients in a form of the layer's choosing: what a layer kind that
/// dpcomp does not have implements (the built-in forms are `PerSample`'s other variants).
pub trait PerSampleGradient {
    /// ||g_i||², [B].
    fn squared_norms(&self) -> Tensor;
    /// Σ_i c_i g_i in the parameter's shape; `c` is [B].
    fn weighted_sum(&self, c: &Tensor) -> Tensor;
    /// Every g_i, [B, ...parameter shape] (tests and oracles; may be memory-hungry).
    fn materialize(&self) -> Tensor;
}

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
    /// A user layer's own form.
    Custom(Box<dyn PerSampleGradient>),
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
            PerSample::Custom(g) => g.squared_norms(),
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
            PerSample::Custom(g) => g.weighted_sum(c),
        }
    }

    /// Every g_i, [B, ...parameter shape] (tests and the oracle; memory-hungry).
    pub fn materialize(&self) -> Tensor {
        match self {
            PerSample::Outer { a, b, shape, .. } => {
                let mut full = vec![a.dims().0];
                full.extend(shape);
                b.transpose(1, 2).bmm(&a.get()).reshape(full.as_slice())
            }
            PerSample::Direct(g) => g.shallow_clone(),
            PerSample::Rows { ids, b, rows } => {
                let (batch, d) = (ids.size()[0], b.size()[2]);
                let offsets =
                    Tensor::arange(batch, (Kind::Int64, ids.device())).view([-1, 1]) * *rows;
                let index = (ids + offsets).reshape([-1]);
                Tensor::zeros([batch * rows, d], (b.kind(), b.device()))
                    .index_add(0, &index, &b.reshape([-1, d]))
                    .view([batch, *rows, d])
            }
            PerSample::Custom(g) => g.materialize(),
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
pub(crate) fn sum_except(x: &Tensor, keep: i64) -> Tensor {
    let dims: Vec<i64> = (1..x.dim() as i64).filter(|&d| d != keep).collect();
    if dims.is_empty() {
        x.shallow_clone()
    } else {
        x.sum_dim_intlist(dims.as_slice(), false, x.kind())
    }
}
