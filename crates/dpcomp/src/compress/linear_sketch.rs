//! What a client sends (Kerkouche, Ács, Castelluccia, Genevès, "Compression Boosts Differentially Private Federated Learning", 2021, the schemes of its
//! tables): FL-STD the whole update; FL-RND m = r n coordinates chosen by a seed shared by all
//! participants and drawn anew each round; FL-FREQ the first m/P DCT coefficients of each of P
//! contiguous chunks (low frequencies, no shuffle), inverted by zero filling; FL-CS the same
//! coefficients of the shuffled update (`sketch::ChunkedDct`), reconstructed on the server by
//! BPDN (`owlqn`). Every encoding is linear, so the server may sum messages before decoding.

use super::chunked_dct::{ChunkedDct, DctRows};
use crate::error::{Error, Result};
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use tch::{Device, Tensor};

/// What a client sends in the federated paper (`--scheme std|rnd|freq|cs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Scheme {
    /// FL-STD: the whole update, uncompressed.
    Std,
    /// FL-RND: m = r n coordinates from the shared seed, drawn anew each round.
    Rnd,
    /// FL-FREQ: the first m/P DCT coefficients of P contiguous chunks, inverted by zero filling.
    Freq,
    /// FL-CS: the same coefficients of the shuffled update, reconstructed by BPDN (`owlqn`).
    Cs,
}

impl Scheme {
    /// The federated paper's name of the scheme: "FL-STD", "FL-RND", "FL-FREQ" or "FL-CS".
    pub fn name(&self) -> &'static str {
        match self {
            Scheme::Std => "FL-STD",
            Scheme::Rnd => "FL-RND",
            Scheme::Freq => "FL-FREQ",
            Scheme::Cs => "FL-CS",
        }
    }
}

/// The default chunk length of FL-FREQ and FL-CS: P = ⌈n / 1024⌉.
pub const DEFAULT_CHUNK_LENGTH: i64 = 1024;

/// A scheme's encoding of updates of one length n: its message length m and, per round, the
/// linear map C (`for_round`). Every participant builds the same `Codec` from the shared seed.
///
/// ```
/// use dpcomp::compress::chunked_dct::DctRows;
/// use dpcomp::compress::linear_sketch::{Codec, Scheme};
/// use tch::{Device, Kind, Tensor};
/// let codec = Codec::new(Scheme::Rnd, 1000, 0.1, None, DctRows::First, 5, Device::Cpu)?;
/// assert_eq!(codec.message_length(), 100);
/// let round = codec.for_round(3, Device::Cpu);
/// let update = Tensor::randn([1000], (Kind::Float, Device::Cpu));
/// let message = round.encode(&update);
/// assert_eq!(message.size(), [100]);
/// // FL-RND's decoding puts the 100 sent coordinates back and zeros the rest.
/// let back = round.zero_fill(&message);
/// assert_eq!(back.ne(0.0).sum(Kind::Int64).int64_value(&[]), 100);
/// # Ok::<(), dpcomp::error::Error>(())
/// ```
pub struct Codec {
    /// Which of the federated paper's schemes.
    pub scheme: Scheme,
    /// n.
    pub length: i64,
    /// The DCT sketch of FL-FREQ and FL-CS.
    pub sketch: Option<ChunkedDct>,
    /// m of FL-RND.
    rnd_length: i64,
    seed: u64,
}

impl Codec {
    /// `ratio` is r = m / n (ignored by FL-STD); `chunks` P (default ⌈n / 1024⌉); `seed` the
    /// seed every participant shares (shuffle, random rows, FL-RND's subsets).
    pub fn new(
        scheme: Scheme,
        length: i64,
        ratio: f64,
        chunks: Option<i64>,
        rows: DctRows,
        seed: u64,
        device: Device,
    ) -> Result<Codec> {
        if !(ratio > 0.0 && ratio <= 1.0) {
            return Err(Error::bad_value(
                "ratio",
                format!("{ratio}: expected 0 < r <= 1"),
            ));
        }
        let chunks = chunks.unwrap_or((length + DEFAULT_CHUNK_LENGTH - 1) / DEFAULT_CHUNK_LENGTH);
        let sketch = match scheme {
            Scheme::Freq => Some(ChunkedDct::new(length, ratio, chunks, None, rows, device)?),
            Scheme::Cs => Some(ChunkedDct::new(
                length,
                ratio,
                chunks,
                Some(seed),
                rows,
                device,
            )?),
            Scheme::Std | Scheme::Rnd => None,
        };
        let rnd_length = ((ratio * length as f64).round() as i64).clamp(1, length);
        Ok(Codec {
            scheme,
            length,
            sketch,
            rnd_length,
            seed,
        })
    }

