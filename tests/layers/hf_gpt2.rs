//! GPT-2 (`hf::gpt2`) against Hugging Face `transformers`: logits of the tiny random checkpoints
//! (language model and classifier) equal transformers' to 1e-5; per-sample gradients of every
//! fine-tuning mode equal per-example autograd (f64), the language model's tied token table
//! included; bad folders and configs are errors naming the tensor or field; and what the model
//! exports loads in transformers with the same logits.

use crate::common;
use crate::grad_sample::run;
use dpcomp::data::Features;
use dpcomp::hf::gpt2::Gpt2Config;
use dpcomp::hf::{self, FineTuning, Gpt2, Head, Pretrained};
use dpcomp::models::Model;
use dpcomp::nn::{Ctx, LoraConfig};
use dpcomp::privacy::grad_sample::{per_sample_gradients, per_sample_to_every_output};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

const CLASSES: i64 = 3;

/// `reference.safetensors`: input_ids, attention_mask, logits.
fn reference(path: &Path) -> HashMap<String, Tensor> {
    Tensor::read_safetensors(path)
        .unwrap()
        .into_iter()
        .collect()
}

/// The reference's right-padded rows as dpcomp's token features.
fn tokens(reference: &HashMap<String, Tensor>) -> Features {
    Features::Tokens {
        ids: reference["input_ids"].shallow_clone(),
        lengths: reference["attention_mask"].sum_dim_intlist(1, false, Kind::Int64),
    }
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

fn fixture(name: &str) -> PathBuf {
    common::hf_fixtures().join(name)
}

fn classifier(fine_tuning: &FineTuning) -> Gpt2 {
    let head = Head::SequenceClassification { classes: CLASSES };
    Gpt2::from_pretrained(&fixture("gpt2-cls"), Device::Cpu, head, fine_tuning).unwrap()
}

#[test]
fn logits_match_transformers() {
    let _serial = common::serial();
    for (name, head, shape) in [
        ("gpt2", Head::CausalLm, vec![3, 7, 100]),
        (
            "gpt2-cls",
            Head::SequenceClassification { classes: CLASSES },
            vec![3, CLASSES],
        ),
    ] {
        let dir = fixture(name);
        let model = Gpt2::from_pretrained(&dir, Device::Cpu, head, &FineTuning::Full).unwrap();
        let reference = reference(&dir.join("reference.safetensors"));
        let features = tokens(&reference);
        model.check_features(&features).unwrap();
        let logits = model.forward(&features, &mut Ctx::eval()).unwrap();
        assert_eq!(logits.size(), shape, "{name}");
        assert_eq!(logits.size(), reference["logits"].size(), "{name}");
        let diff = max_abs_diff(&logits, &reference["logits"]);
        assert!(
            diff < 1e-5,
            "{name}: logits differ from transformers' by {diff:e}"
        );
    }
}

#[test]
fn the_checkpoint_without_the_transformer_prefix_loads_the_same() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let source = fixture("gpt2");
    let tensors: Vec<(String, Tensor)> = Tensor::read_safetensors(source.join("model.safetensors"))
        .unwrap()
        .into_iter()
        .map(|(name, t)| (name.trim_start_matches("transformer.").to_string(), t))
        .collect();
    assert!(tensors.iter().all(|(n, _)| !n.starts_with("transformer.")));
    hf::write_safetensors(&dir.path().join("model.safetensors"), &tensors).unwrap();
    std::fs::copy(source.join("config.json"), dir.path().join("config.json")).unwrap();
    let short =
        Gpt2::from_pretrained(dir.path(), Device::Cpu, Head::CausalLm, &FineTuning::Full).unwrap();
    let full =
        Gpt2::from_pretrained(&source, Device::Cpu, Head::CausalLm, &FineTuning::Full).unwrap();
    let reference = reference(&source.join("reference.safetensors"));
    let features = tokens(&reference);
    let a = short.forward(&features, &mut Ctx::eval()).unwrap();
    let b = full.forward(&features, &mut Ctx::eval()).unwrap();
    assert_eq!(max_abs_diff(&a, &b), 0.0);
}

