//! The BERT encoder loaded from all-MiniLM-L6-v2 against hidden states that Hugging Face
//! `transformers` produced from the same files (models/bert_reference.py made
//! tests/fixtures/bert_reference.json), to 1e-4; and our tokenizer against its token ids.

use crate::common;
use dpcomp::data::{snli, Features};
use dpcomp::models::{BertClassifier, Model};
use dpcomp::nn::Ctx;
use serde_json::Value;
use tch::{Device, Kind, Tensor};

fn reference() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/bert_reference.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn int_matrix(v: &Value) -> Tensor {
    let rows: Vec<Vec<i64>> = serde_json::from_value(v.clone()).unwrap();
    let width = rows[0].len() as i64;
    Tensor::from_slice(&rows.concat()).view([-1, width])
}

fn max_abs_diff(ours: &Tensor, expected: &Value) -> f64 {
    let flat: Vec<f64> = expected
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| match row {
            Value::Array(inner) if inner.first().is_some_and(Value::is_array) => inner
                .iter()
                .flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
                .collect::<Vec<_>>(),
            Value::Array(inner) => inner.iter().map(|x| x.as_f64().unwrap()).collect(),
            x => vec![x.as_f64().unwrap()],
        })
        .collect();
    let ours: Vec<f64> = Vec::try_from(&ours.to_kind(Kind::Double).view(-1)).unwrap();
    assert_eq!(ours.len(), flat.len(), "element count");
    // f64::max ignores NaN: a NaN difference counts as infinitely far.
    ours.iter()
        .zip(&flat)
        .map(|(a, b)| (a - b).abs())
        .map(|d| if d.is_nan() { f64::INFINITY } else { d })
        .fold(0.0, f64::max)
}

#[test]
fn minilm_hidden_states_match_transformers() {
    // Building layers draws from LibTorch's global generator, which the seeded tests of
    // this binary hold: draw only under the same lock.
    let _serial = crate::common::serial();
    let reference = reference();
    let model = BertClassifier::from_pretrained(&common::bert_dir(), Device::Cpu, 3).unwrap();
    let ids = int_matrix(&reference["input_ids"]);
    let types = int_matrix(&reference["token_type_ids"]);
    let mask = int_matrix(&reference["attention_mask"]);

    // Our tokenizer gives the same ids, segments and mask for the same pairs.
    let pairs: Vec<snli::Pair> = reference["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| snli::Pair {
            premise: p[0].as_str().unwrap().into(),
            hypothesis: p[1].as_str().unwrap().into(),
            label: 0,
        })
        .collect();
    let tokenizer = snli::load_tokenizer(&common::bert_dir(), 128).unwrap();
    let Features::TextPair {
        ids: our_ids,
        token_types: our_types,
        attention_mask: our_mask,
    } = snli::encode(&tokenizer, &pairs).unwrap()
    else {
        panic!()
    };
    assert!(our_ids.equal(&ids) && our_types.equal(&types) && our_mask.equal(&mask));

    let hidden = tch::no_grad(|| model.encode(&ids, &types, &mask, &mut Ctx::eval())).unwrap();
    let lengths: Vec<i64> = Vec::try_from(&mask.sum_dim_intlist(1, false, Kind::Int64)).unwrap();
    for (i, &n) in lengths.iter().enumerate() {
        let real = hidden.get(i as i64).narrow(0, 0, n);
        let first16 = max_abs_diff(
            &real.narrow(1, 0, 16),
            &reference["last_hidden_state_first16"][i],
        );
        let mean = max_abs_diff(
            &real.mean_dim(0, false, Kind::Float),
            &reference["last_hidden_state_mean"][i],
        );
        assert!(
            first16 < 1e-4,
            "pair {i}: hidden states differ by {first16}"
        );
        assert!(mean < 1e-4, "pair {i}: mean hidden state differs by {mean}");
    }
    let pooled = tch::no_grad(|| {
        model
            .pooler
            .as_ref()
            .unwrap()
            .forward(&hidden.select(1, 0), &mut Ctx::eval())
            .unwrap()
            .tanh()
    });
    let diff = max_abs_diff(
        &pooled.narrow(1, 0, 16),
        &reference["pooler_output_first16"],
    );
    assert!(diff < 1e-4, "pooler output differs by {diff}");
    assert!(model.parameter_count() > model.trainable_parameter_count());
}

#[test]
fn bert_prefixed_checkpoints_load_too() {
    // Building layers draws from LibTorch's global generator, which the seeded tests of
    // this binary hold: draw only under the same lock.
    let _serial = crate::common::serial();
    // bert-base-cased names its tensors `bert.*` and may carry an MLM head: write such a copy of
    // the MiniLM weights and check it loads to the same encoder.
    let dir = tempfile::tempdir().unwrap();
    let src = common::bert_dir();
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
    let tensors = Tensor::read_safetensors(src.join("model.safetensors")).unwrap();
    let mut renamed: Vec<(String, Tensor)> = tensors
        .into_iter()
        .map(|(n, t)| (format!("bert.{n}"), t))
        .collect();
    renamed.push((
        "cls.predictions.bias".into(),
        Tensor::zeros([4], (Kind::Float, Device::Cpu)),
    ));
    Tensor::write_safetensors(&renamed, dir.path().join("model.safetensors")).unwrap();
    let a = BertClassifier::from_pretrained(&src, Device::Cpu, 3).unwrap();
    let b = BertClassifier::from_pretrained(dir.path(), Device::Cpu, 3).unwrap();
    let (va, vb) = (a.var_store().variables(), b.var_store().variables());
    for (name, t) in &va {
        if !name.starts_with("classifier.") {
            assert!(t.equal(&vb[name]), "{name}");
        }
    }
    // A missing tensor is a clear error naming it.
    let kept: Vec<(String, Tensor)> = renamed
        .into_iter()
        .filter(|(n, _)| !n.contains("layer.3.output.dense.bias"))
        .collect();
    Tensor::write_safetensors(&kept, dir.path().join("model.safetensors")).unwrap();
    let err = BertClassifier::from_pretrained(dir.path(), Device::Cpu, 3)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("missing tensor encoder.layer.3.output.dense.bias"),
        "{err}"
    );
}
