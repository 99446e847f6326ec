//! What happens to a step's final gradient — clipped, and under DP noised — before the weights
//! move: compress -> decompress -> optimiser step (`../shared/design.md`, "One pipeline").
//! Compression is post-processing of the privatised gradient and never changes ε.

use super::exchange::{Exchange, StepTraffic};
use super::optimizer::Optimizer;
use crate::compress::{DenseEncoder, Link, Message, Unpack};
use crate::error::Result;
use tch::Tensor;

pub struct Updater {
    pub optimizer: Box<dyn Optimizer>,
    /// The worker's encoder and the receiver's decoder (one worker in this process).
    pub compressor: Link,
    /// Upstream bits of the last step's message: 8 x the length of its bytes (`compress::wire`).
    pub last_bits: u64,
    /// The same message in the paper's unit (64 bits per transmitted element, `Message::paper_bits`).
    pub last_paper_bits: u64,
    /// With W workers (`train::exchange`): the transport and the decoders of every sender; the
    /// update is then the mean of the W workers' decoded messages. `None`: one worker, whose
    /// message goes through bytes to `compressor.decoder` in this process.
    pub exchange: Option<Exchange>,
    /// What the last step's exchange cost (zero with one worker).
    pub last_traffic: StepTraffic,
    /// C2: the update's global L2 norm is clipped to this before the compressor (the
    /// compression paper's "second clipping", `compression.clip_noised`; post-processing of
    /// the privatised gradient, so ε does not change). One worker only: with several, each
    /// worker's share of the noise is not private on its own.
    pub clip_noised: Option<f64>,
}

impl Updater {
    pub fn new(optimizer: Box<dyn Optimizer>, compressor: Link) -> Self {
        Updater {
            optimizer,
            compressor,
            last_bits: 0,
            last_paper_bits: 0,
            exchange: None,
            last_traffic: StepTraffic::default(),
            clip_noised: None,
        }
    }

    /// Uncompressed (dense fp32 messages, still counted).
    pub fn plain(optimizer: impl Optimizer + 'static) -> Self {
        let link = Link {
            encoder: Box::new(DenseEncoder),
            decoder: Box::new(Unpack::per_parameter()),
        };
        Self::new(Box::new(optimizer), link)
    }

    /// Encodes `grads`, sends the message through bytes, and steps the optimiser on what the
    /// decoder reconstructs from those bytes (with W workers: on the mean of what every worker's
    /// message decodes to, `Exchange::exchange`). Returns the bits sent (8 x the byte length).
    pub fn apply(&mut self, params: &[Tensor], grads: &[Tensor]) -> Result<u64> {
        let clipped;
        let grads = match self.clip_noised {
            Some(radius) => {
                clipped = clip_global_norm(grads, radius);
                &clipped[..]
            }
            None => grads,
        };
        if let Some(exchange) = self.exchange.as_mut() {
            let exchanged = exchange.exchange(self.compressor.encoder.as_mut(), grads)?;
            self.last_bits = exchanged.bits;
            self.last_paper_bits = exchanged.paper_bits;
            self.last_traffic = exchanged.cost;
            self.optimizer.step(params, &exchanged.update);
            return Ok(self.last_bits);
        }
        let message = self.compressor.encoder.encode(grads);
        let bytes = message.to_bytes()?;
        self.last_bits = 8 * bytes.len() as u64;
        self.last_paper_bits = message.paper_bits();
        let device = grads.first().map_or(tch::Device::Cpu, Tensor::device);
        let received = Message::from_bytes(&bytes, device)?;
        let update = self.compressor.decoder.decode(&received);
        self.optimizer.step(params, &update);
        Ok(self.last_bits)
    }
}

/// `grads` scaled by min(1, radius / ||grads||) over all of them together, on the device (no
/// host read: the factor stays a tensor).
fn clip_global_norm(grads: &[Tensor], radius: f64) -> Vec<Tensor> {
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
