//! Which compressor a run uses and its settings: `--compressor`, `--rate`, `--rank` and
//! `--compressor-option key=value` (repeatable; in TOML `compressor_options = ["key=value"]`).
//! Unknown keys and bad values are errors that list what each compressor accepts.

use super::cast::Int8;
use super::chunked_dct::DctRows;
use super::compressor::Compressor;
use super::denoise::Denoise;
use super::dgc::{Dgc, Warmup};
use super::encoding::{Budget, IndexBits};
use super::linear_sketch::Scheme;
use super::powersgd::{MatrixShape, PowerSgd};
use super::qsgd::{Qsgd, QsgdEncoding};
use super::random_k::RandomK;
use super::sketched::Sketch;
use super::threshold::Threshold;
use super::topk::TopK;
use super::{Decoder, Encoder, Link, Scope};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tch::Device;

/// Which compressor a run uses, as `--compressor` and `[compression] kind` name it; its typed
/// settings are `Compressor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum CompressorKind {
    /// Dense fp32, the uncompressed baseline.
    #[default]
    Identity,
    /// Deep Gradient Compression: layer-wise top-k, error feedback, optional bit removal.
    Dgc,
    /// PowerSGD: rank-r approximation by one warm-started power iteration, error feedback.
    Powersgd,
    /// The paper's Denoise: top-k of velocity or acceleration, whichever loses less.
    Denoise,
    /// FL-RND: n / rate coordinates chosen by a shared seed, new every step (`sketched`).
    #[serde(rename = "fl-rnd")]
    FlRnd,
    /// FL-FREQ: the first DCT coefficients of contiguous chunks (`sketched`).
    #[serde(rename = "fl-freq")]
    FlFreq,
    /// FL-CS: DCT coefficients of the shuffled update, reconstructed by BPDN (`sketched`).
    #[serde(rename = "fl-cs")]
    FlCs,
    /// QSGD: per-bucket norm, signs and stochastically rounded levels, unbiased (`qsgd`).
    Qsgd,
    /// TernGrad: per-layer max and stochastic ternary {-1, 0, 1}, unbiased (`terngrad`).
    Terngrad,
    /// signSGD with majority vote: one bit per element, no scale (`sign`).
    Signsgd,
    /// EF-signSGD: the mean magnitude times the sign, with error feedback (`sign`).
    #[serde(rename = "ef-signsgd")]
    EfSignsgd,
    /// Random-k: numel / rate coordinates from a shared seed, no indices sent (`random_k`).
    Randomk,
    /// Threshold-v: every element of magnitude >= v, in COO (`threshold`).
    Threshold,
    /// IEEE half precision, 16 bits per element (`cast`).
    Fp16,
    /// bfloat16, 16 bits per element (`cast`).
    Bf16,
    /// 8-bit integers with a per-tensor scale (`cast`).
    Int8,
    /// Natural compression: stochastic rounding to powers of two, 9 bits, unbiased (`natural`).
    Natural,
}

