//! Federated learning with differential privacy and compressive sensing
//! (Kerkouche et al. 2021).
//!
//! One round (Algorithm 1, with Algorithm 3's server for FL-CS):
//!
//! ```text
//! server ──w_{t-1}──▶ clients sampled with probability C each (Poisson, what the accountant assumes)
//!   client k: T_gd local SGD steps ──Δw_k──▶ encode C(Δw_k) [m], sent as bytes (messages.rs)
//!             DP: clip the message to norm S (in the domain it is sent in)
//!   server:   y = Σ_k |D_k| C(Δw_k) / Σ_k |D_k|                          (no DP)
//!             y = (Σ_k clip_S(C(Δw_k)) + N(0, σ² S² I_m)) / (C N)          (DP: noise on the sum,
//!                                                         as after secure aggregation; fixed
//!                                                         denominator, so the sensitivity is S)
//!   FL-CS:    u = β u + y;  e = e + η u;  s = BPDN(e) (OWL-QN, per chunk);  e = e − C(s);  w += s
//!             (momentum u and error e of size m, in the compressed domain, as FetchSGD)
//!   others:   d = Cᵀ y (zero filling);  u = β u + d;  w += η u
//! ```
//!
//! The encodings are the compressors of `compress::sketched` (the client's `SketchEncoder`, the
//! server's `SketchDecoder`, which holds FL-CS's error e). For FL-RND and FL-FREQ, C Cᵀ = I, so
//! error feedback in the compressed domain is identically zero and is not kept; FL-RND's
//! coordinates change every round, so its momentum lives in the model's domain (for FL-STD and
//! FL-FREQ both domains give the same result by linearity). With `dgc` or `powersgd` as
//! `compression.kind` the server decodes each message and C is the identity above: clipping,
//! sum and noise on the n model coordinates.
//!
//! A run is built by name (`FederatedRun::builder`, `run.rs`) and goes through its parts in
//! order: `setup` (w₀, the clients' shards, the server's state, the run folder and a resume),
//! then per round `round` (the steps above), `evaluate` (the global model after the round) and
//! `record` (its row of `metrics.jsonl`, the checkpoint; the summary at the end). It reports to
//! its observers (`observer`) and writes nothing to stderr. What it trains is dpcomp's network
//! for the settings' dataset, or a model of one's own (any `Model`, whose trainable variables
//! are the vector w: a LoRA fine-tuning federates its adapters) on clients' data of one's own
//! (`task`, `FederatedRunBuilder::model` and `clients`).
//!
//! The settings speak `dpcomp train`'s vocabulary (`FlSettings::compression`, the
//! `[compression]` section: kind, rate n / m, rank, options); the paper's r = m / n is
//! 1 / rate, and cells and tables keep the paper's r as their label.

pub mod checkpoint;
pub mod client;
pub mod config_file;
pub mod data;
mod evaluate;
pub(crate) mod messages;
pub(crate) mod metrics;
pub mod model;
pub mod observer;
mod record;
mod round;
pub mod run;
mod setup;
pub mod sparsity;
mod task;

pub use record::{FlSummary, RoundMetrics};
pub use run::{FederatedRun, FederatedRunBuilder, FlOutcome};

use crate::compress::chunked_dct::DctRows;
use crate::compress::linear_sketch::Scheme;
use crate::compress::{Compressor, CompressorKind};
use crate::config::{AccountantKind, CompressionSettings, DeviceChoice};
use crate::data::partition::Partition;
use crate::error::{Error, Result};
use client::LocalTraining;
use data::FlDataset;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Client-level DP: every client's message is clipped to `clip` (S), and N(0, σ² S²) is added to
/// the sum of the sampled clients' messages.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FlPrivacy {
    /// S, in the domain messages are sent in (so it shrinks with a sketch's rate; see
    /// `default_clip`).
    pub clip: f64,
    /// σ.
    pub noise_multiplier: f64,
    /// δ of the reported (ε, δ).
    pub delta: f64,
    /// The accountant that turns (C, σ, rounds) into ε.
    #[serde(default)]
    pub accountant: AccountantKind,
}

