//! Root-mean-square normalisation (Zhang and Sennrich 2019), Llama's norm: each position's
//! vector divided by its root mean square, then scaled elementwise; no mean is subtracted and
//! there is no bias.
//!
//! The statistics are taken in float32 at least (Hugging Face's `LlamaRMSNorm` upcasts a half
//! or bfloat16 input; a double input stays double). In a private forward pass with a trainable
//! weight the layer's input is recorded, and x̂ is recomputed from it when the per-sample
//! gradients are formed: g_i = Σ_t (x̂ ⊙ dL/dy)_it.

use super::input::{at_least, expect_dim, kernel_error};
use super::per_sample::{sum_except, PerSample};
use super::tape::{LayerGradients, Recorded};
use super::Ctx;
use crate::error::{Error, Result};
use tch::{nn, Kind, Tensor};

/// y = x / sqrt(mean(x²) + ε) ⊙ w over the last dimension (Hugging Face's `LlamaRMSNorm`).
#[derive(Debug)]
pub struct RmsNorm {
    /// The elementwise scale w, `[dim]` (initially 1).
    pub weight: Tensor,
    /// Added to the mean square before its square root (Llama: 1e-6 or 1e-5).
    pub eps: f64,
}

impl RmsNorm {
    /// Over a last dimension of width `dim` with offset `eps`, weight at 1 under `p`.
    ///
    /// # Errors
    ///
    /// [`Error::BadValue`] naming the argument when `dim` is below 1 (`RmsNorm dim: 0, expected
    /// at least 1`) or `eps` is not a finite number above 0 (`RmsNorm eps: -1, expected a
    /// finite number above 0`).
    ///
    /// ```
    /// use dpcomp::nn::{Ctx, RmsNorm};
    /// let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    /// let norm = RmsNorm::new(&vs.root(), 4, 1e-6)?;
    /// let xs = tch::Tensor::from_slice(&[3.0f32, -3.0, 3.0, -3.0]).view([1, 1, 4]);
    /// // Every value has magnitude 3, the root mean square: x̂ = ±1.
    /// let ys = norm.forward(&xs, &mut Ctx::eval())?;
    /// assert!((ys.abs() - 1.0).abs().max().double_value(&[]) < 1e-5);
    /// // An input of another width is an error naming the layer.
    /// let wide = tch::Tensor::ones([1, 1, 5], (tch::Kind::Float, tch::Device::Cpu));
    /// let error = norm.forward(&wide, &mut Ctx::eval()).unwrap_err();
    /// assert_eq!(error.to_string(), "RmsNorm(4) input: shape [1, 1, 5], expected [.., 4]");
    /// # Ok::<(), dpcomp::error::Error>(())
    /// ```
    pub fn new(p: &nn::Path, dim: i64, eps: f64) -> Result<Self> {
        at_least("RmsNorm", [("dim", dim, 1)])?;
        if !(eps.is_finite() && eps > 0.0) {
            return Err(Error::bad_value(
                "RmsNorm eps",
                format!("{eps}, expected a finite number above 0"),
            ));
        }
        Ok(RmsNorm {
            weight: p.var("weight", &[dim], nn::Init::Const(1.0)),
            eps,
        })
    }

    /// xs [.., dim] -> [.., dim]. x̂ is formed in xs's kind (float32 at least) and multiplied by
    /// the weight with PyTorch's type promotion, as Hugging Face does (a half input with a
    /// float32 weight gives float32).
    pub fn forward(&self, xs: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let dim = self.weight.size()[0];
        let layer = || format!("RmsNorm({dim})");
        expect_dim(xs, 1..=usize::MAX, -1, dim, layer, || {
            format!("[.., {dim}]")
        })?;
        let normalized = normalize(xs, self.eps);
        let ys = normalized
            .f_mul(&self.weight)
            .map_err(|e| kernel_error(&layer(), e))?;
        if let Some(tape) = ctx.tape().filter(|_| self.weight.requires_grad()) {
            let record = RmsNormRecord {
                weight: self.weight.shallow_clone(),
                input: xs.detach(),
                eps: self.eps,
            };
            tape.push(record, &ys);
        }
        Ok(ys)
    }
}

/// x̂ = x / sqrt(mean(x²) + ε) over the last dimension, computed in float32 at least and given
/// back in x's kind.
fn normalize(xs: &Tensor, eps: f64) -> Tensor {
    let kind = xs.kind();
    let wide = match kind {
        Kind::Half | Kind::BFloat16 => xs.to_kind(Kind::Float),
        _ => xs.shallow_clone(),
    };
    let mean_square = wide
        .square()
        .mean_dim([-1i64].as_slice(), true, wide.kind());
    (&wide * (mean_square + eps).rsqrt()).to_kind(kind)
}

/// An RMS norm on the tape: its weight and its input (x̂ is recomputed from it).
struct RmsNormRecord {
    weight: Tensor,
    input: Tensor,
    eps: f64,
}

