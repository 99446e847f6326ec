//! Benchmarks on one fixed, seeded batch with the task's shapes.
//!
//! - `dpcomp bench train`: mean time of one non-private training step (forward, loss, backward,
//!   global-norm clip, SGD) and the host reads it made (`host_reads_per_step`, `dpcomp::host`'s
//!   count: 0 is a step that never waits for the device). `--batch-out FILE` writes that batch (safetensors) so that
//!   `benches/train_vs_pytorch.py` times eager PyTorch on the very same tensors in the same run.
//! - `dpcomp bench dp`: the non-private step and the DP-SGD step (per-sample clipping and noise)
//!   in alternating rounds of the same run, their ratio, each one's peak memory and host reads
//!   a step (`nonprivate_host_reads_per_step`, `dp_host_reads_per_step`).
//! - `dpcomp bench finetune` (`finetune.rs`): the same for a pre-trained transformer fine-tuned
//!   in one mode (MiniLM, or a GPT-2-small-shaped language model).
//! - `dpcomp bench compress` (`compress.rs`): a compressor's overhead against the backward pass.
//! - `dpcomp bench comm` (`comm.rs`): a data-parallel step with each compressor on W MPI ranks,
//!   split into compute, encode, communication and decode, and modelled over 1-100 Gb/s links.
//! - `dpcomp bench fl-reconstruction` (`fl.rs`): FL-CS's OWL-QN reconstruction against a round of
//!   client training, and first versus random DCT rows for recovery.

pub mod comm;
pub mod compress;
pub mod device_check;
pub mod finetune;
pub mod fl;

use crate::tasks;
use crate::tasks::{paper_defaults, Task};
use dpcomp::config::{DeviceChoice, TrainConfig};
use dpcomp::data::{Batch, Features};
use dpcomp::error::{Error, Result};
use dpcomp::models::{BertClassifier, BertConfig, Model};
use dpcomp::train::sgd::Sgd;
use dpcomp::train::train_step;
use dpcomp::train::update::Updater;
use std::path::PathBuf;
use std::time::Instant;
use tch::{Device, Kind, Tensor};

/// What every benchmark takes: the task, its batch, the device, how many steps.
#[derive(Debug)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct BenchSetup {
    /// The task whose model and batch shapes are benchmarked.
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub task: Task,
    /// Examples in the benchmarked batch (default: the paper's batch size for the task).
    #[cfg_attr(feature = "cli", arg(long))]
    pub batch_size: Option<i64>,
    /// Timed steps (of each kind), at least 1.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 20, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)))]
    pub steps: usize,
    /// Untimed steps first.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 3))]
    pub warmup: usize,
    /// Sequence length of the synthetic batch (Surnames 12, SNLI 64 by default).
    #[cfg_attr(feature = "cli", arg(long))]
    pub seq_len: Option<i64>,
    /// Where the model and the steps run.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value = "auto"))]
    pub device: DeviceChoice,
    /// BERT folder for --task snli (architecture from its config.json; weights do not matter).
    #[cfg_attr(feature = "cli", arg(long, default_value = "models/all-MiniLM-L6-v2"))]
    pub bert_dir: PathBuf,
    /// Print the results as one JSON object instead of text.
    #[cfg_attr(feature = "cli", arg(long))]
    pub json: bool,
}

/// `dpcomp bench train`: the common settings and where to write the batch.
#[derive(Debug)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct TrainBenchArgs {
    /// Task, batch, device and step counts.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub setup: BenchSetup,
    /// Write the batch as safetensors (features and `labels`).
    #[cfg_attr(feature = "cli", arg(long))]
    pub batch_out: Option<PathBuf>,
}

/// A deterministic synthetic batch with the task's shapes (seeded, so every run times the same
/// tensors): normalised-image-like N(0,1) pixels, random byte names of one length, random
/// WordPiece ids.
pub fn synthetic_batch(
    task: Task,
    batch_size: i64,
    seq_len: i64,
    classes: i64,
    vocab: i64,
) -> Batch {
    tch::manual_seed(1234);
    let opts = (Kind::Int64, Device::Cpu);
    let features = match task {
        Task::Surnames => Features::Tokens {
            ids: Tensor::randint_low(97, 123, [batch_size, seq_len], opts),
            lengths: Tensor::full([batch_size], seq_len, opts),
        },
        Task::Cifar10 | Task::Cifar100 => Features::Images(Tensor::randn(
            [batch_size, 3, 32, 32],
            (Kind::Float, Device::Cpu),
        )),
        Task::Snli => Features::TextPair {
            ids: Tensor::randint_low(1000, vocab, [batch_size, seq_len], opts),
            token_types: Tensor::cat(
                &[
                    Tensor::zeros([batch_size, seq_len / 2], opts),
                    Tensor::ones([batch_size, seq_len - seq_len / 2], opts),
                ],
                1,
            ),
            attention_mask: Tensor::ones([batch_size, seq_len], opts),
        },
    };
    Batch {
        features,
        labels: Tensor::randint(classes, [batch_size], opts),
    }
}