impl CompressorKind {
    /// The name the command line and `config.toml` use ("dgc", "fl-cs", ...).
    pub fn name(self) -> &'static str {
        match self {
            CompressorKind::Identity => "identity",
            CompressorKind::Dgc => "dgc",
            CompressorKind::Powersgd => "powersgd",
            CompressorKind::Denoise => "denoise",
            CompressorKind::FlRnd => "fl-rnd",
            CompressorKind::FlFreq => "fl-freq",
            CompressorKind::FlCs => "fl-cs",
            CompressorKind::Qsgd => "qsgd",
            CompressorKind::Terngrad => "terngrad",
            CompressorKind::Signsgd => "signsgd",
            CompressorKind::EfSignsgd => "ef-signsgd",
            CompressorKind::Randomk => "randomk",
            CompressorKind::Threshold => "threshold",
            CompressorKind::Fp16 => "fp16",
            CompressorKind::Bf16 => "bf16",
            CompressorKind::Int8 => "int8",
            CompressorKind::Natural => "natural",
        }
    }

    /// Every kind, in the order `--help` lists them.
    pub const ALL: [CompressorKind; 17] = [
        CompressorKind::Identity,
        CompressorKind::Dgc,
        CompressorKind::Powersgd,
        CompressorKind::Denoise,
        CompressorKind::FlRnd,
        CompressorKind::FlFreq,
        CompressorKind::FlCs,
        CompressorKind::Qsgd,
        CompressorKind::Terngrad,
        CompressorKind::Signsgd,
        CompressorKind::EfSignsgd,
        CompressorKind::Randomk,
        CompressorKind::Threshold,
        CompressorKind::Fp16,
        CompressorKind::Bf16,
        CompressorKind::Int8,
        CompressorKind::Natural,
    ];

    /// Whether W data-parallel workers exchange this compressor's messages by summing them
    /// (`Encoder::encode_all_reduced`: dense fp32; PowerSGD, whose P, Q and error feedback
    /// depend on the workers' updates only through their sum; the linear sketches, averaged in
    /// the compressed domain and decoded once), so that the update every worker applies is a
    /// function of the *sum* of their noised gradients. DGC's and Denoise's messages are
    /// gathered and each decoded on its own (top-k of each worker's update): the update then
    /// depends on every worker's message separately (`train::builder::TrainerBuilder::communicator`'s noise rule).
    /// So are the quantisers' and casts' (each worker's scale and rounding are its own),
    /// threshold-v's and signSGD's (whose majority vote is a function of the workers' signs,
    /// not of their sum); random-k's shared coordinates make it linear, summed like FL-RND.
    pub fn exchanged_by_sum(self) -> bool {
        matches!(
            self,
            CompressorKind::Identity
                | CompressorKind::Powersgd
                | CompressorKind::FlRnd
                | CompressorKind::FlFreq
                | CompressorKind::FlCs
                | CompressorKind::Randomk
        )
    }

    /// The federated paper's linear sketches (`sketched`).
    pub fn is_sketch(self) -> bool {
        matches!(
            self,
            CompressorKind::FlRnd | CompressorKind::FlFreq | CompressorKind::FlCs
        )
    }

    /// Option keys this compressor accepts, for error messages and `--help`.
    pub fn keys(self) -> &'static [&'static str] {
        match self {
            CompressorKind::Identity => &[],
            CompressorKind::Dgc => &[
                "value_bits",
                "index_bits",
                "momentum",
                "masking",
                "warmup_epochs",
                "warmup",
                "topk",
                "sample_ratio",
                "scope",
                "budget",
                "dense_vectors",
                "error_feedback",
                "residual_decay",
            ],
            CompressorKind::Powersgd => &[
                "shape",
                "min_rate",
                "epsilon",
                "warm_start",
                "seed",
                "error_feedback",
                "residual_decay",
            ],
            CompressorKind::Denoise => &[
                "beta",
                "decay",
                "scope",
                "value_bits",
                "index_bits",
                "topk",
                "sample_ratio",
                "clip",
                "budget",
            ],
            CompressorKind::FlRnd => &["seed", "error_feedback"],
            CompressorKind::FlFreq => &["chunks"],
            CompressorKind::Qsgd => &["levels", "bucket", "encoding"],
            CompressorKind::Randomk => &["seed", "unbiased", "error_feedback"],
            CompressorKind::Threshold => {
                &["threshold", "value_bits", "index_bits", "error_feedback"]
            }
            CompressorKind::Int8 => &["stochastic"],
            CompressorKind::Terngrad
            | CompressorKind::Signsgd
            | CompressorKind::EfSignsgd
            | CompressorKind::Fp16
            | CompressorKind::Bf16
            | CompressorKind::Natural => &[],
            CompressorKind::FlCs => &[
                "chunks",
                "rows",
                "seed",
                "lambda",
                "iterations",
                "error_feedback",
            ],
        }
    }
}

impl std::fmt::Display for CompressorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A compressor and its settings, as a run's configuration holds them.
#[derive(Debug, Clone, PartialEq)]
pub struct CompressorSpec {
    /// Which compressor.
    pub kind: CompressorKind,
    /// Target ratio dense fp32 bits / message bits for the sparsifiers (DGC, Denoise) and the
    /// sketches (n / m); 1 = dense.
    pub rate: f64,
    /// PowerSGD's rank.
    pub rank: i64,
    /// The `key=value` options, checked against the kind's keys (`CompressorKind::keys`).
    pub options: BTreeMap<String, String>,
}

