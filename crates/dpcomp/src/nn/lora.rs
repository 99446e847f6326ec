//! Low-rank adaptation (LoRA, Hu et al. 2021, eq. 3): a frozen linear layer W₀ plus a trainable
//! update of rank r, h = W₀x + b + (α/r)·B A dropout(x), with A [r, in] drawn as PyTorch's
//! `nn.Linear` weight (U(±1/√in), what PEFT's `kaiming_uniform_(a=√5)` gives) and B [out, r]
//! zero, so that training starts from the pre-trained model. A and B are two of dpcomp's
//! [`Linear`] layers, so each records itself and gets per-sample gradients like any other
//! layer: A's from its input x and output gradient, B's from A's output and its own (the
//! ghost norm or the instantiated gradient, whichever costs less for their shapes).
//!
//! Which layers get an adapter is PEFT's rule for a list of `target_modules`: a module whose
//! name (its path in the model, `transformer.h.0.attn.c_attn`) equals a target or ends with
//! `.` + target.

use super::linear::{Linear, LinearConfig};
use super::Ctx;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use tch::{nn, Kind, Tensor};

/// A LoRA adapter's settings (PEFT's `LoraConfig`: `r`, `lora_alpha`, `lora_dropout`,
/// `target_modules`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraConfig {
    /// r, the rank of the update B A (default 8).
    pub rank: i64,
    /// α: the update is scaled by α / r (default 16).
    pub alpha: f64,
    /// Dropout on the adapter's input in training, in [0, 1) (default 0).
    pub dropout: f64,
    /// The modules that get an adapter, by name or by the last parts of their name
    /// (`c_attn`, `q_proj`, `attention.self.query`); empty: the architecture's default
    /// (`hf::Architecture::default_lora_targets`).
    pub target_modules: Vec<String>,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig {
            rank: 8,
            alpha: 16.0,
            dropout: 0.0,
            target_modules: Vec::new(),
        }
    }
}

