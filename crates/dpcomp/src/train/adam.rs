//! Adam (Kingma & Ba 2015) as `torch.optim.Adam` computes it (no weight decay, no AMSGrad):
//! with t the step count,
//!
//!   m <- β1 m + (1 - β1) g,   v <- β2 v + (1 - β2) g²,
//!   θ <- θ - (lr / (1 - β1^t)) m / (sqrt(v) / sqrt(1 - β2^t) + eps).
//!
//! Fed the privacy engine's noised gradient this is DP-Adam: post-processing, no extra ε. Its
//! moments and step count are checkpointed (`m.<name>`, `v.<name>`, `step`).

use super::optimizer::{take_like, Optimizer};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::path::Path;
use tch::{Device, Kind, Tensor};

/// Adam's settings and its state: the moments m and v of every parameter and the step count t
/// (module docs for the update). Made by `Adam::new`; hand it to an `Updater` or call
/// `Optimizer::step` in a loop of one's own.
pub struct Adam {
    /// Learning rate (the step size before bias correction), > 0.
    pub lr: f64,
    /// β1, the decay of the first moment m, in [0, 1); torch's default 0.9.
    pub beta1: f64,
    /// β2, the decay of the second moment v, in [0, 1); torch's default 0.999.
    pub beta2: f64,
    /// ε added to sqrt(v̂) in the denominator, for numerical stability; torch's default 1e-8.
    pub eps: f64,
    /// First and second moments per parameter, created on the first step.
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    /// Steps taken (t).
    steps: i64,
}

impl Adam {
    /// Adam with learning rate `lr`, moment decays `beta1` and `beta2`, and `eps`, before its
    /// first step (moments are made on the first step, shaped as its gradients).
    ///
    /// ```
    /// use dpcomp::prelude::*;
    /// use tch::{Device, Kind, Tensor};
    /// let w = Tensor::zeros([2], (Kind::Float, Device::Cpu));
    /// let mut adam = Adam::new(0.01, 0.9, 0.999, 1e-8);
    /// adam.step(&[w.shallow_clone()], &[Tensor::from_slice(&[3.0f32, -0.5])]);
    /// // The first bias-corrected step moves each weight by about lr against its gradient's sign.
    /// let moved = Vec::<f32>::try_from(&w).unwrap();
    /// assert!((moved[0] + 0.01).abs() < 1e-6 && (moved[1] - 0.01).abs() < 1e-6);
    /// assert_eq!(adam.steps(), 1);
    /// ```
    pub fn new(lr: f64, beta1: f64, beta2: f64, eps: f64) -> Self {
        Adam {
            lr,
            beta1,
            beta2,
            eps,
            m: Vec::new(),
            v: Vec::new(),
            steps: 0,
        }
    }

    /// t, the steps taken so far (restored from a checkpoint's `step` on resume).
    pub fn steps(&self) -> i64 {
        self.steps
    }
}

impl Optimizer for Adam {
    fn step(&mut self, params: &[Tensor], grads: &[Tensor]) {
        tch::no_grad(|| {
            if self.m.is_empty() {
                self.m = grads.iter().map(Tensor::zeros_like).collect();
                self.v = grads.iter().map(Tensor::zeros_like).collect();
            }
            self.steps += 1;
            let t = self.steps as i32;
            let correction1 = 1.0 - self.beta1.powi(t);
            let correction2 = 1.0 - self.beta2.powi(t);
            for (i, (param, grad)) in params.iter().zip(grads).enumerate() {
                let (m, v) = (&mut self.m[i], &mut self.v[i]);
                let _ = m
                    .g_mul_scalar_(self.beta1)
                    .g_add_(&(grad * (1.0 - self.beta1)));
                let _ = v
                    .g_mul_scalar_(self.beta2)
                    .g_add_(&(grad.square() * (1.0 - self.beta2)));
                let denominator = v.sqrt() / correction2.sqrt() + self.eps;
                let update = &*m / denominator * (-self.lr / correction1);
                let _ = param.shallow_clone().g_add_(&update);
            }
        });
    }

    fn state(&self, names: &[String]) -> Vec<(String, Tensor)> {
        if self.m.is_empty() {
            return Vec::new();
        }
        let mut state = Vec::new();
        for ((name, m), v) in names.iter().zip(&self.m).zip(&self.v) {
            state.push((format!("m.{name}"), m.shallow_clone()));
            state.push((format!("v.{name}"), v.shallow_clone()));
        }
        state.push((
            "step".to_string(),
            Tensor::from(self.steps).to_kind(Kind::Int64),
        ));
        state
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
        let step = saved.get("step").ok_or_else(|| {
            Error::bad_file(
                path,
                "missing Adam's step count `step` (a checkpoint of another optimiser?)",
            )
        })?;
        self.steps = crate::host::i64_scalar(&step.to_device(Device::Cpu));
        self.m = params
            .iter()
            .map(|(name, p)| take_like(saved, &format!("m.{name}"), p, path))
            .collect::<Result<_>>()?;
        self.v = params
            .iter()
            .map(|(name, p)| take_like(saved, &format!("v.{name}"), p, path))
            .collect::<Result<_>>()?;
        Ok(())
    }
}
