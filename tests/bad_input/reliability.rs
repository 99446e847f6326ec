//! Issue 14's probes of a run's safety: one writer per run folder, checksummed checkpoints, an
//! accountant that cannot be shortened or dropped across a resume, logs that must match the
//! checkpoint, resume flags that must match the run, and budgets that cannot be met refused.
//! Each test failed before its fix.

use crate::common;
use common::require_shared_data;
use dpcomp::config::TrainConfig;
use dpcomp::error::Error;
use dpcomp::run_lock::{self, RunLock};
use dpcomp::train::checkpoint;
use dpcomp_lab::Task;
use std::path::Path;
use std::process::{Command, Output};

/// A private Surnames run small enough for a test: 300 training names, 2 epochs.
fn small_private(root: &Path) -> TrainConfig {
    let mut c = dpcomp_lab::tasks::paper_defaults(Task::Surnames);
    c.epochs = 2;
    c.data.limit_train = Some(300);
    c.data.limit_test = Some(200);
    c.data.data_dir = Some(root.to_path_buf());
    c.device = dpcomp::config::DeviceChoice::Cpu;
    c.privacy.noise_multiplier = Some(1.0);
    c.seed = 3;
    c
}

/// `small_private` trained for one epoch into `<work>/run`.
fn one_epoch_run(root: &Path, work: &Path) -> std::path::PathBuf {
    let run = work.join("run");
    let mut config = small_private(root);
    config.epochs = 1;
    train(config, &run);
    run
}

fn train(config: TrainConfig, dir: &Path) -> dpcomp::train::metrics::Summary {
    let mut trainer = dpcomp_lab::tasks::start(config, dir).unwrap();
    trainer.run().unwrap()
}

