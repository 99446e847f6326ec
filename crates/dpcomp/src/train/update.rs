//! What happens to a step's final gradient — clipped, and under DP noised — before the weights
//! move: compress -> decompress -> optimiser step (one pipeline, `docs/architecture.md`).
//! Compression is post-processing of the privatised gradient and never changes ε.

use super::exchange::{Exchange, StepTraffic};
use super::optimizer::Optimizer;
use crate::compress::{Compressor, DenseEncoder, Link, Message, Unpack};
use crate::error::{Error, Result};
use tch::Tensor;

/// Compressor and optimiser: what a step's final gradient goes through (module docs). A loop of
/// one's own makes one with `Updater::with_compressor` and calls `apply` once a step.
///
/// ```
/// use dpcomp::prelude::*;
/// use dpcomp::compress::{Compressor, Dgc};
/// let params = [tch::Tensor::zeros([256], (tch::Kind::Float, tch::Device::Cpu))];
/// let dgc = Compressor::Dgc(Dgc { rate: 16.0, warmup_epochs: 2, ..Default::default() });
/// let mut updater = Updater::with_compressor(Sgd::new(0.1, 0.0), &dgc, &params)?;
/// let grads = [tch::Tensor::ones([256], (tch::Kind::Float, tch::Device::Cpu))];
/// let bits = updater.apply(0, &params, &grads)?; // epoch 0: DGC's warm-up rate 4
/// assert!(bits < 256 * 32);
/// # Ok::<(), dpcomp::error::Error>(())
/// ```
pub struct Updater {
    /// What moves the weights once the message is decoded (`Sgd`, `Adam` or one's own).
    pub optimizer: Box<dyn Optimizer>,
    /// The worker's encoder and the receiver's decoder (one worker in this process).
    pub compressor: Link,
    /// Upstream bits of the last step's message: 8 x the length of its bytes (`compress::wire`).
    pub last_bits: u64,
    /// The same message in the paper's unit (64 bits per transmitted element, `Message::paper_bits`).
    pub last_paper_bits: u64,
    /// The part of the last message's size that depends on its values (threshold-v, QSGD's
    /// Elias gamma), left on the device so that the step does not wait for it: an int64 tensor
    /// [wire bits, paper bits] to add to `last_bits` and `last_paper_bits`. The trainer reads
    /// the steps' sizes together at its logging interval (`take_pending_bits`).
    pending_bits: Option<Tensor>,
    /// With W workers (`train::exchange`): the transport and the decoders of every sender; the
    /// update is then the mean of the W workers' decoded messages. `None`: one worker, whose
    /// message goes through bytes to `compressor.decoder` in this process.
    pub exchange: Option<Exchange>,
    /// What the last step's exchange cost (zero with one worker).
    pub last_traffic: StepTraffic,
    /// The epoch the compressor was last told of (DGC's warm-up depends on it).
    epoch: Option<usize>,
    /// C2: the update's global L2 norm is clipped to this before the compressor (the
    /// compression paper's "second clipping", `compression.clip_noised`; post-processing of
    /// the privatised gradient, so ε does not change). One worker only: with several, each
    /// worker's share of the noise is not private on its own.
    pub clip_noised: Option<f64>,
    /// One worker: whether each message goes through its bytes (`Message::to_bytes`, a copy to
    /// the host and back) before the decoder reads it, as a remote worker's would. Off (the
    /// default), the decoder reads the message in memory and the bits are the bytes' exact
    /// length computed from the payloads' sizes (`wire::encoded_len`): the same update bit for
    /// bit and the same count (tested for every compressor), with no host copy in the step.
    pub verify_wire: bool,
}

impl Updater {
    /// `optimizer` after the encoder and decoder of `compressor`, built already: for an
    /// `Encoder`/`Decoder` pair of one's own (`with_compressor` builds the `Link` of a
    /// `Compressor` setting, `plain` an uncompressed one). One worker, no second clipping.
    pub fn new(optimizer: Box<dyn Optimizer>, compressor: Link) -> Self {
        Updater {
            optimizer,
            compressor,
            last_bits: 0,
            last_paper_bits: 0,
            pending_bits: None,
            exchange: None,
            last_traffic: StepTraffic::default(),
            clip_noised: None,
            verify_wire: false,
            epoch: None,
        }
    }

