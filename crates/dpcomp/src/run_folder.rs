//! What a fresh run may do to the folder it is pointed at: never touch a file it did not write.
//!
//! A run folder (`train --out`, `fl --out`, `audit --out`, every grid cell) holds only what
//! dpcomp writes there (`RUN_FILES`), and a fresh start marks it with `MARKER`. A fresh start
//! is accepted in a folder that does not exist, an empty one, or a dpcomp run folder that holds
//! no checkpoint (an earlier start killed in its first epoch, or a grid cell committed before it
//! finished): that run's logs are dpcomp's own and are started afresh. A folder without the
//! marker (a run of a version that wrote none, or a committed grid cell) counts as a dpcomp run
//! folder only when every file in it reads as what dpcomp writes under that name
//! (`is_dpcomp_file`: the settings as dpcomp's settings, the logs as dpcomp's rows, a checkpoint
//! folder sealed by dpcomp's manifest): a file name alone is no evidence. Any other folder, such
//! as one holding a `config.toml` or `summary.json` of the user's, is refused before anything
//! is written, naming what it holds; and a start that fails removes only what it wrote itself.

use crate::error::{Error, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The file a fresh start writes into its folder to mark it as a dpcomp run folder.
pub const MARKER: &str = ".dpcomp-run";

/// Every name a dpcomp run writes into its folder: the configuration (`config.toml`; federated
/// runs of older versions wrote `config.json`, still read and replaced), the logs and their
/// packed forms (`run_log`), the checkpoint's three folders, the lock and the marker.
pub const RUN_FILES: [&str; 15] = [
    MARKER,
    crate::run_lock::LOCK_FILE,
    "config.toml",
    "config.json",
    "metrics.jsonl",
    "upstream.csv",
    "traffic.csv",
    "summary.json",
    "audit.json",
    "grad_error.jsonl",
    "metrics.jsonl.gz",
    "grad_error.jsonl.gz",
    "checkpoint",
    "checkpoint.tmp",
    "checkpoint.old",
];

/// Names that show a folder holds a run (with or without the marker): a folder of run files
/// holding none of these (a lone `config.toml`) is not taken for a run.
const RUN_EVIDENCE: [&str; 7] = [
    MARKER,
    "metrics.jsonl",
    "metrics.jsonl.gz",
    "summary.json",
    "checkpoint",
    "checkpoint.old",
    "audit.json",
];

/// The header of `upstream.csv` and of `traffic.csv`, as dpcomp writes them (up to the columns
/// every version wrote).
const UPSTREAM_HEADER: &str = "step,epoch,upstream_bits";
const TRAFFIC_HEADER: &str = "step,rank,sent_bytes,received_bytes";

/// Whether `text` is the `audit.json` of a federated run (`privacy::audit::CanaryAudit`, which
/// is written, never read back): its two auditors' outcomes beside the accounted ε.
fn is_federated_audit(text: &str) -> std::result::Result<(), String> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let outcome = |key: &str| value.get(key).and_then(|o| o.get("epsilon_lower_bound"));
    let complete = ["accounted_epsilon", "max_bound", "flagged"]
        .iter()
        .all(|key| value.get(key).is_some())
        && outcome("every_step").is_some()
        && outcome("final_weights").is_some();
    match complete {
        true => Ok(()),
        false => Err("not a federated audit's fields".to_string()),
    }
}

