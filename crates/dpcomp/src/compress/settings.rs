//! A compressor's configuration form: the TOML table that `[compression]` of a run's
//! `config.toml`, a federated grid's `compressors` and the `--compressor-option KEY=VALUE`
//! flags (each value read as a TOML value) all give, `kind` and the kind's settings side by
//! side:
//!
//! ```toml
//! kind = "dgc"
//! rate = 256.0
//! budget = "elements"
//! error_feedback = false
//! ```
//!
//! serde reads each kind's settings into its own struct, so a key the kind does not read is
//! refused by name, with the keys it accepts, and an omitted setting takes its default: rate 1
//! (dense) and rank 1 where a kind has them, the rest the settings structs' `Default`. A few
//! settings are spelled as two keys, as the command line always spelled them: `topk` (auto,
//! sampled, exact) and `sample_ratio` make `TopK`; `error_feedback` and `residual_decay` make
//! DGC's and PowerSGD's γ (`error_feedback = false` is γ = 0).
//!
//! ```
//! use dpcomp::compress::{Compressor, Dgc};
//! use dpcomp::compress::encoding::Budget;
//! let dgc: Compressor = toml::from_str("kind = \"dgc\"\nrate = 256.0\nbudget = \"elements\"")?;
//! assert_eq!(dgc, Compressor::Dgc(Dgc { rate: 256.0, budget: Budget::Elements, ..Default::default() }));
//! assert_eq!(dgc.label(), "dgc x256 (budget=elements)");
//! let unknown = toml::from_str::<Compressor>("kind = \"dgc\"\nlevels = 4").unwrap_err();
//! assert!(unknown.to_string().contains("`levels` is not a setting of dgc; it accepts: rate, value_bits"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use super::cast::Int8;
use super::chunked_dct::DctRows;
use super::codec::Scope;
use super::compressor::Compressor;
use super::denoise::Denoise;
use super::dgc::{Dgc, Warmup};
use super::encoding::{Budget, IndexBits};
use super::kind::CompressorKind;
use super::linear_sketch::Scheme;
use super::powersgd::{MatrixShape, PowerSgd};
use super::qsgd::Qsgd;
use super::random_k::RandomK;
use super::sketched::Sketch;
use super::threshold::Threshold;
use super::topk::TopK;
use crate::error::{Error, Result};
use serde::de::{DeserializeOwned, Error as _};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The settings of a compressor, by their keys (`kind` left out).
pub type Settings = toml::Table;

/// The kinds that take no setting.
#[derive(Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct NoSettings {}

/// How `TopK` is chosen, as the `topk` key names it (with `sample_ratio` for the ratio).
#[derive(Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
enum TopKChoice {
    #[default]
    Auto,
    Sampled,
    Exact,
}

/// `TopK` as the keys `topk` and `sample_ratio` (an exact top-k keeps the default ratio).
fn topk_keys(topk: TopK) -> (TopKChoice, f64) {
    match topk {
        TopK::Auto { ratio } => (TopKChoice::Auto, ratio),
        TopK::Sampled { ratio } => (TopKChoice::Sampled, ratio),
        TopK::Exact => (TopKChoice::Exact, default_sample_ratio()),
    }
}

fn topk_of(choice: TopKChoice, ratio: f64) -> TopK {
    match choice {
        TopKChoice::Auto => TopK::Auto { ratio },
        TopKChoice::Sampled => TopK::Sampled { ratio },
        TopKChoice::Exact => TopK::Exact,
    }
}

fn default_sample_ratio() -> f64 {
    let TopK::Auto { ratio } = TopK::DEFAULT else {
        unreachable!("the default top-k is Auto")
    };
    ratio
}

/// γ as the keys `error_feedback` and `residual_decay`: 0 is `error_feedback = false`, 1 the
/// default (no `residual_decay`), anything between `residual_decay` alone.
fn residual_keys(residual_decay: f64) -> (bool, Option<f64>) {
    let feedback = residual_decay != 0.0;
    (
        feedback,
        (feedback && residual_decay != 1.0).then_some(residual_decay),
    )
}

