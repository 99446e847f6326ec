//! W workers over PyTorch's c10d on Gloo (`comm::gloo`): launched by torchrun and by hand
//! (the variables torchrun sets), every collective checked, training equal to the thread
//! workers' bit for bit, and a missing rank ending the job with an error within the timeout.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// A TCP port free on the loopback right now (the store binds it next).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The project's torchrun (scripts/setup.sh installs torch into .venv).
fn torchrun() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/torchrun");
    assert!(
        venv.is_file(),
        "{}: missing; scripts/setup.sh installs torch into .venv",
        venv.display()
    );
    venv
}

/// `dpcomp args` as rank `rank` of `size`, with the variables torchrun would set.
fn rank_process(args: &[&str], rank: usize, size: usize, port: u16, timeout: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_dpcomp"))
        .args(args)
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", size.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("DPCOMP_COLLECTIVE_TIMEOUT", timeout)
        .env("OMP_NUM_THREADS", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("dpcomp runs")
}

/// W ranks of `dpcomp args` started by hand; their outputs in rank order.
fn by_hand(args: &[&str], size: usize) -> Vec<Output> {
    let port = free_port();
    let children: Vec<Child> = (0..size)
        .map(|rank| rank_process(args, rank, size, port, "60"))
        .collect();
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

fn check_report(stdout: &[u8], ranks: u64) {
    let text = String::from_utf8_lossy(stdout);
    let report: serde_json::Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("one JSON line from rank 0 ({e}): {text}"));
    assert_eq!(report["workers"], ranks, "{text}");
    assert_eq!(report["transport"], "c10d on Gloo", "{text}");
    let rows = report["rank0"].as_array().unwrap();
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["collective"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["all_reduce_sum", "all_gather", "broadcast", "barrier"]
    );
    // Rank 0 sends 4 x 100003 bytes into the all-reduce and its 3 + 3 bytes into the gather.
    assert_eq!(rows[0]["sent_bytes"], 400_012, "{text}");
    assert_eq!(rows[1]["sent_bytes"], 6, "{text}");
}

#[test]
fn every_collective_checks_out_under_torchrun_and_by_hand() {
    let check = ["check-comm", "--elements", "100003", "--json"];
    let output = Command::new(torchrun())
        .args(["--nproc-per-node", "2", "--no-python"])
        .arg(env!("CARGO_BIN_EXE_dpcomp"))
        .args(check)
        .env("DPCOMP_COLLECTIVE_TIMEOUT", "60")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    check_report(&output.stdout, 2);

    let outputs = by_hand(&check, 3);
    for (rank, out) in outputs.iter().enumerate() {
        assert!(
            out.status.success(),
            "rank {rank}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    check_report(&outputs[0].stdout, 3);
}

/// Every metrics row of a run without its timings (also the per-worker seconds).
fn metrics(dir: &Path) -> Vec<serde_json::Value> {
    crate::common::metrics_without_timings(dir)
        .into_iter()
        .map(|mut row| {
            if let Some(workers) = row.get_mut("workers").and_then(|w| w.as_object_mut()) {
                workers.remove("comm_seconds");
                workers.remove("compute_seconds");
            }
            row
        })
        .collect()
}

#[test]
fn training_over_gloo_equals_the_thread_workers_bit_for_bit() {
    let data =
        crate::common::data_holding(&["names"]).expect("the Surnames data ship in data/names");
    let data = data.to_str().unwrap().to_string();
    let work = tempfile::tempdir().unwrap();
    for (label, change) in [
        ("dense, shared noise", vec!["--noise-multiplier", "1.0"]),
        (
            "dgc, each worker's noise",
            vec![
                "--noise-multiplier",
                "1.0",
                "--compressor",
                "dgc",
                "--rate",
                "16",
                "--local-noise",
            ],
        ),
        (
            "powersgd, not private",
            vec!["--compressor", "powersgd", "--rank", "1"],
        ),
    ] {
        let mut args = vec![
            "train",
            "--task",
            "surnames",
            "--epochs",
            "2",
            "--limit-train",
            "400",
            "--limit-test",
            "100",
            "--device",
            "cpu",
            "--quiet",
            "--data-dir",
            &data,
        ];
        args.extend(&change);
        let gloo_dir = work.path().join(format!("gloo-{}", label.len()));
        let threads_dir = work.path().join(format!("threads-{}", label.len()));
        let mut over_gloo = args.clone();
        over_gloo.extend(["--out", gloo_dir.to_str().unwrap()]);
        for (rank, out) in by_hand(&over_gloo, 2).iter().enumerate() {
            assert!(
                out.status.success(),
                "{label}, rank {rank}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let mut in_threads = args.clone();
        in_threads.extend([
            "--thread-workers",
            "2",
            "--out",
            threads_dir.to_str().unwrap(),
        ]);
        let out = Command::new(env!("CARGO_BIN_EXE_dpcomp"))
            .args(&in_threads)
            .env("OMP_NUM_THREADS", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{label}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (gloo, threads) = (metrics(&gloo_dir), metrics(&threads_dir));
        assert_eq!(gloo.len(), 2, "{label}");
        assert_eq!(gloo, threads, "{label}");
    }
}

#[test]
fn a_missing_rank_ends_the_job_with_an_error_within_the_timeout() {
    // Rank 1 of 2 never starts: rank 0 waits for it at the rendezvous, then gives up.
    let started = Instant::now();
    let child = rank_process(&["check-comm"], 0, 2, free_port(), "5");
    let out = child.wait_with_output().unwrap();
    let waited = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("rank 0 of 2") && stderr.contains("c10d process group"),
        "{stderr}"
    );
    assert!(
        waited < Duration::from_secs(60),
        "waited {waited:?}: {stderr}"
    );
}
