//! Which compressor a run uses, by the name `--compressor` and `[compression]`'s `kind` give
//! it; its typed settings are `Compressor`.

use serde::{Deserialize, Serialize};

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

    /// The settings this compressor's `[compression]` table accepts besides `kind`, `rate`
    /// and `rank` (which have flags of their own): the keys of `--compressor-option`, read from
    /// the compressor's configuration form (`compress::settings`), for error messages and
    /// `--help`.
    pub fn keys(self) -> Vec<&'static str> {
        super::settings::setting_keys(self)
            .iter()
            .copied()
            .filter(|k| !matches!(*k, "rate" | "rank"))
            .collect()
    }
}

impl std::fmt::Display for CompressorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