/// γ from the keys; `error_feedback = false` with a γ other than 0 is a contradiction.
fn residual_of(error_feedback: bool, residual_decay: Option<f64>) -> Result<f64> {
    match (error_feedback, residual_decay) {
        (true, decay) => Ok(decay.unwrap_or(1.0)),
        (false, None) => Ok(0.0),
        (false, Some(0.0)) => Ok(0.0),
        (false, Some(decay)) => Err(Error::bad_value(
            "compression.residual_decay",
            format!(
                "{decay} with error_feedback = false, which keeps no residual: give one of the two"
            ),
        )),
    }
}

/// DGC's keys.
#[derive(Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct DgcKeys {
    rate: f64,
    value_bits: u32,
    index_bits: IndexBits,
    momentum: f64,
    masking: bool,
    warmup_epochs: usize,
    warmup: Warmup,
    topk: TopKChoice,
    sample_ratio: f64,
    scope: Scope,
    budget: Budget,
    dense_vectors: bool,
    error_feedback: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    residual_decay: Option<f64>,
}

impl Default for DgcKeys {
    fn default() -> Self {
        DgcKeys::from(&Dgc {
            rate: 1.0,
            ..Dgc::default()
        })
    }
}

impl From<&Dgc> for DgcKeys {
    fn from(d: &Dgc) -> Self {
        let (topk, sample_ratio) = topk_keys(d.topk);
        let (error_feedback, residual_decay) = residual_keys(d.residual_decay);
        DgcKeys {
            rate: d.rate,
            value_bits: d.value_bits,
            index_bits: d.index_bits,
            momentum: d.momentum,
            masking: d.masking,
            warmup_epochs: d.warmup_epochs,
            warmup: d.warmup,
            topk,
            sample_ratio,
            scope: d.scope,
            budget: d.budget,
            dense_vectors: d.dense_vectors,
            error_feedback,
            residual_decay,
        }
    }
}

impl DgcKeys {
    fn typed(self) -> Result<Dgc> {
        Ok(Dgc {
            rate: self.rate,
            value_bits: self.value_bits,
            index_bits: self.index_bits,
            momentum: self.momentum,
            masking: self.masking,
            warmup_epochs: self.warmup_epochs,
            warmup: self.warmup,
            topk: topk_of(self.topk, self.sample_ratio),
            scope: self.scope,
            budget: self.budget,
            dense_vectors: self.dense_vectors,
            residual_decay: residual_of(self.error_feedback, self.residual_decay)?,
        })
    }
}

/// PowerSGD's keys.
#[derive(Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct PowerSgdKeys {
    rank: i64,
    shape: MatrixShape,
    min_rate: f64,
    epsilon: f64,
    warm_start: bool,
    seed: i64,
    error_feedback: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    residual_decay: Option<f64>,
}

impl Default for PowerSgdKeys {
    fn default() -> Self {
        PowerSgdKeys::from(&PowerSgd::default())
    }
}

impl From<&PowerSgd> for PowerSgdKeys {
    fn from(p: &PowerSgd) -> Self {
        let (error_feedback, residual_decay) = residual_keys(p.residual_decay);
        PowerSgdKeys {
            rank: p.rank,
            shape: p.shape,
            min_rate: p.min_rate,
            epsilon: p.epsilon,
            warm_start: p.warm_start,
            seed: p.seed,
            error_feedback,
            residual_decay,
        }
    }
}

impl PowerSgdKeys {
    fn typed(self) -> Result<PowerSgd> {
        Ok(PowerSgd {
            rank: self.rank,
            shape: self.shape,
            min_rate: self.min_rate,
            epsilon: self.epsilon,
            warm_start: self.warm_start,
            seed: self.seed,
            residual_decay: residual_of(self.error_feedback, self.residual_decay)?,
        })
    }
}

/// Denoise's keys.
#[derive(Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct DenoiseKeys {
    rate: f64,
    beta: f64,
    decay: f64,
    scope: Scope,
    value_bits: u32,
    index_bits: IndexBits,
    topk: TopKChoice,
    sample_ratio: f64,
    clip: f64,
    budget: Budget,
}