impl Recorded for RmsNormRecord {
    /// g_i(w) = Σ (x̂ ⊙ dy)_i over every dimension but the last.
    fn per_sample(&self, grad: &Tensor) -> LayerGradients {
        let normalized = tch::no_grad(|| normalize(&self.input, self.eps));
        let last = grad.dim() as i64 - 1;
        let gradients = sum_except(&(normalized * grad), last);
        LayerGradients::of(vec![(
            self.weight.shallow_clone(),
            PerSample::Direct(gradients),
        )])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::privacy::grad_sample::per_sample_of;
    use tch::{Device, Reduction};

    /// A norm between two linear maps, so that the norm's input and output gradient vary per
    /// example and position; f64 throughout.
    fn setup() -> (nn::VarStore, RmsNorm, Tensor, Tensor) {
        let vs = nn::VarStore::new(Device::Cpu);
        let norm = RmsNorm::new(&(vs.root() / "norm"), 6, 1e-6).unwrap();
        tch::no_grad(|| {
            let mut w = norm.weight.shallow_clone();
            let shift = Tensor::from_slice(&[0.1f64, -0.2, 0.3, 0.05, -0.15, 0.25]);
            w.set_data(&(w.to_kind(Kind::Double) + shift));
        });
        let generator = Tensor::from_slice(&[0.5f64, -1.0, 2.0, 0.25, -0.75, 1.5]);
        let xs = (Tensor::arange(4 * 5 * 6, (Kind::Double, Device::Cpu)).view([4, 5, 6]) * 0.37)
            .sin()
            * &generator;
        let projection =
            (Tensor::arange(6 * 3, (Kind::Double, Device::Cpu)).view([6, 3]) * 0.91).cos();
        (vs, norm, xs, projection)
    }

    fn losses(norm: &RmsNorm, xs: &Tensor, projection: &Tensor, ctx: &mut Ctx) -> Tensor {
        let ys = norm.forward(xs, ctx).unwrap();
        let logits = ys
            .matmul(projection)
            .sum_dim_intlist(1, false, Kind::Double);
        let labels = Tensor::from_slice(&[0i64, 2, 1, 2]).narrow(0, 0, xs.size()[0]);
        logits.cross_entropy_loss::<Tensor>(&labels, None, Reduction::None, -100, 0.0)
    }

    #[test]
    fn per_sample_gradients_equal_per_example_autograd() {
        let (vs, norm, xs, projection) = setup();
        let params: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        let mut ctx = Ctx::private();
        let loss = losses(&norm, &xs, &projection, &mut ctx).sum(Kind::Double);
        let per_sample = per_sample_of(&mut ctx, &params, &loss).unwrap();
        assert_eq!(per_sample.len(), 1);
        let got = per_sample[0].1.materialize();
        assert_eq!(got.size(), [4, 6]);
        let labels = [0i64, 2, 1, 2];
        for (i, label) in labels.iter().enumerate() {
            let mut weight = norm.weight.shallow_clone();
            weight.zero_grad();
            let example = xs.narrow(0, i as i64, 1);
            let ys = norm.forward(&example, &mut Ctx::eval()).unwrap();
            let logits = ys
                .matmul(&projection)
                .sum_dim_intlist(1, false, Kind::Double);
            let loss = logits.cross_entropy_loss::<Tensor>(
                &Tensor::from_slice(&[*label]),
                None,
                Reduction::Sum,
                -100,
                0.0,
            );
            loss.backward();
            let want = weight.grad();
            let diff = crate::host::f64_scalar(&(got.get(i as i64) - &want).abs().max());
            let scale = crate::host::f64_scalar(&want.abs().max());
            assert!(scale > 1e-3, "example {i}: a gradient to compare");
            assert!(diff < 1e-12 * scale, "example {i}: differs by {diff:e}");
        }
    }

    #[test]
    fn matches_the_definition_and_skips_a_frozen_weight() {
        let (_vs, norm, xs, _) = setup();
        let ys = norm.forward(&xs, &mut Ctx::eval()).unwrap();
        let rms = (xs.square().mean_dim([-1i64].as_slice(), true, Kind::Double) + 1e-6).sqrt();
        let want = &xs / rms * &norm.weight;
        assert!(crate::host::f64_scalar(&(&ys - &want).abs().max()) < 1e-12);
        let mut weight = norm.weight.shallow_clone();
        let _ = weight.requires_grad_(false);
        let mut ctx = Ctx::private();
        let _ = norm.forward(&xs, &mut ctx).unwrap();
        assert!(ctx.take_tape().unwrap().records.is_empty());
    }

    #[test]
    fn a_half_input_is_normalised_in_float32() {
        let vs = nn::VarStore::new(Device::Cpu);
        let norm = RmsNorm::new(&vs.root(), 3, 1e-6).unwrap();
        // 300² overflows half precision (its largest value is 65504); in float32 it does not.
        let xs = Tensor::from_slice(&[300.0f32, -300.0, 300.0])
            .view([1, 3])
            .to_kind(Kind::Half);
        let ys = norm.forward(&xs, &mut Ctx::eval()).unwrap();
        assert_eq!(ys.kind(), Kind::Float);
        assert!(crate::host::bool_scalar(&ys.isfinite().all()).unwrap());
        assert!(crate::host::f64_scalar(&(ys.abs() - 1.0).abs().max()) < 1e-3);
    }

    #[test]
    fn bad_arguments_are_named() {
        let vs = nn::VarStore::new(Device::Cpu);
        let error = RmsNorm::new(&vs.root(), 0, 1e-6).unwrap_err();
        assert_eq!(error.to_string(), "RmsNorm dim: 0, expected at least 1");
        let error = RmsNorm::new(&vs.root(), 4, f64::NAN).unwrap_err();
        assert_eq!(
            error.to_string(),
            "RmsNorm eps: NaN, expected a finite number above 0"
        );
    }
}
