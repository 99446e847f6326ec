//! The run logs' floats in JSON, which has neither NaN nor infinity: readers that keep a diverged
//! run's NaN and a σ = 0 run's infinite ε readable (`metrics.jsonl`, `summary.json`,
//! `grad_error.jsonl`, the federated logs). Shared by the trainer, the analyses and the federated
//! code, so that none of them imports another for it.

use serde::Deserialize;

/// JSON has no NaN: serde_json writes a diverged run's NaN loss as `null`; read it back as NaN
/// so that the run's logs stay readable (resume, plots, analyses).
pub fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// ε in JSON: a number, "inf" when infinite (JSON has no infinity, and serde_json would write
/// `null`, which reads as "not private"), or null without privacy.
pub mod epsilon_json {
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes ε: a number, "inf", or null.
    pub fn serialize<S: Serializer>(value: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(e) if e.is_infinite() => s.serialize_str("inf"),
            Some(e) => s.serialize_f64(*e),
            None => s.serialize_none(),
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Stored {
        Number(f64),
        Text(String),
    }

    /// Reads ε: a number, "inf" (or "infinity"), or null.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        match Option::<Stored>::deserialize(d)? {
            None => Ok(None),
            Some(Stored::Number(e)) => Ok(Some(e)),
            Some(Stored::Text(t)) if matches!(t.as_str(), "inf" | "infinity" | "Infinity") => {
                Ok(Some(f64::INFINITY))
            }
            Some(Stored::Text(t)) => Err(serde::de::Error::custom(format!(
                "epsilon {t:?}: expected a number, \"inf\" or null"
            ))),
        }
    }
}

/// A plain (always present) ε in JSON: a number, or "inf" when infinite (σ 0), as `epsilon_json`
/// writes an optional one. Reads `null` as ∞ too: files written by older versions hold
/// serde_json's `null` for the infinite ε.
pub mod epsilon_f64 {
    use serde::{Deserializer, Serializer};

    /// Writes ε: a number, or "inf".
    pub fn serialize<S: Serializer>(value: &f64, s: S) -> Result<S::Ok, S::Error> {
        super::epsilon_json::serialize(&Some(*value), s)
    }

    /// Reads ε: a number, or "inf" or null as ∞.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(super::epsilon_json::deserialize(d)?.unwrap_or(f64::INFINITY))
    }
}
