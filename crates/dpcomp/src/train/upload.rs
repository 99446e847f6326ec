//! What a run will upload, computed without training: the compressor of the run's configuration
//! encodes one random update of the model's shapes for every epoch whose rate can differ (DGC's
//! warm-up), and the message sizes are multiplied by the steps per epoch (ceil(n / B), the
//! number `Trainer::steps_per_epoch` runs and Opacus's 1/q). Every built-in message has a size
//! that depends only on the shapes and the rate, never on the values, so this is exact; a
//! test checks it against a trained run's `summary.json`.

use crate::compress::message::paper_gib;
use crate::config::TrainConfig;
use crate::error::Result;
use tch::{Device, Kind, Tensor};

/// A run's whole upload in both units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Upload {
    /// Steps of the whole run: epochs x ceil(n / B).
    pub steps: u64,
    /// Exact wire bits.
    pub wire_bits: u64,
    /// 64 bits per transmitted element, plus flag bits (`compress::Message::paper_bits`).
    pub paper_bits: u64,
}

impl Upload {
    /// The exact wire bits in 10^9 bits: what `summary.json`'s `upstream_gigabits` reports.
    pub fn gigabits(&self) -> f64 {
        self.wire_bits as f64 / 1e9
    }

    /// The paper's "Gb": paper bits / 8 / 2^30.
    pub fn paper_gib(&self) -> f64 {
        paper_gib(self.paper_bits)
    }
}

/// The upload of `config` trained on `train_examples` examples with parameters of `shapes`.
pub fn estimate(config: &TrainConfig, train_examples: i64, shapes: &[Vec<i64>]) -> Result<Upload> {
    let compressor = config.compressor()?;
    let mut encoder = compressor.encoder(shapes, Device::Cpu)?;
    let steps_per_epoch = crate::privacy::builder::steps_per_epoch_of_batches(
        train_examples.max(0) as u64,
        config.optimizer.batch_size as u64,
    );
    // Epochs after the warm-up all send the same sizes: encode those once.
    let distinct = match &compressor {
        crate::compress::Compressor::Dgc(dgc) => dgc.warmup_epochs + 1,
        _ => 1,
    };
    let mut total = Upload {
        steps: 0,
        wire_bits: 0,
        paper_bits: 0,
    };
    let mut per_step = (0u64, 0u64);
    for epoch in 0..config.epochs {
        if epoch < distinct {
            encoder.start_epoch(epoch);
            let update: Vec<Tensor> = shapes
                .iter()
                .map(|s| Tensor::randn(s.as_slice(), (Kind::Float, Device::Cpu)))
                .collect();
            let message = encoder.encode(&update);
            // The length of the bytes a run measures (`compress::wire`).
            let bytes = crate::compress::wire::encoded_len(&message) as u64;
            per_step = (8 * bytes, message.paper_bits());
        }
        total.steps += steps_per_epoch;
        total.wire_bits += steps_per_epoch * per_step.0;
        total.paper_bits += steps_per_epoch * per_step.1;
    }
    Ok(total)
}
