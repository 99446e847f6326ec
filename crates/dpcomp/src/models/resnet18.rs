//! CIFAR-100: CIFAR-style ResNet-18 (He et al. 2016; 3x3 stem, no max-pool) with GroupNorm in place
//! of BatchNorm, and the global average pool producing 2x2 instead of 1x1 as the paper does, so the
//! classifier is Linear(512 * 2 * 2 = 2048 -> classes). 11,373,732 parameters for 100 classes.

use super::{check_image_shape, wrong_features, Model};
use crate::data::Features;
use crate::error::Result;
use crate::nn::{Conv2d, Conv2dConfig, Ctx, GroupNorm, Linear, LinearConfig};
use tch::{nn, Device, Tensor};

/// Groups of every GroupNorm (Opacus's recommendation for ResNets: min(32, channels)).
pub const GROUPS: i64 = 32;

/// Two 3x3 convolutions with GroupNorm and a residual connection (He et al. 2016, Figure 2).
struct BasicBlock {
    conv1: Conv2d,
    norm1: GroupNorm,
    conv2: Conv2d,
    norm2: GroupNorm,
    /// 1x1 strided convolution + norm when the shape changes.
    shortcut: Option<(Conv2d, GroupNorm)>,
}

impl BasicBlock {
    fn new(p: &nn::Path, in_c: i64, out_c: i64, stride: i64) -> Result<Self> {
        let shortcut = if stride != 1 || in_c != out_c {
            Some((
                Conv2d::new(
                    &(p / "shortcut_conv"),
                    in_c,
                    out_c,
                    1,
                    Conv2dConfig {
                        stride,
                        bias: false,
                        ..Default::default()
                    },
                )?,
                GroupNorm::new(&(p / "shortcut_norm"), GROUPS.min(out_c), out_c)?,
            ))
        } else {
            None
        };
        Ok(BasicBlock {
            conv1: Conv2d::new(
                &(p / "conv1"),
                in_c,
                out_c,
                3,
                Conv2dConfig {
                    stride,
                    padding: 1,
                    bias: false,
                },
            )?,
            norm1: GroupNorm::new(&(p / "norm1"), GROUPS.min(out_c), out_c)?,
            conv2: Conv2d::new(
                &(p / "conv2"),
                out_c,
                out_c,
                3,
                Conv2dConfig {
                    padding: 1,
                    bias: false,
                    ..Default::default()
                },
            )?,
            norm2: GroupNorm::new(&(p / "norm2"), GROUPS.min(out_c), out_c)?,
            shortcut,
        })
    }

    fn forward(&self, xs: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let ys = self
            .norm1
            .forward(&self.conv1.forward(xs, ctx)?, ctx)?
            .relu();
        let ys = self.norm2.forward(&self.conv2.forward(&ys, ctx)?, ctx)?;
        let skip = match &self.shortcut {
            Some((conv, norm)) => norm.forward(&conv.forward(xs, ctx)?, ctx)?,
            None => xs.shallow_clone(),
        };
        Ok((ys + skip).relu())
    }
}

/// The paper's CIFAR-100 ResNet-18 with GroupNorm (see the module docs): images
/// [B, 3, 32, 32] -> logits [B, classes], every parameter trainable.
pub struct ResNet18 {
    vs: nn::VarStore,
    stem: Conv2d,
    stem_norm: GroupNorm,
    blocks: Vec<BasicBlock>,
    /// The final layer on the pooled features, [classes, 2048].
    pub classifier: Linear,
}

impl ResNet18 {
    /// A freshly initialised ResNet-18 (PyTorch's default initialisations, GroupNorm weights 1
    /// and biases 0) on `device` for `classes` classes (11,373,732 parameters for 100).
    ///
    /// # Errors
    ///
    /// [`Error::BadValue`](crate::error::Error::BadValue) when `classes` is below 1 (the
    /// classifier's `Linear out_dim`).
    pub fn new(device: Device, classes: i64) -> Result<Self> {
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let stem = Conv2d::new(
            &(&root / "stem"),
            3,
            64,
            3,
            Conv2dConfig {
                padding: 1,
                bias: false,
                ..Default::default()
            },
        )?;
        let stem_norm = GroupNorm::new(&(&root / "stem_norm"), GROUPS, 64)?;
        let mut blocks = Vec::new();
        let mut in_c = 64;
        for (stage, (out_c, stride)) in [(64, 1), (128, 2), (256, 2), (512, 2)]
            .into_iter()
            .enumerate()
        {
            for b in 0..2 {
                let p = &root / format!("layer{}", stage + 1) / b;
                blocks.push(BasicBlock::new(
                    &p,
                    in_c,
                    out_c,
                    if b == 0 { stride } else { 1 },
                )?);
                in_c = out_c;
            }
        }
        let classifier = Linear::new(
            &(&root / "classifier"),
            512 * 2 * 2,
            classes,
            LinearConfig::default(),
        )?;
        Ok(ResNet18 {
            vs,
            stem,
            stem_norm,
            blocks,
            classifier,
        })
    }
}

impl Model for ResNet18 {
    fn forward(&self, features: &Features, ctx: &mut Ctx) -> Result<Tensor> {
        let Features::Images(xs) = features else {
            return Err(wrong_features("ResNet18", "images", features));
        };
        check_image_shape("ResNet18", xs)?;
        let mut xs = self
            .stem_norm
            .forward(&self.stem.forward(xs, ctx)?, ctx)?
            .relu();
        for block in &self.blocks {
            xs = block.forward(&xs, ctx)?;
        }
        let xs = xs.adaptive_avg_pool2d([2, 2]).flatten(1, -1);
        self.classifier.forward(&xs, ctx)
    }

    fn check_features(&self, features: &Features) -> Result<()> {
        let Features::Images(xs) = features else {
            return Err(wrong_features("ResNet18", "images", features));
        };
        check_image_shape("ResNet18", xs)
    }

    fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }
}
