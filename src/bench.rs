//! `dpcomp bench train`: mean time of one non-private training step (forward, loss, backward,
//! global-norm clip, SGD) of a task's model on one fixed batch. `--batch-out FILE` writes that
//! batch (safetensors) so that `benches/train_vs_pytorch.py` times eager PyTorch on the very same
//! tensors in the same run.

use crate::config::{DeviceChoice, Task, TrainConfig};
use crate::data::{Batch, Features};
use crate::models::{BertClassifier, BertConfig, Model};
use crate::tasks;
use crate::train::sgd::Sgd;
use crate::train::train_step;
use anyhow::Result;
use std::path::PathBuf;
use std::time::Instant;
use tch::{Device, Kind, Tensor};

#[derive(Debug, clap::Args)]
pub struct TrainBenchArgs {
    #[arg(long, value_enum)]
    pub task: Task,
    /// Default: the paper's batch size for the task.
    #[arg(long)]
    pub batch_size: Option<i64>,
    /// Timed steps.
    #[arg(long, default_value_t = 20)]
    pub steps: usize,
    /// Untimed steps first.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Sequence length of the synthetic batch (Surnames 12, SNLI 64 by default).
    #[arg(long)]
    pub seq_len: Option<i64>,
    #[arg(long, value_enum, default_value = "auto")]
    pub device: DeviceChoice,
    /// BERT folder for --task snli (architecture from its config.json; weights do not matter).
    #[arg(long, default_value = "models/all-MiniLM-L6-v2")]
    pub bert_dir: PathBuf,
    /// Write the batch as safetensors (features and `labels`).
    #[arg(long)]
    pub batch_out: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
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

fn batch_to_device(batch: &Batch, device: Device) -> Batch {
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

pub fn train_bench(args: TrainBenchArgs) -> Result<()> {
    let device = args.device.device()?;
    let defaults = TrainConfig::paper_defaults(args.task);
    let batch_size = args.batch_size.unwrap_or(defaults.batch_size as i64);
    let classes = match args.task {
        Task::Surnames => 18,
        Task::Cifar10 => 10,
        Task::Cifar100 => 100,
        Task::Snli => 3,
    };
    tch::manual_seed(0);
    let (model, vocab): (Box<dyn Model>, i64) = match args.task {
        Task::Snli => {
            let config = BertConfig::from_file(&args.bert_dir.join("config.json"))?;
            let vocab = config.vocab_size;
            (
                Box::new(BertClassifier::new(device, config, classes)),
                vocab,
            )
        }
        task => (
            tasks::build_model(task, classes, device, &args.bert_dir)?,
            256,
        ),
    };
    let seq_len = args
        .seq_len
        .unwrap_or(if args.task == Task::Snli { 64 } else { 12 });
    let batch = synthetic_batch(args.task, batch_size, seq_len, classes, vocab);
    if let Some(path) = &args.batch_out {
        save_batch(&batch, path)?;
    }
    let batch = batch_to_device(&batch, device);
    let params = model.trainable_variables();
    let mut sgd = Sgd::new(defaults.lr, 0.0);
    let sync = || {
        if let Device::Cuda(i) = device {
            tch::Cuda::synchronize(i as i64);
        }
    };
    for _ in 0..args.warmup {
        let _ = train_step(
            model.as_ref(),
            &params,
            &mut sgd,
            &batch,
            defaults.max_grad_norm,
        );
    }
    sync();
    let mut times = Vec::with_capacity(args.steps);
    for _ in 0..args.steps {
        let start = Instant::now();
        let (loss, _) = train_step(
            model.as_ref(),
            &params,
            &mut sgd,
            &batch,
            defaults.max_grad_norm,
        );
        let _ = loss.double_value(&[]);
        sync();
        times.push(start.elapsed().as_secs_f64());
    }
    let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN);
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "task": args.task, "batch_size": batch_size, "seq_len": seq_len, "steps": args.steps,
                "device": format!("{device:?}"), "trainable_parameters": model.trainable_parameter_count(),
                "mean_step_seconds": mean, "median_step_seconds": median, "threads": tch::get_num_threads(),
            })
        );
    } else {
        println!(
            "{} batch {}: mean step {:.2} ms, median {:.2} ms over {} steps on {:?}",
            args.task,
            batch_size,
            mean * 1e3,
            median * 1e3,
            args.steps,
            device
        );
    }
    Ok(())
}
