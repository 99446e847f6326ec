//! Round three of the hostile probes: settings that mean nothing in the run they were given to
//! (DP-only flags on a non-private run, white-box audit flags on a black-box audit), a
//! `config.toml` edited between a kill and `--resume`, `eval` on other data than the run's, and
//! an audit of shuffled batches reporting its ε without the approximation caveat. Each test
//! failed before its fix.

use crate::common;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn dpcomp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dpcomp"))
        .args(args)
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Exit 1 (an error, not a panic's 101 or clap's 2) with `expected` in the message.
#[track_caller]
fn refused(out: &Output, expected: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains(expected), "expected {expected:?} in: {err}");
}

#[track_caller]
fn succeeded(out: &Output) {
    assert_eq!(out.status.code(), Some(0), "{}", stderr(out));
}

/// A small Surnames training run's arguments into `out`, with `extra` flags.
fn train_args(data: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "train",
        "--task",
        "surnames",
        "--limit-train",
        "100",
        "--limit-test",
        "20",
        "--epochs",
        "1",
        "--quiet",
        "--data-dir",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(data.display().to_string());
    args.push("--out".into());
    args.push(out.display().to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn run(args: &[String]) -> Output {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    dpcomp(&args)
}

/// `--local-noise`, `--secure-noise`, `--accountant` other than the default and `--grad-sample`
/// other than tape were accepted silently by a non-private run (with thread workers too): each
/// is refused by its flag, saying DP needs `--noise-multiplier` or `--target-epsilon`, and
/// nothing is written. Their defaults (the accountant's is pld, the tight one), given
/// explicitly, still train.
#[test]
fn dp_only_flags_without_dp_are_refused_by_name() {
    let Some(data) = common::require_shared_data() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 6] = [
        (
            &["--local-noise"],
            "--local-noise: true: applies to DP training only",
        ),
        (
            &["--secure-noise"],
            "--secure-noise: true: applies to DP training only",
        ),
        (
            &["--accountant", "rdp"],
            "--accountant: rdp: applies to DP training only",
        ),
        (
            &["--grad-sample", "oracle"],
            "--grad-sample: oracle: applies to DP training only",
        ),
        (
            &["--grad-sample", "two-pass"],
            "--grad-sample: two-pass: applies to DP training only",
        ),
        (
            &["--thread-workers", "2", "--local-noise"],
            "--local-noise: true: applies to DP training only",
        ),
    ];
    for (i, (flags, expected)) in cases.iter().enumerate() {
        let out_dir = work.path().join(format!("case{i}"));
        let out = run(&train_args(&data, &out_dir, flags));
        refused(&out, expected);
        refused(&out, "needs --noise-multiplier or --target-epsilon");
        assert!(!out_dir.exists(), "{flags:?}: nothing is written");
    }
    // The defaults, given explicitly, are no request for DP.
    let defaults = work.path().join("defaults");
    let out = run(&train_args(
        &data,
        &defaults,
        &[
            "--accountant",
            "pld",
            "--grad-sample",
            "tape",
            "--local-noise",
            "false",
            "--secure-noise",
            "false",
        ],
    ));
    succeeded(&out);
    // Under DP they are taken.
    let private = work.path().join("private");
    let out = run(&train_args(
        &data,
        &private,
        &[
            "--noise-multiplier",
            "1",
            "--accountant",
            "rdp",
            "--secure-noise",
        ],
    ));
    succeeded(&out);
}

/// `audit --black-box` ignored `--observe final` and `--dense` (white-box settings): both are
/// refused by name before anything is trained.
#[test]
fn black_box_audit_refuses_white_box_flags() {
    let Some(data) = common::require_shared_data() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let data = data.display().to_string();
    for (flags, expected) in [
        (
            &["--observe", "final"][..],
            "--observe final: applies to white-box canaries only",
        ),
        (
            &["--dense"][..],
            "--dense: applies to white-box canaries only",
        ),
    ] {
        let out_dir = work.path().join(flags[0].trim_start_matches('-'));
        let out_text = out_dir.display().to_string();
        let mut args = vec![
            "audit",
            "--task",
            "surnames",
            "--limit-train",
            "100",
            "--limit-test",
            "20",
            "--epochs",
            "1",
            "--quiet",
            "--noise-multiplier",
            "1",
            "--canaries",
            "10",
            "--black-box",
            "--data-dir",
            &data,
            "--out",
            &out_text,
        ];
        args.extend_from_slice(flags);
        let out = dpcomp(&args);
        refused(&out, expected);
        refused(&out, "--black-box");
        assert!(!out_dir.exists(), "{flags:?}: nothing is written");
    }
}

/// A finished one-epoch DP run in `work/name`, to resume or evaluate.
fn trained_run(data: &Path, work: &Path, name: &str) -> PathBuf {
    let run_dir = work.join(name);
    let out = run(&train_args(data, &run_dir, &["--noise-multiplier", "1"]));
    succeeded(&out);
    run_dir
}

/// Replaces the line `key = ...` of `run/config.toml`.
fn edit_config(run_dir: &Path, key: &str, value: &str) {
    let path = run_dir.join("config.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let prefix = format!("{key} = ");
    assert!(text.lines().any(|l| l.starts_with(&prefix)), "{text}");
    let edited: Vec<String> = text
        .lines()
        .map(|l| {
            if l.starts_with(&prefix) {
                format!("{key} = {value}")
            } else {
                l.to_string()
            }
        })
        .collect();
    std::fs::write(&path, edited.join("\n") + "\n").unwrap();
}

fn resume(run_dir: &Path, epochs: &str) -> Output {
    dpcomp(&[
        "train",
        "--out",
        &run_dir.display().to_string(),
        "--resume",
        "--epochs",
        epochs,
        "--quiet",
    ])
}

/// `delta` or `sampling` edited in config.toml between a kill and `--resume` was accepted
/// (config.toml is outside the checkpoint's manifest): the checkpoint records the settings it
/// was saved with, and the resume is refused naming config.toml and the field, leaving the
/// run as it was. An unedited run resumes, and so does a checkpoint without the record.
#[test]
fn resume_refuses_a_config_toml_edited_since_the_checkpoint() {
    let Some(data) = common::require_shared_data() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let base = trained_run(&data, work.path(), "base");
    for (key, value, expected) in [
        (
            "delta",
            "0.5",
            "privacy.delta: the checkpoint was saved with 0.00008, config.toml now has 0.5",
        ),
        (
            "sampling",
            "\"shuffle\"",
            "privacy.sampling: the checkpoint was saved with \"poisson\", config.toml now has \"shuffle\"",
        ),
    ] {
        let run_dir = work.path().join(key);
        copy_dir(&base, &run_dir);
        edit_config(&run_dir, key, value);
        let metrics = std::fs::read(run_dir.join("metrics.jsonl")).unwrap();
        let state = std::fs::read(run_dir.join("checkpoint/state.json")).unwrap();
        let out = resume(&run_dir, "2");
        refused(&out, "config.toml: edited since the checkpoint was saved");
        refused(&out, expected);
        assert_eq!(std::fs::read(run_dir.join("metrics.jsonl")).unwrap(), metrics);
        assert_eq!(
            std::fs::read(run_dir.join("checkpoint/state.json")).unwrap(),
            state
        );
    }
    // Unedited: resumes, twice (the second checkpoint records the resumed run's settings).
    let plain = work.path().join("plain");
    copy_dir(&base, &plain);
    succeeded(&resume(&plain, "2"));
    succeeded(&resume(&plain, "3"));
    // A checkpoint made before the record: no check, as before.
    let old = work.path().join("old");
    copy_dir(&base, &old);
    let dir = dpcomp::train::checkpoint::find(&old).unwrap();
    let path = dir.join("state.json");
    let mut state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(state.as_object_mut().unwrap().remove("settings").is_some());
    std::fs::write(&path, serde_json::to_string_pretty(&state).unwrap()).unwrap();
    dpcomp::train::checkpoint::write_manifest(&dir).unwrap();
    succeeded(&resume(&old, "2"));
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

/// `eval --data-dir` on a names folder whose files were rotated (every label wrong) reported
/// 0% with exit 0: refused like `--resume`, by the checkpoint's data fingerprint.
#[test]
fn eval_on_other_data_is_refused() {
    let Some(root) = common::require_shared_data() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("data");
    std::fs::create_dir_all(data.join("names")).unwrap();
    let mut files: Vec<_> = std::fs::read_dir(root.join("names"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for f in &files {
        std::fs::copy(f, data.join("names").join(f.file_name().unwrap())).unwrap();
    }
    let run_dir = trained_run(&data, work.path(), "run");
    let checkpoint = run_dir.display().to_string();
    succeeded(&dpcomp(&["eval", "--checkpoint", &checkpoint]));
    // Rotate the files' contents: each language's names now sit under the next language.
    let rotated = work.path().join("rotated");
    std::fs::create_dir_all(rotated.join("names")).unwrap();
    for (i, f) in files.iter().enumerate() {
        let text = std::fs::read(&files[(i + 1) % files.len()]).unwrap();
        std::fs::write(rotated.join("names").join(f.file_name().unwrap()), text).unwrap();
    }
    let rotated_text = rotated.display().to_string();
    let out = dpcomp(&[
        "eval",
        "--checkpoint",
        &checkpoint,
        "--data-dir",
        &rotated_text,
    ]);
    refused(
        &out,
        &format!("--data-dir {rotated_text}: holds another test split than {checkpoint}"),
    );
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
}

/// `audit --sampling shuffle` printed and wrote its accounted ε without the caveat that the
/// accountant assumes Poisson sampling: audit.json's `sampling` and the printed line carry it,
/// as summary.json and `train`'s line do.
#[test]
fn shuffled_audit_reports_its_epsilon_as_an_approximation() {
    let Some(data) = common::require_shared_data() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let out_dir = work.path().join("audit");
    let out = dpcomp(&[
        "audit",
        "--task",
        "surnames",
        "--limit-train",
        "100",
        "--limit-test",
        "20",
        "--epochs",
        "1",
        "--quiet",
        "--noise-multiplier",
        "1",
        "--sampling",
        "shuffle",
        "--canaries",
        "10",
        "--data-dir",
        &data.display().to_string(),
        "--out",
        &out_dir.display().to_string(),
    ]);
    succeeded(&out);
    let line = stdout(&out);
    assert!(
        line.contains(
            "(shuffled batches: the accountant assumes Poisson sampling, so this ε is an approximation)"
        ),
        "{line}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("audit.json")).unwrap())
            .unwrap();
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(
        report["sampling"].as_str(),
        Some("shuffle (approximation: the accountant assumes Poisson sampling)")
    );
    assert_eq!(report["sampling"], summary["sampling"]);
}
