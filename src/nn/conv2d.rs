//! 2-D convolution with square kernels, stride and zero padding.

use super::per_sample::{outer, Activations, PerSample};
use super::tape::{LayerGradients, Recorded};
use super::{uniform_init, Ctx};
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
            let record = Conv2dRecord {
                weight: self.weight.shallow_clone(),
                bias: self.bias.as_ref().map(Tensor::shallow_clone),
                input: xs.detach(),
                stride: self.stride,
                padding: self.padding,
            };
            tape.push(record, &ys);
        }
        ys
    }
}

/// A convolution on the tape: its parameters, input x [B, C, H, W] (values only) and geometry.
pub struct Conv2dRecord {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub input: Tensor,
    pub stride: i64,
    pub padding: i64,
}

impl Recorded for Conv2dRecord {
    /// g_i(W) = Σ_l b_il p_ilᵀ over output positions l, p the input's patches (cut only when a
    /// norm or sum needs them, `Activations::Patches`); g_i(b) = Σ_l b_il.
    fn per_sample(&self, grad: &Tensor) -> LayerGradients {
        let batch = grad.size()[0];
        let size = self.weight.size();
        let (out_channels, kernel) = (size[0], size[2]);
        let a = Activations::Patches {
            input: self.input.shallow_clone(),
            kernel,
            stride: self.stride,
            padding: self.padding,
        };
        let b = grad.reshape([batch, out_channels, -1]).transpose(1, 2);
        let mut parameters = Vec::new();
        if let Some(bias) = &self.bias {
            let summed = b.sum_dim_intlist(1, false, b.kind());
            parameters.push((bias.shallow_clone(), PerSample::Direct(summed)));
        }
        parameters.push((self.weight.shallow_clone(), outer(a, b, size)));
        LayerGradients::of(parameters)
    }
}
