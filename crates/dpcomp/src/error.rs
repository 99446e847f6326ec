//! The library's error type. The binary wraps these in `anyhow` for context; every variant names
//! the file, record or field that was wrong and what was expected. Fields are the library's
//! names (`TrainConfig`'s and the settings structs' fields, as TOML spells them); a field named
//! inside a message is written in backticks, so the command line can show it as its flag.

use std::path::PathBuf;

/// Every error the library returns. `Display` gives one line naming the file, field or rank
/// that was wrong; match on the variant to react to a kind of failure (for example
/// [`Error::ResumeConflict`] to list the settings that may change on resume).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or folder could not be read, written or created.
    ///
    /// The OS error is part of the message and deliberately not a `source()`: reporters that
    /// print the chain (anyhow's `{:#}`) would otherwise print it twice.
    #[error("{path}: {error}")]
    Io {
        /// The file or folder the operation was on.
        path: PathBuf,
        /// What the operating system reported.
        error: std::io::Error,
    },
    /// A data or model file whose content is not what its format promises.
    #[error("{path}: {what}")]
    BadFile {
        /// The file that was read.
        path: PathBuf,
        /// What was wrong in it (record, offset or key, and what was expected).
        what: String,
    },
    /// A configuration value, flag or option outside its allowed range.
    #[error("{field}: {what}")]
    BadValue {
        /// The setting's name as the library spells it (`TrainConfig`'s or a settings
        /// struct's field, `privacy.delta` style for nested ones).
        field: String,
        /// The allowed range or form, and the value given.
        what: String,
    },
    /// A resume given settings that differ from the run's `config.toml` in fields that may not
    /// change (the checkpoint and the accountant's history were made with the saved ones).
    #[error(
        "{}: trained with other settings; only {} may change on resume ({})",
        run_dir.display(),
        may_change.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>().join(", "),
        conflicts.iter().map(|c| format!("`{}`: the run has {}, given {}", c.field, c.saved, c.given)).collect::<Vec<_>>().join("; ")
    )]
    ResumeConflict {
        /// The run folder whose `config.toml` was compared.
        run_dir: PathBuf,
        /// The fields that a resume may change (a training's `train::RESUME_MAY_CHANGE`: epochs,
        /// data folder, device; a federated run's: rounds, device).
        may_change: Vec<String>,
        /// Every field that differs, with the saved and the given value.
        conflicts: Vec<SettingConflict>,
    },
    /// Another process holds the run folder's lock (`run_lock`).
    #[error(
        "{}: in use by another dpcomp process ({owner}; lock file {}/.lock): wait for it to finish or choose another run folder",
        dir.display(),
        dir.display()
    )]
    RunInUse {
        /// The run folder that is locked.
        dir: PathBuf,
        /// The lock holder as its lock file describes it (`pid P on HOST since TIME`).
        owner: String,
    },
    /// A collective between the workers of a data-parallel run failed or timed out, or the
    /// ranks disagree (`comm`).
    #[error("rank {rank} of {size}: {what}")]
    Comm {
        /// The rank (0-based worker index) that saw the failure.
        rank: usize,
        /// The number of workers W in the run.
        size: usize,
        /// The collective that failed and how.
        what: String,
    },
    /// An error LibTorch raised (a shape mismatch, an unavailable device, a bad tensor file).
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
    /// The field's name, as in `config.toml` (`privacy.noise_multiplier`).
    pub field: String,
    /// The value the run was trained with, as TOML writes it.
    pub saved: String,
    /// The value given to the resume, as TOML writes it.
    pub given: String,
}

impl Error {
    /// An [`Error::Io`] on `path`: `std::fs::read(p).map_err(|e| Error::io(p, e))?`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            error: source,
        }
    }
    /// An [`Error::BadFile`]: `path` exists but its content is not what its format promises.
    pub fn bad_file(path: impl Into<PathBuf>, what: impl Into<String>) -> Self {
        Error::BadFile {
            path: path.into(),
            what: what.into(),
        }
    }
    /// An [`Error::BadValue`]: the setting `field` is outside its range; `what` says the range
    /// and the value given.
    pub fn bad_value(field: impl Into<String>, what: impl Into<String>) -> Self {
        Error::BadValue {
            field: field.into(),
            what: what.into(),
        }
    }
}

/// `std::result::Result` with the library's [`Error`] as its default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
