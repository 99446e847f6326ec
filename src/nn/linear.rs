//! Fully connected layer y = x W^T + b, for 2-D inputs [B, in] and sequences [B, T, in].

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

    pub fn forward(&self, xs: &Tensor, _ctx: &mut Ctx) -> Tensor {
        xs.linear(&self.weight, self.bias.as_ref())
    }
}
