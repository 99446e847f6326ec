//! Lookup table: ids [..] -> rows of `weight` [num, dim].

use super::input::{at_least, kernel_error, wrong_shape};
use super::per_sample::PerSample;
use super::tape::{LayerGradients, Recorded};
use super::Ctx;
use crate::error::Result;
use tch::{nn, Kind, Tensor};

/// A lookup table of `num` vectors of width `dim` (PyTorch's `nn.Embedding`). Its per-sample
/// gradients touch only the rows an example looked up.
#[derive(Debug)]
pub struct Embedding {
    /// The table, [num, dim].
    pub weight: Tensor,
}

impl Embedding {
    /// A table of `num` rows of width `dim` under `p`, N(0, 1) initialisation (PyTorch's
    /// default for `nn.Embedding`).
    ///
    /// # Errors
    ///
    /// [`Error::BadValue`](crate::error::Error::BadValue) naming the argument (`Embedding num:
    /// 0, expected at least 1`) when `num` or `dim` is below 1.
    ///
    /// ```
    /// use dpcomp::nn::{Ctx, Embedding};
    /// let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    /// let table = Embedding::new(&vs.root(), 10, 4)?;
    /// let ids = tch::Tensor::from_slice(&[1i64, 7, 3]).view([1, 3]);
    /// assert_eq!(table.forward(&ids, &mut Ctx::eval())?.size(), [1, 3, 4]);
    /// let error = Embedding::new(&(vs.root() / "empty"), 0, 4).unwrap_err();
    /// assert_eq!(error.to_string(), "Embedding num: 0, expected at least 1");
    /// # Ok::<(), dpcomp::error::Error>(())
    /// ```
    pub fn new(p: &nn::Path, num: i64, dim: i64) -> Result<Self> {
        at_least("Embedding", [("num", num, 1), ("dim", dim, 1)])?;
        let weight = p.var(
            "weight",
            &[num, dim],
            nn::Init::Randn {
                mean: 0.0,
                stdev: 1.0,
            },
        );
        Ok(Embedding { weight })
    }

    /// ids [B, *] of an integer kind -> [B, *, dim]. Ids must lie in [0, num): their values are
    /// not read here (that would synchronise the device every step); the built-in models check a
    /// whole split once (`Model::check_features`), and a model of one's own should too.
    pub fn forward(&self, ids: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let (num, dim) = (self.weight.size()[0], self.weight.size()[1]);
        let layer = || format!("Embedding({num} x {dim})");
        if !matches!(ids.kind(), Kind::Int64 | Kind::Int) || ids.dim() == 0 {
            let expected = format!(
                "integer ids [batch, ..] (kind Int64 or Int), given {:?}",
                ids.kind()
            );
            return Err(wrong_shape(&layer(), ids, &expected));
        }
        let ys = Tensor::f_embedding(&self.weight, ids, -1, false, false)
            .map_err(|e| kernel_error(&layer(), e))?;
        if let Some(tape) = ctx.tape().filter(|_| self.weight.requires_grad()) {
            let record = EmbeddingRecord {
                weight: self.weight.shallow_clone(),
                ids: ids.shallow_clone(),
            };
            tape.push(record, &ys);
        }
        Ok(ys)
    }
}

/// An embedding on the tape: the table and the looked-up ids [B, *].
pub(crate) struct EmbeddingRecord {
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
