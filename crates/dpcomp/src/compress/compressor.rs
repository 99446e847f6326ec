//! A compressor chosen in typed settings: `Compressor::Dgc(Dgc { rate: 256.0,
//! ..Default::default() })`, `Compressor::PowerSgd(PowerSgd { rank: 4, ..Default::default() })`.
//! A run's `[compression]` table and the command line's `--compressor dgc --rate 256
//! --compressor-option key=value` deserialise into the same value (`compress::settings`), so
//! all build the same encoder.
//!
//! ```
//! use dpcomp::compress::{Compressor, Dgc};
//! let dgc = Compressor::Dgc(Dgc { rate: 256.0, ..Default::default() });
//! let shapes = [vec![64, 32], vec![64]];
//! let mut link = dgc.link(&shapes, tch::Device::Cpu)?;
//! let update = [tch::Tensor::ones([64, 32], (tch::Kind::Float, tch::Device::Cpu)), tch::Tensor::ones([64], (tch::Kind::Float, tch::Device::Cpu))];
//! let (message, received) = link.round_trip(&update);
//! assert!(message.to_bytes()?.len() < 64 * 33 * 4 / 100);
//! assert_eq!(received[0].size(), [64, 32]);
//! // Settings a compressor cannot run with are refused, naming the field.
//! assert!(Compressor::Dgc(Dgc { rate: 0.5, ..Default::default() }).link(&shapes, tch::Device::Cpu).is_err());
//! # Ok::<(), dpcomp::error::Error>(())
//! ```

use super::cast::{Cast, CastEncoder, Int8, Int8Encoder};
use super::codec::{Decoder, Encoder, Link};
use super::denoise::{Denoise, DenoiseDecoder, DenoiseEncoder};
use super::dgc::{Dgc, DgcEncoder};
use super::identity::DenseEncoder;
use super::kind::CompressorKind;
use super::natural::NaturalEncoder;
use super::powersgd::{PowerSgd, PowerSgdEncoder};
use super::qsgd::{Qsgd, QsgdEncoder};
use super::random_k::{RandomK, RandomKDecoder, RandomKEncoder};
use super::sign::{EfSignEncoder, MajorityVote, SignEncoder};
use super::sketched::{Sketch, SketchDecoder, SketchEncoder};
use super::terngrad::TernGradEncoder;
use super::threshold::{Threshold, ThresholdEncoder};
use super::topk::TopK;
use super::unpack::Unpack;
use crate::error::{Error, Result};
use tch::Device;

/// Which compressor, with its settings.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Compressor {
    /// Dense fp32 messages (still counted).
    #[default]
    Identity,
    /// Deep Gradient Compression (`dgc`).
    Dgc(Dgc),
    /// PowerSGD (`powersgd`).
    PowerSgd(PowerSgd),
    /// The compression paper's Denoise (`denoise`).
    Denoise(Denoise),
    /// The federated paper's linear sketches, FL-RND, FL-FREQ, FL-CS (`sketched`).
    Sketch(Sketch),
    /// QSGD (`qsgd`): norms, signs and stochastic levels, unbiased.
    Qsgd(Qsgd),
    /// TernGrad (`terngrad`): the layer's max and stochastic ternary codes, unbiased.
    TernGrad,
    /// signSGD with majority vote (`signsgd`): one bit per element, no scale.
    SignSgd,
    /// EF-signSGD (`ef-signsgd`): scaled signs with error feedback.
    EfSignSgd,
    /// Random-k with shared-seed coordinates (`randomk`).
    RandomK(RandomK),
    /// Threshold-v (`threshold`).
    Threshold(Threshold),
    /// IEEE half precision (`fp16`).
    Fp16,
    /// bfloat16 (`bf16`).
    Bf16,
    /// 8-bit integers with a per-tensor scale (`int8`).
    Int8(Int8),
    /// Natural compression (`natural`): stochastic rounding to powers of two, unbiased.
    Natural,
}