    /// m, the length of every message.
    pub fn message_length(&self) -> i64 {
        match (self.scheme, &self.sketch) {
            (Scheme::Std, _) => self.length,
            (Scheme::Rnd, _) => self.rnd_length,
            (_, Some(sketch)) => sketch.message_length(),
            (_, None) => unreachable!("FL-FREQ and FL-CS always have a sketch"),
        }
    }

    /// The actual ratio m / n (the requested one up to rounding per chunk).
    pub fn ratio(&self) -> f64 {
        self.message_length() as f64 / self.length as f64
    }

    /// The encoding of round `round` (FL-RND's coordinates change every round).
    pub fn for_round(&self, round: usize, device: Device) -> RoundCodec<'_> {
        let index = (self.scheme == Scheme::Rnd).then(|| {
            let mut rng = rand::rngs::StdRng::seed_from_u64(
                self.seed ^ (round as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            );
            let mut chosen: Vec<i64> =
                rand::seq::index::sample(&mut rng, self.length as usize, self.rnd_length as usize)
                    .into_iter()
                    .map(|i| i as i64)
                    .collect();
            chosen.sort();
            // Drawn on the host each round; sent without waiting for the device.
            let index = crate::host::upload(&Tensor::from_slice(&chosen), device);
            (index, chosen)
        });
        let (index, chosen) = index.unzip();
        RoundCodec {
            codec: self,
            index,
            chosen,
        }
    }
}

/// One round's encoding of a `Codec` (FL-RND's coordinates of that round): `encode` C(Δw) and
/// its linear decoding `zero_fill` Cᵀ y.
pub struct RoundCodec<'a> {
    codec: &'a Codec,
    /// FL-RND's coordinates on the device, ascending.
    index: Option<Tensor>,
    /// The same coordinates as drawn on the host (to cut them at the parameters' boundaries
    /// without reading the device).
    chosen: Option<Vec<i64>>,
}

impl RoundCodec<'_> {
    /// C(Δw): the message \[m\] a client sends for its update \[n\].
    pub fn encode(&self, update: &Tensor) -> Tensor {
        match (self.codec.scheme, &self.index, &self.codec.sketch) {
            (Scheme::Std, _, _) => update.shallow_clone(),
            (Scheme::Rnd, Some(index), _) => update.index_select(0, index),
            (_, _, Some(sketch)) => sketch.compress(update),
            _ => unreachable!("FL-RND has an index, FL-FREQ and FL-CS a sketch"),
        }
    }

    /// `encode` of the update given as its parts (the parameters, in order), the same values
    /// as `encode(&flatten(parts))` with fewer copies of the whole update: FL-RND gathers its
    /// coordinates from each part (the ascending coordinates cut at the parts' boundaries on
    /// the host), which saves copying all n values into one vector to send m of them; the DCT
    /// sketches join the parts into their chunks directly (`ChunkedDct::compress_parts`).
    pub fn encode_parts(&self, parts: &[Tensor]) -> Tensor {
        let (Scheme::Rnd, Some(index), Some(chosen)) =
            (self.codec.scheme, &self.index, &self.chosen)
        else {
            return match (self.codec.scheme, &self.codec.sketch) {
                (Scheme::Freq | Scheme::Cs, Some(sketch)) => sketch.compress_parts(parts),
                _ => self.encode(&super::codec::flatten(parts)),
            };
        };
        let mut pieces = Vec::new();
        let (mut offset, mut start) = (0i64, 0usize);
        for part in parts {
            let numel = part.numel() as i64;
            let end = start + chosen[start..].partition_point(|&i| i < offset + numel);
            if end > start {
                let local = index.narrow(0, start as i64, (end - start) as i64) - offset;
                pieces.push(part.reshape([-1]).index_select(0, &local));
            }
            offset += numel;
            start = end;
        }
        assert_eq!(
            offset, self.codec.length,
            "encode_parts: the parts hold {offset} values, the codec expects {}",
            self.codec.length
        );
        Tensor::cat(&pieces, 0)
    }

    /// The linear decoding Cᵀ y: zero filling (FL-RND, FL-FREQ; FL-CS's least-norm solution),
    /// the identity for FL-STD.
    pub fn zero_fill(&self, message: &Tensor) -> Tensor {
        match (self.codec.scheme, &self.index, &self.codec.sketch) {
            (Scheme::Std, _, _) => message.shallow_clone(),
            (Scheme::Rnd, Some(index), _) => {
                let mut dense =
                    Tensor::zeros([self.codec.length], (message.kind(), message.device()));
                let _ = dense.index_copy_(0, index, message);
                dense
            }
            (_, _, Some(sketch)) => sketch.zero_fill(message),
            _ => unreachable!("FL-RND has an index, FL-FREQ and FL-CS a sketch"),
        }
    }
}

/// Bits of one message of `m` float32 values (the paper's cost counts 32 bits a value; FL-RND's
/// coordinates and FL-CS's shuffle come from the shared seed, so no indices are sent).
pub fn message_bits(m: i64) -> u64 {
    m as u64 * 32
}
