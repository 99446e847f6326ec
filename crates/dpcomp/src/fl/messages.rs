//! What a round's clients send and how the server reads it, on the compressors every training
//! run uses (`compress::Encoder` / `Decoder`). Every message crosses as bytes
//! (`Message::to_bytes` on the client, `from_bytes` on the server) and the upstream bits are
//! their length.
//!
//! - The paper's schemes (FL-STD, FL-RND, FL-FREQ, FL-CS) are linear sketches
//!   (`compress::sketched`): the server may sum their messages before decoding, as secure
//!   aggregation would, so clipping, the sum and the noise happen in the compressed domain of
//!   m values, and the server decodes the aggregate once. FL-CS's decoder keeps Algorithm 3's
//!   error in the compressed domain.
//! - DGC and PowerSGD (`compression.kind` dgc, powersgd) are not linear: the server decodes each
//!   client's message (statelessly), and clipping, the sum and the noise happen on the n
//!   model coordinates. A client takes part in few rounds, so it keeps no error feedback: each
//!   round's encoder starts afresh.

use super::FlSettings;
use crate::compress::linear_sketch::Scheme;
use crate::compress::message::{Message, Payload};
use crate::compress::sketched::{Sketch, SketchEncoder};
use crate::compress::{flatten, split, Compressor, Decoder, Encoder, SketchDecoder};
use crate::error::{Error, Result};
use std::collections::HashMap;
use tch::{Device, Tensor};

enum Sender {
    /// One encoder for every client: a linear sketch without worker state, told each round.
    Sketch(SketchEncoder),
    /// A fresh encoder per client and round, for parameters of these shapes.
    Compressor(Compressor, Vec<Vec<i64>>),
}

/// A round's senders and the server's decoder (`FlSettings::compressor`).
pub struct RoundMessages {
    sender: Sender,
    decoder: Box<dyn Decoder>,
    device: Device,
}

/// One client's message as the server received it.
pub struct Received {
    /// What the server aggregates: the m sketch values (linear), or the decoded update [n].
    pub value: Tensor,
    /// The bytes that crossed.
    pub bytes: usize,
    /// Values (and factors) the message carried.
    pub elements: u64,
}

impl RoundMessages {
    /// `shapes` are the model's parameters in the order of its flat vector.
    pub fn new(settings: &FlSettings, shapes: &[Vec<i64>], device: Device) -> Result<Self> {
        let n: i64 = shapes.iter().map(|s| s.iter().product::<i64>()).sum();
        let sketch = match settings.compressor()? {
            Compressor::Sketch(sketch) => sketch,
            // FL-STD: the whole update, as the sketch that keeps everything (linear, so the
            // server sums before decoding like the other schemes).
            Compressor::Identity => Sketch {
                seed: settings.seed ^ super::SKETCH_SEED,
                iterations: super::FL_CS_ITERATIONS,
                ..Sketch::new(Scheme::Std, 1.0)
            },
            Compressor::Denoise(_) => {
                return Err(Error::bad_value(
                    "compression.kind",
                    "denoise: not a federated compressor (`FlSettings::validate`)",
                ))
            }
            compressor => {
                let decoder = compressor.decoder(shapes, device)?;
                return Ok(RoundMessages {
                    sender: Sender::Compressor(compressor, shapes.to_vec()),
                    decoder,
                    device,
                });
            }
        };
        // FL-CS's server error (Algorithm 3, `sketch.error_feedback`); no client keeps a
        // residual (`FlSettings::validate` refuses one).
        let flat = [vec![n]];
        Ok(RoundMessages {
            sender: Sender::Sketch(SketchEncoder::new(&flat, device, sketch)?),
            decoder: Box::new(SketchDecoder::new(&flat, device, sketch)?),
            device,
        })
    }

    /// Whether the server aggregates in the compressed domain (the linear sketches).
    pub fn is_linear(&self) -> bool {
        matches!(self.sender, Sender::Sketch(_))
    }

    /// The sketch's message length m and its chunks P (linear sketches only).
    pub fn sketch_shape(&self) -> Option<(i64, Option<i64>)> {
        match &self.sender {
            Sender::Sketch(encoder) => Some((
                encoder.message_length(),
                encoder.codec().sketch.as_ref().map(|s| s.chunks),
            )),
            Sender::Compressor(..) => None,
        }
    }

    /// Client side and wire: encodes `update` [n] for round `round`, sends it as bytes, and
    /// returns what the server reads from them.
    pub fn send(&mut self, update: &Tensor, round: usize) -> Result<Received> {
        let message = match &mut self.sender {
            Sender::Sketch(encoder) => {
                encoder.set_step(round);
                encoder.encode(std::slice::from_ref(update))
            }
            Sender::Compressor(compressor, shapes) => {
                let mut encoder = compressor.encoder(shapes, self.device)?;
                encoder.set_step(round);
                encoder.encode(&split(update, shapes))
            }
        };
        let bytes = message.to_bytes()?;
        let received = Message::from_bytes(&bytes, self.device)?;
        let value = match &self.sender {
            Sender::Sketch(_) => received.payloads[0].to_dense(),
            Sender::Compressor(..) => flatten(&self.decoder.decode(&received)),
        };
        Ok(Received {
            value,
            bytes: bytes.len(),
            elements: received.elements(),
        })
    }

    /// What the messages carry from round to round, by name (a federated checkpoint saves it):
    /// the sketch sender's state under `sender.` (its step; no client keeps a residual) and the
    /// decoder's under `decoder.` (FL-CS's error e in the compressed domain). A compressor's
    /// senders are made afresh every round and carry nothing.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let mut state: Vec<(String, Tensor)> = match &self.sender {
            Sender::Sketch(encoder) => encoder
                .state()
                .into_iter()
                .map(|(name, t)| (format!("sender.{name}"), t))
                .collect(),
            Sender::Compressor(..) => Vec::new(),
        };
        state.extend(
            self.decoder
                .state()
                .into_iter()
                .map(|(name, t)| (format!("decoder.{name}"), t)),
        );
        state
    }

    /// Restores `state()` as saved: every tensor must be present with its shape.
    pub fn load_state(&mut self, state: HashMap<String, Tensor>) -> Result<()> {
        let (mut sender, mut decoder) = (HashMap::new(), HashMap::new());
        for (name, t) in state {
            if let Some(n) = name.strip_prefix("sender.") {
                sender.insert(n.to_string(), t);
            } else if let Some(n) = name.strip_prefix("decoder.") {
                decoder.insert(n.to_string(), t);
            }
        }
        if let Sender::Sketch(encoder) = &mut self.sender {
            encoder.load_state(sender)?;
        }
        self.decoder.load_state(decoder)
    }

    /// Server side: the update [n] of the aggregate of round `round`'s values (the sketch is
    /// decoded: zero filling, or FL-CS's reconstruction of its error; a compressor's aggregate
    /// is already an update).
    pub fn decode(&mut self, aggregate: &Tensor, round: usize) -> Tensor {
        match &self.sender {
            Sender::Sketch(_) => {
                self.decoder.set_step(round);
                let message = Message::new(vec![Payload::Dense {
                    values: aggregate.shallow_clone(),
                    value_bits: 32,
                }]);
                flatten(&self.decoder.decode(&message))
            }
            Sender::Compressor(..) => aggregate.shallow_clone(),
        }
    }
}