/// A federated run's settings, saved as its folder's `config.toml` (`config_file`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlSettings {
    /// The data the clients hold.
    pub dataset: FlDataset,
    /// How the clients' messages are compressed, in `dpcomp train`'s `[compression]` form
    /// (`kind`, `rate` n / m, `rank`, `options`): `identity` is FL-STD (the whole update);
    /// `fl-rnd`, `fl-freq` and `fl-cs` are the paper's linear sketches, summed in the compressed
    /// domain (the paper's r = m / n is 1 / `rate`; options `chunks`, and for FL-CS `rows`,
    /// `lambda`, `iterations`); `dgc` and `powersgd` compress the whole update and the server
    /// decodes each message. Federated defaults: FL-CS at rate 10 (r 0.1), and FL-CS's
    /// `iterations` is `FL_CS_ITERATIONS` when not given; the sketch's seed comes from `seed`.
    /// `clip_noised` does not apply (refused). Read through `compressor`.
    pub compression: CompressionSettings,
    /// N.
    pub clients: usize,
    /// C, each client's probability of taking part in a round.
    pub fraction: f64,
    /// How the training examples are split among the clients.
    pub partition: Partition,
    /// Each client's local training in a round.
    pub local: LocalTraining,
    /// T_cl.
    pub rounds: usize,
    /// Stop after this many rounds without a better held-out metric (0: never).
    pub patience: usize,
    /// η, the server's step on the aggregated update (1: FedAvg).
    pub server_learning_rate: f64,
    /// β, the server's momentum (0: none).
    pub server_momentum: f64,
    /// Client-level DP (none: not private).
    pub privacy: Option<FlPrivacy>,
    /// Test examples, and validation examples, evaluated after each round (0: all).
    pub eval_examples: usize,
    /// Seed of the initial weights, the sampled clients, their batches, the sketch and the noise.
    pub seed: u64,
    /// Where the run computes.
    #[serde(default)]
    pub device: DeviceChoice,
    /// The network (`None`: the dataset's default, `FlData::default_net`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<model::FlNet>,
    /// Share of the training examples held out of every client as a validation split (0:
    /// none). With one, the summary reports beside the paper's "best over rounds on the test
    /// set" the round chosen on validation, its test metric and ε at that round, and
    /// early stopping (`patience`) watches validation.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub validation: f64,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

/// FL-CS's OWL-QN iterations per round in a federated run when `compression.options` does not
/// give `iterations` (a training run's sketch defaults to 100, `Sketch::new`).
pub const FL_CS_ITERATIONS: usize = 50;

/// The federated default rate of the sketches: n / m = 10, the paper's r = 0.1.
pub const DEFAULT_SKETCH_RATE: f64 = 10.0;

/// What the run's seed is XORed with to seed the sketch (coordinates, shuffle, random rows).
const SKETCH_SEED: u64 = 0x5eed;

/// The `compression` of one of the paper's schemes at `rate` (n / m; ignored by FL-STD, which
/// is `identity`), with FL-FREQ's and FL-CS's settings as options in a fixed order, each only
/// where it differs from the federated default: `chunks` P (FL-FREQ, FL-CS), `rows=random`,
/// `lambda` and `iterations` (FL-CS). Settings a scheme does not read are dropped, as the
/// federated round always ignored them; FL-FREQ with random rows has no compressor form and is
/// refused. The form experiment cells and older run folders' `config.json` take.
pub fn scheme_compression(
    scheme: Scheme,
    rate: f64,
    chunks: Option<i64>,
    rows: DctRows,
    lambda: f64,
    iterations: usize,
) -> Result<CompressionSettings> {
    let (kind, rate) = match scheme {
        Scheme::Std => (CompressorKind::Identity, 1.0),
        Scheme::Rnd => (CompressorKind::FlRnd, rate),
        Scheme::Freq => (CompressorKind::FlFreq, rate),
        Scheme::Cs => (CompressorKind::FlCs, rate),
    };
    let mut table = toml::Table::new();
    table.insert("kind".into(), kind.name().into());
    if kind != CompressorKind::Identity {
        table.insert("rate".into(), rate.into());
    }
    if let (Some(p), Scheme::Freq | Scheme::Cs) = (chunks, scheme) {
        table.insert("chunks".into(), p.into());
    }
    match (rows, scheme) {
        (DctRows::Random, Scheme::Cs) => {
            table.insert("rows".into(), "random".into());
        }
        (DctRows::Random, Scheme::Freq) => {
            return Err(Error::bad_value(
                "rows",
                "random: FL-FREQ keeps the first DCT rows (fl-freq has no `rows` option); random rows are FL-CS's",
            ))
        }
        _ => {}
    }
    if scheme == Scheme::Cs {
        if lambda != 0.01 {
            table.insert("lambda".into(), lambda.into());
        }
        if iterations != FL_CS_ITERATIONS {
            table.insert("iterations".into(), (iterations as i64).into());
        }
    }
    CompressionSettings::from_table(table)
}