impl Default for DenoiseKeys {
    fn default() -> Self {
        DenoiseKeys::from(&Denoise {
            rate: 1.0,
            ..Denoise::default()
        })
    }
}

impl From<&Denoise> for DenoiseKeys {
    fn from(d: &Denoise) -> Self {
        let (topk, sample_ratio) = topk_keys(d.topk);
        DenoiseKeys {
            rate: d.rate,
            beta: d.beta,
            decay: d.decay,
            scope: d.scope,
            value_bits: d.value_bits,
            index_bits: d.index_bits,
            topk,
            sample_ratio,
            clip: d.clip,
            budget: d.budget,
        }
    }
}

impl DenoiseKeys {
    fn typed(self) -> Denoise {
        Denoise {
            rate: self.rate,
            beta: self.beta,
            decay: self.decay,
            scope: self.scope,
            value_bits: self.value_bits,
            index_bits: self.index_bits,
            topk: topk_of(self.topk, self.sample_ratio),
            clip: self.clip,
            budget: self.budget,
        }
    }
}

/// FL-RND's keys: the coordinates' seed and the worker's residual.
#[derive(Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RndKeys {
    rate: f64,
    seed: u64,
    error_feedback: bool,
}

impl Default for RndKeys {
    fn default() -> Self {
        let s = Sketch::new(Scheme::Rnd, 1.0);
        RndKeys {
            rate: s.rate,
            seed: s.seed,
            error_feedback: s.error_feedback,
        }
    }
}

/// FL-FREQ's keys: the chunks (its first DCT rows are fixed).
#[derive(Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct FreqKeys {
    rate: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    chunks: Option<i64>,
}

impl Default for FreqKeys {
    fn default() -> Self {
        let s = Sketch::new(Scheme::Freq, 1.0);
        FreqKeys {
            rate: s.rate,
            chunks: s.chunks,
        }
    }
}

/// FL-CS's keys.
#[derive(Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct CsKeys {
    rate: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    chunks: Option<i64>,
    rows: DctRows,
    seed: u64,
    lambda: f64,
    iterations: usize,
    error_feedback: bool,
}

impl Default for CsKeys {
    fn default() -> Self {
        let s = Sketch::new(Scheme::Cs, 1.0);
        CsKeys {
            rate: s.rate,
            chunks: s.chunks,
            rows: s.rows,
            seed: s.seed,
            lambda: s.lambda,
            iterations: s.iterations,
            error_feedback: s.error_feedback,
        }
    }
}

/// `IndexBits` as `index_bits` gives it: 32 (also as the string "32") or "min".
impl Serialize for IndexBits {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            IndexBits::Fixed32 => s.serialize_i64(32),
            IndexBits::Minimal => s.serialize_str("min"),
        }
    }
}

impl<'de> Deserialize<'de> for IndexBits {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Given {
            Number(i64),
            Text(String),
        }
        match Given::deserialize(d)? {
            Given::Number(32) => Ok(IndexBits::Fixed32),
            Given::Text(t) if t == "32" => Ok(IndexBits::Fixed32),
            Given::Text(t) if t == "min" => Ok(IndexBits::Minimal),
            Given::Number(n) => Err(D::Error::custom(format!("{n}: expected 32 or min"))),
            Given::Text(t) => Err(D::Error::custom(format!("{t:?}: expected 32 or min"))),
        }
    }
}

