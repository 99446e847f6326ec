//! Round three of the hostile probes, on the command line: integers past what a flag can take
//! (refused by the flag's name and range, exit 1, never a panic), worker counts without a bound,
//! a federated fraction below one client a round under DP, `dpcomp convex` failing by default
//! or reporting NaN weights as a result, a slow `grid --list` of a large grid, and messages that
//! named the wrong cause. Each test failed before its fix.

use crate::common;
use std::process::{Command, Output};
use std::time::Instant;

const U64_MAX: &str = "18446744073709551615";

fn dpcomp(args: &[&str]) -> Output {
    dpcomp_with(args, &[])
}

fn dpcomp_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_dpcomp"));
    command.args(args);
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Exit 1 (an error, not a panic's 101) with `expected` in the message.
#[track_caller]
fn refused(out: &Output, expected: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains(expected), "expected {expected:?} in: {err}");
}

/// `fl`'s integer flags past 2^63 - 1 (what config.toml's integers hold): each refused by its
/// flag with the range, before any data is read; `--eval-examples` panicked in LibTorch, the
/// others said "cannot be written as TOML" without a flag.
#[test]
fn federated_integer_flags_past_i64_are_refused_by_their_flag() {
    let work = tempfile::tempdir().unwrap();
    for flag in [
        "--rounds",
        "--local-batch",
        "--patience",
        "--local-steps",
        "--eval-examples",
        "--clients",
    ] {
        let out_dir = work.path().join(flag.trim_start_matches('-'));
        let out = dpcomp(&[
            "fl",
            "--dataset",
            "breast_cancer",
            "--compressor",
            "identity",
            flag,
            U64_MAX,
            "--out",
            &out_dir.display().to_string(),
        ]);
        refused(
            &out,
            &format!("{flag}: {U64_MAX}: expected at most 9223372036854775807"),
        );
        assert!(!out_dir.exists(), "{flag}: nothing is written");
    }
}

