//! Dense fp32: the uncompressed baseline (rate 1), counted like every other message.

use super::{Compressor, Message, Payload};
use tch::Tensor;

pub struct Identity;

impl Compressor for Identity {
    fn compress(&mut self, update: &[Tensor]) -> Message {
        Message::new(
            update
                .iter()
                .map(|t| Payload::Dense {
                    values: t.shallow_clone(),
                    value_bits: 32,
                })
                .collect(),
        )
    }

    fn decompress(&mut self, message: &Message) -> Vec<Tensor> {
        message.payloads.iter().map(Payload::to_dense).collect()
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}