    /// `optimizer` after `compressor`, for parameters shaped and placed as `params` are.
    pub fn with_compressor(
        optimizer: impl Optimizer + 'static,
        compressor: &Compressor,
        params: &[Tensor],
    ) -> Result<Self> {
        let Some(first) = params.first() else {
            return Err(Error::bad_value(
                "params",
                "empty: expected the trainable tensors the updates apply to",
            ));
        };
        let shapes: Vec<Vec<i64>> = params.iter().map(Tensor::size).collect();
        let link = compressor.link(&shapes, first.device())?;
        Ok(Self::new(Box::new(optimizer), link))
    }

    /// Uncompressed (dense fp32 messages, still counted).
    pub fn plain(optimizer: impl Optimizer + 'static) -> Self {
        let link = Link {
            encoder: Box::new(DenseEncoder),
            decoder: Box::new(Unpack::per_parameter()),
        };
        Self::new(Box::new(optimizer), link)
    }

    /// One step of epoch `epoch` (0-based): encodes `grads` and steps the optimiser on what
    /// the decoder reconstructs from the message (with W workers: on the mean of what every
    /// worker's message decodes to, `Exchange::exchange`). Returns the bits sent: 8 x the
    /// length of the message's bytes, made only where they cross a process or with
    /// `verify_wire`, otherwise computed exactly from the payloads' sizes. The epoch is an
    /// argument so that a schedule that depends on it (DGC's warm-up) cannot be left behind.
    /// A message whose size depends on its values (threshold-v, QSGD's Elias gamma) has it
    /// read from the device here (one counted host read); the trainer defers that read.
    pub fn apply(&mut self, epoch: usize, params: &[Tensor], grads: &[Tensor]) -> Result<u64> {
        self.start_epoch(epoch);
        self.step(params, grads)?;
        if let Some(pending) = self.pending_bits.take() {
            let both = crate::host::to_vec_i64(&pending.to_device(tch::Device::Cpu))?;
            self.last_bits += both[0] as u64;
            self.last_paper_bits += both[1] as u64;
        }
        Ok(self.last_bits)
    }

    /// The data-dependent part of the last message's size, [wire bits, paper bits] as an
    /// int64 tensor on the device (`None` when the payloads' shapes fix it), taken: the caller
    /// adds it to `last_bits` and `last_paper_bits` when it reads it.
    pub(crate) fn take_pending_bits(&mut self) -> Option<Tensor> {
        self.pending_bits.take()
    }

    /// Tells the compressor that epoch `epoch` has begun (once per epoch).
    pub(crate) fn start_epoch(&mut self, epoch: usize) {
        if self.epoch != Some(epoch) {
            self.compressor.start_epoch(epoch);
            self.epoch = Some(epoch);
        }
    }

    /// `apply` in the epoch `start_epoch` last set (the trainer's steps), leaving a
    /// data-dependent size on the device (`take_pending_bits`).
    pub(crate) fn step(&mut self, params: &[Tensor], grads: &[Tensor]) -> Result<u64> {
        self.pending_bits = None;
        let clipped;
        let grads = match self.clip_noised {
            Some(radius) => {
                clipped = crate::compress::clip_global_norm(grads, radius);
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
        let (paper_bits, pending_paper) = message.paper_bits_split();
        self.last_paper_bits = paper_bits;
        let update = if self.verify_wire {
            let bytes = message.to_bytes()?;
            self.last_bits = 8 * bytes.len() as u64;
            if let Some(p) = pending_paper {
                self.last_paper_bits += crate::host::i64_scalar(&p) as u64;
            }
            let device = grads.first().map_or(tch::Device::Cpu, Tensor::device);
            let received = Message::from_bytes(&bytes, device)?;
            self.compressor.decoder.decode(&received)
        } else {
            let (bytes, pending_bytes) = crate::compress::wire::encoded_len_split(&message);
            self.last_bits = 8 * bytes as u64;
            if let (Some(wire), Some(paper)) = (pending_bytes, pending_paper) {
                self.pending_bits = Some(Tensor::stack(&[wire * 8, paper], 0));
            }
            self.compressor.decoder.decode(&message)
        };
        let update = self.compressor.decoder.combine(update);
        self.optimizer.step(params, &update);
        Ok(self.last_bits)
    }
}
