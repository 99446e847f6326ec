//! Natural compression (Horváth, Ho, Horváth, Sahu, Canini, Richtárik, "Natural Compression
//! for Distributed Deep Learning", 2019, its equation (3)): every element t ≠ 0 with
//! 2^a <= |t| < 2^(a+1) is rounded to sign(t) 2^a with probability (2^(a+1) − |t|) / 2^a and to
//! sign(t) 2^(a+1) otherwise, an unbiased estimate (E = t) with variance at most t² / 8. A power
//! of two is an fp32 pattern without mantissa, so each element costs 9 bits: the sign and the
//! 8 exponent bits (zero is the all-zero pattern).
//!
//! Below the smallest normal number 2^-126 the lower neighbour is 0 and the upper 2^-126, the
//! same unbiased rule; above 2^127 the upper neighbour would be infinite and the lower one is
//! kept (no gradient comes near).

use super::codec::Encoder;
use super::message::{Message, Payload};
use tch::{Kind, Tensor};

/// Natural compression's worker side (`Compressor::Natural`, `--compressor natural`):
/// stateless; `Unpack` receives it.
///
/// ```
/// use dpcomp::compress::Compressor;
/// use tch::{Device, Tensor};
/// let mut link = Compressor::Natural.link(&[vec![4]], Device::Cpu)?;
/// let (message, received) = link.round_trip(&[Tensor::from_slice(&[1.0f32, -0.25, 3.0, 0.0])]);
/// assert_eq!(message.wire_bits(), 4 * 9);
/// let back = Vec::<f32>::try_from(&received[0]).unwrap();
/// // Powers of two stay; 3 becomes 2 or 4.
/// assert_eq!((back[0], back[1], back[3]), (1.0, -0.25, 0.0));
/// assert!(back[2] == 2.0 || back[2] == 4.0);
/// # Ok::<(), dpcomp::error::Error>(())
/// ```
pub struct NaturalEncoder;

/// `t` rounded stochastically to a signed power of two (or zero), unbiased, fp32.
pub fn natural_round(t: &Tensor) -> Tensor {
    let x = t.to_kind(Kind::Float);
    let magnitude = x.abs();
    // 2^a: the exponent bits alone (0 for zero and subnormal numbers); 2^(a+1): the next
    // exponent (2^-126 = MIN_NORMAL above 0, +inf above 2^127, never chosen: u inf is not
    // below a finite gap).
    let exponent = magnitude.view_dtype(Kind::Int).bitwise_and(0x7f80_0000i64);
    let high = (&exponent + 0x0080_0000i64).view_dtype(Kind::Float);
    let low = exponent.view_dtype(Kind::Float);
    // Up with probability (|t| - 2^a) / (2^(a+1) - 2^a).
    let up = magnitude
        .rand_like()
        .g_mul_(&(&high - &low))
        .lt_tensor(&(&magnitude - &low));
    high.where_self(&up, &low).copysign_(&x)
}

impl Encoder for NaturalEncoder {
    fn encode(&mut self, update: &[Tensor]) -> Message {
        tch::no_grad(|| {
            Message::new(
                update
                    .iter()
                    .map(|g| Payload::Cast {
                        values: natural_round(g),
                        value_bits: 9,
                    })
                    .collect(),
            )
        })
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}
