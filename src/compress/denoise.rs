//! Denoise, the paper's algorithm (`../shared/papers/dp-and-gradient-compression.txt`, "Denoise";
//! its Algorithm 1 box is missing from the text, so this follows the prose, choices marked):
//!
//! - sender and receiver each keep a velocity, an exponential average of past mean gradients:
//!   v_t = β v_{t-1} + (1 - β) g_t (`beta`; the coefficient is not in the text);
//! - acceleration = the change in velocity, a_t = v_t - v_{t-1};
//! - both candidates, velocity and acceleration, each plus the residual r, are top-k sparsified at
//!   the budget `rate` gives (as DGC's), and the one with the smaller sparsification error
//!   ||x - topk(x)|| is sent, with a 1-bit flag (ties: velocity);
//! - the residual is the chosen candidate's unsent part, decayed: r <- `decay` (x - topk(x))
//!   (the factor is not in the text);
//! - the receiver replaces its velocity with a sent velocity, or adds a sent acceleration, and
//!   uses its velocity as the update. The sender mirrors the receiver's velocity, so
//!   `receiver_velocity() == sender_mirror()` after every step (tested).
//!
//! `scope = layer` chooses per parameter (one flag each); `scope = model` runs one top-k over all
//! parameters concatenated (one flag). `clip` (off by default) bounds the global norm of the
//! incoming gradient: our reading of the "second clipping" the paper's results mention.

use super::encoding::{sparse_budget, sparse_is_cheaper, truncate_mantissa, IndexBits};
use super::topk::{largest, TopK};
use super::{Compressor, Message, Payload};
use tch::{Device, Kind, Tensor};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Layer,
    Model,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DenoiseOptions {
    pub rate: f64,
    pub beta: f64,
    pub decay: f64,
    pub scope: Scope,
    pub value_bits: u32,
    pub index_bits: IndexBits,
    pub topk: TopK,
    pub clip: f64,
}

/// Per segment (a parameter, or the whole model): flat [numel] tensors.
struct Segment {
    velocity: Tensor,
    residual: Tensor,
    /// The sender's copy of the receiver's velocity.
    mirror: Tensor,
    /// The receiver's velocity.
    received: Tensor,
}

pub struct Denoise {
    options: DenoiseOptions,
    shapes: Vec<Vec<i64>>,
    segments: Vec<Segment>,
}

impl Denoise {
    pub fn new(shapes: &[Vec<i64>], device: Device, options: DenoiseOptions) -> Self {
        let sizes: Vec<i64> = match options.scope {
            Scope::Layer => shapes.iter().map(|s| s.iter().product()).collect(),
            Scope::Model => vec![shapes.iter().map(|s| s.iter().product::<i64>()).sum()],
        };
        let zeros = |n: i64| Tensor::zeros([n], (Kind::Float, device));
        Denoise {
            segments: sizes
                .into_iter()
                .map(|n| Segment {
                    velocity: zeros(n),
                    residual: zeros(n),
                    mirror: zeros(n),
                    received: zeros(n),
                })
                .collect(),
            shapes: shapes.to_vec(),
            options,
        }
    }

    /// The receiver's velocities (flat, one per segment).
    pub fn receiver_velocity(&self) -> Vec<Tensor> {
        self.segments
            .iter()
            .map(|s| s.received.shallow_clone())
            .collect()
    }

    /// The sender's record of the receiver's velocities.
    pub fn sender_mirror(&self) -> Vec<Tensor> {
        self.segments
            .iter()
            .map(|s| s.mirror.shallow_clone())
            .collect()
    }

    /// The incoming update as flat segments (clipped when `clip` is set).
    fn segments_of(&self, update: &[Tensor]) -> Vec<Tensor> {
        let flat: Vec<Tensor> = update
            .iter()
            .map(|t| t.to_kind(Kind::Float).reshape([-1]))
            .collect();
        let flat = if self.options.clip.is_finite() {
            let squares: Vec<Tensor> = flat.iter().map(|t| t.square().sum(Kind::Float)).collect();
            let norm = Tensor::stack(&squares, 0).sum(Kind::Float).sqrt();
            let factor = (self.options.clip / (norm + 1e-6)).clamp_max(1.0);
            flat.iter().map(|t| t * &factor).collect()
        } else {
            flat
        };
        match self.options.scope {
            Scope::Layer => flat,
            Scope::Model => vec![Tensor::cat(&flat, 0)],
        }
    }

