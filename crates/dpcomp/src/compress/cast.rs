//! Low-precision casts, the common baselines of gradient compression: every element sent in a
//! narrower format, no error feedback.
//!
//! - **fp16**: IEEE half precision (PyTorch's `fp16_compress_hook`), 16 bits per element;
//!   values beyond ±65504 become infinite and those below 2⁻²⁴ zero, so gradients far from 1
//!   lose precision (DP's noise σ C / B is typically 1e-3 to 1e-1: fine).
//! - **bf16**: bfloat16 (`bf16_compress_hook`), fp32's range with 8 significant bits: the top
//!   16 bits of the fp32 pattern after round-to-nearest-even.
//! - **int8**: the "8-bit" baseline: one fp32 scale per tensor, max |g| / 127, and each
//!   element as round(g / scale) in [-127, 127] (round to nearest; `stochastic=true` rounds
//!   stochastically, which makes it unbiased), 8 bits per element (a sign bit and 7 magnitude
//!   bits) plus the 32-bit scale.

use super::codec::Encoder;
use super::message::LevelCode;
use super::message::{Message, Payload};
use tch::{Kind, Tensor};

/// The target format of `CastEncoder`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cast {
    /// IEEE half precision.
    Fp16,
    /// bfloat16.
    Bf16,
}

/// The fp16 and bf16 casts' worker side (`Compressor::Fp16`, `Compressor::Bf16`;
/// `--compressor fp16|bf16`); `Unpack` receives them.
///
/// ```
/// use dpcomp::compress::Compressor;
/// use tch::{Device, Kind, Tensor};
/// let mut link = Compressor::Bf16.link(&[vec![3]], Device::Cpu)?;
/// let (message, received) = link.round_trip(&[Tensor::from_slice(&[1.0f32, 1.00390625, -3.3])]);
/// assert_eq!(message.wire_bits(), 3 * 16);
/// // 1 + 2^-8 is a tie between two bfloat16 values: rounded to the even one, 1.
/// assert_eq!(Vec::<f32>::try_from(&received[0]).unwrap(), [1.0, 1.0, -3.296875]);
/// # Ok::<(), dpcomp::error::Error>(())
/// ```
pub struct CastEncoder(pub Cast);

impl Encoder for CastEncoder {
    fn encode(&mut self, update: &[Tensor]) -> Message {
        tch::no_grad(|| {
            Message::new(
                update
                    .iter()
                    .map(|g| match self.0 {
                        Cast::Fp16 => Payload::Cast {
                            values: g.to_kind(Kind::Half),
                            value_bits: 16,
                        },
                        Cast::Bf16 => Payload::Cast {
                            values: g.to_kind(Kind::BFloat16).to_kind(Kind::Float),
                            value_bits: 16,
                        },
                    })
                    .collect(),
            )
        })
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}

/// int8's settings (`Compressor::Int8`; `--compressor int8` and the key `stochastic`).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Int8 {
    /// Round g / scale stochastically (unbiased) instead of to the nearest integer.
    pub stochastic: bool,
}

/// int8's worker side; `Unpack` receives it.
///
/// ```
/// use dpcomp::compress::{Compressor, Int8};
/// use tch::{Device, Tensor};
/// let mut link = Compressor::Int8(Int8::default()).link(&[vec![4]], Device::Cpu)?;
/// let (message, received) = link.round_trip(&[Tensor::from_slice(&[1.27f32, -0.5, 0.0, 0.004])]);
/// assert_eq!(message.wire_bits(), 32 + 4 * 8);
/// // scale 0.01: codes 127, -50, 0, 0.
/// let back = Vec::<f32>::try_from(&received[0]).unwrap();
/// assert!((back[0] - 1.27).abs() < 1e-6 && (back[1] + 0.5).abs() < 1e-6 && back[3] == 0.0);
/// # Ok::<(), dpcomp::error::Error>(())
/// ```
pub struct Int8Encoder(pub Int8);

impl Encoder for Int8Encoder {
    fn encode(&mut self, update: &[Tensor]) -> Message {
        tch::no_grad(|| {
            Message::new(
                update
                    .iter()
                    .map(|g| {
                        let flat = g.to_kind(Kind::Float).reshape([-1]);
                        let scale = flat.abs().max().reshape([1]) / 127.0;
                        let safe = scale.where_scalarother(&scale.gt(0.0), 1.0);
                        let mut x = &flat / &safe;
                        if self.0.stochastic {
                            let _ = x.g_add_(&x.rand_like()).floor_();
                        } else {
                            let _ = x.round_();
                        }
                        let _ = x.clamp_(-127.0, 127.0);
                        Payload::Quantized {
                            codes: x.to_kind(Kind::Int8),
                            scales: scale,
                            bucket: flat.numel().max(1) as i64,
                            levels: 1,
                            code: LevelCode::SignMagnitude { magnitude_bits: 7 },
                            shape: g.size(),
                        }
                    })
                    .collect(),
            )
        })
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}
