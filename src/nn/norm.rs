//! Normalisations with affine parameters and no running statistics (per-sample gradients of
//! BatchNorm do not exist, so the paper's models use these instead).
//!
//! Outside private training each calls LibTorch's fused kernel with its affine parameters. In
//! private training (`Ctx::private`) the normalisation runs without them and the affine map
//! y = x̂ w + b is applied separately, so that x̂ can be recorded for per-sample gradients.

use super::{Ctx, Layer};
use tch::{nn, Tensor};

const EPS: f64 = 1e-5;

fn affine(p: &nn::Path, channels: i64) -> (Tensor, Tensor) {
    (
        p.var("weight", &[channels], nn::Init::Const(1.0)),
        p.var("bias", &[channels], nn::Init::Const(0.0)),
    )
}

/// Shared by the three norms: `fused(w, b)` is LibTorch's kernel with the affine parameters,
/// `plain()` the same normalisation without them; `channel_dim` is where w and b apply.
fn normalise(
    weight: &Tensor,
    bias: &Tensor,
    channel_dim: i64,
    ctx: &mut Ctx,
    fused: impl Fn(&Tensor, &Tensor) -> Tensor,
    plain: impl Fn() -> Tensor,
) -> Tensor {
    let Some(tape) = ctx.tape().filter(|_| weight.requires_grad()) else {
        return fused(weight, bias);
    };
    let normalized = plain();
    let mut shape = vec![1i64; normalized.dim()];
    let c = if channel_dim < 0 {
        shape.len() as i64 + channel_dim
    } else {
        channel_dim
    } as usize;
    shape[c] = -1;
    let ys = bias
        .view(shape.as_slice())
        .addcmul(&normalized, &weight.view(shape.as_slice()));
    let layer = Layer::Affine {
        weight: weight.shallow_clone(),
        bias: bias.shallow_clone(),
        normalized: normalized.detach(),
        channel_dim: c as i64,
    };
    tape.push(layer, &ys);
    ys
}

/// Instance normalisation over H, W of each (example, channel), optionally followed by a
/// per-channel affine map. Instance statistics are used in training and evaluation alike
/// (PyTorch's `InstanceNorm2d` default, `track_running_stats=False`), so the "momentum 0.1" the
/// paper mentions has nothing to act on. `new` has the affine map (`affine=True`), `plain` has
/// none (PyTorch's default `affine=False`: no parameters, the paper's CIFAR-10 CNN).
#[derive(Debug)]
pub struct InstanceNorm2d {
    /// (weight, bias), or `None` without an affine map.
    pub affine: Option<(Tensor, Tensor)>,
}

impl InstanceNorm2d {
    pub fn new(p: &nn::Path, channels: i64) -> Self {
        InstanceNorm2d {
            affine: Some(affine(p, channels)),
        }
    }

    /// Without parameters: nothing to record, per-sample by construction.
    pub fn plain() -> Self {
        InstanceNorm2d { affine: None }
    }

    pub fn forward(&self, xs: &Tensor, ctx: &mut Ctx) -> Tensor {
        let run = |w: Option<&Tensor>, b: Option<&Tensor>| {
            xs.instance_norm(
                w,
                b,
                None::<&Tensor>,
                None::<&Tensor>,
                true,
                0.1,
                EPS,
                false,
            )
        };
        match &self.affine {
            None => run(None, None),
            Some((weight, bias)) => normalise(
                weight,
                bias,
                1,
                ctx,
                |w, b| run(Some(w), Some(b)),
                || run(None, None),
            ),
        }
    }
}

/// Group normalisation over (channels of a group, H, W), then a per-channel affine map.
#[derive(Debug)]
pub struct GroupNorm {
    pub weight: Tensor,
    pub bias: Tensor,
    pub groups: i64,
}

impl GroupNorm {
    pub fn new(p: &nn::Path, groups: i64, channels: i64) -> Self {
        let (weight, bias) = affine(p, channels);
        GroupNorm {
            weight,
            bias,
            groups,
        }
    }

    pub fn forward(&self, xs: &Tensor, ctx: &mut Ctx) -> Tensor {
        let run =
            |w: Option<&Tensor>, b: Option<&Tensor>| xs.group_norm(self.groups, w, b, EPS, false);
        normalise(
            &self.weight,
            &self.bias,
            1,
            ctx,
            |w, b| run(Some(w), Some(b)),
            || run(None, None),
        )
    }
}

/// Layer normalisation over the last dimension, then an elementwise affine map.
#[derive(Debug)]
pub struct LayerNorm {
    pub weight: Tensor,
    pub bias: Tensor,
    pub dim: i64,
    pub eps: f64,
}

impl LayerNorm {
    pub fn new(p: &nn::Path, dim: i64, eps: f64) -> Self {
        let (weight, bias) = affine(p, dim);
        LayerNorm {
            weight,
            bias,
            dim,
            eps,
        }
    }

    pub fn forward(&self, xs: &Tensor, ctx: &mut Ctx) -> Tensor {
        let run = |w: Option<&Tensor>, b: Option<&Tensor>| {
            xs.layer_norm([self.dim], w, b, self.eps, false)
        };
        normalise(
            &self.weight,
            &self.bias,
            -1,
            ctx,
            |w, b| run(Some(w), Some(b)),
            || run(None, None),
        )
    }
}
