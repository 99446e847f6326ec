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
    /// ||g_i||², \[B\].
    fn squared_norms(&self) -> Tensor;
    /// Σ_i c_i g_i in the parameter's shape; `c` is \[B\].
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
        /// The convolution's input, [B, C, H, W].
        input: Tensor,
        /// The square kernel's side.
        kernel: i64,
        /// The convolution's stride.
        stride: i64,
        /// The convolution's zero padding on every side.
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

    /// Examples `start..start + len` of a, [len, T, in] (a convolution's patches cut for those
    /// examples only).
    fn rows(&self, start: i64, len: i64) -> Tensor {
        match self {
            Activations::Held(a) => a.narrow(0, start, len),
            Activations::Patches {
                input,
                kernel,
                stride,
                padding,
            } => patches(&input.narrow(0, start, len), *kernel, *stride, *padding).transpose(1, 2),
        }
    }

    /// How many examples one chunk of a computation over this layer takes: enough that its
    /// temporaries (the examples' patches, and `per_example` more elements each) stay within
    /// `CHUNK_ELEMENTS`, at least one.
    fn chunk_len(&self, per_example: i64) -> i64 {
        let (batch, steps, input) = self.dims();
        let patches = match self {
            Activations::Held(_) => 0,
            Activations::Patches { .. } => steps * input,
        };
        (CHUNK_ELEMENTS / (patches + per_example).max(1)).clamp(1, batch.max(1))
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

    /// Examples `start..start + len` of the Gram matrices A_i A_iᵀ, [len, T, T], for the ghost
    /// norm; for a convolution from its input's pixels where that is cheaper
    /// (`grams_from_pixels`), without cutting patches.
    fn grams(&self, start: i64, len: i64) -> Tensor {
        match self {
            Activations::Patches {
                input,
                kernel,
                stride,
                padding,
            } if self.grams_from_pixels() => {
                pixel_grams(&input.narrow(0, start, len), *kernel, *stride, *padding)
            }
            _ => {
                let a = self.rows(start, len);
                a.bmm(&a.transpose(1, 2))
            }
        }
    }

    /// Whether a convolution's patch Grams are formed from the Gram matrix of its zero-padded
    /// input's P pixels (`pixel_grams`): P² C multiply-adds an example against T² C k² for the
    /// patches' own product, and no patches cut. For a stride-1 convolution P is about T, so
    /// this is about k² times cheaper; for stride 2 (P about 4 T) or a 1x1 kernel it is not.
    fn grams_from_pixels(&self) -> bool {
        match self {
            Activations::Held(_) => false,
            Activations::Patches { kernel, .. } => {
                let (_, steps, _) = self.dims();
                let pixels = self.padded_pixels();
                pixels * pixels < steps * steps * kernel * kernel
            }
        }
    }

    /// A convolution's pixels per example after zero padding, (H + 2 p) (W + 2 p); 0 for held
    /// activations.
    fn padded_pixels(&self) -> i64 {
        match self {
            Activations::Held(_) => 0,
            Activations::Patches { input, padding, .. } => {
                let s = input.size();
                (s[2] + 2 * padding) * (s[3] + 2 * padding)
            }
        }
    }

    /// How many examples one chunk of the ghost norm takes: its temporaries (the Grams of both
    /// sides, and either the patches or the pixels' Gram and its gathered entries) within
    /// `CHUNK_ELEMENTS`.
    fn ghost_chunk_len(&self) -> i64 {
        let (batch, steps, _) = self.dims();
        let grams = 2 * steps * steps;
        let per_example = match self {
            Activations::Patches { kernel, .. } if self.grams_from_pixels() => {
                let pixels = self.padded_pixels();
                grams + pixels * pixels + steps * steps * kernel * kernel
            }
            _ => return self.chunk_len(grams),
        };
        (CHUNK_ELEMENTS / per_example.max(1)).clamp(1, batch.max(1))
    }

    /// Elements the book-keeping holds for this layer anyway (the recorded input).
    fn held_elements(&self) -> i64 {
        match self {
            Activations::Held(a) => a.numel() as i64,
            Activations::Patches { input, .. } => input.numel() as i64,
        }
    }
}

