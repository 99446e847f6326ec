//! TernGrad (Wen, Xu, Yan, Wu, Wang, Chen, Li, "TernGrad: Ternary Gradients to Reduce
//! Communication in Distributed Deep Learning", NeurIPS 2017): each layer's gradient g is sent
//! as its scalar sₜ = max |gᵢ| and a ternary vector, gᵢ ≈ sₜ sign(gᵢ) bᵢ with bᵢ ~ Bernoulli(|gᵢ| /
//! sₜ) (its equation (4)), an unbiased estimate (E = g, its Theorem 1's premise). Two bits per
//! element on the wire (a sign bit and one magnitude bit) plus the 32-bit scalar. The paper's
//! optional gradient clipping (to 2.5 standard deviations) is not applied: under DP the
//! gradients are already clipped per example.

use super::codec::Encoder;
use super::message::LevelCode;
use super::message::{Message, Payload};
use tch::{Kind, Tensor};

/// TernGrad's worker side (`Compressor::TernGrad`, `--compressor terngrad`): no settings and
/// no state; `Unpack` receives it.
///
/// ```
/// use dpcomp::compress::Compressor;
/// use tch::{Device, Kind, Tensor};
/// let mut link = Compressor::TernGrad.link(&[vec![100, 10]], Device::Cpu)?;
/// let update = Tensor::randn([100, 10], (Kind::Float, Device::Cpu));
/// let (message, received) = link.round_trip(&[update.shallow_clone()]);
/// assert_eq!(message.wire_bits(), 32 + 2 * 1000);
/// // Every element is 0 or ± the layer's largest magnitude.
/// let max = update.abs().max();
/// let ternary = received[0].abs().eq_tensor(&max).logical_or(&received[0].eq(0.0));
/// assert!(bool::try_from(ternary.all()).unwrap());
/// # Ok::<(), dpcomp::error::Error>(())
/// ```
pub struct TernGradEncoder;

impl Encoder for TernGradEncoder {
    fn encode(&mut self, update: &[Tensor]) -> Message {
        tch::no_grad(|| {
            Message::new(
                update
                    .iter()
                    .map(|g| {
                        let flat = g.to_kind(Kind::Float).reshape([-1]);
                        let magnitude = flat.abs();
                        let max = magnitude.max().reshape([1]);
                        // b ~ Bernoulli(|g| / max): u max < |g| (a zero max keeps nothing).
                        let keep = flat.rand_like().g_mul_(&max).lt_tensor(&magnitude);
                        Payload::Quantized {
                            codes: flat.sign().to_kind(Kind::Int8).g_mul_(&keep),
                            scales: max,
                            bucket: flat.numel().max(1) as i64,
                            levels: 1,
                            code: LevelCode::SignMagnitude { magnitude_bits: 1 },
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
