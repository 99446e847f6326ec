//! Parameter counts and forward shapes of the four models.

mod common;

use dpcomp::data::Features;
use dpcomp::models::{BertClassifier, BertConfig, CifarCnn, Model, ResNet18, SurnamesLstm};
use dpcomp::nn::Ctx;
use tch::{Device, Kind, Tensor};

#[test]
fn surnames_lstm_has_118034_parameters_and_reads_last_real_step() {
    tch::manual_seed(0);
    let model = SurnamesLstm::new(Device::Cpu, 18);
    assert_eq!(model.parameter_count(), 118_034);
    assert_eq!(model.trainable_parameter_count(), 118_034);
    let ids = Tensor::randint_low(97, 123, [4, 7], (Kind::Int64, Device::Cpu));
    let lengths = Tensor::from_slice(&[7i64, 3, 1, 5]);
    let logits = model.forward(
        &Features::Tokens {
            ids: ids.shallow_clone(),
            lengths: lengths.shallow_clone(),
        },
        &mut Ctx::eval(),
    );
    assert_eq!(logits.size(), vec![4, 18]);
    // Padding beyond the true length must not change the output: garble it and compare.
    let garbled = ids.copy();
    let _ = garbled.narrow(1, 5, 2).fill_(0);
    let _ = garbled.narrow(0, 1, 1).narrow(1, 3, 4).fill_(200);
    let again = model.forward(
        &Features::Tokens {
            ids: garbled,
            lengths,
        },
        &mut Ctx::eval(),
    );
    let rows = Tensor::from_slice(&[1i64, 2, 3]);
    let diff = (logits.index_select(0, &rows) - again.index_select(0, &rows))
        .abs()
        .max()
        .double_value(&[]);
    assert!(diff < 1e-6, "padding changed the logits by {diff}");
}

#[test]
fn cifar_cnn_has_the_papers_361290_parameters() {
    let model = CifarCnn::new(Device::Cpu, 10);
    assert_eq!(model.parameter_count(), 361_290);
    assert_eq!(model.trainable_parameter_count(), 361_290);
    // The paper's uncompressed CIFAR-10 bandwidth: 64 bits per element, 391 steps x 100 epochs.
    let gib = 361_290.0 * 64.0 * 39_100.0 / 8.0 / (1u64 << 30) as f64;
    assert_eq!(format!("{gib:.2}"), "105.25");
    // And its noise error m σ² C² / B² at σ 0.8, C 5, B 128 (the paper: 353.0).
    let noise = 361_290.0 * 0.64 * 25.0 / (128.0 * 128.0);
    assert!((noise - 353.0f64).abs() < 0.5, "{noise}");
    let xs = Tensor::randn([3, 3, 32, 32], (Kind::Float, Device::Cpu));
    assert_eq!(
        model
            .forward(&Features::Images(xs), &mut Ctx::train())
            .size(),
        vec![3, 10]
    );
}

#[test]
fn resnet18_groupnorm_with_2x2_pool() {
    let model = ResNet18::new(Device::Cpu, 100);
    // 11,168,832 in the residual trunk + 2048 * 100 + 100 in the classifier.
    assert_eq!(model.parameter_count(), 11_373_732);
    assert_eq!(model.classifier.weight.size(), vec![100, 2048]);
    let xs = Tensor::randn([2, 3, 32, 32], (Kind::Float, Device::Cpu));
    assert_eq!(
        model
            .forward(&Features::Images(xs), &mut Ctx::eval())
            .size(),
        vec![2, 100]
    );
}

fn tiny_bert_config() -> BertConfig {
    serde_json::from_str(
        r#"{"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 3, "num_attention_heads": 4,
            "intermediate_size": 32, "max_position_embeddings": 20}"#,
    )
    .unwrap()
}

#[test]
fn bert_trains_only_last_layer_pooler_and_classifier() {
    let model = BertClassifier::new(Device::Cpu, tiny_bert_config(), 3);
    let trainable: Vec<String> = model
        .trainable_variables()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(!trainable.is_empty());
    for name in &trainable {
        assert!(
            name.starts_with("encoder.layer.2.")
                || name.starts_with("pooler.")
                || name.starts_with("classifier."),
            "{name} should be frozen"
        );
    }
    // Last layer: 4 linear (16x16+16) + 2 LayerNorm (32) + intermediate (16*32+32) + output (32*16+16).
    let last_layer = 4 * (16 * 16 + 16) + 2 * 32 + (16 * 32 + 32) + (32 * 16 + 16);
    let pooler = 16 * 16 + 16;
    let classifier = 3 * 16 + 3;
    assert_eq!(
        model.trainable_parameter_count(),
        (last_layer + pooler + classifier) as i64
    );

    let ids = Tensor::from_slice(&[2i64, 5, 7, 3, 9, 3, 2, 6, 3, 0, 0, 0]).view([2, 6]);
    let token_types = Tensor::from_slice(&[0i64, 0, 0, 0, 1, 1, 0, 0, 1, 0, 0, 0]).view([2, 6]);
    let attention_mask = Tensor::from_slice(&[1i64, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0]).view([2, 6]);
    let mut ctx = Ctx::train();
    let logits = model.forward(
        &Features::TextPair {
            ids,
            token_types,
            attention_mask,
        },
        &mut ctx,
    );
    assert_eq!(logits.size(), vec![2, 3]);
    // Frozen parts run without autograd: after backward only trainable tensors have gradients.
    ctx.backward(&logits.sum(Kind::Float));
    for (name, var) in model.var_store().variables() {
        assert_eq!(var.grad().defined(), var.requires_grad(), "{name}");
    }
}