/// The keys `T` reads, as serde's derive lists them (a deserializer that only records the
/// field names a struct asks for).
fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    struct Names(&'static [&'static str]);
    impl<'de> Deserializer<'de> for &mut Names {
        type Error = serde::de::value::Error;
        fn deserialize_any<V: serde::de::Visitor<'de>>(
            self,
            _: V,
        ) -> std::result::Result<V::Value, Self::Error> {
            Err(Self::Error::custom("only a struct's field names are read"))
        }
        fn deserialize_struct<V: serde::de::Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> std::result::Result<V::Value, Self::Error> {
            self.0 = fields;
            Err(Self::Error::custom("only a struct's field names are read"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }
    let mut names = Names(&[]);
    let _ = T::deserialize(&mut names);
    names.0
}

/// Every key `kind`'s table may hold besides `kind`, in its settings struct's order.
pub(crate) fn setting_keys(kind: CompressorKind) -> &'static [&'static str] {
    use CompressorKind as K;
    match kind {
        K::Dgc => field_names::<DgcKeys>(),
        K::Powersgd => field_names::<PowerSgdKeys>(),
        K::Denoise => field_names::<DenoiseKeys>(),
        K::FlRnd => field_names::<RndKeys>(),
        K::FlFreq => field_names::<FreqKeys>(),
        K::FlCs => field_names::<CsKeys>(),
        K::Qsgd => field_names::<Qsgd>(),
        K::Randomk => field_names::<RandomK>(),
        K::Threshold => field_names::<Threshold>(),
        K::Int8 => field_names::<Int8>(),
        K::Identity | K::Terngrad | K::Signsgd | K::EfSignsgd | K::Fp16 | K::Bf16 | K::Natural => {
            field_names::<NoSettings>()
        }
    }
}

/// The error for a key `kind` does not read, under `field` (`compression`, or the field of the
/// flag that gave the key): it names the key, the kind and what it accepts.
pub fn unknown_setting(field: &str, kind: CompressorKind, key: &str) -> Error {
    let accepted = setting_keys(kind);
    Error::bad_value(
        field,
        format!(
            "`{key}` is not a setting of {kind}; it accepts: {}",
            if accepted.is_empty() {
                "none (only `kind`)".to_string()
            } else {
                accepted.join(", ")
            }
        ),
    )
}

/// `kind` from the value of the `kind` key; an unknown one is refused, naming every kind.
pub fn kind_of(value: &toml::Value) -> Result<CompressorKind> {
    CompressorKind::deserialize(value.clone()).map_err(|_| {
        Error::bad_value(
            "compression.kind",
            format!(
                "{value}: expected one of {}",
                CompressorKind::ALL.map(CompressorKind::name).join(", ")
            ),
        )
    })
}

/// `kind`'s settings struct from its table; a value the struct cannot take is refused with its
/// key (each key tried alone to find the one at fault).
fn read<T: DeserializeOwned>(kind: CompressorKind, settings: Settings) -> Result<T> {
    T::deserialize(toml::Value::Table(settings.clone())).map_err(|e| {
        let culprit = settings.iter().find(|(key, value)| {
            let alone = Settings::from_iter([(key.to_string(), (*value).clone())]);
            T::deserialize(toml::Value::Table(alone)).is_err()
        });
        let what = e.message().trim_end();
        match culprit {
            Some((key, value)) => Error::bad_value(
                format!("compression.{key}"),
                format!("{value}: {what} ({kind})"),
            ),
            None => Error::bad_value("compression", format!("{kind}: {what}")),
        }
    })
}

fn write<T: Serialize>(keys: T) -> Settings {
    match toml::Value::try_from(keys) {
        Ok(toml::Value::Table(table)) => table,
        _ => unreachable!("a compressor's keys serialise to a table"),
    }
}