/// The reference's three rows (7, 5 and 2 tokens) with labels, for the oracle tests.
fn oracle_batch() -> (Features, Tensor) {
    let reference = reference(&fixture("gpt2-cls").join("reference.safetensors"));
    (tokens(&reference), Tensor::from_slice(&[2i64, 0, 1]))
}

/// Per-sample gradients from one private pass equal per-example autograd (f64) for every
/// trainable weight of `model`, whose names are returned.
fn check_oracle(model: &Gpt2) -> Vec<String> {
    common::to_double(model.var_store());
    let (features, labels) = oracle_batch();
    run(model, features, labels);
    model
        .trainable_variables()
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}

#[test]
fn per_sample_gradients_of_full_fine_tuning_equal_per_example_autograd() {
    let _serial = common::serial();
    let model = classifier(&FineTuning::Full);
    let trained = check_oracle(&model);
    assert_eq!(trained.len(), model.var_store().variables().len());
    assert!(trained.contains(&"transformer.wte.weight".to_string()));
    assert!(trained.contains(&"score.weight".to_string()));
}

#[test]
fn per_sample_gradients_of_the_last_layer_equal_per_example_autograd() {
    let _serial = common::serial();
    let model = classifier(&FineTuning::LastLayers { layers: 1 });
    let trained = check_oracle(&model);
    assert!(trained.iter().all(|n| n.starts_with("transformer.h.1.")
        || n.starts_with("transformer.ln_f.")
        || n == "score.weight"));
    assert!(trained.contains(&"transformer.h.1.attn.c_attn.weight".to_string()));
    assert!(trained.contains(&"transformer.ln_f.bias".to_string()));
    // The first block and the embeddings have nothing to train: they run without autograd.
    assert!(!model.blocks[0].c_attn.base.weight.requires_grad());
}

#[test]
fn per_sample_gradients_of_bitfit_equal_per_example_autograd() {
    let _serial = common::serial();
    let model = classifier(&FineTuning::BitFit);
    let trained = check_oracle(&model);
    assert!(trained
        .iter()
        .all(|n| n.ends_with(".bias") || n == "score.weight"));
    // Every block: ln_1, c_attn, c_proj, ln_2, c_fc, mlp.c_proj biases; ln_f's; the head.
    assert_eq!(trained.len(), 2 * 6 + 1 + 1);
}

#[test]
fn per_sample_gradients_of_lora_equal_per_example_autograd() {
    let _serial = common::serial();
    let lora = LoraConfig {
        rank: 2,
        alpha: 4.0,
        dropout: 0.0,
        target_modules: vec!["c_attn".into(), "mlp.c_fc".into()],
    };
    let model = classifier(&FineTuning::Lora(lora));
    // B starts at zero, which gives A no gradient: perturb B so both factors are checked.
    tch::manual_seed(11);
    perturb_adapters(&model);
    let trained = check_oracle(&model);
    let mut expected = vec!["score.weight".to_string()];
    for i in 0..2 {
        for target in ["attn.c_attn", "mlp.c_fc"] {
            for factor in ["lora_A", "lora_B"] {
                expected.push(format!("transformer.h.{i}.{target}.{factor}.weight"));
            }
        }
    }
    expected.sort();
    assert_eq!(trained, expected);
}

#[test]
fn default_lora_targets_are_c_attn() {
    let _serial = common::serial();
    let model = classifier(&FineTuning::Lora(LoraConfig::default()));
    let adapted: Vec<&str> = model
        .projections()
        .into_iter()
        .filter(|p| p.adapter.is_some())
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(
        adapted,
        ["transformer.h.0.attn.c_attn", "transformer.h.1.attn.c_attn"]
    );
}

