//! The GPU kit's rehearsal on the CPU (issue 15), so that the path a CUDA machine runs never rots:
//! `scripts/gpu-kit.sh` packs this build's binary and a data subset, `scripts/gpu-check.sh
//! --device cpu --quick` unpacks and runs every stage of the check from the kit alone (correctness,
//! benchmarks against eager PyTorch and Opacus, three short trainings, data-parallel runs under
//! torchrun) and the JSON it writes is read back here.

use crate::common;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn gpu_check_rehearsal_on_cpu() {
    // The kit packs a CIFAR-10 subset and SNLI, which are not shipped.
    let Some(data) = common::require_data(
        &["names", "cifar-10-batches-bin", "snli_1.0"],
        "CIFAR-10 and SNLI are not in the data folder: large downloads, not shipped (dpcomp data fetch cifar10, dpcomp data fetch snli, or set DPCOMP_DATA)",
    ) else {
        return;
    };
    if !root().join(".venv/bin/python").exists() || !common::bert_dir().join("config.json").exists()
    {
        common::skip(".venv or models/all-MiniLM-L6-v2 missing: run scripts/setup.sh");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let kit = tmp.path().join("kit");
    let out = tmp.path().join("out");
    // The CIFAR-10 subset is left to the script: sized to the room the working tree leaves under
    // the device tool's 64 MiB, as on the way to a device.
    let packed = Command::new("bash")
        .arg(root().join("scripts/gpu-kit.sh"))
        .args([
            "--bin",
            env!("CARGO_BIN_EXE_dpcomp"),
            "--no-wheels",
            "--out",
        ])
        .arg(&kit)
        .env("DPCOMP_DATA", &data)
        .current_dir(root())
        .output()
        .unwrap();
    let packing = String::from_utf8_lossy(&packed.stderr);
    assert!(packed.status.success(), "gpu-kit.sh failed:\n{packing}");
    assert!(kit.join("dpcomp.gz").exists() && kit.join("bert_shapes.json").exists());
    // The working tree it counted is what travels: every tracked file and every untracked one git
    // does not ignore (an earlier count summed only the last of xargs' batches: 10 of 42 MiB).
    let counted: u64 = packing
        .split("with the working tree (")
        .nth(1)
        .and_then(|rest| rest.split(" KiB)").next())
        .and_then(|kib| kib.parse().ok())
        .unwrap_or_else(|| panic!("no working-tree size in gpu-kit.sh's log:\n{packing}"));
    let listed = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(root())
        .output()
        .unwrap();
    let travelling: u64 = listed
        .stdout
        .split(|&b| b == 0)
        .filter(|name| !name.is_empty())
        .filter_map(|name| {
            std::fs::metadata(root().join(String::from_utf8_lossy(name).as_ref())).ok()
        })
        .map(|m| m.len())
        .sum();
    let expected = travelling / 1024;
    assert!(
        counted.abs_diff(expected) <= expected / 100 + 64,
        "gpu-kit.sh counted {counted} KiB of working tree, git lists {expected} KiB"
    );
    let subset = std::fs::read_to_string(kit.join("kit.txt")).unwrap();
    let images = |key: &str| -> u64 {
        subset
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{key} missing from kit.txt: {subset}"))
    };
    assert!(
        images("cifar_train=") >= 1000 && images("cifar_test=") >= 250,
        "too small a CIFAR-10 subset for the device's trainings: {subset}"
    );

    let output = Command::new("bash")
        .arg(root().join("scripts/gpu-check.sh"))
        .args(["--device", "cpu", "--quick", "--kit"])
        .arg(&kit)
        .arg("--out")
        .arg(&out)
        .env_remove("OUT")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "gpu-check.sh failed:\n{log}");

    // 1. Correctness: every model's per-sample gradients and norms, every compressor, the
    // accountant's golden value, all passed.
    let check = read_json(&out.join("check_device.json"));
    let checks = check["checks"].as_array().unwrap();
    let names: Vec<&str> = checks.iter().map(|c| c["name"].as_str().unwrap()).collect();
    for model in [
        "surnames_lstm",
        "cifar10_cnn",
        "cifar100_resnet18",
        "bert_small",
    ] {
        assert!(
            names.contains(&format!("per_sample_gradients/{model}").as_str()),
            "{names:?}"
        );
        assert!(
            names.contains(&format!("per_sample_norms/{model}").as_str()),
            "{names:?}"
        );
    }
    for compressor in ["dgc_x16", "dgc_x256", "denoise_x16", "powersgd_rank4"] {
        assert!(
            names.contains(&format!("compressor/{compressor}").as_str()),
            "{names:?}"
        );
    }
    assert!(names.contains(&"accountant/opacus_golden_rdp"));
    for c in checks {
        assert_eq!(c["passed"], true, "{c}");
        assert!(c["error"].as_f64().unwrap() <= c["tolerance"].as_f64().unwrap());
    }

    // 2. Benchmarks: our DP and non-private steps for the four tasks, and the peers ran.
    let summary = read_json(&out.join("gpu_check.json"));
    assert_eq!(summary["correct"], true);
    assert_eq!(
        summary["failed_benches"].as_array().unwrap().len(),
        0,
        "{summary}"
    );
    let steps = summary["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 4);
    for row in steps {
        let dp = row["dp_step_ms"].as_f64().unwrap();
        let plain = row["nonprivate_step_ms"].as_f64().unwrap();
        assert!(dp > 0.0 && plain > 0.0, "{row}");
        // No device memory on the CPU: reported as null, never as a made-up number.
        assert!(row["dp_peak_device_bytes"].is_null(), "{row}");
        if row["task"] != "snli" {
            assert!(
                row["ratio_ours_over_eager_pytorch"].as_f64().unwrap() > 0.0,
                "{row}"
            );
            assert!(row["speedup_over_opacus"].as_f64().unwrap() > 0.0, "{row}");
        }
    }
    assert_eq!(summary["compressors"].as_object().unwrap().len(), 5);
    for (name, c) in summary["compressors"].as_object().unwrap() {
        assert!(c["message_bytes_ms"].as_f64().unwrap() > 0.0, "{name}: {c}");
    }

    // 3. Trainings: each finished an epoch with a finite loss and a spent privacy budget.
    let trainings = summary["trainings_last_epoch"].as_object().unwrap();
    for name in [
        "surnames_dp_dgc16",
        "cifar10_dp",
        "snli_dp_random_minilm",
        "cifar10_dp_dgc256",
        "cifar10_dp_dgc256_bytes",
    ] {
        let last = &trainings[name];
        assert_eq!(last["epoch"], 1, "{name}: {last}");
        assert!(last["train_loss"].as_f64().unwrap().is_finite(), "{name}");
        assert!(last["epsilon"].as_f64().unwrap() > 0.0, "{name}");
        // Issue 37: every run logs its steps' host reads. DGC's top-k is sampled on the CPU
        // (`topk=auto`), which reads; uncompressed steps read nothing, as on CUDA.
        let reads = summary["host_reads_per_step"][name].as_f64().unwrap();
        if name.contains("dgc") {
            assert!(
                reads > 0.0,
                "{name}: the CPU's sampled top-k reads, {reads}"
            );
        } else {
            assert_eq!(reads, 0.0, "{name}");
        }
    }
    // 3b. Data-parallel over c10d under torchrun: every collective checked with one rank and
    // with two over Gloo, the tensor ones on the device; the trainings equal their references on
    // the same device (on the CPU bit for bit: one rank trains as one process, and Gloo's sums
    // of two are the thread workers'), each with a step time and its host reads.
    let c10d = read_json(&out.join("c10d.json"));
    assert_eq!(c10d["passed"], true, "{c10d}");
    let names: Vec<&str> = c10d["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "c10d/check_one_rank",
            "c10d/check_gloo_two_ranks",
            "c10d/c10d_torchrun_one_rank",
            "c10d/c10d_torchrun_gloo_two_ranks"
        ]
    );
    assert_eq!(
        c10d["check_one_rank"]["transport"], "c10d on Gloo",
        "{c10d}"
    );
    assert_eq!(c10d["check_gloo_two_ranks"]["workers"], 2, "{c10d}");
    for check in c10d["checks"].as_array().unwrap().iter().skip(2) {
        assert_eq!(check["error"].as_f64(), Some(0.0), "{check}");
    }
    for name in ["c10d_torchrun_one_rank", "c10d_torchrun_gloo_two_ranks"] {
        let run = &c10d["runs"][name];
        assert!(run["step_ms"].as_f64().unwrap() > 0.0, "{name}: {run}");
        assert!(
            run["host_reads_per_step"].as_f64().unwrap() >= 0.0,
            "{name}: {run}"
        );
    }
    assert_eq!(
        c10d["runs"]["c10d_torchrun_one_rank"]["host_reads_per_step"],
        c10d["runs"]["c10d_one_process"]["host_reads_per_step"]
    );
    // Each of the two ranks' seconds in the exchange.
    let comm_seconds = c10d["runs"]["c10d_torchrun_gloo_two_ranks"]["comm_seconds"]
        .as_array()
        .unwrap();
    assert_eq!(comm_seconds.len(), 2, "{c10d}");
    assert!(comm_seconds.iter().all(|s| s.as_f64().unwrap() > 0.0));

    // With and without the message's bytes made: the same bits, a step time for each.
    let bytes = &summary["message_bytes_in_the_step"];
    assert_eq!(bytes["same_upstream_bits"], true, "{bytes}");
    assert!(
        bytes["ratio_step_time_bytes_over_in_memory"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    // What comes back from a device: at most 8 flat files, each well under 16 MiB.
    let files: Vec<_> = std::fs::read_dir(&out).unwrap().flatten().collect();
    assert!(files.len() <= 8, "{} files", files.len());
    for f in files {
        let meta = f.metadata().unwrap();
        assert!(meta.is_file() && meta.len() < 16 << 20, "{:?}", f.path());
    }
}
