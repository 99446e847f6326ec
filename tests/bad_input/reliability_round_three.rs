//! Reliability fixes of the third round of probes: a user's files that carry names dpcomp also
//! writes are never taken for a run and deleted, a diverged run keeps its last finite
//! checkpoint (and every step in its ε), a data folder whose path is not UTF-8 is refused
//! before anything is written, and a start or a checkpoint save cut short by a full disk leaves
//! nothing behind.

use crate::common;
use common::{require_breast_cancer, require_shared_data};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn dpcomp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dpcomp"))
        .args(args)
        .env("OMP_NUM_THREADS", "1")
        .output()
        .expect("dpcomp runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Writes `files` (path relative to `dir`, text) and returns them for `assert_untouched`.
fn plant(dir: &Path, files: &[(&str, &str)]) -> Vec<(PathBuf, String)> {
    files
        .iter()
        .map(|(name, text)| {
            let path = dir.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
            (path, text.to_string())
        })
        .collect()
}

/// Every planted file is still there with its bytes, and nothing else was added to `dir`.
fn assert_untouched(dir: &Path, planted: &[(PathBuf, String)]) {
    for (path, text) in planted {
        let now = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("{} was removed: {e}", path.display()));
        assert_eq!(&now, text, "{} was overwritten", path.display());
    }
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut expected: Vec<String> = planted
        .iter()
        .map(|(p, _)| {
            p.strip_prefix(dir)
                .unwrap()
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    expected.sort();
    expected.dedup();
    assert_eq!(names, expected, "{} gained files", dir.display());
}

/// The refusal names the folder, says it is not a run folder, and names a file it holds.
fn assert_refused(out: &Output, dir: &Path, holds: &str) {
    let text = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains(&dir.display().to_string()), "{text}");
    assert!(text.contains("not a dpcomp run folder"), "{text}");
    assert!(text.contains(holds), "{text}");
}

/// A folder of the user's holding `config.toml` and `summary.json` (the `--config` file among
/// them) is refused by a start that would fail anyway, not emptied.
#[test]
fn a_users_config_and_summary_survive_a_failed_train() {
    let root = tempfile::tempdir().unwrap();
    let v = root.path().join("v");
    let planted = plant(
        &v,
        &[
            ("config.toml", "task = \"surnames\"\nepochs = 1\n"),
            ("summary.json", "{\"acc\":0.93}\n"),
        ],
    );
    let config = v.join("config.toml");
    let out = dpcomp(&[
        "train",
        "--config",
        config.to_str().unwrap(),
        "--out",
        v.to_str().unwrap(),
        "--data-dir",
        "/nonexistent",
    ]);
    assert_refused(&out, &v, "summary.json");
    assert_untouched(&v, &planted);
}

/// `checkpoint/model.pt` alone (another tool's checkpoint) is not taken for a dpcomp run:
/// `train --out` refused to start there instead of replacing the folder at its first save.
#[test]
fn another_tools_checkpoint_survives_train() {
    let Some(data) = require_shared_data() else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let w = root.path().join("w");
    let planted = plant(&w, &[("checkpoint/model.pt", "weights of another tool")]);
    let out = dpcomp(&[
        "train",
        "--task",
        "surnames",
        "--epochs",
        "1",
        "--limit-train",
        "64",
        "--limit-test",
        "10",
        "--quiet",
        "--data-dir",
        data.to_str().unwrap(),
        "--out",
        w.to_str().unwrap(),
    ]);
    assert_refused(&out, &w, "not a dpcomp checkpoint");
    assert_untouched(&w, &planted);
}

/// A folder given as `--out`: its name, the user's files (name, contents) and the one checked.
type UserFolder = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static str,
);

