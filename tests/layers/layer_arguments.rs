//! The layer constructors check their sizes as `Conv2d::new` does: a 0 or negative width, groups
//! that do not divide the channels or a LayerNorm eps that is not a finite positive number is an
//! `Error::BadValue` naming the layer, the argument, the value and what was expected, returned
//! before any parameter is created, not a panic in LibTorch or a layer of empty tensors. The
//! models built from them pass the error on.

use dpcomp::error::Error;
use dpcomp::fl::model::FlModel;
use dpcomp::models::bert::BertConfig;
use dpcomp::models::{BertClassifier, CifarCnn, Model, SurnamesLstm};
use dpcomp::nn::{
    Conv2d, Conv2dConfig, Embedding, GroupNorm, Gru, InstanceNorm2d, LayerNorm, Linear,
    LinearConfig, Lstm,
};
use tch::{nn, Device};

/// `result` is an `Error::BadValue` on `field` whose message is exactly `message`.
fn refused<T>(result: dpcomp::error::Result<T>, field: &str, message: &str) {
    match result {
        Err(error @ Error::BadValue { .. }) => {
            assert_eq!(error.to_string(), message);
            let Error::BadValue { field: named, .. } = &error else {
                unreachable!()
            };
            assert_eq!(named, field, "{message}");
        }
        Err(other) => panic!("expected the error {message:?}, got {other:?}"),
        Ok(_) => panic!("expected the error {message:?}, the constructor accepted it"),
    }
}

/// The store has no parameter: a refused constructor created none.
fn untouched(vs: &nn::VarStore) {
    let names: Vec<String> = vs.variables().into_keys().collect();
    assert!(names.is_empty(), "a refused constructor created {names:?}");
}

#[test]
fn linear_refuses_a_width_below_one() {
    // Building layers draws from LibTorch's global generator, which the seeded tests of
    // this binary hold: draw only under the same lock.
    let _serial = crate::common::serial();
    let vs = nn::VarStore::new(Device::Cpu);
    let p = vs.root();
    let config = LinearConfig::default();
    for (in_dim, out_dim, field, message) in [
        (
            0,
            3,
            "Linear in_dim",
            "Linear in_dim: 0, expected at least 1",
        ),
        (
            -2,
            3,
            "Linear in_dim",
            "Linear in_dim: -2, expected at least 1",
        ),
        (
            5,
            0,
            "Linear out_dim",
            "Linear out_dim: 0, expected at least 1",
        ),
        (
            5,
            -1,
            "Linear out_dim",
            "Linear out_dim: -1, expected at least 1",
        ),
        (
            0,
            0,
            "Linear in_dim",
            "Linear in_dim: 0, expected at least 1",
        ),
    ] {
        refused(Linear::new(&p, in_dim, out_dim, config), field, message);
    }
    untouched(&vs);
    let layer = Linear::new(&(&p / "good"), 5, 3, config).unwrap();
    assert_eq!(layer.weight.size(), [3, 5]);
    assert_eq!(layer.bias.as_ref().map(|b| b.size()), Some(vec![3]));
    let no_bias = LinearConfig { bias: false };
    let layer = Linear::new(&(&p / "one"), 1, 1, no_bias).unwrap();
    assert_eq!(
        (layer.weight.size(), layer.bias.is_none()),
        (vec![1, 1], true)
    );
}

#[test]
fn embedding_refuses_an_empty_table() {
    // Building layers draws from LibTorch's global generator, which the seeded tests of
    // this binary hold: draw only under the same lock.
    let _serial = crate::common::serial();
    let vs = nn::VarStore::new(Device::Cpu);
    let p = vs.root();
    for (num, dim, field, message) in [
        (
            0,
            4,
            "Embedding num",
            "Embedding num: 0, expected at least 1",
        ),
        (
            -1,
            4,
            "Embedding num",
            "Embedding num: -1, expected at least 1",
        ),
        (
            10,
            0,
            "Embedding dim",
            "Embedding dim: 0, expected at least 1",
        ),
        (
            10,
            -8,
            "Embedding dim",
            "Embedding dim: -8, expected at least 1",
        ),
    ] {
        refused(Embedding::new(&p, num, dim), field, message);
    }
    untouched(&vs);
    let table = Embedding::new(&(&p / "good"), 10, 4).unwrap();
    assert_eq!(table.weight.size(), [10, 4]);
}

