//! Deep Gradient Compression (Lin et al. 2018), as the paper uses it: per layer, send the
//! largest-magnitude elements of the accumulated update so that the message is `rate` times
//! smaller than dense fp32, with their low-order mantissa bits removed; keep everything unsent
//! (including the removed bits) as a residual that joins the next step's update (error feedback).
//!
//! Options from the original DGC, off unless set: momentum correction (`momentum`: accumulate
//! u <- m u + g, v <- v + u and sparsify v, so momentum is applied before sparsification; use it
//! with the optimiser's momentum at 0), momentum-factor masking (`masking`: zero u where v was
//! sent), and the exponential sparsity warm-up (`warmup_epochs` W: rate min(R, 4^(e+1)) in epoch
//! e < W, i.e. density 25%, 6.25%, 1.56%, ... as in DGC's 75%, 93.75%, 98.4%, ... schedule).
//! Top-k by a sampled threshold (`topk = sampled`; exact by construction) or LibTorch's exact
//! selection (`topk = exact`); the default (`topk = auto`) samples on the CPU, where it is
//! faster, and selects exactly on CUDA, where the sampled threshold would make every step wait
//! for the device (`topk.rs`).
//!
//! `scope = model` ranks the whole update as one vector (the paper's "model-wise sparsification",
//! the plain baseline of its Denoise comparison): residual and momentum are then one flat tensor.
//!
//! A tensor is sent dense (at `value_bits`) when its sparse encoding would not be smaller: then
//! the rate cannot be gained on it (rate 1 sends everything dense, exactly). With
//! `dense_vectors=true` every 1-D parameter (biases, norm scales) is sent dense too, as DGC
//! implementations that compress only weight matrices and kernels do.
//!
//! Error feedback (`residual_decay` γ, default 1; `error_feedback=false` is γ = 0): after the
//! message is taken out, the residual becomes γ (v - sent). γ = 1 is DGC's error feedback, which
//! eventually sends every coordinate of every update, the DP noise included; γ = 0 is a top-k of
//! the current update alone, which drops what it does not send (the ablation of the
//! compression paper's gains under DP, `docs/results/compression-paper.md`).
//!
//! What the rate divides is `budget` (`bits`, the default: the message's wire bits; `elements`:
//! k = ceil(numel / rate), DGC's `compress_ratio`): see `encoding::Budget` for the derivation
//! against the paper's bandwidth figures. The warm-up schedule is `warmup=paper` (DGC paper:
//! rate min(R, 4^(e+1))) or `warmup=reference` (DGC reference implementation: density
//! R^-(e+1)/(W+1), e < W).

use super::codec::{Encoder, Scope};
use super::encoding::{sparse_budget, sparse_is_cheaper, truncate_mantissa, Budget, IndexBits};
use super::message::{Message, Payload};
use super::topk::{largest, TopK};
use tch::{Device, Kind, Tensor};

