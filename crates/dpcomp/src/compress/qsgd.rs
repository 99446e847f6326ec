//! QSGD (Alistarh, Grubic, Li, Tomioka, Vojnovic, "QSGD: Communication-Efficient SGD via
//! Gradient Quantization and Encoding", NeurIPS 2017): each bucket v of `bucket` consecutive
//! elements is sent as its norm ||v||₂, and per element a sign and a level
//! ℓᵢ ∈ {0, …, s}, the stochastic rounding of s |vᵢ| / ||v||₂ (its equation (4)):
//!
//! ℓᵢ = ⌊s |vᵢ| / ||v||₂⌋ + 1 with probability s |vᵢ| / ||v||₂ − ⌊s |vᵢ| / ||v||₂⌋, else ⌊…⌋,
//!
//! and the receiver reads Q(vᵢ) = ||v||₂ sign(vᵢ) ℓᵢ / s, an unbiased estimate (Lemma 3.1:
//! E Q(v) = v). The levels go on the wire at a fixed width (a sign bit and ⌈log2(s + 1)⌉ bits)
//! or in the paper's Elias-gamma code (`elias`, section 3.2), whose length depends on the levels.
//! No error feedback: QSGD is unbiased without it.

use super::codec::Encoder;
use super::message::LevelCode;
use super::message::{Message, Payload};
use tch::{Kind, Tensor};

/// How QSGD writes its levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QsgdEncoding {
    /// A sign bit and ⌈log2(s + 1)⌉ bits per element (`encoding=fixed`).
    #[default]
    Fixed,
    /// The paper's Code_s: Elias gamma of the zero runs and of the nonzero levels
    /// (`encoding=elias`).
    Elias,
}

/// QSGD's settings (`Compressor::Qsgd`; on the command line `--compressor qsgd` and the
/// `--compressor-option` keys `levels`, `bucket`, `encoding`).
///
/// ```
/// use dpcomp::compress::{Compressor, Qsgd};
/// use tch::{Device, Kind, Tensor};
/// let qsgd = Compressor::Qsgd(Qsgd { levels: 4, bucket: 512, ..Default::default() });
/// let mut link = qsgd.link(&[vec![1000]], Device::Cpu)?;
/// let (message, received) = link.round_trip(&[Tensor::randn([1000], (Kind::Float, Device::Cpu))]);
/// // Two norms of 32 bits, then a sign bit and ceil(log2 5) = 3 level bits per element.
/// assert_eq!(message.wire_bits(), 2 * 32 + 1000 * 4);
/// assert_eq!(received[0].size(), [1000]);
/// # Ok::<(), dpcomp::error::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Qsgd {
    /// s >= 1, the levels of each magnitude (s = 1: a sign and one bit).
    pub levels: u32,
    /// Elements per norm (the paper's bucket size d; 512 in its experiments); 0: one norm per
    /// tensor.
    pub bucket: i64,
    /// Fixed-width levels or the paper's Elias-gamma code.
    pub encoding: QsgdEncoding,
}

impl Default for Qsgd {
    /// 16 levels, buckets of 512 (the paper's), fixed-width levels.
    fn default() -> Self {
        Qsgd {
            levels: 16,
            bucket: 512,
            encoding: QsgdEncoding::Fixed,
        }
    }
}

/// Bits of a magnitude 0..=s: ⌈log2(s + 1)⌉.
pub fn level_bits(levels: u32) -> u32 {
    32 - levels.leading_zeros()
}

/// QSGD's worker side: stateless apart from the random draws; `Unpack` receives it.
pub struct QsgdEncoder {
    options: Qsgd,
}

impl QsgdEncoder {
    /// The encoder; the settings are taken as given (`Compressor::Qsgd(..).encoder` checks
    /// them first).
    pub fn new(options: Qsgd) -> Self {
        QsgdEncoder { options }
    }

    fn quantize(&self, g: &Tensor) -> Payload {
        let s = self.options.levels;
        let flat = g.to_kind(Kind::Float).reshape([-1]);
        let numel = flat.numel() as i64;
        let bucket = if self.options.bucket <= 0 || self.options.bucket >= numel {
            numel.max(1)
        } else {
            self.options.bucket
        };
        let buckets = (numel + bucket - 1) / bucket;
        let padded = buckets * bucket;
        let rows = if padded == numel {
            flat.view([buckets, bucket])
        } else {
            flat.constant_pad_nd([0, padded - numel])
                .view([buckets, bucket])
        };
        let norms = rows.norm_scalaropt_dim(2, [1i64].as_slice(), false);
        // A zero bucket sends zero levels (its norm 0 makes every level 0).
        let safe = norms.where_scalarother(&norms.gt(0.0), 1.0);
        let per_norm = (safe.reciprocal() * s as f64).unsqueeze(1);
        let mut levels = rows.abs().g_mul_(&per_norm);
        let _ = levels
            .g_add_(&levels.rand_like())
            .floor_()
            .clamp_max_(s as f64);
        let levels = levels.g_mul_(&rows.sign()).view([-1]).narrow(0, 0, numel);
        let codes = levels.to_kind(if s <= 127 { Kind::Int8 } else { Kind::Int });
        Payload::Quantized {
            codes,
            scales: norms,
            bucket,
            levels: s,
            code: match self.options.encoding {
                QsgdEncoding::Fixed => LevelCode::SignMagnitude {
                    magnitude_bits: level_bits(s),
                },
                QsgdEncoding::Elias => LevelCode::EliasGamma,
            },
            shape: g.size(),
        }
    }
}

impl Encoder for QsgdEncoder {
    fn encode(&mut self, update: &[Tensor]) -> Message {
        tch::no_grad(|| Message::new(update.iter().map(|g| self.quantize(g)).collect()))
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}