/// Every test example at the largest count the flag takes: the count is clamped to the test
/// set, not turned negative.
#[test]
fn federated_eval_examples_at_the_largest_count_evaluates_every_example() {
    let Some(data) = common::require_breast_cancer() else {
        return;
    };
    let out = dpcomp(&[
        "fl",
        "--dataset",
        "breast_cancer",
        "--data-dir",
        &data.display().to_string(),
        "--compressor",
        "identity",
        "--rounds",
        "1",
        "--eval-examples",
        "9223372036854775807",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let summary: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(summary["rounds_run"], 1, "{summary}");
}

/// A fraction whose expected clients a round (q N) is below one, under client-level DP: the
/// noise on the average, σ S / (q N), swamps every update. It read as "training diverged ...
/// lower --local-lr or --server-lr"; now --fraction is refused with the smallest it takes.
#[test]
fn a_federated_fraction_below_one_client_a_round_is_refused_under_dp() {
    let out = dpcomp(&[
        "fl",
        "--dataset",
        "breast_cancer",
        "--rounds",
        "2",
        "--compressor",
        "identity",
        "--fraction",
        "1e-300",
        "--dp",
        "--noise-multiplier",
        "1",
    ]);
    refused(
        &out,
        "--fraction: 1e-300: with 50 clients a round expects 5.000e-299 clients",
    );
    refused(&out, "needs at least one (fraction >= 1 / clients = 0.02)");
    let out = dpcomp(&[
        "fl",
        "--dataset",
        "breast_cancer",
        "--clients",
        "10",
        "--fraction",
        "0.05",
        "--dp",
        "--noise-multiplier",
        "1",
    ]);
    refused(
        &out,
        "--fraction: 0.05: with 10 clients a round expects 0.500 clients",
    );
}

/// Sizes past what memory holds: panics ("capacity overflow", or inside LibTorch) before; each
/// is now refused by its flag with the range it takes.
#[test]
fn sizes_past_memory_are_refused_by_their_flag_with_the_range() {
    refused(
        &dpcomp(&["check-comm", "--elements", U64_MAX]),
        &format!("--elements {U64_MAX}: expected 0 to 268435456 f32 values"),
    );
    refused(
        &dpcomp(&["check-comm", "--threads", U64_MAX, "--elements", "5"]),
        &format!("--threads {U64_MAX}: expected 1 to 256 workers"),
    );
    for spec in [
        format!("synthetic:{U64_MAX}:2"),
        "synthetic:100000000:2".to_string(),
        "synthetic:1000001:2".to_string(),
        "synthetic:100000:101".to_string(),
        "synthetic:9:2".to_string(),
        "synthetic:100:0".to_string(),
    ] {
        refused(
            &dpcomp(&["convex", "--data", &spec, "--algorithm", "nonprivate"]),
            &format!(
                "--data: {spec}: expected 10 <= N <= 1000000 rows of D >= 1 features, N x D <= 10000000"
            ),
        );
    }
}

/// `--thread-workers` had no bound: W 1000 ran for minutes and ended in libgomp's "Thread
/// creation failed", 2^64 - 1 panicked allocating. Refused before anything is written.
#[test]
fn thread_workers_past_the_bound_are_refused_before_anything_is_written() {
    let work = tempfile::tempdir().unwrap();
    for workers in ["0", "257", "1000", U64_MAX] {
        let run = work.path().join(format!("w{}", workers.len()));
        let started = Instant::now();
        let out = dpcomp(&[
            "train",
            "--task",
            "surnames",
            "--epochs",
            "1",
            "--limit-train",
            "10",
            "--thread-workers",
            workers,
            "--out",
            &run.display().to_string(),
        ]);
        refused(
            &out,
            &format!("--thread-workers {workers}: expected 1 to 256 workers"),
        );
        assert!(started.elapsed().as_secs() < 30);
        assert!(!run.exists());
    }
}

/// `check-comm --threads` under a launcher of several processes ran one independent check per
/// process; it is refused as a training run without MPI is. `bench comm --workers 0` was
/// accepted.
#[test]
fn worker_counts_that_cannot_run_are_refused() {
    for launcher in [
        [("PMI_SIZE", "2"), ("PMI_RANK", "1")],
        [("OMPI_COMM_WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_RANK", "0")],
    ] {
        refused(
            &dpcomp_with(
                &["check-comm", "--threads", "2", "--elements", "5"],
                &launcher,
            ),
            "--threads 2: an MPI launcher started 2 processes",
        );
    }
    // Training's thread workers under torchrun (or any launcher of several) likewise.
    refused(
        &dpcomp_with(
            &["train", "--task", "surnames", "--thread-workers", "2"],
            &[("WORLD_SIZE", "2")],
        ),
        "--thread-workers 2: torchrun (WORLD_SIZE) started 2 processes",
    );
    // One process of a launcher, or none: the check runs.
    let out = dpcomp_with(
        &["check-comm", "--threads", "2", "--elements", "5"],
        &[("PMI_SIZE", "1")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("2 worker(s) over threads"));
    for (flag, value, shown) in [
        (
            "--workers",
            "0",
            "--workers: 0: expected worker counts of at least 1",
        ),
        (
            "--workers",
            "1,0",
            "--workers: 1,0: expected worker counts of at least 1",
        ),
        (
            "--model-workers",
            "0,2",
            "--model-workers: 0,2: expected worker counts of at least 1",
        ),
    ] {
        refused(
            &dpcomp(&[
                "bench", "comm", "--task", "surnames", flag, value, "--steps", "1",
            ]),
            shown,
        );
    }
}

/// `dpcomp convex` with its defaults found no feasible β for Theorem 11 on the bundled data
/// and said only "raise epsilon, n or delta": now it names the smallest --epsilon that has one
/// (and the accountant's calibration), and that --epsilon runs.
#[test]
fn an_infeasible_convex_calibration_names_the_epsilon_that_works() {
    let Some(data) = common::require_breast_cancer() else {
        return;
    };
    let data = data.display().to_string();
    let base = ["convex", "--data-dir", data.as_str(), "--steps", "3000"];
    let out = dpcomp(&base);
    let err = stderr(&out);
    refused(&out, "--epsilon: no feasible beta");
    refused(&out, "or --calibration accountant");
    let (_, rest) = err.split_once("give --epsilon ").expect(&err);
    let smallest: f64 = rest.split_whitespace().next().unwrap().parse().unwrap();
    assert!(smallest > 1.0 && smallest < 1e4, "{err}");
    let given = format!("{smallest}");
    let mut feasible = base.to_vec();
    feasible.extend(["--epsilon", given.as_str(), "--json"]);
    let out = dpcomp(&feasible);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert!(
        report["beta"].as_f64().is_some_and(|b| b > 0.0 && b < 1.0),
        "{report}"
    );
    // A little less than that: still infeasible (the number is the smallest, to 3 digits).
    let less = format!("{}", smallest * 0.98);
    let mut infeasible = base.to_vec();
    infeasible.extend(["--epsilon", less.as_str()]);
    refused(&dpcomp(&infeasible), "no feasible beta");
    // The accountant's calibration at the default epsilon.
    let mut accountant = base.to_vec();
    accountant.extend(["--calibration", "accountant"]);
    let out = dpcomp(&accountant);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// A step size that sends SGD to infinity gave NaN weights, "accuracy 0.00%" and exit 0.
#[test]
fn convex_weights_that_are_not_finite_fail_naming_the_step_size() {
    let out = dpcomp(&[
        "convex",
        "--data",
        "synthetic:200:5",
        "--algorithm",
        "nonprivate",
        "--loss",
        "least_squares",
        "--step-size",
        "1e300",
        "--steps",
        "50",
    ]);
    refused(
        &out,
        "--step-size: 1e300: the weights are not finite after 50 steps",
    );
    // The same with a step size that converges.
    let out = dpcomp(&[
        "convex",
        "--data",
        "synthetic:200:5",
        "--algorithm",
        "nonprivate",
        "--step-size",
        "0.1",
        "--steps",
        "50",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// A tiny δ printed as a decimal of hundreds of digits; it prints as 1e-300 now, and the
/// usual δ as before. With the RDP accountant: the default (PLD) refuses δ below 1e-20.
#[test]
fn a_tiny_delta_prints_in_scientific_notation() {
    let epsilon = |delta: &str| {
        let out = dpcomp(&[
            "epsilon",
            "--sample-rate",
            "0.01",
            "--noise-multiplier",
            "1",
            "--steps",
            "100",
            "--delta",
            delta,
            "--accountant",
            "rdp",
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        stdout(&out)
    };
    let text = epsilon("1e-300");
    assert!(text.trim_end().ends_with("at delta 1e-300"), "{text}");
    assert!(text.len() < 80, "{text}");
    let text = epsilon("4.9e-324");
    assert!(text.trim_end().ends_with("at delta 5e-324"), "{text}");
    let text = epsilon("0.00001");
    assert!(text.trim_end().ends_with("at delta 0.00001"), "{text}");
}

/// An empty CIFAR-10 test file read as "not a whole number of 3073-byte records (record 0 is
/// truncated)"; it says the file is empty.
#[test]
fn an_empty_cifar_file_is_called_empty() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("data/cifar-10-batches-bin");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 1..=5 {
        common::write_cifar_file(&dir.join(format!("data_batch_{i}.bin")), &[(vec![3], 9)]);
    }
    std::fs::write(dir.join("test_batch.bin"), b"").unwrap();
    let out = dpcomp(&[
        "train",
        "--task",
        "cifar10",
        "--epochs",
        "1",
        "--quiet",
        "--data-dir",
        &work.path().join("data").display().to_string(),
        "--out",
        &work.path().join("run").display().to_string(),
    ]);
    refused(&out, "test_batch.bin");
    refused(
        &out,
        "the file is empty (0 bytes): expected 3073-byte records",
    );
    assert!(!stderr(&out).contains("truncated"), "{}", stderr(&out));
}

/// `audit --out` on a training run's folder suggested resuming it, which audit cannot; and
/// `audit --target-epsilon` was refused though `train` calibrates σ from it. It calibrates as
/// train does now, and the audit reports the calibrated σ within the target.
#[test]
fn audit_calibrates_from_a_target_and_refuses_a_run_it_cannot_continue() {
    let Some(data) = common::require_shared_data() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let data = data.display().to_string();
    let run = work.path().join("audit");
    let run_text = run.display().to_string();
    let audit = |extra: &[&str]| {
        let mut args = vec![
            "audit",
            "--task",
            "surnames",
            "--limit-train",
            "200",
            "--limit-test",
            "20",
            "--epochs",
            "1",
            "--canaries",
            "40",
            "--quiet",
            "--json",
            "--data-dir",
            data.as_str(),
            "--out",
            run_text.as_str(),
        ];
        args.extend(extra);
        dpcomp(&args)
    };
    let out = audit(&["--target-epsilon", "5"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let sigma = report["noise_multiplier"].as_f64().unwrap();
    let accounted = report["accounted_epsilon"].as_f64().unwrap();
    assert!(sigma > 0.0 && sigma.is_finite(), "{report}");
    assert!(accounted <= 5.0 + 1e-6 && accounted > 1.0, "{report}");
    // The folder now holds that run: another audit is refused without "resume".
    let out = audit(&["--noise-multiplier", "1"]);
    refused(
        &out,
        &format!("--out {}: already holds a run", run.display()),
    );
    refused(&out, "cannot continue one: choose another run folder");
    assert!(!stderr(&out).contains("resume"), "{}", stderr(&out));
    // Neither σ nor a target: the error names both flags.
    let other = work.path().join("other").display().to_string();
    let out = dpcomp(&[
        "audit",
        "--task",
        "surnames",
        "--data-dir",
        data.as_str(),
        "--out",
        other.as_str(),
    ]);
    refused(&out, "--noise-multiplier: not set");
    refused(&out, "--target-epsilon to calibrate it");
}

/// `grid --list` of a 1000 x 1000 grid ran for minutes: a quadratic duplicate-cell check, and
/// an upload estimate encoded afresh for every cell (0.6 ms each on Surnames: 79 s for 100,000
/// cells). A grid of 20,000 cells lists in about a second now; a reader that stops after one
/// line ends the list without a panic; a repeated value is still refused by name.
#[test]
fn a_large_grid_lists_quickly_and_repeated_cells_are_refused() {
    let Some(data) = common::require_shared_data() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let values = |n: usize| {
        (0..n)
            .map(|i| (i + 1).to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let file = work.path().join("large.toml");
    std::fs::write(
        &file,
        format!(
            "name = \"large\"\n[base]\ntask = \"surnames\"\nepochs = 1\ndata_dir = {:?}\n[grid]\nseed = [{}]\nlimit_test = [{}]\n[profiles.cpu]\n",
            data.display().to_string(),
            values(200),
            values(100)
        ),
    )
    .unwrap();
    let runs = work.path().join("runs").display().to_string();
    let file = file.display().to_string();
    let started = Instant::now();
    let out = dpcomp(&["grid", &file, "--list", "--runs", &runs]);
    let seconds = started.elapsed().as_secs_f64();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 20_000);
    assert!(text.lines().all(|l| l.contains("  new  epochs 1  upload ")));
    assert!(seconds < 6.0, "{seconds} s to list 20,000 cells");
    // One line read, then the pipe closed: the list ends quietly.
    let mut child = Command::new(env!("CARGO_BIN_EXE_dpcomp"))
        .args(["grid", &file, "--list", "--runs", &runs])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    assert!(first.starts_with("limit_test-1_seed-1  new"), "{first}");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    let repeated = work.path().join("repeated.toml");
    std::fs::write(
        &repeated,
        "name = \"repeated\"\n[base]\ntask = \"surnames\"\nepochs = 1\n[grid]\nseed = [1, 2, 1]\n[profiles.cpu]\n",
    )
    .unwrap();
    let out = dpcomp(&[
        "grid",
        &repeated.display().to_string(),
        "--list",
        "--runs",
        &runs,
    ]);
    refused(&out, "cell seed-1 appears twice");
}
