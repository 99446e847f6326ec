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

/// What moves the weights given a step's final gradient: `Sgd`, `Adam`, or one of one's own,
/// which an `Updater` (and so the `Trainer`) drives the same way. The state it returns is
/// written to the checkpoint's `optimizer.safetensors` and handed back on resume.
///
/// ```
/// use dpcomp::prelude::*;
/// use std::{collections::HashMap, path::Path};
/// use tch::{Device, Kind, Tensor};
///
/// /// signSGD: each weight moves by `lr` against its gradient's sign; nothing carried.
/// struct SignSgd { lr: f64 }
///
/// impl Optimizer for SignSgd {
///     fn step(&mut self, params: &[Tensor], grads: &[Tensor]) {
///         tch::no_grad(|| {
///             for (p, g) in params.iter().zip(grads) {
///                 let _ = p.shallow_clone().g_add_(&(g.sign() * -self.lr));
///             }
///         });
///     }
///     fn state(&self, _names: &[String]) -> Vec<(String, Tensor)> { Vec::new() }
///     fn load_state(&mut self, _: &[(String, Tensor)], _: &HashMap<String, Tensor>, _: &Path)
///         -> dpcomp::Result<()> { Ok(()) }
/// }
///
/// let w = Tensor::zeros([2], (Kind::Float, Device::Cpu));
/// let mut updater = Updater::plain(SignSgd { lr: 0.5 });
/// updater.apply(0, &[w.shallow_clone()], &[Tensor::from_slice(&[2.0f32, -3.0])])?;
/// assert_eq!(Vec::<f32>::try_from(&w).unwrap(), [-0.5, 0.5]);
/// # Ok::<(), dpcomp::Error>(())
/// ```
pub trait Optimizer {
    /// How `config.toml` names an optimiser of one's own given to the `Trainer`
    /// (`[parts] optimizer`); a resumed run must be given one of the same name. By default the
    /// type's path.
    fn name(&self) -> String {
        std::any::type_name::<Self>().to_string()
    }

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

/// `saved[key]`, checked against `like`'s shape and moved to its device: how an optimiser's
/// `load_state` (the built-in ones', or one of one's own) takes each tensor back, with an error
/// naming `path` and the tensor when it is missing or of another shape.
pub fn take_like(
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