    /// Sparsifies `x` at the budget: (payload, x - sent).
    fn sparsify(&self, x: &Tensor) -> (Payload, Tensor) {
        let o = &self.options;
        let n = x.numel() as i64;
        let index_bits = o.index_bits.width(n);
        let k = sparse_budget(n, o.rate, o.value_bits, index_bits);
        if o.rate <= 1.0 || !sparse_is_cheaper(k, n, o.value_bits, index_bits) {
            let values = truncate_mantissa(x, o.value_bits);
            let error = x - &values;
            return (
                Payload::Dense {
                    values,
                    value_bits: o.value_bits,
                },
                error,
            );
        }
        let (indices, kept) = largest(x, k, o.topk);
        let values = truncate_mantissa(&kept, o.value_bits);
        let error = x.index_add(0, &indices, &values.neg());
        (
            Payload::Sparse {
                indices,
                values,
                shape: vec![n],
                value_bits: o.value_bits,
                index_bits,
            },
            error,
        )
    }
}

/// One of two payloads of the same layout, chosen by a 0-d bool tensor on the device.
fn choose(flag: &Tensor, a: Payload, b: Payload) -> Payload {
    match (a, b) {
        (
            Payload::Dense {
                values: va,
                value_bits,
            },
            Payload::Dense { values: vb, .. },
        ) => Payload::Dense {
            values: va.where_self(flag, &vb),
            value_bits,
        },
        (
            Payload::Sparse {
                indices: ia,
                values: va,
                shape,
                value_bits,
                index_bits,
            },
            Payload::Sparse {
                indices: ib,
                values: vb,
                ..
            },
        ) => Payload::Sparse {
            indices: ia.where_self(flag, &ib),
            values: va.where_self(flag, &vb),
            shape,
            value_bits,
            index_bits,
        },
        _ => unreachable!("both candidates use the same budget and hence the same encoding"),
    }
}

/// The receiver's velocity after a message: replaced by a velocity (flag true), or plus an
/// acceleration (flag false).
fn receive(velocity: &Tensor, flag: &Tensor, sent: &Tensor) -> Tensor {
    sent.where_self(flag, &(velocity + sent))
}

impl Compressor for Denoise {
    fn compress(&mut self, update: &[Tensor]) -> Message {
        tch::no_grad(|| {
            let incoming = self.segments_of(update);
            let (beta, decay) = (self.options.beta, self.options.decay);
            let mut payloads = Vec::new();
            let mut flags = Vec::new();
            for (i, g) in incoming.iter().enumerate() {
                let seg = &self.segments[i];
                let velocity = &seg.velocity * beta + g * (1.0 - beta);
                let acceleration = &velocity - &seg.velocity;
                let (as_velocity, error_v) = self.sparsify(&(&velocity + &seg.residual));
                let (as_acceleration, error_a) = self.sparsify(&(&acceleration + &seg.residual));
                let flag = error_v
                    .square()
                    .sum(Kind::Float)
                    .le_tensor(&error_a.square().sum(Kind::Float));
                let residual = error_v.where_self(&flag, &error_a) * decay;
                let payload = choose(&flag, as_velocity, as_acceleration);
                let seg = &mut self.segments[i];
                seg.mirror = receive(&seg.mirror, &flag, &payload.to_dense());
                seg.velocity = velocity;
                seg.residual = residual;
                payloads.push(payload);
                flags.push(flag);
            }
            Message { payloads, flags }
        })
    }

    fn decompress(&mut self, message: &Message) -> Vec<Tensor> {
        tch::no_grad(|| {
            for ((seg, payload), flag) in self
                .segments
                .iter_mut()
                .zip(&message.payloads)
                .zip(&message.flags)
            {
                seg.received = receive(&seg.received, flag, &payload.to_dense());
            }
            let flat: Vec<Tensor> = match self.options.scope {
                Scope::Layer => self
                    .segments
                    .iter()
                    .map(|s| s.received.shallow_clone())
                    .collect(),
                Scope::Model => {
                    let sizes: Vec<i64> = self.shapes.iter().map(|s| s.iter().product()).collect();
                    self.segments[0].received.split_with_sizes(&sizes, 0)
                }
            };
            flat.iter()
                .zip(&self.shapes)
                .map(|(t, shape)| t.view(shape.as_slice()))
                .collect()
        })
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        let mut state = Vec::new();
        for (i, s) in self.segments.iter().enumerate() {
            state.push((format!("velocity.{i}"), s.velocity.shallow_clone()));
            state.push((format!("residual.{i}"), s.residual.shallow_clone()));
            state.push((format!("mirror.{i}"), s.mirror.shallow_clone()));
            state.push((format!("received.{i}"), s.received.shallow_clone()));
        }
        state
    }
}
