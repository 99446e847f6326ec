//! `dpcomp bench comm`: what a data-parallel step costs with each compressor, measured
//! on W MPI ranks of this machine, and modelled over real links.
//!
//! For each W it launches `mpiexec -n W dpcomp bench comm --worker ...`; every rank trains the
//! task's model on its own copy of the seeded synthetic batch (the non-private step: forward,
//! backward, global-norm clip; the exchange is the same under DP), exchanging real messages
//! through `train::exchange`, and times each step's parts: compute (everything outside the
//! exchange), encode, communication (inside the collectives, waiting for the slowest rank
//! included) and decode, with the bytes each rank handed to MPI. Rank 0 prints the medians over
//! the timed steps. A worker runs in whatever job `comm::world()` finds, so `torchrun
//! --nproc-per-node W --no-python dpcomp bench comm --worker --json ...` measures the same step
//! over c10d on Gloo (`benches/comm_vs_ddp.py` runs it both ways against PyTorch DDP).
//!
//! The link model (`model_step`) puts the measured compute, encode and decode (decode per
//! message, for the gathered compressors whose receivers decode all W) beside the standard ring
//! algorithms' costs over a link of bandwidth B and latency α: an all-reduce of b bytes takes
//! 2 (W - 1) α + 2 (W - 1) / W · b / B (PowerSGD runs two), an all-gather of W messages of b
//! bytes (W - 1) α + (W - 1) b / B. A compressor pays for itself where its modelled step is
//! shorter than the identity's (dense all-reduce) at the same W and link.

use super::{median, synchronize, BenchSetup, Prepared};
use dpcomp::comm::{Communicator, Shared};
use dpcomp::compress::CompressorKind;
use dpcomp::config::CompressionSettings;
use dpcomp::error::{Error, Result};
use dpcomp::train::exchange::Exchange;
use dpcomp::train::sgd::Sgd;
use dpcomp::train::traffic::{gather_traffic, TrafficRow};
use dpcomp::train::train_step;
use dpcomp::train::update::Updater;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// `dpcomp bench comm`: the common settings, the compressors, the measured and the modelled
/// worker counts.
#[derive(Debug)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct CommBenchArgs {
    /// Task, batch (per worker), device and step counts.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub setup: BenchSetup,
    /// Compressors, comma-separated: KIND[:N[:KEY=VALUE...]], N the rate (DGC, Denoise, the
    /// sketches, random-k) or the rank (PowerSGD), omitted for the kinds without either:
    /// identity, dgc:256, powersgd:1:shape=rows, denoise:16, fp16.
    #[cfg_attr(
        feature = "cli",
        arg(
            long,
            value_delimiter = ',',
            default_value = "identity,dgc:256,powersgd:1,denoise:256"
        )
    )]
    pub compressors: Vec<String>,
    /// Worker counts, each launched as `mpiexec -n W`.
    #[cfg_attr(
        feature = "cli",
        arg(long, value_delimiter = ',', default_value = "1,2,4")
    )]
    pub workers: Vec<usize>,
    /// Worker counts the link model extrapolates to.
    #[cfg_attr(
        feature = "cli",
        arg(long, value_delimiter = ',', default_value = "2,4,8,16,32,64")
    )]
    pub model_workers: Vec<usize>,
    /// Run as one rank of the job (what `bench comm` launches under mpiexec; torchrun works too).
    #[cfg_attr(feature = "cli", arg(long, hide = true))]
    pub worker: bool,
}