impl Compressor {
    /// The compressor of `kind` with `settings` (its keys, `kind` left out), checked
    /// (`validate`); a key `kind` does not read is refused by name.
    pub fn from_settings(kind: CompressorKind, settings: Settings) -> Result<Self> {
        if let Some(key) = settings
            .keys()
            .find(|k| !setting_keys(kind).contains(&k.as_str()))
        {
            return Err(unknown_setting("compression", kind, key));
        }
        use CompressorKind as K;
        let sketch = |scheme: Scheme, rate: f64| Sketch::new(scheme, rate);
        let compressor = match kind {
            K::Identity => Compressor::Identity,
            K::Dgc => Compressor::Dgc(read::<DgcKeys>(kind, settings)?.typed()?),
            K::Powersgd => Compressor::PowerSgd(read::<PowerSgdKeys>(kind, settings)?.typed()?),
            K::Denoise => Compressor::Denoise(read::<DenoiseKeys>(kind, settings)?.typed()),
            K::FlRnd => {
                let k: RndKeys = read(kind, settings)?;
                Compressor::Sketch(Sketch {
                    seed: k.seed,
                    error_feedback: k.error_feedback,
                    ..sketch(Scheme::Rnd, k.rate)
                })
            }
            K::FlFreq => {
                let k: FreqKeys = read(kind, settings)?;
                Compressor::Sketch(Sketch {
                    chunks: k.chunks,
                    ..sketch(Scheme::Freq, k.rate)
                })
            }
            K::FlCs => {
                let k: CsKeys = read(kind, settings)?;
                Compressor::Sketch(Sketch {
                    scheme: Scheme::Cs,
                    rate: k.rate,
                    chunks: k.chunks,
                    rows: k.rows,
                    seed: k.seed,
                    lambda: k.lambda,
                    iterations: k.iterations,
                    error_feedback: k.error_feedback,
                })
            }
            K::Qsgd => Compressor::Qsgd(read(kind, settings)?),
            K::Randomk => Compressor::RandomK(read(kind, settings)?),
            K::Threshold => Compressor::Threshold(read(kind, settings)?),
            K::Int8 => Compressor::Int8(read(kind, settings)?),
            K::Terngrad | K::Signsgd | K::EfSignsgd | K::Fp16 | K::Bf16 | K::Natural => {
                read::<NoSettings>(kind, settings)?;
                match kind {
                    K::Terngrad => Compressor::TernGrad,
                    K::Signsgd => Compressor::SignSgd,
                    K::EfSignsgd => Compressor::EfSignSgd,
                    K::Fp16 => Compressor::Fp16,
                    K::Bf16 => Compressor::Bf16,
                    _ => Compressor::Natural,
                }
            }
        };
        compressor.validated()
    }

    /// The compressor a table gives: `kind` and its settings. A missing or unknown `kind`
    /// is refused, naming the kinds.
    pub fn from_table(mut table: Settings) -> Result<Self> {
        let kind = match table.remove("kind") {
            Some(kind) => kind_of(&kind)?,
            None => {
                return Err(Error::bad_value(
                    "compression.kind",
                    format!(
                        "missing: expected one of {}",
                        CompressorKind::ALL.map(CompressorKind::name).join(", ")
                    ),
                ))
            }
        };
        Compressor::from_settings(kind, table)
    }

    /// Every setting of the compressor's kind under its key (`kind` left out). A sketch's
    /// settings that its scheme does not read (FL-FREQ's seed) are not among them
    /// (`unread_setting`).
    pub fn settings(&self) -> Settings {
        match self {
            Compressor::Identity
            | Compressor::TernGrad
            | Compressor::SignSgd
            | Compressor::EfSignSgd
            | Compressor::Fp16
            | Compressor::Bf16
            | Compressor::Natural => Settings::new(),
            Compressor::Dgc(d) => write(DgcKeys::from(d)),
            Compressor::PowerSgd(p) => write(PowerSgdKeys::from(p)),
            Compressor::Denoise(d) => write(DenoiseKeys::from(d)),
            Compressor::Sketch(s) => match s.scheme {
                Scheme::Rnd => write(RndKeys {
                    rate: s.rate,
                    seed: s.seed,
                    error_feedback: s.error_feedback,
                }),
                Scheme::Freq => write(FreqKeys {
                    rate: s.rate,
                    chunks: s.chunks,
                }),
                Scheme::Cs | Scheme::Std => write(CsKeys {
                    rate: s.rate,
                    chunks: s.chunks,
                    rows: s.rows,
                    seed: s.seed,
                    lambda: s.lambda,
                    iterations: s.iterations,
                    error_feedback: s.error_feedback,
                }),
            },
            Compressor::Qsgd(q) => write(q),
            Compressor::RandomK(r) => write(r),
            Compressor::Threshold(t) => write(t),
            Compressor::Int8(i) => write(i),
        }
    }

