//! A run's logs, `metrics.jsonl` and `grad_error.jsonl`: one JSON row a line, appended while the
//! run trains. Once the run has finished its logs may be packed: `X.jsonl` becomes
//! `X.jsonl.gz`, the same bytes gzip-compressed (about a quarter of the size). The committed
//! grid cells under `experiments/runs/` keep their logs packed.
//!
//! Every reader of a log goes through [`read_text`] (or [`read_rows`]), which opens `X.jsonl`,
//! or else `X.jsonl.gz`: the plain file is the log whenever it exists. Writers keep the plain
//! form: [`append_line`] to a packed log first brings the plain file back ([`unpack`]), and
//! `run_folder::replace` of a log removes its packed copy, so that a packed run that is resumed
//! (to more epochs or rounds) goes on appending plain rows.
//!
//! [`pack_run`] packs the logs of one finished run folder (one holding dpcomp's `summary.json`,
//! whose lock no process holds); [`pack_below`] every such folder below a folder. `dpcomp grid`
//! packs each cell when it finishes, `dpcomp pack FOLDER` the run folders below a folder. A
//! packed file never replaces a file dpcomp did not write: a log is packed only when it reads as
//! dpcomp's rows, and an `X.jsonl.gz` already beside it is never overwritten.

use crate::error::{Error, Result};
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use serde::de::DeserializeOwned;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// The logs a run appends to, by their plain names.
pub const LOGS: [&str; 2] = ["metrics.jsonl", "grad_error.jsonl"];

/// What packing appends to a log's name: `metrics.jsonl` is packed as `metrics.jsonl.gz`.
pub const PACKED_SUFFIX: &str = ".gz";

/// The packed form of the log `path`: `X.jsonl` -> `X.jsonl.gz` beside it.
pub fn packed_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(PACKED_SUFFIX);
    path.with_file_name(name)
}

/// Whether `path` names one of the `LOGS` (the plain form), whose packed copy `replace` and
/// `append_line` keep in step.
pub fn is_log(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| LOGS.contains(&n))
}

/// The decompressed text of the gzip file `path`; `Ok(None)` when it does not exist. An error
/// names the file: unreadable, not gzip, or not UTF-8 text.
pub fn read_packed(path: &Path) -> Result<Option<String>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    };
    let mut text = String::new();
    GzDecoder::new(bytes.as_slice())
        .read_to_string(&mut text)
        .map_err(|e| {
            Error::bad_file(
                path,
                format!("expected a gzip-compressed log of UTF-8 text ({e})"),
            )
        })?;
    Ok(Some(text))
}

/// The text of the log `path` (`<run>/X.jsonl`) and the file it came from: `X.jsonl` when it
/// exists, else `X.jsonl.gz` decompressed; `Ok(None)` when neither exists. Reads only, so it is
/// safe on a log another process is appending to or packing.
pub fn read_text(path: &Path) -> Result<Option<(PathBuf, String)>> {
    match std::fs::read_to_string(path) {
        Ok(text) => return Ok(Some((path.to_path_buf(), text))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(path, e)),
    }
    let packed = packed_path(path);
    match read_packed(&packed)? {
        Some(text) => Ok(Some((packed, text))),
        // Packed and its plain file removed between the two reads: the plain file was renamed
        // away only after the packed one was in place, so one of them is there now.
        None => match std::fs::read_to_string(path) {
            Ok(text) => Ok(Some((path.to_path_buf(), text))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(path, e)),
        },
    }
}

/// The first `limit` rows of the log `path` (`read_text`), each line that is not blank parsed as
/// one `T`; `Ok(None)` when the log exists in neither form. Lines after the first `limit` rows
/// are not parsed (a resume reads only the rows its checkpoint covers). An error names the file
/// read and the line.
pub fn read_rows<T: DeserializeOwned>(path: &Path, limit: usize) -> Result<Option<Vec<T>>> {
    let Some((file, text)) = read_text(path)? else {
        return Ok(None);
    };
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .take(limit)
        .map(|(i, line)| {
            serde_json::from_str(line)
                .map_err(|e| Error::bad_file(&file, format!("line {}: {e}", i + 1)))
        })
        .collect::<Result<Vec<T>>>()
        .map(Some)
}