/// `dpcomp bench dp`: the common settings and the DP step's noise and per-sample gradients.
#[derive(Debug)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct DpBenchArgs {
    /// Task, batch, device and step counts.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub setup: BenchSetup,
    /// Alternating rounds the timed steps are split into.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 4))]
    pub rounds: usize,
    /// Noise multiplier σ of the DP step (Gaussian noise of standard deviation σ C on the
    /// clipped sum, C the paper's clipping radius for the task).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0.8))]
    pub noise_multiplier: f64,
    /// Draw the DP step's noise from the secure source (an OS-seeded ChaCha12 stream on the CPU,
    /// copied to the device) instead of LibTorch's seeded generator, to measure its cost.
    #[cfg_attr(feature = "cli", arg(long))]
    pub secure_noise: bool,
    /// How the DP step forms its clipped sums: tape (one backward pass, fastest) or two-pass
    /// (norms inside the first of two, least memory); oracle is per-example autograd.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value = "tape"))]
    pub grad_sample: dpcomp::config::GradSampleMode,
}

pub(crate) fn batch_to_device(batch: &Batch, device: Device) -> Batch {
    Batch {
        features: batch.features.to_device(device),
        labels: batch.labels.to_device(device),
    }
}

fn save_batch(batch: &Batch, path: &std::path::Path) -> Result<()> {
    let mut named: Vec<(&str, Tensor)> = match &batch.features {
        Features::Tokens { ids, lengths } => vec![
            ("ids", ids.shallow_clone()),
            ("lengths", lengths.shallow_clone()),
        ],
        Features::Images(x) => vec![("images", x.shallow_clone())],
        Features::Rows(x) => vec![("rows", x.shallow_clone())],
        Features::TextPair {
            ids,
            token_types,
            attention_mask,
        } => vec![
            ("ids", ids.shallow_clone()),
            ("token_types", token_types.shallow_clone()),
            ("attention_mask", attention_mask.shallow_clone()),
        ],
    };
    named.push(("labels", batch.labels.shallow_clone()));
    Tensor::write_safetensors(&named, path)?;
    Ok(())
}

fn classes(task: Task) -> i64 {
    match task {
        Task::Surnames => 18,
        Task::Cifar10 => 10,
        Task::Cifar100 => 100,
        Task::Snli => 3,
    }
}

/// The task's model (BERT: architecture from `config.json`, fresh weights) and its vocabulary.
fn bench_model(
    task: Task,
    device: Device,
    bert_dir: &std::path::Path,
) -> Result<(Box<dyn Model>, i64)> {
    tch::manual_seed(0);
    Ok(match task {
        Task::Snli => {
            let config = BertConfig::from_file(&bert_dir.join("config.json"))?;
            let vocab = config.vocab_size;
            (
                Box::new(BertClassifier::new(device, config, classes(task))?),
                vocab,
            )
        }
        task => (
            tasks::build_model(
                task,
                classes(task),
                device,
                bert_dir,
                &dpcomp::hf::FineTuning::default(),
            )?,
            256,
        ),
    })
}

fn default_seq_len(task: Task) -> i64 {
    if task == Task::Snli {
        64
    } else {
        12
    }
}

/// Peak resident memory of this process in bytes since the last reset (Linux: VmHWM, reset by
/// writing 5 to /proc/self/clear_refs); `None` where that is unavailable.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Runs `step` once between resets of both high-water marks: (peak RSS, peak device bytes).
fn step_peaks(
    device: Device,
    step: impl FnOnce() -> Result<()>,
) -> Result<(Option<u64>, Option<u64>)> {
    synchronize(device);
    reset_peak_rss();
    dpcomp::cuda_memory::reset_peak(device);
    step()?;
    synchronize(device);
    Ok((peak_rss(), dpcomp::cuda_memory::peak_allocated(device)))
}

/// Waits for queued CUDA work, so that wall-clock timings cover it (no-op on the CPU).
pub(crate) fn synchronize(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}

