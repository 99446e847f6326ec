//! Threshold-v sparsification (GRACE's `Threshold`, Xu et al., "GRACE: A Compressed
//! Communication Framework for Distributed Machine Learning", ICDCS 2021; Strom, "Scalable
//! Distributed DNN Training Using Commodity GPU Cloud Computing", Interspeech 2015): send every
//! element whose magnitude is at least v, in COO (a value and an index each), and, with error
//! feedback (the default), keep the others for the next step.
//!
//! How many elements pass depends on the values, so the message's size does too. The payload is
//! held on the device as the update with zeros where nothing is sent (`Payload::Masked`):
//! choosing the elements never waits for the device, and the count is read with the other
//! steps' sizes at the trainer's logging interval. Bytes (a sparse payload) are made only where
//! the message crosses a process.
//!
//! Under DP the noise σ C / B per coordinate sets the scale: a threshold well above it sends
//! mostly signal and noise peaks; one below it sends nearly everything.

use super::codec::Encoder;
use super::encoding::{truncate_mantissa, IndexBits};
use super::message::{Message, Payload};
use tch::{Device, Kind, Tensor};

/// Threshold-v's settings (`Compressor::Threshold`; `--compressor threshold` and the keys
/// `threshold`, `value_bits`, `index_bits`, `error_feedback`).
///
/// ```
/// use dpcomp::compress::{Compressor, Threshold};
/// use tch::{Device, Tensor};
/// let threshold = Compressor::Threshold(Threshold { threshold: 1.0, ..Default::default() });
/// let mut link = threshold.link(&[vec![6]], Device::Cpu)?;
/// let update = Tensor::from_slice(&[0.5f32, -2.0, 0.0, 1.0, -0.9, 3.0]);
/// let (message, received) = link.round_trip(&[update]);
/// // Three elements pass, each a 32-bit value and a 32-bit index.
/// assert_eq!(message.wire_bits(), 3 * 64);
/// assert_eq!(message.to_bytes()?.len(), dpcomp::compress::wire::encoded_len(&message));
/// assert_eq!(Vec::<f32>::try_from(&received[0]).unwrap(), [0.0, -2.0, 0.0, 1.0, 0.0, 3.0]);
/// # Ok::<(), dpcomp::error::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Threshold {
    /// v > 0: elements with |value| >= v are sent.
    pub threshold: f64,
    /// Bits kept of each sent fp32 value, 9..=32 (as DGC's).
    pub value_bits: u32,
    /// Width of each sent index.
    pub index_bits: IndexBits,
    /// Keep the unsent elements (and the removed low-order bits) for the next step.
    pub error_feedback: bool,
}

impl Default for Threshold {
    /// v = 0.01, fp32 values, 32-bit indices, error feedback.
    fn default() -> Self {
        Threshold {
            threshold: 0.01,
            value_bits: 32,
            index_bits: IndexBits::Fixed32,
            error_feedback: true,
        }
    }
}

/// Threshold-v's worker side; `Unpack` receives it.
pub struct ThresholdEncoder {
    options: Threshold,
    residuals: Option<Vec<Tensor>>,
}

impl ThresholdEncoder {
    /// The encoder for parameters of `shapes` on `device`, its residual at zero with error
    /// feedback; the settings are taken as given (`Compressor::Threshold(..).encoder` checks them).
    pub fn new(shapes: &[Vec<i64>], device: Device, options: Threshold) -> Self {
        let residuals = options.error_feedback.then(|| {
            shapes
                .iter()
                .map(|s| Tensor::zeros(s.as_slice(), (Kind::Float, device)))
                .collect()
        });
        ThresholdEncoder { options, residuals }
    }

    /// The unsent update per parameter (`None` without error feedback).
    pub fn residuals(&self) -> Option<&[Tensor]> {
        self.residuals.as_deref()
    }
}

impl Encoder for ThresholdEncoder {
    fn encode(&mut self, update: &[Tensor]) -> Message {
        let o = self.options.clone();
        let payloads = tch::no_grad(|| {
            update
                .iter()
                .enumerate()
                .map(|(i, g)| {
                    let v = match self.residuals.as_mut() {
                        Some(r) => r[i].g_add_(&g.to_kind(Kind::Float)),
                        None => g.to_kind(Kind::Float),
                    };
                    let keep = v.abs().ge(o.threshold);
                    // Unsent elements are +0.0 (not -0.0), as the receiver of the bytes fills them.
                    let kept = v.where_scalarother(&keep, 0.0);
                    let values = if o.value_bits == 32 {
                        kept
                    } else {
                        truncate_mantissa(&kept, o.value_bits)
                    };
                    if let Some(r) = self.residuals.as_mut() {
                        let _ = r[i].g_sub_(&values);
                    }
                    Payload::Masked {
                        values,
                        value_bits: o.value_bits,
                        index_bits: o.index_bits.width(v.numel() as i64),
                    }
                })
                .collect()
        });
        Message::new(payloads)
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        self.residuals
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, t)| (format!("residual.{i}"), t.shallow_clone()))
            .collect()
    }
}
