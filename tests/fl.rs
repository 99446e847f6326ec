//! Federated learning with compressive sensing (issue 7): BPDN solvers, the compressed
//! aggregation, client-level DP and small real federated runs.

mod common;

use dpcomp::fl::owlqn::{fista, objective, owlqn, Measurement, OwlqnSettings};
use dpcomp::fl::sketch::{ChunkedDct, DctRows};
use tch::{Device, Kind, Tensor};

const OPTS: (Kind, Device) = (Kind::Double, Device::Cpu);

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
    let reference = fista(&sketch, &y, &lambda, length, 1.0, 20_000);
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
    // BPDN proper: noisy measurements, moderate λ, first-m rows (the paper's), shuffled input.
    let n = 3000;
    let sketch = ChunkedDct::new(n, 0.1, 3, Some(5), DctRows::First, Device::Cpu).unwrap();
    let truth = sparse_chunks(1, n, 30, 12).squeeze_dim(0);
    tch::manual_seed(13);
    let y = sketch.measurements(&sketch.compress(&truth))
        + Tensor::randn([3, sketch.kept], OPTS) * 0.05;
    let lambda = Tensor::full([3, 1], 0.05, OPTS);
    let settings = OwlqnSettings {
        max_iterations: 2_000,
        tolerance: 1e-12,
        ..Default::default()
    };
    let solution = owlqn(&sketch, &y, &lambda, sketch.chunk_length, &settings);
    let reference = fista(&sketch, &y, &lambda, sketch.chunk_length, 1.0, 5_000);
    let ours = objective(&sketch, &solution.s, &y, &lambda);
    for r in 0..3 {
        let (a, b) = (
            ours.double_value(&[r]),
            reference.objective.double_value(&[r]),
        );
        assert!(
            (a - b).abs() <= 1e-6 * b,
            "chunk {r}: OWL-QN {a:e}, FISTA {b:e}"
        );
    }
}
