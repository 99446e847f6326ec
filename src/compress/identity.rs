//! Dense fp32: the uncompressed baseline (rate 1), counted like every other message. Its
//! receiver is `Unpack`.

use super::{Encoder, Message, Payload};
use tch::Tensor;

pub struct DenseEncoder;

impl Encoder for DenseEncoder {
    fn encode(&mut self, update: &[Tensor]) -> Message {
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

    fn state(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}