    /// The settings that differ from those of a table that names only the kind.
    pub fn changed_settings(&self) -> Settings {
        let defaults = Compressor::defaults_of(self.kind()).settings();
        self.settings()
            .into_iter()
            .filter(|(key, value)| defaults.get(key) != Some(value))
            .collect()
    }

    /// The compressor of a table that names only `kind`: every setting its default.
    pub fn defaults_of(kind: CompressorKind) -> Self {
        Compressor::from_settings(kind, Settings::new())
            .expect("every kind's defaults are valid settings")
    }

    /// A sketch's setting that its scheme does not read and that is not its default (FL-RND
    /// reads rate, seed and error_feedback; FL-FREQ rate and chunks; FL-CS all), by key: such a
    /// setting has no place in the configuration form, which would drop it.
    pub fn unread_setting(&self) -> Option<&'static str> {
        let Compressor::Sketch(s) = self else {
            return None;
        };
        let d = Sketch::new(s.scheme, s.rate);
        let differs = [
            ("chunks", s.chunks != d.chunks),
            ("rows", s.rows != d.rows),
            ("seed", s.seed != d.seed),
            ("lambda", s.lambda != d.lambda),
            ("iterations", s.iterations != d.iterations),
            ("error_feedback", s.error_feedback != d.error_feedback),
        ];
        let read = setting_keys(self.kind());
        differs
            .into_iter()
            .find(|(key, differs)| *differs && !read.contains(key))
            .map(|(key, _)| key)
    }
}

/// `kind`, then every setting.
impl Serialize for Compressor {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let settings = self.settings();
        let mut map = s.serialize_map(Some(settings.len() + 1))?;
        map.serialize_entry("kind", self.kind().name())?;
        for (key, value) in &settings {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

/// `kind` and any of its settings (`Compressor::from_table`).
impl<'de> Deserialize<'de> for Compressor {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let table = Settings::deserialize(d)?;
        Compressor::from_table(table).map_err(|e| D::Error::custom(e.to_string()))
    }
}

/// One `KEY=VALUE` of `--compressor-option` (or of a configuration's older `options` list),
/// the value read as TOML: `levels=4` an integer, `clip=3.0` a float, `error_feedback=false` a
/// boolean, and a value that is no TOML number, boolean or quoted string (`budget=elements`)
/// the string itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Setting {
    /// The setting's key.
    pub key: String,
    /// Its value.
    pub value: toml::Value,
}

impl std::str::FromStr for Setting {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, String> {
        let Some((key, value)) = text.split_once('=') else {
            return Err(format!("{text:?}: expected KEY=VALUE"));
        };
        let (key, value) = (key.trim(), value.trim());
        if key.is_empty() {
            return Err(format!("{text:?}: expected KEY=VALUE, the key before `=`"));
        }
        let parsed = toml::from_str::<toml::Table>(&format!("value = {value}"))
            .ok()
            .and_then(|mut t| t.remove("value"))
            .filter(|v| {
                matches!(
                    v,
                    toml::Value::String(_)
                        | toml::Value::Integer(_)
                        | toml::Value::Float(_)
                        | toml::Value::Boolean(_)
                )
            });
        Ok(Setting {
            key: key.to_string(),
            value: parsed.unwrap_or_else(|| toml::Value::String(value.to_string())),
        })
    }
}

impl Setting {
    /// Each `KEY=VALUE` of `texts` as a `Setting`; an error names `compression.options` (the
    /// `--compressor-option` flag).
    pub fn parse_all<S: AsRef<str>>(texts: &[S]) -> Result<Vec<Setting>> {
        texts
            .iter()
            .map(|t| {
                t.as_ref()
                    .parse()
                    .map_err(|e| Error::bad_value("compression.options", e))
            })
            .collect()
    }
}

impl std::fmt::Display for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.key, shown(&self.value))
    }
}

