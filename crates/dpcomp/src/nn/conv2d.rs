//! 2-D convolution with square kernels, stride and zero padding.

use super::input::{at_least, expect_dim, kernel_error, wrong_shape};
use super::per_sample::{outer, Activations, PerSample};
use super::tape::{LayerGradients, Recorded};
use super::{uniform_init, Ctx};
use crate::error::Result;
use tch::{nn, Tensor};

/// A convolution's settings besides its channels and kernel size (tch-rs's `ConvConfig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2dConfig {
    /// Step between kernel positions, in both directions (default 1).
    pub stride: i64,
    /// Zeros added on every side of the input (default 0).
    pub padding: i64,
    /// Whether the layer adds a per-channel bias (default true, as PyTorch's `nn.Conv2d`).
    pub bias: bool,
}

impl Default for Conv2dConfig {
    fn default() -> Self {
        Conv2dConfig {
            stride: 1,
            padding: 0,
            bias: true,
        }
    }
}

/// A 2-D convolution over [B, C_in, H, W] with a square kernel, recording itself for
/// per-sample gradients in a private forward pass (PyTorch's `nn.Conv2d` without dilation or
/// groups).
#[derive(Debug)]
pub struct Conv2d {
    /// The kernels, [out_channels, in_channels, kernel, kernel].
    pub weight: Tensor,
    /// One bias per output channel, `[out_channels]`; `None` without a bias.
    pub bias: Option<Tensor>,
    /// Step between kernel positions, in both directions.
    pub stride: i64,
    /// Zeros added on every side of the input.
    pub padding: i64,
}

impl Conv2d {
    /// A `kernel x kernel` convolution from `in_channels` to `out_channels` under `p`, weights and
    /// bias U(±1/√fan_in) (PyTorch's default).
    ///
    /// # Errors
    ///
    /// [`Error::BadValue`](crate::error::Error::BadValue) naming the argument (`Conv2d stride:
    /// 0, expected at least 1`) when `in_channels`, `out_channels`, `kernel` or the stride is
    /// below 1 or the padding is negative.
    ///
    /// ```
    /// use dpcomp::nn::{Conv2d, Conv2dConfig, Ctx};
    /// let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    /// let config = Conv2dConfig { stride: 2, padding: 1, ..Default::default() };
    /// let conv = Conv2d::new(&vs.root(), 3, 16, 3, config)?;
    /// let images = tch::Tensor::zeros([8, 3, 32, 32], (tch::Kind::Float, tch::Device::Cpu));
    /// assert_eq!(conv.forward(&images, &mut Ctx::eval())?.size(), [8, 16, 16, 16]);
    /// # Ok::<(), dpcomp::error::Error>(())
    /// ```
    pub fn new(
        p: &nn::Path,
        in_channels: i64,
        out_channels: i64,
        kernel: i64,
        config: Conv2dConfig,
    ) -> Result<Self> {
        at_least(
            "Conv2d",
            [
                ("in_channels", in_channels, 1),
                ("out_channels", out_channels, 1),
                ("kernel", kernel, 1),
                ("stride", config.stride, 1),
                ("padding", config.padding, 0),
            ],
        )?;
        let fan_in = in_channels * kernel * kernel;
        let weight = p.var(
            "weight",
            &[out_channels, in_channels, kernel, kernel],
            uniform_init(fan_in),
        );
        let bias = config
            .bias
            .then(|| p.var("bias", &[out_channels], uniform_init(fan_in)));
        Ok(Conv2d {
            weight,
            bias,
            stride: config.stride,
            padding: config.padding,
        })
    }

    /// xs [B, in_channels, H, W] with H, W + 2·padding at least the kernel size.
    pub fn forward(&self, xs: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let size = self.weight.size();
        let (out_channels, in_channels, kernel) = (size[0], size[1], size[2]);
        let layer = || format!("Conv2d({in_channels} -> {out_channels}, kernel {kernel})");
        expect_dim(xs, 4..=4, 1, in_channels, layer, || {
            format!("[batch, {in_channels}, height, width]")
        })?;
        let spatial = &xs.size()[2..];
        if spatial.iter().any(|&s| s + 2 * self.padding < kernel) {
            let expected = format!(
                "height and width + 2 x padding {} at least the kernel {kernel}",
                self.padding
            );
            return Err(wrong_shape(&layer(), xs, &expected));
        }
        let ys = xs
            .f_conv2d(
                &self.weight,
                self.bias.as_ref(),
                [self.stride, self.stride],
                [self.padding, self.padding],
                [1, 1],
                1,
            )
            .map_err(|e| kernel_error(&layer(), e))?;
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
        Ok(ys)
    }
}

/// A convolution on the tape: its parameters, input x [B, C, H, W] (values only) and geometry.
pub(crate) struct Conv2dRecord {
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