impl LoraConfig {
    /// α / r, the scale of the update.
    pub fn scaling(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// Whether the module named `module` (dot-separated path) gets an adapter.
    pub fn targets(&self, module: &str) -> bool {
        self.target_modules.iter().any(|target| {
            module == target
                || module
                    .strip_suffix(target.as_str())
                    .is_some_and(|head| head.ends_with('.'))
        })
    }

    /// Checks the values: a rank of at least 1, a finite α above 0, a dropout in [0, 1), and
    /// target names that are not empty. Errors name the setting (`lora.rank`, ...).
    pub fn check(&self) -> Result<()> {
        if self.rank < 1 {
            return Err(Error::bad_value(
                "lora.rank",
                format!("{}, expected at least 1", self.rank),
            ));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(Error::bad_value(
                "lora.alpha",
                format!("{}, expected a finite number above 0", self.alpha),
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(Error::bad_value(
                "lora.dropout",
                format!("{}, expected a probability in [0, 1)", self.dropout),
            ));
        }
        if let Some(empty) = self.target_modules.iter().find(|t| t.trim().is_empty()) {
            return Err(Error::bad_value(
                "lora.target_modules",
                format!("{empty:?}, expected module names such as \"q_proj\""),
            ));
        }
        Ok(())
    }
}

/// The trainable low-rank update of one linear layer.
#[derive(Debug)]
pub struct LoraAdapter {
    /// A, [r, in] (`lora_A.weight`).
    pub a: Linear,
    /// B, [out, r] (`lora_B.weight`), zero at the start.
    pub b: Linear,
    /// α / r.
    pub scaling: f64,
    /// Dropout on the adapter's input in training.
    pub dropout: f64,
}

/// A linear layer that may carry a LoRA adapter: every projection of the Hugging Face models
/// is one, so that any of them can be a LoRA target.
#[derive(Debug)]
pub struct LoraLinear {
    /// The layer itself (frozen when an adapter trains beside it).
    pub base: Linear,
    /// The adapter, where `LoraConfig::targets` named this layer.
    pub adapter: Option<LoraAdapter>,
    /// The layer's name, its path in the model (`transformer.h.0.attn.c_attn`).
    pub name: String,
}

impl LoraLinear {
    /// A linear layer `in_dim -> out_dim` under `p`, with an adapter under `p / "lora_A"` and
    /// `p / "lora_B"` when `lora` targets the layer's name (its path `p`).
    ///
    /// ```
    /// use dpcomp::nn::{Ctx, LinearConfig, LoraConfig, LoraLinear};
    /// let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    /// let lora = LoraConfig { rank: 2, target_modules: vec!["q_proj".into()], ..LoraConfig::default() };
    /// let q = LoraLinear::new(&(vs.root() / "attn" / "q_proj"), 6, 4, LinearConfig::default(), Some(&lora))?;
    /// let k = LoraLinear::new(&(vs.root() / "attn" / "k_proj"), 6, 4, LinearConfig::default(), Some(&lora))?;
    /// assert!(q.adapter.is_some() && k.adapter.is_none());
    /// // B starts at zero: the adapted layer is the layer itself.
    /// let x = tch::Tensor::randn([3, 6], (tch::Kind::Float, tch::Device::Cpu));
    /// let y = q.forward(&x, &mut Ctx::eval())?;
    /// assert!(y.allclose(&q.base.forward(&x, &mut Ctx::eval())?, 0.0, 0.0, false));
    /// # Ok::<(), dpcomp::Error>(())
    /// ```
    pub fn new(
        p: &nn::Path,
        in_dim: i64,
        out_dim: i64,
        config: LinearConfig,
        lora: Option<&LoraConfig>,
    ) -> Result<Self> {
        let name = p.components().collect::<Vec<_>>().join(".");
        let base = Linear::new(p, in_dim, out_dim, config)?;
        let adapter = match lora.filter(|l| l.targets(&name)) {
            None => None,
            Some(lora) => {
                lora.check()?;
                let no_bias = LinearConfig { bias: false };
                let a = Linear::new(&(p / "lora_A"), in_dim, lora.rank, no_bias)?;
                let b = Linear {
                    weight: (p / "lora_B").zeros("weight", &[out_dim, lora.rank]),
                    bias: None,
                };
                Some(LoraAdapter {
                    a,
                    b,
                    scaling: lora.scaling(),
                    dropout: lora.dropout,
                })
            }
        };
        Ok(LoraLinear {
            base,
            adapter,
            name,
        })
    }

    /// W₀x + b, plus (α/r)·B A dropout(x) with an adapter.
    pub fn forward(&self, xs: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let ys = self.base.forward(xs, ctx)?;
        let Some(adapter) = &self.adapter else {
            return Ok(ys);
        };
        let dropped = xs.dropout(adapter.dropout, ctx.train);
        let low = adapter.a.forward(&dropped, ctx)?;
        Ok(ys + adapter.b.forward(&low, ctx)? * adapter.scaling)
    }

    /// The weight with the adapter merged in, W₀ + (α/r)·B A (W₀ itself without one), [out, in].
    pub fn merged_weight(&self) -> Tensor {
        tch::no_grad(|| match &self.adapter {
            None => self.base.weight.detach().copy(),
            Some(adapter) => {
                let update = adapter
                    .b
                    .weight
                    .to_kind(Kind::Double)
                    .matmul(&adapter.a.weight.to_kind(Kind::Double))
                    * adapter.scaling;
                (self.base.weight.to_kind(Kind::Double) + update).to_kind(self.base.weight.kind())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    #[test]
    fn targets_follow_peft_names() {
        let lora = LoraConfig {
            target_modules: vec!["c_attn".into(), "attention.self.query".into()],
            ..LoraConfig::default()
        };
        assert!(lora.targets("transformer.h.0.attn.c_attn"));
        assert!(lora.targets("c_attn"));
        assert!(!lora.targets("transformer.h.0.attn.xc_attn"));
        assert!(lora.targets("encoder.layer.3.attention.self.query"));
        assert!(!lora.targets("encoder.layer.3.attention.self.key"));
    }

    #[test]
    fn bad_settings_are_named() {
        let bad = LoraConfig {
            rank: 0,
            ..LoraConfig::default()
        };
        assert_eq!(
            bad.check().unwrap_err().to_string(),
            "lora.rank: 0, expected at least 1"
        );
        let bad = LoraConfig {
            dropout: 1.0,
            ..LoraConfig::default()
        };
        assert!(bad
            .check()
            .unwrap_err()
            .to_string()
            .contains("lora.dropout"));
    }

    #[test]
    fn the_merged_weight_gives_the_adapted_output() {
        tch::manual_seed(3);
        let vs = nn::VarStore::new(Device::Cpu);
        let lora = LoraConfig {
            rank: 2,
            alpha: 6.0,
            target_modules: vec!["proj".into()],
            ..LoraConfig::default()
        };
        let layer = LoraLinear::new(
            &(vs.root() / "proj"),
            5,
            3,
            LinearConfig::default(),
            Some(&lora),
        )
        .unwrap();
        let adapter = layer.adapter.as_ref().unwrap();
        let _ = tch::no_grad(|| adapter.b.weight.shallow_clone().uniform_(-1.0, 1.0));
        let x = Tensor::randn([4, 5], (Kind::Float, Device::Cpu));
        let adapted = layer.forward(&x, &mut Ctx::eval()).unwrap();
        let merged = x.linear(&layer.merged_weight(), layer.base.bias.as_ref());
        let gap = |a: &Tensor, b: &Tensor| crate::host::f64_scalar(&(a - b).abs().max());
        assert!(gap(&adapted, &merged) < 1e-5);
        // The adapter changed the output (B is no longer zero).
        let plain = layer.base.forward(&x, &mut Ctx::eval()).unwrap();
        assert!(gap(&adapted, &plain) > 1e-3);
    }
}
