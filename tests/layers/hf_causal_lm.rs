//! Causal language modelling with the Hugging Face decoders: one example is one sequence, its
//! loss the mean cross-entropy of its next tokens over its real positions (padding masked), and
//! the per-sample gradients of that loss equal per-example autograd for GPT-2 and Llama in the
//! fine-tuning modes a language model trains in.

use crate::common;
use dpcomp::data::Features;
use dpcomp::hf::{
    next_token_accuracy_sum, next_token_losses, FineTuning, Gpt2, Head, Llama, Pretrained,
};
use dpcomp::models::Model;
use dpcomp::nn::{Ctx, LoraConfig};
use tch::{Device, Kind, Tensor};

/// Four right-padded sequences of 7 positions (lengths 7, 5, 2, 1), tokens 3..=90, padding 0.
fn sequences() -> Features {
    let lengths = [7i64, 5, 2, 1];
    let mut ids = Vec::new();
    for (row, &length) in lengths.iter().enumerate() {
        for t in 0..7i64 {
            ids.push(if t < length {
                3 + (row as i64 * 13 + t * 29) % 88
            } else {
                0
            });
        }
    }
    Features::Tokens {
        ids: Tensor::from_slice(&ids).view([4, 7]),
        lengths: Tensor::from_slice(&lengths),
    }
}

fn lora(targets: &[&str]) -> FineTuning {
    FineTuning::Lora(LoraConfig {
        rank: 2,
        alpha: 4.0,
        dropout: 0.0,
        target_modules: targets.iter().map(|t| t.to_string()).collect(),
    })
}

fn perturb_adapters(model: &dyn Pretrained) {
    for projection in model.projections() {
        if let Some(adapter) = &projection.adapter {
            let _ = tch::no_grad(|| adapter.b.weight.shallow_clone().normal_(0.0, 0.05));
        }
    }
}

#[test]
fn the_loss_is_each_sequences_mean_next_token_cross_entropy() {
    let _serial = common::serial();
    tch::manual_seed(11);
    let Features::Tokens { ids, lengths } = sequences() else {
        unreachable!()
    };
    let logits = Tensor::randn([4, 7, 91], (Kind::Double, Device::Cpu));
    let losses = next_token_losses(&logits, &ids, &lengths);
    let log_p = logits.log_softmax(-1, Kind::Double);
    let mut hits_total = 0.0;
    for (row, length) in [7i64, 5, 2, 1].into_iter().enumerate() {
        let row = row as i64;
        let mut sum = 0.0;
        let mut hits = 0.0;
        for t in 0..length - 1 {
            let next = ids.int64_value(&[row, t + 1]);
            sum -= log_p.double_value(&[row, t, next]);
            let predicted = logits.get(row).get(t).argmax(0, false).int64_value(&[]);
            hits += f64::from(u8::from(predicted == next));
        }
        let expected = if length > 1 {
            sum / (length - 1) as f64
        } else {
            0.0
        };
        let got = losses.double_value(&[row]);
        assert!(
            (got - expected).abs() < 1e-12,
            "row {row}: {got} vs {expected}"
        );
        hits_total += if length > 1 {
            hits / (length - 1) as f64
        } else {
            0.0
        };
    }
    let accuracy = next_token_accuracy_sum(&logits, &ids, &lengths).double_value(&[]);
    assert!((accuracy - hits_total).abs() < 1e-12);
}

#[test]
fn gpt2_language_model_per_sample_gradients_equal_per_example_autograd() {
    let _serial = common::serial();
    let dir = common::hf_fixtures().join("gpt2");
    for (k, mode) in [
        lora(&["c_attn", "c_fc"]),
        FineTuning::LastLayers { layers: 1 },
    ]
    .into_iter()
    .enumerate()
    {
        tch::manual_seed(20 + k as i64);
        let model = Gpt2::from_pretrained(&dir, Device::Cpu, Head::CausalLm, &mode).unwrap();
        perturb_adapters(&model);
        common::to_double(model.var_store());
        assert!(crate::grad_sample::run(
            &model,
            sequences(),
            Tensor::zeros([4], (Kind::Int64, Device::Cpu))
        ));
    }
}

#[test]
fn llama_language_model_per_sample_gradients_equal_per_example_autograd() {
    let _serial = common::serial();
    let dir = common::hf_fixtures().join("llama");
    for (k, mode) in [
        lora(&["q_proj", "v_proj", "down_proj"]),
        FineTuning::LastLayers { layers: 1 },
        FineTuning::Full,
    ]
    .into_iter()
    .enumerate()
    {
        tch::manual_seed(30 + k as i64);
        let model = Llama::from_pretrained(&dir, Device::Cpu, Head::CausalLm, &mode).unwrap();
        perturb_adapters(&model);
        common::to_double(model.var_store());
        assert!(crate::grad_sample::run(
            &model,
            sequences(),
            Tensor::zeros([4], (Kind::Int64, Device::Cpu))
        ));
    }
}

#[test]
fn a_language_models_reported_accuracy_is_its_next_token_accuracy() {
    let dir = common::hf_fixtures().join("gpt2");
    let model =
        Gpt2::from_pretrained(&dir, Device::Cpu, Head::CausalLm, &FineTuning::Full).unwrap();
    let features = sequences();
    let Features::Tokens { ids, lengths } = &features else {
        unreachable!()
    };
    let labels = Tensor::zeros([4], (Kind::Int64, Device::Cpu));
    let logits = tch::no_grad(|| model.forward(&features, &mut Ctx::eval()).unwrap());
    let mean = model
        .mean_loss(&logits, &features, &labels)
        .double_value(&[]);
    let each = next_token_losses(&logits, ids, lengths);
    assert!((mean - each.mean(Kind::Double).double_value(&[])).abs() < 1e-6);
    assert!(model
        .example_losses(&logits, &features, &labels)
        .equal(&each));
    assert_eq!(
        model.correct(&logits, &features, &labels).double_value(&[]),
        next_token_accuracy_sum(&logits, ids, lengths).double_value(&[])
    );
}