/// Elements (12 MiB of f32) that one chunk of a per-sample computation may allocate for its
/// temporaries: a convolution's patches, instantiated per-sample gradients before their norm,
/// the Gram matrices of the ghost norm. Computing layer by layer over chunks of examples keeps
/// each temporary small, so that it fits in memory the backward pass just freed instead of
/// growing the heap (ResNet-18's layer1 patches are 151 MB for a batch of 64, and with them
/// whole the DP step's peak resident memory was 1.45x the non-private step's while the bytes in
/// use never exceeded the forward pass's). The size is measured: at 12 MiB ResNet-18's DP peak
/// is 1.16x the non-private step's (1.21x at 16 MiB) and the CNN's 1.05x (1.06x), the time
/// ratios unchanged; 8 MiB gave 1.18x and was 3 % slower (which sizes fit the freed holes
/// depends on the model, so smaller is not always lower).
pub const CHUNK_ELEMENTS: i64 = 3 << 20;

/// (start, len) of consecutive chunks of `len` examples covering `batch`; one empty chunk for
/// an empty batch (so that its results keep their shapes).
fn chunks(batch: i64, len: i64) -> impl Iterator<Item = (i64, i64)> {
    (0..batch.max(1))
        .step_by(len.max(1) as usize)
        .map(move |start| (start, len.min(batch - start)))
}