impl Compressor {
    /// DGC at `rate` (dense fp32 bits / message bits), every other setting its default:
    /// `Compressor::dgc(16.0)` is `Compressor::Dgc(Dgc { rate: 16.0, ..Default::default() })`.
    ///
    /// ```
    /// use dpcomp::compress::{Compressor, Dgc};
    /// let dgc = Compressor::dgc(16.0);
    /// assert_eq!(dgc, Compressor::Dgc(Dgc { rate: 16.0, ..Default::default() }));
    /// assert_eq!(dgc.label(), "dgc x16");
    /// ```
    pub fn dgc(rate: f64) -> Self {
        Compressor::Dgc(Dgc {
            rate,
            ..Default::default()
        })
    }

    /// PowerSGD at rank `rank`, every other setting its default.
    pub fn powersgd(rank: i64) -> Self {
        Compressor::PowerSgd(PowerSgd {
            rank,
            ..Default::default()
        })
    }

    /// Denoise at `rate`, every other setting its default.
    pub fn denoise(rate: f64) -> Self {
        Compressor::Denoise(Denoise {
            rate,
            ..Default::default()
        })
    }

    /// The federated paper's sketch `scheme` (FL-RND, FL-FREQ, FL-CS) at `rate` = n / m, with
    /// `Sketch::new`'s defaults.
    pub fn sketch(scheme: super::linear_sketch::Scheme, rate: f64) -> Self {
        Compressor::Sketch(Sketch::new(scheme, rate))
    }

    /// Its kind, as the command line names it.
    pub fn kind(&self) -> CompressorKind {
        match self {
            Compressor::Identity => CompressorKind::Identity,
            Compressor::Dgc(_) => CompressorKind::Dgc,
            Compressor::PowerSgd(_) => CompressorKind::Powersgd,
            Compressor::Denoise(_) => CompressorKind::Denoise,
            Compressor::Sketch(s) => match s.scheme {
                super::linear_sketch::Scheme::Std => CompressorKind::Identity,
                super::linear_sketch::Scheme::Rnd => CompressorKind::FlRnd,
                super::linear_sketch::Scheme::Freq => CompressorKind::FlFreq,
                super::linear_sketch::Scheme::Cs => CompressorKind::FlCs,
            },
            Compressor::Qsgd(_) => CompressorKind::Qsgd,
            Compressor::TernGrad => CompressorKind::Terngrad,
            Compressor::SignSgd => CompressorKind::Signsgd,
            Compressor::EfSignSgd => CompressorKind::EfSignsgd,
            Compressor::RandomK(_) => CompressorKind::Randomk,
            Compressor::Threshold(_) => CompressorKind::Threshold,
            Compressor::Fp16 => CompressorKind::Fp16,
            Compressor::Bf16 => CompressorKind::Bf16,
            Compressor::Int8(_) => CompressorKind::Int8,
            Compressor::Natural => CompressorKind::Natural,
        }
    }

    /// The compression rate of the kinds that take one (DGC, Denoise, random-k, the sketches);
    /// 1 for the others.
    pub fn rate(&self) -> f64 {
        match self {
            Compressor::Dgc(d) => d.rate,
            Compressor::Denoise(d) => d.rate,
            Compressor::Sketch(s) => s.rate,
            Compressor::RandomK(r) => r.rate,
            _ => 1.0,
        }
    }

    /// PowerSGD's rank; 1 for the other kinds.
    pub fn rank(&self) -> i64 {
        match self {
            Compressor::PowerSgd(p) => p.rank,
            _ => 1,
        }
    }

    /// A short label for tables: "identity", "dgc x256", "powersgd r16", "denoise x16", with
    /// the settings that differ from their defaults: "denoise x16 (scope=model)"
    /// (`label_given`).
    pub fn label(&self) -> String {
        self.label_given(&super::settings::Settings::new())
    }

    /// The label with the settings that differ from their defaults and those in `given` (the
    /// settings as a configuration gave them, shown even at their default: "dgc x256
    /// (budget=bits)"), each `key=value` in key order, the value as `given` spells it, else as
    /// TOML writes it (`clip=3.0`; a string bare). The rate and the rank are in the name:
    /// "qsgd", "randomk x32", "powersgd r1".
    pub fn label_given(&self, given: &super::settings::Settings) -> String {
        let kind = self.kind();
        let base = match kind {
            CompressorKind::Identity => "identity".to_string(),
            CompressorKind::Powersgd => format!("powersgd r{}", self.rank()),
            k if self.rate() == 1.0
                && !matches!(k, CompressorKind::Dgc | CompressorKind::Denoise)
                && !k.is_sketch() =>
            {
                k.to_string()
            }
            k => format!("{k} x{}", self.rate()),
        };
        let changed = self.changed_settings();
        let shown: Vec<String> = self
            .settings()
            .iter()
            .filter(|(key, _)| !matches!(key.as_str(), "rate" | "rank"))
            .filter(|(key, _)| changed.contains_key(*key) || given.contains_key(*key))
            .map(|(key, value)| {
                let value = given.get(key).unwrap_or(value);
                format!("{key}={}", super::settings::shown(value))
            })
            .collect();
        if shown.is_empty() {
            base
        } else {
            format!("{base} ({})", shown.join(", "))
        }
    }

