//! PowerSGD (Vogels et al. 2019) as PyTorch's `powerSGD_hook` runs it, for one worker: each
//! parameter's update plus its error-feedback residual is viewed as a matrix M [n, m]; with the
//! warm-started Q [m, r]: P = M Q, P orthonormalised (Gram-Schmidt with an epsilon), Q = Mᵀ P;
//! the receiver forms P Qᵀ; the residual M - P Qᵀ joins the next step (zero on padding).
//!
//! Matrix shape (`shape`): `square` (the paper: the flat update padded with zeros to
//! ceil(sqrt(numel)) rows of ceil(numel / rows) columns) or `rows` (PyTorch's [shape\[0\], -1]).
//! A parameter is compressed only when (n + m) r `min_rate` < n m (PyTorch's
//! `_should_compress`, default min_rate 2); others, and every vector, are sent dense and exactly.
//! On the wire: P and Q in fp32, 32 (n + m) r bits.

use super::codec::{all_reduce_sum, copy_state, take_state, AllReduce, Encoder};
use super::message::{Message, Payload};
use crate::error::Result;
use std::collections::HashMap;
use tch::{Device, Kind, Tensor};

/// How a parameter's update is viewed as the matrix M [n, m] that PowerSGD approximates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum MatrixShape {
    /// The paper's: the flat update zero-padded to ceil(sqrt(numel)) rows of ceil(numel / rows)
    /// columns (`shape=square`, the default).
    #[default]
    #[serde(rename = "square")]
    NearSquare,
    /// PyTorch's `[shape[0], -1]`: the first dimension as rows (`shape=rows`).
    #[serde(rename = "rows")]
    Rows,
}

/// PowerSGD's settings (`Compressor::PowerSgd`; on the command line `--compressor powersgd
/// --rank r` and the `--compressor-option` keys named after the fields). `Default` is the
/// command line's.
///
/// ```
/// use dpcomp::compress::{Encoder, PowerSgd, PowerSgdEncoder};
/// use tch::{Device, Kind, Tensor};
/// let settings = PowerSgd { rank: 2, ..Default::default() };
/// let mut encoder = PowerSgdEncoder::new(&[vec![64, 64], vec![64]], Device::Cpu, settings);
/// let update = [Tensor::randn([64, 64], (Kind::Float, Device::Cpu)), Tensor::randn([64], (Kind::Float, Device::Cpu))];
/// let message = encoder.encode(&update);
/// // The matrix as P [64, 2] and Q [64, 2] in fp32, the bias dense: 32 (2 * 64 * 2 + 64) bits.
/// assert_eq!(message.wire_bits(), 32 * (2 * 64 * 2 + 64));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct PowerSgd {
    /// Rank r >= 1 of the approximation P Qᵀ (at most min(n, m) per parameter).
    pub rank: i64,
    /// How each parameter is viewed as a matrix.
    pub shape: MatrixShape,
    /// A parameter is compressed only when (n + m) r `min_rate` < n m (PyTorch's
    /// `_should_compress`; default 2); the others are sent dense. 0 compresses every matrix.
    pub min_rate: f64,
    /// Added to each column's norm in the Gram-Schmidt orthonormalisation of P (default 1e-8;
    /// 0 divides by the norm alone).
    pub epsilon: f64,
    /// Start each step's power iteration from the previous step's Q (PowerSGD's warm start);
    /// off, Q is drawn afresh from `seed` every step.
    pub warm_start: bool,
    /// Seed of the N(0, 1) draws of Q, from a generator of its own (the training's random
    /// stream is untouched); the same on every worker.
    pub seed: i64,
    /// γ in [0, 1] of the error feedback e <- γ (M - P Qᵀ) (1: PowerSGD's; 0,
    /// `error_feedback=false`: the rank-r approximation of the current update alone, warm start
    /// kept).
    pub residual_decay: f64,
}

impl Default for PowerSgd {
    /// Rank 1 and the command line's defaults: near-square matrices, layers compressed when
    /// that saves at least half, ε 1e-8 in the orthonormalisation, warm start, seed 0, error
    /// feedback.
    fn default() -> Self {
        PowerSgd {
            rank: 1,
            shape: MatrixShape::NearSquare,
            min_rate: 2.0,
            epsilon: 1e-8,
            warm_start: true,
            seed: 0,
            residual_decay: 1.0,
        }
    }
}