/// A compressor from `KIND[:N[:KEY=VALUE...]]`.
pub fn parse_compressor(text: &str) -> Result<CompressionSettings> {
    let mut parts = text.split(':');
    let name = parts.next().unwrap_or_default();
    let kind = CompressorKind::ALL
        .into_iter()
        .find(|k| k.name() == name)
        .ok_or_else(|| {
            let names: Vec<&str> = CompressorKind::ALL.iter().map(|k| k.name()).collect();
            Error::bad_value(
                "--compressors",
                format!(
                    "{text:?}: unknown compressor {name:?}; expected one of {}",
                    names.join(", ")
                ),
            )
        })?;
    let number = match parts.next() {
        Some(n) => n.parse::<f64>().map_err(|_| {
            Error::bad_value(
                "--compressors",
                format!("{text:?}: {n:?} is not a number (the rate, or PowerSGD's rank)"),
            )
        })?,
        None => 1.0,
    };
    let options = parts
        .map(str::parse)
        .collect::<std::result::Result<Vec<_>, String>>()
        .map_err(|e| Error::bad_value("--compressors", format!("{text:?}: {e}")))?;
    let (rate, rank) = match kind {
        CompressorKind::Powersgd => (1.0, number as i64),
        _ => (number, 1),
    };
    CompressionSettings::from_flags(kind, Some(rate), Some(rank), options)
}

/// One compressor's step on W ranks: medians over the timed steps of rank 0's parts, and the
/// bytes per step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CommRow {
    /// The compressor's label with its settings ("dgc x256", "powersgd r1").
    pub compressor: String,
    /// The compressor's kind ("identity", "dgc", "powersgd", ...).
    pub kind: String,
    /// W: the ranks of the job.
    pub workers: usize,
    /// The whole step (compute, encode, communication and decode), in seconds.
    pub step_seconds: f64,
    /// Everything outside the exchange (forward, backward, clip, update), in seconds.
    pub compute_seconds: f64,
    /// Encoding the message, in seconds.
    pub encode_seconds: f64,
    /// Inside the collectives, waiting for the slowest rank included, in seconds.
    pub comm_seconds: f64,
    /// Decoding the received messages, in seconds.
    pub decode_seconds: f64,
    /// Inside the collectives on the rank that spent least there, each step, in seconds: the
    /// transfer itself, nearly without waiting for a slower rank (`comm_seconds` minus this is
    /// rank 0's wait for the others).
    #[serde(default)]
    pub least_comm_seconds: f64,
    /// Bytes rank 0 handed to MPI per step (its message, or the vectors it all-reduced).
    pub sent_bytes: f64,
    /// Bytes rank 0 received per step.
    pub received_bytes: f64,
    /// Bytes of rank 0's message per step whatever W (what one worker uploads).
    pub message_bytes: f64,
    /// The model's trainable parameters.
    pub parameters: i64,
    /// Examples per rank and step.
    pub batch_size: i64,
}