impl CompressorSpec {
    /// Parses `key=value` strings; checks every key against `kind` and every value's type.
    pub fn new(kind: CompressorKind, rate: f64, rank: i64, options: &[String]) -> Result<Self> {
        if !(rate.is_finite() && rate >= 1.0) {
            return Err(Error::bad_value(
                "rate",
                format!("{rate}: expected a compression rate >= 1 (1 = dense)"),
            ));
        }
        if rank < 1 {
            return Err(Error::bad_value(
                "rank",
                format!("{rank}: expected a rank >= 1"),
            ));
        }
        // A setting the chosen compressor does not read would be silently ignored: refuse it.
        let uses_rate = matches!(
            kind,
            CompressorKind::Dgc | CompressorKind::Denoise | CompressorKind::Randomk
        ) || kind.is_sketch();
        if rate != 1.0 && !uses_rate {
            return Err(Error::bad_value(
                "rate",
                format!("{rate}: the rate applies to dgc, denoise, randomk and the fl sketches, not {kind} (remove it, or choose another `compressor`)"),
            ));
        }
        if rank != 1 && kind != CompressorKind::Powersgd {
            return Err(Error::bad_value(
                "rank",
                format!("{rank}: the rank applies to powersgd, not {kind} (remove it, or choose `compressor` powersgd)"),
            ));
        }
        let mut map = BTreeMap::new();
        for option in options {
            let Some((key, value)) = option.split_once('=') else {
                return Err(Error::bad_value(
                    "compressor_options",
                    format!("{option:?}: expected key=value"),
                ));
            };
            let (key, value) = (key.trim().to_string(), value.trim().to_string());
            if !kind.keys().contains(&key.as_str()) {
                return Err(Error::bad_value(
                    "compressor_options",
                    format!(
                        "{key:?} is not an option of {kind}; it accepts: {}",
                        if kind.keys().is_empty() {
                            "none".to_string()
                        } else {
                            kind.keys().join(", ")
                        }
                    ),
                ));
            }
            map.insert(key, value);
        }
        let spec = CompressorSpec {
            kind,
            rate,
            rank,
            options: map,
        };
        // Parse once now so that bad values fail before training starts.
        match kind {
            CompressorKind::Identity => {}
            CompressorKind::Dgc => {
                spec.dgc_options()?;
            }
            CompressorKind::Powersgd => {
                spec.powersgd_options()?;
            }
            CompressorKind::Denoise => {
                spec.denoise_options()?;
            }
            CompressorKind::FlRnd | CompressorKind::FlFreq | CompressorKind::FlCs => {
                spec.sketch_options()?;
            }
            _ => {
                spec.compressor()?;
            }
        }
        Ok(spec)
    }

    /// The typed settings this spec parses into (`Compressor`).
    pub fn compressor(&self) -> Result<Compressor> {
        match self.kind {
            CompressorKind::Identity => Compressor::Identity,
            CompressorKind::Dgc => Compressor::Dgc(self.dgc_options()?),
            CompressorKind::Powersgd => Compressor::PowerSgd(self.powersgd_options()?),
            CompressorKind::Denoise => Compressor::Denoise(self.denoise_options()?),
            CompressorKind::FlRnd | CompressorKind::FlFreq | CompressorKind::FlCs => {
                Compressor::Sketch(self.sketch_options()?)
            }
            CompressorKind::Qsgd => Compressor::Qsgd(self.qsgd_options()?),
            CompressorKind::Terngrad => Compressor::TernGrad,
            CompressorKind::Signsgd => Compressor::SignSgd,
            CompressorKind::EfSignsgd => Compressor::EfSignSgd,
            CompressorKind::Randomk => Compressor::RandomK(RandomK {
                rate: self.rate,
                seed: self.get("seed", 0, "an integer >= 0")?,
                unbiased: self.get("unbiased", false, "true or false")?,
                error_feedback: self.get("error_feedback", true, "true or false")?,
            }),
            CompressorKind::Threshold => Compressor::Threshold(Threshold {
                threshold: match self.options.get("threshold") {
                    None => Threshold::default().threshold,
                    Some(_) => self.get("threshold", 0.0, "a number > 0")?,
                },
                value_bits: self.value_bits()?,
                index_bits: self.index_bits()?,
                error_feedback: self.get("error_feedback", true, "true or false")?,
            }),
            CompressorKind::Fp16 => Compressor::Fp16,
            CompressorKind::Bf16 => Compressor::Bf16,
            CompressorKind::Int8 => Compressor::Int8(Int8 {
                stochastic: self.get("stochastic", false, "true or false")?,
            }),
            CompressorKind::Natural => Compressor::Natural,
        }
        .validated()
    }