/// Whether the file or folder `name` in a folder without the marker is what dpcomp writes under
/// that name: `Ok(())`, or why not (shown in the refusal). Only such files may be replaced or
/// removed by a fresh start, `clear` or a checkpoint's save, or packed (`run_log`). A packed
/// log (`metrics.jsonl.gz`) is judged by its decompressed text, as the plain log.
pub(crate) fn is_dpcomp_file(dir: &Path, name: &str) -> std::result::Result<(), String> {
    let path = dir.join(name);
    if name == crate::run_lock::LOCK_FILE {
        // A lock file left by a killed run: empty, or its owner's line (`run_lock`).
        let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
        return match text.is_empty() || text.starts_with("pid ") {
            true => Ok(()),
            false => Err("not a dpcomp lock file".to_string()),
        };
    }
    if matches!(name, "checkpoint" | "checkpoint.old" | "checkpoint.tmp") {
        if !path.is_dir() {
            return Err("not a checkpoint folder".to_string());
        }
        return crate::train::checkpoint::verify(&path)
            .map_err(|e| format!("not a dpcomp checkpoint ({e})"));
    }
    if !path.is_file() {
        return Err("not a file".to_string());
    }
    let packed_log = name
        .strip_suffix(crate::run_log::PACKED_SUFFIX)
        .filter(|plain| crate::run_log::LOGS.contains(plain));
    let (name, text) = match packed_log {
        Some(plain) => match crate::run_log::read_packed(&path) {
            Ok(Some(text)) => (plain, text),
            Ok(None) => return Err("not a file".to_string()),
            Err(e) => return Err(format!("not a dpcomp packed log ({e})")),
        },
        None => (
            name,
            std::fs::read_to_string(&path).map_err(|e| format!("unreadable ({e})"))?,
        ),
    };
    let rows = || text.lines().filter(|l| !l.trim().is_empty());
    // Every row parses as one of `T`; the last may be cut short by a kill or a full disk.
    fn all_rows<'a, T: serde::de::DeserializeOwned>(
        rows: impl Iterator<Item = &'a str>,
    ) -> std::result::Result<usize, String> {
        let rows: Vec<&str> = rows.collect();
        for (i, row) in rows.iter().enumerate() {
            if let Err(e) = serde_json::from_str::<T>(row) {
                if i + 1 < rows.len() || i == 0 {
                    return Err(format!("line {}: {e}", i + 1));
                }
            }
        }
        Ok(rows.len())
    }
    // Either of a training run's and a federated run's form of the file.
    let either = |what: &str,
                  train: std::result::Result<(), String>,
                  fl: std::result::Result<(), String>| {
        train
            .or(fl)
            .map_err(|e| format!("not a dpcomp {what} ({e})"))
    };
    match name {
        "config.toml" => {
            let train = crate::config::TrainConfig::from_toml_file(&path)
                .map(drop)
                .map_err(|e| e.to_string());
            let fl = toml::from_str::<crate::fl::FlSettings>(&text)
                .map(drop)
                .map_err(|e| e.to_string());
            either("settings file", train, fl)
        }
        "config.json" => crate::fl::config_file::from_json(&text)
            .map(drop)
            .map_err(|e| format!("not a dpcomp settings file ({e})")),
        "summary.json" => either(
            "summary",
            serde_json::from_str::<crate::train::metrics::Summary>(&text)
                .map(drop)
                .map_err(|e| e.to_string()),
            serde_json::from_str::<crate::fl::FlSummary>(&text)
                .map(drop)
                .map_err(|e| e.to_string()),
        ),
        "audit.json" => either(
            "audit report",
            serde_json::from_str::<crate::train::audit::AuditReport>(&text)
                .map(drop)
                .map_err(|e| e.to_string()),
            is_federated_audit(&text),
        ),
        "metrics.jsonl" => {
            let train = all_rows::<crate::train::metrics::EpochMetrics>(rows());
            let fl = all_rows::<crate::fl::RoundMetrics>(rows());
            match (train, fl) {
                (Ok(0), _) | (_, Ok(0)) => Err("empty: not a dpcomp log".to_string()),
                (Ok(_), _) | (_, Ok(_)) => Ok(()),
                (Err(e), _) => Err(format!("not a dpcomp metrics log ({e})")),
            }
        }
        "grad_error.jsonl" => match all_rows::<MeasurementLine>(rows()) {
            Ok(0) => Err("empty: not a dpcomp log".to_string()),
            Ok(_) => Ok(()),
            Err(e) => Err(format!("not a dpcomp gradient-error log ({e})")),
        },
        "upstream.csv" | "traffic.csv" => {
            let header = if name == "upstream.csv" {
                UPSTREAM_HEADER
            } else {
                TRAFFIC_HEADER
            };
            match text.lines().next() {
                Some(first) if first.starts_with(header) => Ok(()),
                _ => Err(format!(
                    "not a dpcomp log (expected the header {header},...)"
                )),
            }
        }
        // The marker itself, and the temporary files of a killed `replace`, are only dpcomp's
        // in a folder it marked.
        _ => Err("written by dpcomp only in a folder it marked".to_string()),
    }
}