/// One rank's part of the benchmark: every compressor in turn, `setup.warmup` untimed then
/// `setup.steps` timed steps each; rank 0 returns the rows.
pub fn worker(args: &CommBenchArgs, comm: Shared) -> Result<Vec<CommRow>> {
    let setup = &args.setup;
    let mut rows = Vec::new();
    for text in &args.compressors {
        let spec = parse_compressor(text)?;
        let Prepared {
            device,
            defaults,
            batch_size,
            model,
            batch,
            ..
        } = setup.prepare()?;
        let batch = super::batch_to_device(&batch, device);
        let params = model.trainable_variables();
        let shapes: Vec<Vec<i64>> = params.iter().map(|(_, p)| p.size()).collect();
        let mut updater = Updater::new(
            Box::new(Sgd::new(defaults.optimizer.lr, 0.0)),
            spec.compressor.link(&shapes, device)?,
        );
        let workers = comm.size();
        let decoders = (0..workers)
            .map(|_| spec.compressor.decoder(&shapes, device))
            .collect::<Result<Vec<_>>>()?;
        updater.exchange = Some(Exchange::new(Box::new(comm.clone()), decoders));
        let mut mine = Vec::with_capacity(setup.steps);
        let mut bits = Vec::with_capacity(setup.steps);
        for step in 0..setup.warmup + setup.steps {
            let started = Instant::now();
            let (loss, _) = train_step(
                model.as_ref(),
                &params,
                &mut updater,
                &batch,
                defaults.privacy.max_grad_norm,
            )?;
            let _ = dpcomp::host::f64_scalar(&loss);
            synchronize(device);
            let seconds = started.elapsed().as_secs_f64();
            if step >= setup.warmup {
                bits.push(updater.last_bits as f64);
                let cost = updater.last_traffic;
                let exchange = cost.encode_seconds + cost.comm_seconds + cost.decode_seconds;
                mine.push(TrafficRow {
                    step: step as u64,
                    rank: comm.rank(),
                    compute_seconds: (seconds - exchange).max(0.0),
                    cost,
                });
            }
        }
        let message_bytes = median(bits) / 8.0;
        let mut gathering = comm.clone();
        let all = gather_traffic(&mut gathering, &mine)?;
        let zero: Vec<&TrafficRow> = all.iter().filter(|r| r.rank == 0).collect();
        let of = |f: &dyn Fn(&TrafficRow) -> f64| median(zero.iter().map(|r| f(r)).collect());
        let least_comm = median(
            (setup.warmup..setup.warmup + setup.steps)
                .map(|step| {
                    all.iter()
                        .filter(|r| r.step == step as u64)
                        .map(|r| r.cost.comm_seconds)
                        .fold(f64::INFINITY, f64::min)
                })
                .collect(),
        );
        let parts = [
            of(&|r| r.compute_seconds),
            of(&|r| r.cost.encode_seconds),
            of(&|r| r.cost.comm_seconds),
            of(&|r| r.cost.decode_seconds),
        ];
        rows.push(CommRow {
            compressor: spec.label(),
            kind: spec.kind().name().to_string(),
            workers,
            step_seconds: of(&|r| {
                r.compute_seconds
                    + r.cost.encode_seconds
                    + r.cost.comm_seconds
                    + r.cost.decode_seconds
            }),
            compute_seconds: parts[0],
            encode_seconds: parts[1],
            comm_seconds: parts[2],
            decode_seconds: parts[3],
            least_comm_seconds: least_comm,
            sent_bytes: of(&|r| r.cost.traffic.sent as f64),
            received_bytes: of(&|r| r.cost.traffic.received as f64),
            message_bytes,
            parameters: model.trainable_parameter_count(),
            batch_size,
        });
    }
    Ok(rows)
}

/// A link of `gigabits` per second and `latency_us` microseconds per message.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Link {
    /// Bandwidth B, in gigabits per second.
    pub gigabits: f64,
    /// Latency α of one message, in microseconds.
    pub latency_us: f64,
}

/// The links the README's table models: 1 Gb/s Ethernet (50 µs), 10 Gb/s (10 µs), 100 Gb/s
/// (InfiniBand-class, 2 µs).
pub const LINKS: [Link; 3] = [
    Link {
        gigabits: 1.0,
        latency_us: 50.0,
    },
    Link {
        gigabits: 10.0,
        latency_us: 10.0,
    },
    Link {
        gigabits: 100.0,
        latency_us: 2.0,
    },
];

/// The modelled step of `row`'s compressor (measured with one worker: its encode and decode of
/// one message) at `workers` workers over `link` (module docs), after `compute` seconds of
/// forward and backward (the same for every compressor: the W = 1 rows' median, so that the
/// machine's noise between rows does not pass for a compressor's cost).
pub fn model_step(row: &CommRow, compute: f64, workers: usize, link: Link) -> f64 {
    let w = workers as f64;
    let alpha = link.latency_us * 1e-6;
    let seconds_per_byte = 8.0 / (link.gigabits * 1e9);
    let b = row.message_bytes;
    let (comm, decode) = match row.kind.as_str() {
        "identity" => (
            2.0 * (w - 1.0) * alpha + 2.0 * (w - 1.0) / w * b * seconds_per_byte,
            row.decode_seconds,
        ),
        // Two all-reduces (P then Q) of about half the bytes each.
        "powersgd" => (
            4.0 * (w - 1.0) * alpha + 2.0 * (w - 1.0) / w * b * seconds_per_byte,
            row.decode_seconds,
        ),
        _ => (
            (w - 1.0) * alpha + (w - 1.0) * b * seconds_per_byte,
            row.decode_seconds * w,
        ),
    };
    compute + row.encode_seconds + decode + comm
}

