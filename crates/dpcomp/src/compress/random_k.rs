//! Random-k sparsification: each step every parameter tensor sends k = ⌊numel / rate⌋ of its
//! elements (at least one), chosen uniformly at random from a seed every participant shares, so
//! that no index crosses the wire: a message is k fp32 values per tensor (GRACE's `RandomK`,
//! Xu et al., "GRACE: A Compressed Communication Framework for Distributed Machine Learning",
//! ICDCS 2021; Stich, Cordonnier, Jaggi, "Sparsified SGD with Memory", NeurIPS 2018, for the
//! error feedback).
//!
//! Two ways to use it: with error feedback (the default; the unsent elements wait in a residual,
//! as in "Sparsified SGD with Memory") or unbiased (`unbiased=true`: the receiver scales the
//! values by numel / k, so the expected received update is the update, and nothing is kept). The two do not combine:
//! an unbiased estimate has no error to feed back.
//!
//! Every worker draws the same coordinates (the seed and the step), so the workers' messages
//! add up coordinate by coordinate: W workers exchange them by one all-reduce, and the update
//! is a function of the sum of their noised gradients (the residuals, too, evolve by their sum).

use super::codec::{mean_of_dense_messages, take_state, AllReduce, Decoder, Encoder};
use super::message::{Message, Payload};
use super::sketched::{counted_state, load_counted_state};
use crate::error::Result;
use crate::host;
use rand::SeedableRng;
use std::collections::HashMap;
use tch::{Device, Kind, Tensor};

/// Random-k's settings (`Compressor::RandomK`; `--compressor randomk --rate R` and the keys
/// `seed`, `unbiased`, `error_feedback`).
///
/// ```
/// use dpcomp::compress::{Compressor, RandomK};
/// use tch::{Device, Kind, Tensor};
/// let randomk = Compressor::RandomK(RandomK { rate: 10.0, ..Default::default() });
/// let mut link = randomk.link(&[vec![100, 10]], Device::Cpu)?;
/// let (message, received) = link.round_trip(&[Tensor::ones([100, 10], (Kind::Float, Device::Cpu))]);
/// // 100 values of 32 bits, no indices: the receiver draws the same coordinates.
/// assert_eq!(message.wire_bits(), 100 * 32);
/// assert_eq!(received[0].sum(Kind::Float).double_value(&[]), 100.0);
/// # Ok::<(), dpcomp::error::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default = "RandomK::configured", deny_unknown_fields)]
pub struct RandomK {
    /// numel / k >= 1 per tensor (dense fp32 bits over message bits).
    pub rate: f64,
    /// The seed every participant shares.
    pub seed: u64,
    /// Scale the received values by numel / k (an unbiased estimate; needs `error_feedback`
    /// off).
    pub unbiased: bool,
    /// Keep the unsent elements for the next step.
    pub error_feedback: bool,
}

impl RandomK {
    /// The defaults of a `[compression]` table that names no `rate`: rate 1 (every element),
    /// as for the other compressors with a rate, the rest `Default`'s.
    pub(crate) fn configured() -> Self {
        RandomK {
            rate: 1.0,
            ..Default::default()
        }
    }
}

impl Default for RandomK {
    /// Rate 16, seed 0, error feedback, not rescaled.
    fn default() -> Self {
        RandomK {
            rate: 16.0,
            seed: 0,
            unbiased: false,
            error_feedback: true,
        }
    }
}

/// k for a tensor of `numel` elements at `rate`: ⌊numel / rate⌋, at least 1.
pub fn random_k(numel: i64, rate: f64) -> i64 {
    ((numel as f64 / rate).floor() as i64).clamp(1, numel.max(1))
}

