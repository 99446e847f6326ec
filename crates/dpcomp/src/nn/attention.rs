//! Multi-head scaled dot-product attention (Vaswani et al. 2017, §3.2.2), the BERT block's
//! attention as a layer of its own. Its trainable parameters are four linear layers (query,
//! key, value, output; each a [`LoraLinear`] that may carry a LoRA adapter), each of which
//! records itself on the tape; softmax(Q Kᵀ / √d) V only mixes
//! positions of one example, so the per-sample gradients of the four projections are the
//! linear layers' g_i = Σ_t b_it x_itᵀ with no record of its own (`tests/layers/layers_tests.rs` checks them
//! against per-example autograd).

use super::input::{expect_dim, kernel_error};
use super::{Ctx, Linear, LinearConfig, LoraLinear};
use crate::error::{Error, Result};
use tch::{nn, Tensor};

/// Multi-head attention's settings besides its width.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionConfig {
    /// Number of heads, a divisor of the width (default 1).
    pub heads: i64,
    /// Dropout on the attention probabilities in training, in [0, 1) (default 0).
    pub dropout: f64,
}

impl Default for AttentionConfig {
    fn default() -> Self {
        AttentionConfig {
            heads: 1,
            dropout: 0.0,
        }
    }
}

/// Multi-head scaled dot-product attention over [B, T, dim] with four `dim x dim` projections
/// (PyTorch's `nn.MultiheadAttention` with `batch_first`, BERT's self-attention).
#[derive(Debug)]
pub struct MultiheadAttention {
    /// Q = x W_qᵀ + b_q.
    pub query: LoraLinear,
    /// K = m W_kᵀ + b_k, m the memory attended to.
    pub key: LoraLinear,
    /// V = m W_vᵀ + b_v.
    pub value: LoraLinear,
    /// The projection of the heads' concatenation back to `dim`.
    pub output: LoraLinear,
    /// Number of heads; each attends with width dim / heads.
    pub heads: i64,
    /// Dropout on the attention probabilities in training.
    pub dropout: f64,
}

impl MultiheadAttention {
    /// Four `dim x dim` projections with biases under `query`, `key`, `value`, `output`.
    ///
    /// # Errors
    ///
    /// [`Error::BadValue`] when `dim` is below 1 (`Linear in_dim: 0, expected at least 1`, from
    /// the projections) or, as [`from_projections`](Self::from_projections), when the heads do
    /// not divide `dim` or the dropout is not in [0, 1).
    ///
    /// ```
    /// use dpcomp::nn::{AttentionConfig, Ctx, MultiheadAttention};
    /// let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    /// let config = AttentionConfig { heads: 4, ..Default::default() };
    /// let attention = MultiheadAttention::new(&vs.root(), 16, config)?;
    /// let xs = tch::Tensor::zeros([2, 5, 16], (tch::Kind::Float, tch::Device::Cpu));
    /// assert_eq!(attention.forward(&xs, None, &mut Ctx::eval())?.size(), [2, 5, 16]);
    /// # Ok::<(), dpcomp::error::Error>(())
    /// ```
    pub fn new(p: &nn::Path, dim: i64, config: AttentionConfig) -> Result<Self> {
        let linear = |name: &str| Linear::new(&(p / name), dim, dim, LinearConfig::default());
        Self::from_projections(
            [
                linear("query")?,
                linear("key")?,
                linear("value")?,
                linear("output")?,
            ],
            config,
        )
    }

    /// From projections [query, key, value, output] built elsewhere (BERT's checkpoint names
    /// them `attention.self.query`, ..., `attention.output.dense`).
    pub fn from_projections(projections: [Linear; 4], config: AttentionConfig) -> Result<Self> {
        let adapted = projections.map(|base| LoraLinear {
            base,
            adapter: None,
            name: String::new(),
        });
        Self::from_adapted(adapted, config)
    }

    /// From projections [query, key, value, output] that may carry LoRA adapters.
    pub fn from_adapted(projections: [LoraLinear; 4], config: AttentionConfig) -> Result<Self> {
        let AttentionConfig { heads, dropout } = config;
        let [query, key, value, output] = projections;
        let dim = query.base.weight.size()[0];
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
    pub fn forward(&self, xs: &Tensor, mask: Option<&Tensor>, ctx: &mut Ctx) -> Result<Tensor> {
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
    ) -> Result<Tensor> {
        let dim = self.query.base.weight.size()[0];
        let layer = || format!("MultiheadAttention({dim}, {} heads)", self.heads);
        let expected = || format!("[batch, steps, {dim}]");
        expect_dim(queries, 3..=3, 2, dim, layer, expected)?;
        expect_dim(memory, 3..=3, 0, queries.size()[0], layer, || {
            format!(
                "memory [{}, steps, {dim}], the queries' batch",
                queries.size()[0]
            )
        })?;
        expect_dim(memory, 3..=3, 2, dim, layer, expected)?;
        let (b, t) = (queries.size()[0], queries.size()[1]);
        let head_dim = dim / self.heads;
        let split = |ys: Tensor| ys.view([b, -1, self.heads, head_dim]).transpose(1, 2);
        let q = split(self.query.forward(queries, ctx)?);
        let k = split(self.key.forward(memory, ctx)?);
        let v = split(self.value.forward(memory, ctx)?);
        let dropout = if ctx.train { self.dropout } else { 0.0 };
        let attended =
            Tensor::f_scaled_dot_product_attention(&q, &k, &v, mask, dropout, false, None, false)
                .map_err(|e| kernel_error(&layer(), e))?
                .transpose(1, 2)
                .reshape([b, t, dim]);
        self.output.forward(&attended, ctx)
    }
}