/// Whether `name` is one dpcomp's runs write: one of `RUN_FILES`, or the temporary file a
/// `replace` of one of them left when it was killed.
fn is_run_file(name: &str) -> bool {
    RUN_FILES.contains(&name)
        || name
            .strip_prefix('.')
            .and_then(|n| n.strip_suffix(".tmp"))
            .is_some_and(|n| RUN_FILES.contains(&n))
}

/// Replaces the file `path` with `contents` all at once: written to a temporary file beside it,
/// synced, then renamed over it, so that a kill or a full disk leaves the old file or the new
/// one, never a half of either. When `path` is a run's log (`run_log::LOGS`), its packed copy
/// beside it is removed once the plain file is in place: the plain file is the log from then on.
pub fn replace(path: &Path, contents: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let written = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(contents)?;
        file.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(&tmp, e));
    }
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
    if crate::run_log::is_log(path) {
        let packed = crate::run_log::packed_path(path);
        match std::fs::remove_file(&packed) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io(&packed, e))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Appends `line` and a newline to the log at `path` (created if missing) in one write; when
/// the write fails (a full disk) the file is cut back to its length before it, so a log never
/// ends in half a row that would make every later row unreadable.
pub fn append_line(path: &Path, line: &str) -> Result<()> {
    append_text(path, &format!("{line}\n"))
}

/// `append_line` for several lines (or a header and lines) at once: all of `text` or none.
pub fn append_text(path: &Path, text: &str) -> Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    let before = file.metadata().map_err(|e| Error::io(path, e))?.len();
    if let Err(e) = file.write_all(text.as_bytes()).and_then(|()| file.flush()) {
        let _ = file.set_len(before);
        return Err(Error::io(path, e));
    }
    Ok(())
}

/// What a fresh start in `dir` would find: `Ok(true)` when the folder is a dpcomp run folder
/// (its files may be replaced), `Ok(false)` when it does not exist or is empty, and an error
/// naming the folder and what it holds otherwise.
pub fn check_fresh(dir: &Path) -> Result<bool> {
    if !dir.exists() {
        return Ok(false);
    }
    if !dir.is_dir() {
        return Err(Error::bad_value(
            "run_dir",
            format!(
                "{}: is a file, expected a folder for the run",
                dir.display()
            ),
        ));
    }
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    let foreign: Vec<&String> = names.iter().filter(|n| !is_run_file(n)).collect();
    let only_lock = names.iter().all(|n| n == crate::run_lock::LOCK_FILE);
    if only_lock {
        return Ok(false);
    }
    let evidence = names.iter().any(|n| RUN_EVIDENCE.contains(&n.as_str()));
    // Without the marker, each file must read as dpcomp's own: the first that does not says
    // why the folder is refused.
    let not_ours = if foreign.is_empty() && evidence && !names.iter().any(|n| n == MARKER) {
        names.iter().find_map(|n| {
            is_dpcomp_file(dir, n)
                .err()
                .map(|why| format!("; {n}: {why}"))
        })
    } else {
        None
    };
    if foreign.is_empty() && evidence && not_ours.is_none() {
        return Ok(true);
    }
    let shown: Vec<&str> = if foreign.is_empty() {
        names.iter().map(String::as_str).take(5).collect()
    } else {
        foreign.iter().map(|n| n.as_str()).take(5).collect()
    };
    let more = if foreign.len().max(names.len()) > 5 {
        ", ..."
    } else {
        ""
    };
    Err(Error::bad_value(
        "run_dir",
        format!(
            "{}: not empty and not a dpcomp run folder (it holds {}{more}{}); a fresh run never overwrites or deletes files it did not write: choose a new or empty folder",
            dir.display(),
            shown.join(", "),
            not_ours.unwrap_or_default()
        ),
    ))
}

/// A fresh start's claim on its folder, taken after `check_fresh` and under the folder's lock:
/// marks the folder and remembers what this start created, so that a failed start removes
/// exactly that (`undo`).
#[derive(Debug)]
pub struct FreshStart {
    dir: PathBuf,
    created_dir: bool,
    created: Vec<PathBuf>,
}

