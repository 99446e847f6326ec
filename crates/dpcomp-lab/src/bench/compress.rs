//! `dpcomp bench compress`: a compressor's compress + decompress time per step on the task
//! model's real gradients, against the same model's backward pass timed in the same run, and its
//! wire bits against dense fp32.
//!
//! The gradients are the model's own (one forward/backward on the seeded synthetic batch); every
//! timed step compresses them plus fresh Gaussian noise of the DP scale σ C / B (what a DP step
//! hands the compressor), drawn before the timer starts. Rounds alternate backward passes and
//! compressor steps, so both see the same machine load.
//!
//! It also times what making each step's message bytes and reading them back adds: a run with
//! `compression.verify_wire` pays it every step (training otherwise decodes the message in
//! memory); messages cross a process only as bytes.

use super::{synchronize, BenchSetup, Prepared};
use dpcomp::compress::{dense_fp32_bits, CompressorKind, Message, Setting};
use dpcomp::config::CompressionSettings;
use dpcomp::error::Result;
use dpcomp::nn::Ctx;
use std::time::Instant;
use tch::{Reduction, Tensor};

/// `dpcomp bench compress`: the common settings, the compressor and the noise on its input.
#[derive(Debug)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct CompressBenchArgs {
    /// Task, batch, device and step counts.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub setup: BenchSetup,
    /// The compressor timed.
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub compressor: CompressorKind,
    /// DGC/Denoise rate (dense fp32 bits / message bits).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1.0))]
    pub rate: f64,
    /// PowerSGD rank.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1))]
    pub rank: i64,
    /// Compressor setting key=value, repeatable, the value read as TOML (as for `dpcomp
    /// train`).
    #[cfg_attr(
        feature = "cli",
        arg(long = "compressor-option", value_name = "KEY=VALUE")
    )]
    pub compressor_options: Vec<Setting>,
    /// Alternating rounds the timed steps are split into.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 4))]
    pub rounds: usize,
    /// Noise added to the gradients before each compression: σ C / batch per coordinate.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0.8))]
    pub noise_multiplier: f64,
}

/// Times the compressor's compress + decompress of noisy real gradients against the model's
/// backward pass in alternating rounds, and the message's trip to bytes and back, then prints
/// the mean times, their ratios and the wire bits a step against dense fp32 (a line, or JSON
/// with `--json`).
pub fn compress_bench(args: CompressBenchArgs) -> Result<()> {
    let setup = &args.setup;
    let Prepared {
        device,
        defaults,
        batch_size,
        model,
        batch,
        ..
    } = setup.prepare()?;
    let batch = super::batch_to_device(&batch, device);
    let spec = CompressionSettings::from_flags(
        args.compressor,
        Some(args.rate),
        Some(args.rank),
        args.compressor_options.clone(),
    )?;
    let params = model.trainable_variables();
    let shapes: Vec<Vec<i64>> = params.iter().map(|(_, p)| p.size()).collect();
    let mut compressor = spec.compressor.link(&shapes, device)?;

    // One backward pass of the model (forward untimed): its gradients and its time.
    let backward = || -> Result<(Vec<Tensor>, f64)> {
        for (_, p) in &params {
            p.shallow_clone().zero_grad();
        }
        let mut ctx = Ctx::train();
        let logits = model.forward(&batch.features, &mut ctx)?;
        let loss =
            logits.cross_entropy_loss::<Tensor>(&batch.labels, None, Reduction::Mean, -100, 0.0);
        synchronize(device);
        let start = Instant::now();
        ctx.backward(&loss);
        synchronize(device);
        let seconds = start.elapsed().as_secs_f64();
        Ok((
            params.iter().map(|(_, p)| p.grad().copy()).collect(),
            seconds,
        ))
    };
    let (gradients, _) = backward()?;
    let noise_std = args.noise_multiplier * defaults.privacy.max_grad_norm / batch_size as f64;
    let noisy = || -> Vec<Tensor> {
        gradients
            .iter()
            .map(|g| g + g.randn_like() * noise_std)
            .collect()
    };
    let mut step = |update: &[Tensor]| -> (f64, Message) {
        synchronize(device);
        let start = Instant::now();
        let (message, received) = compressor.round_trip(update);
        synchronize(device);
        let seconds = start.elapsed().as_secs_f64();
        drop(received);
        (seconds, message)
    };
    // The message to its bytes (a copy to the host) and back onto the device.
    let through_bytes = |message: &Message| -> Result<f64> {
        synchronize(device);
        let start = Instant::now();
        let bytes = message.to_bytes()?;
        let back = Message::from_bytes(&bytes, device)?;
        synchronize(device);
        let seconds = start.elapsed().as_secs_f64();
        drop(back);
        Ok(seconds)
    };
    for _ in 0..setup.warmup {
        let _ = backward()?;
        let (_, message) = step(&noisy());
        through_bytes(&message)?;
    }
    let rounds = args.rounds.max(1);
    let per_round = (setup.steps / rounds).max(1);
    let (mut compress_total, mut backward_total, mut bits_total) = (0.0, 0.0, 0u64);
    let mut bytes_total = 0.0;
    for _ in 0..rounds {
        for _ in 0..per_round {
            backward_total += backward()?.1;
        }
        for _ in 0..per_round {
            let update = noisy();
            let (seconds, message) = step(&update);
            compress_total += seconds;
            bits_total += message.wire_bits();
            bytes_total += through_bytes(&message)?;
        }
    }
    let steps = rounds * per_round;
    let compress = compress_total / steps as f64;
    let backward_mean = backward_total / steps as f64;
    let bytes_mean = bytes_total / steps as f64;
    let dense = dense_fp32_bits(&gradients);
    let bits = bits_total / steps as u64;
    if setup.json {
        println!(
            "{}",
            serde_json::json!({
                "task": setup.task, "batch_size": batch_size, "device": format!("{device:?}"),
                "compressor": spec.label(), "options": spec.to_table(), "steps": steps,
                "mean_compress_decompress_seconds": compress,
                "mean_backward_seconds": backward_mean,
                "ratio_compress_over_backward": compress / backward_mean,
                "mean_message_bytes_seconds": bytes_mean,
                "ratio_message_bytes_over_compress": bytes_mean / compress,
                "wire_bits_per_step": bits, "dense_fp32_bits_per_step": dense,
                "achieved_rate": dense as f64 / bits as f64,
                "layer_shapes": shapes, "threads": tch::get_num_threads(),
            })
        );
    } else {
        println!(
            "{} {}: compress+decompress {:.2} ms, backward {:.2} ms, ratio {:.3}; message to bytes and back {:.2} ms; {} bits/step = dense / {:.1}",
            setup.task,
            spec.label(),
            compress * 1e3,
            backward_mean * 1e3,
            compress / backward_mean,
            bytes_mean * 1e3,
            bits,
            dense as f64 / bits as f64
        );
    }
    Ok(())
}