/// Runs the benchmark: one `mpiexec -n W` job per W (W = 1 too, in this process when it is not
/// under MPI), then prints the measured table and the link model.
pub fn comm_bench(args: CommBenchArgs) -> Result<()> {
    for (flag, counts) in [
        ("workers", &args.workers),
        ("model_workers", &args.model_workers),
    ] {
        if counts.is_empty() || counts.contains(&0) {
            return Err(Error::bad_value(
                flag,
                format!(
                    "{}: expected worker counts of at least 1, comma-separated",
                    counts
                        .iter()
                        .map(usize::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            ));
        }
    }
    if args.worker {
        let (world, _) = dpcomp::comm::world()?;
        let shared = Shared::new(world);
        let rows = worker(&args, shared.clone())
            .inspect_err(|e| dpcomp::comm::end_job(&mut shared.clone(), &e.to_string()))?;
        if shared.rank() == 0 {
            println!("{}", serde_json::to_string(&rows).expect("rows serialise"));
        }
        return Ok(());
    }
    let mut measured: Vec<CommRow> = Vec::new();
    for &workers in &args.workers {
        measured.extend(launch(&args, workers)?);
    }
    let table = model_table(&args, &measured);
    if args.setup.json {
        println!(
            "{}",
            serde_json::json!({"measured": measured, "links": LINKS, "model": table})
        );
        return Ok(());
    }
    println!(
        "measured on this machine ({} ranks, task {}, batch {} per worker, median of {} steps; times in ms)",
        args.workers
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join("/"),
        args.setup.task,
        measured.first().map_or(0, |r| r.batch_size),
        args.setup.steps
    );
    println!(
        "{:<26} {:>3} {:>9} {:>9} {:>8} {:>8} {:>8} {:>12} {:>12}",
        "compressor", "W", "step", "compute", "encode", "comm", "decode", "sent B", "received B"
    );
    for r in &measured {
        println!(
            "{:<26} {:>3} {:>9.2} {:>9.2} {:>8.2} {:>8.2} {:>8.2} {:>12.0} {:>12.0}",
            r.compressor,
            r.workers,
            1e3 * r.step_seconds,
            1e3 * r.compute_seconds,
            1e3 * r.encode_seconds,
            1e3 * r.comm_seconds,
            1e3 * r.decode_seconds,
            r.sent_bytes,
            r.received_bytes
        );
    }
    println!(
        "\nmodelled speed-up over identity (> 1: the compressor pays for itself), from the W = 1 rows (compute: their median)"
    );
    let mut header = format!("{:<16} {:<26}", "link", "compressor");
    for w in &args.model_workers {
        header.push_str(&format!(" {:>7}", format!("W={w}")));
    }
    println!("{header}");
    for link in LINKS {
        let label = format!("{} Gb/s {} us", link.gigabits, link.latency_us);
        let mut names: Vec<&str> = Vec::new();
        for entry in table.iter().filter(|e| e.link.gigabits == link.gigabits) {
            if !names.contains(&entry.compressor.as_str()) {
                names.push(&entry.compressor);
            }
        }
        for name in names {
            let mut line = format!("{label:<16} {name:<26}");
            for w in &args.model_workers {
                let cell = table.iter().find(|e| {
                    e.link.gigabits == link.gigabits && e.workers == *w && e.compressor == name
                });
                line.push_str(&format!(" {:>7.2}", cell.map_or(f64::NAN, |e| e.speedup)));
            }
            println!("{line}");
        }
    }
    Ok(())
}

/// One cell of the link model.
#[derive(Debug, Clone, Serialize)]
pub struct ModelRow {
    /// The modelled link.
    pub link: Link,
    /// W: the modelled workers.
    pub workers: usize,
    /// The compressor's label, as in [`CommRow::compressor`].
    pub compressor: String,
    /// The modelled step (`model_step`), in seconds.
    pub step_seconds: f64,
    /// The identity's modelled step / this one's (> 1: the compressor pays for itself).
    pub speedup: f64,
}

fn model_table(args: &CommBenchArgs, measured: &[CommRow]) -> Vec<ModelRow> {
    let alone: Vec<&CommRow> = measured.iter().filter(|r| r.workers == 1).collect();
    let Some(identity) = alone.iter().find(|r| r.kind == "identity") else {
        return Vec::new();
    };
    let compute = median(alone.iter().map(|r| r.compute_seconds).collect());
    let mut table = Vec::new();
    for link in LINKS {
        for &workers in &args.model_workers {
            let baseline = model_step(identity, compute, workers, link);
            for row in &alone {
                let step = model_step(row, compute, workers, link);
                table.push(ModelRow {
                    link,
                    workers,
                    compressor: row.compressor.clone(),
                    step_seconds: step,
                    speedup: baseline / step,
                });
            }
        }
    }
    table
}

/// `mpiexec -n W` of this binary as the benchmark's worker; rank 0's rows.
fn launch(args: &CommBenchArgs, workers: usize) -> Result<Vec<CommRow>> {
    let exe = std::env::current_exe().map_err(|e| Error::io("the dpcomp binary", e))?;
    let setup = &args.setup;
    let mut command = std::process::Command::new("mpiexec");
    command
        .args(["-n", &workers.to_string()])
        .arg(&exe)
        .args(["bench", "comm", "--worker", "--json"])
        .args(["--task", &setup.task.to_string()])
        .args(["--steps", &setup.steps.to_string()])
        .args(["--warmup", &setup.warmup.to_string()])
        .args([
            "--device",
            match setup.device {
                dpcomp::config::DeviceChoice::Auto => "auto",
                dpcomp::config::DeviceChoice::Cpu => "cpu",
                dpcomp::config::DeviceChoice::Cuda => "cuda",
            },
        ])
        .arg("--bert-dir")
        .arg(&setup.bert_dir)
        .args(["--compressors", &args.compressors.join(",")]);
    if let Some(b) = setup.batch_size {
        command.args(["--batch-size", &b.to_string()]);
    }
    if let Some(l) = setup.seq_len {
        command.args(["--seq-len", &l.to_string()]);
    }
    let output = command.output().map_err(|e| {
        Error::bad_value(
            "mpiexec",
            format!("{e}: `bench comm` launches its workers with MPICH's mpiexec (scripts/setup.sh installs it)"),
        )
    })?;
    if !output.status.success() {
        return Err(Error::bad_value(
            "mpiexec",
            format!(
                "the {workers}-rank benchmark failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ),
        ));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('['))
        .unwrap_or("");
    serde_json::from_str(line).map_err(|e| {
        Error::bad_value(
            "mpiexec",
            format!("the {workers}-rank benchmark printed no rows ({e}): {stdout}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_parses_by_its_name_and_an_unknown_one_names_them() {
        for (text, kind) in [
            ("identity", CompressorKind::Identity),
            ("fp16", CompressorKind::Fp16),
            ("bf16", CompressorKind::Bf16),
            ("dgc:256", CompressorKind::Dgc),
            ("powersgd:2:shape=rows", CompressorKind::Powersgd),
        ] {
            assert_eq!(parse_compressor(text).unwrap().kind(), kind, "{text}");
        }
        let error = parse_compressor("fp8").unwrap_err().to_string();
        assert!(
            error.contains("--compressors") && error.contains("fp16"),
            "{error}"
        );
        let error = parse_compressor("fp16:4").unwrap_err().to_string();
        assert!(error.contains("rate"), "{error}");
    }
}
