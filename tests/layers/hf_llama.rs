//! Llama (`hf::llama`) against Hugging Face `transformers`: logits of the tiny random
//! checkpoints (single file and sharded) equal transformers' to 1e-5; per-sample gradients of
//! every fine-tuning mode equal per-example autograd (f64); bad folders and configs are errors
//! naming the tensor or field; and what the model exports loads in transformers with the same
//! logits.

use crate::common;
use dpcomp::data::Features;
use dpcomp::hf::{self, FineTuning, Head, Llama, LlamaConfig, Pretrained};
use dpcomp::models::Model;
use dpcomp::nn::{Ctx, LoraConfig};
use dpcomp::privacy::grad_sample::per_sample_gradients;
use dpcomp_lab::bench::device_check::per_example_gradients;
use std::collections::HashMap;
use std::path::Path;
use tch::{Device, Kind, Reduction, Tensor};

/// `reference.safetensors`: input_ids, attention_mask, logits.
fn reference(path: &Path) -> HashMap<String, Tensor> {
    Tensor::read_safetensors(path)
        .unwrap()
        .into_iter()
        .collect()
}

/// The reference's right-padded rows as dpcomp's token features.
fn tokens(reference: &HashMap<String, Tensor>) -> Features {
    let mask = &reference["attention_mask"];
    Features::Tokens {
        ids: reference["input_ids"].shallow_clone(),
        lengths: mask.sum_dim_intlist(1, false, Kind::Int64),
    }
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

#[test]
fn logits_match_transformers_single_and_sharded() {
    let _serial = common::serial();
    let fixtures = common::hf_fixtures();
    for name in ["llama", "llama-sharded"] {
        let dir = fixtures.join(name);
        let model =
            Llama::from_pretrained(&dir, Device::Cpu, Head::CausalLm, &FineTuning::Full).unwrap();
        let reference = reference(&dir.join("reference.safetensors"));
        let features = tokens(&reference);
        model.check_features(&features).unwrap();
        let logits = model.forward(&features, &mut Ctx::eval()).unwrap();
        assert_eq!(logits.size(), reference["logits"].size(), "{name}");
        let diff = max_abs_diff(&logits, &reference["logits"]);
        assert!(
            diff < 1e-5,
            "{name}: logits differ from transformers' by {diff:e}"
        );
    }
}

/// A tiny Llama config: GQA (4 query heads over 2 key/value heads), padding id 0.
fn tiny_config(attention_bias: bool, tie_word_embeddings: bool) -> LlamaConfig {
    let raw = serde_json::json!({
        "model_type": "llama",
        "vocab_size": 20,
        "hidden_size": 16,
        "intermediate_size": 24,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 16,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 100.0},
        "hidden_act": "silu",
        "attention_bias": attention_bias,
        "mlp_bias": attention_bias,
        "tie_word_embeddings": tie_word_embeddings,
        "initializer_range": 0.3,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
    });
    LlamaConfig::from_json(raw, Path::new("tiny/config.json")).unwrap()
}

/// Four right-padded rows of 6 positions (lengths 6, 4, 1, 3), tokens 3..19, padding 0.
fn tiny_batch() -> (Features, Tensor) {
    let lengths = [6i64, 4, 1, 3];
    let mut ids = Vec::new();
    for (row, &length) in lengths.iter().enumerate() {
        for t in 0..6i64 {
            ids.push(if t < length {
                3 + (row as i64 * 7 + t * 5) % 17
            } else {
                0
            });
        }
    }
    let features = Features::Tokens {
        ids: Tensor::from_slice(&ids).view([4, 6]),
        lengths: Tensor::from_slice(&lengths),
    };
    (features, Tensor::from_slice(&[0i64, 2, 1, 2]))
}

