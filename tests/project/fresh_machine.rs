//! The main job's data path on a machine with nothing beside the checkout: `DPCOMP_DATA` unset,
//! no `--data-dir`, no download. `scripts/run.sh` trains on the Surnames data the repository
//! ships in `data/names/` (data/README.md); this runs the same `dpcomp train` from the
//! repository root, as the script does, and checks that it read that folder and learned.

use crate::common;
use std::path::Path;
use std::process::Command;

/// One epoch of the main job's training (the paper's Surnames settings, which `scripts/run.sh`
/// passes on with `--epochs 1`) on the shipped names, from the repository root with
/// `DPCOMP_DATA` removed from the environment.
#[test]
fn the_main_job_trains_on_the_shipped_names_with_no_data_folder_set() {
    let _serial = common::serial();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shipped = root.join("data/names");
    let files = std::fs::read_dir(&shipped)
        .unwrap_or_else(|e| panic!("{}: {e}: the repository ships it", shipped.display()))
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "txt")
        })
        .count();
    assert_eq!(files, 18, "one <Language>.txt per class");

    let work = tempfile::tempdir().unwrap();
    let run = work.path().join("run");
    let out = Command::new(env!("CARGO_BIN_EXE_dpcomp"))
        .args([
            "train",
            "--task",
            "surnames",
            "--epochs",
            "1",
            "--limit-train",
            LIMIT_TRAIN,
            "--device",
            "cpu",
            "--quiet",
            "--out",
        ])
        .arg(&run)
        .env_remove("DPCOMP_DATA")
        .current_dir(root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "dpcomp train with DPCOMP_DATA unset: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The run recorded the folder it read: the checkout's data/, made absolute.
    let config = dpcomp::config::TrainConfig::from_toml_file(&run.join("config.toml")).unwrap();
    assert_eq!(
        config.data.data_dir.as_deref(),
        Some(root.join("data").as_path())
    );

    // It learned: the majority class of the test split (Russian, about 47%) is the accuracy of
    // a constant guess; one epoch on 8,000 names beats it by far (67.96% measured, 2026-12-07).
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    // The thread count it trained with is recorded: LibTorch's default in the same environment.
    assert_eq!(
        summary["threads"].as_i64(),
        Some(i64::from(tch::get_num_threads())),
        "{summary}"
    );
    let accuracy = summary["last_test_accuracy"]
        .as_f64()
        .unwrap_or_else(|| panic!("no last_test_accuracy in {summary}"));
    let test = dpcomp_lab::tasks::load_data(&config).unwrap().test;
    let counts = test.labels.bincount(None::<tch::Tensor>, 18);
    let counts = Vec::<i64>::try_from(&counts).unwrap();
    let majority = *counts.iter().max().unwrap() as f64 / test.len() as f64;
    assert!(
        accuracy > MIN_ACCURACY && accuracy > majority + 0.1,
        "test accuracy {accuracy} after one epoch (majority class {majority})"
    );
}

/// The training names the epoch takes: half the training split, to keep the test short.
const LIMIT_TRAIN: &str = "8000";
/// 67.96% measured (`dpcomp train --task surnames --epochs 1 --limit-train 8000`, seed 0,
/// 2026-12-07); a constant guess of the majority class scores about 47%.
const MIN_ACCURACY: f64 = 0.6;