    /// QSGD's typed settings: `levels` s (default 16), `bucket` (default 512; 0: one norm per
    /// tensor), `encoding=fixed|elias`.
    fn qsgd_options(&self) -> Result<Qsgd> {
        let default = Qsgd::default();
        Ok(Qsgd {
            levels: self.get("levels", default.levels, "a whole number of levels >= 1")?,
            bucket: self.get("bucket", default.bucket, "a whole number of elements >= 0")?,
            encoding: match self.options.get("encoding").map(String::as_str) {
                None | Some("fixed") => QsgdEncoding::Fixed,
                Some("elias") => QsgdEncoding::Elias,
                Some(v) => {
                    return Err(Error::bad_value(
                        "compressor option encoding",
                        format!("{v:?}: expected fixed or elias (the paper's Elias-gamma code)"),
                    ))
                }
            },
        })
    }

    /// The worker's encoder for parameters of `shapes` on `device`, its state allocated there.
    pub fn encoder(&self, shapes: &[Vec<i64>], device: Device) -> Result<Box<dyn Encoder>> {
        self.compressor()?.encoder(shapes, device)
    }

    /// The receiver's decoder for the encoder's messages (`encoder` with the same arguments).
    pub fn decoder(&self, shapes: &[Vec<i64>], device: Device) -> Result<Box<dyn Decoder>> {
        self.compressor()?.decoder(shapes, device)
    }

    /// An encoder and its decoder in one process (`Link`).
    pub fn link(&self, shapes: &[Vec<i64>], device: Device) -> Result<Link> {
        self.compressor()?.link(shapes, device)
    }

    /// A short label for tables: "identity", "dgc x256", "powersgd r16", "denoise x16", with the
    /// options that were set: "denoise x16 (scope=model)".
    pub fn label(&self) -> String {
        let base = match self.kind {
            CompressorKind::Identity => "identity".to_string(),
            CompressorKind::Powersgd => format!("powersgd r{}", self.rank),
            k if self.rate == 1.0
                && !matches!(k, CompressorKind::Dgc | CompressorKind::Denoise)
                && !k.is_sketch() =>
            {
                k.to_string()
            }
            k => format!("{k} x{}", self.rate),
        };
        if self.options.is_empty() {
            return base;
        }
        let options: Vec<String> = self
            .options
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        format!("{base} ({})", options.join(", "))
    }

