//! Sign compression, one bit per element.
//!
//! - **signSGD with majority vote** (Bernstein, Zhao, Azizzadenesheli, Anandkumar, "signSGD
//!   with Majority Vote is Communication Efficient and Fault Tolerant", ICLR 2019, Algorithm 1):
//!   every worker sends sign(g); the server sends back sign(Σ_w sign(g_w)), the majority's
//!   sign, and the step is lr × that sign (a tie, possible with an even number of workers, gives
//!   0). The message carries no scale: the learning rate is the step size, so signSGD runs at a
//!   learning rate of its own (the paper's are around 1e-4 to 1e-3 for Adam-like step sizes).
//!   Biased; no error feedback.
//! - **EF-signSGD** (Karimireddy, Rebjock, Stich, Jaggi, "Error Feedback Fixes SignSGD and
//!   other Gradient Compression Schemes", ICML 2019, Algorithm 1): p = g + e,
//!   Δ = (||p||₁ / d) sign(p) per tensor, e ← p − Δ: a scaled sign (32 bits of scale plus one
//!   bit per element) whose error is carried to the next step. The paper folds the learning rate
//!   into p (p = γ g + e); here the optimiser applies it after decoding, which is the same
//!   algorithm at a constant learning rate (its error is e / γ) and differs only in how the
//!   error carried across a learning-rate change is weighted.
//!
//! sign(0) is sent as +1 (one bit has no zero).

use super::codec::{Decoder, Encoder};
use super::message::LevelCode;
use super::message::{Message, Payload};
use super::unpack::Unpack;
use tch::{Device, Kind, Tensor};

/// ±1 codes of `p` (+1 where p >= 0), int8, built in place.
fn signs(p: &Tensor) -> Tensor {
    p.ge(0.0)
        .to_kind(Kind::Int8)
        .g_mul_scalar_(2)
        .g_sub_scalar_(1)
}

/// signSGD's worker side (`Compressor::SignSgd`, `--compressor signsgd`): stateless.
///
/// ```
/// use dpcomp::compress::Compressor;
/// use tch::{Device, Kind, Tensor};
/// let mut link = Compressor::SignSgd.link(&[vec![8]], Device::Cpu)?;
/// let update = Tensor::from_slice(&[0.5f32, -2.0, 0.0, 3.0, -0.1, 1.0, -1.0, 7.0]);
/// let (message, received) = link.round_trip(&[update]);
/// assert_eq!(message.wire_bits(), 8);
/// assert_eq!(Vec::<f32>::try_from(&received[0]).unwrap(), [1.0, -1.0, 1.0, 1.0, -1.0, 1.0, -1.0, 1.0]);
/// # Ok::<(), dpcomp::error::Error>(())
/// ```
pub struct SignEncoder;

impl Encoder for SignEncoder {
    fn encode(&mut self, update: &[Tensor]) -> Message {
        tch::no_grad(|| {
            Message::new(
                update
                    .iter()
                    .map(|g| Payload::Quantized {
                        codes: signs(&g.reshape([-1])),
                        scales: Tensor::zeros([0], (Kind::Float, g.device())),
                        bucket: g.numel().max(1) as i64,
                        levels: 1,
                        code: LevelCode::Sign,
                        shape: g.size(),
                    })
                    .collect(),
            )
        })
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}

/// signSGD's receiver: each message decodes to its signs (`Unpack`); the mean of the W
/// workers' signs becomes the majority's sign (`Decoder::combine`).
pub struct MajorityVote;

impl Decoder for MajorityVote {
    fn decode(&mut self, message: &Message) -> Vec<Tensor> {
        Unpack::per_parameter().decode(message)
    }

    /// sign(Σ_w sign(g_w)), 0 on a tie (from the mean, which has the sum's sign).
    fn combine(&self, mean: Vec<Tensor>) -> Vec<Tensor> {
        mean.iter().map(Tensor::sign).collect()
    }
}

/// EF-signSGD's worker side (`Compressor::EfSignSgd`, `--compressor ef-signsgd`): its state is
/// the error e per parameter; `Unpack` receives it.
///
/// ```
/// use dpcomp::compress::{EfSignEncoder, Encoder};
/// use tch::{Device, Tensor};
/// let mut encoder = EfSignEncoder::new(&[vec![4]], Device::Cpu);
/// let update = Tensor::from_slice(&[1.0f32, -3.0, 0.5, 2.5]);
/// let sent = encoder.encode(&[update.shallow_clone()]).payloads[0].to_dense();
/// // Δ = mean |p| x sign(p) = 1.75 x (1, -1, 1, 1); the error keeps p - Δ.
/// assert_eq!(Vec::<f32>::try_from(&sent).unwrap(), [1.75, -1.75, 1.75, 1.75]);
/// assert_eq!(Vec::<f32>::try_from(&encoder.errors()[0]).unwrap(), [-0.75, -1.25, -1.25, 0.75]);
/// ```
pub struct EfSignEncoder {
    errors: Vec<Tensor>,
}

impl EfSignEncoder {
    /// The encoder, its error at zero for parameters of `shapes` on `device`.
    pub fn new(shapes: &[Vec<i64>], device: Device) -> Self {
        EfSignEncoder {
            errors: shapes
                .iter()
                .map(|s| Tensor::zeros(s.as_slice(), (Kind::Float, device)))
                .collect(),
        }
    }

    /// The error e carried to the next step, one tensor per parameter.
    pub fn errors(&self) -> &[Tensor] {
        &self.errors
    }
}

impl Encoder for EfSignEncoder {
    fn encode(&mut self, update: &[Tensor]) -> Message {
        tch::no_grad(|| {
            let payloads = update
                .iter()
                .zip(&mut self.errors)
                .map(|(g, e)| {
                    let p = e.g_add_(&g.to_kind(Kind::Float));
                    let flat = p.reshape([-1]);
                    let scale = flat.abs().mean(Kind::Float).reshape([1]);
                    let codes = signs(&flat);
                    let sent = codes.to_kind(Kind::Float).g_mul_(&scale);
                    let _ = flat.shallow_clone().g_sub_(&sent);
                    Payload::Quantized {
                        codes,
                        scales: scale,
                        bucket: flat.numel().max(1) as i64,
                        levels: 1,
                        code: LevelCode::Sign,
                        shape: g.size(),
                    }
                })
                .collect();
            Message::new(payloads)
        })
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        self.errors
            .iter()
            .enumerate()
            .map(|(i, t)| (format!("error.{i}"), t.shallow_clone()))
            .collect()
    }
}