/// Brings back the plain log `path` from its packed copy, for a writer: when `path` does not
/// exist and `X.jsonl.gz` does, writes its text to `path` (atomically, `run_folder::replace`,
/// which then removes the packed copy). Does nothing otherwise.
pub fn unpack(path: &Path) -> Result<()> {
    if path.exists() {
        return Ok(());
    }
    match read_packed(&packed_path(path))? {
        Some(text) => crate::run_folder::replace(path, text.as_bytes()),
        None => Ok(()),
    }
}

/// Appends `line` and a newline to the log `path`, whole or not at all
/// (`run_folder::append_line`); a packed log is unpacked first, so the row follows the rows
/// already logged.
pub fn append_line(path: &Path, line: &str) -> Result<()> {
    unpack(path)?;
    crate::run_folder::append_line(path, line)
}

/// `text` gzip-compressed at the best level. The header holds no name and no time, so the same
/// log always packs to the same bytes.
fn compress(text: &str) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder
        .write_all(text.as_bytes())
        .expect("writing to memory");
    encoder.finish().expect("writing to memory")
}

/// Packs the log `name` of the run folder `dir`: writes `name.gz` (temporary file and rename),
/// checks that it reads back as the same text, then removes `name`. Returns whether it packed.
/// Nothing is done when `name` does not exist, or does not read as dpcomp's rows (an empty
/// log, a file of the user's). A packed copy already there is never overwritten: when it holds
/// the same text (a pack stopped before its last step) the plain file is removed, otherwise
/// the two are refused, named.
fn pack_log(dir: &Path, name: &str) -> Result<bool> {
    let path = dir.join(name);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(Error::io(&path, e)),
    };
    if crate::run_folder::is_dpcomp_file(dir, name).is_err() {
        return Ok(false);
    }
    let packed = packed_path(&path);
    match read_packed(&packed) {
        Ok(None) => {}
        Ok(Some(old)) if old == text => {
            std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
            return Ok(true);
        }
        _ => {
            return Err(Error::bad_file(
                &packed,
                format!(
                    "already exists beside {name} and does not hold the same rows; packing never overwrites it: move one of the two away"
                ),
            ))
        }
    }
    crate::run_folder::replace(&packed, &compress(&text))?;
    if read_packed(&packed)?.as_deref() != Some(text.as_str()) {
        let _ = std::fs::remove_file(&packed);
        return Err(Error::bad_file(
            &packed,
            "did not read back as the log it packs; the plain log is kept",
        ));
    }
    std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
    Ok(true)
}

/// What `pack_run` found in a folder.
#[derive(Debug, Clone, PartialEq)]
pub enum Packing {
    /// A finished run: this many logs were packed now (0 when they already were).
    Packed(usize),
    /// No dpcomp `summary.json`: not a run, or one still training or interrupted; left as it is.
    Unfinished,
    /// Another process holds the folder's lock (its owner): left as it is.
    InUse(String),
}

/// Packs the logs of the run folder `dir` when the run has finished (it holds a `summary.json`
/// that reads as dpcomp's), under the folder's lock (`run_lock`): a folder another process
/// holds is left as it is. Files that are not dpcomp's logs are never touched.
pub fn pack_run(dir: &Path) -> Result<Packing> {
    if !dir.join("summary.json").is_file()
        || crate::run_folder::is_dpcomp_file(dir, "summary.json").is_err()
    {
        return Ok(Packing::Unfinished);
    }
    if !LOGS.iter().any(|name| dir.join(name).exists()) {
        return Ok(Packing::Packed(0));
    }
    let _lock = match crate::run_lock::RunLock::acquire(dir) {
        Ok(lock) => lock,
        Err(Error::RunInUse { owner, .. }) => return Ok(Packing::InUse(owner)),
        Err(e) => return Err(e),
    };
    let mut packed = 0;
    for name in LOGS {
        packed += usize::from(pack_log(dir, name)?);
    }
    Ok(Packing::Packed(packed))
}

/// What `pack_below` did: the finished run folders it found, the logs it packed, and the
/// folders it left because another process holds them (with their owners).
#[derive(Debug, Default)]
pub struct PackReport {
    /// Finished run folders found (packed now or before).
    pub finished: usize,
    /// Logs packed now.
    pub packed: usize,
    /// Run folders left unpacked because they are in use: (folder, owner).
    pub in_use: Vec<(PathBuf, String)>,
}

