//! Same seeds, same results: committed cells of the training, audit and convex grids
//! (experiments/runs, experiments/results), run again from their experiment files through
//! `dpcomp grid` (training and audit cells for their first epoch), give the numbers their
//! committed logs and tables hold. (The federated grids' cells are
//! `tests/federated/fl_committed_cells.rs`.) The cells read the Surnames names and the
//! breast-cancer table the repository ships (data/), so these run on a fresh clone.
//!
//! Exactly equal: every metric of the epoch (losses, accuracies, ε, clipped fraction, payload
//! bits) and each convex table row. Not compared: timings, which no two runs share, and what the
//! rows recorded differently then (`RECORDED_SINCE`, `AUDIT_RECORDED_SINCE`). The gradient-error
//! rows (sums of squares over 118k weights in f64) agree to 1e-12 relative: LibTorch's CPU
//! reductions add in an order that depends on the vector width and the thread count.

use crate::common;
use std::path::{Path, PathBuf};

/// The repository's root.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A copy of `experiments/<file>` in `dir` whose profile `profile` trains `epochs` epochs
/// (and measures the gradient error only at those), everything else as committed: the
/// cells keep their names and settings, so their first epochs are the committed ones' (no
/// setting of an epoch depends on how many follow it).
fn shortened(file: &str, profile: &str, epochs: i64, dir: &Path) -> PathBuf {
    let path = root().join("experiments").join(file);
    let mut experiment: toml::Table =
        toml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let settings = experiment["profiles"]
        .as_table_mut()
        .and_then(|p| p.get_mut(profile))
        .and_then(toml::Value::as_table_mut)
        .unwrap_or_else(|| panic!("{file}: no profile {profile}"));
    settings.insert("epochs".into(), toml::Value::Integer(epochs));
    if let Some(toml::Value::Array(at)) = settings.get_mut("grad_error_epochs") {
        at.retain(|e| e.as_integer().is_some_and(|e| e <= epochs));
    }
    let copy = dir.join(file);
    std::fs::write(&copy, toml::to_string(&experiment).unwrap()).unwrap();
    copy
}

/// `dpcomp grid <experiment> --profile <profile> --only ... --runs <runs>` on the shipped data.
fn grid(experiment: &Path, profile: &str, only: &[&str], runs: &Path) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_dpcomp"));
    command
        .args(["grid", experiment.to_str().unwrap(), "--profile", profile])
        .arg("--runs")
        .arg(runs)
        .env("DPCOMP_DATA", root().join("data"))
        .env("OMP_NUM_THREADS", "1");
    for axis in only {
        command.args(["--only", axis]);
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        experiment.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The first `n` rows of a run's log `name` (plain or packed).
fn rows(dir: &Path, name: &str, n: usize) -> Vec<serde_json::Value> {
    dpcomp::run_log::read_rows(&dir.join(name), n)
        .unwrap()
        .unwrap_or_else(|| panic!("{}: no {name}", dir.display()))
}

/// Every number of `a` and `b` (JSON of the same shape) within `relative` of each other,
/// everything else equal.
fn assert_close(a: &serde_json::Value, b: &serde_json::Value, relative: f64, at: &str) {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!(
                (x - y).abs() <= relative * x.abs().max(y.abs()),
                "{at}: {x} against {y} committed"
            );
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{at}");
            for (i, (x, y)) in x.iter().zip(y).enumerate() {
                assert_close(x, y, relative, &format!("{at}[{i}]"));
            }
        }
        (Value::Object(x), Value::Object(y)) => {
            assert_eq!(
                x.keys().collect::<Vec<_>>(),
                y.keys().collect::<Vec<_>>(),
                "{at}"
            );
            for (k, v) in x {
                assert_close(v, &y[k], relative, &format!("{at}.{k}"));
            }
        }
        _ => assert_eq!(a, b, "{at}"),
    }
}

/// What the committed Surnames cells' rows recorded differently: `noise` (no field then: null),
/// `upstream_bits` and `upstream_gigabits` (the wire format's message header has grown by 120
/// bytes since: the same payload bits, `upstream_paper_gib`, are compared), and
/// `host_reads_per_step` (not recorded then).
const RECORDED_SINCE: [&str; 4] = [
    "noise",
    "upstream_bits",
    "upstream_gigabits",
    "host_reads_per_step",
];

/// What the committed audit cells' rows did not record: `host_reads_per_step`.
const AUDIT_RECORDED_SINCE: [&str; 1] = ["host_reads_per_step"];

/// A metrics row without its timings and the fields `recorded_since`.
fn comparable(row: serde_json::Value, recorded_since: &[&str]) -> serde_json::Value {
    let mut row = common::without_timings(row);
    for field in recorded_since {
        row.as_object_mut().unwrap().remove(*field);
    }
    row
}