/// A benchmark's model, batch and settings.
pub(crate) struct Prepared {
    device: Device,
    defaults: TrainConfig,
    batch_size: i64,
    seq_len: i64,
    model: Box<dyn Model>,
    batch: Batch,
}

impl BenchSetup {
    pub(crate) fn prepare(&self) -> Result<Prepared> {
        let device = self.device.device()?;
        let defaults = paper_defaults(self.task);
        let batch_size = self
            .batch_size
            .unwrap_or(defaults.optimizer.batch_size as i64);
        let (model, vocab) = bench_model(self.task, device, &self.bert_dir)?;
        if batch_size < 1 {
            return Err(Error::bad_value(
                "batch_size",
                format!("{batch_size}: expected at least 1 example per benchmarked step"),
            ));
        }
        let seq_len = self.seq_len.unwrap_or(default_seq_len(self.task));
        if seq_len < 1 {
            return Err(Error::bad_value(
                "seq_len",
                format!("{seq_len}: expected at least 1 token"),
            ));
        }
        let batch = synthetic_batch(self.task, batch_size, seq_len, classes(self.task), vocab);
        Ok(Prepared {
            device,
            defaults,
            batch_size,
            seq_len,
            model,
            batch,
        })
    }
}

/// Times the non-private step and the DP-SGD step in alternating rounds on the same batch,
/// after measuring each one's peak memory on a step of its own, and prints their mean step
/// times, ratio, host reads a step and peaks (a line, or JSON with `--json`).
pub fn dp_bench(args: DpBenchArgs) -> Result<()> {
    let setup = &args.setup;
    let prepared = setup.prepare()?;
    let timing = DpTiming {
        warmup: setup.warmup,
        steps: setup.steps,
        rounds: args.rounds,
        noise_multiplier: args.noise_multiplier,
        secure_noise: args.secure_noise,
        grad_sample: args.grad_sample,
    };
    let measured = dp_against_nonprivate(&prepared, &timing)?;
    let label = format!("{} batch {}", setup.task, prepared.batch_size);
    let fields = serde_json::json!({"task": setup.task});
    print_dp(&prepared, &timing, &measured, &label, fields, setup.json);
    Ok(())
}

/// How `dp_against_nonprivate` times the two steps.
pub(crate) struct DpTiming {
    pub warmup: usize,
    pub steps: usize,
    pub rounds: usize,
    pub noise_multiplier: f64,
    pub secure_noise: bool,
    pub grad_sample: dpcomp::config::GradSampleMode,
}

/// What `dp_against_nonprivate` measured: mean step seconds, host reads a step and peak memory of
/// each step kind.
pub(crate) struct DpMeasured {
    pub steps: usize,
    pub plain: f64,
    pub dp: f64,
    pub plain_reads: f64,
    pub dp_reads: f64,
    pub plain_peak: Option<u64>,
    pub dp_peak: Option<u64>,
    pub plain_device_peak: Option<u64>,
    pub dp_device_peak: Option<u64>,
}