/// `config.json` + `metrics.jsonl` (what many tools write), and `metrics.jsonl` + a
/// `checkpoint/pytorch_model.bin`: `fl --out` neither deletes the files nor removes the
/// checkpoint folder.
#[test]
fn a_users_logs_and_checkpoint_survive_fl() {
    let Some(data) = require_breast_cancer() else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    // (folder, the user's files in it, the file whose survival is checked)
    let cases: [UserFolder; 2] = [
        (
            "x",
            &[
                ("config.json", "{\"lr\": 0.1}\n"),
                ("metrics.jsonl", "{\"step\": 1, \"loss\": 0.5}\n"),
            ],
            "config.json",
        ),
        (
            "y",
            &[
                ("metrics.jsonl", "{\"step\": 1, \"loss\": 0.5}\n"),
                ("checkpoint/pytorch_model.bin", "weights"),
            ],
            "checkpoint",
        ),
    ];
    for (name, files, holds) in cases {
        let dir = root.path().join(name);
        let planted = plant(&dir, files);
        let out = dpcomp(&[
            "fl",
            "--dataset",
            "breast_cancer",
            "--data-dir",
            data.to_str().unwrap(),
            "--rounds",
            "1",
            "--out",
            dir.to_str().unwrap(),
        ]);
        assert_refused(&out, &dir, holds);
        assert_untouched(&dir, &planted);
        // Nor does discarding "the run" there (`--restart`) touch them.
        let out = dpcomp(&[
            "fl",
            "--dataset",
            "breast_cancer",
            "--data-dir",
            data.to_str().unwrap(),
            "--rounds",
            "1",
            "--restart",
            "--out",
            dir.to_str().unwrap(),
        ]);
        assert_refused(&out, &dir, holds);
        assert_untouched(&dir, &planted);
    }
}

/// `audit --out` on a folder holding a user's `audit.json` and `upstream.csv` overwrites
/// neither.
#[test]
fn a_users_audit_files_survive_audit() {
    let Some(data) = require_shared_data() else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let z = root.path().join("z");
    let planted = plant(
        &z,
        &[
            ("audit.json", "{\"my_audit\": true}\n"),
            ("upstream.csv", "time,bytes\n1,2\n"),
        ],
    );
    let out = dpcomp(&[
        "audit",
        "--task",
        "surnames",
        "--limit-train",
        "64",
        "--limit-test",
        "10",
        "--epochs",
        "1",
        "--quiet",
        "--noise-multiplier",
        "1",
        "--canaries",
        "10",
        "--data-dir",
        data.to_str().unwrap(),
        "--out",
        z.to_str().unwrap(),
    ]);
    assert_refused(&out, &z, "audit.json");
    assert_untouched(&z, &planted);
}

/// Run folders of versions that wrote no marker (the committed grid cells) are still dpcomp's:
/// their files read as dpcomp's, so `fl --restart` (`clear_run`) may discard them, and a
/// training run's logs left without a checkpoint are started afresh.
#[test]
fn committed_run_folders_without_the_marker_are_still_run_folders() {
    let runs = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/runs");
    let names = [
        "config.toml",
        "config.json",
        "metrics.jsonl",
        "metrics.jsonl.gz",
        "summary.json",
        "audit.json",
        "grad_error.jsonl",
        "grad_error.jsonl.gz",
    ];
    let mut cells = Vec::new();
    let mut stack = vec![runs];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.path().is_dir() {
                stack.push(entry.path());
            }
        }
        if dir.join("summary.json").is_file() && !dir.join(".dpcomp-run").exists() {
            cells.push(dir);
        }
    }
    assert!(
        cells.len() > 100,
        "{} committed cells without a marker",
        cells.len()
    );
    // The committed cells' logs are packed: the copies hold them, so `clear_run` judges them.
    assert!(
        cells.iter().all(|c| c.join("metrics.jsonl.gz").is_file()),
        "a committed cell without packed logs"
    );
    let root = tempfile::tempdir().unwrap();
    for (i, cell) in cells.iter().enumerate() {
        let copy = root.path().join(i.to_string());
        std::fs::create_dir(&copy).unwrap();
        for name in names {
            if cell.join(name).is_file() {
                std::fs::copy(cell.join(name), copy.join(name)).unwrap();
            }
        }
        dpcomp::fl::clear_run(&copy).unwrap_or_else(|e| panic!("{} refused: {e}", cell.display()));
        assert_eq!(
            std::fs::read_dir(&copy).unwrap().count(),
            0,
            "{}",
            cell.display()
        );
    }
}

fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// The probe's diverging run (`--lr 3e17 --momentum 0.99`, the loss non-finite in epoch 4)
/// keeps the epoch-3 weights, says so, counts the diverged epoch's steps in ε, and `eval` and
/// `--resume` work on the checkpoint.
#[test]
fn a_diverged_run_keeps_its_last_finite_checkpoint() {
    let Some(data) = require_shared_data() else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let run = root.path().join("d");
    let out = dpcomp(&[
        "train",
        "--task",
        "surnames",
        "--limit-train",
        "200",
        "--limit-test",
        "20",
        "--epochs",
        "6",
        "--lr",
        "3e17",
        "--momentum",
        "0.99",
        "--noise-multiplier",
        "1",
        "--quiet",
        "--data-dir",
        data.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let summary = read_json(&run.join("summary.json"));
    let stopped = summary["stopped"].as_str().unwrap().to_string();
    let epochs = summary["epochs"].as_u64().unwrap() as usize;
    assert!(epochs >= 2, "diverged in epoch {epochs}: {stopped}");
    assert!(
        stopped.contains(&format!("in epoch {epochs} "))
            && stopped.contains(&format!(
                "the checkpoint keeps the weights after epoch {}",
                epochs - 1
            )),
        "{stopped}"
    );
    let state = read_json(&run.join("checkpoint/state.json"));
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), epochs);
    assert_eq!(state["epochs_done"].as_u64(), Some(epochs as u64));
    assert_eq!(state["weights_epoch"].as_u64(), Some(epochs as u64 - 1));
    // Every step taken, the diverged epoch's among them, is in the accountant and in ε.
    let steps = rows[epochs - 1]["steps"].as_u64().unwrap();
    assert!(steps > rows[epochs - 2]["steps"].as_u64().unwrap());
    assert_eq!(state["steps_done"].as_u64(), Some(steps));
    let history = state["accountant"]["history"].as_array().unwrap();
    let accounted: u64 = history
        .iter()
        .map(|block| {
            block
                .get("steps")
                .or_else(|| block.get(2))
                .and_then(|s| s.as_u64())
                .unwrap_or_else(|| panic!("an accountant block without steps: {block}"))
        })
        .sum();
    assert_eq!(accounted, steps);
    let epsilon = summary["epsilon"].as_f64().unwrap();
    assert_eq!(rows[epochs - 1]["epsilon"].as_f64(), Some(epsilon));
    assert!(epsilon > rows[epochs - 2]["epsilon"].as_f64().unwrap());
    // The kept weights are finite: `eval` reads them.
    let out = dpcomp(&["eval", "--checkpoint", run.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    // A resume is not refused for its weights and forgets no step: the run stays stopped, with
    // the same ε.
    let out = dpcomp(&[
        "train",
        "--out",
        run.to_str().unwrap(),
        "--resume",
        "--epochs",
        "6",
        "--quiet",
    ]);
    let text = stderr(&out);
    assert!(!text.contains("NaN or infinite"), "{text}");
    assert!(text.contains("diverged"), "{text}");
    let resumed = read_json(&run.join("summary.json"));
    assert_eq!(resumed["epsilon"].as_f64(), Some(epsilon));
    assert_eq!(resumed["stopped"].as_str(), Some(stopped.as_str()));
}

/// A run that diverges in its first epoch has no finite checkpoint to keep: it keeps none (not
/// a NaN model) and says so, with every step in its ε.
#[test]
fn a_run_diverged_in_its_first_epoch_keeps_no_nan_checkpoint() {
    let Some(data) = require_shared_data() else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let run = root.path().join("d1");
    let out = dpcomp(&[
        "train",
        "--task",
        "surnames",
        "--limit-train",
        "200",
        "--limit-test",
        "20",
        "--epochs",
        "3",
        "--lr",
        "1e30",
        "--noise-multiplier",
        "1",
        "--quiet",
        "--data-dir",
        data.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let summary = read_json(&run.join("summary.json"));
    let stopped = summary["stopped"].as_str().unwrap();
    assert!(
        stopped.contains("in epoch 1 ") && stopped.contains("no checkpoint is kept"),
        "{stopped}"
    );
    assert!(!run.join("checkpoint").exists());
    assert!(summary["epsilon"].as_f64().unwrap() > 0.0);
}

/// A `--data-dir` whose path is not UTF-8 cannot be recorded in `config.toml`: a clear error
/// naming the flag, no panic, and no run folder left behind.
#[cfg(unix)]
#[test]
fn a_data_dir_that_is_not_utf8_is_refused_before_anything_is_written() {
    use std::os::unix::ffi::OsStrExt;
    let root = tempfile::tempdir().unwrap();
    let bad = root
        .path()
        .join(std::ffi::OsStr::from_bytes(b"data_\xff_dir"));
    std::fs::create_dir(&bad).unwrap();
    let run = root.path().join("u");
    let out = Command::new(env!("CARGO_BIN_EXE_dpcomp"))
        .args([
            "train",
            "--task",
            "surnames",
            "--epochs",
            "1",
            "--quiet",
            "--data-dir",
        ])
        .arg(&bad)
        .arg("--out")
        .arg(&run)
        .output()
        .unwrap();
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("--data-dir") && text.contains("not valid UTF-8"),
        "{text}"
    );
    assert!(!text.contains("panicked"), "{text}");
    assert!(!run.exists(), "{} was left behind", run.display());
    // The same folder reached through $DPCOMP_DATA.
    let out = Command::new(env!("CARGO_BIN_EXE_dpcomp"))
        .args([
            "train", "--task", "surnames", "--epochs", "1", "--quiet", "--out",
        ])
        .arg(&run)
        .env("DPCOMP_DATA", &bad)
        .output()
        .unwrap();
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("not valid UTF-8"), "{text}");
    assert!(!run.exists(), "{} was left behind", run.display());
}

/// A tmpfs of `size` mounted on a fresh folder (root only); `None`, announced, where this
/// machine cannot mount one.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(size: &str) -> Option<SmallDisk> {
        let dir = tempfile::tempdir().unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .is_ok_and(|o| o.status.success());
        if !mounted {
            common::announce_skip("cannot mount a small tmpfs here (needs root) to fill a disk");
            return None;
        }
        Some(SmallDisk { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fills the disk to its last byte.
    fn fill(&self) {
        use std::io::Write;
        let mut file = std::fs::File::create(self.path().join("filler")).unwrap();
        let block = vec![0u8; 4096];
        while file.write_all(&block).is_ok() {}
        while file.write_all(&[0]).is_ok() {}
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// On a full disk a fresh start fails on its lock file and leaves nothing it created: not the
/// lock, not the run folder, not the folders above it that it made.
#[test]
fn a_start_on_a_full_disk_leaves_nothing() {
    let Some(disk) = SmallDisk::mount("64k") else {
        return;
    };
    disk.fill();
    let run = disk.path().join("runs/t2");
    let out = dpcomp(&[
        "train",
        "--task",
        "surnames",
        "--epochs",
        "1",
        "--quiet",
        "--data-dir",
        "/nonexistent",
        "--out",
        run.to_str().unwrap(),
    ]);
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("No space left on device"), "{text}");
    assert!(!disk.path().join("runs").exists(), "{text}");
}

/// A checkpoint save cut short by a full disk frees what it wrote (`checkpoint.tmp`) and
/// leaves no half checkpoint.
#[test]
fn a_checkpoint_save_on_a_full_disk_leaves_no_checkpoint_tmp() {
    let Some(data) = require_shared_data() else {
        return;
    };
    // The Surnames LSTM's weights (about 470 kB) fit, its momentum buffers beside them do not.
    let Some(disk) = SmallDisk::mount("768k") else {
        return;
    };
    let run = disk.path().join("run");
    let out = dpcomp(&[
        "train",
        "--task",
        "surnames",
        "--limit-train",
        "64",
        "--limit-test",
        "20",
        "--epochs",
        "1",
        "--momentum",
        "0.5",
        "--noise-multiplier",
        "1",
        "--quiet",
        "--data-dir",
        data.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
    ]);
    let text = stderr(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the small disk held the checkpoint: {text}"
    );
    assert!(text.contains("No space left on device"), "{text}");
    assert!(text.contains("checkpoint.tmp"), "{text}");
    assert!(!run.join("checkpoint.tmp").exists(), "{text}");
    assert!(!run.join("checkpoint").exists(), "{text}");
    // The logs up to the failure are kept.
    assert!(run.join("metrics.jsonl").is_file());
}