/// Per-sample gradients from one private forward and backward pass against per-example
/// autograd, for every trainable weight; returns the names of the weights that trained.
fn check_per_sample(model: &Llama) -> Vec<String> {
    common::to_double(model.var_store());
    let (features, labels) = tiny_batch();
    let expected = per_example_gradients(model, &features, &labels).unwrap();
    let names: HashMap<usize, String> = model
        .trainable_variables()
        .into_iter()
        .map(|(n, p)| (p.data_ptr() as usize, n))
        .collect();
    let mut ctx = Ctx::private().without_dropout();
    let logits = model.forward(&features, &mut ctx).unwrap();
    assert_eq!(logits.size(), [4, 3]);
    let losses = logits.cross_entropy_loss::<Tensor>(&labels, None, Reduction::None, -100, 0.0);
    let tape = ctx.take_tape().unwrap();
    let per_sample = per_sample_gradients(tape, &losses.sum(Kind::Double)).unwrap();
    assert_eq!(
        per_sample.len(),
        names.len(),
        "every trainable weight has one recipe"
    );
    let scale = expected
        .values()
        .map(|g| g.abs().max().double_value(&[]))
        .fold(0.0, f64::max);
    assert!(scale > 1e-6, "gradients to compare");
    let mut trained = Vec::new();
    for (param, recipe) in &per_sample {
        let name = &names[&(param.data_ptr() as usize)];
        let got = recipe.materialize();
        let want = &expected[name];
        assert_eq!(got.size(), want.size(), "{name}");
        let diff = max_abs_diff(&got, want) / scale;
        assert!(
            diff < 1e-9,
            "{name}: per-sample gradients differ from per-example autograd by {diff:e}"
        );
        trained.push(name.clone());
    }
    trained.sort();
    trained
}

fn classifier(attention_bias: bool, lora: Option<&LoraConfig>) -> Llama {
    let head = Head::SequenceClassification { classes: 3 };
    Llama::new(tiny_config(attention_bias, false), Device::Cpu, head, lora).unwrap()
}

#[test]
fn per_sample_gradients_of_full_fine_tuning_equal_per_example_autograd() {
    let _serial = common::serial();
    tch::manual_seed(11);
    let model = classifier(false, None);
    FineTuning::Full.apply(&model).unwrap();
    let trained = check_per_sample(&model);
    assert_eq!(trained.len(), model.var_store().variables().len());
    assert!(trained.contains(&"model.embed_tokens.weight".to_string()));
    assert!(trained.contains(&"model.layers.0.input_layernorm.weight".to_string()));
}

#[test]
fn per_sample_gradients_of_the_last_layer_equal_per_example_autograd() {
    let _serial = common::serial();
    tch::manual_seed(12);
    let model = classifier(false, None);
    FineTuning::LastLayers { layers: 1 }.apply(&model).unwrap();
    let trained = check_per_sample(&model);
    assert!(trained.iter().all(|n| n.starts_with("model.layers.1.")
        || n == "model.norm.weight"
        || n == "score.weight"));
    assert_eq!(trained.len(), 2 + 7 + 1 + 1, "{trained:?}");
}

#[test]
fn per_sample_gradients_of_lora_equal_per_example_autograd() {
    let _serial = common::serial();
    tch::manual_seed(13);
    let lora = LoraConfig {
        rank: 2,
        alpha: 4.0,
        target_modules: vec!["q_proj".into(), "v_proj".into()],
        ..LoraConfig::default()
    };
    let fine_tuning = FineTuning::Lora(lora.clone());
    let model = classifier(false, Some(&hf::lora_for(hf::Architecture::Llama, &lora)));
    // B starts at zero, which would leave A without gradient: perturb it.
    for projection in model.projections() {
        if let Some(adapter) = &projection.adapter {
            let _ = tch::no_grad(|| adapter.b.weight.shallow_clone().uniform_(-0.5, 0.5));
        }
    }
    fine_tuning.apply(&model).unwrap();
    let trained = check_per_sample(&model);
    let want: Vec<String> = {
        let mut names: Vec<String> = (0..2)
            .flat_map(|i| {
                ["q_proj", "v_proj"].into_iter().flat_map(move |p| {
                    ["lora_A", "lora_B"]
                        .map(|m| format!("model.layers.{i}.self_attn.{p}.{m}.weight"))
                })
            })
            .collect();
        names.push("score.weight".into());
        names.sort();
        names
    };
    assert_eq!(trained, want);
}