#[test]
fn lstm_and_gru_refuse_a_width_below_one() {
    // Building layers draws from LibTorch's global generator, which the seeded tests of
    // this binary hold: draw only under the same lock.
    let _serial = crate::common::serial();
    let vs = nn::VarStore::new(Device::Cpu);
    let p = vs.root();
    for (input, hidden, argument, value) in [
        (0, 6, "input", 0),
        (-4, 6, "input", -4),
        (4, 0, "hidden", 0),
        (4, -3, "hidden", -3),
    ] {
        refused(
            Lstm::new(&p, input, hidden),
            &format!("Lstm {argument}"),
            &format!("Lstm {argument}: {value}, expected at least 1"),
        );
        refused(
            Gru::new(&p, input, hidden),
            &format!("Gru {argument}"),
            &format!("Gru {argument}: {value}, expected at least 1"),
        );
    }
    untouched(&vs);
    let lstm = Lstm::new(&(&p / "lstm"), 4, 6).unwrap();
    assert_eq!(
        (lstm.w_ih.size(), lstm.w_hh.size()),
        (vec![24, 4], vec![24, 6])
    );
    assert_eq!(lstm.hidden, 6);
    let gru = Gru::new(&(&p / "gru"), 4, 6).unwrap();
    assert_eq!(
        (gru.w_ih.size(), gru.w_hh.size()),
        (vec![18, 4], vec![18, 6])
    );
    assert_eq!(gru.hidden, 6);
}

#[test]
fn group_norm_refuses_groups_that_do_not_divide_the_channels() {
    // Building layers draws from LibTorch's global generator, which the seeded tests of
    // this binary hold: draw only under the same lock.
    let _serial = crate::common::serial();
    let vs = nn::VarStore::new(Device::Cpu);
    let p = vs.root();
    for (groups, channels, field, message) in [
        (
            3,
            10,
            "GroupNorm groups",
            "GroupNorm groups: 3, expected a divisor of channels 10",
        ),
        (
            16,
            8,
            "GroupNorm groups",
            "GroupNorm groups: 16, expected a divisor of channels 8",
        ),
        (
            0,
            8,
            "GroupNorm groups",
            "GroupNorm groups: 0, expected at least 1",
        ),
        (
            -2,
            8,
            "GroupNorm groups",
            "GroupNorm groups: -2, expected at least 1",
        ),
        (
            2,
            0,
            "GroupNorm channels",
            "GroupNorm channels: 0, expected at least 1",
        ),
        (
            2,
            -4,
            "GroupNorm channels",
            "GroupNorm channels: -4, expected at least 1",
        ),
    ] {
        refused(GroupNorm::new(&p, groups, channels), field, message);
    }
    untouched(&vs);
    for (groups, channels) in [(1, 1), (2, 4), (4, 4), (32, 64)] {
        let norm = GroupNorm::new(&(&p / format!("g{groups}c{channels}")), groups, channels);
        let norm = norm.unwrap();
        assert_eq!((norm.groups, norm.weight.size()), (groups, vec![channels]));
    }
}

#[test]
fn layer_norm_refuses_an_empty_width_and_an_eps_that_is_not_positive_and_finite() {
    // Building layers draws from LibTorch's global generator, which the seeded tests of
    // this binary hold: draw only under the same lock.
    let _serial = crate::common::serial();
    let vs = nn::VarStore::new(Device::Cpu);
    let p = vs.root();
    refused(
        LayerNorm::new(&p, 0, 1e-5),
        "LayerNorm dim",
        "LayerNorm dim: 0, expected at least 1",
    );
    refused(
        LayerNorm::new(&p, -3, 1e-5),
        "LayerNorm dim",
        "LayerNorm dim: -3, expected at least 1",
    );
    for (eps, shown) in [
        (0.0, "0"),
        (-0.0, "-0"),
        (-1e-5, "-0.00001"),
        (f64::NAN, "NaN"),
        (f64::INFINITY, "inf"),
        (f64::NEG_INFINITY, "-inf"),
    ] {
        refused(
            LayerNorm::new(&p, 4, eps),
            "LayerNorm eps",
            &format!("LayerNorm eps: {shown}, expected a finite number above 0"),
        );
    }
    untouched(&vs);
    for (i, eps) in [1e-12, 1e-5, 0.5].into_iter().enumerate() {
        let norm = LayerNorm::new(&(&p / i), 4, eps).unwrap();
        assert_eq!((norm.dim, norm.eps, norm.weight.size()), (4, eps, vec![4]));
    }
}

