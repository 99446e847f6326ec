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

/// `dpcomp bench fl-reconstruction`: the model sizes, FL-CS's ratio and solver, and the client
/// round the reconstruction is compared with.
#[derive(Debug)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct FlBenchArgs {
    /// Model sizes n (parameters of the MLP 784-h-10, h chosen to come close), comma-separated.
    #[cfg_attr(
        feature = "cli",
        arg(long, value_delimiter = ',', default_value = "100000,1000000")
    )]
    pub sizes: Vec<i64>,
    /// FL-CS's ratio r = m / n: measurements sent per model parameter.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0.1))]
    pub ratio: f64,
    /// OWL-QN iterations per reconstruction (the experiment's 50).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 50))]
    pub iterations: usize,
    /// Clients in the round of client training the reconstruction is compared with.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 10))]
    pub clients: usize,
    /// Local SGD steps of each client in that round.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 10))]
    pub local_steps: usize,
    /// Examples per local SGD step.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 20))]
    pub batch: usize,
    /// Alternating timed rounds (client round, reconstruction).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 3))]
    pub rounds: usize,
    /// Print the speed and recovery tables as one JSON object instead of text.
    #[cfg_attr(feature = "cli", arg(long))]
    pub json: bool,
}

/// One model size's timings (medians over the timed rounds) and reconstruction errors.
#[derive(Debug, Serialize)]
pub struct SpeedRow {
    /// n: the model's parameters.
    pub parameters: i64,
    /// P: the chunks the sketch splits the update into.
    pub chunks: i64,
    /// m: the measurements in one message.
    pub message_length: i64,
    /// One round of client training, in seconds.
    pub client_round_seconds: f64,
    /// One OWL-QN reconstruction (λ, solve and unshuffle), in seconds.
    pub owlqn_seconds: f64,
    /// Applications of A in one reconstruction (line searches included).
    pub owlqn_evaluations: usize,
    /// FISTA on the same problem for as many iterations as OWL-QN, in seconds.
    pub fista_seconds: f64,
    /// Zero filling (Aᵀy: the dropped DCT coefficients taken as zero), in seconds.
    pub zero_fill_seconds: f64,
    /// OWL-QN reconstruction / one round of client training.
    pub ratio_to_client_round: f64,
    /// ‖D(C(Δ)) − Δ‖ / ‖Δ‖ with D the OWL-QN reconstruction, Δ the last client update of the
    /// last round.
    pub update_error_owlqn: f64,
    /// The same relative error with zero filling as D.
    pub update_error_zero_fill: f64,
}

/// Recovery of k-sparse chunks of length 1024 at one ratio and sparsity: the relative error
/// ‖ŝ − s‖ / ‖s‖, mean of 8 chunks, from the first or from random DCT rows.
#[derive(Debug, Serialize)]
pub struct RecoveryRow {
    /// r = m / n of the sketch.
    pub ratio: f64,
    /// k: the nonzero coordinates of each chunk.
    pub sparsity: i64,
    /// The relative error with the first m/P DCT rows (FL-CS's choice).
    pub error_first_rows: f64,
    /// The relative error with m/P random DCT rows.
    pub error_random_rows: f64,
}

fn relative(a: &Tensor, b: &Tensor) -> f64 {
    dpcomp::host::f64_scalar(&(a - b).norm()) / dpcomp::host::f64_scalar(&b.norm()).max(1e-30)
}

/// Times FL-CS's reconstruction against a round of client training for each model size (on
/// the CPU), measures the recovery of k-sparse chunks from first versus random DCT rows, and
/// prints both tables (text, or JSON with `--json`).
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
