//! The choice of c10d backend by device (`--comm auto|gloo|nccl`, `comm::world_on`): NCCL asked
//! for where it cannot run says why (no GPU, a CPU run, outside torchrun), and the tensor
//! collectives check out under torchrun, over Gloo on the CPU and, where a GPU is present, over
//! NCCL on it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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

/// `dpcomp args` as the one rank of a job, with the variables torchrun would set.
fn one_rank(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dpcomp"))
        .args(args)
        .env("RANK", "0")
        .env("WORLD_SIZE", "1")
        .env("LOCAL_RANK", "0")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", free_port().to_string())
        .env("DPCOMP_COLLECTIVE_TIMEOUT", "60")
        .env("OMP_NUM_THREADS", "1")
        .output()
        .unwrap()
}

/// `dpcomp args` outside any launcher.
fn alone(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dpcomp"))
        .args(args)
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("MASTER_ADDR")
        .env_remove("MASTER_PORT")
        .output()
        .unwrap()
}

/// rank 0's check-comm rows by collective name: (sent, received) bytes.
fn rows(stdout: &[u8], transport: &str, workers: u64) -> Vec<(String, u64, u64)> {
    let text = String::from_utf8_lossy(stdout);
    let report: serde_json::Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("one JSON line from rank 0 ({e}): {text}"));
    assert_eq!(report["transport"], transport, "{text}");
    assert_eq!(report["workers"], workers, "{text}");
    report["rank0"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["collective"].as_str().unwrap().to_string(),
                r["sent_bytes"].as_u64().unwrap(),
                r["received_bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn failed_saying(out: &Output, want: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "succeeded: {stderr}");
    assert!(stderr.contains(want), "expected {want:?} in: {stderr}");
}

#[test]
fn nccl_asked_for_where_it_cannot_run_says_why() {
    let train = [
        "train",
        "--task",
        "surnames",
        "--epochs",
        "1",
        "--limit-train",
        "64",
        "--limit-test",
        "32",
        "--quiet",
        "--comm",
        "nccl",
    ];
    let work = tempfile::tempdir().unwrap();
    let out_dir = work.path().join("run");
    let mut train_cpu: Vec<&str> = train.to_vec();
    train_cpu.extend(["--device", "cpu", "--out", out_dir.to_str().unwrap()]);
    if tch::Cuda::device_count() == 0 {
        let no_gpu = "--comm nccl: NCCL needs CUDA tensors; this process sees no GPU";
        failed_saying(&one_rank(&["check-comm", "--comm", "nccl"]), no_gpu);
        failed_saying(&alone(&["check-comm", "--comm", "nccl"]), no_gpu);
        failed_saying(&one_rank(&train_cpu), no_gpu);
        // Insisting on CUDA without one is refused by the device setting first.
        failed_saying(
            &one_rank(&["check-comm", "--comm", "nccl", "--device", "cuda"]),
            "device: cuda requested but LibTorch finds no CUDA device",
        );
    } else {
        failed_saying(
            &one_rank(&train_cpu),
            "--comm nccl: NCCL needs CUDA tensors, and this run's device is Cpu",
        );
        failed_saying(
            &alone(&["check-comm", "--comm", "nccl", "--device", "cuda"]),
            "--comm nccl: a c10d process group needs torchrun's variables",
        );
    }
    // Refused before training: no run folder was written.
    assert!(!out_dir.exists());
    failed_saying(
        &alone(&["check-comm", "--comm", "gloo"]),
        "--comm gloo: a c10d process group needs torchrun's variables",
    );
}

#[test]
fn the_tensor_collectives_check_out_under_torchrun() {
    // Two ranks over Gloo on the CPU: the host rows, then the tensor rows.
    let output = Command::new(torchrun())
        .args(["--nproc-per-node", "2", "--no-python"])
        .arg(env!("CARGO_BIN_EXE_dpcomp"))
        .args([
            "check-comm",
            "--elements",
            "100003",
            "--device",
            "cpu",
            "--comm",
            "gloo",
            "--json",
        ])
        .env("DPCOMP_COLLECTIVE_TIMEOUT", "60")
        .env("OMP_NUM_THREADS", "1")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let got = rows(&output.stdout, "c10d on Gloo", 2);
    let names: Vec<&str> = got.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "all_reduce_sum",
            "all_gather",
            "broadcast",
            "barrier",
            "all_reduce_tensor",
            "all_gather_tensor"
        ]
    );
    // 4 x 100003 bytes each way; 3 + 100003 % 1000 = 6 bytes from each rank.
    assert_eq!((got[4].1, got[4].2), (400_012, 400_012));
    assert_eq!((got[5].1, got[5].2), (6, 6));

    // One rank on the GPU, where there is one: auto picks NCCL for CUDA.
    if tch::Cuda::device_count() > 0 {
        let out = one_rank(&["check-comm", "--device", "cuda", "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got = rows(&out.stdout, "c10d on NCCL", 1);
        assert_eq!(got.len(), 6);
        assert_eq!(got[4].0, "all_reduce_tensor");
    }
}
