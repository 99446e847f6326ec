//! Normalisations with affine parameters and no running statistics (per-sample gradients of
//! BatchNorm do not exist, so the paper's models use these instead).

use super::Ctx;
use tch::{nn, Tensor};

const EPS: f64 = 1e-5;

fn affine(p: &nn::Path, channels: i64) -> (Tensor, Tensor) {
    (
        p.var("weight", &[channels], nn::Init::Const(1.0)),
        p.var("bias", &[channels], nn::Init::Const(0.0)),
    )
}

/// Instance normalisation over H, W of each (example, channel), then a per-channel affine map.
/// Instance statistics are used in training and evaluation alike (PyTorch's
/// `InstanceNorm2d(affine=True)` default, `track_running_stats=False`), so the "momentum 0.1" the
/// paper mentions has nothing to act on.
#[derive(Debug)]
pub struct InstanceNorm2d {
    pub weight: Tensor,
    pub bias: Tensor,
}

impl InstanceNorm2d {
    pub fn new(p: &nn::Path, channels: i64) -> Self {
        let (weight, bias) = affine(p, channels);
        InstanceNorm2d { weight, bias }
    }

    pub fn forward(&self, xs: &Tensor, _ctx: &mut Ctx) -> Tensor {
        xs.instance_norm(
            Some(&self.weight),
            Some(&self.bias),
            None::<&Tensor>,
            None::<&Tensor>,
            true,
            0.1,
            EPS,
            false,
        )
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

    pub fn forward(&self, xs: &Tensor, _ctx: &mut Ctx) -> Tensor {
        xs.group_norm(
            self.groups,
            Some(&self.weight),
            Some(&self.bias),
            EPS,
            false,
        )
    }
}

/// Layer normalisation over the last dimension, then an elementwise affine map.
#[derive(Debug)]
pub struct LayerNorm {
    pub weight: Tensor,
    pub bias: Tensor,
    pub eps: f64,
}

impl LayerNorm {
    pub fn new(p: &nn::Path, dim: i64, eps: f64) -> Self {
        let (weight, bias) = affine(p, dim);
        LayerNorm { weight, bias, eps }
    }

    pub fn forward(&self, xs: &Tensor, _ctx: &mut Ctx) -> Tensor {
        let dim = self.weight.size()[0];
        xs.layer_norm([dim], Some(&self.weight), Some(&self.bias), self.eps, false)
    }
}
