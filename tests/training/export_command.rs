//! `dpcomp export`: a private fine-tuning of the tiny BERT fixture (`common::hf_fixtures`),
//! trained by the `Trainer` into a run folder as `dpcomp train --task snli` writes it, exported
//! by the binary as a Hugging Face folder (LoRA merged, tokenizer files copied) and as a PEFT
//! adapter, both of which `transformers` and `peft` load with the logits dpcomp computes from
//! the run's checkpoint. Every refusal (no finished checkpoint, a task without a Hugging Face
//! model, `--adapter` without LoRA, an output folder in use) exits non-zero naming the flag, and
//! writes nothing.

use crate::common;
use dpcomp::config::{FineTuningKind, TrainConfig};
use dpcomp::data::{Dataset, Features, TaskData};
use dpcomp::models::{BertClassifier, Model};
use dpcomp::nn::Ctx;
use dpcomp::train::{checkpoint, Trainer};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tch::{Device, Kind, Tensor};

/// The fixture's vocabulary has 100 rows; the ids 0 to 4 are its special tokens.
const VOCAB: i64 = 100;

fn dpcomp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dpcomp"))
        .args(args)
        .output()
        .expect("dpcomp runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn text(path: &Path) -> String {
    path.display().to_string()
}

/// The tiny BERT fixture with a WordPiece vocabulary of its 100 rows and a tokenizer config, as
/// a BERT folder of the Hub has them.
fn bert_folder(dir: &Path) -> PathBuf {
    let fixture = common::hf_fixtures().join("bert");
    let bert = dir.join("bert");
    std::fs::create_dir_all(&bert).unwrap();
    for name in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture.join(name), bert.join(name)).unwrap();
    }
    let mut vocab: Vec<String> = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        .iter()
        .map(|t| t.to_string())
        .collect();
    vocab.extend((vocab.len() as i64..VOCAB).map(|i| format!("word{i}")));
    std::fs::write(bert.join("vocab.txt"), vocab.join("\n") + "\n").unwrap();
    std::fs::write(
        bert.join("tokenizer_config.json"),
        r#"{"do_lower_case": true, "tokenizer_class": "BertTokenizer"}"#,
    )
    .unwrap();
    bert
}

/// `n` sentence pairs `[CLS] a [SEP] b [SEP]` of random words, right-padded to 10 tokens (every
/// other example 3 tokens short).
fn pairs(n: i64, seed: i64) -> Features {
    tch::manual_seed(seed);
    let width = 10;
    let ids = Tensor::randint_low(5, VOCAB, [n, width], (Kind::Int64, Device::Cpu));
    let positions = Tensor::arange(width, (Kind::Int64, Device::Cpu)).unsqueeze(0);
    let lengths = Tensor::from_slice(
        &(0..n)
            .map(|i| if i % 2 == 0 { width } else { width - 3 })
            .collect::<Vec<_>>(),
    )
    .unsqueeze(1);
    let attention_mask = positions.lt_tensor(&lengths).to_kind(Kind::Int64);
    let ids = ids * &attention_mask;
    let _ = ids.narrow(1, 0, 1).fill_(2);
    let _ = ids.narrow(1, 4, 1).fill_(3);
    let last = (&lengths - 1).expand([n, 1], false);
    let ids = ids.scatter_value(1, &last, 3);
    let token_types = positions.ge(5).to_kind(Kind::Int64) * &attention_mask;
    Features::TextPair {
        ids,
        token_types,
        attention_mask,
    }
}

fn split(n: i64, seed: i64) -> Dataset {
    let labels = Tensor::randint(3, [n], (Kind::Int64, Device::Cpu));
    Dataset::new(pairs(n, seed), labels, None)
}

/// Trains one private epoch of the BERT folder with `fine_tuning` into `run`, as `dpcomp train
/// --task snli --bert-dir BERT` would (its config.toml, checkpoint and summary.json).
fn train(run: &Path, bert: &Path, fine_tuning: FineTuningKind) {
    let mut config: TrainConfig = dpcomp_lab::tasks::paper_defaults(dpcomp_lab::Task::Snli);
    config.epochs = 1;
    config.optimizer.batch_size = 8;
    config.optimizer.lr = 0.5;
    config.data.eval_batch_size = 16;
    config.data.max_seq_len = 16;
    config.model.bert_dir = bert.to_path_buf();
    config.model.fine_tuning = fine_tuning;
    config.model.lora_rank = 2;
    config.device = dpcomp::config::DeviceChoice::Cpu;
    let mode = config.model.fine_tuning_mode().unwrap();
    let model = BertClassifier::from_pretrained_with(bert, Device::Cpu, 3, &mode).unwrap();
    let data = TaskData {
        train: split(48, 1),
        test: split(16, 2),
        classes: dpcomp::data::snli::CLASSES
            .iter()
            .map(|c| c.to_string())
            .collect(),
    };
    let mut trainer = Trainer::builder(run)
        .config(config)
        .model(Box::new(model), data)
        .build()
        .unwrap();
    trainer.run().unwrap();
    assert!(run.join("summary.json").is_file());
}

