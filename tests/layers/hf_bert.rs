//! The BERT family from Hugging Face folders: tiny random BERT and RoBERTa classifiers that
//! `transformers` made (`scripts/hf_reference.py make`) load with its logits; every fine-tuning
//! mode's per-sample gradients equal per-example autograd; the exported folder and the PEFT
//! adapter load in `transformers` and `peft` with dpcomp's logits.

use crate::common;
use dpcomp::data::Features;
use dpcomp::hf::{save_adapter, save_pretrained, FineTuning, Pretrained};
use dpcomp::models::{BertClassifier, BertConfig, Model};
use dpcomp::nn::{Ctx, LoraConfig};
use std::collections::HashMap;
use std::path::Path;
use tch::{Device, Kind, Tensor};

fn reference(dir: &Path) -> HashMap<String, Tensor> {
    Tensor::read_safetensors(dir.join("reference.safetensors"))
        .unwrap()
        .into_iter()
        .collect()
}

fn features(reference: &HashMap<String, Tensor>) -> Features {
    let ids = reference["input_ids"].shallow_clone();
    let token_types = reference
        .get("token_type_ids")
        .map(Tensor::shallow_clone)
        .unwrap_or_else(|| ids.zeros_like());
    Features::TextPair {
        ids,
        token_types,
        attention_mask: reference["attention_mask"].shallow_clone(),
    }
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

fn logits(model: &dyn Model, features: &Features) -> Tensor {
    tch::no_grad(|| model.forward(features, &mut Ctx::eval()).unwrap())
}

/// Runs `scripts/hf_reference.py check` and returns its max_abs_diff.
fn python_check(model_dir: &Path, reference: &Path, adapter: Option<&Path>) -> f64 {
    let mut command = std::process::Command::new(common::venv_python());
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

/// Writes `features` and `logits` as a reference file `check` reads.
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

#[test]
fn bert_and_roberta_logits_equal_transformers() {
    let fixtures = common::hf_fixtures();
    for name in ["bert", "roberta"] {
        let dir = fixtures.join(name);
        let model =
            BertClassifier::from_pretrained_with(&dir, Device::Cpu, 3, &FineTuning::Full).unwrap();
        let reference = reference(&dir);
        let ours = logits(&model, &features(&reference));
        let diff = max_abs_diff(&ours, &reference["logits"]);
        assert!(
            diff < 1e-5,
            "{name}: logits differ from transformers' by {diff:e}"
        );
    }
}

fn tiny(model_type: &str) -> BertConfig {
    serde_json::from_value(serde_json::json!({
        "model_type": model_type, "vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 24, "max_position_embeddings": 24,
        "type_vocab_size": if model_type == "roberta" { 1 } else { 2 }, "pad_token_id": 1
    }))
    .unwrap()
}

fn lora(targets: &[&str]) -> FineTuning {
    FineTuning::Lora(LoraConfig {
        rank: 2,
        alpha: 4.0,
        dropout: 0.0,
        target_modules: targets.iter().map(|t| t.to_string()).collect(),
    })
}

/// B starts at zero, which makes A's per-sample gradients zero: draw it so both are exercised.
fn perturb_adapters(model: &dyn Pretrained) {
    for projection in model.projections() {
        if let Some(adapter) = &projection.adapter {
            let _ = tch::no_grad(|| adapter.b.weight.shallow_clone().normal_(0.0, 0.5));
        }
    }
}

#[test]
fn every_mode_gives_per_example_autograds_gradients() {
    let _serial = common::serial();
    for model_type in ["bert", "roberta"] {
        for (k, mode) in [
            FineTuning::Full,
            FineTuning::LastLayers { layers: 1 },
            FineTuning::BitFit,
            lora(&["query", "value", "intermediate.dense"]),
        ]
        .into_iter()
        .enumerate()
        {
            tch::manual_seed(40 + k as i64);
            let model =
                BertClassifier::with_fine_tuning(Device::Cpu, tiny(model_type), 3, &mode).unwrap();
            perturb_adapters(&model);
            common::to_double(model.var_store());
            let trainable: Vec<String> = model
                .trainable_variables()
                .into_iter()
                .map(|(n, _)| n)
                .collect();
            match &mode {
                FineTuning::BitFit => assert!(trainable
                    .iter()
                    .all(|n| n.ends_with(".bias") || n.starts_with("classifier."))),
                FineTuning::Lora(_) => {
                    assert!(trainable
                        .iter()
                        .all(|n| n.contains(".lora_") || n.starts_with("classifier.")));
                    // Two layers x three targets x (A, B).
                    assert_eq!(
                        trainable.iter().filter(|n| n.contains(".lora_")).count(),
                        12
                    );
                }
                _ => {}
            }
            let ids = Tensor::randint_low(2, 40, [3, 6], (Kind::Int64, Device::Cpu));
            let attention_mask =
                Tensor::from_slice(&[1i64, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0])
                    .view([3, 6]);
            let token_types = if model_type == "roberta" {
                ids.zeros_like()
            } else {
                Tensor::from_slice(&[0i64, 0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0])
                    .view([3, 6])
            };
            let features = Features::TextPair {
                ids,
                token_types,
                attention_mask,
            };
            // `run` asserts every check; it returns whether every layer ran in autograd.
            assert!(
                crate::grad_sample::run(&model, features, Tensor::from_slice(&[2i64, 0, 1])),
                "{model_type} {}",
                mode.label()
            );
        }
    }
}

#[test]
fn lora_trains_a_hundredth_of_the_weights_and_starts_from_the_model() {
    let dir = common::hf_fixtures().join("bert");
    let full =
        BertClassifier::from_pretrained_with(&dir, Device::Cpu, 3, &FineTuning::Full).unwrap();
    let adapted = BertClassifier::from_pretrained_with(&dir, Device::Cpu, 3, &lora(&[])).unwrap();
    // The default targets are PEFT's for BERT: query and value.
    let adapters: Vec<String> = adapted
        .projections()
        .iter()
        .filter(|p| p.adapter.is_some())
        .map(|p| p.name.clone())
        .collect();
    assert!(adapters
        .iter()
        .all(|n| n.ends_with("query") || n.ends_with("value")));
    assert_eq!(adapters.len(), 2 * full.config.num_hidden_layers as usize);
    assert!(adapted.trainable_parameter_count() * 10 < full.trainable_parameter_count());
    // B = 0: the same logits as the model itself.
    let reference = reference(&dir);
    let features = features(&reference);
    assert!(logits(&adapted, &features).equal(&logits(&full, &features)));
}

#[test]
fn exported_folder_and_adapter_load_in_transformers_and_peft() {
    let _serial = common::serial();
    let fixtures = common::hf_fixtures();
    for name in ["bert", "roberta"] {
        let base = fixtures.join(name);
        tch::manual_seed(7);
        let model = BertClassifier::from_pretrained_with(
            &base,
            Device::Cpu,
            3,
            &lora(&["query", "value", "output.dense"]),
        )
        .unwrap();
        perturb_adapters(&model);
        // A classifier of its own, as training would leave it.
        for (_, var) in model.var_store().variables() {
            if var.requires_grad() && !var.size().is_empty() {
                let _ = tch::no_grad(|| var.shallow_clone().normal_(0.0, 0.3));
            }
        }
        let features = features(&reference(&base));
        let ours = logits(&model, &features);
        let out = tempfile::tempdir().unwrap();
        let reference_file = out.path().join("ours.safetensors");
        write_reference(&reference_file, &features, &ours);

        let merged = out.path().join("merged");
        save_pretrained(&model, &merged).unwrap();
        let diff = python_check(&merged, &reference_file, None);
        assert!(
            diff < 1e-5,
            "{name}: the merged folder's logits differ by {diff:e}"
        );
        // dpcomp reads its own export back to the same logits.
        let again =
            BertClassifier::from_pretrained_with(&merged, Device::Cpu, 3, &FineTuning::Full)
                .unwrap();
        assert!(max_abs_diff(&logits(&again, &features), &ours) < 1e-5);

        let adapter = out.path().join("adapter");
        save_adapter(&model, &adapter, base.to_str()).unwrap();
        let diff = python_check(&base, &reference_file, Some(&adapter));
        assert!(
            diff < 1e-5,
            "{name}: the PEFT adapter's logits differ by {diff:e}"
        );

        // Nothing is written into a folder that holds something.
        let err = save_pretrained(&model, &merged).unwrap_err().to_string();
        assert!(err.contains("not empty") && err.contains("merged"), "{err}");
    }
}

#[test]
fn bad_modes_and_folders_are_named() {
    let dir = common::hf_fixtures().join("bert");
    let err = BertClassifier::from_pretrained_with(
        &dir,
        Device::Cpu,
        3,
        &FineTuning::LastLayers { layers: 9 },
    )
    .err()
    .unwrap()
    .to_string();
    assert_eq!(
        err,
        "fine_tuning.layers: 9, expected 1 to 2 (the model's blocks)"
    );
    let err = BertClassifier::from_pretrained_with(&dir, Device::Cpu, 3, &lora(&["q_proj"]))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("lora.target_modules [\"q_proj\"] name none of the model's projections")
            && err.contains("encoder.layer.0.attention.self.query"),
        "{err}"
    );
    let model =
        BertClassifier::from_pretrained_with(&dir, Device::Cpu, 3, &FineTuning::BitFit).unwrap();
    let out = tempfile::tempdir().unwrap();
    let err = save_adapter(&model, &out.path().join("a"), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no LoRA adapter"), "{err}");
    // Another architecture's folder is refused naming its model_type.
    let err = BertClassifier::from_pretrained(&common::hf_fixtures().join("gpt2"), Device::Cpu, 3)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("model_type \"gpt2\""), "{err}");
}
