//! The tape a private forward pass writes: for every trainable layer, what its per-sample
//! gradients are made of (its input activation and parameters) and its output, with respect to
//! which one backward pass gives each example's output gradient. `privacy::grad_sample` turns
//! records into per-sample norms and clipped sums.

use super::lstm::LstmCache;
use super::norm::Normalization;
use tch::Tensor;

/// A trainable layer's parameters and recorded input (detached: values only).
pub enum Layer {
    /// y = x W^T + b, x [B, *, in].
    Linear {
        weight: Tensor,
        bias: Option<Tensor>,
        input: Tensor,
    },
    /// y = conv2d(x, W, b), x [B, C, H, W], square kernel.
    Conv2d {
        weight: Tensor,
        bias: Option<Tensor>,
        input: Tensor,
        stride: i64,
        padding: i64,
    },
    /// y = W[ids], ids [B, *].
    Embedding { weight: Tensor, ids: Tensor },
    /// y = x̂ w + b with w, b indexed along `channel_dim` of the normalised input
    /// x̂ = `normalization`(input) (instance, group and layer norms). x̂ is recomputed from the
    /// input when the per-sample gradients are formed, not kept from the forward pass.
    Affine {
        weight: Tensor,
        bias: Tensor,
        input: Tensor,
        normalization: Normalization,
        channel_dim: i64,
    },
    /// The LSTM (its output is a leaf: the recurrence ran without autograd).
    Lstm {
        w_ih: Tensor,
        w_hh: Tensor,
        b_ih: Tensor,
        b_hh: Tensor,
        cache: LstmCache,
        /// The input as the graph before the LSTM produced it (to carry gradients back).
        input: Tensor,
    },
}

pub struct Record {
    pub layer: Layer,
    /// The layer's output as used downstream.
    pub output: Tensor,
}

#[derive(Default)]
pub struct Tape {
    pub records: Vec<Record>,
}

impl Tape {
    pub fn push(&mut self, layer: Layer, output: &Tensor) {
        self.records.push(Record {
            layer,
            output: output.shallow_clone(),
        });
    }
}
