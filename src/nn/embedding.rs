//! Lookup table: ids [..] -> rows of `weight` [num, dim].

use super::{Ctx, Layer};
use tch::{nn, Tensor};

#[derive(Debug)]
pub struct Embedding {
    pub weight: Tensor,
}

impl Embedding {
    /// N(0, 1) initialisation, PyTorch's default for `nn.Embedding`.
    pub fn new(p: &nn::Path, num: i64, dim: i64) -> Self {
        let weight = p.var(
            "weight",
            &[num, dim],
            nn::Init::Randn {
                mean: 0.0,
                stdev: 1.0,
            },
        );
        Embedding { weight }
    }

    pub fn forward(&self, ids: &Tensor, ctx: &mut Ctx) -> Tensor {
        let ys = Tensor::embedding(&self.weight, ids, -1, false, false);
        if let Some(tape) = ctx.tape().filter(|_| self.weight.requires_grad()) {
            let layer = Layer::Embedding {
                weight: self.weight.shallow_clone(),
                ids: ids.shallow_clone(),
            };
            tape.push(layer, &ys);
        }
        ys
    }
}
