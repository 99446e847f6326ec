//! `dpcomp export`: a finished run's fine-tuned model as a Hugging Face folder (`config.json`,
//! `model.safetensors`, LoRA adapters merged, and the BERT folder's tokenizer files), or its
//! LoRA adapter as a PEFT folder (`dpcomp::hf::save_pretrained`, `dpcomp::hf::save_adapter`).
//! The run's `config.toml` says which pre-trained folder and which fine-tuning to rebuild the
//! model with; its checkpoint holds the weights.

use anyhow::{bail, Context, Result};
use dpcomp::hf::FineTuning;
use dpcomp::models::BertClassifier;
use dpcomp::train::checkpoint;
use dpcomp_lab::{tasks, Task};
use std::path::{Path, PathBuf};
use tch::Device;

/// The tokenizer files of a BERT folder that a merged export carries along (those present), so
/// that `AutoTokenizer.from_pretrained` reads the exported folder as it reads the original.
pub const TOKENIZER_FILES: [&str; 4] = [
    "tokenizer.json",
    "vocab.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
];

#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// A finished run folder (config.toml, checkpoint/ and summary.json) of a task whose model
    /// is a Hugging Face model: snli (BERT or RoBERTa, any --fine-tuning).
    #[arg(long, value_name = "RUN_DIR")]
    pub run: PathBuf,
    /// The folder to write, new or empty (nothing is replaced). Without --adapter: a Hugging
    /// Face folder (config.json, model.safetensors with LoRA adapters merged into their
    /// weights, and the tokenizer files of the run's BERT folder) that `from_pretrained` reads.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Write the run's LoRA adapter instead, as a PEFT folder (adapter_config.json,
    /// adapter_model.safetensors, the classifier included) whose base model is the run's BERT
    /// folder: `PeftModel.from_pretrained(base, DIR)`. Only for a run fine-tuned with LoRA.
    #[arg(long)]
    pub adapter: bool,
}

pub fn run(args: ExportArgs) -> Result<()> {
    let run_dir = &args.run;
    let config_path = run_dir.join("config.toml");
    if !config_path.is_file() {
        bail!(
            "--run {}: no config.toml there; expected a run folder written by `dpcomp train`",
            run_dir.display()
        );
    }
    let config = tasks::config_from_file(&config_path)?;
    if Task::from_name(&config.task) != Some(Task::Snli) {
        bail!(
            "--run {}: its task is {} ({}), whose model is not a Hugging Face model; only \
             snli runs (a BERT or RoBERTa folder fine-tuned) can be exported",
            run_dir.display(),
            config.task,
            config_path.display()
        );
    }
    let fine_tuning = config
        .model
        .fine_tuning_mode()
        .with_context(|| format!("{}", config_path.display()))?;
    if args.adapter && !matches!(fine_tuning, FineTuning::Lora(_)) {
        bail!(
            "--adapter: the run in {} was fine-tuned with {} ({}), not LoRA, so it has no \
             adapter; export it without --adapter (a Hugging Face folder of the whole model)",
            run_dir.display(),
            fine_tuning.label(),
            config_path.display()
        );
    }
    let ckpt = finished_checkpoint(run_dir)?;
    check_out_folder(&args.out)?;
    let bert_dir = tasks::resolve_bert_dir(&config.model.bert_dir).with_context(|| {
        format!(
            "the BERT folder the run was fine-tuned from ({}: model.bert_dir)",
            config_path.display()
        )
    })?;

    let classes = dpcomp::data::snli::CLASSES.len() as i64;
    let model =
        BertClassifier::from_pretrained_with(&bert_dir, Device::Cpu, classes, &fine_tuning)?;
    let weights = ckpt.join("model.safetensors");
    checkpoint::load_weights(dpcomp::models::Model::var_store(&model), &weights)?;

    if args.adapter {
        let base = bert_dir.canonicalize().unwrap_or_else(|_| bert_dir.clone());
        dpcomp::hf::save_adapter(&model, &args.out, Some(&base.to_string_lossy()))?;
        println!(
            "{}: the LoRA adapter of {} (PEFT; base model {})",
            args.out.display(),
            run_dir.display(),
            base.display()
        );
    } else {
        dpcomp::hf::save_pretrained(&model, &args.out)?;
        let copied = copy_tokenizer(&bert_dir, &args.out)?;
        println!(
            "{}: the model of {} as a Hugging Face folder ({}{})",
            args.out.display(),
            run_dir.display(),
            match fine_tuning {
                FineTuning::Lora(_) => "LoRA adapters merged",
                _ => "fine-tuned weights",
            },
            if copied.is_empty() {
                format!("; {} has no tokenizer files", bert_dir.display())
            } else {
                format!("; tokenizer: {}", copied.join(", "))
            }
        );
    }
    Ok(())
}

/// The run's checkpoint folder, verified against its manifest, when the run finished
/// (`summary.json`): the weights of an interrupted run are not its final ones.
fn finished_checkpoint(run_dir: &Path) -> Result<PathBuf> {
    let Some(ckpt) = checkpoint::find(run_dir) else {
        bail!(
            "--run {}: no checkpoint (checkpoint/state.json); the run has not finished an epoch, \
             so there are no weights to export",
            run_dir.display()
        );
    };
    if !run_dir.join("summary.json").is_file() {
        bail!(
            "--run {}: no summary.json, so the run has not finished and its checkpoint holds no \
             final weights; finish it first (`dpcomp train --resume {}`)",
            run_dir.display(),
            run_dir.display()
        );
    }
    checkpoint::verify(&ckpt)?;
    Ok(ckpt)
}

/// `--out` must be a new or an empty folder, checked before the model is built.
fn check_out_folder(out: &Path) -> Result<()> {
    if !out.exists() {
        return Ok(());
    }
    if !out.is_dir() {
        bail!(
            "--out {}: is a file; expected a new or empty folder",
            out.display()
        );
    }
    let empty = std::fs::read_dir(out)
        .with_context(|| format!("--out {}", out.display()))?
        .next()
        .is_none();
    if !empty {
        bail!(
            "--out {}: not empty; expected a new or empty folder (nothing is replaced)",
            out.display()
        );
    }
    Ok(())
}

/// Copies the tokenizer files `bert_dir` has (`TOKENIZER_FILES`) into `out`; their names.
fn copy_tokenizer(bert_dir: &Path, out: &Path) -> Result<Vec<&'static str>> {
    let mut copied = Vec::new();
    for name in TOKENIZER_FILES {
        let source = bert_dir.join(name);
        if source.is_file() {
            std::fs::copy(&source, out.join(name))
                .with_context(|| format!("copying {} to {}", source.display(), out.display()))?;
            copied.push(name);
        }
    }
    Ok(copied)
}
