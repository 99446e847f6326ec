//! PowerSGD (Vogels et al. 2019) as PyTorch's `powerSGD_hook` runs it, for one worker: each
//! parameter's update plus its error-feedback residual is viewed as a matrix M [n, m]; with the
//! warm-started Q [m, r]: P = M Q, P orthonormalised (Gram-Schmidt with an epsilon), Q = Mᵀ P;
//! the receiver forms P Qᵀ; the residual M - P Qᵀ joins the next step (zero on padding).
//!
//! Matrix shape (`shape`): `square` (the paper: the flat update padded with zeros to
//! ceil(sqrt(numel)) rows of ceil(numel / rows) columns) or `rows` (PyTorch's [shape[0], -1]).
//! A parameter is compressed only when (n + m) r `min_rate` < n m (PyTorch's
//! `_should_compress`, default min_rate 2); others, and every vector, are sent dense and exactly.
//! On the wire: P and Q in fp32, 32 (n + m) r bits.

use super::{Compressor, Message, Payload};
use tch::{Device, Kind, Tensor};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatrixShape {
    NearSquare,
    Rows,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PowerSgdOptions {
    pub rank: i64,
    pub shape: MatrixShape,
    pub min_rate: f64,
    pub epsilon: f64,
    pub warm_start: bool,
    pub seed: i64,
}

/// The matrix a parameter of `shape` is viewed as, or `None` for a vector.
pub fn matrix_dims(shape: &[i64], how: MatrixShape) -> Option<(i64, i64)> {
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

pub struct PowerSgd {
    options: PowerSgdOptions,
    layers: Vec<Layer>,
}

impl PowerSgd {
    pub fn new(shapes: &[Vec<i64>], device: Device, options: PowerSgdOptions) -> Self {
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
                        Some(seeded_normal(generator_seed, i as i64, [m, r], device)),
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
        PowerSgd { options, layers }
    }
}

/// N(0, 1) values of `shape` from (seed, layer), reproducible and independent of the global
/// generator (drawn on the CPU, then moved).
fn seeded_normal(seed: i64, layer: i64, shape: [i64; 2], device: Device) -> Tensor {
    use rand::SeedableRng;
    use rand_distr::{Distribution, StandardNormal};
    let mut rng = rand::rngs::StdRng::seed_from_u64((seed as u64) ^ (layer as u64).rotate_left(32));
    let values: Vec<f32> = (0..shape[0] * shape[1])
        .map(|_| StandardNormal.sample(&mut rng))
        .collect();
    Tensor::from_slice(&values).view(shape).to_device(device)
}

impl Compressor for PowerSgd {
    fn compress(&mut self, update: &[Tensor]) -> Message {
        let o = self.options.clone();
        let payloads = tch::no_grad(|| {
            self.layers
                .iter_mut()
                .zip(update)
                .map(|(layer, g)| {
                    let g = g.to_kind(Kind::Float);
                    let Some((n, m, _)) = layer.dims else {
                        return Payload::Dense {
                            values: g,
                            value_bits: 32,
                        };
                    };
                    let numel = g.numel() as i64;
                    let flat = g.reshape([-1]);
                    let padded = if n * m > numel {
                        flat.constant_pad_nd([0, n * m - numel])
                    } else {
                        flat
                    };
                    let error = layer
                        .error
                        .as_mut()
                        .expect("compressed layer has a residual");
                    let matrix = padded.view([n, m]) + &*error;
                    let q = layer.q.as_mut().expect("compressed layer has Q");
                    if !o.warm_start {
                        let fresh = q.randn_like();
                        q.copy_(&fresh);
                    }
                    let mut p = matrix.mm(q);
                    orthogonalize(&mut p, o.epsilon);
                    let new_q = matrix.tr().mm(&p);
                    q.copy_(&new_q);
                    let approximation = p.mm(&new_q.tr());
                    error.copy_(&(&matrix - approximation));
                    if n * m > numel {
                        // Padding is not part of the update: no error is fed back there.
                        let _ = error.view([-1]).narrow(0, numel, n * m - numel).zero_();
                    }
                    Payload::LowRank {
                        p,
                        q: new_q,
                        shape: layer.shape.clone(),
                    }
                })
                .collect()
        });
        Message::new(payloads)
    }

    fn decompress(&mut self, message: &Message) -> Vec<Tensor> {
        message.payloads.iter().map(Payload::to_dense).collect()
    }

    fn state(&self) -> Vec<(String, Tensor)> {
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