impl FlSettings {
    /// A dataset's defaults (see `experiments/fl_cs.toml` for the experiment's settings).
    pub fn defaults(dataset: FlDataset) -> FlSettings {
        let (clients, fraction, local, rounds) = match dataset {
            FlDataset::FashionMnist => (
                1000,
                0.01,
                LocalTraining {
                    steps: 10,
                    batch: 20,
                    learning_rate: 0.05,
                },
                100,
            ),
            FlDataset::BreastCancer => (
                50,
                0.2,
                LocalTraining {
                    steps: 5,
                    batch: 0,
                    learning_rate: 0.5,
                },
                100,
            ),
            // 20 "hospitals" of about 315 patients, 4 a round; 5 full-batch GD steps.
            FlDataset::Flchain => (
                20,
                0.2,
                LocalTraining {
                    steps: 5,
                    batch: 0,
                    learning_rate: 0.5,
                },
                100,
            ),
        };
        FlSettings {
            dataset,
            compression: CompressionSettings::new(Compressor::sketch(
                Scheme::Cs,
                DEFAULT_SKETCH_RATE,
            )),
            clients,
            fraction,
            partition: Partition::Iid,
            local,
            rounds,
            patience: 0,
            server_learning_rate: 1.0,
            server_momentum: 0.0,
            privacy: None,
            eval_examples: 0,
            seed: 0,
            device: DeviceChoice::Cpu,
            model: None,
            validation: 0.0,
        }
    }