/// Packs every finished run folder at or below `root` (`pack_run`); folders without a finished
/// run are passed over, checkpoint folders are not entered.
pub fn pack_below(root: &Path) -> Result<PackReport> {
    if !root.is_dir() {
        return Err(Error::bad_value(
            "pack",
            format!("{}: expected a folder of runs", root.display()),
        ));
    }
    let mut report = PackReport::default();
    let mut folders = vec![root.to_path_buf()];
    while let Some(dir) = folders.pop() {
        match pack_run(&dir)? {
            Packing::Packed(n) => {
                report.finished += 1;
                report.packed += n;
            }
            Packing::InUse(owner) => report.in_use.push((dir.clone(), owner)),
            Packing::Unfinished => {}
        }
        let mut children = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))? {
            let entry = entry.map_err(|e| Error::io(&dir, e))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let is_dir = entry
                .file_type()
                .map_err(|e| Error::io(entry.path(), e))?
                .is_dir();
            if is_dir && !name.starts_with("checkpoint") {
                children.push(entry.path());
            }
        }
        children.sort();
        folders.extend(children.into_iter().rev());
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_reads_the_same_plain_and_packed_and_appends_after_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        assert!(read_text(&path).unwrap().is_none());
        let text = "{\"a\":1}\n\n{\"a\":2}\n";
        std::fs::write(&path, text).unwrap();
        let plain: Vec<serde_json::Value> = read_rows(&path, usize::MAX).unwrap().unwrap();
        std::fs::write(packed_path(&path), compress(text)).unwrap();
        std::fs::remove_file(&path).unwrap();
        let (file, read) = read_text(&path).unwrap().unwrap();
        assert_eq!((file, read.as_str()), (packed_path(&path), text));
        assert_eq!(
            read_rows::<serde_json::Value>(&path, usize::MAX)
                .unwrap()
                .unwrap(),
            plain
        );
        assert_eq!(
            read_rows::<serde_json::Value>(&path, 1)
                .unwrap()
                .unwrap()
                .len(),
            1
        );
        // A row appended to a packed log follows its rows, in the plain file.
        append_line(&path, "{\"a\":3}").unwrap();
        assert!(!packed_path(&path).exists());
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("{text}{{\"a\":3}}\n")
        );
        // An error names the packed file and the line.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(packed_path(&path), compress("{\"a\":1}\nnot json\n")).unwrap();
        let error = read_rows::<serde_json::Value>(&path, usize::MAX)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("metrics.jsonl.gz") && error.contains("line 2"),
            "{error}"
        );
        std::fs::write(packed_path(&path), "plain text").unwrap();
        let error = read_text(&path).unwrap_err().to_string();
        assert!(error.contains("gzip"), "{error}");
    }

    #[test]
    fn packing_never_overwrites_a_packed_file_that_differs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let row = "{\"epoch\":1,\"steps\":4,\"train_loss\":0.7,\"train_accuracy\":0.5,\"test_loss\":0.7,\"test_accuracy\":0.5,\"examples_per_second\":9.0,\"epoch_seconds\":1.0,\"wall_seconds\":1.0}\n";
        std::fs::write(&path, row).unwrap();
        std::fs::write(packed_path(&path), "the user's own file").unwrap();
        let error = pack_log(dir.path(), "metrics.jsonl")
            .unwrap_err()
            .to_string();
        assert!(error.contains("never overwrites"), "{error}");
        assert_eq!(
            std::fs::read(packed_path(&path)).unwrap(),
            b"the user's own file"
        );
        assert!(path.exists());
        // Without it, the log is packed and the plain file removed; a file that is not
        // dpcomp's log is left as it is.
        std::fs::remove_file(packed_path(&path)).unwrap();
        assert!(pack_log(dir.path(), "metrics.jsonl").unwrap());
        assert!(!path.exists());
        assert_eq!(read_packed(&packed_path(&path)).unwrap().unwrap(), row);
        let other = dir.path().join("grad_error.jsonl");
        std::fs::write(&other, "my notes\n").unwrap();
        assert!(!pack_log(dir.path(), "grad_error.jsonl").unwrap());
        assert!(other.exists() && !packed_path(&other).exists());
    }
}