/// The logits of the run's model (rebuilt as the run's config.toml says, with its checkpoint's
/// weights) on `features`.
fn run_logits(run: &Path, bert: &Path, features: &Features) -> Tensor {
    let config = dpcomp_lab::tasks::config_from_file(&run.join("config.toml")).unwrap();
    let mode = config.model.fine_tuning_mode().unwrap();
    let model = BertClassifier::from_pretrained_with(bert, Device::Cpu, 3, &mode).unwrap();
    checkpoint::load_weights(
        model.var_store(),
        &run.join("checkpoint").join("model.safetensors"),
    )
    .unwrap();
    logits(&model, features)
}

fn logits(model: &dyn Model, features: &Features) -> Tensor {
    tch::no_grad(|| model.forward(features, &mut Ctx::eval()).unwrap())
}

/// Writes `features` and `logits` as the reference file `scripts/hf_reference.py check` reads.
fn write_reference(path: &Path, features: &Features, logits: &Tensor) {
    let Features::TextPair {
        ids,
        token_types,
        attention_mask,
    } = features
    else {
        unreachable!()
    };
    let tensors = vec![
        ("input_ids".to_string(), ids.shallow_clone()),
        ("token_type_ids".to_string(), token_types.shallow_clone()),
        ("attention_mask".to_string(), attention_mask.shallow_clone()),
        ("logits".to_string(), logits.to_kind(Kind::Float)),
    ];
    dpcomp::hf::write_safetensors(path, &tensors).unwrap();
}

/// `scripts/hf_reference.py check`'s largest difference between `transformers`' logits of
/// `model_dir` (with the PEFT `adapter` on it) and the reference's.
fn python_check(model_dir: &Path, reference: &Path, adapter: Option<&Path>) -> f64 {
    let mut command = Command::new(common::venv_python());
    command
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/hf_reference.py"))
        .arg("check")
        .arg("--model")
        .arg(model_dir)
        .arg("--reference")
        .arg(reference);
    if let Some(adapter) = adapter {
        command.arg("--adapter").arg(adapter);
    }
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "hf_reference.py check failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    line["max_abs_diff"].as_f64().unwrap()
}

fn export(args: &[&str]) -> Output {
    let mut all = vec!["export"];
    all.extend_from_slice(args);
    dpcomp(&all)
}

fn assert_exported(out: &Output) {
    assert!(
        out.status.success(),
        "dpcomp export failed: {}",
        stderr(out)
    );
}