    /// Checks every setting; each error names the field and what it takes.
    pub fn validate(&self) -> Result<()> {
        let positive = |field: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(Error::bad_value(
                    field,
                    format!("{v}: expected a positive, finite number"),
                ))
            }
        };
        positive("local.learning_rate", self.local.learning_rate)?;
        positive("server_learning_rate", self.server_learning_rate)?;
        if !(0.0..1.0).contains(&self.server_momentum) {
            return Err(Error::bad_value(
                "server_momentum",
                format!("{}: expected 0 <= beta < 1", self.server_momentum),
            ));
        }
        if self.clients == 0 {
            return Err(Error::bad_value(
                "clients",
                "0: expected at least one client",
            ));
        }
        if !(0.0..0.5).contains(&self.validation) {
            return Err(Error::bad_value(
                "validation",
                format!(
                    "{}: expected a share of the training examples in [0, 0.5)",
                    self.validation
                ),
            ));
        }
        if !(self.fraction > 0.0 && self.fraction <= 1.0) {
            return Err(Error::bad_value(
                "fraction",
                format!("{}: expected 0 < C <= 1", self.fraction),
            ));
        }
        if self.rounds == 0 || self.local.steps == 0 {
            return Err(Error::bad_value(
                "rounds/local.steps",
                "expected at least one round and one local step",
            ));
        }
        // Every integer setting must fit the signed 64 bits TOML holds (the run folder's
        // settings are written before the first round) and the tensors' i64 sizes.
        let integers = [
            ("seed", self.seed),
            ("clients", self.clients as u64),
            ("rounds", self.rounds as u64),
            ("local.steps", self.local.steps as u64),
            ("local.batch", self.local.batch as u64),
            ("patience", self.patience as u64),
            ("eval_examples", self.eval_examples as u64),
        ];
        for (field, value) in integers {
            if value > i64::MAX as u64 {
                return Err(Error::bad_value(
                    field,
                    format!(
                        "{value}: expected at most {} (2^63 - 1: config.toml holds signed 64-bit integers)",
                        i64::MAX
                    ),
                ));
            }
        }
        self.validate_compression()?;
        if let Some(p) = &self.privacy {
            if !(p.clip > 0.0 && p.clip.is_finite()) {
                return Err(Error::bad_value(
                    "privacy.clip",
                    format!("{}: expected a positive, finite S", p.clip),
                ));
            }
            crate::privacy::validate(self.fraction, p.noise_multiplier, self.rounds as u64)?;
            // The server divides the noised sum by the expected number of clients q N: below
            // one client a round, the noise on the averaged update (σ S / (q N)) exceeds a whole
            // client's clipped update, and most rounds would average noise alone.
            let expected = self.fraction * self.clients as f64;
            if expected < 1.0 {
                // Tiny numbers in scientific notation (1e-300, not 300 digits).
                let short = |x: f64| match x {
                    x if x >= 1e-4 => format!("{x}"),
                    x => format!("{x:e}"),
                };
                let expected = match expected {
                    e if e >= 1e-3 => format!("{e:.3}"),
                    e => format!("{e:.3e}"),
                };
                return Err(Error::bad_value(
                    "fraction",
                    format!(
                        "{}: with {} clients a round expects {} clients (fraction x clients); \
                         client-level DP needs at least one (fraction >= 1 / clients = {}), as \
                         the noise on the average grows as 1 / (fraction x clients)",
                        short(self.fraction),
                        self.clients,
                        expected,
                        short(1.0 / self.clients as f64)
                    ),
                ));
            }
            crate::privacy::validate_delta(p.delta)?;
            // The PLD accountant's floor, checked before the first round instead of at its ε.
            if p.accountant == AccountantKind::Pld && p.delta < crate::privacy::pld::MIN_PLD_DELTA {
                return Err(Error::bad_value(
                    "privacy.delta",
                    format!(
                        "{:e}: the PLD accountant is accurate for delta >= {:e}; use \
                         `privacy.accountant` rdp for a smaller delta",
                        p.delta,
                        crate::privacy::pld::MIN_PLD_DELTA
                    ),
                ));
            }
        }
        Ok(())
    }

    /// `compression` as federated runs take it: a kind the round can aggregate, no
    /// `clip_noised`, and none of the sketch options the round sets itself.
    fn validate_compression(&self) -> Result<()> {
        let c = &self.compression;
        if c.kind() == CompressorKind::Denoise {
            return Err(Error::bad_value(
                "compression.kind",
                "denoise: federated runs take identity (FL-STD), fl-rnd, fl-freq, fl-cs, dgc or powersgd (denoise's receiver follows a single sender's velocity)",
            ));
        }
        // The families of training runs (QSGD, signSGD, ...) are not wired into the federated
        // round: its server neither counts random-k's rounds nor takes signSGD's majority vote.
        let federated = [
            CompressorKind::Identity,
            CompressorKind::FlRnd,
            CompressorKind::FlFreq,
            CompressorKind::FlCs,
            CompressorKind::Dgc,
            CompressorKind::Powersgd,
        ];
        if !federated.contains(&c.kind()) {
            return Err(Error::bad_value(
                "compression.kind",
                format!("{}: federated runs take identity (FL-STD), fl-rnd, fl-freq, fl-cs, dgc or powersgd; the other compressors run in `dpcomp train`", c.kind()),
            ));
        }
        if let Some(c2) = c.clip_noised {
            return Err(Error::bad_value(
                "compression.clip_noised",
                format!("{c2}: the second clipping of a training run's privatised update does not apply to federated runs, whose clients' messages are clipped to `privacy.clip`; leave it out"),
            ));
        }
        if c.verify_wire {
            return Err(Error::bad_value(
                "compression.verify_wire",
                "true: every federated message already goes through its bytes (`fl::messages`); leave it out",
            ));
        }
        if c.kind().is_sketch() {
            let reason = [
                ("seed", "the sketch's seed is derived from the run's `seed`"),
                (
                    "error_feedback",
                    "FL-CS keeps Algorithm 3's error on the server, and a client, sampled in few rounds, keeps no residual",
                ),
            ];
            for (key, why) in reason {
                if c.given.contains_key(key) {
                    return Err(Error::bad_value(
                        "compression.options",
                        format!("{key}: not an option of a federated {}: {why}", c.kind()),
                    ));
                }
            }
        }
        self.compressor().map(|_| ())
    }

    /// The round's scheme, from `compression.kind`: the sketches' own (FL-RND, FL-FREQ,
    /// FL-CS), and FL-STD for `identity` and for the compressors of whole updates (`dgc`,
    /// `powersgd`), whose messages the server decodes before the sum.
    pub fn scheme(&self) -> Scheme {
        match self.compression.kind() {
            CompressorKind::FlRnd => Scheme::Rnd,
            CompressorKind::FlFreq => Scheme::Freq,
            CompressorKind::FlCs => Scheme::Cs,
            _ => Scheme::Std,
        }
    }

    /// The paper's r = m / n of a sketch, 1 / `compression.rate` (what cells are named and
    /// figures are labelled by); 1 for FL-STD and for `dgc` and `powersgd`.
    pub fn paper_ratio(&self) -> f64 {
        if self.compression.kind().is_sketch() {
            1.0 / self.compression.rate()
        } else {
            1.0
        }
    }

    /// The typed compressor the round runs (`compression.compressor`, checked), with the
    /// federated defaults: FL-CS's `FL_CS_ITERATIONS` unless `iterations` is given, and the
    /// sketch's seed derived from `seed`.
    pub fn compressor(&self) -> Result<Compressor> {
        Ok(match self.compression.compressor.clone().validated()? {
            Compressor::Sketch(mut sketch) => {
                if !self.compression.given.contains_key("iterations") {
                    sketch.iterations = FL_CS_ITERATIONS;
                }
                sketch.seed = self.seed ^ SKETCH_SEED;
                Compressor::Sketch(sketch)
            }
            other => other,
        })
    }

    /// The label of the run's scheme in summaries and tables: "FL-STD", "FL-CS", "FL-CS (random
    /// rows)", "FL-STD dgc x16".
    pub fn scheme_label(&self) -> Result<String> {
        Ok(match self.compressor()? {
            Compressor::Identity => Scheme::Std.name().to_string(),
            Compressor::Sketch(s) if s.scheme == Scheme::Cs && s.rows == DctRows::Random => {
                "FL-CS (random rows)".to_string()
            }
            Compressor::Sketch(s) => s.scheme.name().to_string(),
            _ => format!("{} {}", Scheme::Std.name(), self.compression.label()),
        })
    }
}