fn dpcomp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dpcomp"))
        .args(args)
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Edits the checkpoint's state.json with `edit`, then reseals the manifest, as a buggy or
/// hostile writer could: the checks behind the manifest must still refuse it.
fn edit_state(run: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let dir = checkpoint::find(run).unwrap();
    let path = dir.join("state.json");
    let mut state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut state);
    std::fs::write(&path, serde_json::to_string_pretty(&state).unwrap()).unwrap();
    checkpoint::write_manifest(&dir).unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn a_run_folder_has_one_writer_and_stale_locks_are_taken_over() {
    let work = tempfile::tempdir().unwrap();
    let run = work.path().join("run");
    let held = RunLock::acquire(&run).unwrap();
    let owner = std::fs::read_to_string(held.path()).unwrap();
    assert!(
        owner.contains(&format!("pid {}", std::process::id())),
        "{owner}"
    );
    match RunLock::acquire(&run) {
        Err(Error::RunInUse { owner, .. }) => {
            assert!(owner.contains(&format!("pid {}", std::process::id())))
        }
        other => panic!("a second writer was let in: {other:?}"),
    }
    assert!(run_lock::holder(&run).is_some());

    // Every command that writes a run folder refuses it while it is held, and writes nothing.
    let out = dpcomp(&[
        "train",
        "--task",
        "surnames",
        "--epochs",
        "1",
        "--out",
        &run.display().to_string(),
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("in use by another dpcomp process"),
        "{}",
        stderr(&out)
    );
    if let Some(root) = common::require_breast_cancer() {
        let out = dpcomp(&[
            "fl",
            "--dataset",
            "breast_cancer",
            "--rounds",
            "1",
            "--data-dir",
            &root.display().to_string(),
            "--out",
            &run.display().to_string(),
        ]);
        assert!(!out.status.success());
        assert!(
            stderr(&out).contains("in use by another dpcomp process"),
            "{}",
            stderr(&out)
        );
    }
    let files: Vec<_> = std::fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(files, vec![std::ffi::OsString::from(run_lock::LOCK_FILE)]);

    // Released: the lock file goes, and the folder can be taken again.
    drop(held);
    assert!(!run.join(run_lock::LOCK_FILE).exists());
    assert!(run_lock::holder(&run).is_none());

    // A lock file whose process died (no OS lock behind it) is stale: taken over.
    std::fs::write(
        run.join(run_lock::LOCK_FILE),
        "pid 4194000 on elsewhere since unix time 0",
    )
    .unwrap();
    assert!(run_lock::holder(&run).is_none());
    let again = RunLock::acquire(&run).unwrap();
    let owner = std::fs::read_to_string(again.path()).unwrap();
    assert!(
        owner.contains(&format!("pid {}", std::process::id())),
        "{owner}"
    );
}

#[test]
fn a_failed_start_leaves_no_run_folder() {
    let work = tempfile::tempdir().unwrap();
    let run = work.path().join("run");
    let out = dpcomp(&[
        "train",
        "--task",
        "surnames",
        "--epochs",
        "1",
        "--data-dir",
        &work.path().join("no-data-here").display().to_string(),
        "--out",
        &run.display().to_string(),
    ]);
    assert!(!out.status.success());
    assert!(!run.exists(), "a failed start left {}", run.display());
}

#[test]
fn resume_refuses_a_corrupted_or_altered_checkpoint() {
    let _serial = common::serial();
    let Some(root) = require_shared_data() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let run = one_epoch_run(&root, work.path());
    let pristine = work.path().join("pristine");
    copy_dir(&run, &pristine);
    let fresh = |name: &str| {
        let dir = work.path().join(name);
        copy_dir(&pristine, &dir);
        dir
    };
    let refused = |dir: &Path, expected: &str| {
        let err = dpcomp_lab::tasks::resume(dir, Some(2))
            .err()
            .expect("the resume was accepted");
        assert!(err.to_string().contains(expected), "{err}");
    };

    // Weight bytes overwritten with 0xFF: refused by the manifest, never trained on as NaN.
    let bad = fresh("weights");
    let weights = bad.join("checkpoint/model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let n = bytes.len();
    bytes[n - 64..].fill(0xFF);
    std::fs::write(&weights, bytes).unwrap();
    refused(&bad, "corrupted");
    let out = dpcomp(&["eval", "--checkpoint", &bad.display().to_string()]);
    assert!(
        !out.status.success() && stderr(&out).contains("corrupted"),
        "{}",
        stderr(&out)
    );

    // Weights written with a NaN behind a resealed manifest (another tool, or a hand edit):
    // refused by the value check, naming the tensor.
    let bad = fresh("nan");
    let dir = bad.join("checkpoint");
    let weights = dir.join("model.safetensors");
    let tensors = tch::Tensor::read_safetensors(&weights).unwrap();
    let _ = tensors[0].1.view([-1]).get(0).fill_(f64::NAN);
    tch::Tensor::write_safetensors(&tensors, &weights).unwrap();
    checkpoint::write_manifest(&dir).unwrap();
    refused(&bad, &format!("{}: holds NaN", tensors[0].0));

    // A file added to the checkpoint, or one removed from it.
    let bad = fresh("added");
    std::fs::write(bad.join("checkpoint/compressor.safetensors"), b"x").unwrap();
    refused(&bad, "not in the checkpoint's manifest");
    let bad = fresh("manifest");
    std::fs::remove_file(bad.join("checkpoint/manifest.json")).unwrap();
    refused(&bad, "manifest");

    // Behind a resealed manifest: a null, shortened or re-parametrised accountant history.
    let bad = fresh("null");
    edit_state(&bad, |s| s["accountant"] = serde_json::Value::Null);
    refused(&bad, "no accountant history");
    let bad = fresh("short");
    edit_state(&bad, |s| {
        let steps = s["accountant"]["history"][0]["steps"].as_u64().unwrap();
        s["accountant"]["history"][0]["steps"] = (steps / 2).into();
    });
    refused(&bad, "ε would be under-counted");
    let bad = fresh("sigma");
    edit_state(&bad, |s| {
        s["accountant"]["history"][0]["noise_multiplier"] = 2.0.into()
    });
    refused(&bad, "but this run's are sigma 1");
    let bad = fresh("rate");
    edit_state(&bad, |s| {
        let q = s["accountant"]["history"][0]["sample_rate"]
            .as_f64()
            .unwrap();
        s["accountant"]["history"][0]["sample_rate"] = (q / 2.0).into()
    });
    refused(&bad, "but this run's are sigma 1");

    // metrics.jsonl lost: the summary would be over rows that are not there.
    let bad = fresh("metrics");
    std::fs::remove_file(bad.join("metrics.jsonl")).unwrap();
    refused(&bad, "0 rows for the 1 epochs");
    let bad = fresh("upstream");
    std::fs::write(
        bad.join("upstream.csv"),
        "step,epoch,upstream_bits,paper_bits\n",
    )
    .unwrap();
    refused(&bad, "rows for the");

    // The untouched copy resumes, and its ε is the uninterrupted run's.
    let good = fresh("good");
    let mut trainer = dpcomp_lab::tasks::resume(&good, Some(2)).unwrap();
    let resumed = trainer.run().unwrap();
    let straight = train(small_private(&root), &work.path().join("straight"));
    assert_eq!(resumed.epsilon, straight.epsilon);
    assert!(resumed.epsilon.unwrap() > 0.0);
}

#[test]
fn resume_flags_must_match_the_run_except_epochs_data_and_device() {
    let _serial = common::serial();
    let Some(root) = require_shared_data() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    // The data through a link, so that it can "move".
    let link = work.path().join("data-here");
    std::os::unix::fs::symlink(std::fs::canonicalize(&root).unwrap(), &link).unwrap();
    let run = work.path().join("run");
    let run_s = run.display().to_string();
    let out = dpcomp(&[
        "train",
        "--task",
        "surnames",
        "--epochs",
        "1",
        "--limit-train",
        "300",
        "--limit-test",
        "200",
        "--noise-multiplier",
        "1.0",
        "--device",
        "cpu",
        "--quiet",
        "--data-dir",
        &link.display().to_string(),
        "--out",
        &run_s,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let config_before = std::fs::read_to_string(run.join("config.toml")).unwrap();

    let out = dpcomp(&[
        "train",
        "--resume",
        "--out",
        &run_s,
        "--noise-multiplier",
        "0.5",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--noise-multiplier: the run has 1.0, given 0.5"),
        "{}",
        stderr(&out)
    );
    let out = dpcomp(&["train", "--resume", "--out", &run_s, "--task", "cifar10"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--task: the run has \"surnames\", given \"cifar10\""),
        "{}",
        stderr(&out)
    );
    // Fewer epochs than done: refused, config.toml untouched.
    let out = dpcomp(&["train", "--resume", "--out", &run_s, "--epochs", "0"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("epochs: 0: expected a positive number"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read_to_string(run.join("config.toml")).unwrap(),
        config_before
    );
    // The same value again is fine (nothing to train: the run is done).
    let out = dpcomp(&[
        "train",
        "--resume",
        "--quiet",
        "--out",
        &run_s,
        "--noise-multiplier",
        "1.0",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));

    // The data folder moves: the resume fails, and --data-dir repairs it (and is recorded).
    let moved = work.path().join("data-moved");
    std::fs::rename(&link, &moved).unwrap();
    let out = dpcomp(&[
        "train", "--resume", "--quiet", "--out", &run_s, "--epochs", "2",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("names: no such folder") && stderr(&out).contains("--data-dir"),
        "{}",
        stderr(&out)
    );
    let out = dpcomp(&[
        "train",
        "--resume",
        "--quiet",
        "--out",
        &run_s,
        "--epochs",
        "2",
        "--data-dir",
        &moved.display().to_string(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let saved = TrainConfig::from_toml_file(&run.join("config.toml")).unwrap();
    assert_eq!(saved.data.data_dir.as_deref(), Some(moved.as_path()));
    assert_eq!(saved.epochs, 2);
    // eval finds the data from the recorded folder, from another working directory.
    let out = Command::new(env!("CARGO_BIN_EXE_dpcomp"))
        .args(["eval", "--checkpoint", &run_s])
        .current_dir(work.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_budget_that_one_step_exceeds_is_refused_and_sigma_zero_is_infinite() {
    let _serial = common::serial();
    let Some(root) = require_shared_data() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let mut config = small_private(&root);
    config.privacy.target_epsilon = Some(0.001);
    let run = work.path().join("tiny-target");
    let mut trainer = dpcomp_lab::tasks::start(config.clone(), &run).unwrap();
    let err = trainer.run().expect_err("an unreachable target trained");
    assert!(err.to_string().contains("already spends epsilon"), "{err}");
    assert!(!run.join("metrics.jsonl").exists());
    assert!(!run.join("summary.json").exists());

    config.privacy.noise_multiplier = Some(0.0);
    config.privacy.target_epsilon = Some(5.0);
    let mut trainer =
        dpcomp_lab::tasks::start(config.clone(), work.path().join("sigma0-target")).unwrap();
    let err = trainer.run().unwrap_err().to_string();
    assert!(
        err.starts_with("privacy.target_epsilon:") && err.contains("inf"),
        "{err}"
    );

    // σ = 0 without a target trains (clipping only), and its ε is infinite, never 0 or null.
    config.privacy.target_epsilon = None;
    let run = work.path().join("sigma0");
    let summary = train(config, &run);
    assert_eq!(summary.epsilon, Some(f64::INFINITY));
    let text = std::fs::read_to_string(run.join("summary.json")).unwrap();
    assert!(text.contains("\"epsilon\": \"inf\""), "{text}");
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert!(
        metrics.lines().all(|l| l.contains("\"epsilon\":\"inf\"")),
        "{metrics}"
    );
}

#[test]
fn a_budget_spent_at_an_epoch_boundary_writes_no_empty_epoch() {
    let _serial = common::serial();
    let Some(root) = require_shared_data() else {
        return;
    };
    // Find the ε after exactly one epoch, then make that the target of a 3-epoch run: the second
    // epoch cannot take a step, and must not be logged as a zero-loss epoch.
    let work = tempfile::tempdir().unwrap();
    let mut config = small_private(&root);
    config.epochs = 1;
    let one = train(config.clone(), &work.path().join("one"))
        .epsilon
        .unwrap();
    config.epochs = 3;
    config.privacy.target_epsilon = Some(one * (1.0 + 1e-9));
    let run = work.path().join("budget");
    let summary = train(config, &run);
    assert_eq!(summary.epochs, 1);
    assert!(summary.stopped.is_some());
    let rows = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert_eq!(rows.lines().count(), 1, "{rows}");
}

#[test]
fn non_finite_settings_are_refused_and_divergence_stops_with_an_error() {
    // convex: a NaN step size, and NaN/inf cells in a CSV.
    let out = dpcomp(&[
        "convex",
        "--data",
        "synthetic:200:5",
        "--algorithm",
        "nonprivate",
        "--step-size",
        "nan",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--step-size: NaN"),
        "{}",
        stderr(&out)
    );
    let work = tempfile::tempdir().unwrap();
    for bad in ["nan", "inf", "-inf"] {
        let csv = work.path().join(format!("{bad}.csv"));
        let mut text = String::from("a,b,label\n");
        for i in 0..20 {
            text.push_str(&format!(
                "{},{},{}\n",
                if i == 7 {
                    bad.to_string()
                } else {
                    i.to_string()
                },
                i % 3,
                i % 2
            ));
        }
        std::fs::write(&csv, text).unwrap();
        let out = dpcomp(&[
            "convex",
            "--data",
            &format!("csv:{}", csv.display()),
            "--algorithm",
            "nonprivate",
        ]);
        assert!(!out.status.success());
        assert!(
            stderr(&out).contains("data row 8, column 1"),
            "{}",
            stderr(&out)
        );
    }
    let Some(root) = common::require_breast_cancer() else {
        return;
    };
    let data = root.display().to_string();
    // fl: learning rates, momentum and iterations outside their ranges.
    for bad in [
        ["--local-lr", "nan"],
        ["--local-lr", "inf"],
        ["--local-lr", "0"],
        ["--local-lr=-1", "--seed=0"],
        ["--server-lr", "nan"],
        ["--server-momentum", "1.5"],
        ["--rate", "0.5"],
    ] {
        let out = dpcomp(
            &[
                &[
                    "fl",
                    "--dataset",
                    "breast_cancer",
                    "--rounds",
                    "1",
                    "--data-dir",
                    &data,
                ][..],
                &bad[..],
            ]
            .concat(),
        );
        assert!(!out.status.success(), "{bad:?} accepted");
        let flag = bad[0].split('=').next().unwrap();
        assert!(
            stderr(&out).contains(&format!("{flag}: ")),
            "{bad:?}: {}",
            stderr(&out)
        );
    }
    // FL-CS's OWL-QN iterations, a compressor option as in training.
    let out = dpcomp(&[
        "fl",
        "--dataset",
        "breast_cancer",
        "--rounds",
        "1",
        "--compressor-option",
        "iterations=0",
        "--data-dir",
        &data,
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out)
            .contains("--compressor-option: iterations: 0: expected at least one OWL-QN iteration"),
        "{}",
        stderr(&out)
    );
    // fl and train runs whose loss overflows stop with an error naming the round / epoch.
    let out = dpcomp(&[
        "fl",
        "--dataset",
        "breast_cancer",
        "--rounds",
        "3",
        "--compressor",
        "identity",
        "--local-lr",
        "1e38",
        "--data-dir",
        &data,
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("non-finite test loss after round 1"),
        "{}",
        stderr(&out)
    );
    let run = work.path().join("diverged");
    let out = dpcomp(&[
        "train",
        "--task",
        "surnames",
        "--epochs",
        "3",
        "--limit-train",
        "300",
        "--limit-test",
        "100",
        "--lr",
        "1e38",
        "--max-grad-norm",
        "inf",
        "--device",
        "cpu",
        "--quiet",
        "--data-dir",
        &data,
        "--out",
        &run.display().to_string(),
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("non-finite training loss in epoch 1"),
        "{}",
        stderr(&out)
    );
    let rows = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert_eq!(
        rows.lines().count(),
        1,
        "trained on after diverging: {rows}"
    );
}

/// `convex --radius 1e30` reported a negative excess empirical risk: the reference minimiser's
/// step R / sqrt(k) jumped to risks of 1e30 and never left 0. Excess risk is >= 0 (within the
/// solver's tolerance) at every radius, for every algorithm whose output lies in the ball.
#[test]
fn excess_empirical_risk_is_never_negative() {
    use dpcomp_lab::convex::{self, loss::Loss, Algorithm, Calibration, ConvexSettings};
    // |w*| 4: points with margin |<x, w*>| >= 1 inside the unit ball (|w*| <= 1 would have none).
    let data = dpcomp::data::tabular::synthetic(2000, 10, 4.0, 4).unwrap();
    for radius in [0.1, 1.0, 100.0, 1e30] {
        for (algorithm, loss) in [
            (Algorithm::Nonprivate, "hinge"),
            (Algorithm::Gradient, "hinge"),
            (Algorithm::Nonprivate, "qhinge:1.5"),
            (Algorithm::Nonprivate, "logistic"),
        ] {
            let settings = ConvexSettings {
                loss: Loss::parse(loss).unwrap(),
                algorithm,
                calibration: Calibration::Accountant,
                epsilon: 4.0,
                delta: None,
                radius,
                unbounded: false,
                steps: Some(2000),
                step_size: None,
                seed: 0,
            };
            let start = std::time::Instant::now();
            let report = convex::run(&data, &settings).unwrap();
            eprintln!(
                "R {radius} {algorithm:?} {loss}: excess {} in {:.1} s",
                report.excess_empirical_risk,
                start.elapsed().as_secs_f64()
            );
            assert!(
                report.excess_empirical_risk >= -1e-9,
                "R {radius} {algorithm:?} {loss}: excess {} (train {}, reference {})",
                report.excess_empirical_risk,
                report.train_risk,
                report.reference_risk
            );
        }
    }
}

/// Grid files: a name must be one folder (not `../../x`), and a repeated axis value (the same
/// cell twice) is an error rather than one run listed twice.
#[test]
fn grid_names_stay_inside_runs_and_cells_are_distinct() {
    let work = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = work.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let base = "[base]\ntask = \"surnames\"\n[profiles.cpu]\nepochs = 1\n";
    for (file, text, expected) in [
        (
            "escape.toml",
            format!("name = \"../../x\"\n{base}[grid]\nseed = [0]\n"),
            "name \"../../x\"",
        ),
        (
            "dot.toml",
            format!("name = \"..\"\n{base}[grid]\nseed = [0]\n"),
            "name \"..\"",
        ),
        (
            "label.toml",
            format!("name = \"ok\"\n{base}[grid]\nv = [{{ label = \"a/b\", lr = 1.0 }}]\n"),
            "label \"a/b\"",
        ),
        (
            "twice.toml",
            format!("name = \"ok\"\n{base}[grid]\nseed = [0, 0]\n"),
            "appears twice",
        ),
    ] {
        let path = write(file, &text);
        let runs = work.path().join("runs");
        let out = dpcomp(&[
            "grid",
            &path.display().to_string(),
            "--runs",
            &runs.display().to_string(),
            "--list",
        ]);
        assert!(!out.status.success(), "{file} accepted");
        assert!(stderr(&out).contains(expected), "{file}: {}", stderr(&out));
        assert!(!work.path().join("x").exists());
    }
}

/// Smaller probes: `bench --steps 0` printed -0.0 ms; the flags' help texts were empty.
#[test]
fn bench_needs_a_step_and_every_training_flag_is_documented() {
    let out = dpcomp(&["bench", "dp", "--task", "surnames", "--steps", "0"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--steps"), "{}", stderr(&out));
    let help = String::from_utf8_lossy(&dpcomp(&["train", "--help"]).stdout).into_owned();
    for flag in [
        "--epochs",
        "--batch-size",
        "--lr",
        "--momentum",
        "--seed",
        "--delta",
        "--max-seq-len",
        "--bert-dir",
        "--secure-noise",
        "--clipping",
        "--optimizer",
        "--adam-beta1",
        "--adam-beta2",
        "--adam-eps",
    ] {
        let line = help
            .lines()
            .position(|l| l.trim_start().starts_with(&format!("{flag} ")))
            .unwrap_or_else(|| panic!("{flag} missing from train --help"));
        let next = help.lines().nth(line + 1).unwrap_or_default().trim();
        assert!(
            !next.is_empty() && !next.starts_with("--"),
            "{flag} has no help text"
        );
    }
}

/// User data that used to reach LibTorch unchecked (a C++ panic): a BERT config.json with 0 heads
/// or layers, a --max-seq-len beyond the position table, a stored config.toml with batch size 0.
#[test]
fn bert_configs_and_stored_settings_are_checked_before_any_tensor() {
    let _serial = common::serial();
    use dpcomp::models::bert::BertConfig;
    let work = tempfile::tempdir().unwrap();
    let source = common::bert_dir();
    let text = std::fs::read_to_string(source.join("config.json")).unwrap();
    let original: serde_json::Value = serde_json::from_str(&text).unwrap();
    for (field, value, expected) in [
        (
            "num_attention_heads",
            0,
            "num_attention_heads 0: expected at least 1",
        ),
        (
            "num_hidden_layers",
            0,
            "num_hidden_layers 0: expected at least 1",
        ),
        ("vocab_size", -3, "vocab_size -3"),
    ] {
        let mut config = original.clone();
        config[field] = value.into();
        let path = work.path().join(format!("{field}.json"));
        std::fs::write(&path, config.to_string()).unwrap();
        let err = BertConfig::from_file(&path).expect_err("a broken config was accepted");
        assert!(err.to_string().contains(expected), "{err}");
    }
    // A sequence length beyond the position table, refused by the SNLI loader (which needs
    // SNLI's folder, not shipped).
    if let Some(snli_root) = common::require_snli() {
        let positions = original["max_position_embeddings"].as_u64().unwrap() as usize;
        let config_path = source.join("config.json");
        let limits = BertConfig::from_file(&config_path)
            .unwrap()
            .encoder_limits(&config_path);
        let err =
            dpcomp::data::snli::load(&snli_root.join("snli_1.0"), &source, positions + 1, &limits)
                .expect_err("a sequence length beyond the position table was accepted");
        assert!(err.to_string().starts_with("data.max_seq_len:"), "{err}");
    }
    let Some(root) = require_shared_data() else {
        return;
    };

    // A run folder whose config.toml says batch_size = 0: eval and resume refuse it.
    let run = one_epoch_run(&root, work.path());
    let path = run.join("config.toml");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("batch_size = 32", "batch_size = 0");
    std::fs::write(&path, text).unwrap();
    let out = dpcomp(&["eval", "--checkpoint", &run.display().to_string()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("batch_size: 0"), "{}", stderr(&out));
    let err = dpcomp_lab::tasks::resume(&run, Some(2))
        .err()
        .expect("batch size 0 was resumed");
    assert!(err.to_string().contains("batch_size"), "{err}");
}

/// `--bert-dir`'s default is relative: it is found from any working directory (the project
/// folder is searched too), and a folder found nowhere is named with every place looked.
#[test]
fn the_default_bert_folder_is_found_from_anywhere() {
    let Some(root) = common::require_snli() else {
        return;
    };
    let root = std::fs::canonicalize(root).unwrap();
    let work = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_dpcomp"))
            .args([
                "train",
                "--task",
                "snli",
                "--epochs",
                "1",
                "--limit-train",
                "64",
                "--limit-test",
                "32",
                "--device",
                "cpu",
                "--quiet",
                "--data-dir",
                &root.display().to_string(),
                "--out",
                &work
                    .path()
                    .join(format!("run{}", extra.len()))
                    .display()
                    .to_string(),
            ])
            .args(extra)
            .current_dir(work.path())
            .output()
            .unwrap()
    };
    let out = run(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run(&["--bert-dir", "nowhere/bert"]);
    assert!(!out.status.success());
    let message = stderr(&out);
    assert!(
        message.contains("--bert-dir: no BERT folder") && message.contains("nowhere/bert, "),
        "{message}"
    );
}

/// `dpcomp plot RUN` on a single run said it had no finished runs; it is a grid of one.
#[test]
fn plot_draws_a_single_run() {
    let _serial = common::serial();
    let Some(root) = require_shared_data() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let run = one_epoch_run(&root, work.path());
    let before = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let figures = work.path().join("figures");
    let out = dpcomp(&[
        "plot",
        &run.display().to_string(),
        "--out",
        &figures.display().to_string(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(figures.join("accuracy_per_epoch.png").is_file());
    // Reading a run's logs never rewrites them.
    assert_eq!(
        std::fs::read_to_string(run.join("metrics.jsonl")).unwrap(),
        before
    );
}

/// A flag the run would not read is refused rather than silently ignored; a measurement
/// scheduled after the run's last epoch is a warning (the run may be extended to reach it).
#[test]
fn flags_that_do_not_apply_are_refused_or_warned() {
    let work = tempfile::tempdir().unwrap();
    let out_dir = work.path().join("run").display().to_string();
    for (flags, expected) in [
        (
            &["--rate", "16"][..],
            "--rate: --rate is not a setting of identity; it accepts: none",
        ),
        (
            &["--compressor", "dgc", "--rank", "4"][..],
            "--rank: --rank is not a setting of dgc; it accepts: rate,",
        ),
        (
            &["--compressor", "powersgd", "--rate", "16"][..],
            "--rate: --rate is not a setting of powersgd; it accepts: rank,",
        ),
        (
            &["--physical-batch-size", "8"][..],
            "--physical-batch-size: applies to DP training (--noise-multiplier)",
        ),
    ] {
        let mut args = vec!["train", "--task", "surnames", "--out", &out_dir];
        args.extend_from_slice(flags);
        let out = dpcomp(&args);
        assert!(!out.status.success(), "{flags:?} accepted");
        assert!(
            stderr(&out).contains(expected),
            "{flags:?}: {}",
            stderr(&out)
        );
        assert!(
            !work.path().join("run").exists(),
            "{flags:?} left a run folder"
        );
    }
    // With DP the physical batch applies and is accepted.
    let mut config = dpcomp_lab::tasks::paper_defaults(Task::Surnames);
    config.privacy.noise_multiplier = Some(1.0);
    config.privacy.physical_batch_size = Some(8);
    config.validate().unwrap();

    config.epochs = 10;
    config.analysis.grad_error_epochs = vec![0, 1, 10, 50, 100];
    assert_eq!(
        config.warnings(),
        vec!["`analysis.grad_error_epochs` [50, 100] lie beyond the run's 10 epochs and will not be measured (resume the run with more `epochs`)".to_string()]
    );
    config.epochs = 100;
    assert!(config.warnings().is_empty());
    // Settings of an optimiser or clipping rule the run does not use.
    let mut unused = config.clone();
    unused.optimizer.adam_beta2 = 0.99;
    unused.privacy.target_quantile = 0.7;
    let said = unused.warnings();
    assert_eq!(said.len(), 2, "{said:?}");
    assert!(said[0].starts_with(
        "`optimizer.adam_beta1`/`optimizer.adam_beta2`/`optimizer.adam_eps` are set but the optimizer is SGD"
    ));
    assert!(said[1].contains("clipping is not adaptive"));
    unused.optimizer.kind = dpcomp::config::OptimizerKind::Adam;
    unused.optimizer.momentum = 0.9;
    unused.privacy.clipping = dpcomp::config::ClippingMode::Adaptive;
    assert_eq!(
        unused.warnings(),
        vec!["`optimizer.momentum` 0.9 has no effect with Adam (its first moment is `optimizer.adam_beta1`)".to_string()]
    );
    // The library reports it through `log`; the command line shows it as a warning.
    if let Some(root) = common::shared_data() {
        let out_dir = work.path().join("warned");
        let out = dpcomp(&[
            "train",
            "--task",
            "surnames",
            "--epochs",
            "1",
            "--limit-train",
            "64",
            "--limit-test",
            "32",
            "--grad-error-epochs",
            "5",
            "--quiet",
            "--data-dir",
            root.to_str().unwrap(),
            "--out",
            out_dir.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("warning: --grad-error-epochs [5] lie beyond the run's 1 epochs and will not be measured (resume the run with more --epochs)"),
            "{}",
            stderr(&out)
        );
    }
    // An OS error is printed once (it was in the message and again as its cause).
    let out = dpcomp(&["train", "--task", "surnames", "--out", "/dev/null/run"]);
    let err = stderr(&out);
    assert!(!out.status.success());
    assert_eq!(err.matches("Not a directory").count(), 1, "{err}");
}
