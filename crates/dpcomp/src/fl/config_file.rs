//! A federated run's settings in its folder: `config.toml`, the `FlSettings` in TOML as a
//! training run's `config.toml` holds its `TrainConfig`. Folders written by older versions hold
//! `config.json` instead, with the federated round's own names for the compressor (`scheme`,
//! `ratio` r = m / n, `chunks`, `rows`, `lambda`, `owlqn_iterations`, `compressor`): it is read
//! when the folder has no `config.toml`, its names migrated to `compression` (`migrate_json`),
//! and a run that continues in such a folder writes `config.toml` in its place.

use super::{scheme_compression, FlSettings, FL_CS_ITERATIONS};
use crate::compress::chunked_dct::DctRows;
use crate::compress::linear_sketch::Scheme;
use crate::compress::CompressorKind;
use crate::config::CompressionSettings;
use crate::error::{Error, Result};
use serde::Deserialize;
use std::path::Path;

/// The settings file of a federated run folder.
pub const CONFIG_FILE: &str = "config.toml";

/// The settings file of federated run folders written before `config.toml`, still read.
pub const LEGACY_CONFIG_FILE: &str = "config.json";

/// The settings the federated run in `dir` recorded: its `config.toml`, else the `config.json`
/// of an older run (migrated, `from_json`); `None` when the folder has neither. A file that
/// cannot be read as settings is an error naming it.
pub fn read(dir: &Path) -> Result<Option<FlSettings>> {
    let path = dir.join(CONFIG_FILE);
    if path.is_file() {
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        return toml::from_str(&text)
            .map(Some)
            .map_err(|e| Error::bad_file(&path, e.to_string()));
    }
    let path = dir.join(LEGACY_CONFIG_FILE);
    if path.is_file() {
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        return from_json(&text)
            .map(Some)
            .map_err(|what| Error::bad_file(&path, what));
    }
    Ok(None)
}

/// Writes `settings` as `dir/config.toml` (all of it or nothing, `run_folder::replace`) and
/// removes the folder's older `config.json`, whose settings it replaces.
pub fn write(dir: &Path, settings: &FlSettings) -> Result<()> {
    let text = toml::to_string(settings)
        .map_err(|e| Error::bad_value("settings", format!("cannot be written as TOML: {e}")))?;
    crate::run_folder::replace(&dir.join(CONFIG_FILE), text.as_bytes())?;
    let legacy = dir.join(LEGACY_CONFIG_FILE);
    match std::fs::remove_file(&legacy) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(&legacy, e)),
        _ => Ok(()),
    }
}

/// Settings from the text of a `config.json`: the older names it was written with
/// migrated (`migrate_json`), or `FlSettings`' own JSON form as it is. The error says what is
/// wrong with the text.
pub fn from_json(text: &str) -> std::result::Result<FlSettings, String> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    serde_json::from_value(migrate_json(value)?).map_err(|e| e.to_string())
}

/// The `compressor` of an older `config.json` (DGC or PowerSGD with `scheme` std).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEraCompressor {
    kind: CompressorKind,
    #[serde(default = "one")]
    rate: f64,
    #[serde(default = "one_rank")]
    rank: i64,
    #[serde(default)]
    options: Vec<String>,
}

fn one() -> f64 {
    1.0
}

fn one_rank() -> i64 {
    1
}

/// Names older versions wrote into `config.json`, each replaced by `compression`.
pub const JSON_ERA_FIELDS: [&str; 7] = [
    "scheme",
    "ratio",
    "chunks",
    "rows",
    "lambda",
    "owlqn_iterations",
    "compressor",
];