/// How one parameter's per-sample gradients are formed.
pub enum PerSample {
    /// g_i = Σ_t b_it a_itᵀ with a [B, T, in], b [B, T, out], viewed as `shape`, kept factored:
    /// ||g_i||² by the ghost identity (`ghost`) or from g_i instantiated for this layer alone and
    /// dropped, Σ_i c_i g_i as one contraction (c b)ᵀ a (for a convolution, its weight gradient
    /// for the output gradient c b, without cutting patches).
    Outer {
        /// The layer's input activations a, [B, T, in].
        a: Activations,
        /// The gradients b of the layer's output, [B, T, out].
        b: Tensor,
        /// The parameter's shape, which each g_i [out, in] is viewed as.
        shape: Vec<i64>,
        /// Norms by the ghost identity rather than from instantiated g_i (`ghost_is_cheaper`).
        ghost: bool,
    },
    /// g_i given directly, [B, ...parameter shape].
    Direct(Tensor),
    /// g_i instantiated in consecutive chunks of examples, each [len, ...parameter shape]: no
    /// single allocation larger than a chunk (`CHUNK_ELEMENTS`).
    Parts(Vec<Tensor>),
    /// Embedding rows: g_i = Σ_t e_{ids_it} b_itᵀ with ids [B, T], b [B, T, d], `rows` rows.
    Rows {
        /// The looked-up row indices, [B, T].
        ids: Tensor,
        /// The output gradients, [B, T, d].
        b: Tensor,
        /// The table's number of rows.
        rows: i64,
    },
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

/// Whether the ghost norm is cheaper than an instantiated g that would not be kept (larger than
/// `KEEP_INSTANTIATED_FACTOR` allows): such a g is formed (B T in out), written and read for its
/// norm (two of the three passes `MEMORY_WEIGHT` counts), and dropped, and the clipped sum is
/// then the same contraction the ghost norm needs. So the ghost norm is cheaper when
/// T² (in + out) < (T + 2 MEMORY_WEIGHT / 3) in out: for a transformer's projections at
/// T = 128 (GPT-2's 768 x 2304 attention projection: 50M against 255M multiply-adds an
/// example), not for a convolution's many positions.
pub fn ghost_is_cheaper_than_dropped(batch: i64, steps: i64, input: i64, output: i64) -> bool {
    steps * steps * (input + output) < (steps + 2 * MEMORY_WEIGHT / 3) * input * output
        || batch * input * output > MAX_INSTANTIATED
}

/// An instantiated g is kept when it has at most this many times the elements of the input the
/// book-keeping holds for the layer anyway; a larger one is formed twice (norm, then clipped sum
/// by contraction) rather than held.
pub const KEEP_INSTANTIATED_FACTOR: i64 = 8;

/// The per-sample gradient recipe for g_i = Σ_t b_it a_itᵀ (a [B, T, in], b [B, T, out]).
/// An instantiated g is kept (its clipped sum is then one GEMV) when it has at most
/// `KEEP_INSTANTIATED_FACTOR` times the elements of the input the book-keeping holds for this
/// layer anyway; a larger g is formed for the norm, dropped, and the clipped sum taken by
/// contraction (to bound memory). The ghost norm is used where it costs less than the
/// instantiation that would happen: `ghost_is_cheaper` against a kept g,
/// `ghost_is_cheaper_than_dropped` against a dropped one. ResNet-18's
/// largest instantiated g, layer2's 3x3 128->128 convolution at batch 64, is 4.5x its input, so
/// there every one is kept; the rule bounds what an unusual layer can hold. A kept g is formed
/// and held in chunks of examples (`PerSample::Parts`), no allocation larger than
/// `CHUNK_ELEMENTS` plus one chunk's patches.
pub fn outer(a: Activations, b: Tensor, shape: Vec<i64>) -> PerSample {
    let (batch, steps, input) = a.dims();
    let output = b.size()[2];
    let keepable = batch * input * output <= KEEP_INSTANTIATED_FACTOR * a.held_elements();
    let ghost = if keepable {
        ghost_is_cheaper(batch, steps, input, output)
    } else {
        ghost_is_cheaper_than_dropped(batch, steps, input, output)
    };
    if !ghost && keepable {
        let parts = chunks(batch, a.chunk_len(input * output))
            .map(|(start, len)| {
                let mut full = vec![len];
                full.extend(&shape);
                let b = b.narrow(0, start, len);
                match &a {
                    Activations::Patches {
                        input: x,
                        kernel,
                        stride: 1,
                        padding,
                    } if x.size()[1] >= GROUPED_FROM_CHANNELS => {
                        grouped_gradients(&b, &x.narrow(0, start, len), *kernel, *padding)
                            .reshape(full.as_slice())
                    }
                    _ => b
                        .transpose(1, 2)
                        .bmm(&a.rows(start, len))
                        .reshape(full.as_slice()),
                }
            })
            .collect();
        PerSample::Parts(parts)
    } else {
        PerSample::Outer { a, b, shape, ghost }
    }
}

impl PerSample {
    /// ||g_i||², \[B\]; for `Outer` by the ghost identity ||Σ_t b_t a_tᵀ||² = <A Aᵀ, B Bᵀ>
    /// (for T = 1, ||a||² ||b||²).
    pub fn squared_norms(&self) -> Tensor {
        match self {
            PerSample::Outer { a, b, ghost, .. } => {
                let (batch, steps, input) = a.dims();
                let output = b.size()[2];
                let sum12 = |x: &Tensor| x.sum_dim_intlist([1, 2].as_slice(), false, x.kind());
                let chunk = if !*ghost {
                    a.chunk_len(input * output)
                } else if steps == 1 {
                    a.chunk_len(0)
                } else {
                    a.ghost_chunk_len()
                };
                let parts: Vec<Tensor> = chunks(batch, chunk)
                    .map(|(start, len)| {
                        let b = b.narrow(0, start, len);
                        if !*ghost {
                            b.transpose(1, 2)
                                .bmm(&a.rows(start, len))
                                .flatten(1, -1)
                                .norm_scalaropt_dim(2.0, [1i64].as_slice(), false)
                                .square()
                        } else if steps == 1 {
                            let a = a.rows(start, len);
                            sum12(&a.square()) * sum12(&b.square())
                        } else {
                            sum12(&(a.grams(start, len) * b.bmm(&b.transpose(1, 2))))
                        }
                    })
                    .collect();
                Tensor::cat(&parts, 0)
            }
            // A fused norm reduction: no B x P temporary for the squares.
            PerSample::Direct(g) => squared_norms_of(g),
            PerSample::Parts(parts) => {
                Tensor::cat(&parts.iter().map(squared_norms_of).collect::<Vec<_>>(), 0)
            }
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

    /// Σ_i c_i g_i, parameter-shaped; `c` is \[B\].
    pub fn weighted_sum(&self, c: &Tensor) -> Tensor {
        match self {
            PerSample::Outer { a, b, shape, .. } => {
                let (batch, _, input) = a.dims();
                let output = b.size()[2];
                let c = c.to_kind(b.kind()).view([-1, 1, 1]);
                if let Activations::Patches {
                    input: x,
                    kernel,
                    stride,
                    padding,
                } = a
                {
                    // A convolution: the weight gradient of the output gradient scaled per
                    // example, without cutting patches (`conv2d_weight_grad`), over the same
                    // chunks of examples as the contraction, so that the kernel's temporaries
                    // stay as small.
                    let s = x.size();
                    let rows = (s[2] + 2 * padding - kernel) / stride + 1;
                    let cols = (s[3] + 2 * padding - kernel) / stride + 1;
                    let size = [output, s[1], *kernel, *kernel];
                    let mut sum: Option<Tensor> = None;
                    for (start, len) in chunks(batch, a.chunk_len(0)) {
                        let weighted = (b.narrow(0, start, len) * c.narrow(0, start, len))
                            .transpose(1, 2)
                            .reshape([len, output, rows, cols]);
                        let x = x.narrow(0, start, len);
                        let part = conv2d_weight_grad(&weighted, &x, size, *stride, *padding);
                        sum = Some(match sum {
                            Some(total) => total + part,
                            None => part,
                        });
                    }
                    return sum.expect("at least one chunk").view(shape.as_slice());
                }
                // The first chunk's product is the sum so far (0 + x = x): no zero buffer.
                let mut sum: Option<Tensor> = None;
                for (start, len) in chunks(batch, a.chunk_len(0)) {
                    let weighted = b.narrow(0, start, len) * c.narrow(0, start, len);
                    let a = a.rows(start, len);
                    let part = weighted
                        .reshape([-1, output])
                        .tr()
                        .mm(&a.reshape([-1, input]));
                    match sum.as_mut() {
                        Some(total) => *total += part,
                        None => sum = Some(part),
                    }
                }
                sum.unwrap_or_else(|| Tensor::zeros([output, input], (b.kind(), b.device())))
                    .view(shape.as_slice())
            }
            PerSample::Direct(g) => weighted_sum_of(g, c),
            PerSample::Parts(parts) => {
                let mut start = 0;
                let mut sum: Option<Tensor> = None;
                for g in parts {
                    let len = g.size()[0];
                    let part = weighted_sum_of(g, &c.narrow(0, start, len));
                    start += len;
                    sum = Some(match sum {
                        Some(total) => total + part,
                        None => part,
                    });
                }
                sum.expect("at least one example")
            }
            PerSample::Rows { b, rows, .. } => {
                let mut sum = Tensor::zeros([*rows, b.size()[2]], (b.kind(), b.device()));
                self.add_weighted_sum_to(c, &mut sum);
                sum
            }
            PerSample::Custom(g) => g.weighted_sum(c),
        }
    }

    /// `sum` += Σ_i c_i g_i, in place where the form allows (embedding rows are added into
    /// `sum` without a parameter-sized temporary).
    pub fn add_weighted_sum_to(&self, c: &Tensor, sum: &mut Tensor) {
        match self {
            PerSample::Rows { ids, b, .. } => {
                let d = b.size()[2];
                let weighted = (b * c.to_kind(b.kind()).view([-1, 1, 1])).reshape([-1, d]);
                let _ = sum.index_add_(0, &ids.reshape([-1]), &weighted);
            }
            _ => *sum += self.weighted_sum(c),
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
            PerSample::Parts(parts) => Tensor::cat(parts, 0),
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

/// Input channels from which a stride-1 convolution's per-sample gradients are formed by a
/// grouped convolution backward (`grouped_gradients`) rather than patches and a batched product.
/// On one CPU core, batch 128: the CIFAR-10 CNN's 32 -> 64 layer at 15x15 about 10 ms against
/// 14; ResNet-18's 64 -> 64 at 32x32 and 128 -> 128 at 16x16 (batch 64) 66 against 79 and 49
/// against 62 ms; the 3-channel first layers, and stride 2, were as fast or faster with patches.
pub const GROUPED_FROM_CHANNELS: i64 = 16;

/// Per-example gradients [len, out, in, k, k] of a stride-1 convolution from its output
/// gradient b [len, T, out] and input x [len, in, H, W]: the weight gradient of one convolution
/// with the examples as `len` groups, which cuts each example's patches where they are used
/// instead of all of them at once.
fn grouped_gradients(b: &Tensor, x: &Tensor, kernel: i64, padding: i64) -> Tensor {
    let (len, output) = (b.size()[0], b.size()[2]);
    let s = x.size();
    let rows = s[2] + 2 * padding - kernel + 1;
    let cols = s[3] + 2 * padding - kernel + 1;
    let grad = b.transpose(1, 2).reshape([1, len * output, rows, cols]);
    let input = x.reshape([1, len * s[1], s[2], s[3]]);
    conv2d_weight_grad_grouped(
        &grad,
        &input,
        [len * output, s[1], kernel, kernel],
        1,
        padding,
        len,
    )
    .view([len, output, s[1], kernel, kernel])
}

extern "C" {
    fn dpcomp_conv2d_weight_grad(
        grad_output: *const torch_sys::C_tensor,
        input: *const torch_sys::C_tensor,
        weight_size: *const i64,
        stride: i64,
        padding: i64,
        groups: i64,
    ) -> *mut torch_sys::C_tensor;
}

/// d/dW of Σ grad_output ⊙ conv2d(input, W) for W of `size` [out, in, k, k] (square `stride`,
/// `padding`, no dilation or groups): LibTorch's convolution backward with only the weight's
/// gradient asked for (`crates/dpcomp/src/conv_grad.cpp`), the kernel a non-private step runs.
fn conv2d_weight_grad(
    grad_output: &Tensor,
    input: &Tensor,
    size: [i64; 4],
    stride: i64,
    padding: i64,
) -> Tensor {
    conv2d_weight_grad_grouped(grad_output, input, size, stride, padding, 1)
}

/// `conv2d_weight_grad` for a convolution of `groups` groups (`size`'s in is per group).
fn conv2d_weight_grad_grouped(
    grad_output: &Tensor,
    input: &Tensor,
    size: [i64; 4],
    stride: i64,
    padding: i64,
    groups: i64,
) -> Tensor {
    // SAFETY: valid tensor handles and a 4-value array for the duration of the call; the result
    // is a new handle this side owns, or null.
    let grad = unsafe {
        dpcomp_conv2d_weight_grad(
            grad_output.as_ptr(),
            input.as_ptr(),
            size.as_ptr(),
            stride,
            padding,
            groups,
        )
    };
    assert!(
        !grad.is_null(),
        "LibTorch's convolution backward refused gradient {:?} and input {:?} for weight {size:?}",
        grad_output.size(),
        input.size()
    );
    // SAFETY: a valid, owned handle.
    unsafe { Tensor::from_ptr(grad) }
}

/// ||g_i||² of instantiated g [B, ...]: a fused norm reduction, no B x P temporary for the
/// squares.
fn squared_norms_of(g: &Tensor) -> Tensor {
    g.flatten(1, -1)
        .norm_scalaropt_dim(2.0, [1i64].as_slice(), false)
        .square()
}

/// Σ_i c_i g_i of instantiated g [B, ...]: one GEMV, c [1, B] x g [B, P], no B x P temporary.
fn weighted_sum_of(g: &Tensor, c: &Tensor) -> Tensor {
    let batch = g.size()[0];
    c.to_kind(g.kind())
        .unsqueeze(0)
        .mm(&g.reshape([batch, -1]))
        .view(&g.size()[1..])
}

/// `input` [B, C, H, W] with `padding` zeros on every side of H and W; the input itself when
/// there are none (LibTorch's `constant_pad_nd` copies its input even with no padding).
fn zero_padded(input: &Tensor, padding: i64) -> Tensor {
    if padding == 0 {
        input.shallow_clone()
    } else {
        input.constant_pad_nd([padding, padding, padding, padding])
    }
}

/// The convolution's input patches, [B, C k k, L] in `im2col`'s layout (channel, kernel row,
/// kernel column; output positions row-major): a strided view of the zero-padded input copied
/// once. LibTorch's `im2col` gives the same values but runs about twice as long on CPU.
pub fn patches(input: &Tensor, kernel: i64, stride: i64, padding: i64) -> Tensor {
    let padded = zero_padded(input, padding);
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

/// The Gram matrices P_i P_iᵀ [B, T, T] of a convolution's patches P_i [T, C k k] (`patches`),
/// from its input x [B, C, H, W] without cutting them: with K_i = X_iᵀ X_i the Gram matrix of
/// the zero-padded input's pixels (X_i [C, P]), (P_i P_iᵀ)[l, m] = Σ_(u,v) K_i[p_l + (u, v),
/// p_m + (u, v)] over the kernel's k² offsets, p_l the top-left pixel of output position l.
/// Equal to the patches' product up to rounding (tested); `Activations::grams_from_pixels` says
/// when it is the cheaper of the two.
pub fn pixel_grams(input: &Tensor, kernel: i64, stride: i64, padding: i64) -> Tensor {
    let padded = zero_padded(input, padding);
    let size = padded.size();
    let (batch, height, width) = (size[0], size[2], size[3]);
    let rows = (height - kernel) / stride + 1;
    let cols = (width - kernel) / stride + 1;
    let (steps, pixels) = (rows * cols, height * width);
    let x = padded.flatten(2, 3);
    let pixel_gram = x.transpose(1, 2).bmm(&x).view([batch, pixels * pixels]);
    // Indices into the flattened pixel Gram, built on the tensor's device (no upload): entry
    // (l, m, offset) is (p_l + offset) * P + p_m + offset.
    let on = (tch::Kind::Int64, input.device());
    let corners = (Tensor::arange(rows, on).view([-1, 1]) * (stride * width)
        + Tensor::arange(cols, on).view([1, -1]) * stride)
        .view([-1]);
    let offsets = (Tensor::arange(kernel, on).view([-1, 1]) * width
        + Tensor::arange(kernel, on).view([1, -1]))
    .view([1, 1, -1]);
    let index =
        (corners.view([-1, 1, 1]) + &offsets) * pixels + corners.view([1, -1, 1]) + &offsets;
    pixel_gram
        .index_select(1, &index.view([-1]))
        .view([batch, steps * steps, kernel * kernel])
        .sum_dim_intlist(2, false, input.kind())
        .view([batch, steps, steps])
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