/// Round `round`'s clients, each included independently with probability `fraction` (Poisson
/// sampling, which client-level DP's amplification assumes: the accountant is run at
/// q = fraction). Seeded by the run's seed and the round, so a run is reproducible.
pub fn sample_clients(seed: u64, round: usize, clients: usize, fraction: f64) -> Vec<usize> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(
        seed ^ (round as u64).wrapping_mul(0xA24B_AED4_963E_E407),
    );
    (0..clients)
        .filter(|_| rng.random::<f64>() < fraction)
        .collect()
}

/// The clip radius S in the sent domain from S₁, the radius for the whole update: S₁ √r, with
/// the paper's r = m / n = 1 / `rate` of a sketch. After the shared shuffle (FL-CS) or a random
/// subset (FL-RND) the update's energy spreads evenly over what is kept, so the message's norm
/// is about √r times the update's, and the same share of clients is clipped at every rate.
/// (FL-FREQ keeps low frequencies of unshuffled chunks, which may hold more than r of the
/// energy; it gets the same S, as the paper gives one S per ratio.) FL-STD, and the compressors
/// of whole updates (`scheme` std), keep S₁.
pub fn default_clip(full_clip: f64, scheme: Scheme, rate: f64) -> f64 {
    match scheme {
        Scheme::Std => full_clip,
        _ => full_clip * (1.0 / rate).sqrt(),
    }
}

/// S₁, the default clip radius of a whole update: about the median norm of a client's update in
/// the first rounds of a non-private FL-STD run with the dataset's defaults (`message_norm` in
/// metrics.jsonl of `dpcomp fl --compressor identity`: 1.1 falling to 0.45 over 10 rounds on Fashion-MNIST,
/// 0.99 falling to 0.28 on breast cancer), so that most clients are clipped early in training and
/// about half later.
pub fn default_full_clip(dataset: FlDataset) -> f64 {
    match dataset {
        FlDataset::FashionMnist => 0.5,
        FlDataset::BreastCancer => 0.5,
        // flchain: 0.30 then 0.15-0.19 over rounds 1-8 of FL-STD (20 hospitals, C 0.2).
        FlDataset::Flchain => 0.2,
    }
}