/// The matrix a parameter of `shape` is viewed as, or `None` for a vector.
pub(crate) fn matrix_dims(shape: &[i64], how: MatrixShape) -> Option<(i64, i64)> {
    let numel: i64 = shape.iter().product();
    if shape.len() < 2 {
        return None;
    }
    Some(match how {
        MatrixShape::Rows => (shape[0], numel / shape[0]),
        MatrixShape::NearSquare => {
            let rows = (numel as f64).sqrt().ceil() as i64;
            (rows, (numel + rows - 1) / rows)
        }
    })
}

/// Orthonormalises the columns of `p` [n, r] in place by Gram-Schmidt:
/// p_i <- p_i / (||p_i|| + epsilon), then p_j -= <p_i, p_j> p_i for j > i
/// (`torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook._orthogonalize_gram_schmidt`).
pub fn orthogonalize(p: &mut Tensor, epsilon: f64) {
    let r = p.size()[1];
    for i in 0..r {
        let mut col = p.narrow(1, i, 1);
        let norm = col.norm_scalaropt_dim(2.0, [0i64].as_slice(), true);
        let _ = if epsilon == 0.0 {
            col.g_div_(&norm)
        } else {
            col.g_div_(&(norm + epsilon))
        };
        if i + 1 < r {
            let mut rest = p.narrow(1, i + 1, r - i - 1);
            let dots = (&col * &rest).sum_dim_intlist([0i64].as_slice(), true, Kind::Float);
            let _ = rest.g_sub_(&(dots * &col));
        }
    }
}

struct Layer {
    shape: Vec<i64>,
    /// (n, m, effective rank) when compressed.
    dims: Option<(i64, i64, i64)>,
    /// Error feedback residual, [n, m] (compressed layers only).
    error: Option<Tensor>,
    /// Warm-started Q, [m, r].
    q: Option<Tensor>,
}

/// PowerSGD's worker side (its receiver, `Unpack`, forms P Qᵀ statelessly).
pub struct PowerSgdEncoder {
    options: PowerSgd,
    layers: Vec<Layer>,
    /// Steps compressed so far: a host number, so that a step reads nothing from the device
    /// on CUDA. Checkpointed as the 0-d int64 tensor `step` when Q is redrawn every step.
    step: i64,
}

impl PowerSgdEncoder {
    /// An encoder for parameters of `shapes`: residuals zero and the initial Q drawn from
    /// `options.seed`, on `device`. The settings are taken as given:
    /// `Compressor::PowerSgd(..).encoder` checks them first.
    pub fn new(shapes: &[Vec<i64>], device: Device, options: PowerSgd) -> Self {
        // Q starts from N(0, 1) draws of a generator of its own (PyTorch forks the RNG with a
        // seeded state for the same reason): the training's random stream is untouched.
        let generator_seed = options.seed;
        let layers = shapes
            .iter()
            .enumerate()
            .map(|(i, shape)| {
                let dims = matrix_dims(shape, options.shape).and_then(|(n, m)| {
                    let r = options.rank.min(n).min(m);
                    ((n + m) as f64 * r as f64 * options.min_rate < (n * m) as f64)
                        .then_some((n, m, r))
                });
                let (error, q) = match dims {
                    Some((n, m, r)) => (
                        Some(Tensor::zeros([n, m], (Kind::Float, device))),
                        Some(seeded_normal(generator_seed, i as i64, 0, [m, r], device)),
                    ),
                    None => (None, None),
                };
                Layer {
                    shape: shape.clone(),
                    dims,
                    error,
                    q,
                }
            })
            .collect();
        PowerSgdEncoder {
            options,
            layers,
            step: 0,
        }
    }
}

