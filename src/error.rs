//! The library's error type. The binary wraps these in `anyhow` for context; every variant names
//! the file, record, field or flag that was wrong and what was expected.

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
    /// Another process holds the run folder's lock (`run_lock`).
    #[error(
        "{}: in use by another dpcomp process ({owner}; lock file {}/.lock): wait for it to finish or choose another --out",
        dir.display(),
        dir.display()
    )]
    RunInUse { dir: PathBuf, owner: String },
    #[error(transparent)]
    Torch(#[from] tch::TchError),
    /// Download or archive problems in `dpcomp data fetch`.
    #[error("{0}")]
    Fetch(String),
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