/// The non-private step and the DP-SGD step of `prepared`'s model on its batch, in alternating
/// rounds, after measuring each one's peak memory on a step of its own.
pub(crate) fn dp_against_nonprivate(prepared: &Prepared, timing: &DpTiming) -> Result<DpMeasured> {
    let Prepared {
        device,
        defaults,
        batch_size,
        model,
        batch,
        ..
    } = prepared;
    let (device, batch_size) = (*device, *batch_size);
    // Held on the device, as the trainer holds its datasets there.
    let data = dpcomp::data::Dataset::new(
        batch.features.to_device(Device::Cpu),
        batch.labels.shallow_clone(),
        None,
    )
    .to_device(device);
    let index = Tensor::arange(batch_size, (Kind::Int64, Device::Cpu));
    let plain_batch = data.batch(&index, device, true);
    let params = model.trainable_variables();
    let mut sgd = Updater::plain(Sgd::new(defaults.optimizer.lr, 0.0));
    let settings = dpcomp::train::private::DpSettings {
        expected_batch: batch_size as f64,
        physical_batch: None,
        mode: timing.grad_sample,
    };
    // Each step adds the host reads it made itself (none on the trainer's path) to
    // its count, then the benchmark reads its loss, so that steps do not queue up unboundedly.
    let (plain_reads, dp_reads) = (std::cell::Cell::new(0u64), std::cell::Cell::new(0u64));
    let plain_step = |sgd: &mut Updater| -> Result<()> {
        let reads = dpcomp::host::HostReads::start();
        let (loss, _) = train_step(
            model.as_ref(),
            &params,
            sgd,
            &plain_batch,
            defaults.privacy.max_grad_norm,
        )?;
        plain_reads.set(plain_reads.get() + reads.since());
        let _ = dpcomp::host::f64_scalar(&loss);
        Ok(())
    };
    let noise = if timing.secure_noise {
        dpcomp::privacy::noise::NoiseSource::secure()
    } else {
        dpcomp::privacy::noise::NoiseSource::Seeded
    };
    // A step's cost does not depend on q; the engine counts the benchmark's steps at q = 1.
    let engine = dpcomp::privacy::engine::PrivacyEngine::builder()
        .noise_multiplier(timing.noise_multiplier)
        .sample_rate(1.0)
        .expected_batch_size(batch_size as f64)
        .delta(defaults.privacy.delta)
        .max_grad_norm(defaults.privacy.max_grad_norm)
        .noise_source(noise)
        .build(&params)?;
    let engine = std::cell::RefCell::new(engine);
    let dp_step = |sgd: &mut Updater| -> Result<()> {
        let reads = dpcomp::host::HostReads::start();
        let totals = dpcomp::train::private::dp_step(
            model.as_ref(),
            &params,
            sgd,
            &data,
            &index,
            device,
            &settings,
            &mut engine.borrow_mut(),
            None,
        )?;
        dp_reads.set(dp_reads.get() + reads.since());
        let _ = dpcomp::host::f64_scalar(&totals.loss_sum);
        Ok(())
    };
    // Peak memory of each kind of step, measured separately from a reset high-water mark: the
    // process's resident memory, and on CUDA the caching allocator's peak allocation (what
    // torch.cuda.max_memory_allocated reports, so the Python peers compare like with like).
    let (plain_peak, plain_device_peak) = step_peaks(device, || plain_step(&mut sgd))?;
    let (dp_peak, dp_device_peak) = step_peaks(device, || dp_step(&mut sgd))?;
    for _ in 0..timing.warmup {
        plain_step(&mut sgd)?;
        dp_step(&mut sgd)?;
    }
    synchronize(device);
    plain_reads.set(0);
    dp_reads.set(0);
    let rounds = timing.rounds.max(1);
    let per_round = (timing.steps / rounds).max(1);
    let (mut plain_total, mut dp_total) = (0.0, 0.0);
    for _ in 0..rounds {
        let start = Instant::now();
        for _ in 0..per_round {
            plain_step(&mut sgd)?;
        }
        synchronize(device);
        plain_total += start.elapsed().as_secs_f64();
        let start = Instant::now();
        for _ in 0..per_round {
            dp_step(&mut sgd)?;
        }
        synchronize(device);
        dp_total += start.elapsed().as_secs_f64();
    }
    let steps = rounds * per_round;
    Ok(DpMeasured {
        steps,
        plain: plain_total / steps as f64,
        dp: dp_total / steps as f64,
        plain_reads: plain_reads.get() as f64 / steps as f64,
        dp_reads: dp_reads.get() as f64 / steps as f64,
        plain_peak,
        dp_peak,
        plain_device_peak,
        dp_device_peak,
    })
}