impl FreshStart {
    /// Marks `dir` (which `check_fresh` accepted; `created_dir` when this start made it) and
    /// removes the logs `stale` an earlier start of a dpcomp run left there (a log in its plain
    /// and its packed form, `run_log`).
    pub fn claim(dir: &Path, created_dir: bool, stale: &[&str]) -> Result<FreshStart> {
        let mut start = FreshStart {
            dir: dir.to_path_buf(),
            created_dir,
            created: Vec::new(),
        };
        let marker = dir.join(MARKER);
        if !marker.exists() {
            start.created.push(marker.clone());
            let written = std::fs::write(
                &marker,
                "a dpcomp run folder: dpcomp writes and replaces only its own files here\n",
            );
            if let Err(e) = written {
                // A full disk: the half-written marker goes with the rest of the start.
                start.undo();
                return Err(Error::io(&marker, e));
            }
        }
        for name in stale {
            debug_assert!(RUN_FILES.contains(name), "{name} is not a run file");
            let path = dir.join(name);
            let packed = crate::run_log::packed_path(&path);
            let forms = match crate::run_log::is_log(&path) {
                true => vec![path, packed],
                false => vec![path],
            };
            for path in forms {
                if path.is_file() {
                    if let Err(e) = std::fs::remove_file(&path) {
                        start.undo();
                        return Err(Error::io(&path, e));
                    }
                }
            }
        }
        Ok(start)
    }

    /// Records that this start wrote `name` into the folder (a file that did not exist before
    /// it, or an earlier dpcomp start's).
    pub fn wrote(&mut self, name: &str) {
        debug_assert!(RUN_FILES.contains(&name), "{name} is not a run file");
        self.created.push(self.dir.join(name));
    }

    /// After a failed start: removes what this start wrote, and the folder if it made it (and
    /// it holds nothing else).
    pub fn undo(self) {
        for path in &self.created {
            let _ = std::fs::remove_file(path);
        }
        if self.created_dir {
            let _ = std::fs::remove_file(self.dir.join(crate::run_lock::LOCK_FILE));
            let _ = std::fs::remove_dir(&self.dir);
        }
    }
}

/// Removes what an earlier (unfinished, unresumable) run left in the dpcomp run folder `dir`:
/// its files among `RUN_FILES` and its checkpoint folders. A folder that is not a dpcomp run
/// folder is refused (`check_fresh`) and left as it is.
pub fn clear(dir: &Path) -> Result<()> {
    if !check_fresh(dir)? {
        return Ok(());
    }
    for name in RUN_FILES {
        if name == crate::run_lock::LOCK_FILE {
            continue;
        }
        let path = dir.join(name);
        if path.is_dir() {
            std::fs::remove_dir_all(&path).map_err(|e| Error::io(&path, e))?;
        } else if path.exists() {
            std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
        }
    }
    Ok(())
}

