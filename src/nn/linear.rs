//! Fully connected layer y = x W^T + b, for 2-D inputs [B, in] and sequences [B, T, in].

use super::per_sample::{outer, Activations, PerSample};
use super::tape::{LayerGradients, Recorded};
use super::{uniform_init, Ctx};
use tch::{nn, Tensor};

#[derive(Debug)]
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl Linear {
    pub fn new(p: &nn::Path, in_dim: i64, out_dim: i64, bias: bool) -> Self {
        let weight = p.var("weight", &[out_dim, in_dim], uniform_init(in_dim));
        let bias = bias.then(|| p.var("bias", &[out_dim], uniform_init(in_dim)));
        Linear { weight, bias }
    }

    pub fn forward(&self, xs: &Tensor, ctx: &mut Ctx) -> Tensor {
        let ys = xs.linear(&self.weight, self.bias.as_ref());
        if let Some(tape) = ctx.tape().filter(|_| self.weight.requires_grad()) {
            let record = LinearRecord {
                weight: self.weight.shallow_clone(),
                bias: self.bias.as_ref().map(Tensor::shallow_clone),
                input: xs.detach(),
            };
            tape.push(record, &ys);
        }
        ys
    }
}

/// A linear layer on the tape: its parameters and its input x [B, *, in] (values only).
pub struct LinearRecord {
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
        if let Some(bias) = &self.bias {
            let summed = b.sum_dim_intlist(1, false, b.kind());
            parameters.push((bias.shallow_clone(), PerSample::Direct(summed)));
        }
        parameters.push((self.weight.shallow_clone(), outer(a, b, self.weight.size())));
        LayerGradients::of(parameters)
    }
}