/// DGC's settings (`Compressor::Dgc`; on the command line `--compressor dgc --rate R` and the
/// `--compressor-option` keys named after the fields). `Default` is the command line's.
///
/// ```
/// use dpcomp::compress::{Dgc, DgcEncoder, Encoder};
/// use tch::{Device, Kind, Tensor};
/// let mut encoder = DgcEncoder::new(&[vec![100, 10]], Device::Cpu, Dgc { rate: 16.0, ..Default::default() });
/// let update = [Tensor::randn([100, 10], (Kind::Float, Device::Cpu))];
/// let message = encoder.encode(&update);
/// // 32-bit values and indices: k = floor(32 * 1000 / (16 * 64)) = 31 elements sent, 16x fewer bits.
/// assert_eq!(message.elements(), 31);
/// assert!(16 * message.wire_bits() <= 32 * 1000);
/// // Error feedback: what was not sent waits in the residual for the next step.
/// let sent = message.payloads[0].to_dense();
/// let gap = (sent + &encoder.residuals()[0] - &update[0]).abs().max().double_value(&[]);
/// assert!(gap < 1e-6);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Dgc {
    /// Compression rate R >= 1: what `budget` divides (dense fp32 bits over message bits, or
    /// elements over kept elements); 1 sends every tensor dense.
    pub rate: f64,
    /// Bits kept of each sent fp32 value, 9..=32 (sign, 8 exponent bits, `value_bits - 9`
    /// mantissa bits; the removed low-order bits stay in the residual). 32: values unchanged.
    pub value_bits: u32,
    /// Width of each sent index: 32 bits (the paper's COO) or the minimal ceil(log2 numel).
    pub index_bits: IndexBits,
    /// Momentum-correction factor m in [0, 1) (u <- m u + g, v <- v + u, then v is sparsified);
    /// 0 turns it off. Use it with the optimiser's momentum at 0.
    pub momentum: f64,
    /// Momentum-factor masking: zero u where v was sent (only acts with `momentum > 0`).
    pub masking: bool,
    /// Epochs W of DGC's exponential sparsity warm-up (0: the full `rate` from the start).
    pub warmup_epochs: usize,
    /// The warm-up schedule over `warmup_epochs`: the DGC paper's or its reference code's.
    pub warmup: Warmup,
    /// How the k largest magnitudes are found (sampled threshold or exact; both exact results;
    /// by default sampled on the CPU and exact on CUDA).
    pub topk: TopK,
    /// Top-k per parameter tensor or over the whole model.
    pub scope: Scope,
    /// What `rate` divides: the wire bits (default) or the element count (DGC's own meaning).
    pub budget: Budget,
    /// Send every 1-D parameter (biases, norm scales) dense, as implementations that compress
    /// only weight matrices and kernels do (layer-wise scope only).
    pub dense_vectors: bool,
    /// γ in [0, 1]: the share of the unsent update kept for the next step (1: error feedback).
    pub residual_decay: f64,
}

impl Default for Dgc {
    /// Rate 16 (the paper's milder setting), and the command line's defaults for the rest:
    /// fp32 values, 32-bit indices, no momentum correction, masking on (inert without it), no
    /// warm-up, the sampled top-k, layer-wise, the rate dividing the wire bits, error feedback.
    fn default() -> Self {
        Dgc {
            rate: 16.0,
            value_bits: 32,
            index_bits: IndexBits::Fixed32,
            momentum: 0.0,
            masking: true,
            warmup_epochs: 0,
            warmup: Warmup::Paper,
            topk: TopK::DEFAULT,
            scope: Scope::Layer,
            budget: Budget::Bits,
            dense_vectors: false,
            residual_decay: 1.0,
        }
    }
}

/// DGC's sparsity warm-up over `warmup_epochs` W.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Warmup {
    /// DGC paper (Lin et al. 2018, section 3.3): rate min(R, 4^(e+1)) in epoch e < W, i.e.
    /// density 25%, 6.25%, 1.56%, ... (its 75%, 93.75%, 98.4375%, ... sparsity).
    #[default]
    Paper,
    /// DGC reference implementation: density max(R^-(e+1)/(W+1), 1/R) in epoch e < W.
    Reference,
}

/// DGC's worker side (its receiver is the stateless `Unpack`).
pub struct DgcEncoder {
    options: Dgc,
    /// The parameters' shapes (a 1-D parameter may be sent dense, `dense_vectors`).
    shapes: Vec<Vec<i64>>,
    /// Accumulated unsent update per parameter, or one flat tensor model-wise (v in DGC's
    /// notation).
    residuals: Vec<Tensor>,
    /// Momentum-correction buffers u (empty without momentum correction).
    momenta: Vec<Tensor>,
    epoch: usize,
}

impl DgcEncoder {
    /// An encoder for parameters of `shapes` (in the order the updates will come), its residual
    /// (and momentum, with `momentum > 0`) allocated as zeros on `device`. The settings are
    /// taken as given: `Compressor::Dgc(..).encoder` checks them first.
    pub fn new(shapes: &[Vec<i64>], device: Device, options: Dgc) -> Self {
        let segments: Vec<Vec<i64>> = match options.scope {
            Scope::Layer => shapes.to_vec(),
            Scope::Model => vec![vec![shapes.iter().map(|s| s.iter().product::<i64>()).sum()]],
        };
        let zeros = || -> Vec<Tensor> {
            segments
                .iter()
                .map(|s| Tensor::zeros(s.as_slice(), (Kind::Float, device)))
                .collect()
        };
        DgcEncoder {
            momenta: if options.momentum > 0.0 {
                zeros()
            } else {
                Vec::new()
            },
            residuals: zeros(),
            shapes: shapes.to_vec(),
            options,
            epoch: 0,
        }
    }