    fn get<T: std::str::FromStr>(&self, key: &str, default: T, expected: &str) -> Result<T> {
        match self.options.get(key) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| {
                Error::bad_value(
                    format!("compressor option {key}"),
                    format!("{v:?}: expected {expected}"),
                )
            }),
        }
    }

    fn value_bits(&self) -> Result<u32> {
        let bits: u32 = self.get("value_bits", 32, "an integer from 9 to 32")?;
        if !(9..=32).contains(&bits) {
            return Err(Error::bad_value(
                "compressor option value_bits",
                format!("{bits}: expected 9..=32 (sign + 8 exponent bits + kept mantissa bits)"),
            ));
        }
        Ok(bits)
    }

    fn index_bits(&self) -> Result<IndexBits> {
        match self.options.get("index_bits").map(String::as_str) {
            None | Some("32") => Ok(IndexBits::Fixed32),
            Some("min") => Ok(IndexBits::Minimal),
            Some(v) => Err(Error::bad_value(
                "compressor option index_bits",
                format!("{v:?}: expected 32 or min"),
            )),
        }
    }

    fn topk(&self) -> Result<TopK> {
        let ratio: f64 = self.get("sample_ratio", 0.01, "a number in (0, 1]")?;
        if !(ratio > 0.0 && ratio <= 1.0) {
            return Err(Error::bad_value(
                "compressor option sample_ratio",
                format!("{ratio}: expected a number in (0, 1]"),
            ));
        }
        match self.options.get("topk").map(String::as_str) {
            None | Some("auto") => Ok(TopK::Auto { ratio }),
            Some("sampled") => Ok(TopK::Sampled { ratio }),
            Some("exact") => Ok(TopK::Exact),
            Some(v) => Err(Error::bad_value(
                "compressor option topk",
                format!("{v:?}: expected auto, sampled or exact"),
            )),
        }
    }

    fn unit(&self, key: &str, default: f64, upper_open: bool) -> Result<f64> {
        let v: f64 = self.get(key, default, "a number in [0, 1)")?;
        let ok = v >= 0.0 && if upper_open { v < 1.0 } else { v <= 1.0 };
        if !ok {
            return Err(Error::bad_value(
                format!("compressor option {key}"),
                format!(
                    "{v}: expected a number in [0, 1{}",
                    if upper_open { ")" } else { "]" }
                ),
            ));
        }
        Ok(v)
    }

    /// DGC's typed settings from the rate and options; errors name the option.
    pub fn dgc_options(&self) -> Result<Dgc> {
        Ok(Dgc {
            rate: self.rate,
            value_bits: self.value_bits()?,
            index_bits: self.index_bits()?,
            momentum: self.unit("momentum", 0.0, true)?,
            masking: self.get("masking", true, "true or false")?,
            warmup_epochs: self.get("warmup_epochs", 0, "a whole number of epochs")?,
            warmup: match self.options.get("warmup").map(String::as_str) {
                None | Some("paper") => Warmup::Paper,
                Some("reference") => Warmup::Reference,
                Some(v) => {
                    return Err(Error::bad_value(
                        "compressor option warmup",
                        format!("{v:?}: expected paper (DGC paper's 4^(e+1)) or reference"),
                    ))
                }
            },
            topk: self.topk()?,
            scope: self.scope()?,
            budget: self.budget()?,
            dense_vectors: self.get("dense_vectors", false, "true or false")?,
            residual_decay: self.residual_decay()?,
        })
    }

    /// γ of `residual <- γ (residual - sent)` (DGC, PowerSGD): `residual_decay` in [0, 1]
    /// (default 1: the error feedback of both papers); `error_feedback=false` is γ = 0 (the
    /// compression of the current update alone: what is not sent is dropped). Giving both with
    /// `error_feedback=false` and a γ other than 0 is a contradiction.
    fn residual_decay(&self) -> Result<f64> {
        let feedback: bool = self.get("error_feedback", true, "true or false")?;
        let decay = self.unit("residual_decay", 1.0, false)?;
        if !feedback && self.options.contains_key("residual_decay") && decay != 0.0 {
            return Err(Error::bad_value(
                "compressor option residual_decay",
                format!("{decay} with error_feedback=false, which keeps no residual: give one of the two"),
            ));
        }
        Ok(if feedback { decay } else { 0.0 })
    }

    /// `budget=bits|elements` of the sparsifiers (`encoding::Budget`; bits by default).
    fn budget(&self) -> Result<Budget> {
        match self.options.get("budget").map(String::as_str) {
            None | Some("bits") => Ok(Budget::Bits),
            Some("elements") => Ok(Budget::Elements),
            Some(v) => Err(Error::bad_value(
                "compressor option budget",
                format!("{v:?}: expected bits (the wire bits shrink by the rate) or elements (k = numel / rate)"),
            )),
        }
    }

    /// `scope=layer|model` of the sparsifiers (layer-wise by default).
    fn scope(&self) -> Result<Scope> {
        match self.options.get("scope").map(String::as_str) {
            None | Some("layer") => Ok(Scope::Layer),
            Some("model") => Ok(Scope::Model),
            Some(v) => Err(Error::bad_value(
                "compressor option scope",
                format!("{v:?}: expected layer or model"),
            )),
        }
    }

    /// PowerSGD's typed settings from the rank and options; errors name the option.
    pub fn powersgd_options(&self) -> Result<PowerSgd> {
        let shape = match self.options.get("shape").map(String::as_str) {
            None | Some("square") => MatrixShape::NearSquare,
            Some("rows") => MatrixShape::Rows,
            Some(v) => {
                return Err(Error::bad_value(
                    "compressor option shape",
                    format!("{v:?}: expected square (the paper) or rows (PyTorch's [rows, -1])"),
                ))
            }
        };
        let min_rate: f64 = self.get("min_rate", 2.0, "a number >= 0")?;
        let epsilon: f64 = self.get("epsilon", 1e-8, "a number >= 0")?;
        if !(min_rate >= 0.0 && epsilon >= 0.0) {
            return Err(Error::bad_value(
                "compressor option min_rate/epsilon",
                format!("{min_rate}/{epsilon}: expected numbers >= 0"),
            ));
        }
        Ok(PowerSgd {
            rank: self.rank,
            shape,
            min_rate,
            epsilon,
            warm_start: self.get("warm_start", true, "true or false")?,
            seed: self.get("seed", 0, "an integer")?,
            residual_decay: self.residual_decay()?,
        })
    }

    /// Denoise's typed settings from the rate and options; errors name the option.
    pub fn denoise_options(&self) -> Result<Denoise> {
        let scope = self.scope()?;
        let clip: f64 = self.get("clip", f64::INFINITY, "a positive number (inf: off)")?;
        // NaN fails every comparison: test for it by name.
        if clip.is_nan() || clip <= 0.0 {
            return Err(Error::bad_value(
                "compressor option clip",
                format!("{clip}: expected a positive number (inf: off)"),
            ));
        }
        Ok(Denoise {
            rate: self.rate,
            beta: self.unit("beta", 0.9, true)?,
            decay: self.unit("decay", 0.9, false)?,
            scope,
            value_bits: self.value_bits()?,
            index_bits: self.index_bits()?,
            topk: self.topk()?,
            clip,
            budget: self.budget()?,
        })
    }

    /// The sketch of `fl-rnd`, `fl-freq` and `fl-cs` at `rate` n / m (the paper's r = 1 / rate); `chunks` P (default
    /// ⌈n / 1024⌉); `rows=first|random` (FL-CS); `seed` (default 0); `lambda` (FL-CS, default
    /// 0.01, the federated runs' default); `iterations` (FL-CS OWL-QN, default 100);
    /// `error_feedback` (FL-RND: off by default; FL-CS: on, Algorithm 3's error).
    pub fn sketch_options(&self) -> Result<Sketch> {
        let scheme = match self.kind {
            CompressorKind::FlRnd => Scheme::Rnd,
            CompressorKind::FlFreq => Scheme::Freq,
            CompressorKind::FlCs => Scheme::Cs,
            kind => {
                return Err(Error::bad_value(
                    "compressor",
                    format!("{kind} is not one of the fl sketches"),
                ))
            }
        };
        let chunks: Option<i64> = match self.options.get("chunks") {
            None => None,
            Some(_) => Some(self.get("chunks", 1, "a whole number of chunks >= 1")?),
        };
        if chunks.is_some_and(|p| p < 1) {
            return Err(Error::bad_value(
                "compressor option chunks",
                "expected a whole number of chunks >= 1",
            ));
        }
        let rows = match self.options.get("rows").map(String::as_str) {
            None | Some("first") => DctRows::First,
            Some("random") => DctRows::Random,
            Some(v) => {
                return Err(Error::bad_value(
                    "compressor option rows",
                    format!("{v:?}: expected first (the paper's) or random"),
                ))
            }
        };
        let lambda: f64 = self.get("lambda", 0.01, "a finite number >= 0")?;
        if !(lambda.is_finite() && lambda >= 0.0) {
            return Err(Error::bad_value(
                "compressor option lambda",
                format!("{lambda}: expected a finite number >= 0"),
            ));
        }
        let iterations: usize = self.get("iterations", 100, "a whole number >= 1")?;
        if iterations == 0 {
            return Err(Error::bad_value(
                "compressor option iterations",
                "0: FL-CS reconstructs with at least one OWL-QN iteration",
            ));
        }
        Ok(Sketch {
            scheme,
            rate: self.rate,
            chunks,
            rows,
            seed: self.get("seed", 0, "an integer")?,
            lambda,
            iterations,
            error_feedback: self.get("error_feedback", scheme == Scheme::Cs, "true or false")?,
        })
    }
}

