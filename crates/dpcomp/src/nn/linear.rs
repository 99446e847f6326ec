//! Fully connected layer y = x W^T + b, for 2-D inputs [B, in] and sequences [B, T, in].

use super::input::{at_least, expect_dim, kernel_error};
use super::per_sample::{outer, Activations, PerSample};
use super::tape::{LayerGradients, Recorded};
use super::{uniform_init, Ctx};
use crate::error::Result;
use tch::{nn, Tensor};

/// A linear layer's settings besides its two sizes (tch-rs's `LinearConfig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearConfig {
    /// Whether the layer adds a bias b (default: true, as PyTorch's `nn.Linear`).
    pub bias: bool,
}

impl Default for LinearConfig {
    fn default() -> Self {
        LinearConfig { bias: true }
    }
}

/// A fully connected layer y = x Wᵀ + b that records itself for per-sample gradients in a
/// private forward pass (PyTorch's `nn.Linear`).
#[derive(Debug)]
pub struct Linear {
    /// W, [out_dim, in_dim].
    pub weight: Tensor,
    /// b, `[out_dim]`; `None` without a bias.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// W [out_dim, in_dim] and b \[out_dim\] under `p`, both U(±1/√in_dim) (PyTorch's default).
    ///
    /// # Errors
    ///
    /// [`Error::BadValue`](crate::error::Error::BadValue) naming the argument (`Linear in_dim:
    /// 0, expected at least 1`) when `in_dim` or `out_dim` is below 1; no parameter is created
    /// under `p` then.
    ///
    /// ```
    /// use dpcomp::nn::{Ctx, Linear, LinearConfig};
    /// let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    /// let layer = Linear::new(&vs.root(), 5, 3, LinearConfig::default())?;
    /// let ys = layer.forward(&tch::Tensor::ones([4, 5], (tch::Kind::Float, tch::Device::Cpu)), &mut Ctx::eval())?;
    /// assert_eq!(ys.size(), [4, 3]);
    /// // An input of another width is an error naming the layer, not a panic.
    /// assert!(layer.forward(&tch::Tensor::ones([4, 7], (tch::Kind::Float, tch::Device::Cpu)), &mut Ctx::eval()).is_err());
    /// // So is a layer of no width.
    /// let error = Linear::new(&(vs.root() / "empty"), 5, 0, LinearConfig::default()).unwrap_err();
    /// assert_eq!(error.to_string(), "Linear out_dim: 0, expected at least 1");
    /// # Ok::<(), dpcomp::error::Error>(())
    /// ```
    pub fn new(p: &nn::Path, in_dim: i64, out_dim: i64, config: LinearConfig) -> Result<Self> {
        at_least("Linear", [("in_dim", in_dim, 1), ("out_dim", out_dim, 1)])?;
        let weight = p.var("weight", &[out_dim, in_dim], uniform_init(in_dim));
        let bias = config
            .bias
            .then(|| p.var("bias", &[out_dim], uniform_init(in_dim)));
        Ok(Linear { weight, bias })
    }

    /// xs [B, *, in_dim] -> [B, *, out_dim]. Another last dimension is an error.
    pub fn forward(&self, xs: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let (out_dim, in_dim) = (self.weight.size()[0], self.weight.size()[1]);
        let layer = || format!("Linear({in_dim} -> {out_dim})");
        expect_dim(xs, 1..=usize::MAX, -1, in_dim, layer, || {
            format!("[.., {in_dim}]")
        })?;
        let ys = xs
            .f_linear(&self.weight, self.bias.as_ref())
            .map_err(|e| kernel_error(&layer(), e))?;
        let trainable =
            self.weight.requires_grad() || self.bias.as_ref().is_some_and(Tensor::requires_grad);
        if let Some(tape) = ctx.tape().filter(|_| trainable) {
            let record = LinearRecord {
                weight: self.weight.shallow_clone(),
                bias: self.bias.as_ref().map(Tensor::shallow_clone),
                input: xs.detach(),
            };
            tape.push(record, &ys);
        }
        Ok(ys)
    }
}

/// A linear layer on the tape: its parameters and its input x [B, *, in] (values only).
pub(crate) struct LinearRecord {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub input: Tensor,
}

impl Recorded for LinearRecord {
    /// g_i(W) = Σ_t b_it x_itᵀ (`per_sample::outer`), g_i(b) = Σ_t b_it, with b = d(Σ loss)/dy.
    fn per_sample(&self, grad: &Tensor) -> LayerGradients {
        let batch = grad.size()[0];
        let (input_dim, output_dim) = (self.weight.size()[1], self.weight.size()[0]);
        let a = Activations::Held(self.input.reshape([batch, -1, input_dim]));
        let b = grad.reshape([batch, -1, output_dim]);
        let mut parameters = Vec::new();
        if let Some(bias) = self.bias.as_ref().filter(|b| b.requires_grad()) {
            let summed = b.sum_dim_intlist(1, false, b.kind());
            parameters.push((bias.shallow_clone(), PerSample::Direct(summed)));
        }
        // A frozen weight (BiTFiT trains the bias alone) costs no per-sample work.
        if self.weight.requires_grad() {
            parameters.push((self.weight.shallow_clone(), outer(a, b, self.weight.size())));
        }
        LayerGradients::of(parameters)
    }
}