/// Surnames training cells (DP-SGD at σ 0.4 with DGC x16 and x256, from the compression
/// paper's grid): the first epoch's loss, accuracies, ε, clipped fraction and payload bits, and
/// the gradient-error measurements before training and after epoch 1.
#[test]
fn training_cells_run_again_to_their_committed_first_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let file = shortened("surnames_dgc.toml", "full", 1, dir.path());
    let runs = dir.path().join("runs");
    for rate in ["16", "256"] {
        let cell = format!("noise_multiplier-0.4_rate-{rate}_seed-0");
        let only = [
            "noise_multiplier=0.4".to_string(),
            format!("rate={rate}"),
            "seed=0".to_string(),
        ];
        let only: Vec<&str> = only.iter().map(String::as_str).collect();
        grid(&file, "full", &only, &runs);
        let again = runs.join("surnames_dgc/full").join(&cell);
        let committed = root()
            .join("experiments/runs/surnames_dgc/full")
            .join(&cell);
        let metrics = |d: &Path| {
            rows(d, "metrics.jsonl", 1)
                .into_iter()
                .map(|row| comparable(row, &RECORDED_SINCE))
                .collect::<Vec<_>>()
        };
        assert_eq!(metrics(&again), metrics(&committed), "{cell}");
        let (a, c) = (
            rows(&again, "grad_error.jsonl", 2),
            rows(&committed, "grad_error.jsonl", 2),
        );
        assert_eq!(a.len(), 2, "{cell}: epochs 0 and 1");
        for (a, c) in a.iter().zip(&c) {
            let at = format!("{cell} grad_error epoch {}", c["epoch"]);
            assert_close(a, c, 1e-12, &at);
        }
    }
}

/// Surnames audit cells at σ 0.8 (1,000 canaries of seed 19, 100 guesses): the white-box grid's
/// uncompressed and PowerSGD rank-1 cells and the black-box grid's uncompressed cell, each run
/// again for its first epoch. Every metric of that epoch equals the committed log's (the
/// canaries' draws come from the audit's own generator and no setting of an epoch depends on how
/// many follow it), and `audit.json` holds what is fixed before the run (the canaries drawn in,
/// the guesses, the confidence, δ, the bound's maximum, σ and q) as committed, with the steps
/// and accounted ε of the committed first epoch. The audited lower bound itself needs the
/// whole run (ten epochs) and is not compared. The grids' DGC and Denoise cells are not run
/// again: their sampled top-k breaks ties on the CPU differently since they were committed, so
/// they no longer reproduce bit for bit.
#[test]
fn audit_cells_run_again_to_their_committed_first_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    for (file, compressor) in [
        ("audit_surnames.toml", "none"),
        ("audit_surnames.toml", "powersgd-r1"),
        ("audit_surnames_blackbox.toml", "none"),
    ] {
        let experiment = shortened(file, "cpu", 1, dir.path());
        let only = format!("compressor={compressor}");
        grid(&experiment, "cpu", &[&only, "noise_multiplier=0.8"], &runs);
        let name = file.trim_end_matches(".toml");
        let cell = format!("compressor-{compressor}_noise_multiplier-0.8");
        let at = format!("{name}/{cell}");
        let again = runs.join(name).join("cpu").join(&cell);
        let committed = root()
            .join("experiments/runs")
            .join(name)
            .join("cpu")
            .join(&cell);
        let first =
            |d: &Path| comparable(rows(d, "metrics.jsonl", 1).remove(0), &AUDIT_RECORDED_SINCE);
        let (row, committed_row) = (first(&again), first(&committed));
        assert_eq!(row, committed_row, "{at}: the first epoch");
        let report = |d: &Path| -> serde_json::Value {
            let path = d.join("audit.json");
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        };
        let (report, committed_report) = (report(&again), report(&committed));
        for field in [
            "task",
            "compressor",
            "kind",
            "observe",
            "dense",
            "noise_multiplier",
            "sample_rate",
            "max_bound",
        ] {
            assert_eq!(
                report[field], committed_report[field],
                "{at}: audit.json {field}"
            );
        }
        for field in ["canaries", "included", "guesses", "confidence", "delta"] {
            assert_eq!(
                report["outcome"][field], committed_report["outcome"][field],
                "{at}: audit.json outcome.{field}"
            );
        }
        assert_eq!(
            report["steps"], committed_row["steps"],
            "{at}: audit.json steps"
        );
        assert_eq!(
            report["accounted_epsilon"], committed_row["epsilon"],
            "{at}: audit.json accounted_epsilon"
        );
    }
}

/// Convex DP-SGD on the breast-cancer table (logistic loss, output and gradient perturbation
/// at ε 1 and the non-private baseline, 20 seeds each): the rows of the committed table.
#[test]
fn convex_cells_run_again_to_their_committed_rows() {
    let dir = tempfile::tempdir().unwrap();
    let mut experiment: toml::Table =
        toml::from_str(&std::fs::read_to_string(root().join("experiments/convex.toml")).unwrap())
            .unwrap();
    let grid_axes = experiment["grid"].as_table_mut().unwrap();
    grid_axes.insert("data".into(), toml::Value::from(vec!["breast_cancer"]));
    grid_axes.insert("loss".into(), toml::Value::from(vec!["logistic"]));
    grid_axes.insert("epsilon".into(), toml::Value::from(vec![1.0]));
    let file = dir.path().join("convex.toml");
    std::fs::write(&file, toml::to_string(&experiment).unwrap()).unwrap();
    let runs = dir.path().join("runs");
    grid(&file, "cpu", &[], &runs);
    let again = std::fs::read_to_string(runs.join("convex/cpu/results.csv")).unwrap();
    let committed =
        std::fs::read_to_string(root().join("experiments/results/convex.cpu.csv")).unwrap();
    let mut lines = again.lines();
    assert_eq!(lines.next(), committed.lines().next(), "the header");
    let again: Vec<&str> = lines.collect();
    assert_eq!(again.len(), 3, "output, gradient, non-private: {again:?}");
    for row in again {
        assert!(
            committed.lines().any(|c| c == row),
            "{row}: not a committed row of experiments/results/convex.cpu.csv"
        );
    }
}