/// The coordinates of tensor `layer` at `step`: k distinct flat positions, sorted, drawn on the
/// host from the shared seed (Floyd's algorithm for small k, `rand::seq::index::sample`) and
/// sent to `device` without waiting for it.
fn coordinates(seed: u64, step: usize, layer: usize, numel: i64, k: i64, device: Device) -> Tensor {
    let mixed = seed
        ^ (step as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (layer as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    let mut rng = rand::rngs::StdRng::seed_from_u64(mixed);
    let mut positions: Vec<i64> = rand::seq::index::sample(&mut rng, numel as usize, k as usize)
        .into_iter()
        .map(|i| i as i64)
        .collect();
    positions.sort_unstable();
    host::upload(&Tensor::from_slice(&positions), device)
}

/// Random-k's worker side.
pub struct RandomKEncoder {
    options: RandomK,
    residuals: Option<Vec<Tensor>>,
    step: usize,
    device: Device,
}

impl RandomKEncoder {
    /// The encoder for parameters of `shapes` on `device`, its residual at zero (with error
    /// feedback); the settings are taken as given (`Compressor::RandomK(..).encoder` checks them).
    pub fn new(shapes: &[Vec<i64>], device: Device, options: RandomK) -> Self {
        let residuals = options.error_feedback.then(|| {
            shapes
                .iter()
                .map(|s| Tensor::zeros(s.as_slice(), (Kind::Float, device)))
                .collect()
        });
        RandomKEncoder {
            options,
            residuals,
            step: 0,
            device,
        }
    }

    /// The unsent elements per parameter (`None` without error feedback).
    pub fn residuals(&self) -> Option<&[Tensor]> {
        self.residuals.as_deref()
    }
}

impl Encoder for RandomKEncoder {
    fn set_step(&mut self, step: usize) {
        self.step = step;
    }

    fn encode(&mut self, update: &[Tensor]) -> Message {
        let o = &self.options;
        let payloads = tch::no_grad(|| {
            update
                .iter()
                .enumerate()
                .map(|(i, g)| {
                    let numel = g.numel() as i64;
                    let k = random_k(numel, o.rate);
                    let idx = coordinates(o.seed, self.step, i, numel, k, self.device);
                    let values = match self.residuals.as_mut() {
                        None => g.to_kind(Kind::Float).reshape([-1]).index_select(0, &idx),
                        Some(residuals) => {
                            let v = residuals[i].g_add_(&g.to_kind(Kind::Float)).view([-1]);
                            let values = v.index_select(0, &idx);
                            let _ = v.shallow_clone().index_fill_(0, &idx, 0.0);
                            values
                        }
                    };
                    Payload::Dense {
                        values,
                        value_bits: 32,
                    }
                })
                .collect()
        });
        self.step += 1;
        Message::new(payloads)
    }

    /// The workers' values summed by one all-reduce (the same coordinates on every worker) and
    /// averaged: the message of the mean.
    fn encode_all_reduced(
        &mut self,
        update: &[Tensor],
        workers: usize,
        reduce: &mut AllReduce,
    ) -> Option<Result<Message>> {
        let message = self.encode(update);
        Some(mean_of_dense_messages(message, workers, reduce))
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        let mut state = counted_state(self.step, "unused", None);
        if let Some(residuals) = &self.residuals {
            state.extend(
                residuals
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (format!("residual.{i}"), t.shallow_clone())),
            );
        }
        state
    }

    fn load_state(&mut self, mut state: HashMap<String, Tensor>) -> Result<()> {
        if let Some(residuals) = self.residuals.as_mut() {
            for (i, live) in residuals.iter_mut().enumerate() {
                let saved = take_state(&mut state, &format!("residual.{i}"), &live.size())?;
                tch::no_grad(|| live.copy_(&saved));
            }
        }
        self.step = load_counted_state(state, "unused", None)?;
        Ok(())
    }
}

/// Random-k's receiver: draws the same coordinates and scatters the values there (times
/// numel / k when unbiased).
pub struct RandomKDecoder {
    options: RandomK,
    shapes: Vec<Vec<i64>>,
    step: usize,
    device: Device,
}

impl RandomKDecoder {
    /// The receiver of `RandomKEncoder::new(shapes, device, options)`'s messages.
    pub fn new(shapes: &[Vec<i64>], device: Device, options: RandomK) -> Self {
        RandomKDecoder {
            options,
            shapes: shapes.to_vec(),
            step: 0,
            device,
        }
    }
}

impl Decoder for RandomKDecoder {
    fn set_step(&mut self, step: usize) {
        self.step = step;
    }

    fn decode(&mut self, message: &Message) -> Vec<Tensor> {
        let o = &self.options;
        let out = self
            .shapes
            .iter()
            .zip(&message.payloads)
            .enumerate()
            .map(|(i, (shape, payload))| {
                let numel: i64 = shape.iter().product();
                let k = random_k(numel, o.rate);
                let idx = coordinates(o.seed, self.step, i, numel, k, self.device);
                let values = payload.to_dense().to_kind(Kind::Float);
                let values = if o.unbiased {
                    values * (numel as f64 / k as f64)
                } else {
                    values
                };
                Tensor::zeros([numel], (Kind::Float, values.device()))
                    .index_copy(0, &idx, &values)
                    .view(shape.as_slice())
            })
            .collect();
        self.step += 1;
        out
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        counted_state(self.step, "unused", None)
    }

    fn load_state(&mut self, state: HashMap<String, Tensor>) -> Result<()> {
        self.step = load_counted_state(state, "unused", None)?;
        Ok(())
    }
}
