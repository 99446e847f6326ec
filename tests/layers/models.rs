//! Parameter counts and forward shapes of the four models.

use crate::common;
use dpcomp::data::Features;
use dpcomp::models::{BertClassifier, BertConfig, CifarCnn, Model, ResNet18, SurnamesLstm};
use dpcomp::nn::Ctx;
use tch::{Device, Kind, Tensor};

#[test]
fn surnames_lstm_has_118034_parameters_and_reads_last_real_step() {
    let _serial = common::serial();
    tch::manual_seed(0);
    let model = SurnamesLstm::new(Device::Cpu, 18).unwrap();
    assert_eq!(model.parameter_count(), 118_034);
    assert_eq!(model.trainable_parameter_count(), 118_034);
    let ids = Tensor::randint_low(97, 123, [4, 7], (Kind::Int64, Device::Cpu));
    let lengths = Tensor::from_slice(&[7i64, 3, 1, 5]);
    let logits = model
        .forward(
            &Features::Tokens {
                ids: ids.shallow_clone(),
                lengths: lengths.shallow_clone(),
            },
            &mut Ctx::eval(),
        )
        .unwrap();
    assert_eq!(logits.size(), vec![4, 18]);
    // Padding beyond the true length must not change the output: garble it and compare.
    let garbled = ids.copy();
    let _ = garbled.narrow(1, 5, 2).fill_(0);
    let _ = garbled.narrow(0, 1, 1).narrow(1, 3, 4).fill_(200);
    let again = model
        .forward(
            &Features::Tokens {
                ids: garbled,
                lengths,
            },
            &mut Ctx::eval(),
        )
        .unwrap();
    let rows = Tensor::from_slice(&[1i64, 2, 3]);
    let diff = (logits.index_select(0, &rows) - again.index_select(0, &rows))
        .abs()
        .max()
        .double_value(&[]);
    assert!(diff < 1e-6, "padding changed the logits by {diff}");
}

#[test]
fn cifar_cnn_has_the_papers_361290_parameters() {
    let _serial = common::serial();
    let model = CifarCnn::new(Device::Cpu, 10).unwrap();
    assert_eq!(model.parameter_count(), 361_290);
    assert_eq!(model.trainable_parameter_count(), 361_290);
    // The paper's uncompressed CIFAR-10 bandwidth: 64 bits per element, 391 steps x 100 epochs.
    let m = model.trainable_parameter_count();
    let gib = dpcomp::compress::message::paper_gib(m as u64 * 64 * 39_100);
    assert_eq!(format!("{gib:.2}"), "105.25");
    // And its noise error m σ² C² / B² at σ 0.8, C 5, B 128 (the paper: 353.0).
    let noise = m as f64 * 0.64 * 25.0 / (128.0 * 128.0);
    assert!((noise - 353.0f64).abs() < 0.5, "{noise}");
    let xs = Tensor::randn([3, 3, 32, 32], (Kind::Float, Device::Cpu));
    assert_eq!(
        model
            .forward(&Features::Images(xs), &mut Ctx::train())
            .unwrap()
            .size(),
        vec![3, 10]
    );
}