/// N(0, 1) values of `shape` from (seed, layer, draw), reproducible and independent of the global
/// generator (drawn on the CPU, then moved). Draw 0 is the initial Q; draw t >= 1 the fresh Q of
/// step t when warm start is off.
fn seeded_normal(seed: i64, layer: i64, draw: i64, shape: [i64; 2], device: Device) -> Tensor {
    use rand::SeedableRng;
    use rand_distr::{Distribution, StandardNormal};
    let mut rng = if draw == 0 {
        // The initial Q's derivation predates redraws; kept so that earlier runs reproduce.
        rand::rngs::StdRng::seed_from_u64((seed as u64) ^ (layer as u64).rotate_left(32))
    } else {
        // (seed, layer, draw) laid side by side in the 32-byte key: distinct for every triple.
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&seed.to_le_bytes());
        key[8..16].copy_from_slice(&layer.to_le_bytes());
        key[16..24].copy_from_slice(&draw.to_le_bytes());
        rand::rngs::StdRng::from_seed(key)
    };
    let values: Vec<f32> = (0..shape[0] * shape[1])
        .map(|_| StandardNormal.sample(&mut rng))
        .collect();
    // Every step without warm start: sent without waiting for the device.
    crate::host::upload(&Tensor::from_slice(&values).view(shape), device)
}

impl PowerSgdEncoder {
    /// One step of PowerSGD for this worker. Alone (`reduce` is `None`): P = M Q, orthonormalised,
    /// Q = Mᵀ P, error M - P Qᵀ. With W workers, as PyTorch's `powerSGD_hook` runs it: every
    /// dense (uncompressed) layer and every P is summed over the workers in one all-reduce (the
    /// dense layers then divided by W; P's scale does not matter, it is orthonormalised), each
    /// worker forms Q = Mᵀ P from its own M, the Qs are averaged in a second all-reduce, and each
    /// worker keeps M - P Q̄ᵀ as its error: P Q̄ᵀ = P Pᵀ mean(M), the same on every worker.
    /// M is formed in each layer's residual, so when an all-reduce fails the residual holds
    /// M = e + g, not e: the step's error ends the run (no checkpoint is written after it).
    fn step(
        &mut self,
        update: &[Tensor],
        mut reduce: Option<(usize, &mut AllReduce)>,
    ) -> Result<Message> {
        let o = self.options.clone();
        let step = self.step + 1;
        let payloads = tch::no_grad(|| -> Result<Vec<Payload>> {
            // First pass: each layer's dense values, or its matrix M and P = M Q. M is formed
            // in place in the layer's residual (e <- e + g; the padding of a near-square
            // matrix stays zero): no [n, m] temporary, and the same sums as g + e.
            let mut dense: Vec<Option<Tensor>> = Vec::with_capacity(update.len());
            let mut matrices: Vec<Option<(Tensor, Tensor)>> = Vec::with_capacity(update.len());
            for (i, (layer, g)) in self.layers.iter_mut().zip(update).enumerate() {
                let g = g.to_kind(Kind::Float);
                let Some((n, m, _)) = layer.dims else {
                    dense.push(Some(g));
                    matrices.push(None);
                    continue;
                };
                let numel = g.numel() as i64;
                let error = layer
                    .error
                    .as_mut()
                    .expect("compressed layer has a residual");
                let _ = error
                    .view([-1])
                    .narrow(0, 0, numel)
                    .g_add_(&g.reshape([-1]));
                let matrix = error.shallow_clone();
                debug_assert_eq!(matrix.size(), [n, m]);
                let q = layer.q.as_mut().expect("compressed layer has Q");
                if !o.warm_start {
                    // A fresh Q from (seed, layer, step), as PyTorch's hook draws it from a
                    // generator of its own: the same on every worker and after a resume.
                    let (m, r) = (q.size()[0], q.size()[1]);
                    q.copy_(&seeded_normal(o.seed, i as i64, step, [m, r], q.device()));
                }
                let p = matrix.mm(q);
                dense.push(None);
                matrices.push(Some((matrix, p)));
            }
            if let Some((workers, reduce)) = reduce.as_mut() {
                // All-reduce 1: the dense layers (averaged) and the Ps (summed).
                let mut first: Vec<Tensor> =
                    dense.iter().flatten().map(Tensor::shallow_clone).collect();
                let dense_count = first.len();
                first.extend(matrices.iter().flatten().map(|(_, p)| p.shallow_clone()));
                let mut summed = all_reduce_sum(&first, reduce)?;
                let ps = summed.split_off(dense_count);
                let mut ps = ps.into_iter();
                let mut means = summed.into_iter().map(|s| s / *workers as f64);
                for slot in dense.iter_mut().filter(|d| d.is_some()) {
                    *slot = means.next();
                }
                for (_, p) in matrices.iter_mut().flatten() {
                    *p = ps.next().expect("one P per compressed layer");
                }
            }
            // Second pass: orthonormalise P, Q = Mᵀ P (averaged over the workers when several).
            let mut qs: Vec<Option<Tensor>> = matrices
                .iter_mut()
                .map(|entry| {
                    entry.as_mut().map(|(matrix, p)| {
                        orthogonalize(p, o.epsilon);
                        matrix.tr().mm(p)
                    })
                })
                .collect();
            if let Some((workers, reduce)) = reduce.as_mut() {
                let local: Vec<Tensor> = qs.iter().flatten().map(Tensor::shallow_clone).collect();
                let mut means = all_reduce_sum(&local, reduce)?
                    .into_iter()
                    .map(|s| s / *workers as f64);
                for slot in qs.iter_mut().filter(|q| q.is_some()) {
                    *slot = means.next();
                }
            }
            let mut payloads = Vec::with_capacity(update.len());
            for (((layer, values), entry), new_q) in
                self.layers.iter_mut().zip(dense).zip(matrices).zip(qs)
            {
                let (Some((matrix, p)), Some(new_q)) = (entry, new_q) else {
                    payloads.push(Payload::Dense {
                        values: values.expect("an uncompressed layer is sent dense"),
                        value_bits: 32,
                    });
                    continue;
                };
                let (n, m, _) = layer.dims.expect("compressed layer");
                let numel: i64 = layer.shape.iter().product();
                layer
                    .q
                    .as_mut()
                    .expect("compressed layer has Q")
                    .copy_(&new_q);
                // The residual holds M (first pass); it becomes γ (M - P Qᵀ) in place. P Qᵀ is
                // formed apart and then subtracted (not fused into one addmm, whose single
                // rounding would change the residual's last bits).
                let mut error = matrix;
                if o.residual_decay == 0.0 {
                    let _ = error.zero_();
                } else {
                    let _ = error.g_sub_(&p.mm(&new_q.tr()));
                    if o.residual_decay != 1.0 {
                        let _ = error.g_mul_scalar_(o.residual_decay);
                    }
                }
                if n * m > numel {
                    // Padding is not part of the update: no error is fed back there.
                    let _ = error.view([-1]).narrow(0, numel, n * m - numel).zero_();
                }
                payloads.push(Payload::LowRank {
                    p,
                    q: new_q,
                    shape: layer.shape.clone(),
                });
            }
            Ok(payloads)
        })?;
        self.step = step;
        Ok(Message::new(payloads))
    }
}