/// The language model's token table is used twice (lookup and head): its per-sample gradients
/// are the sum of both uses, checked against per-example autograd with a loss over every real
/// position's logits.
#[test]
fn per_sample_gradients_of_the_tied_token_table_equal_per_example_autograd() {
    let _serial = common::serial();
    let dir = fixture("gpt2");
    let model =
        Gpt2::from_pretrained(&dir, Device::Cpu, Head::CausalLm, &FineTuning::Full).unwrap();
    common::to_double(model.var_store());
    let reference = reference(&dir.join("reference.safetensors"));
    let Features::Tokens { ids, lengths } = tokens(&reference) else {
        unreachable!()
    };
    let (batch, steps) = (ids.size()[0], ids.size()[1]);
    tch::manual_seed(12);
    // loss_i = Σ_t<len_i Σ_v logits_itv r_itv, a fixed random r zero on padding.
    let real = Tensor::arange(steps, (Kind::Int64, Device::Cpu))
        .unsqueeze(0)
        .lt_tensor(&lengths.unsqueeze(1))
        .to_kind(Kind::Double);
    let weights =
        Tensor::randn([batch, steps, 100], (Kind::Double, Device::Cpu)) * real.unsqueeze(2);
    let features = Features::Tokens {
        ids: ids.shallow_clone(),
        lengths: lengths.shallow_clone(),
    };
    let names: HashMap<usize, String> = model
        .trainable_variables()
        .into_iter()
        .map(|(n, p)| (p.data_ptr() as usize, n))
        .collect();
    // Per-example autograd, one trimmed example at a time.
    let mut expected: HashMap<String, Vec<Tensor>> = HashMap::new();
    for i in 0..batch {
        let length = lengths.int64_value(&[i]);
        let one = Features::Tokens {
            ids: ids.narrow(0, i, 1).narrow(1, 0, length),
            lengths: lengths.narrow(0, i, 1),
        };
        for (_, p) in model.trainable_variables() {
            p.shallow_clone().zero_grad();
        }
        let logits = model.forward(&one, &mut Ctx::eval()).unwrap();
        let loss = (logits * weights.narrow(0, i, 1).narrow(1, 0, length)).sum(Kind::Double);
        loss.backward();
        for (name, p) in model.trainable_variables() {
            expected.entry(name).or_default().push(p.grad().copy());
        }
    }
    for every_output in [false, true] {
        let mut ctx = Ctx::private().without_dropout();
        let logits = model.forward(&features, &mut ctx).unwrap();
        let loss_sum = (logits * &weights).sum(Kind::Double);
        let tape = ctx.take_tape().unwrap();
        let recipes = if every_output {
            per_sample_to_every_output(tape, &loss_sum).unwrap()
        } else {
            per_sample_gradients(tape, &loss_sum).unwrap()
        };
        assert_eq!(recipes.len(), names.len(), "every weight has one recipe");
        for (param, recipe) in &recipes {
            let name = &names[&(param.data_ptr() as usize)];
            let want = Tensor::stack(&expected[name], 0);
            let got = recipe.materialize();
            let scale = want.abs().max().double_value(&[]);
            let diff = max_abs_diff(&got, &want) / scale;
            assert!(diff < 1e-9, "{name}: differs from autograd by {diff:e}");
            let norms = want
                .square()
                .flatten(1, -1)
                .sum_dim_intlist(1, false, Kind::Double);
            let diff = max_abs_diff(&recipe.squared_norms(), &norms) / (scale * scale);
            assert!(diff < 1e-9, "{name}: squared norms differ by {diff:e}");
            let c = Tensor::from_slice(&[0.5f64, -1.0, 2.0]);
            let mut shape = vec![1i64; want.dim()];
            shape[0] = batch;
            let want_sum =
                (want * c.view(shape.as_slice())).sum_dim_intlist(0, false, Kind::Double);
            let diff = max_abs_diff(&recipe.weighted_sum(&c), &want_sum) / scale;
            assert!(diff < 1e-9, "{name}: weighted sums differ by {diff:e}");
        }
    }
}

/// A copy of `gpt2-cls` in a temporary folder, with `change` applied to its tensors and
/// `config` to its config.json.
fn changed_copy(
    change: impl Fn(&mut Vec<(String, Tensor)>),
    config: impl Fn(&mut serde_json::Value),
) -> tempfile::TempDir {
    let source = fixture("gpt2-cls");
    let dir = tempfile::tempdir().unwrap();
    let mut tensors: Vec<(String, Tensor)> =
        Tensor::read_safetensors(source.join("model.safetensors")).unwrap();
    change(&mut tensors);
    hf::write_safetensors(&dir.path().join("model.safetensors"), &tensors).unwrap();
    let text = std::fs::read_to_string(source.join("config.json")).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    config(&mut json);
    std::fs::write(dir.path().join("config.json"), json.to_string()).unwrap();
    dir
}