/// A setting's value as labels show it: a string bare (`elements`), anything else in TOML
/// notation (`3.0`, `16`, `false`).
pub fn shown(value: &toml::Value) -> String {
    match value {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::qsgd::QsgdEncoding;

    /// Every kind, at its defaults and with every setting moved off its default, comes back
    /// from its table unchanged.
    #[test]
    fn every_kind_survives_its_table() {
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
        let mut all = vec![
            Compressor::Dgc(Dgc::default()),
            Compressor::Dgc(changed_dgc),
            Compressor::Dgc(Dgc {
                residual_decay: 0.0,
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
            Compressor::Qsgd(Qsgd {
                levels: 4,
                bucket: 0,
                encoding: QsgdEncoding::Elias,
            }),
            Compressor::RandomK(RandomK {
                rate: 8.0,
                seed: 3,
                unbiased: true,
                error_feedback: false,
            }),
            Compressor::Threshold(Threshold {
                threshold: 0.5,
                value_bits: 12,
                index_bits: IndexBits::Minimal,
                error_feedback: false,
            }),
            Compressor::Int8(Int8 { stochastic: true }),
        ];
        all.extend(CompressorKind::ALL.map(Compressor::defaults_of));
        for compressor in all {
            let text = toml::to_string(&compressor).unwrap();
            let back: Compressor = toml::from_str(&text).unwrap();
            assert_eq!(back, compressor, "{text}");
            let mut changed = compressor.changed_settings();
            changed.insert("kind".into(), compressor.kind().name().into());
            assert_eq!(Compressor::from_table(changed).unwrap(), compressor);
        }
    }

    #[test]
    fn a_table_names_its_errors() {
        let error = |text: &str| toml::from_str::<Compressor>(text).unwrap_err().to_string();
        let e = error("kind = \"fl-freq\"\nseed = 3");
        assert!(
            e.contains("`seed` is not a setting of fl-freq; it accepts: rate, chunks"),
            "{e}"
        );
        let e = error("kind = \"terngrad\"\nrate = 2.0");
        assert!(
            e.contains("`rate` is not a setting of terngrad; it accepts: none"),
            "{e}"
        );
        let e = error("kind = \"dcg\"");
        assert!(
            e.contains("\"dcg\": expected one of identity, dgc, powersgd"),
            "{e}"
        );
        let e = error("rate = 2.0");
        assert!(
            e.contains("compression.kind: missing: expected one of identity"),
            "{e}"
        );
        let e = error("kind = \"qsgd\"\nlevels = \"many\"");
        assert!(
            e.contains("compression.levels: \"many\": invalid type: string \"many\""),
            "{e}"
        );
        let e = error("kind = \"dgc\"\nerror_feedback = false\nresidual_decay = 0.5");
        assert!(e.contains("residual_decay"), "{e}");
        let e = error("kind = \"dgc\"\nrate = 0.5");
        assert!(e.contains("compressor setting rate"), "{e}");
        let e = error("kind = \"dgc\"\nindex_bits = 16");
        assert!(e.contains("16: expected 32 or min"), "{e}");
    }

    #[test]
    fn a_flag_value_is_read_as_toml() {
        let value = |text: &str| text.parse::<Setting>().unwrap().value;
        assert_eq!(value("levels=4"), toml::Value::Integer(4));
        assert_eq!(value("clip=3.0"), toml::Value::Float(3.0));
        assert_eq!(value("error_feedback = false"), toml::Value::Boolean(false));
        assert_eq!(
            value("budget=elements"),
            toml::Value::String("elements".into())
        );
        assert_eq!(
            value("budget=\"elements\""),
            toml::Value::String("elements".into())
        );
        assert_eq!(
            "clip=3.0".parse::<Setting>().unwrap().to_string(),
            "clip=3.0"
        );
        assert!("levels"
            .parse::<Setting>()
            .unwrap_err()
            .contains("KEY=VALUE"));
        assert!("=4".parse::<Setting>().is_err());
    }

    #[test]
    fn a_sketchs_unread_setting_is_named() {
        let mut freq = Sketch::new(Scheme::Freq, 5.0);
        assert_eq!(Compressor::Sketch(freq).unread_setting(), None);
        freq.seed = 9;
        assert_eq!(Compressor::Sketch(freq).unread_setting(), Some("seed"));
        assert_eq!(Compressor::dgc(16.0).unread_setting(), None);
    }
}