    /// These settings if `validate` accepts them.
    pub fn validated(self) -> Result<Self> {
        self.validate()?;
        Ok(self)
    }

    /// Checks every setting; each error names the field and what it takes.
    pub fn validate(&self) -> Result<()> {
        match self {
            Compressor::Identity => Ok(()),
            Compressor::Dgc(d) => {
                rate(d.rate)?;
                value_bits(d.value_bits)?;
                unit("momentum", d.momentum, false)?;
                unit("residual_decay", d.residual_decay, true)?;
                topk(d.topk)
            }
            Compressor::PowerSgd(p) => {
                if p.rank < 1 {
                    return Err(field("rank", p.rank, "a rank >= 1"));
                }
                if !(p.min_rate >= 0.0 && p.epsilon >= 0.0) {
                    return Err(field(
                        "min_rate/epsilon",
                        format!("{}/{}", p.min_rate, p.epsilon),
                        "numbers >= 0",
                    ));
                }
                unit("residual_decay", p.residual_decay, true)
            }
            Compressor::Denoise(d) => {
                rate(d.rate)?;
                value_bits(d.value_bits)?;
                unit("beta", d.beta, false)?;
                unit("decay", d.decay, true)?;
                if d.clip.is_nan() || d.clip <= 0.0 {
                    return Err(field("clip", d.clip, "a positive number (inf: off)"));
                }
                topk(d.topk)
            }
            Compressor::Sketch(s) => {
                if s.scheme == super::linear_sketch::Scheme::Std {
                    return Err(field(
                        "scheme",
                        "std",
                        "rnd, freq or cs (std is the uncompressed scheme: Compressor::Identity)",
                    ));
                }
                rate(s.rate)?;
                if s.chunks.is_some_and(|p| p < 1) {
                    return Err(field("chunks", s.chunks.unwrap_or(0), "at least 1"));
                }
                if !(s.lambda.is_finite() && s.lambda >= 0.0) {
                    return Err(field("lambda", s.lambda, "a finite number >= 0"));
                }
                if s.iterations == 0 {
                    return Err(field("iterations", 0, "at least one OWL-QN iteration"));
                }
                Ok(())
            }
            Compressor::Qsgd(q) => {
                if !(1..=(1 << 30)).contains(&q.levels) {
                    return Err(field("levels", q.levels, "a whole number from 1 to 2^30"));
                }
                if q.bucket < 0 {
                    return Err(field(
                        "bucket",
                        q.bucket,
                        "elements per norm >= 1, or 0 for one norm per tensor",
                    ));
                }
                Ok(())
            }
            Compressor::RandomK(r) => {
                rate(r.rate)?;
                if r.unbiased && r.error_feedback {
                    return Err(field(
                        "unbiased",
                        "true with error_feedback=true",
                        "one of the two: an unbiased estimate keeps no error (set error_feedback=false)",
                    ));
                }
                Ok(())
            }
            Compressor::Threshold(t) => {
                if !(t.threshold.is_finite() && t.threshold > 0.0) {
                    return Err(field("threshold", t.threshold, "a finite number > 0"));
                }
                value_bits(t.value_bits)
            }
            Compressor::TernGrad
            | Compressor::SignSgd
            | Compressor::EfSignSgd
            | Compressor::Fp16
            | Compressor::Bf16
            | Compressor::Int8(_)
            | Compressor::Natural => Ok(()),
        }
    }

