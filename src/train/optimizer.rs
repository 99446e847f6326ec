//! The optimiser a step's final gradient drives: SGD with heavy-ball momentum (the paper's) or
//! Adam (Kingma & Ba 2015, as `torch.optim.Adam`). Under DP it receives the engine's privatised
//! gradient, so whatever it does is post-processing and costs no ε (DP-SGD, DP-Adam).
//!
//! State for the checkpoint's `optimizer.safetensors` is named by parameter: SGD's momentum
//! buffers under the parameter's own name (the format every earlier checkpoint has), Adam's
//! moments as `m.<name>` and `v.<name>` plus its step count `step`.

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::path::Path;
use tch::Tensor;

pub trait Optimizer {
    /// Moves each parameter by its gradient (same order and shapes).
    fn step(&mut self, params: &[Tensor], grads: &[Tensor]);

    /// Everything carried between steps, named for parameters `names` (empty when stateless).
    fn state(&self, names: &[String]) -> Vec<(String, Tensor)>;

    /// Restores `state` as saved in `path` for `params` (name, tensor); an empty file means no
    /// step has been carried yet.
    fn load_state(
        &mut self,
        params: &[(String, Tensor)],
        saved: &HashMap<String, Tensor>,
        path: &Path,
    ) -> Result<()>;
}

/// `saved[key]`, checked against `like`'s shape and moved to its device.
pub(crate) fn take_like(
    saved: &HashMap<String, Tensor>,
    key: &str,
    like: &Tensor,
    path: &Path,
) -> Result<Tensor> {
    let t = saved
        .get(key)
        .ok_or_else(|| Error::bad_file(path, format!("missing tensor {key}")))?;
    crate::nn::check_loaded(path, key, t, &like.size())?;
    Ok(t.to_device(like.device()))
}
