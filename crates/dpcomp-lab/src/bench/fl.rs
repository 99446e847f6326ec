//! `dpcomp bench fl-reconstruction`: FL-CS's server-side reconstruction (chunked BPDN by OWL-QN)
//! per round for models of n parameters, against one round of client training of a model of the
//! same size, timed in alternating rounds of the same run; and the recovery quality of the
//! paper's first-m DCT rows against random DCT rows.
//!
//! The model of n parameters is an MLP 784 → h → 10 on Fashion-MNIST-shaped inputs (h chosen so
//! that it has about n parameters); one round of client training is `clients` clients × T_gd local
//! SGD steps of `batch` examples, as the experiment's Fashion-MNIST setting (10 × 10 × 20). Its
//! update is what gets compressed and reconstructed, so the reconstruction sees a real update.
//!
//! Recovery quality: a k-sparse chunk (random support, as after the shuffle) of length 1024 is
//! measured by m/P first or random DCT rows and recovered by BPDN solved to convergence (FISTA,
//! whose iterations are cheap; the question is the sensing matrix, not the solver); the relative
//! error ‖ŝ − s‖ / ‖s‖ is printed for both row choices, and for a real (dense) client update.

use super::median;
use dpcomp::compress::chunked_dct::{ChunkedDct, DctRows};
use dpcomp::compress::linear_sketch::{Codec, Scheme};
use dpcomp::compress::owlqn::{fista, owlqn, Measurement, OwlqnSettings};
use dpcomp::error::Result;
use dpcomp::fl::client::{client_update, LocalTraining};
use dpcomp::fl::model::FlModel;
use serde::Serialize;
use std::time::Instant;
use tch::{Device, Kind, Tensor};

#[derive(Debug)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct FlBenchArgs {
    /// Model sizes n.
    #[cfg_attr(
        feature = "cli",
        arg(long, value_delimiter = ',', default_value = "100000,1000000")
    )]
    pub sizes: Vec<i64>,
    /// r = m / n.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0.1))]
    pub ratio: f64,
    /// OWL-QN iterations per reconstruction (the experiment's 50).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 50))]
    pub iterations: usize,
    /// Clients per round, local steps and batch of the client round it is compared with.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 10))]
    pub clients: usize,
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 10))]
    pub local_steps: usize,
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 20))]
    pub batch: usize,
    /// Alternating timed rounds (client round, reconstruction).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 3))]
    pub rounds: usize,
    #[cfg_attr(feature = "cli", arg(long))]
    pub json: bool,
}

#[derive(Debug, Serialize)]
pub struct SpeedRow {
    pub parameters: i64,
    pub chunks: i64,
    pub message_length: i64,
    pub client_round_seconds: f64,
    pub owlqn_seconds: f64,
    /// Applications of A in one reconstruction (line searches included).
    pub owlqn_evaluations: usize,
    pub fista_seconds: f64,
    pub zero_fill_seconds: f64,
    /// OWL-QN reconstruction / one round of client training.
    pub ratio_to_client_round: f64,
    /// ‖D(C(Δ)) − Δ‖ / ‖Δ‖ for the real update, OWL-QN and zero filling.
    pub update_error_owlqn: f64,
    pub update_error_zero_fill: f64,
}

#[derive(Debug, Serialize)]
pub struct RecoveryRow {
    pub ratio: f64,
    pub sparsity: i64,
    pub error_first_rows: f64,
    pub error_random_rows: f64,
}

fn relative(a: &Tensor, b: &Tensor) -> f64 {
    dpcomp::host::f64_scalar(&(a - b).norm()) / dpcomp::host::f64_scalar(&b.norm()).max(1e-30)
}

