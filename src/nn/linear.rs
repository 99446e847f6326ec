//! Fully connected layer y = x W^T + b, for 2-D inputs [B, in] and sequences [B, T, in].

use super::{uniform_init, Ctx, Layer};
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
            let layer = Layer::Linear {
                weight: self.weight.shallow_clone(),
                bias: self.bias.as_ref().map(Tensor::shallow_clone),
                input: xs.detach(),
            };
            tape.push(layer, &ys);
        }
        ys
    }
}
