//! `dpcomp bench finetune`: the DP-SGD step against the non-private step of a pre-trained
//! transformer fine-tuned in one mode, on one fixed random batch: all-MiniLM-L6-v2 as the SNLI
//! classifier (its pre-trained weights, sentence pairs of `--seq-len` tokens) or a
//! GPT-2-small-shaped language model (124M parameters, random weights, sequences of `--seq-len`
//! tokens). Time and peak memory of both steps in alternating rounds of the same run
//! (`dp_against_nonprivate`), and the trainable-parameter count.

use super::{dp_against_nonprivate, print_dp, DpTiming, Prepared};
use dpcomp::config::{DeviceChoice, FineTuningKind, ModelSettings, TrainConfig};
use dpcomp::data::{Batch, Features};
use dpcomp::error::Result;
use dpcomp::hf::{Gpt2, Gpt2Config, Head};
use dpcomp::models::{BertClassifier, Model};
use std::path::PathBuf;
use tch::{Device, Kind, Tensor};

/// The model a fine-tuning benchmark runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum FinetuneModel {
    /// all-MiniLM-L6-v2 (`--bert-dir`) as the SNLI classifier: 6 layers, hidden 384, 22.7M
    /// parameters, pre-trained.
    Minilm,
    /// GPT-2 small's shape as a causal language model: 12 layers, hidden 768, vocabulary
    /// 50,257, 124M parameters, random weights (the step's cost does not depend on them).
    #[cfg_attr(feature = "cli", value(name = "gpt2-small"))]
    Gpt2Small,
}

/// `dpcomp bench finetune`'s settings.
#[derive(Debug)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct FinetuneBenchArgs {
    /// The transformer.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value = "minilm"))]
    pub model: FinetuneModel,
    /// What trains: lora, full, bitfit or last-layers (one layer).
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value = "lora"))]
    pub fine_tuning: FineTuningKind,
    /// LoRA's rank (the default targets: query and value; GPT-2's c_attn).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 8))]
    pub lora_rank: i64,
    /// Sequences in the batch.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 8))]
    pub batch_size: i64,
    /// Tokens in every sequence (no padding).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 128))]
    pub seq_len: i64,
    /// Timed steps of each kind, at least 1.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 6, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)))]
    pub steps: usize,
    /// Untimed steps of each kind first.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 1))]
    pub warmup: usize,
    /// Alternating rounds the timed steps are split into.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 2))]
    pub rounds: usize,
    /// Noise multiplier σ of the DP step (clipping radius 1).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0.8))]
    pub noise_multiplier: f64,
    /// How the DP step forms its clipped sums (tape, two-pass, oracle).
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value = "tape"))]
    pub grad_sample: dpcomp::config::GradSampleMode,
    /// Where the steps run.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value = "auto"))]
    pub device: DeviceChoice,
    /// The MiniLM folder for `--model minilm`.
    #[cfg_attr(feature = "cli", arg(long, default_value = "models/all-MiniLM-L6-v2"))]
    pub bert_dir: PathBuf,
    /// Print one JSON object instead of a line.
    #[cfg_attr(feature = "cli", arg(long))]
    pub json: bool,
}

/// Builds the model and its batch, times both steps and prints the result.
pub fn finetune_bench(args: FinetuneBenchArgs) -> Result<()> {
    let device = args.device.device()?;
    let settings = ModelSettings {
        fine_tuning: args.fine_tuning,
        lora_rank: args.lora_rank,
        ..ModelSettings::default()
    };
    let mode = settings.fine_tuning_mode()?;
    for (flag, value) in [
        ("--batch-size", args.batch_size),
        ("--seq-len", args.seq_len),
    ] {
        if value < 1 {
            return Err(dpcomp::Error::bad_value(
                flag,
                format!("{value}: expected at least 1"),
            ));
        }
    }
    tch::manual_seed(0);
    let (b, t) = (args.batch_size, args.seq_len);
    let (model, features): (Box<dyn Model>, Features) = match args.model {
        FinetuneModel::Minilm => {
            let dir = crate::tasks::resolve_bert_dir(&args.bert_dir)?;
            let model = BertClassifier::from_pretrained_with(&dir, device, 3, &mode)?;
            let vocab = model.config.vocab_size;
            let ids = Tensor::randint_low(1000, vocab, [b, t], (Kind::Int64, Device::Cpu));
            let token_types = Tensor::cat(
                &[
                    Tensor::zeros([b, t / 2], (Kind::Int64, Device::Cpu)),
                    Tensor::ones([b, t - t / 2], (Kind::Int64, Device::Cpu)),
                ],
                1,
            );
            let features = Features::TextPair {
                ids,
                token_types,
                attention_mask: Tensor::ones([b, t], (Kind::Int64, Device::Cpu)),
            };
            (Box::new(model), features)
        }
        FinetuneModel::Gpt2Small => {
            let config: Gpt2Config = serde_json::from_value(serde_json::json!({
                "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12,
                "n_head": 12
            }))
            .map_err(|e| dpcomp::Error::bad_value("GPT-2 small config", e.to_string()))?;
            let lora = mode
                .lora()
                .map(|l| dpcomp::hf::lora_for(dpcomp::hf::Architecture::Gpt2, l));
            let model = Gpt2::new(config, device, Head::CausalLm, lora.as_ref())?;
            mode.apply(&model)?;
            let ids = Tensor::randint(50257, [b, t], (Kind::Int64, Device::Cpu));
            let features = Features::Tokens {
                ids,
                lengths: Tensor::full([b], t, (Kind::Int64, Device::Cpu)),
            };
            (Box::new(model), features)
        }
    };
    let mut defaults = TrainConfig::new("finetune");
    defaults.optimizer.lr = 1e-3;
    defaults.privacy.max_grad_norm = 1.0;
    let prepared = Prepared {
        device,
        defaults,
        batch_size: b,
        seq_len: t,
        model,
        batch: Batch {
            features,
            labels: Tensor::randint(3, [b], (Kind::Int64, Device::Cpu)),
        },
    };
    let timing = DpTiming {
        warmup: args.warmup,
        steps: args.steps,
        rounds: args.rounds,
        noise_multiplier: args.noise_multiplier,
        secure_noise: false,
        grad_sample: args.grad_sample,
    };
    let measured = dp_against_nonprivate(&prepared, &timing)?;
    let model_name = match args.model {
        FinetuneModel::Minilm => "minilm",
        FinetuneModel::Gpt2Small => "gpt2-small",
    };
    let label = format!(
        "{model_name} {} batch {b} x {t} tokens, {} trainable of {} parameters",
        mode.label(),
        prepared.model.trainable_parameter_count(),
        prepared.model.parameter_count()
    );
    let fields = serde_json::json!({"model": model_name, "fine_tuning": mode.label()});
    print_dp(&prepared, &timing, &measured, &label, fields, args.json);
    Ok(())
}