#[test]
fn bitfit_needs_biases() {
    let _serial = common::serial();
    tch::manual_seed(14);
    let error = FineTuning::BitFit
        .apply(&classifier(false, None))
        .unwrap_err()
        .to_string();
    assert!(error.contains("BiTFiT"), "{error}");
    // With attention and feed-forward biases the biases (and the head) train.
    let model = classifier(true, None);
    FineTuning::BitFit.apply(&model).unwrap();
    let trained = check_per_sample(&model);
    assert_eq!(trained.len(), 2 * 7 + 1, "{trained:?}");
    assert!(trained
        .iter()
        .all(|n| n.ends_with(".bias") || n == "score.weight"));
}

/// A copy of the `llama` fixture's config and weights in a folder of its own, the weights
/// passed through `change`.
fn changed_copy(
    fixture: &Path,
    out: &Path,
    change: impl Fn(Vec<(String, Tensor)>) -> Vec<(String, Tensor)>,
) {
    std::fs::copy(fixture.join("config.json"), out.join("config.json")).unwrap();
    let tensors = Tensor::read_safetensors(fixture.join("model.safetensors")).unwrap();
    hf::write_safetensors(&out.join("model.safetensors"), &change(tensors)).unwrap();
}

#[test]
fn a_missing_tensor_is_named() {
    let _serial = common::serial();
    let fixture = common::hf_fixtures().join("llama");
    let dir = tempfile::tempdir().unwrap();
    let missing = "model.layers.1.mlp.up_proj.weight";
    changed_copy(&fixture, dir.path(), |tensors| {
        tensors.into_iter().filter(|(n, _)| n != missing).collect()
    });
    let error = Llama::from_pretrained(dir.path(), Device::Cpu, Head::CausalLm, &FineTuning::Full)
        .err()
        .expect("a checkpoint without a weight is refused")
        .to_string();
    assert!(error.contains(missing), "{error}");
    // A classifier reads the same folder without `score.weight` (a fresh head) but not without
    // a block's weight.
    let head = Head::SequenceClassification { classes: 2 };
    let error = Llama::from_pretrained(dir.path(), Device::Cpu, head, &FineTuning::Full)
        .err()
        .expect("refused")
        .to_string();
    assert!(error.contains(missing), "{error}");
    let model = Llama::from_pretrained(&fixture, Device::Cpu, head, &FineTuning::Full).unwrap();
    assert_eq!(model.trainable_variables().len(), 1 + 2 * 9 + 1 + 1);
}