#[test]
fn instance_norm_refuses_no_channels() {
    // Building layers draws from LibTorch's global generator, which the seeded tests of
    // this binary hold: draw only under the same lock.
    let _serial = crate::common::serial();
    let vs = nn::VarStore::new(Device::Cpu);
    let p = vs.root();
    for channels in [0, -4] {
        refused(
            InstanceNorm2d::new(&p, channels),
            "InstanceNorm2d channels",
            &format!("InstanceNorm2d channels: {channels}, expected at least 1"),
        );
    }
    untouched(&vs);
    let norm = InstanceNorm2d::new(&(&p / "good"), 3).unwrap();
    let (weight, bias) = norm.affine.as_ref().unwrap();
    assert_eq!((weight.size(), bias.size()), (vec![3], vec![3]));
}

/// The constructors that already returned a `Result` keep their messages (the same helper).
#[test]
fn conv2d_messages_are_unchanged() {
    // Building layers draws from LibTorch's global generator, which the seeded tests of
    // this binary hold: draw only under the same lock.
    let _serial = crate::common::serial();
    let vs = nn::VarStore::new(Device::Cpu);
    let p = vs.root();
    let stride0 = Conv2dConfig {
        stride: 0,
        ..Default::default()
    };
    refused(
        Conv2d::new(&p, 3, 16, 3, stride0),
        "Conv2d stride",
        "Conv2d stride: 0, expected at least 1",
    );
    refused(
        Conv2d::new(&p, 0, 16, 3, Conv2dConfig::default()),
        "Conv2d in_channels",
        "Conv2d in_channels: 0, expected at least 1",
    );
    let negative_padding = Conv2dConfig {
        padding: -1,
        ..Default::default()
    };
    refused(
        Conv2d::new(&p, 3, 16, 3, negative_padding),
        "Conv2d padding",
        "Conv2d padding: -1, expected at least 0",
    );
    untouched(&vs);
}

/// The models pass their layers' errors on instead of panicking.
#[test]
fn models_pass_a_layers_error_on() {
    // Building layers draws from LibTorch's global generator, which the seeded tests of
    // this binary hold: draw only under the same lock.
    let _serial = crate::common::serial();
    refused(
        SurnamesLstm::new(Device::Cpu, 0),
        "Linear out_dim",
        "Linear out_dim: 0, expected at least 1",
    );
    refused(
        CifarCnn::new(Device::Cpu, -1),
        "Linear out_dim",
        "Linear out_dim: -1, expected at least 1",
    );
    refused(
        FlModel::mlp(0, 32, 2, Device::Cpu),
        "Linear in_dim",
        "Linear in_dim: 0, expected at least 1",
    );
    refused(
        FlModel::mlp(30, 32, 0, Device::Cpu),
        "Linear out_dim",
        "Linear out_dim: 0, expected at least 1",
    );
    let config = || -> BertConfig {
        serde_json::from_str(
            r#"{"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1,
                "num_attention_heads": 4, "intermediate_size": 32, "max_position_embeddings": 20}"#,
        )
        .unwrap()
    };
    refused(
        BertClassifier::new(Device::Cpu, config(), 0),
        "BertClassifier classes",
        "BertClassifier classes: 0, expected at least 1",
    );
    let mut no_eps = config();
    no_eps.layer_norm_eps = 0.0;
    refused(
        BertClassifier::new(Device::Cpu, no_eps, 3),
        "LayerNorm eps",
        "LayerNorm eps: 0, expected a finite number above 0",
    );
    let mut no_vocabulary = config();
    no_vocabulary.vocab_size = 0;
    refused(
        BertClassifier::new(Device::Cpu, no_vocabulary, 3),
        "Embedding num",
        "Embedding num: 0, expected at least 1",
    );
    let mut uneven_heads = config();
    uneven_heads.num_attention_heads = 3;
    refused(
        BertClassifier::new(Device::Cpu, uneven_heads, 3),
        "heads",
        "heads: 3: expected a positive divisor of the model width 16",
    );
    // And accept what they were built with.
    assert_eq!(
        SurnamesLstm::new(Device::Cpu, 18)
            .unwrap()
            .trainable_parameter_count(),
        118_034
    );
    assert_eq!(
        FlModel::mlp(30, 32, 2, Device::Cpu)
            .unwrap()
            .parameter_count(),
        1_058
    );
    assert!(BertClassifier::new(Device::Cpu, config(), 3).is_ok());
}
