//! Dense fp32: the uncompressed baseline (rate 1), counted like every other message. Its
//! receiver is `Unpack`.

use super::codec::{all_reduce_sum, AllReduce, Encoder};
use super::message::{Message, Payload};
use crate::error::Result;
use tch::Tensor;

/// The identity compressor's worker side (`Compressor::Identity`): every update tensor sent as
/// dense fp32 values, stateless; `Unpack` receives it.
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

    /// The workers' updates averaged by one all-reduce (what DDP does without compression).
    fn encode_all_reduced(
        &mut self,
        update: &[Tensor],
        workers: usize,
        reduce: &mut AllReduce,
    ) -> Option<Result<Message>> {
        Some(all_reduce_sum(update, reduce).map(|sums| {
            self.encode(
                &sums
                    .into_iter()
                    .map(|s| s / workers as f64)
                    .collect::<Vec<_>>(),
            )
        }))
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}