impl Compressor {
    /// These settings as a run's configuration holds them (`[compression]`'s `kind`, `rate`,
    /// `rank` and `options`; `TrainConfig::set_compressor`): a setting that differs from the
    /// command line's default becomes one `key=value` option, so `to_spec()?.compressor()`
    /// gives the same settings back (tested for every kind). A setting the kind does not
    /// read (a seed for FL-FREQ, say) is refused, naming it, as on the command line.
    ///
    /// ```
    /// use dpcomp::compress::{Compressor, Dgc};
    /// let dgc = Compressor::Dgc(Dgc { rate: 256.0, residual_decay: 0.0, ..Default::default() });
    /// let spec = dgc.to_spec()?;
    /// assert_eq!(spec.label(), "dgc x256 (error_feedback=false)");
    /// assert_eq!(spec.compressor()?, dgc);
    /// # Ok::<(), dpcomp::error::Error>(())
    /// ```
    pub fn to_spec(&self) -> Result<CompressorSpec> {
        self.validate()?;
        let mut options: Vec<String> = Vec::new();
        let mut set = |key: &str, value: String| options.push(format!("{key}={value}"));
        let (mut rate, mut rank) = (1.0, 1);
        match self {
            Compressor::Identity => {}
            Compressor::Dgc(d) => {
                let default = Dgc::default();
                rate = d.rate;
                sparsifier_options(
                    &mut set,
                    (d.value_bits, d.index_bits, d.topk, d.scope, d.budget),
                );
                if d.momentum != default.momentum {
                    set("momentum", d.momentum.to_string());
                }
                if d.masking != default.masking {
                    set("masking", d.masking.to_string());
                }
                if d.warmup_epochs != default.warmup_epochs {
                    set("warmup_epochs", d.warmup_epochs.to_string());
                }
                if d.warmup == Warmup::Reference {
                    set("warmup", "reference".into());
                }
                if d.dense_vectors != default.dense_vectors {
                    set("dense_vectors", d.dense_vectors.to_string());
                }
                residual_options(&mut set, d.residual_decay);
            }
            Compressor::PowerSgd(p) => {
                let default = PowerSgd::default();
                rank = p.rank;
                if p.shape == MatrixShape::Rows {
                    set("shape", "rows".into());
                }
                if p.min_rate != default.min_rate {
                    set("min_rate", p.min_rate.to_string());
                }
                if p.epsilon != default.epsilon {
                    set("epsilon", p.epsilon.to_string());
                }
                if p.warm_start != default.warm_start {
                    set("warm_start", p.warm_start.to_string());
                }
                if p.seed != default.seed {
                    set("seed", p.seed.to_string());
                }
                residual_options(&mut set, p.residual_decay);
            }
            Compressor::Denoise(d) => {
                let default = Denoise::default();
                rate = d.rate;
                sparsifier_options(
                    &mut set,
                    (d.value_bits, d.index_bits, d.topk, d.scope, d.budget),
                );
                if d.beta != default.beta {
                    set("beta", d.beta.to_string());
                }
                if d.decay != default.decay {
                    set("decay", d.decay.to_string());
                }
                if d.clip != default.clip {
                    set("clip", d.clip.to_string());
                }
            }
            Compressor::Sketch(s) => {
                let default = Sketch::new(s.scheme, s.rate);
                rate = s.rate;
                if let Some(chunks) = s.chunks {
                    set("chunks", chunks.to_string());
                }
                if s.rows == DctRows::Random {
                    set("rows", "random".into());
                }
                if s.seed != default.seed {
                    set("seed", s.seed.to_string());
                }
                if s.lambda != default.lambda {
                    set("lambda", s.lambda.to_string());
                }
                if s.iterations != default.iterations {
                    set("iterations", s.iterations.to_string());
                }
                if s.error_feedback != default.error_feedback {
                    set("error_feedback", s.error_feedback.to_string());
                }
            }
            Compressor::Qsgd(q) => {
                let default = Qsgd::default();
                if q.levels != default.levels {
                    set("levels", q.levels.to_string());
                }
                if q.bucket != default.bucket {
                    set("bucket", q.bucket.to_string());
                }
                if q.encoding == QsgdEncoding::Elias {
                    set("encoding", "elias".into());
                }
            }
            Compressor::RandomK(r) => {
                let default = RandomK::default();
                rate = r.rate;
                if r.seed != default.seed {
                    set("seed", r.seed.to_string());
                }
                if r.unbiased != default.unbiased {
                    set("unbiased", r.unbiased.to_string());
                }
                if r.error_feedback != default.error_feedback {
                    set("error_feedback", r.error_feedback.to_string());
                }
            }
            Compressor::Threshold(t) => {
                let default = Threshold::default();
                if t.threshold != default.threshold {
                    set("threshold", t.threshold.to_string());
                }
                if t.value_bits != 32 {
                    set("value_bits", t.value_bits.to_string());
                }
                if t.index_bits == IndexBits::Minimal {
                    set("index_bits", "min".into());
                }
                if t.error_feedback != default.error_feedback {
                    set("error_feedback", t.error_feedback.to_string());
                }
            }
            Compressor::Int8(i) => {
                if i.stochastic {
                    set("stochastic", "true".into());
                }
            }
            Compressor::TernGrad
            | Compressor::SignSgd
            | Compressor::EfSignSgd
            | Compressor::Fp16
            | Compressor::Bf16
            | Compressor::Natural => {}
        }
        CompressorSpec::new(self.kind(), rate, rank, &options)
    }
}