/// Prints what `dp_against_nonprivate` measured: one JSON object (with `fields` first) or a
/// line starting with `label`.
pub(crate) fn print_dp(
    prepared: &Prepared,
    timing: &DpTiming,
    m: &DpMeasured,
    label: &str,
    fields: serde_json::Value,
    json: bool,
) {
    let ratio = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) if a > 0 => Some(b as f64 / a as f64),
        _ => None,
    };
    if json {
        let mut row = serde_json::json!({
            "batch_size": prepared.batch_size, "seq_len": prepared.seq_len, "steps": m.steps,
            "device": format!("{:?}", prepared.device), "noise_multiplier": timing.noise_multiplier,
            "max_grad_norm": prepared.defaults.privacy.max_grad_norm, "grad_sample": timing.grad_sample,
            "trainable_parameters": prepared.model.trainable_parameter_count(),
            "parameters": prepared.model.parameter_count(),
            "nonprivate_mean_step_seconds": m.plain, "dp_mean_step_seconds": m.dp,
            "ratio_dp_over_nonprivate": m.dp / m.plain,
            "nonprivate_host_reads_per_step": m.plain_reads, "dp_host_reads_per_step": m.dp_reads,
            "host_reads_note": "tensor values a step read to the host or data-dependent ops it ran (dpcomp::host's count), over the timed steps; the benchmark's own read of each step's loss is not included",
            "nonprivate_peak_rss_bytes": m.plain_peak, "dp_peak_rss_bytes": m.dp_peak,
            "ratio_dp_over_nonprivate_peak_rss": ratio(m.plain_peak, m.dp_peak),
            "nonprivate_peak_device_bytes": m.plain_device_peak, "dp_peak_device_bytes": m.dp_device_peak,
            "ratio_dp_over_nonprivate_peak_device": ratio(m.plain_device_peak, m.dp_device_peak),
            "peak_memory_note": "rss: process peak resident memory (VmHWM) during one step of each kind; device: LibTorch's CUDA caching allocator's peak allocated bytes during that step (null on the CPU)",
        });
        if let (Some(row), Some(extra)) = (row.as_object_mut(), fields.as_object()) {
            for (k, v) in extra {
                row.insert(k.clone(), v.clone());
            }
        }
        println!("{row}");
    } else {
        let mib = |b: Option<u64>| {
            b.map_or("n/a".to_string(), |b| {
                format!("{:.0} MiB", b as f64 / 1048576.0)
            })
        };
        println!(
            "{label}: non-private {:.2} ms, DP {:.2} ms, ratio {:.3}; host reads a step {} / {}; peak RSS {} / {} (ratio {}); peak device {} / {}",
            m.plain * 1e3,
            m.dp * 1e3,
            m.dp / m.plain,
            m.plain_reads,
            m.dp_reads,
            mib(m.plain_peak),
            mib(m.dp_peak),
            ratio(m.plain_peak, m.dp_peak).map_or("n/a".into(), |r| format!("{r:.3}")),
            mib(m.plain_device_peak),
            mib(m.dp_device_peak)
        );
    }
}

/// Times the non-private training step on the task's synthetic batch (after `warmup` untimed
/// steps) and prints its mean and median step time and host reads a step (a line, or with
/// `--json` a JSON object that adds the parameter count and peak device memory); writes the
/// batch first with `--batch-out`.
pub fn train_bench(args: TrainBenchArgs) -> Result<()> {
    let setup = &args.setup;
    let Prepared {
        device,
        defaults,
        batch_size,
        seq_len,
        model,
        batch,
    } = setup.prepare()?;
    if let Some(path) = &args.batch_out {
        save_batch(&batch, path)?;
    }
    let batch = batch_to_device(&batch, device);
    let params = model.trainable_variables();
    let mut sgd = Updater::plain(Sgd::new(defaults.optimizer.lr, 0.0));
    let (_, device_peak) = step_peaks(device, || {
        train_step(
            model.as_ref(),
            &params,
            &mut sgd,
            &batch,
            defaults.privacy.max_grad_norm,
        )
        .map(|_| ())
    })?;
    for _ in 0..setup.warmup {
        let _ = train_step(
            model.as_ref(),
            &params,
            &mut sgd,
            &batch,
            defaults.privacy.max_grad_norm,
        );
    }
    synchronize(device);
    let mut times = Vec::with_capacity(setup.steps);
    // The host reads the steps made themselves; the benchmark's read of each loss is its own.
    let mut reads = 0;
    for _ in 0..setup.steps {
        let start = Instant::now();
        let counted = dpcomp::host::HostReads::start();
        let (loss, _) = train_step(
            model.as_ref(),
            &params,
            &mut sgd,
            &batch,
            defaults.privacy.max_grad_norm,
        )?;
        reads += counted.since();
        let _ = dpcomp::host::f64_scalar(&loss);
        synchronize(device);
        times.push(start.elapsed().as_secs_f64());
    }
    let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
    let median = median(times.clone());
    let reads_per_step = reads as f64 / setup.steps.max(1) as f64;
    if setup.json {
        println!(
            "{}",
            serde_json::json!({
                "task": setup.task, "batch_size": batch_size, "seq_len": seq_len, "steps": setup.steps,
                "device": format!("{device:?}"), "trainable_parameters": model.trainable_parameter_count(),
                "mean_step_seconds": mean, "median_step_seconds": median, "threads": tch::get_num_threads(),
                "peak_device_bytes": device_peak, "host_reads_per_step": reads_per_step,
            })
        );
    } else {
        println!(
            "{} batch {}: mean step {:.2} ms, median {:.2} ms over {} steps on {:?}, {} host reads a step",
            setup.task,
            batch_size,
            mean * 1e3,
            median * 1e3,
            setup.steps,
            device,
            reads_per_step
        );
    }
    Ok(())
}

/// The median of timings (the upper one of an even count); NaN when there are none.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}