fn sorted_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_lora_run_exports_merged_and_as_an_adapter_that_transformers_and_peft_read() {
    let _serial = common::serial();
    let work = tempfile::tempdir().unwrap();
    let bert = bert_folder(work.path());
    let run = work.path().join("run");
    train(&run, &bert, FineTuningKind::Lora);

    // The adapters trained (B starts at zero), so the merge changes the weights.
    let adapters = common::checkpoint_tensors(&run, "model.safetensors");
    let trained_b: Vec<_> = adapters
        .iter()
        .filter(|(name, _)| name.contains(".lora_B"))
        .collect();
    assert!(!trained_b.is_empty(), "the run has no LoRA adapter");
    for (name, b) in trained_b {
        assert!(
            b.abs().sum(Kind::Float).double_value(&[]) > 0.0,
            "{name} is zero"
        );
    }
    let features = pairs(6, 9);
    let expected = run_logits(&run, &bert, &features);
    let base =
        BertClassifier::from_pretrained_with(&bert, Device::Cpu, 3, &dpcomp::hf::FineTuning::Full)
            .unwrap();
    let untrained = (logits(&base, &features) - &expected).abs().max();
    assert!(
        untrained.double_value(&[]) > 1e-4,
        "the fine-tuned model gives the pre-trained model's logits: nothing to check"
    );
    let reference = work.path().join("reference.safetensors");
    write_reference(&reference, &features, &expected);

    // Merged: config.json, model.safetensors and the BERT folder's tokenizer files.
    let merged = work.path().join("merged");
    assert_exported(&export(&["--run", &text(&run), "--out", &text(&merged)]));
    assert_eq!(
        sorted_names(&merged),
        [
            "config.json",
            "model.safetensors",
            "tokenizer_config.json",
            "vocab.txt"
        ]
    );
    for name in ["vocab.txt", "tokenizer_config.json"] {
        assert_eq!(
            std::fs::read(merged.join(name)).unwrap(),
            std::fs::read(bert.join(name)).unwrap(),
            "{name} is not the BERT folder's"
        );
    }
    let reloaded = BertClassifier::from_pretrained_with(
        &merged,
        Device::Cpu,
        3,
        &dpcomp::hf::FineTuning::Full,
    )
    .unwrap();
    let diff = (logits(&reloaded, &features) - &expected)
        .abs()
        .max()
        .double_value(&[]);
    assert!(diff < 1e-5, "dpcomp reads the merged export {diff:e} off");
    let diff = python_check(&merged, &reference, None);
    assert!(
        diff < 1e-4,
        "transformers' logits of the merged export differ by {diff:e}"
    );

    // The PEFT adapter on the BERT folder the run was fine-tuned from.
    let adapter = work.path().join("adapter");
    assert_exported(&export(&[
        "--run",
        &text(&run),
        "--out",
        &text(&adapter),
        "--adapter",
    ]));
    assert_eq!(
        sorted_names(&adapter),
        ["adapter_config.json", "adapter_model.safetensors"]
    );
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(adapter.join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(config["r"], 2);
    assert_eq!(
        config["base_model_name_or_path"].as_str().unwrap(),
        bert.canonicalize().unwrap().to_string_lossy()
    );
    let diff = python_check(&bert, &reference, Some(&adapter));
    assert!(
        diff < 1e-4,
        "peft's logits of the adapter differ by {diff:e}"
    );

    // An output folder in use is refused, and left as it was.
    let out = export(&["--run", &text(&run), "--out", &text(&merged)]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(&format!("--out {}: not empty", merged.display())),
        "{}",
        stderr(&out)
    );
    let file = work.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let out = export(&["--run", &text(&run), "--out", &text(&file), "--adapter"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--out"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");

    // A run that has not finished, or has no checkpoint yet.
    let unfinished = work.path().join("unfinished");
    copy_run(&run, &unfinished);
    std::fs::remove_file(unfinished.join("summary.json")).unwrap();
    refused(&unfinished, &[], "no summary.json", work.path());
    std::fs::remove_dir_all(unfinished.join("checkpoint")).unwrap();
    refused(&unfinished, &[], "no checkpoint", work.path());
    let empty = work.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    refused(&empty, &[], "no config.toml", work.path());

    // A task whose model is not a Hugging Face model.
    let surnames = work.path().join("surnames");
    copy_run(&run, &surnames);
    let config = std::fs::read_to_string(surnames.join("config.toml")).unwrap();
    assert!(config.contains("task = \"snli\""), "{config}");
    std::fs::write(
        surnames.join("config.toml"),
        config.replace("task = \"snli\"", "task = \"surnames\""),
    )
    .unwrap();
    refused(&surnames, &[], "its task is surnames", work.path());
}

#[test]
fn a_run_without_lora_exports_merged_but_has_no_adapter() {
    let _serial = common::serial();
    let work = tempfile::tempdir().unwrap();
    let bert = bert_folder(work.path());
    let run = work.path().join("run");
    train(&run, &bert, FineTuningKind::Bitfit);
    refused(&run, &["--adapter"], "--adapter: the run in", work.path());
    let merged = work.path().join("merged");
    assert_exported(&export(&["--run", &text(&run), "--out", &text(&merged)]));
    let features = pairs(4, 3);
    let reloaded = BertClassifier::from_pretrained_with(
        &merged,
        Device::Cpu,
        3,
        &dpcomp::hf::FineTuning::Full,
    )
    .unwrap();
    let diff = (logits(&reloaded, &features) - run_logits(&run, &bert, &features))
        .abs()
        .max()
        .double_value(&[]);
    assert!(diff < 1e-5, "dpcomp reads the bitfit export {diff:e} off");
}

/// Copies a run folder (its files and its checkpoint folder).
fn copy_run(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.join("checkpoint")).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
        }
    }
    for entry in std::fs::read_dir(from.join("checkpoint")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, to.join("checkpoint").join(path.file_name().unwrap())).unwrap();
    }
}

/// `dpcomp export --run run [extra]` into a new folder fails with `expected` (after the flag
/// `--run` or the one it names) and creates nothing.
fn refused(run: &Path, extra: &[&str], expected: &str, work: &Path) {
    let out_dir = work.join("refused-out");
    let mut args = vec![
        "--run".to_string(),
        text(run),
        "--out".into(),
        text(&out_dir),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = export(&args);
    assert!(!out.status.success(), "{args:?} was accepted");
    let message = stderr(&out);
    assert!(
        message.contains(expected) && (message.contains("--run") || message.contains("--adapter")),
        "{args:?}: {message}"
    );
    assert!(!out_dir.exists(), "{args:?} created {}", out_dir.display());
}
