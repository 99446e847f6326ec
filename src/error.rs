//! The library's error type. The binary wraps these in `anyhow` for context; every variant names
//! the file, record or field that was wrong and what was expected. Fields are the library's
//! names (`TrainConfig`'s and the settings structs' fields, as TOML spells them); a field named
//! inside a message is written in backticks, so the command line can show it as its flag.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The OS error is part of the message and deliberately not a `source()`: reporters that
    /// print the chain (anyhow's `{:#}`) would otherwise print it twice.
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    /// A data or model file whose content is not what its format promises.
    #[error("{path}: {what}")]
    BadFile { path: PathBuf, what: String },
    /// A configuration value, flag or option outside its allowed range.
    #[error("{field}: {what}")]
    BadValue { field: String, what: String },
    /// A resume given settings that differ from the run's `config.toml` in fields that may not
    /// change (the checkpoint and the accountant's history were made with the saved ones).
    #[error(
        "{}: trained with other settings; only {} may change on resume ({})",
        run_dir.display(),
        may_change.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>().join(", "),
        conflicts.iter().map(|c| format!("`{}`: the run has {}, given {}", c.field, c.saved, c.given)).collect::<Vec<_>>().join("; ")
    )]
    ResumeConflict {
        run_dir: PathBuf,
        may_change: Vec<String>,
        conflicts: Vec<SettingConflict>,
    },
    /// Another process holds the run folder's lock (`run_lock`).
    #[error(
        "{}: in use by another dpcomp process ({owner}; lock file {}/.lock): wait for it to finish or choose another run folder",
        dir.display(),
        dir.display()
    )]
    RunInUse { dir: PathBuf, owner: String },
    /// A collective between the workers of a data-parallel run failed or timed out, or the
    /// ranks disagree (`comm`).
    #[error("rank {rank} of {size}: {what}")]
    Comm {
        rank: usize,
        size: usize,
        what: String,
    },
    #[error(transparent)]
    Torch(#[from] tch::TchError),
    /// Download or archive problems in `dpcomp data fetch`.
    #[error("{0}")]
    Fetch(String),
}

/// One setting whose resumed value differs from the run's: its field name and both values as
/// TOML writes them.
#[derive(Debug, Clone, PartialEq)]
pub struct SettingConflict {
    pub field: String,
    pub saved: String,
    pub given: String,
}

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            error: source,
        }
    }
    pub fn bad_file(path: impl Into<PathBuf>, what: impl Into<String>) -> Self {
        Error::BadFile {
            path: path.into(),
            what: what.into(),
        }
    }
    pub fn bad_value(field: impl Into<String>, what: impl Into<String>) -> Self {
        Error::BadValue {
            field: field.into(),
            what: what.into(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
