//! Multi-head scaled dot-product attention (Vaswani et al. 2017, §3.2.2), the BERT block's
//! attention as a layer of its own. Its trainable parameters are four `Linear` layers (query,
//! key, value, output), each of which records itself on the tape; softmax(Q Kᵀ / √d) V only mixes
//! positions of one example, so the per-sample gradients of the four projections are the
//! linear layers' g_i = Σ_t b_it x_itᵀ with no record of its own (`tests/layers.rs` checks them
//! against per-example autograd).

use super::{Ctx, Linear};
use crate::error::{Error, Result};
use tch::{nn, Tensor};

#[derive(Debug)]
pub struct MultiheadAttention {
    pub query: Linear,
    pub key: Linear,
    pub value: Linear,
    pub output: Linear,
    pub heads: i64,
    /// Dropout on the attention probabilities in training.
    pub dropout: f64,
}

impl MultiheadAttention {
    /// Four `dim x dim` projections with biases under `query`, `key`, `value`, `output`.
    pub fn new(p: &nn::Path, dim: i64, heads: i64, dropout: f64) -> Result<Self> {
        let linear = |name: &str| Linear::new(&(p / name), dim, dim, true);
        Self::from_projections(
            linear("query"),
            linear("key"),
            linear("value"),
            linear("output"),
            heads,
            dropout,
        )
    }

    /// From projections built elsewhere (BERT's checkpoint names them
    /// `attention.self.query`, ..., `attention.output.dense`).
    pub fn from_projections(
        query: Linear,
        key: Linear,
        value: Linear,
        output: Linear,
        heads: i64,
        dropout: f64,
    ) -> Result<Self> {
        let dim = query.weight.size()[0];
        if heads < 1 || dim % heads != 0 {
            return Err(Error::bad_value(
                "heads",
                format!("{heads}: expected a positive divisor of the model width {dim}"),
            ));
        }
        if !(0.0..1.0).contains(&dropout) {
            return Err(Error::bad_value(
                "dropout",
                format!("{dropout}: expected a probability in [0, 1)"),
            ));
        }
        Ok(MultiheadAttention {
            query,
            key,
            value,
            output,
            heads,
            dropout,
        })
    }

    /// Self-attention over xs [B, T, dim]; see `attend`.
    pub fn forward(&self, xs: &Tensor, mask: Option<&Tensor>, ctx: &mut Ctx) -> Tensor {
        self.attend(xs, xs, mask, ctx)
    }

    /// Queries [B, T, dim] attend to `memory` [B, S, dim]. `mask`: bool, broadcastable to
    /// [B, heads, T, S], true where a key may be attended (BERT's padding mask is [B, 1, 1, S]).
    /// Returns the output projection of the heads' concatenation, [B, T, dim].
    pub fn attend(
        &self,
        queries: &Tensor,
        memory: &Tensor,
        mask: Option<&Tensor>,
        ctx: &mut Ctx,
    ) -> Tensor {
        let (b, t, dim) = (queries.size()[0], queries.size()[1], queries.size()[2]);
        let head_dim = dim / self.heads;
        let split = |ys: Tensor| ys.view([b, -1, self.heads, head_dim]).transpose(1, 2);
        let q = split(self.query.forward(queries, ctx));
        let k = split(self.key.forward(memory, ctx));
        let v = split(self.value.forward(memory, ctx));
        let dropout = if ctx.train { self.dropout } else { 0.0 };
        let attended =
            Tensor::scaled_dot_product_attention(&q, &k, &v, mask, dropout, false, None, false)
                .transpose(1, 2)
                .reshape([b, t, dim]);
        self.output.forward(&attended, ctx)
    }
}