pub fn fl_bench(args: FlBenchArgs) -> Result<()> {
    tch::manual_seed(0);
    let device = Device::Cpu;
    let settings = OwlqnSettings {
        max_iterations: args.iterations,
        tolerance: 0.0,
        ..OwlqnSettings::default()
    };
    let mut speed = Vec::new();
    for &n in &args.sizes {
        let hidden = ((n - 10) / (784 + 1 + 10)).max(1);
        let mut model = FlModel::mlp(784, hidden, 10, device)?;
        let global = model.flat();
        let examples = (args.clients * args.batch * args.local_steps) as i64;
        let x = Tensor::randn([examples, 784], (Kind::Float, device));
        let y = Tensor::randint(10, [examples], (Kind::Int64, device));
        let per_client = (args.batch * args.local_steps) as i64;
        let local = LocalTraining {
            steps: args.local_steps,
            batch: args.batch,
            learning_rate: 0.05,
        };
        let codec = Codec::new(
            Scheme::Cs,
            global.size()[0],
            args.ratio,
            None,
            DctRows::First,
            1,
            device,
        )?;
        let sketch = codec.sketch.as_ref().expect("FL-CS has a sketch");
        let mut update = Tensor::zeros_like(&global);
        let (mut client_times, mut owlqn_times, mut fista_times, mut fill_times) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut errors = (0.0, 0.0);
        let mut evaluations = 0;
        for round in 0..args.rounds {
            let start = Instant::now();
            for k in 0..args.clients as i64 {
                let index: Vec<i64> = (k * per_client..(k + 1) * per_client).collect();
                update = client_update(&mut model, &global, &x, &y, &index, &local, round as u64)?;
            }
            client_times.push(start.elapsed().as_secs_f64());
            let message = sketch.compress(&update);
            let measurements = sketch.measurements(&message).to_kind(Kind::Double);
            let start = Instant::now();
            let lambda = sketch
                .adjoint(&measurements)
                .abs()
                .amax([1i64].as_slice(), true)
                * 0.01;
            let solution = owlqn(
                sketch,
                &measurements,
                &lambda,
                sketch.chunk_length,
                &settings,
            );
            let reconstructed = sketch.unshuffle(&solution.s.to_kind(Kind::Float));
            evaluations = solution.evaluations;
            owlqn_times.push(start.elapsed().as_secs_f64());
            let start = Instant::now();
            let _ = fista(
                sketch,
                &measurements,
                &lambda,
                sketch.chunk_length,
                1.0,
                args.iterations,
            );
            fista_times.push(start.elapsed().as_secs_f64());
            let start = Instant::now();
            let filled = sketch.zero_fill(&message);
            fill_times.push(start.elapsed().as_secs_f64());
            errors = (
                relative(&reconstructed, &update),
                relative(&filled, &update),
            );
        }
        let client = median(client_times);
        let rec = median(owlqn_times);
        speed.push(SpeedRow {
            parameters: global.size()[0],
            chunks: sketch.chunks,
            message_length: sketch.message_length(),
            client_round_seconds: client,
            owlqn_seconds: rec,
            owlqn_evaluations: evaluations,
            fista_seconds: median(fista_times),
            zero_fill_seconds: median(fill_times),
            ratio_to_client_round: rec / client,
            update_error_owlqn: errors.0,
            update_error_zero_fill: errors.1,
        });
    }
    let recovery = recovery_table(device);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"speed": speed, "recovery": recovery})
            )
            .expect("numbers serialise")
        );
        return Ok(());
    }
    println!(
        "FL-CS reconstruction, r {}, {} OWL-QN iterations; client round = {} clients x {} steps x {} examples (MLP 784-h-10)",
        args.ratio, args.iterations, args.clients, args.local_steps, args.batch
    );
    println!(
        "{:>9} {:>6} {:>8} {:>11} {:>9} {:>9} {:>10} {:>8} {:>13} {:>15}",
        "n",
        "P",
        "m",
        "client s",
        "OWL-QN s",
        "FISTA s",
        "zero-fill s",
        "ratio",
        "err OWL-QN",
        "err zero-fill"
    );
    for r in &speed {
        println!(
            "{:>9} {:>6} {:>8} {:>11.3} {:>9.3} {:>9.3} {:>10.4} {:>8.2} {:>13.3} {:>15.3}",
            r.parameters,
            r.chunks,
            r.message_length,
            r.client_round_seconds,
            r.owlqn_seconds,
            r.fista_seconds,
            r.zero_fill_seconds,
            r.ratio_to_client_round,
            r.update_error_owlqn,
            r.update_error_zero_fill
        );
    }
    println!("\nk-sparse recovery, chunk length 1024, random support, BPDN with λ 1e-4 ‖Aᵀy‖∞ solved to convergence (FISTA, 3,000 iterations); relative error, mean of 8 chunks");
    println!(
        "{:>6} {:>6} {:>12} {:>12}",
        "r", "k", "first rows", "random rows"
    );
    for r in &recovery {
        println!(
            "{:>6} {:>6} {:>12.4} {:>12.4}",
            r.ratio, r.sparsity, r.error_first_rows, r.error_random_rows
        );
    }
    Ok(())
}

/// Relative recovery error of k-sparse chunks from the first or random DCT rows.
fn recovery_table(device: Device) -> Vec<RecoveryRow> {
    let length = 1024;
    let chunks = 8;
    let mut rows = Vec::new();
    for ratio in [0.05, 0.1, 0.2] {
        let kept = (ratio * length as f64).round() as i64;
        for sparsity in [kept / 8, kept / 4, kept / 2] {
            tch::manual_seed(sparsity);
            let truth = Tensor::zeros([chunks, length], (Kind::Double, device));
            for c in 0..chunks {
                let places = Tensor::randperm(length, (Kind::Int64, device)).narrow(0, 0, sparsity);
                let values = Tensor::randn([sparsity], (Kind::Double, device));
                let _ = truth.get(c).index_copy_(0, &places, &values);
            }
            let error = |rows: DctRows| {
                let sketch = ChunkedDct::new(chunks * length, ratio, chunks, None, rows, device)
                    .expect("valid sketch");
                let y = sketch.apply(&truth);
                let lambda = sketch.adjoint(&y).abs().amax([1i64].as_slice(), true) * 1e-4;
                let s = fista(&sketch, &y, &lambda, length, 1.0, 3_000).s;
                let per_chunk = (&s - &truth).norm_scalaropt_dim(2.0, [1i64].as_slice(), false)
                    / truth.norm_scalaropt_dim(2.0, [1i64].as_slice(), false);
                dpcomp::host::f64_scalar(&per_chunk.mean(Kind::Double))
            };
            rows.push(RecoveryRow {
                ratio,
                sparsity,
                error_first_rows: error(DctRows::First),
                error_random_rows: error(DctRows::Random),
            });
        }
    }
    rows
}