/// The options DGC and Denoise share, where they differ from the defaults.
fn sparsifier_options(
    set: &mut impl FnMut(&str, String),
    (value_bits, index_bits, topk, scope, budget): (u32, IndexBits, TopK, Scope, Budget),
) {
    if value_bits != 32 {
        set("value_bits", value_bits.to_string());
    }
    if index_bits == IndexBits::Minimal {
        set("index_bits", "min".into());
    }
    let ratio = match topk {
        TopK::Exact => {
            set("topk", "exact".into());
            None
        }
        TopK::Sampled { ratio } => {
            set("topk", "sampled".into());
            Some(ratio)
        }
        TopK::Auto { ratio } => Some(ratio),
    };
    if let Some(ratio) = ratio.filter(|&r| r != 0.01) {
        set("sample_ratio", ratio.to_string());
    }
    if scope == Scope::Model {
        set("scope", "model".into());
    }
    if budget == Budget::Elements {
        set("budget", "elements".into());
    }
}

/// γ as the options say it: 0 is `error_feedback=false`, 1 (the default) nothing.
fn residual_options(set: &mut impl FnMut(&str, String), residual_decay: f64) {
    if residual_decay == 0.0 {
        set("error_feedback", "false".into());
    } else if residual_decay != 1.0 {
        set("residual_decay", residual_decay.to_string());
    }
}