fn append_row(path: &Path, row: &RoundMetrics) -> Result<()> {
    let line = serde_json::to_string(row).expect("metrics serialise");
    crate::run_log::append_line(path, &line)
}

/// The first `rounds` rows of a run's `metrics.jsonl` for a resume: what follows them (rows of
/// rounds after the checkpoint, a last line cut short by a full disk) is not read, since those
/// rounds run again.
fn read_rows_up_to(path: &Path, rounds: usize) -> Result<Vec<RoundMetrics>> {
    crate::run_log::read_rows(path, rounds)?
        .ok_or_else(|| Error::io(path, std::io::Error::from(std::io::ErrorKind::NotFound)))
}

/// Discards the federated run in the dpcomp run folder `dir` (its checkpoint, logs and
/// summary), so that the next run there starts afresh: `dpcomp fl --restart`. A folder that is
/// not a dpcomp run folder is refused and left as it is.
pub fn clear_run(dir: &Path) -> Result<()> {
    crate::run_folder::clear(dir)
}

/// The rows of a run's `metrics.jsonl`.
pub fn read_rows(path: &Path) -> Result<Vec<RoundMetrics>> {
    read_rows_up_to(path, usize::MAX)
}

#[cfg(test)]
mod compression_tests {
    use super::*;

    /// Federated runs take `[compression]` as training does, except what does not apply to
    /// them: each refused by its name.
    #[test]
    fn what_does_not_apply_to_federated_runs_is_refused_by_name() {
        let mut settings = FlSettings::defaults(data::FlDataset::BreastCancer);
        settings.validate().unwrap();
        assert_eq!(settings.scheme(), Scheme::Cs);
        assert_eq!(settings.paper_ratio(), 0.1);
        let refused = |change: &dyn Fn(&mut FlSettings)| {
            let mut s = FlSettings::defaults(data::FlDataset::BreastCancer);
            change(&mut s);
            s.validate().unwrap_err().to_string()
        };
        let err = refused(&|s| s.compression.clip_noised = Some(5.0));
        assert!(err.starts_with("compression.clip_noised: 5:"), "{err}");
        let err = refused(&|s| s.compression.verify_wire = true);
        assert!(err.starts_with("compression.verify_wire: true:"), "{err}");
        let err = refused(&|s| {
            s.compression = CompressionSettings::new(Compressor::Denoise(Default::default()))
        });
        assert!(err.starts_with("compression.kind: denoise"), "{err}");
        let err = refused(&|s| {
            s.compression = toml::from_str("kind = \"fl-cs\"\nrate = 10.0\nseed = 3").unwrap()
        });
        assert!(err.starts_with("compression.options: seed"), "{err}");
        let err = refused(&|s| {
            s.compression = CompressionSettings::new(Compressor::sketch(Scheme::Cs, 0.5))
        });
        assert!(err.starts_with("compressor setting rate: 0.5"), "{err}");
        let err = refused(&|s| s.seed = u64::MAX);
        assert!(err.starts_with("seed:"), "{err}");
        // FL-CS's federated default of 50 OWL-QN iterations, unless given.
        let Compressor::Sketch(sketch) = settings.compressor().unwrap() else {
            panic!("fl-cs is a sketch")
        };
        assert_eq!((sketch.iterations, sketch.seed), (FL_CS_ITERATIONS, 0x5eed));
        settings.compression =
            toml::from_str("kind = \"fl-cs\"\nrate = 10.0\niterations = 100\nrows = \"random\"")
                .unwrap();
        let Compressor::Sketch(sketch) = settings.compressor().unwrap() else {
            panic!("fl-cs is a sketch")
        };
        assert_eq!(sketch.iterations, 100);
        assert_eq!(settings.scheme_label().unwrap(), "FL-CS (random rows)");
        settings.compression = CompressionSettings::new(Compressor::dgc(16.0));
        assert_eq!(settings.scheme(), Scheme::Std);
        assert_eq!(settings.paper_ratio(), 1.0);
        assert_eq!(settings.scheme_label().unwrap(), "FL-STD dgc x16");
    }
}