#[test]
fn unsupported_configs_are_named() {
    let fixture = common::hf_fixtures().join("llama");
    let text = std::fs::read_to_string(fixture.join("config.json")).unwrap();
    let good: serde_json::Value = serde_json::from_str(&text).unwrap();
    let source = Path::new("some/config.json");
    let refused = |change: &dyn Fn(&mut serde_json::Value)| {
        let mut raw = good.clone();
        change(&mut raw);
        LlamaConfig::from_json(raw, source)
            .expect_err("refused")
            .to_string()
    };
    let error = refused(&|c| c["hidden_act"] = "gelu".into());
    assert!(error.contains("some/config.json"), "{error}");
    assert!(error.contains("hidden_act \"gelu\""), "{error}");
    let error = refused(&|c| {
        c["rope_parameters"] =
            serde_json::json!({"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0})
    });
    assert!(
        error.contains("rope_parameters.rope_type \"llama3\""),
        "{error}"
    );
    // transformers 4's spelling: rope_scaling with `type`, θ beside it.
    let error = refused(&|c| {
        c.as_object_mut().unwrap().remove("rope_parameters");
        c["rope_theta"] = 5e5.into();
        c["rope_scaling"] = serde_json::json!({"type": "linear", "factor": 2.0});
    });
    assert!(error.contains("rope_scaling.type \"linear\""), "{error}");
    let error = refused(&|c| c["num_key_value_heads"] = 3.into());
    assert!(error.contains("num_key_value_heads 3"), "{error}");
    let error = refused(&|c| c["rms_norm_eps"] = (-1.0).into());
    assert!(error.contains("rms_norm_eps"), "{error}");
    // transformers 4's θ beside a null rope_scaling is read.
    let mut old = good.clone();
    old.as_object_mut().unwrap().remove("rope_parameters");
    old["rope_theta"] = 5e5.into();
    old["rope_scaling"] = serde_json::Value::Null;
    assert_eq!(LlamaConfig::from_json(old, source).unwrap().rope_theta, 5e5);
    assert_eq!(
        LlamaConfig::from_json(good, source).unwrap().rope_theta,
        1e4
    );
}

#[test]
fn bad_batches_are_refused() {
    let _serial = common::serial();
    tch::manual_seed(15);
    let model = classifier(false, None);
    let (features, _) = tiny_batch();
    model.check_features(&features).unwrap();
    let Features::Tokens { ids, .. } = &features else {
        unreachable!()
    };
    let empty_row = Features::Tokens {
        ids: ids.shallow_clone(),
        lengths: Tensor::from_slice(&[6i64, 0, 1, 3]),
    };
    let error = model.check_features(&empty_row).unwrap_err().to_string();
    assert!(error.contains("lengths"), "{error}");
    let outside = Features::Tokens {
        ids: ids.shallow_clone() + 19,
        lengths: Tensor::from_slice(&[6i64, 4, 1, 3]),
    };
    let error = model.check_features(&outside).unwrap_err().to_string();
    assert!(error.contains("token ids"), "{error}");
    let long = Features::Tokens {
        ids: Tensor::ones([1, 17], (Kind::Int64, Device::Cpu)),
        lengths: Tensor::from_slice(&[17i64]),
    };
    let error = model
        .forward(&long, &mut Ctx::eval())
        .unwrap_err()
        .to_string();
    assert!(error.contains("max_position_embeddings"), "{error}");
    let no_steps = Features::Tokens {
        ids: Tensor::zeros([2, 0], (Kind::Int64, Device::Cpu)),
        lengths: Tensor::from_slice(&[0i64, 0]),
    };
    let error = model
        .forward(&no_steps, &mut Ctx::eval())
        .unwrap_err()
        .to_string();
    assert!(error.contains("sequences of 0 tokens"), "{error}");
}

/// Writes `model`'s export (`hf::save_pretrained`) and a reference of `features` with
/// dpcomp's logits, and runs `scripts/hf_reference.py check` on them: the largest difference
/// between transformers' logits from the export and ours. With `adapter_of`, the export is the
/// model's PEFT adapter (`hf::save_adapter`) on the base folder `adapter_of` instead.
fn transformers_diff(model: &Llama, features: &Features, adapter_of: Option<&Path>) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("export");
    let (model_dir, adapter) = match adapter_of {
        None => {
            hf::save_pretrained(model, &export).unwrap();
            (export, None)
        }
        Some(base) => {
            hf::save_adapter(model, &export, base.to_str()).unwrap();
            (base.to_path_buf(), Some(export))
        }
    };
    let Features::Tokens { ids, lengths } = features else {
        unreachable!()
    };
    let steps = ids.size()[1];
    let mask = Tensor::arange(steps, (Kind::Int64, Device::Cpu))
        .unsqueeze(0)
        .lt_tensor(&lengths.unsqueeze(1))
        .to_kind(Kind::Int64);
    let logits = model.forward(features, &mut Ctx::eval()).unwrap();
    let reference = dir.path().join("reference.safetensors");
    hf::write_safetensors(
        &reference,
        &[
            ("input_ids".into(), ids.to_kind(Kind::Int64)),
            ("attention_mask".into(), mask),
            ("logits".into(), logits),
        ],
    )
    .unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/hf_reference.py");
    let mut command = std::process::Command::new(common::venv_python());
    command
        .arg(script)
        .arg("check")
        .arg("--model")
        .arg(&model_dir)
        .arg("--reference")
        .arg(&reference)
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1");
    if let Some(adapter) = &adapter {
        command.arg("--adapter").arg(adapter);
    }
    let output = command
        .output()
        .expect("run .venv/bin/python (scripts/setup.sh makes it)");
    assert!(
        output.status.success(),
        "hf_reference.py check failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().last().expect("one JSON line");
    let result: serde_json::Value = serde_json::from_str(line).unwrap();
    result["max_abs_diff"].as_f64().expect("max_abs_diff")
}

#[test]
fn the_export_loads_in_transformers_with_the_same_logits() {
    let _serial = common::serial();
    // The language model with trained LoRA adapters on every projection, merged on export.
    let fixture = common::hf_fixtures().join("llama");
    let lora = LoraConfig {
        rank: 2,
        alpha: 2.0,
        target_modules: vec![
            "q_proj".into(),
            "k_proj".into(),
            "v_proj".into(),
            "o_proj".into(),
            "gate_proj".into(),
            "up_proj".into(),
            "down_proj".into(),
        ],
        ..LoraConfig::default()
    };
    tch::manual_seed(16);
    let model = Llama::from_pretrained(
        &fixture,
        Device::Cpu,
        Head::CausalLm,
        &FineTuning::Lora(lora),
    )
    .unwrap();
    for projection in model.projections() {
        let adapter = projection
            .adapter
            .as_ref()
            .expect("every projection adapted");
        let _ = tch::no_grad(|| adapter.b.weight.shallow_clone().uniform_(-0.05, 0.05));
    }
    let names: Vec<String> = model.hf_tensors().into_iter().map(|(n, _)| n).collect();
    assert!(names.contains(&"lm_head.weight".to_string()));
    assert!(!names.iter().any(|n| n.contains("lora_")));
    let reference = reference(&fixture.join("reference.safetensors"));
    let features = tokens(&reference);
    let adapted = model.forward(&features, &mut Ctx::eval()).unwrap();
    let change = max_abs_diff(&adapted, &reference["logits"]);
    assert!(change > 1e-2, "the adapters change the logits: {change:e}");
    let diff = transformers_diff(&model, &features, None);
    assert!(diff < 1e-5, "LoRA-merged language model: {diff:e}");
    let diff = transformers_diff(&model, &features, Some(&fixture));
    assert!(
        diff < 1e-5,
        "PEFT adapter on the pre-trained model: {diff:e}"
    );

    // A classifier with biases, and a language model whose head is its embedding table.
    let (features, _) = tiny_batch();
    let with_biases = classifier(true, None);
    let diff = transformers_diff(&with_biases, &features, None);
    assert!(diff < 1e-5, "classifier with biases: {diff:e}");
    let tied = Llama::new(tiny_config(false, true), Device::Cpu, Head::CausalLm, None).unwrap();
    let names: Vec<String> = tied.hf_tensors().into_iter().map(|(n, _)| n).collect();
    assert!(!names.contains(&"lm_head.weight".to_string()), "{names:?}");
    let diff = transformers_diff(&tied, &features, None);
    assert!(diff < 1e-5, "tied language model: {diff:e}");
}

#[test]
fn a_trained_tied_table_gets_one_per_sample_gradient_for_both_uses() {
    let _serial = common::serial();
    tch::manual_seed(17);
    let tied = Llama::new(tiny_config(false, true), Device::Cpu, Head::CausalLm, None).unwrap();
    let (features, _) = tiny_batch();
    FineTuning::Full.apply(&tied).unwrap();
    common::to_double(tied.var_store());
    // The table is the lookup and the head: its per-sample gradient sums both uses, against
    // per-example autograd of each sequence's next-token loss.
    assert!(crate::grad_sample::run(
        &tied,
        features,
        Tensor::zeros([4], (Kind::Int64, Device::Cpu))
    ));
}
