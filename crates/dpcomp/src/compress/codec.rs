//! What every compressor shares: the worker's `Encoder` and the receiver's `Decoder`, the two
//! joined in one process (`Link`), the all-reduce a linear compressor's workers sum through,
//! the sparsifiers' `Scope`, and the small tensor helpers their encoders use (flattening,
//! checkpoint state, global-norm clipping). It imports no compressor: each compressor's module
//! imports from here.

use super::message::{Message, Payload};
use crate::error::Result;
use std::collections::HashMap;
use tch::Tensor;

/// What a sparsifier's top-k ranks together: each parameter tensor on its own (layer-wise, DGC's
/// way) or all parameters as one vector (model-wise: the k largest of the whole update, so a
/// layer may send nothing in a step).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// One top-k per parameter tensor, each at the rate's budget (`scope=layer`, the default).
    #[default]
    Layer,
    /// One top-k over all parameters concatenated into one flat vector (`scope=model`).
    Model,
}

/// The worker's side of a compressor: turns each step's update into the message it sends and
/// keeps what the worker carries between steps (error feedback, momentum correction,
/// PowerSGD's warm-started Q, Denoise's velocity and its mirror of the receiver's).
pub trait Encoder {
    /// The message for this step's update, one tensor per trainable parameter (in a fixed order).
    fn encode(&mut self, update: &[Tensor]) -> Message;

    /// Called at the start of every epoch (0-based), for schedules such as DGC's warm-up.
    fn start_epoch(&mut self, _epoch: usize) {}

    /// Numbers the next message `step` (the sketches draw FL-RND's coordinates from it). A
    /// training run's encoder counts its own steps; a federated round creates its clients'
    /// encoders afresh and tells them the round.
    fn set_step(&mut self, _step: usize) {}

    /// Everything the encoder carries from one step to the next, by name. A checkpoint saves
    /// it; `load_state` copies it back exactly.
    fn state(&self) -> Vec<(String, Tensor)>;

    /// For a linear compressor (dense fp32, PowerSGD): this step's message formed together with
    /// the other workers of a data-parallel run, every worker's encoder making the
    /// same calls to `reduce`, an all-reduce sum over the `workers` workers. The message decodes
    /// (`Unpack`) to the compressor's estimate of the *mean* of the workers' updates, the same
    /// on every worker. `None` for compressors whose messages are instead gathered and decoded
    /// one by one (the sparsifiers, Denoise, the sketches).
    fn encode_all_reduced(
        &mut self,
        _update: &[Tensor],
        _workers: usize,
        _reduce: &mut AllReduce,
    ) -> Option<Result<Message>> {
        None
    }

    /// Restores `state()` as saved; every tensor must be present with its shape.
    fn load_state(&mut self, state: HashMap<String, Tensor>) -> Result<()> {
        copy_state(self.state(), state)
    }
}

/// The receiver's side: turns a message back into an update of the parameters' shapes. DGC,
/// PowerSGD and dense messages decode statelessly (`Unpack`); Denoise's receiver keeps its
/// velocity.
pub trait Decoder {
    /// The update the receiver reconstructs from `message` (the shapes the encoder was given).
    fn decode(&mut self, message: &Message) -> Vec<Tensor>;

    /// What the receiver makes of the mean of the W workers' decoded updates: the mean itself
    /// (the default), or signSGD's majority vote, its sign. A single worker's update goes
    /// through it too.
    fn combine(&self, mean: Vec<Tensor>) -> Vec<Tensor> {
        mean
    }

    /// Numbers the next message `step`, as `Encoder::set_step` does on the sender.
    fn set_step(&mut self, _step: usize) {}

    /// What the decoder carries from one message to the next, by name (empty when stateless).
    fn state(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }

    /// Restores `state()` as saved; every tensor must be present with its shape.
    fn load_state(&mut self, state: HashMap<String, Tensor>) -> Result<()> {
        copy_state(self.state(), state)
    }
}

/// Copies each saved tensor into the live one of the same name (checked by `take_state`).
pub(crate) fn copy_state(
    live: Vec<(String, Tensor)>,
    mut saved: HashMap<String, Tensor>,
) -> Result<()> {
    for (name, mut mine) in live {
        let value = take_state(&mut saved, &name, &mine.size())?;
        tch::no_grad(|| mine.copy_(&value));
    }
    Ok(())
}

/// One worker's encoder and the receiver's decoder, joined in one process: what a single-worker
/// run, a benchmark or a test uses. (With several workers each holds its own encoder and the
/// receiver one decoder.)
pub struct Link {
    /// The worker's side, with its state (residuals, momentum, warm-start factors).
    pub encoder: Box<dyn Encoder>,
    /// The receiver's side (stateless `Unpack`, or Denoise's and the sketches' decoders).
    pub decoder: Box<dyn Decoder>,
}

/// Name prefix of the encoder's tensors in a checkpoint's `compressor.safetensors`
/// (`Link::state`).
pub const ENCODER_PREFIX: &str = "encoder.";
/// Name prefix of the decoder's tensors in a checkpoint's `compressor.safetensors`
/// (`Link::state`).
pub const DECODER_PREFIX: &str = "decoder.";

impl Link {
    /// Encodes `update` and decodes the message in memory (no bytes: `train::Updater` sends
    /// them through `wire`). Returns the message and the received update.
    pub fn round_trip(&mut self, update: &[Tensor]) -> (Message, Vec<Tensor>) {
        let message = self.encoder.encode(update);
        let received = self.decoder.decode(&message);
        (message, received)
    }

