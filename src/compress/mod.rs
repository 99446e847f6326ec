//! Gradient compressors: what one worker puts on the wire for its update, and how the receiver
//! turns it back into an update (`../shared/papers/dp-and-gradient-compression.txt`, its
//! "gradient compression" sections; GRACE's compressor/memory split).
//!
//! In training the order is clip -> noise -> **compress -> decompress** -> optimiser step
//! (`train::apply_update`): compression is post-processing of the already-noisy gradient and never
//! changes ε. Every compressor keeps its own per-worker state (residuals, momentum, velocity,
//! warm-start factors), allocated from the parameters' shapes when it is built
//! (`CompressorSpec::build`) and saved in every checkpoint (`state` / `load_state`). All tensor
//! work stays on the gradients' device.

pub mod denoise;
pub mod dgc;
pub mod encoding;
pub mod identity;
pub mod message;
pub mod options;
pub mod powersgd;
pub mod topk;
pub mod wire;

pub use denoise::Denoise;
pub use dgc::Dgc;
pub use identity::Identity;
pub use message::{Message, Payload};
pub use options::{CompressorKind, CompressorSpec};
pub use powersgd::PowerSgd;

use crate::error::Result;
use std::collections::HashMap;
use tch::Tensor;

/// What a sparsifier's top-k ranks together: each parameter tensor on its own (layer-wise, DGC's
/// way) or all parameters as one vector (model-wise: the k largest of the whole update, so a
/// layer may send nothing in a step).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Layer,
    Model,
}

/// One worker's compressor (sender) together with the receiver's side of it.
pub trait Compressor {
    /// The message for this step's update, one tensor per trainable parameter (in a fixed order).
    fn compress(&mut self, update: &[Tensor]) -> Message;

    /// The update the receiver reconstructs from `message` (same shapes as `compress`'s input).
    fn decompress(&mut self, message: &Message) -> Vec<Tensor>;

    /// Called at the start of every epoch (0-based), for schedules such as DGC's warm-up.
    fn start_epoch(&mut self, _epoch: usize) {}

    /// Everything the compressor carries from one step to the next, by name. A checkpoint
    /// saves it; `load_state` copies it back exactly.
    fn state(&self) -> Vec<(String, Tensor)>;

    /// Restores `state()` as saved; every tensor must be present with its shape.
    fn load_state(&mut self, mut state: HashMap<String, Tensor>) -> Result<()> {
        for (name, mut mine) in self.state() {
            let saved = take_state(&mut state, &name, &mine.size())?;
            tch::no_grad(|| mine.copy_(&saved));
        }
        Ok(())
    }
}

/// Bits of `update` sent as dense fp32: the uncompressed baseline every rate is relative to.
pub fn dense_fp32_bits(update: &[Tensor]) -> u64 {
    update.iter().map(|t| 32 * t.numel() as u64).sum()
}

/// Looks up `name` in a saved state, checking that it has `shape` and, if floating, finite values.
pub(crate) fn take_state(
    state: &mut HashMap<String, Tensor>,
    name: &str,
    shape: &[i64],
) -> Result<Tensor> {
    let t = state.remove(name).ok_or_else(|| {
        crate::error::Error::bad_value(
            "compressor state",
            format!("missing tensor {name} in the checkpoint's compressor.safetensors"),
        )
    })?;
    if t.size() != shape {
        return Err(crate::error::Error::bad_value(
            "compressor state",
            format!("{name}: shape {:?}, expected {shape:?}", t.size()),
        ));
    }
    if !crate::nn::all_finite(&t) {
        return Err(crate::error::Error::bad_value(
            "compressor state",
            format!("{name}: holds NaN or infinite values"),
        ));
    }
    Ok(t)
}