fn load_error(dir: &Path, fine_tuning: &FineTuning) -> String {
    let head = Head::SequenceClassification { classes: CLASSES };
    match Gpt2::from_pretrained(dir, Device::Cpu, head, fine_tuning) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_folders_and_modes_are_named() {
    let _serial = common::serial();
    let missing = changed_copy(
        |t| t.retain(|(n, _)| n != "transformer.h.1.mlp.c_fc.bias"),
        |_| {},
    );
    let error = load_error(missing.path(), &FineTuning::Full);
    assert!(
        error.contains("missing tensor transformer.h.1.mlp.c_fc.bias"),
        "{error}"
    );

    // A Conv1D weight stored [out, in] (nn.Linear's layout) rather than [in, out].
    let transposed = changed_copy(
        |t| {
            for (name, tensor) in t.iter_mut() {
                if name == "transformer.h.0.attn.c_attn.weight" {
                    *tensor = tensor.tr().contiguous();
                }
            }
        },
        |_| {},
    );
    let error = load_error(transposed.path(), &FineTuning::Full);
    assert!(
        error.contains("transformer.h.0.attn.c_attn.weight: shape [96, 32], expected [32, 96]"),
        "{error}"
    );

    let relu = changed_copy(|_| {}, |c| c["activation_function"] = "relu".into());
    let error = load_error(relu.path(), &FineTuning::Full);
    assert!(error.contains("config.json"), "{error}");
    assert!(
        error.contains("activation_function \"relu\": only \"gelu_new\" is supported"),
        "{error}"
    );

    let inverse = changed_copy(
        |_| {},
        |c| c["scale_attn_by_inverse_layer_idx"] = true.into(),
    );
    let error = load_error(inverse.path(), &FineTuning::Full);
    assert!(error.contains("scale_attn_by_inverse_layer_idx"), "{error}");

    let heads = changed_copy(|_| {}, |c| c["n_head"] = 5.into());
    let error = load_error(heads.path(), &FineTuning::Full);
    assert!(
        error.contains("n_head 5: expected a divisor of n_embd 32"),
        "{error}"
    );

    let error = load_error(&fixture("gpt2-cls"), &FineTuning::LastLayers { layers: 99 });
    assert!(
        error.contains("fine_tuning.layers: 99, expected 1 to 2"),
        "{error}"
    );

    // A head of another number of classes than the checkpoint's score.
    let head = Head::SequenceClassification { classes: 5 };
    let error =
        match Gpt2::from_pretrained(&fixture("gpt2-cls"), Device::Cpu, head, &FineTuning::Full) {
            Ok(_) => panic!("5 classes loaded"),
            Err(e) => e.to_string(),
        };
    assert!(
        error.contains("score.weight: shape [3, 32], expected [5, 32]"),
        "{error}"
    );
}

#[test]
fn bad_batches_are_refused() {
    let _serial = common::serial();
    let model = classifier(&FineTuning::Full);
    let batch = |ids: Vec<i64>, t: i64, lengths: Vec<i64>| Features::Tokens {
        ids: Tensor::from_slice(&ids).view([-1, t]),
        lengths: Tensor::from_slice(&lengths),
    };
    let error = model
        .check_features(&batch(vec![1, 2, 100, 4], 2, vec![2, 2]))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("token ids range from 1 to 100, expected 0 to 99"),
        "{error}"
    );
    let error = model
        .check_features(&batch(vec![1, 2, 3, 4], 2, vec![2, 3]))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("lengths range from 2 to 3, expected 1 to 2"),
        "{error}"
    );
    let error = model
        .check_features(&batch(vec![1, 2, 3, 4], 2, vec![0, 2]))
        .unwrap_err()
        .to_string();
    assert!(error.contains("lengths range from 0 to 2"), "{error}");
    let long = batch(vec![1; 65], 65, vec![65]);
    let error = model
        .forward(&long, &mut Ctx::eval())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("65 tokens, expected 1 to 64 (n_positions)"),
        "{error}"
    );
    let images = Features::Images(Tensor::zeros([1, 3, 32, 32], (Kind::Float, Device::Cpu)));
    assert!(model.forward(&images, &mut Ctx::eval()).is_err());
}

