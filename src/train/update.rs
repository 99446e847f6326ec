//! What happens to a step's final gradient — clipped, and under DP noised — before the weights
//! move: compress -> decompress -> optimiser step (`../shared/design.md`, "One pipeline").
//! Compression is post-processing of the privatised gradient and never changes ε.

use super::sgd::Sgd;
use crate::compress::{Compressor, Identity};
use tch::Tensor;

pub struct Updater {
    pub optimizer: Sgd,
    pub compressor: Box<dyn Compressor>,
    /// Upstream bits of the last step's message.
    pub last_bits: u64,
    /// The same message in the paper's unit (64 bits per transmitted element, `Message::paper_bits`).
    pub last_paper_bits: u64,
}

impl Updater {
    pub fn new(optimizer: Sgd, compressor: Box<dyn Compressor>) -> Self {
        Updater {
            optimizer,
            compressor,
            last_bits: 0,
            last_paper_bits: 0,
        }
    }

    /// Uncompressed (dense fp32 messages, still counted).
    pub fn plain(optimizer: Sgd) -> Self {
        Self::new(optimizer, Box::new(Identity))
    }

    /// Sends `grads` through the compressor and steps the optimiser on what the receiver gets.
    /// Returns the message's wire bits.
    pub fn apply(&mut self, params: &[Tensor], grads: &[Tensor]) -> u64 {
        let message = self.compressor.compress(grads);
        self.last_bits = message.wire_bits();
        self.last_paper_bits = message.paper_bits();
        let received = self.compressor.decompress(&message);
        self.optimizer.step(params, &received);
        self.last_bits
    }
}