/// A federated run's settings as JSON, with the fields older versions wrote
/// (`JSON_ERA_FIELDS`) replaced by the `compression` they meant: `scheme` std is `identity`,
/// or its `compressor` (DGC, PowerSGD) as it was; rnd, freq and cs are `fl-rnd`, `fl-freq`
/// and `fl-cs` at rate 1 / `ratio`, with `chunks`, `rows`, `lambda` and `owlqn_iterations`
/// as options where the scheme read them and they differ from the federated defaults
/// (`scheme_compression`), so that the settings equal those a grid cell or `dpcomp fl` forms
/// today. A value without those fields is returned as it is.
pub fn migrate_json(value: serde_json::Value) -> std::result::Result<serde_json::Value, String> {
    let serde_json::Value::Object(mut map) = value else {
        return Err("expected the settings as a JSON object".to_string());
    };
    let given: Vec<&str> = JSON_ERA_FIELDS
        .into_iter()
        .filter(|f| map.contains_key(*f))
        .collect();
    if given.is_empty() {
        return Ok(serde_json::Value::Object(map));
    }
    if map.contains_key("compression") {
        return Err(format!(
            "holds `compression` and the older {}: expected one form",
            given.join(", ")
        ));
    }
    fn field<T: serde::de::DeserializeOwned>(
        map: &mut serde_json::Map<String, serde_json::Value>,
        key: &str,
        default: T,
    ) -> std::result::Result<T, String> {
        match map.remove(key) {
            None | Some(serde_json::Value::Null) => Ok(default),
            Some(v) => serde_json::from_value(v).map_err(|e| format!("{key}: {e}")),
        }
    }
    let scheme: Scheme = match map.remove("scheme") {
        Some(v) => serde_json::from_value(v).map_err(|e| format!("scheme: {e}"))?,
        None => return Err(format!("{} without `scheme`", given.join(", "))),
    };
    let ratio: f64 = field(&mut map, "ratio", 1.0)?;
    let chunks: Option<i64> = field(&mut map, "chunks", None)?;
    let rows: DctRows = field(&mut map, "rows", DctRows::First)?;
    let lambda: f64 = field(&mut map, "lambda", 0.01)?;
    let iterations: usize = field(&mut map, "owlqn_iterations", FL_CS_ITERATIONS)?;
    let compressor: Option<JsonEraCompressor> = field(&mut map, "compressor", None)?;
    let compression = match (scheme, compressor) {
        (Scheme::Std, Some(c)) => CompressionSettings::from_table(toml::Table::from_iter([
            ("kind".to_string(), toml::Value::from(c.kind.name())),
            ("rate".to_string(), c.rate.into()),
            ("rank".to_string(), c.rank.into()),
            ("options".to_string(), c.options.into()),
        ]))
        .map_err(|e| format!("compressor: {e}"))?,
        (scheme, Some(c)) => {
            return Err(format!(
                "compressor {} with scheme {}: a compressor ran with scheme std only",
                c.kind,
                scheme.name()
            ))
        }
        (Scheme::Std, None) => CompressionSettings::default(),
        (scheme, None) => {
            if !(ratio > 0.0 && ratio <= 1.0) {
                return Err(format!("ratio: {ratio}: expected 0 < r <= 1"));
            }
            scheme_compression(scheme, 1.0 / ratio, chunks, rows, lambda, iterations)
                .map_err(|e| e.to_string())?
        }
    };
    let compression = serde_json::to_value(compression).map_err(|e| e.to_string())?;
    map.insert("compression".to_string(), compression);
    Ok(serde_json::Value::Object(map))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fl::data::FlDataset;

    /// Today's settings with the older JSON names in place of `compression`.
    fn json_era(settings: &FlSettings, old: serde_json::Value) -> String {
        let mut value = serde_json::to_value(settings).unwrap();
        let map = value.as_object_mut().unwrap();
        map.remove("compression");
        map.extend(old.as_object().unwrap().clone());
        serde_json::to_string(&value).unwrap()
    }

    #[test]
    fn json_era_names_become_the_compression_they_meant() {
        let base = FlSettings::defaults(FlDataset::BreastCancer);
        let fields = |scheme: &str, ratio: f64, chunks: Option<i64>, rows: &str, lambda: f64| {
            serde_json::json!({"scheme": scheme, "ratio": ratio, "chunks": chunks, "rows": rows,
                "lambda": lambda, "owlqn_iterations": 50})
        };
        // FL-CS with every setting off its default: options in `scheme_compression`'s order.
        let cs = from_json(&json_era(&base, fields("cs", 0.05, Some(8), "random", 0.1))).unwrap();
        let c = &cs.compression;
        assert_eq!((c.kind(), c.rate()), (CompressorKind::FlCs, 20.0));
        assert_eq!(c.to_table().to_string(), "chunks = 8\nkind = \"fl-cs\"\nlambda = 0.1\nrate = 20.0\nrows = \"random\"\nverify_wire = false\n");
        // What a scheme never read is dropped; FL-STD is identity whatever its ratio said.
        let rnd = from_json(&json_era(&base, fields("rnd", 0.2, Some(8), "first", 0.1))).unwrap();
        assert_eq!(rnd.compression.kind(), CompressorKind::FlRnd);
        assert_eq!(
            rnd.compression.compressor,
            crate::compress::Compressor::sketch(Scheme::Rnd, 5.0)
        );
        let std = from_json(&json_era(&base, fields("std", 0.1, None, "first", 0.01))).unwrap();
        assert_eq!(std.compression, CompressionSettings::default());
        // DGC of the whole update, as `compressor` beside `scheme` std.
        let mut dgc = fields("std", 1.0, None, "first", 0.01);
        dgc["compressor"] = serde_json::json!({"kind": "dgc", "rate": 16.0,
            "options": ["error_feedback=false"]});
        let dgc = from_json(&json_era(&base, dgc)).unwrap();
        assert_eq!(dgc.compression.label(), "dgc x16 (error_feedback=false)");
        // Today's JSON form reads as it is; both forms at once, or FL-FREQ with random rows
        // (no compressor form), are refused naming what is wrong.
        assert_eq!(from_json(&serde_json::to_string(&cs).unwrap()).unwrap(), cs);
        let mut both = serde_json::to_value(&cs).unwrap();
        both["ratio"] = serde_json::json!(0.1);
        let err = from_json(&both.to_string()).unwrap_err();
        assert!(err.contains("`compression` and the older ratio"), "{err}");
        let err =
            from_json(&json_era(&base, fields("freq", 0.1, None, "random", 0.01))).unwrap_err();
        assert!(err.contains("rows: random"), "{err}");
    }

    #[test]
    fn config_toml_is_written_read_back_and_replaces_config_json() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read(dir.path()).unwrap().is_none());
        let mut settings = FlSettings::defaults(FlDataset::Flchain);
        settings.compression =
            toml::from_str("kind = \"fl-cs\"\nrate = 10.0\nrows = \"random\"\niterations = 7")
                .unwrap();
        settings.privacy = Some(crate::fl::FlPrivacy {
            clip: 0.1,
            noise_multiplier: 1.3,
            delta: 1e-5,
            accountant: Default::default(),
        });
        settings.validation = 0.1;
        std::fs::write(dir.path().join(LEGACY_CONFIG_FILE), "{}").unwrap();
        write(dir.path(), &settings).unwrap();
        assert!(!dir.path().join(LEGACY_CONFIG_FILE).exists());
        let text = std::fs::read_to_string(dir.path().join(CONFIG_FILE)).unwrap();
        assert!(
            text.contains(
                "[compression]\nkind = \"fl-cs\"\niterations = 7\nrate = 10.0\nrows = \"random\"\n"
            ),
            "{text}"
        );
        assert_eq!(read(dir.path()).unwrap(), Some(settings));
        std::fs::write(dir.path().join(CONFIG_FILE), "rounds = \"many\"").unwrap();
        let err = read(dir.path()).unwrap_err().to_string();
        assert!(err.contains("config.toml"), "{err}");
    }
}