#[test]
fn configs_made_in_code_fill_in_transformers_defaults() {
    let config: Gpt2Config = serde_json::from_str(
        r#"{"vocab_size": 50, "n_positions": 16, "n_embd": 8, "n_layer": 1, "n_head": 2}"#,
    )
    .unwrap();
    assert_eq!(config.inner(), 32);
    assert_eq!(config.activation_function, "gelu_new");
    assert!(config.scale_attn_weights);
    let model = Gpt2::new(config.clone(), Device::Cpu, Head::CausalLm, None).unwrap();
    // wte, wpe, ln_f and one block (two norms, four projections with biases).
    assert_eq!(
        model.parameter_count(),
        50 * 8
            + 16 * 8
            + 2 * 8
            + 2 * 2 * 8
            + (8 * 24 + 24)
            + (8 * 8 + 8)
            + (8 * 32 + 32)
            + (32 * 8 + 8)
    );
    let hf = model.hf_config();
    assert_eq!(hf["architectures"], serde_json::json!(["GPT2LMHeadModel"]));
    assert_eq!(hf["model_type"], "gpt2");
    assert_eq!(hf["n_embd"], 8);
    let mut bad = config;
    bad.resid_pdrop = 1.0;
    let error = Gpt2::new(bad, Device::Cpu, Head::CausalLm, None)
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("resid_pdrop 1: expected a probability in [0, 1)"),
        "{error}"
    );
}

/// Writes `model`'s logits on `features` (`ids` padded as the checkpoint pads) as a reference
/// file in `dir`: input_ids, attention_mask, logits.
fn write_reference(dir: &Path, model: &Gpt2, features: &Features) -> PathBuf {
    let Features::Tokens { ids, lengths } = features else {
        unreachable!()
    };
    let steps = ids.size()[1];
    let mask = Tensor::arange(steps, (Kind::Int64, Device::Cpu))
        .unsqueeze(0)
        .lt_tensor(&lengths.unsqueeze(1))
        .to_kind(Kind::Int64);
    let logits = model.forward(features, &mut Ctx::eval()).unwrap();
    let reference = dir.join("reference.safetensors");
    hf::write_safetensors(
        &reference,
        &[
            ("input_ids".into(), ids.to_kind(Kind::Int64)),
            ("attention_mask".into(), mask),
            ("logits".into(), logits),
        ],
    )
    .unwrap();
    reference
}