    /// Tells the encoder that epoch `epoch` (0-based) starts (`Encoder::start_epoch`: DGC's
    /// sparsity warm-up reads it).
    pub fn start_epoch(&mut self, epoch: usize) {
        self.encoder.start_epoch(epoch);
    }

    /// Both sides' state, named `encoder.*` and `decoder.*`.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let prefixed = |prefix: &str, state: Vec<(String, Tensor)>| {
            state
                .into_iter()
                .map(|(name, t)| (format!("{prefix}{name}"), t))
                .collect::<Vec<_>>()
        };
        let mut state = prefixed(ENCODER_PREFIX, self.encoder.state());
        state.extend(prefixed(DECODER_PREFIX, self.decoder.state()));
        state
    }

    /// Restores `state()` as saved. Checkpoints written before the encoder/decoder split hold
    /// one namespace without prefixes (`residual.0`, `received.0`, ...): each such name goes to
    /// the side whose state has it (the decoder's names never occurred on the encoder's side).
    pub fn load_state(&mut self, state: HashMap<String, Tensor>) -> Result<()> {
        let split = state
            .keys()
            .any(|k| k.starts_with(ENCODER_PREFIX) || k.starts_with(DECODER_PREFIX));
        let decoder_names: Vec<String> = self.decoder.state().into_iter().map(|(n, _)| n).collect();
        let (mut encoder, mut decoder) = (HashMap::new(), HashMap::new());
        for (name, t) in state {
            if split {
                if let Some(n) = name.strip_prefix(ENCODER_PREFIX) {
                    encoder.insert(n.to_string(), t);
                } else if let Some(n) = name.strip_prefix(DECODER_PREFIX) {
                    decoder.insert(n.to_string(), t);
                }
            } else if decoder_names.contains(&name) {
                decoder.insert(name, t);
            } else {
                encoder.insert(name, t);
            }
        }
        self.encoder.load_state(encoder)?;
        self.decoder.load_state(decoder)
    }
}

/// Sums a flat f32 vector over the workers of a data-parallel run and returns the sum on the
/// vector's device, the same on every worker (`comm::Communicator::all_reduce_sum`, through
/// the exchange's host buffers, `comm::staging`; or in place where the transport moves
/// tensors, `Communicator::all_reduce_tensor`). The vector is the caller's own, which it may
/// find summed afterwards: `all_reduce_sum` hands it one made for the call.
pub type AllReduce<'a> = dyn FnMut(&Tensor) -> Result<Tensor> + 'a;

/// `tensors` summed over the workers through one call of `reduce` (one flat vector, as MPI
/// sums it), each back on its device in its shape and kind.
pub fn all_reduce_sum(tensors: &[Tensor], reduce: &mut AllReduce) -> Result<Vec<Tensor>> {
    if tensors.is_empty() {
        return Ok(Vec::new());
    }
    let flat = flatten(
        &tensors
            .iter()
            .map(|t| t.to_kind(tch::Kind::Float))
            .collect::<Vec<_>>(),
    );
    let summed = reduce(&flat)?;
    let shapes: Vec<Vec<i64>> = tensors.iter().map(Tensor::size).collect();
    Ok(split(&summed, &shapes)
        .into_iter()
        .zip(tensors)
        .map(|(s, t)| s.to_kind(t.kind()))
        .collect())
}

/// The mean over the workers of a message of dense fp32 payloads (the linear compressors whose
/// workers share their coordinates: the sketches, random-k), by one all-reduce of its values.
pub(crate) fn mean_of_dense_messages(
    message: Message,
    workers: usize,
    reduce: &mut AllReduce,
) -> Result<Message> {
    let values: Vec<Tensor> = message
        .payloads
        .iter()
        .map(|p| match p {
            Payload::Dense { values, .. } => values.shallow_clone(),
            _ => unreachable!("a linear compressor's message is dense values"),
        })
        .collect();
    let sums = all_reduce_sum(&values, reduce)?;
    Ok(Message::new(
        sums.into_iter()
            .map(|s| Payload::Dense {
                values: s / workers as f64,
                value_bits: 32,
            })
            .collect(),
    ))
}

/// The tensors of `update` flattened and joined into one vector, in order.
pub fn flatten(update: &[Tensor]) -> Tensor {
    let parts: Vec<Tensor> = update.iter().map(|t| t.reshape([-1])).collect();
    Tensor::cat(&parts, 0)
}

/// The inverse of `flatten`: `flat` cut into tensors of `shapes` (views, in order).
pub fn split(flat: &Tensor, shapes: &[Vec<i64>]) -> Vec<Tensor> {
    let mut offset = 0;
    shapes
        .iter()
        .map(|shape| {
            let numel: i64 = shape.iter().product();
            let part = flat.narrow(0, offset, numel).view(shape.as_slice());
            offset += numel;
            part
        })
        .collect()
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

/// `grads` scaled by min(1, radius / (||grads|| + 1e-6)) over all of them together (the second
/// clipping of `compression.clip_noised` and of Denoise's `clip`), on the device (no
/// host read: the factor stays a tensor).
pub(crate) fn clip_global_norm(grads: &[Tensor], radius: f64) -> Vec<Tensor> {
    tch::no_grad(|| {
        let squares: Vec<Tensor> = grads
            .iter()
            .map(|g| g.to_kind(tch::Kind::Float).square().sum(tch::Kind::Float))
            .collect();
        let norm = Tensor::stack(&squares, 0).sum(tch::Kind::Float).sqrt();
        let factor = (radius / (norm + 1e-6)).clamp_max(1.0);
        grads
            .iter()
            .map(|g| g * &factor.to_kind(g.kind()))
            .collect()
    })
}
