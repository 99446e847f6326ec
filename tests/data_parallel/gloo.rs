//! W workers over PyTorch's c10d on Gloo (`comm::gloo`): launched by torchrun (on one node and
//! as two nodes) and by hand (the variables torchrun sets), every collective checked, training
//! with every compressor equal to the thread workers', a resume under the same W only, and ranks
//! that die, hang, are missing or run other settings ending the job with an error that names
//! them, within the timeout.
//!
//! Every training is 4 steps of one short epoch (200 Surnames examples, batches of 50): a
//! process's start (loading LibTorch) costs more than its training, and the CI has 2 cores.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
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

/// `dpcomp args` as rank `rank` of `size`, with the variables torchrun would set and a
/// collective deadline of `timeout` seconds.
fn rank_process<S: AsRef<OsStr>>(
    args: &[S],
    rank: usize,
    size: usize,
    port: u16,
    timeout: &str,
) -> Child {
    Command::new(env!("CARGO_BIN_EXE_dpcomp"))
        .args(args)
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", size.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("DPCOMP_COLLECTIVE_TIMEOUT", timeout)
        .env("OMP_NUM_THREADS", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dpcomp runs")
}

/// W ranks of `dpcomp args` started by hand, all at once.
fn start_by_hand<S: AsRef<OsStr>>(args: &[S], size: usize) -> Vec<Child> {
    let port = free_port();
    (0..size)
        .map(|rank| rank_process(args, rank, size, port, "60"))
        .collect()
}

/// Their outputs in rank order.
fn wait_all(children: Vec<Child>) -> Vec<Output> {
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

/// W ranks of `dpcomp args` started by hand; their outputs in rank order.
fn by_hand<S: AsRef<OsStr>>(args: &[S], size: usize) -> Vec<Output> {
    wait_all(start_by_hand(args, size))
}

fn succeeded(what: &str, outputs: &[Output]) {
    for (rank, out) in outputs.iter().enumerate() {
        assert!(
            out.status.success(),
            "{what}, process {rank}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
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
    succeeded("check-comm by hand", &outputs);
    check_report(&outputs[0].stdout, 3);
}

/// The Surnames data folder (shipped in data/names).
fn data_dir() -> String {
    crate::common::data_holding(&["names"])
        .expect("the Surnames data ship in data/names")
        .to_str()
        .unwrap()
        .to_string()
}

/// `dpcomp train` for `epochs` epochs of 4 steps on 200 Surnames examples into `out`, with
/// `extra` flags.
fn train_args(data: &str, out: &Path, epochs: usize, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "train",
        "--task",
        "surnames",
        "--limit-train",
        "200",
        "--batch-size",
        "50",
        "--limit-test",
        "50",
        "--device",
        "cpu",
        "--quiet",
    ]
    .map(String::from)
    .to_vec();
    args.extend(["--epochs".to_string(), epochs.to_string()]);
    args.extend(["--data-dir".to_string(), data.to_string()]);
    args.extend(["--out".to_string(), out.to_str().unwrap().to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// `dpcomp args --thread-workers W`, started.
fn start_threads(args: &[String], workers: usize) -> Child {
    Command::new(env!("CARGO_BIN_EXE_dpcomp"))
        .args(args)
        .args(["--thread-workers", &workers.to_string()])
        .env("OMP_NUM_THREADS", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dpcomp runs")
}

/// Every metrics row of a run without what depends on the transport rather than on the
/// training: its timings, the bytes each rank handed to the transport (Gloo's all-gather pads
/// the messages to the longest; the threads move them as they are) and the host reads per step
/// (Gloo takes tensors where they live). The messages' own bits (`upstream_bits`) stay.
fn metrics(dir: &Path) -> Vec<serde_json::Value> {
    crate::common::metrics_without_timings(dir)
        .into_iter()
        .map(|mut row| {
            let row_map = row.as_object_mut().unwrap();
            row_map.remove("host_reads_per_step");
            if let Some(workers) = row_map.get_mut("workers").and_then(|w| w.as_object_mut()) {
                workers.retain(|key, _| key == "workers");
            }
            row
        })
        .collect()
}

/// What a metrics row says of the run's messages and budget, not of its weights: the same
/// whatever order the ranks' values are added in.
fn accounting(row: &serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "epoch": row["epoch"],
        "steps": row["steps"],
        "epsilon": row["epsilon"],
        "upstream_bits": row["upstream_bits"],
        "workers": row["workers"],
    })
}

/// `summary.json` without its time.
fn summary(dir: &Path) -> serde_json::Value {
    let path = dir.join("summary.json");
    let mut value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    value.as_object_mut().unwrap().remove("wall_seconds");
    value
}

/// Every `.safetensors` file of a run's checkpoint (weights, optimizer, every rank's
/// compressor state), by name, as bytes.
fn checkpoint_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir.join("checkpoint"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .map(|p| {
            let name = p.file_name().unwrap().to_str().unwrap().to_string();
            (name, std::fs::read(&p).unwrap())
        })
        .collect();
    files.sort_by(|a, b| a.0.cmp(&b.0));
    files
}

/// Asserts that two runs' checkpoints hold the same files with the same bytes.
fn same_checkpoint(what: &str, a: &Path, b: &Path) {
    let (a, b) = (checkpoint_files(a), checkpoint_files(b));
    let names = |files: &[(String, Vec<u8>)]| files.iter().map(|f| f.0.clone()).collect::<Vec<_>>();
    assert_eq!(names(&a), names(&b), "{what}");
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        assert!(x == y, "{what}: checkpoint/{name} differs");
    }
}

/// The largest difference between two runs' weights.
fn largest_weight_difference(a: &Path, b: &Path) -> f64 {
    let read = |run: &Path| {
        let mut w =
            tch::Tensor::read_safetensors(run.join("checkpoint/model.safetensors")).unwrap();
        w.sort_by(|x, y| x.0.cmp(&y.0));
        w
    };
    let (a, b) = (read(a), read(b));
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(&b)
        .map(|((name, x), (other, y))| {
            assert_eq!(name, other);
            (x - y).abs().max().double_value(&[])
        })
        .fold(0.0, f64::max)
}

/// The steps and ranks of `traffic.csv` (its bytes are the transport's: see `metrics`), and
/// `upstream.csv` (rank 0's message bits, step by step).
fn messages_logged(dir: &Path) -> (Vec<String>, String) {
    let traffic = std::fs::read_to_string(dir.join("traffic.csv"))
        .unwrap()
        .lines()
        .map(|l| l.split(',').take(2).collect::<Vec<_>>().join(","))
        .collect();
    (
        traffic,
        std::fs::read_to_string(dir.join("upstream.csv")).unwrap(),
    )
}

/// How a compressor's messages are brought together, which decides what W ranks over Gloo
/// promise against W thread workers.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Exchange {
    /// All-gathered and decoded message by message in rank order on every rank: bit for bit at
    /// any W.
    Gathered,
    /// Summed by Gloo's all-reduce. Bit for bit at W = 2 (a + b = b + a); at W = 3 Gloo's ring
    /// adds each chunk's three values in an order that depends on the chunk, the threads in
    /// rank order, so the weights differ by float rounding (a few 1e-7 after 4 steps), while
    /// the messages' bits, the steps and ε stay equal.
    Summed,
    /// Summed, then reconstructed by FL-CS's iterative solver, whose line searches turn that
    /// rounding into differences of 1e-2 at W = 3: there only the bits, steps and ε compare.
    Reconstructed,
}

/// Every compressor family with its exchange: the summed ones with the noise shared among the
/// workers (σ/√W each), the gathered ones with each worker's whole noise (`--local-noise`, which
/// they require under DP), and the step without privacy, dense and DGC's (top-k) without noise.
const CASES: [(&str, Exchange, &[&str]); 19] = [
    ("dense, not private", Exchange::Summed, &[]),
    (
        "dense DP step",
        Exchange::Summed,
        &["--noise-multiplier", "1"],
    ),
    (
        "powersgd",
        Exchange::Summed,
        &[
            "--noise-multiplier",
            "1",
            "--compressor",
            "powersgd",
            "--rank",
            "2",
        ],
    ),
    (
        "randomk",
        Exchange::Summed,
        &[
            "--noise-multiplier",
            "1",
            "--compressor",
            "randomk",
            "--rate",
            "16",
        ],
    ),
    (
        "fl-rnd",
        Exchange::Summed,
        &[
            "--noise-multiplier",
            "1",
            "--compressor",
            "fl-rnd",
            "--rate",
            "8",
        ],
    ),
    (
        "fl-freq",
        Exchange::Summed,
        &[
            "--noise-multiplier",
            "1",
            "--compressor",
            "fl-freq",
            "--rate",
            "8",
        ],
    ),
    (
        "fl-cs",
        Exchange::Reconstructed,
        &[
            "--noise-multiplier",
            "1",
            "--compressor",
            "fl-cs",
            "--rate",
            "8",
            "--compressor-option",
            "iterations=20",
        ],
    ),
    (
        "dgc",
        Exchange::Gathered,
        &[
            "--noise-multiplier",
            "1",
            "--local-noise",
            "--compressor",
            "dgc",
            "--rate",
            "16",
        ],
    ),
    (
        "top-k (dgc's exact top-k), not private",
        Exchange::Gathered,
        &[
            "--compressor",
            "dgc",
            "--rate",
            "16",
            "--compressor-option",
            "topk=exact",
        ],
    ),
    (
        "denoise",
        Exchange::Gathered,
        &[
            "--noise-multiplier",
            "1",
            "--local-noise",
            "--compressor",
            "denoise",
            "--rate",
            "16",
        ],
    ),
    (
        "qsgd",
        Exchange::Gathered,
        &[
            "--noise-multiplier",
            "1",
            "--local-noise",
            "--compressor",
            "qsgd",
            "--compressor-option",
            "encoding=elias",
        ],
    ),
    (
        "terngrad",
        Exchange::Gathered,
        &[
            "--noise-multiplier",
            "1",
            "--local-noise",
            "--compressor",
            "terngrad",
        ],
    ),
    (
        "signsgd",
        Exchange::Gathered,
        &[
            "--noise-multiplier",
            "1",
            "--local-noise",
            "--compressor",
            "signsgd",
        ],
    ),
    (
        "ef-signsgd",
        Exchange::Gathered,
        &[
            "--noise-multiplier",
            "1",
            "--local-noise",
            "--compressor",
            "ef-signsgd",
        ],
    ),
    (
        "threshold",
        Exchange::Gathered,
        &[
            "--noise-multiplier",
            "1",
            "--local-noise",
            "--compressor",
            "threshold",
            "--compressor-option",
            "threshold=0.05",
        ],
    ),
    (
        "fp16",
        Exchange::Gathered,
        &[
            "--noise-multiplier",
            "1",
            "--local-noise",
            "--compressor",
            "fp16",
        ],
    ),
    (
        "bf16",
        Exchange::Gathered,
        &[
            "--noise-multiplier",
            "1",
            "--local-noise",
            "--compressor",
            "bf16",
        ],
    ),
    (
        "int8",
        Exchange::Gathered,
        &[
            "--noise-multiplier",
            "1",
            "--local-noise",
            "--compressor",
            "int8",
        ],
    ),
    (
        "natural",
        Exchange::Gathered,
        &[
            "--noise-multiplier",
            "1",
            "--local-noise",
            "--compressor",
            "natural",
        ],
    ),
];

/// One case with W ranks over Gloo and W thread workers, started together, compared.
fn compare_with_threads(
    data: &str,
    work: &Path,
    index: usize,
    workers: usize,
) -> Result<(), String> {
    let (label, exchange, flags) = CASES[index];
    let label = format!("{label} with {workers} workers");
    let gloo_dir = work.join(format!("gloo-{workers}-{index}"));
    let threads_dir = work.join(format!("threads-{workers}-{index}"));
    let ranks = start_by_hand(&train_args(data, &gloo_dir, 1, flags), workers);
    let threads = start_threads(&train_args(data, &threads_dir, 1, flags), workers);
    let (ranks, threads) = (wait_all(ranks), threads.wait_with_output().unwrap());
    for (rank, out) in ranks.iter().enumerate() {
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            return Err(format!("{label}, rank {rank} failed: {stderr}"));
        }
    }
    if !threads.status.success() {
        let stderr = String::from_utf8_lossy(&threads.stderr);
        return Err(format!("{label}, threads failed: {stderr}"));
    }
    let (gloo, reference) = (metrics(&gloo_dir), metrics(&threads_dir));
    if gloo.len() != 1 || reference.len() != 1 {
        return Err(format!(
            "{label}: {} and {} epochs",
            gloo.len(),
            reference.len()
        ));
    }
    if messages_logged(&gloo_dir) != messages_logged(&threads_dir) {
        return Err(format!(
            "{label}: traffic.csv's steps or upstream.csv differ"
        ));
    }
    let exact = exchange == Exchange::Gathered || workers == 2;
    if exact {
        if gloo != reference {
            return Err(format!("{label}: metrics\n{gloo:?}\n{reference:?}"));
        }
        if summary(&gloo_dir) != summary(&threads_dir) {
            return Err(format!("{label}: summary.json differs"));
        }
        for ((name, a), (_, b)) in checkpoint_files(&gloo_dir)
            .iter()
            .zip(&checkpoint_files(&threads_dir))
        {
            if a != b {
                return Err(format!("{label}: checkpoint/{name} differs"));
            }
        }
        return Ok(());
    }
    if accounting(&gloo[0]) != accounting(&reference[0]) {
        return Err(format!("{label}: metrics\n{gloo:?}\n{reference:?}"));
    }
    let difference = largest_weight_difference(&gloo_dir, &threads_dir);
    if exchange == Exchange::Summed && difference > 1e-6 {
        return Err(format!("{label}: weights differ by {difference}"));
    }
    Ok(())
}

#[test]
fn training_over_gloo_equals_the_thread_workers_for_every_compressor_at_2_and_3_workers() {
    let data = data_dir();
    let work = tempfile::tempdir().unwrap();
    let jobs: Vec<(usize, usize)> = (0..CASES.len()).flat_map(|c| [(c, 2), (c, 3)]).collect();
    let next = std::sync::Mutex::new(jobs.into_iter());
    let failures = std::sync::Mutex::new(Vec::new());
    // Two cases at a time: one leaves a core idle while a case's ranks meet.
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| loop {
                let Some((case, workers)) = next.lock().unwrap().next() else {
                    break;
                };
                if let Err(e) = compare_with_threads(&data, work.path(), case, workers) {
                    failures.lock().unwrap().push(e);
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// A gathered compressor under shared noise is refused on every rank, naming the setting.
#[test]
fn a_gathered_compressor_without_local_noise_is_refused_over_gloo() {
    let data = data_dir();
    let work = tempfile::tempdir().unwrap();
    for (workers, compressor) in [(2, "dgc"), (3, "fp16")] {
        let out = work.path().join(compressor);
        let flags = ["--noise-multiplier", "1", "--compressor", compressor];
        let outputs = by_hand(&train_args(&data, &out, 1, &flags), workers);
        for (rank, output) in outputs.iter().enumerate() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(!output.status.success(), "{compressor}, rank {rank}");
            assert!(
                stderr.contains(&format!("rank {rank} of {workers}"))
                    && stderr.contains(&format!(
                        "local_noise: false with {workers} workers and the {compressor} compressor"
                    )),
                "{compressor}, rank {rank}: {stderr}"
            );
        }
        assert!(!out.join("checkpoint").exists(), "{compressor}: trained");
    }
}

/// The two-node form of torchrun, both nodes on this machine: static rendezvous at node 0's
/// agent (`--master-addr`, `--master-port`), one process per node, equal to 2 thread workers.
#[test]
fn two_torchrun_nodes_equal_two_thread_workers_bit_for_bit() {
    let data = data_dir();
    let work = tempfile::tempdir().unwrap();
    let flags = [
        "--noise-multiplier",
        "1",
        "--local-noise",
        "--compressor",
        "dgc",
        "--rate",
        "16",
    ];
    let (nodes_dir, threads_dir) = (work.path().join("nodes"), work.path().join("threads"));
    let port = free_port().to_string();
    let nodes: Vec<Child> = ["0", "1"]
        .iter()
        .map(|node| {
            Command::new(torchrun())
                .args([
                    "--nnodes",
                    "2",
                    "--node-rank",
                    node,
                    "--nproc-per-node",
                    "1",
                ])
                .args(["--master-addr", "127.0.0.1", "--master-port", &port])
                .args(["--no-python", env!("CARGO_BIN_EXE_dpcomp")])
                .args(train_args(&data, &nodes_dir, 1, &flags))
                .env("DPCOMP_COLLECTIVE_TIMEOUT", "60")
                .env("OMP_NUM_THREADS", "1")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let threads = start_threads(&train_args(&data, &threads_dir, 1, &flags), 2);
    succeeded("two torchrun nodes", &wait_all(nodes));
    succeeded("2 thread workers", &[threads.wait_with_output().unwrap()]);
    assert_eq!(summary(&nodes_dir)["workers"], 2);
    assert_eq!(metrics(&nodes_dir), metrics(&threads_dir));
    same_checkpoint("two nodes", &nodes_dir, &threads_dir);
    assert_eq!(messages_logged(&nodes_dir), messages_logged(&threads_dir));
}

/// A run over Gloo resumes only with as many workers (each holds its compressor state and data
/// shard); resumed with them, it is the uninterrupted run (here: its thread workers' twin).
#[test]
fn a_gloo_run_resumes_under_the_same_w_and_refuses_another() {
    let data = data_dir();
    let work = tempfile::tempdir().unwrap();
    let flags = [
        "--noise-multiplier",
        "1",
        "--local-noise",
        "--compressor",
        "denoise",
        "--rate",
        "16",
    ];
    let (run, whole) = (work.path().join("run"), work.path().join("whole"));
    let uninterrupted = start_threads(&train_args(&data, &whole, 2, &flags), 2);
    succeeded(
        "first epoch",
        &by_hand(&train_args(&data, &run, 1, &flags), 2),
    );
    let refused = by_hand(&train_args(&data, &run, 2, &["--resume"]), 3);
    for (rank, output) in refused.iter().enumerate() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "rank {rank} resumed with 3");
        assert!(
            stderr.contains("workers: 3, but") && stderr.contains("trained by 2 worker(s)"),
            "rank {rank}: {stderr}"
        );
    }
    succeeded(
        "second epoch",
        &by_hand(&train_args(&data, &run, 2, &["--resume"]), 2),
    );
    succeeded(
        "uninterrupted",
        &[uninterrupted.wait_with_output().unwrap()],
    );
    assert_eq!(metrics(&run).len(), 2);
    assert_eq!(metrics(&run), metrics(&whole));
    same_checkpoint("resumed", &run, &whole);
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

/// `child`'s output once it exits, or `None` (and the child killed) when it still runs after
/// `limit`.
fn wait_at_most(mut child: Child, limit: Duration) -> Option<Output> {
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(child.wait_with_output().unwrap())
}

/// Whether `stderr` names one of the collectives a training step runs, as having failed.
fn names_a_failed_collective(stderr: &str) -> bool {
    ["all_reduce", "all_gather", "broadcast", "barrier"]
        .iter()
        .any(|c| stderr.contains(c))
        && stderr.contains("failed")
}

/// Rank 1 of 3 is killed (SIGKILL) or stopped (SIGSTOP: it hangs) once training has begun: the
/// other ranks exit non-zero with an error naming their rank and the collective, at once when
/// the peer's connection drops, at the deadline (DPCOMP_COLLECTIVE_TIMEOUT) when it hangs.
#[test]
fn a_rank_killed_or_hung_mid_training_ends_the_others_within_the_timeout() {
    let data = data_dir();
    let work = tempfile::tempdir().unwrap();
    for signal in ["KILL", "STOP"] {
        let out = work.path().join(signal);
        // Long enough not to end before the signal: the others stop at their next collective.
        let args = train_args(&data, &out, 500, &["--noise-multiplier", "1"]);
        let port = free_port();
        let mut ranks: Vec<Child> = (0..3)
            .map(|rank| rank_process(&args, rank, 3, port, "5"))
            .collect();
        let begun = Instant::now();
        let first_epoch = out.join("metrics.jsonl");
        while !std::fs::metadata(&first_epoch).is_ok_and(|m| m.len() > 0) {
            if begun.elapsed() > Duration::from_secs(60) {
                for rank in &mut ranks {
                    rank.kill().unwrap();
                    rank.wait().unwrap();
                }
                panic!("{signal}: no epoch ended in 60 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let victim = ranks.remove(1);
        let status = Command::new("kill")
            .args([format!("-{signal}"), victim.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal}");
        let signalled = Instant::now();
        // The deadline is 5 s; the rest of the step and the exit add little.
        let others: Vec<(usize, Option<Output>, Duration)> = [0, 2]
            .into_iter()
            .zip(ranks)
            .map(|(rank, child)| {
                let output = wait_at_most(child, Duration::from_secs(20));
                (rank, output, signalled.elapsed())
            })
            .collect();
        let mut victim = victim;
        victim.kill().unwrap();
        victim.wait().unwrap();
        for (rank, output, waited) in others {
            let output = output
                .unwrap_or_else(|| panic!("{signal}: rank {rank} still ran after {waited:?}"));
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(!output.status.success(), "{signal}, rank {rank}: {stderr}");
            assert!(
                stderr.contains(&format!("rank {rank} of 3")) && names_a_failed_collective(&stderr),
                "{signal}, rank {rank}: {stderr}"
            );
        }
    }
}

/// A rank started with another setting is refused at the start, on every rank, by an error that
/// names the setting and its values.
#[test]
fn a_rank_with_another_setting_is_refused_naming_the_setting() {
    let data = data_dir();
    let work = tempfile::tempdir().unwrap();
    let out = work.path().join("run");
    for (zero, one, named) in [
        (
            ["--lr", "0.5"],
            ["--lr", "0.25"],
            "optimizer.lr is 0.5 on rank 0 but 0.25 on rank 1",
        ),
        (
            ["--compressor", "identity"],
            ["--compressor", "powersgd"],
            "compression.kind is \"identity\" on rank 0 but \"powersgd\" on rank 1",
        ),
    ] {
        let port = free_port();
        let started = Instant::now();
        let children = vec![
            rank_process(&train_args(&data, &out, 1, &zero), 0, 2, port, "30"),
            rank_process(&train_args(&data, &out, 1, &one), 1, 2, port, "30"),
        ];
        for (rank, output) in wait_all(children).iter().enumerate() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(!output.status.success(), "{one:?}, rank {rank}");
            assert!(
                stderr.contains(&format!("rank {rank} of 2"))
                    && stderr.contains("the configuration differs between ranks")
                    && stderr.contains(named),
                "{one:?}, rank {rank}: {stderr}"
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(25),
            "{one:?}: took {:?}, as if waiting for the deadline",
            started.elapsed()
        );
        assert!(!out.join("checkpoint").exists(), "{one:?}: trained");
    }
}
