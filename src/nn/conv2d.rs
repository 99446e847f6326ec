//! 2-D convolution with square kernels, stride and zero padding.

use super::{uniform_init, Ctx, Layer};
use tch::{nn, Tensor};

#[derive(Debug)]
pub struct Conv2d {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub stride: i64,
    pub padding: i64,
}

impl Conv2d {
    pub fn new(
        p: &nn::Path,
        in_channels: i64,
        out_channels: i64,
        kernel: i64,
        stride: i64,
        padding: i64,
        bias: bool,
    ) -> Self {
        let fan_in = in_channels * kernel * kernel;
        let weight = p.var(
            "weight",
            &[out_channels, in_channels, kernel, kernel],
            uniform_init(fan_in),
        );
        let bias = bias.then(|| p.var("bias", &[out_channels], uniform_init(fan_in)));
        Conv2d {
            weight,
            bias,
            stride,
            padding,
        }
    }

    pub fn forward(&self, xs: &Tensor, ctx: &mut Ctx) -> Tensor {
        let ys = xs.conv2d(
            &self.weight,
            self.bias.as_ref(),
            [self.stride, self.stride],
            [self.padding, self.padding],
            [1, 1],
            1,
        );
        if let Some(tape) = ctx.tape().filter(|_| self.weight.requires_grad()) {
            let layer = Layer::Conv2d {
                weight: self.weight.shallow_clone(),
                bias: self.bias.as_ref().map(Tensor::shallow_clone),
                input: xs.detach(),
                stride: self.stride,
                padding: self.padding,
            };
            tape.push(layer, &ys);
        }
        ys
    }
}