    /// The worker's encoder for parameters of `shapes` on `device`, its state allocated there.
    pub fn encoder(&self, shapes: &[Vec<i64>], device: Device) -> Result<Box<dyn Encoder>> {
        self.validate()?;
        Ok(match self {
            Compressor::Identity => Box::new(DenseEncoder),
            Compressor::Dgc(d) => Box::new(DgcEncoder::new(shapes, device, d.clone())),
            Compressor::PowerSgd(p) => Box::new(PowerSgdEncoder::new(shapes, device, p.clone())),
            Compressor::Denoise(d) => Box::new(DenoiseEncoder::new(shapes, device, d.clone())),
            Compressor::Sketch(s) => Box::new(SketchEncoder::new(shapes, device, *s)?),
            Compressor::Qsgd(q) => Box::new(QsgdEncoder::new(q.clone())),
            Compressor::TernGrad => Box::new(TernGradEncoder),
            Compressor::SignSgd => Box::new(SignEncoder),
            Compressor::EfSignSgd => Box::new(EfSignEncoder::new(shapes, device)),
            Compressor::RandomK(r) => Box::new(RandomKEncoder::new(shapes, device, r.clone())),
            Compressor::Threshold(t) => Box::new(ThresholdEncoder::new(shapes, device, t.clone())),
            Compressor::Fp16 => Box::new(CastEncoder(Cast::Fp16)),
            Compressor::Bf16 => Box::new(CastEncoder(Cast::Bf16)),
            Compressor::Int8(i) => Box::new(Int8Encoder(i.clone())),
            Compressor::Natural => Box::new(NaturalEncoder),
        })
    }

    /// The receiver's decoder for the encoder's messages (`encoder` with the same arguments).
    pub fn decoder(&self, shapes: &[Vec<i64>], device: Device) -> Result<Box<dyn Decoder>> {
        self.validate()?;
        Ok(match self {
            Compressor::Identity | Compressor::PowerSgd(_) => Box::new(Unpack::per_parameter()),
            Compressor::Dgc(d) => Box::new(Unpack::new(shapes, d.scope)),
            Compressor::Denoise(d) => Box::new(DenoiseDecoder::new(shapes, device, d.scope)),
            Compressor::Sketch(s) => Box::new(SketchDecoder::new(shapes, device, *s)?),
            Compressor::RandomK(r) => Box::new(RandomKDecoder::new(shapes, device, r.clone())),
            Compressor::SignSgd => Box::new(MajorityVote),
            Compressor::Qsgd(_)
            | Compressor::TernGrad
            | Compressor::EfSignSgd
            | Compressor::Threshold(_)
            | Compressor::Fp16
            | Compressor::Bf16
            | Compressor::Int8(_)
            | Compressor::Natural => Box::new(Unpack::per_parameter()),
        })
    }

    /// An encoder and its decoder in one process.
    pub fn link(&self, shapes: &[Vec<i64>], device: Device) -> Result<Link> {
        Ok(Link {
            encoder: self.encoder(shapes, device)?,
            decoder: self.decoder(shapes, device)?,
        })
    }
}

fn field(name: &str, value: impl std::fmt::Display, expected: &str) -> Error {
    Error::bad_value(
        format!("compressor setting {name}"),
        format!("{value}: expected {expected}"),
    )
}

fn rate(rate: f64) -> Result<()> {
    if rate.is_finite() && rate >= 1.0 {
        Ok(())
    } else {
        Err(field("rate", rate, "a compression rate >= 1 (1 = dense)"))
    }
}

fn value_bits(bits: u32) -> Result<()> {
    if (9..=32).contains(&bits) {
        Ok(())
    } else {
        Err(field(
            "value_bits",
            bits,
            "9..=32 (sign + 8 exponent bits + kept mantissa bits)",
        ))
    }
}

/// A number in [0, 1) or, with `closed`, [0, 1].
fn unit(name: &str, v: f64, closed: bool) -> Result<()> {
    let ok = v >= 0.0 && if closed { v <= 1.0 } else { v < 1.0 };
    if ok {
        Ok(())
    } else {
        let range = if closed { "[0, 1]" } else { "[0, 1)" };
        Err(field(name, v, &format!("a number in {range}")))
    }
}

fn topk(topk: TopK) -> Result<()> {
    match topk {
        TopK::Sampled { ratio } | TopK::Auto { ratio } if !(ratio > 0.0 && ratio <= 1.0) => {
            Err(field("sample_ratio", ratio, "a number in (0, 1]"))
        }
        _ => Ok(()),
    }
}
