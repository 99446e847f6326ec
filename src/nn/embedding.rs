//! Lookup table: ids [..] -> rows of `weight` [num, dim].

use super::per_sample::PerSample;
use super::tape::{LayerGradients, Recorded};
use super::Ctx;
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
            let record = EmbeddingRecord {
                weight: self.weight.shallow_clone(),
                ids: ids.shallow_clone(),
            };
            tape.push(record, &ys);
        }
        ys
    }
}

/// An embedding on the tape: the table and the looked-up ids [B, *].
pub struct EmbeddingRecord {
    pub weight: Tensor,
    pub ids: Tensor,
}

impl Recorded for EmbeddingRecord {
    /// g_i = Σ_t e_{ids_it} b_itᵀ: only the rows example i looked up (`PerSample::Rows`).
    fn per_sample(&self, grad: &Tensor) -> LayerGradients {
        let batch = grad.size()[0];
        let (rows, d) = (self.weight.size()[0], self.weight.size()[1]);
        let recipe = PerSample::Rows {
            ids: self.ids.reshape([batch, -1]),
            b: grad.reshape([batch, -1, d]),
            rows,
        };
        LayerGradients::of(vec![(self.weight.shallow_clone(), recipe)])
    }
}