    /// The rate in force this epoch (DGC's exponential warm-up, then `rate`).
    pub fn current_rate(&self) -> f64 {
        let o = &self.options;
        if self.epoch >= o.warmup_epochs {
            return o.rate;
        }
        match o.warmup {
            Warmup::Paper => o.rate.min(4f64.powi(self.epoch as i32 + 1)),
            Warmup::Reference => o
                .rate
                .powf((self.epoch + 1) as f64 / (o.warmup_epochs + 1) as f64)
                .min(o.rate),
        }
    }

    /// The accumulated unsent update v (the error feedback), one tensor per parameter in its
    /// shape, or one flat tensor with `scope = Scope::Model`.
    pub fn residuals(&self) -> &[Tensor] {
        &self.residuals
    }
}

/// residual <- γ residual (nothing when γ = 1; zeros when γ = 0).
fn decay_residual(residual: &mut Tensor, decay: f64) {
    if decay == 0.0 {
        let _ = residual.zero_();
    } else if decay != 1.0 {
        let _ = residual.g_mul_scalar_(decay);
    }
}

impl Encoder for DgcEncoder {
    fn encode(&mut self, update: &[Tensor]) -> Message {
        let rate = self.current_rate();
        let o = self.options.clone();
        let segments: Vec<Tensor> = match o.scope {
            Scope::Layer => update.iter().map(|g| g.to_kind(Kind::Float)).collect(),
            Scope::Model => {
                let flat: Vec<Tensor> = update
                    .iter()
                    .map(|g| g.to_kind(Kind::Float).reshape([-1]))
                    .collect();
                vec![Tensor::cat(&flat, 0)]
            }
        };
        let payloads = tch::no_grad(|| {
            segments
                .iter()
                .enumerate()
                .map(|(i, g)| {
                    let v = &mut self.residuals[i];
                    if o.momentum > 0.0 {
                        let u = &mut self.momenta[i];
                        let _ = u.g_mul_scalar_(o.momentum).g_add_(g);
                        let _ = v.g_add_(u);
                    } else {
                        let _ = v.g_add_(g);
                    }
                    let n = v.numel() as i64;
                    let shape = v.size();
                    let index_bits = o.index_bits.width(n);
                    let k = sparse_budget(n, rate, o.value_bits, index_bits, o.budget);
                    let vector = o.scope == Scope::Layer && self.shapes[i].len() <= 1;
                    if rate <= 1.0
                        || (o.dense_vectors && vector)
                        || !sparse_is_cheaper(k, n, o.value_bits, index_bits)
                    {
                        let values = truncate_mantissa(v, o.value_bits);
                        let _ = v.g_sub_(&values);
                        decay_residual(v, o.residual_decay);
                        if let Some(u) = self.momenta.get_mut(i).filter(|_| o.masking) {
                            let _ = u.zero_();
                        }
                        return Payload::Dense {
                            values,
                            value_bits: o.value_bits,
                        };
                    }
                    let flat = v.view([-1]);
                    let (indices, kept) = largest(&flat, k, o.topk);
                    let values = truncate_mantissa(&kept, o.value_bits);
                    let _ = flat.shallow_clone().index_add_(0, &indices, &values.neg());
                    decay_residual(v, o.residual_decay);
                    if let Some(u) = self.momenta.get_mut(i).filter(|_| o.masking) {
                        let _ = u.view([-1]).index_fill_(0, &indices, 0.0);
                    }
                    Payload::Sparse {
                        indices,
                        values,
                        shape,
                        value_bits: o.value_bits,
                        index_bits,
                    }
                })
                .collect()
        });
        Message::new(payloads)
    }

    fn start_epoch(&mut self, epoch: usize) {
        self.epoch = epoch;
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        let mut state: Vec<(String, Tensor)> = self
            .residuals
            .iter()
            .enumerate()
            .map(|(i, t)| (format!("residual.{i}"), t.shallow_clone()))
            .collect();
        state.extend(
            self.momenta
                .iter()
                .enumerate()
                .map(|(i, t)| (format!("momentum.{i}"), t.shallow_clone())),
        );
        state
    }
}