/// Appends `lines` to the CSV file at `path`, writing `header` first when the file is new.
pub(crate) fn append_csv(path: &Path, header: &str, lines: &[String]) -> Result<()> {
    let new = !path.exists();
    let mut text = String::new();
    if new {
        text.push_str(header);
        text.push('\n');
    }
    for line in lines {
        text.push_str(line);
        text.push('\n');
    }
    append_text(path, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_of_the_users_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.toml"), "task = \"surnames\"\n").unwrap();
        let error = check_fresh(dir.path()).unwrap_err().to_string();
        assert!(error.contains("not a dpcomp run folder"), "{error}");
        assert!(error.contains("config.toml"), "{error}");
        std::fs::write(dir.path().join("notes.txt"), "mine").unwrap();
        assert!(clear(dir.path()).is_err());
        assert!(dir.path().join("notes.txt").exists());
        assert!(dir.path().join("config.toml").exists());
    }

    #[test]
    fn replace_leaves_one_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        std::fs::write(&path, "old\n").unwrap();
        replace(&path, b"new\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new\n");
        append_line(&path, "row").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new\nrow\n");
        // A killed replace's temporary file does not make a marked run folder foreign.
        std::fs::write(dir.path().join(".metrics.jsonl.tmp"), "half").unwrap();
        std::fs::write(dir.path().join(MARKER), "").unwrap();
        assert!(check_fresh(dir.path()).unwrap());
    }

    #[test]
    fn empty_new_and_run_folders_are_accepted() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!check_fresh(&dir.path().join("new")).unwrap());
        assert!(!check_fresh(dir.path()).unwrap());
        std::fs::write(dir.path().join("config.toml"), "").unwrap();
        std::fs::write(dir.path().join("metrics.jsonl"), "").unwrap();
        // Without the marker, files that do not read as dpcomp's are not taken for a run.
        let error = check_fresh(dir.path()).unwrap_err().to_string();
        assert!(error.contains("not a dpcomp run folder"), "{error}");
        std::fs::write(dir.path().join(MARKER), "").unwrap();
        assert!(check_fresh(dir.path()).unwrap());
        std::fs::remove_file(dir.path().join(MARKER)).unwrap();
        let start = FreshStart::claim(dir.path(), false, &["metrics.jsonl"]).unwrap();
        assert!(dir.path().join(MARKER).exists());
        assert!(!dir.path().join("metrics.jsonl").exists());
        start.undo();
        assert!(!dir.path().join(MARKER).exists());
        assert!(dir.path().join("config.toml").exists());
    }

    /// A packed log counts as dpcomp's when its text does; a replace or a fresh start takes
    /// both forms of a log into account.
    #[test]
    fn packed_logs_are_judged_by_their_rows() {
        let row = "{\"epoch\":1,\"steps\":4,\"train_loss\":0.7,\"train_accuracy\":0.5,\"test_loss\":0.7,\"test_accuracy\":0.5,\"examples_per_second\":9.0,\"epoch_seconds\":1.0,\"wall_seconds\":1.0}\n";
        let gz = |text: &str| {
            use flate2::write::GzEncoder;
            let mut encoder = GzEncoder::new(Vec::new(), flate2::Compression::default());
            encoder.write_all(text.as_bytes()).unwrap();
            encoder.finish().unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let packed = dir.path().join("metrics.jsonl.gz");
        std::fs::write(&packed, gz(row)).unwrap();
        assert!(check_fresh(dir.path()).unwrap());
        std::fs::write(&packed, gz("{\"loss\": 1.0}\n")).unwrap();
        let error = check_fresh(dir.path()).unwrap_err().to_string();
        assert!(error.contains("metrics.jsonl.gz"), "{error}");
        std::fs::write(&packed, "not gzip").unwrap();
        assert!(check_fresh(dir.path()).is_err());
        // Replacing the plain log drops the packed copy; a fresh start removes either form.
        std::fs::write(&packed, gz(row)).unwrap();
        replace(&dir.path().join("metrics.jsonl"), row.as_bytes()).unwrap();
        assert!(!packed.exists());
        std::fs::write(&packed, gz(row)).unwrap();
        let start = FreshStart::claim(dir.path(), false, &["metrics.jsonl"]).unwrap();
        assert!(!packed.exists() && !dir.path().join("metrics.jsonl").exists());
        drop(start);
    }

    #[test]
    fn files_named_as_dpcomp_names_them_are_not_taken_for_a_run() {
        let cases: [&[(&str, &str)]; 4] = [
            &[
                ("config.toml", "title = \"my own settings\"\n"),
                ("summary.json", "{\"acc\": 0.93}"),
            ],
            &[("checkpoint/model.pt", "weights")],
            &[
                ("config.json", "{\"lr\": 0.1}"),
                ("metrics.jsonl", "{\"loss\": 1.0}\n"),
            ],
            &[
                ("metrics.jsonl", "{\"loss\": 1.0}\n"),
                ("checkpoint/pytorch_model.bin", "weights"),
            ],
        ];
        for files in cases {
            let dir = tempfile::tempdir().unwrap();
            for (name, text) in files {
                let path = dir.path().join(name);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, text).unwrap();
            }
            let error = check_fresh(dir.path()).unwrap_err().to_string();
            assert!(error.contains("not a dpcomp run folder"), "{error}");
            assert!(clear(dir.path()).is_err());
            for (name, text) in files {
                assert_eq!(
                    std::fs::read_to_string(dir.path().join(name)).unwrap(),
                    *text
                );
            }
        }
    }
}

/// The fields every line of a gradient-error log (`grad_error.jsonl`, written by the lab's
/// `analysis::gradient_error`) has: enough to tell it from a file dpcomp did not write.
#[derive(serde::Deserialize)]
#[allow(dead_code)] // read only to check the line's form
struct MeasurementLine {
    epoch: usize,
    steps: u64,
    compressor: String,
    stages: Vec<serde_json::Value>,
}
