//! CIFAR-10, the paper's 3-block CNN (Lin 2022, the
//! CIFAR-10 task): three blocks [Conv 3x3 stride 1, no padding, bias -> InstanceNorm (no affine
//! parameters) -> ReLU -> AvgPool 2 -> Dropout2d 0.1] with 32, 64, 128 filters (32 -> 30 -> 15 ->
//! 13 -> 6 -> 4 -> 2), then Linear 512->256 -> ReLU -> Dropout 0.25 -> Linear 256->512 -> ReLU ->
//! Dropout 0.25 -> Linear 512->10: 896 + 18,496 + 73,856 + 131,328 + 131,584 + 5,130 =
//! **361,290 parameters**.
//!
//! The text names neither padding nor affine norms; two of the paper's own numbers pin them:
//! its uncompressed bandwidth 361,290 x 64 bits x 39,100 steps / 8 / 2^30 = 105.25 (the paper's
//! "105.25Gb") and its noise error m σ² C² / B² = 361,290 x 0.8² x 5² / 128² = 352.8 (the
//! paper's 353.0). "Instance normalization with a momentum of 0.1" is PyTorch's
//! `InstanceNorm2d(c)` with its defaults (`affine=False`, momentum 0.1). An earlier version
//! (padding 1, affine norms, flatten 2048: 754,954 parameters) came from a wrong specification.

use super::{check_image_shape, wrong_features, Model};
use crate::data::Features;
use crate::error::Result;
use crate::nn::{avg_pool2x2, Conv2d, Conv2dConfig, Ctx, InstanceNorm2d, Linear, LinearConfig};
use tch::{nn, Device, Tensor};

/// Flattened features after the three blocks: 128 channels x 2 x 2.
pub const FEATURES: i64 = 128 * 2 * 2;

/// Trainable parameters for 10 classes (tested; the paper's bandwidths imply it).
pub const PARAMETERS: i64 = 361_290;

/// The paper's CIFAR-10 CNN (see the module docs): images [B, 3, 32, 32] -> logits
/// [B, classes], every parameter trainable.
pub struct CifarCnn {
    vs: nn::VarStore,
    blocks: Vec<(Conv2d, InstanceNorm2d)>,
    fc1: Linear,
    fc2: Linear,
    fc3: Linear,
}

impl CifarCnn {
    /// A freshly initialised CNN (PyTorch's default initialisations) on `device` for `classes`
    /// classes ([`PARAMETERS`] for 10).
    ///
    /// # Errors
    ///
    /// [`Error::BadValue`](crate::error::Error::BadValue) when `classes` is below 1 (the last
    /// layer's `Linear out_dim`).
    ///
    /// ```
    /// use dpcomp::data::Features;
    /// use dpcomp::models::{cifar_cnn, CifarCnn, Model};
    /// use dpcomp::nn::Ctx;
    /// use tch::{Device, Kind, Tensor};
    /// let model = CifarCnn::new(Device::Cpu, 10)?;
    /// assert_eq!(model.trainable_parameter_count(), cifar_cnn::PARAMETERS);
    /// let images = Features::Images(Tensor::zeros([2, 3, 32, 32], (Kind::Float, Device::Cpu)));
    /// assert_eq!(model.forward(&images, &mut Ctx::eval())?.size(), [2, 10]);
    /// # Ok::<(), dpcomp::Error>(())
    /// ```
    pub fn new(device: Device, classes: i64) -> Result<Self> {
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let mut blocks = Vec::new();
        let mut in_channels = 3;
        for (i, out_channels) in [32, 64, 128].into_iter().enumerate() {
            let p = &root / format!("block{i}");
            blocks.push((
                Conv2d::new(
                    &(&p / "conv"),
                    in_channels,
                    out_channels,
                    3,
                    Conv2dConfig::default(),
                )?,
                InstanceNorm2d::plain(),
            ));
            in_channels = out_channels;
        }
        let fc1 = Linear::new(&(&root / "fc1"), FEATURES, 256, LinearConfig::default())?;
        let fc2 = Linear::new(&(&root / "fc2"), 256, 512, LinearConfig::default())?;
        let fc3 = Linear::new(&(&root / "fc3"), 512, classes, LinearConfig::default())?;
        Ok(CifarCnn {
            vs,
            blocks,
            fc1,
            fc2,
            fc3,
        })
    }
}

impl Model for CifarCnn {
    fn forward(&self, features: &Features, ctx: &mut Ctx) -> Result<Tensor> {
        let Features::Images(xs) = features else {
            return Err(wrong_features("CifarCnn", "images", features));
        };
        check_image_shape("CifarCnn", xs)?;
        let mut xs = xs.shallow_clone();
        for (conv, norm) in &self.blocks {
            let normed = norm.forward(&conv.forward(&xs, ctx)?, ctx)?.relu();
            xs = avg_pool2x2(&normed)?.feature_dropout(0.1, ctx.train);
        }
        let xs = xs.flatten(1, -1);
        let xs = self.fc1.forward(&xs, ctx)?.relu().dropout(0.25, ctx.train);
        let xs = self.fc2.forward(&xs, ctx)?.relu().dropout(0.25, ctx.train);
        self.fc3.forward(&xs, ctx)
    }

    fn check_features(&self, features: &Features) -> Result<()> {
        let Features::Images(xs) = features else {
            return Err(wrong_features("CifarCnn", "images", features));
        };
        check_image_shape("CifarCnn", xs)
    }

    fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }
}