impl PowerSgdEncoder {
    /// Each compressed layer's residual and Q, shallow clones of the live tensors.
    fn layer_state(&self) -> Vec<(String, Tensor)> {
        let mut state = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            if let (Some(e), Some(q)) = (&layer.error, &layer.q) {
                state.push((format!("error.{i}"), e.shallow_clone()));
                state.push((format!("q.{i}"), q.shallow_clone()));
            }
        }
        state
    }
}

impl Encoder for PowerSgdEncoder {
    fn encode(&mut self, update: &[Tensor]) -> Message {
        self.step(update, None)
            .expect("PowerSGD without workers to reduce with cannot fail")
    }

    fn encode_all_reduced(
        &mut self,
        update: &[Tensor],
        workers: usize,
        reduce: &mut AllReduce,
    ) -> Option<Result<Message>> {
        Some(self.step(update, Some((workers, reduce))))
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        let mut state = self.layer_state();
        if !self.options.warm_start {
            state.push(("step".to_string(), Tensor::from(self.step)));
        }
        state
    }

    /// Copies the residuals and Qs back in place and takes the step count back to the host
    /// (read once, on resume).
    fn load_state(&mut self, mut state: HashMap<String, Tensor>) -> Result<()> {
        if !self.options.warm_start {
            self.step = crate::host::i64_scalar(&take_state(&mut state, "step", &[])?);
        }
        copy_state(self.layer_state(), state)
    }
}