/// `scripts/hf_reference.py check`: transformers' logits of `model_dir` (with the PEFT
/// `adapter` on it) on the reference's inputs, minus the reference's logits.
fn python_check(model_dir: &Path, reference: &Path, adapter: Option<&Path>) -> f64 {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/hf_reference.py");
    let mut command = std::process::Command::new(common::venv_python());
    command
        .arg(script)
        .arg("check")
        .arg("--model")
        .arg(model_dir)
        .arg("--reference")
        .arg(reference)
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1");
    if let Some(adapter) = adapter {
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

/// Writes `model`'s export (`hf_tensors`, `hf_config`) with `hf::write_safetensors` and a
/// reference of its own logits, and returns transformers' logits of the export minus ours.
fn transformers_diff(model: &Gpt2, features: &Features) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let model_dir = dir.path().join("model");
    std::fs::create_dir(&model_dir).unwrap();
    hf::write_safetensors(&model_dir.join("model.safetensors"), &model.hf_tensors()).unwrap();
    let config = serde_json::to_string_pretty(&model.hf_config()).unwrap();
    std::fs::write(model_dir.join("config.json"), config).unwrap();
    let reference = write_reference(dir.path(), model, features);
    python_check(&model_dir, &reference, None)
}

#[test]
fn the_export_loads_in_transformers_with_the_same_logits() {
    let _serial = common::serial();
    tch::manual_seed(13);
    // The classifier with trained LoRA adapters on c_attn and c_fc, merged on export.
    let lora = LoraConfig {
        rank: 2,
        alpha: 4.0,
        dropout: 0.0,
        target_modules: vec!["c_attn".into(), "c_fc".into()],
    };
    let model = classifier(&FineTuning::Lora(lora));
    let (features, _) = oracle_batch();
    let before = model.forward(&features, &mut Ctx::eval()).unwrap();
    perturb_adapters(&model);
    let after = model.forward(&features, &mut Ctx::eval()).unwrap();
    assert!(
        max_abs_diff(&before, &after) > 1e-3,
        "the adapters change the logits"
    );
    // The export holds what save_pretrained writes: the checkpoint's names, no adapters.
    let mut exported: Vec<String> = model.hf_tensors().into_iter().map(|(n, _)| n).collect();
    let mut stored: Vec<String> =
        Tensor::read_safetensors(fixture("gpt2-cls").join("model.safetensors"))
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
    exported.sort();
    stored.sort();
    assert_eq!(exported, stored);
    let diff = transformers_diff(&model, &features);
    assert!(
        diff < 1e-5,
        "classifier: transformers' logits differ by {diff:e}"
    );

    // The language model, its (tied) token table and a block changed: no lm_head.weight written.
    let dir = fixture("gpt2");
    let model =
        Gpt2::from_pretrained(&dir, Device::Cpu, Head::CausalLm, &FineTuning::Full).unwrap();
    tch::no_grad(|| {
        let _ = model.wte.weight.shallow_clone().normal_(0.0, 0.3);
        let _ = model.blocks[1]
            .c_fc
            .base
            .weight
            .shallow_clone()
            .normal_(0.0, 0.3);
    });
    let names: Vec<String> = model.hf_tensors().into_iter().map(|(n, _)| n).collect();
    assert!(!names.iter().any(|n| n.starts_with("lm_head")));
    let features = tokens(&reference(&dir.join("reference.safetensors")));
    let diff = transformers_diff(&model, &features);
    assert!(
        diff < 1e-5,
        "language model: transformers' logits differ by {diff:e}"
    );
}

/// B drawn away from zero, as training leaves it.
fn perturb_adapters(model: &Gpt2) {
    for projection in model.projections() {
        if let Some(adapter) = &projection.adapter {
            tch::no_grad(|| {
                let _ = adapter.b.weight.shallow_clone().normal_(0.0, 0.3);
            });
        }
    }
}

/// `hf::save_pretrained` and `hf::save_adapter` on GPT-2: the merged folder loads in
/// transformers and in dpcomp, and the PEFT adapter (`fan_in_fan_out`, the trained `score` as
/// `modules_to_save`) on the pre-trained folder gives the same logits in peft.
#[test]
fn saved_folder_and_peft_adapter_give_the_same_logits() {
    let _serial = common::serial();
    tch::manual_seed(14);
    let base = fixture("gpt2-cls");
    let lora = LoraConfig {
        rank: 2,
        alpha: 4.0,
        dropout: 0.0,
        target_modules: vec!["c_attn".into(), "mlp.c_proj".into()],
    };
    let model = classifier(&FineTuning::Lora(lora));
    perturb_adapters(&model);
    tch::no_grad(|| {
        let _ = model
            .score
            .as_ref()
            .unwrap()
            .weight
            .shallow_clone()
            .normal_(0.0, 0.3);
    });
    let (features, _) = oracle_batch();
    let out = tempfile::tempdir().unwrap();
    let reference = write_reference(out.path(), &model, &features);
    let ours = model.forward(&features, &mut Ctx::eval()).unwrap();

    let merged = out.path().join("merged");
    hf::save_pretrained(&model, &merged).unwrap();
    let diff = python_check(&merged, &reference, None);
    assert!(diff < 1e-5, "merged folder: logits differ by {diff:e}");
    let head = Head::SequenceClassification { classes: CLASSES };
    let again = Gpt2::from_pretrained(&merged, Device::Cpu, head, &FineTuning::Full).unwrap();
    let diff = max_abs_diff(&again.forward(&features, &mut Ctx::eval()).unwrap(), &ours);
    assert!(diff < 1e-5, "dpcomp reads its export back: {diff:e}");

    let adapter = out.path().join("adapter");
    hf::save_adapter(&model, &adapter, base.to_str()).unwrap();
    let diff = python_check(&base, &reference, Some(&adapter));
    assert!(diff < 1e-5, "PEFT adapter: logits differ by {diff:e}");
}
