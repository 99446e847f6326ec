//! The MPI transport under a real launcher: `mpiexec -n W dpcomp check-comm` for W = 1, 2, 4 (the
//! 2-core machine oversubscribes, which MPICH allows): every collective's result checked on
//! every rank by the binary itself, and the bytes each moved as the formulas say. Needs MPICH's
//! `mpiexec` (scripts/setup.sh installs it with the default `mpi` feature).
#![cfg(feature = "mpi")]

use std::process::Command;

#[test]
fn every_collective_checks_out_under_mpiexec_with_1_2_and_4_ranks() {
    for ranks in [1usize, 2, 4] {
        let output = Command::new("mpiexec")
            .args(["-n", &ranks.to_string()])
            .arg(env!("CARGO_BIN_EXE_dpcomp"))
            .args(["check-comm", "--elements", "100003", "--json"])
            .env("DPCOMP_COLLECTIVE_TIMEOUT", "120")
            .output()
            .expect("mpiexec (MPICH) must be installed: scripts/setup.sh installs it");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{ranks} ranks: {stderr}");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let report: serde_json::Value = serde_json::from_str(stdout.trim())
            .unwrap_or_else(|e| panic!("{ranks} ranks: one JSON line from rank 0 ({e}): {stdout}"));
        assert_eq!(report["workers"], ranks as u64, "{stdout}");
        // Under mpiexec even one rank runs over MPI (the launcher's variables are set).
        assert_eq!(report["transport"], "MPI", "{stdout}");
        let rows = report["rank0"].as_array().unwrap();
        let names: Vec<&str> = rows
            .iter()
            .map(|r| r["collective"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["all_reduce_sum", "all_gather", "broadcast", "barrier"]
        );
        // Rank 0 sends 4 x 100003 bytes into the all-reduce and 3 + 3 bytes (its 3 (r + 1) plus
        // 100003 mod 1000) into the all-gather, receiving every other rank's 3 (r + 1) + 3.
        if ranks == 1 {
            // Nothing crosses with one rank.
            assert!(rows
                .iter()
                .all(|r| r["sent_bytes"] == 0 && r["received_bytes"] == 0));
            continue;
        }
        assert_eq!(rows[0]["sent_bytes"], 400_012);
        assert_eq!(rows[1]["sent_bytes"], 6);
        let others: u64 = (1..ranks as u64).map(|r| 3 * (r + 1) + 3).sum();
        assert_eq!(rows[1]["received_bytes"], others);
    }
}

use crate::common;
use std::path::{Path, PathBuf};

/// `dpcomp train` on 1000 Surnames examples for `epochs` epochs of 10 steps (q = 0.1) at σ 1,
/// with `extra` flags; `launch`: under `mpiexec -n W`. Short on purpose: MPI's all-reduce adds
/// the ranks' values in its own order ((a + b) + (c + d) for 4 ranks), the threads in rank
/// order, and the rounding difference (1e-7 a step) stays below 1e-6 over these steps, where a
/// long run at a large learning rate would amplify it.
fn train_for(
    epochs: usize,
    data: &Path,
    out: &Path,
    launch: Option<usize>,
    extra: &[&str],
) -> std::process::Output {
    let mut command = match launch {
        Some(ranks) => {
            let mut c = Command::new("mpiexec");
            c.args(["-n", &ranks.to_string()])
                .arg(env!("CARGO_BIN_EXE_dpcomp"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_dpcomp")),
    };
    command
        .args([
            "train",
            "--task",
            "surnames",
            "--epochs",
            &epochs.to_string(),
        ])
        .args([
            "--limit-train",
            "1000",
            "--batch-size",
            "100",
            "--lr",
            "0.5",
        ])
        .args([
            "--limit-test",
            "300",
            "--noise-multiplier",
            "1",
            "--seed",
            "3",
        ])
        .args(["--device", "cpu", "--quiet", "--data-dir"])
        .arg(data)
        .arg("--out")
        .arg(out)
        .args(extra)
        .env("OMP_NUM_THREADS", "1")
        .env("DPCOMP_COLLECTIVE_TIMEOUT", "120");
    command
        .output()
        .expect("mpiexec (MPICH) must be installed: scripts/setup.sh installs it")
}

fn train(data: &Path, out: &Path, launch: Option<usize>, extra: &[&str]) -> std::process::Output {
    train_for(1, data, out, launch, extra)
}

fn succeeded(what: &str, output: std::process::Output) {
    assert!(
        output.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn weights(run: &Path) -> Vec<(String, tch::Tensor)> {
    let mut w = tch::Tensor::read_safetensors(run.join("checkpoint/model.safetensors")).unwrap();
    w.sort_by(|a, b| a.0.cmp(&b.0));
    w
}

fn json(path: PathBuf) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// metrics.jsonl without its timings.
fn metrics(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut row: serde_json::Value = serde_json::from_str(l).unwrap();
            let row_map = row.as_object_mut().unwrap();
            for timing in ["wall_seconds", "examples_per_second", "epoch_seconds"] {
                row_map.remove(timing);
            }
            if let Some(w) = row_map.get_mut("workers").and_then(|w| w.as_object_mut()) {
                w.remove("comm_seconds");
                w.remove("compute_seconds");
            }
            row
        })
        .collect()
}

fn csv(path: &Path) -> Vec<Vec<f64>> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(|x| x.parse().unwrap()).collect())
        .collect()
}

#[test]
fn one_rank_under_mpiexec_is_the_plain_run_bit_for_bit() {
    let Some(data) = common::require_shared_data() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (plain, mpi) = (dir.path().join("plain"), dir.path().join("mpi"));
    let dgc = ["--compressor", "dgc", "--rate", "16"];
    succeeded("plain", train(&data, &plain, None, &dgc));
    succeeded("mpiexec -n 1", train(&data, &mpi, Some(1), &dgc));
    for ((name, a), (_, b)) in weights(&plain).iter().zip(&weights(&mpi)) {
        assert!(a.equal(b), "{name} differs");
    }
    assert_eq!(metrics(&plain), metrics(&mpi));
    let read = |run: &Path| std::fs::read_to_string(run.join("upstream.csv")).unwrap();
    assert_eq!(read(&plain), read(&mpi));
    assert!(
        !mpi.join("traffic.csv").exists(),
        "one worker exchanges nothing"
    );
}

#[test]
fn w_ranks_under_mpiexec_equal_w_thread_workers_for_every_compressor() {
    let Some(data) = common::require_shared_data() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let alone = dir.path().join("alone");
    succeeded("one process", train(&data, &alone, None, &[]));
    let epsilon = json(alone.join("summary.json"))["epsilon"]
        .as_f64()
        .unwrap();
    let compressors: [&[&str]; 12] = [
        &[],
        // Gathered messages each carry the whole noise (`--local-noise`, required for them).
        &["--compressor", "dgc", "--rate", "16", "--local-noise"],
        &["--compressor", "powersgd", "--rank", "2"],
        &["--compressor", "denoise", "--rate", "16", "--local-noise"],
        // Summed in the compressed domain, decoded once per step.
        &["--compressor", "fl-freq", "--rate", "8"],
        &[
            "--compressor",
            "fl-cs",
            "--rate",
            "8",
            "--compressor-option",
            "iterations=20",
        ],
        // Issue 40's families: random-k summed (shared coordinates), the others gathered.
        &["--compressor", "randomk", "--rate", "16"],
        &[
            "--compressor",
            "qsgd",
            "--compressor-option",
            "encoding=elias",
            "--local-noise",
        ],
        &["--compressor", "signsgd", "--local-noise"],
        &["--compressor", "ef-signsgd", "--local-noise"],
        &[
            "--compressor",
            "threshold",
            "--compressor-option",
            "threshold=0.05",
            "--local-noise",
        ],
        &["--compressor", "int8", "--local-noise"],
    ];
    for (c, flags) in compressors.iter().enumerate() {
        // FL-CS's OWL-QN reconstruction (line searches, orthant choices) turns MPI's other
        // summation order at 4 ranks ((a + b) + (c + d), 1e-7 apart) into 3e-3 after 10 steps:
        // compared at 2 ranks, where both add a + b.
        // Issue 40's families (after the first six) at 2 ranks, to keep the suite short.
        let two_ranks_only = flags.contains(&"fl-cs") || c >= 6;
        for ranks in [2usize, 4]
            .into_iter()
            .filter(|&r| !two_ranks_only || r == 2)
        {
            let label = format!("{flags:?} with {ranks} workers");
            let mpi = dir.path().join(format!("mpi-{ranks}-{c}"));
            let threads = dir.path().join(format!("threads-{ranks}-{c}"));
            succeeded(&label, train(&data, &mpi, Some(ranks), flags));
            let w = ranks.to_string();
            let mut threaded = flags.to_vec();
            threaded.extend(["--thread-workers", &w]);
            succeeded(&label, train(&data, &threads, None, &threaded));
            for ((name, a), (_, b)) in weights(&mpi).iter().zip(&weights(&threads)) {
                let diff = (a - b).abs().max().double_value(&[]);
                assert!(diff <= 1e-6, "{label}: {name} differs by {diff}");
            }
            let summary = json(mpi.join("summary.json"));
            assert_eq!(summary["epsilon"].as_f64(), Some(epsilon), "{label}");
            assert_eq!(summary["workers"].as_u64(), Some(ranks as u64), "{label}");
            // The bytes each rank handed to MPI: the same as the threads' transport counted,
            // and rank 0's are its logged upstream bits / 8.
            let (traffic, reference) = (
                csv(&mpi.join("traffic.csv")),
                csv(&threads.join("traffic.csv")),
            );
            assert_eq!(traffic.len(), reference.len(), "{label}");
            for (a, b) in traffic.iter().zip(&reference) {
                assert_eq!(a[..4], b[..4], "{label}: step, rank, sent, received");
            }
            for row in csv(&mpi.join("upstream.csv")) {
                let zero = traffic
                    .iter()
                    .find(|t| t[0] == row[0] && t[1] == 0.0)
                    .unwrap();
                assert_eq!(8.0 * zero[2], row[2], "{label}, step {}", row[0]);
            }
        }
    }
}

#[test]
fn an_mpi_run_resumes_under_the_same_w_and_refuses_another() {
    let Some(data) = common::require_shared_data() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let flags = ["--compressor", "denoise", "--rate", "16", "--local-noise"];
    succeeded("first epoch", train(&data, &run, Some(2), &flags));
    let refused = train_for(2, &data, &run, Some(3), &["--resume"]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("trained by 2 worker(s)"), "{stderr}");
    succeeded(
        "second epoch",
        train_for(2, &data, &run, Some(2), &["--resume"]),
    );
    assert_eq!(metrics(&run).len(), 2);
    assert_eq!(json(run.join("summary.json"))["epochs"], 2);
}

/// A rank that fails (here: its data folder does not exist) or runs another configuration ends
/// the whole job promptly with an error naming it, on MPMD command lines.
#[test]
fn a_failing_or_diverging_rank_ends_the_job_with_an_error() {
    let Some(data) = common::require_shared_data() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = data.to_str().unwrap().to_string();
    let bin = env!("CARGO_BIN_EXE_dpcomp");
    let base = |out: &str, data: &str, lr: &str| -> Vec<String> {
        [
            bin,
            "train",
            "--task",
            "surnames",
            "--epochs",
            "1",
            "--limit-train",
            "600",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(
            [
                "--quiet",
                "--device",
                "cpu",
                "--lr",
                lr,
                "--data-dir",
                data,
                "--out",
                out,
            ]
            .map(String::from),
        )
        .collect()
    };
    for (case, second_data, second_lr, expected) in [
        (
            "missing data",
            "/nonexistent/dpcomp-data",
            "0.5",
            "rank 1 of 2",
        ),
        (
            "another lr",
            data.as_str(),
            "0.25",
            "the configuration differs",
        ),
    ] {
        let out = dir.path().join(case.replace(' ', "-"));
        let out = out.to_str().unwrap();
        let started = std::time::Instant::now();
        let output = Command::new("mpiexec")
            .arg("-n")
            .arg("1")
            .args(base(out, &data, "0.5"))
            .arg(":")
            .arg("-n")
            .arg("1")
            .args(base(out, second_data, second_lr))
            .env("OMP_NUM_THREADS", "1")
            .env("DPCOMP_COLLECTIVE_TIMEOUT", "60")
            .output()
            .unwrap();
        assert!(!output.status.success(), "{case}: the job succeeded");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{case}: {stderr}");
        assert!(
            started.elapsed().as_secs() < 50,
            "{case}: took {:?}, as if waiting for the collective deadline",
            started.elapsed()
        );
    }
}