#[test]
fn resnet18_groupnorm_with_2x2_pool() {
    let _serial = common::serial();
    let model = ResNet18::new(Device::Cpu, 100).unwrap();
    // 11,168,832 in the residual trunk + 2048 * 100 + 100 in the classifier.
    assert_eq!(model.parameter_count(), 11_373_732);
    assert_eq!(model.classifier.weight.size(), vec![100, 2048]);
    let xs = Tensor::randn([2, 3, 32, 32], (Kind::Float, Device::Cpu));
    assert_eq!(
        model
            .forward(&Features::Images(xs), &mut Ctx::eval())
            .unwrap()
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
    let _serial = common::serial();
    let model = BertClassifier::new(Device::Cpu, tiny_bert_config(), 3).unwrap();
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
    let logits = model
        .forward(
            &Features::TextPair {
                ids,
                token_types,
                attention_mask,
            },
            &mut ctx,
        )
        .unwrap();
    assert_eq!(logits.size(), vec![2, 3]);
    // Frozen parts run without autograd: after backward only trainable tensors have gradients.
    ctx.backward(&logits.sum(Kind::Float));
    for (name, var) in model.var_store().variables() {
        assert_eq!(var.grad().defined(), var.requires_grad(), "{name}");
    }
}

/// Features a model cannot read are errors naming the model and what it expected, never a
/// LibTorch abort: the wrong kind, the wrong shape, ids outside the embedding tables, sequences
/// longer than the position table, labels outside the classes.
#[test]
fn inputs_a_model_cannot_read_are_errors_not_panics() {
    let _serial = common::serial();
    tch::manual_seed(0);
    let message = |r: dpcomp::error::Result<Tensor>| r.expect_err("accepted").to_string();
    let images = |size: &[i64]| Features::Images(Tensor::zeros(size, (Kind::Float, Device::Cpu)));
    let tokens = |ids: &[i64], lengths: &[i64]| Features::Tokens {
        ids: Tensor::from_slice(ids).view([lengths.len() as i64, -1]),
        lengths: Tensor::from_slice(lengths),
    };

    let lstm = SurnamesLstm::new(Device::Cpu, 18).unwrap();
    let err = message(lstm.forward(&images(&[2, 3, 32, 32]), &mut Ctx::eval()));
    assert!(
        err.contains("SurnamesLstm input: given images, expected token sequences"),
        "{err}"
    );
    let mismatched = Features::Tokens {
        ids: Tensor::zeros([2, 2], (Kind::Int64, Device::Cpu)),
        lengths: Tensor::from_slice(&[1i64, 1, 1]),
    };
    let err = message(lstm.forward(&mismatched, &mut Ctx::eval()));
    assert!(
        err.contains("expected [batch, length] and [batch]"),
        "{err}"
    );
    let err = lstm
        .check_features(&tokens(&[65, 300, 66, 0], &[2, 1]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("token ids range from 0 to 300, expected 0 to 255"),
        "{err}"
    );
    let err = lstm
        .check_features(&tokens(&[65, 66, 66, 0], &[2, 3]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("lengths range from 2 to 3, expected 1 to 2"),
        "{err}"
    );
    lstm.check_features(&tokens(&[65, 66, 66, 0], &[2, 1]))
        .unwrap();

    let cnn = CifarCnn::new(Device::Cpu, 10).unwrap();
    let err = message(cnn.forward(&images(&[2, 3, 28, 28]), &mut Ctx::eval()));
    assert!(
        err.contains("images of shape [2, 3, 28, 28], expected [batch, 3, 32, 32]"),
        "{err}"
    );
    let err = message(cnn.forward(&tokens(&[1, 2], &[2]), &mut Ctx::eval()));
    assert!(
        err.contains("CifarCnn input: given token sequences, expected images"),
        "{err}"
    );
    let resnet = ResNet18::new(Device::Cpu, 100).unwrap();
    let err = message(resnet.forward(&images(&[2, 1, 32, 32]), &mut Ctx::eval()));
    assert!(err.contains("ResNet18 input"), "{err}");

    let bert = BertClassifier::new(Device::Cpu, tiny_bert_config(), 3).unwrap();
    let pair = |ids: Tensor, types: Tensor| Features::TextPair {
        attention_mask: ids.ones_like(),
        ids,
        token_types: types,
    };
    let long = Tensor::ones([1, 21], (Kind::Int64, Device::Cpu));
    let err = message(bert.forward(&pair(long.copy(), long.zeros_like()), &mut Ctx::eval()));
    assert!(
        err.contains("sequences of 21 tokens, longer than the model's 20 positions"),
        "{err}"
    );
    let ids = Tensor::from_slice(&[2i64, 50, 3]).view([1, 3]);
    let err = bert
        .check_features(&pair(ids.copy(), ids.zeros_like()))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("token ids range from 2 to 50, expected 0 to 49"),
        "{err}"
    );
    let ids = Tensor::from_slice(&[2i64, 5, 3]).view([1, 3]);
    let err = bert
        .check_features(&pair(ids.copy(), ids.ones_like() * 2))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("token type ids range from 2 to 2, expected 0 to 1"),
        "{err}"
    );
    bert.check_features(&pair(ids.copy(), ids.zeros_like()))
        .unwrap();
    let err = message(bert.forward(&images(&[1, 3, 32, 32]), &mut Ctx::eval()));
    assert!(
        err.contains("BertClassifier input: given images, expected sentence pairs"),
        "{err}"
    );

    let err = dpcomp::models::check_labels(&Tensor::from_slice(&[0i64, 18, 3]), 18)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("labels range from 0 to 18, expected 0 to 17"),
        "{err}"
    );
    dpcomp::models::check_labels(&Tensor::from_slice(&[0i64, 17, 3]), 18).unwrap();
}
