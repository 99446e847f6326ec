//! Plain SGD (the paper's optimiser), with optional heavy-ball momentum whose buffers are part of
//! the checkpoint.

use super::optimizer::{take_like, Optimizer};
use crate::error::Result;
use std::collections::HashMap;
use std::path::Path;
use tch::Tensor;

/// SGD's settings and its momentum buffers: w <- w - lr v, v <- momentum v + g (v = g without
/// momentum), as `torch.optim.SGD` without dampening or weight decay. Hand it to an `Updater` or
/// call `Optimizer::step` in a loop of one's own.
pub struct Sgd {
    /// Learning rate, > 0.
    pub lr: f64,
    /// Heavy-ball momentum in [0, 1); 0 is plain SGD and keeps no buffers.
    pub momentum: f64,
    /// One buffer per trainable variable, created on the first step when momentum > 0.
    pub buffers: Vec<Tensor>,
}

impl Sgd {
    /// SGD with learning rate `lr` and heavy-ball `momentum` (0 for none), before its first step.
    ///
    /// ```
    /// use dpcomp::prelude::*;
    /// use tch::{Device, Kind, Tensor};
    /// let w = Tensor::ones([1], (Kind::Float, Device::Cpu));
    /// let mut sgd = Sgd::new(0.1, 0.9);
    /// let g = Tensor::ones([1], (Kind::Float, Device::Cpu));
    /// sgd.step(&[w.shallow_clone()], &[g.shallow_clone()]); // v = 1, w = 1 - 0.1
    /// sgd.step(&[w.shallow_clone()], &[g]); // v = 0.9 + 1, w = 0.9 - 0.19
    /// assert!((w.double_value(&[0]) - 0.71).abs() < 1e-6);
    /// ```
    pub fn new(lr: f64, momentum: f64) -> Self {
        Sgd {
            lr,
            momentum,
            buffers: Vec::new(),
        }
    }
}

impl Optimizer for Sgd {
    /// w <- w - lr * v, v = momentum * v + g (v = g without momentum), for each (w, g).
    fn step(&mut self, params: &[Tensor], grads: &[Tensor]) {
        tch::no_grad(|| {
            if self.momentum > 0.0 && self.buffers.is_empty() {
                self.buffers = grads.iter().map(Tensor::zeros_like).collect();
            }
            for (i, (param, grad)) in params.iter().zip(grads).enumerate() {
                let mut param = param.shallow_clone();
                if self.momentum > 0.0 {
                    let buffer = &mut self.buffers[i];
                    let _ = buffer.g_mul_scalar_(self.momentum).g_add_(grad);
                    let _ = param.g_add_(&(&*buffer * -self.lr));
                } else {
                    let _ = param.g_add_(&(grad * -self.lr));
                }
            }
        });
    }

    /// The momentum buffers, under each parameter's name (none before the first step or
    /// without momentum).
    fn state(&self, names: &[String]) -> Vec<(String, Tensor)> {
        names
            .iter()
            .zip(&self.buffers)
            .map(|(name, b)| (name.clone(), b.shallow_clone()))
            .collect()
    }

    fn load_state(
        &mut self,
        params: &[(String, Tensor)],
        saved: &HashMap<String, Tensor>,
        path: &Path,
    ) -> Result<()> {
        if saved.is_empty() {
            return Ok(());
        }
        self.buffers = params
            .iter()
            .map(|(name, p)| take_like(saved, name, p, path))
            .collect::<Result<_>>()?;
        Ok(())
    }
}

/// Scales `grads` in place so that their joint L2 norm is at most `max_norm` (factor
/// min(1, C / (||g|| + 1e-6)), as `torch.nn.utils.clip_grad_norm_`). Returns the norm before
/// clipping as a 0-d tensor on the gradients' device (no host sync). `max_norm = inf` only measures.
pub fn clip_global_norm(grads: &[Tensor], max_norm: f64) -> Tensor {
    let squares: Vec<Tensor> = grads.iter().map(|g| g.square().sum(g.kind())).collect();
    let norm = Tensor::stack(&squares, 0).sum(squares[0].kind()).sqrt();
    if max_norm.is_finite() {
        let factor = (max_norm / (&norm + 1e-6)).clamp_max(1.0);
        for g in grads {
            let _ = g.shallow_clone().g_mul_(&factor);
        }
    }
    norm
}
