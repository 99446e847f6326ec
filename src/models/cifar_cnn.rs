//! CIFAR-10: three blocks [Conv 3x3 stride 1 (padding 1, bias) -> InstanceNorm (affine) -> ReLU ->
//! AvgPool 2 -> Dropout2d 0.1] with 32, 64, 128 filters -> Linear 2048->256 -> ReLU -> Dropout 0.25
//! -> Linear 256->512 -> ReLU -> Dropout 0.25 -> Linear 512->10. 754,954 parameters.

use super::{wrong_features, Model};
use crate::data::Features;
use crate::nn::{Conv2d, Ctx, InstanceNorm2d, Linear};
use tch::{nn, Device, Tensor};

pub struct CifarCnn {
    vs: nn::VarStore,
    pub blocks: Vec<(Conv2d, InstanceNorm2d)>,
    pub fc1: Linear,
    pub fc2: Linear,
    pub fc3: Linear,
}

impl CifarCnn {
    pub fn new(device: Device, classes: i64) -> Self {
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let mut blocks = Vec::new();
        let mut in_channels = 3;
        for (i, out_channels) in [32, 64, 128].into_iter().enumerate() {
            let p = &root / format!("block{i}");
            blocks.push((
                Conv2d::new(&(&p / "conv"), in_channels, out_channels, 3, 1, 1, true),
                InstanceNorm2d::new(&(&p / "norm"), out_channels),
            ));
            in_channels = out_channels;
        }
        let fc1 = Linear::new(&(&root / "fc1"), 128 * 4 * 4, 256, true);
        let fc2 = Linear::new(&(&root / "fc2"), 256, 512, true);
        let fc3 = Linear::new(&(&root / "fc3"), 512, classes, true);
        CifarCnn {
            vs,
            blocks,
            fc1,
            fc2,
            fc3,
        }
    }
}

impl Model for CifarCnn {
    fn forward(&self, features: &Features, ctx: &mut Ctx) -> Tensor {
        let Features::Images(xs) = features else {
            wrong_features("CifarCnn", features)
        };
        let mut xs = xs.shallow_clone();
        for (conv, norm) in &self.blocks {
            xs = norm
                .forward(&conv.forward(&xs, ctx), ctx)
                .relu()
                .avg_pool2d([2, 2], [2, 2], [0, 0], false, true, None::<i64>)
                .feature_dropout(0.1, ctx.train);
        }
        let xs = xs.flatten(1, -1);
        let xs = self.fc1.forward(&xs, ctx).relu().dropout(0.25, ctx.train);
        let xs = self.fc2.forward(&xs, ctx).relu().dropout(0.25, ctx.train);
        self.fc3.forward(&xs, ctx)
    }

    fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }
}