#[cfg(test)]
mod to_spec_tests {
    use super::*;

    /// Every kind, at its defaults and with every setting moved off its default, comes back
    /// from its configuration form unchanged.
    #[test]
    fn typed_settings_survive_the_configuration_form() {
        let changed_dgc = Dgc {
            rate: 256.0,
            value_bits: 16,
            index_bits: IndexBits::Minimal,
            momentum: 0.9,
            masking: false,
            warmup_epochs: 4,
            warmup: Warmup::Reference,
            topk: TopK::Sampled { ratio: 0.05 },
            scope: Scope::Model,
            budget: Budget::Elements,
            dense_vectors: true,
            residual_decay: 0.5,
        };
        let changed_powersgd = PowerSgd {
            rank: 16,
            shape: MatrixShape::Rows,
            min_rate: 0.0,
            epsilon: 1e-6,
            warm_start: false,
            seed: 7,
            residual_decay: 0.0,
        };
        let changed_denoise = Denoise {
            rate: 64.0,
            beta: 0.5,
            decay: 0.25,
            scope: Scope::Model,
            value_bits: 12,
            index_bits: IndexBits::Minimal,
            topk: TopK::Exact,
            clip: 5.0,
            budget: Budget::Elements,
        };
        let mut cs = Sketch::new(Scheme::Cs, 20.0);
        cs.chunks = Some(8);
        cs.rows = DctRows::Random;
        cs.seed = 3;
        cs.lambda = 0.05;
        cs.iterations = 7;
        cs.error_feedback = false;
        let mut rnd = Sketch::new(Scheme::Rnd, 10.0);
        rnd.error_feedback = true;
        let all = [
            Compressor::Identity,
            Compressor::Dgc(Dgc::default()),
            Compressor::Dgc(changed_dgc),
            Compressor::Dgc(Dgc {
                residual_decay: 0.0,
                ..Dgc::default()
            }),
            Compressor::Dgc(Dgc {
                topk: TopK::Sampled { ratio: 0.01 },
                ..Dgc::default()
            }),
            Compressor::Dgc(Dgc {
                topk: TopK::Auto { ratio: 0.05 },
                ..Dgc::default()
            }),
            Compressor::PowerSgd(PowerSgd::default()),
            Compressor::PowerSgd(changed_powersgd),
            Compressor::Denoise(Denoise::default()),
            Compressor::Denoise(changed_denoise),
            Compressor::Sketch(Sketch::new(Scheme::Freq, 5.0)),
            Compressor::Sketch(cs),
            Compressor::Sketch(rnd),
        ];
        for compressor in all {
            let spec = compressor.to_spec().unwrap();
            assert_eq!(spec.compressor().unwrap(), compressor, "{}", spec.label());
        }
        let spec = Compressor::Dgc(Dgc::default()).to_spec().unwrap();
        assert_eq!(
            (spec.kind, spec.rate, spec.options.len()),
            (CompressorKind::Dgc, 16.0, 0)
        );
    }

    #[test]
    fn a_setting_the_kind_does_not_read_is_refused() {
        let mut freq = Sketch::new(Scheme::Freq, 5.0);
        freq.seed = 9;
        let err = Compressor::Sketch(freq).to_spec().unwrap_err().to_string();
        assert!(
            err.contains("\"seed\" is not an option of fl-freq"),
            "{err}"
        );
        let err = Compressor::Dgc(Dgc {
            rate: 0.5,
            ..Dgc::default()
        })
        .to_spec()
        .unwrap_err()
        .to_string();
        assert!(err.contains("rate"), "{err}");
    }
}
